"""torch's C++ side writes its warnings and profiler chatter to the process's stderr directly,
past Python's `warnings` and `sys.stderr`. Work amplint does on its own behalf (a kernel probe,
a memory pass) captures that descriptor and passes on only the lines meant for the user."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def native_stderr_without(noise: Callable[[bytes], bool]) -> Iterator[None]:
    """Within the block, the lines written to file descriptor 2 for which `noise(line)` holds are
    dropped; the others are written out, in order, when the block ends."""
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to capture
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(keepends=True) if not noise(line)]
            if kept:
                os.write(2, b"".join(kept))
