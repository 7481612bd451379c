"""The byte prefilter is a sound over-approximation: it never hides a finding.

That gated runs equal full runs on every fixture and on the torch tree is tests/test_stages.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from amplint.catalogue import catalogue, code_examples
from amplint.static.gate import GATES, possible_rules

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "static"
ALL = frozenset({"AMP000", "AMP001", "AMP002", "AMP003", "AMP004", "AMP005"})  # the labelled rules


def _flagged_fixtures() -> list[tuple[str, Path]]:
    cases = []
    for path in sorted(FIXTURES.glob("AMP0[0-9][0-9]/*.py")):
        lines = path.with_suffix(".expected").read_text(encoding="utf-8").split()
        for code in sorted(set(lines[0::2])):
            if code != "AMP000":
                cases.append((code, path))
    return cases


@pytest.mark.parametrize("code,path", _flagged_fixtures(), ids=lambda v: v if isinstance(v, str) else f"{v.parent.name}/{v.name}")
def test_fixture_passes_gate(code: str, path: Path) -> None:
    assert code in possible_rules(path.read_bytes(), frozenset({code}))


@pytest.mark.parametrize(
    "code,source",
    [(r.code, s) for r in catalogue().values() if r.code in GATES for s in code_examples(r, "Example")],
    ids=lambda v: v if str(v).startswith("AMP") else "",
)
def test_example_passes_gate(code: str, source: str) -> None:
    assert code in possible_rules(source.encode(), frozenset({code}))


def test_plain_file_passes_no_gate() -> None:
    source = b"import numpy as np\n\ndef mean(xs):\n    return np.mean(xs)\n"
    assert possible_rules(source, ALL) & set(GATES) == frozenset()


@pytest.mark.parametrize(
    ("source", "code", "passes"),
    [
        (b"from torch.cuda import amp\n", "AMP001", True),
        (b"y = x.clamp(0, 1)  # example, sample, timestamp\n", "AMP001", False),
        (b"torch.set_autocast_gpu_dtype(torch.half)\n", "AMP001", True),
        (b"import torch.cuda as tc\nwith tc.amp.autocast():\n    pass\n", "AMP001", True),
        (b"with torch.amp.autocast('cuda'):\n    pass\n", "AMP001", False),  # the replacement API
        (b"with torch.autocast('cuda'):\n    loss.backward()\n", "AMP003", True),
        (b"torch._C._autocast_to_full_precision(x)\nloss.backward()\n", "AMP003", False),
        (b"GRAD_SCALER.step(optimizer)\n", "AMP007", True),  # a scaler's name in any case
        (b"self.MyScaler .update()\n", "AMP011", True),
        (b"optimizer.step()\nscheduler.update()\n", "AMP007", False),
        (b"scaler.unscale_(opt)\n", "AMP008", True),
        (b"torch._amp_foreach_non_finite_check_and_unscale_(g)\n", "AMP008", False),
        (b"if s.get_scale() < before:\n    opt.step()\n", "AMP007", True),
        (b"h = get_scale_value(scales, 0)\nopt.step()\n", "AMP007", False),  # interpolation, not a scaler
        (b"s = _interpolate_get_scales_and_mode(g)\nopt.step()\n", "AMP011", False),
    ],
)
def test_gate_words(source: bytes, code: str, passes: bool) -> None:
    assert (code in possible_rules(source, frozenset({code}))) is passes
