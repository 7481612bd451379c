"""native_stderr_without: what torch's C++ side writes to the stderr descriptor during amplint's own
work passes through, except the lines named as noise."""

from __future__ import annotations

import os

from amplint.native_stderr import native_stderr_without


def test_noise_lines_are_dropped_and_the_others_kept_in_order(capfd) -> None:
    with native_stderr_without(lambda line: line.startswith(b"[W")):
        os.write(2, b"first\n[W1203 EmptyTensor.cpp:54] Warning: ComplexHalf\nsecond\n")
    assert capfd.readouterr().err == "first\nsecond\n"


def test_the_descriptor_is_restored_when_the_block_raises(capfd) -> None:
    try:
        with native_stderr_without(lambda line: True):
            raise ValueError("probe failed")
    except ValueError:
        pass
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"
