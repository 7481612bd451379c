"""The AMP006-AMP017 fixtures: every rule runs, and each file yields exactly its `.expected` findings."""

from __future__ import annotations

from pathlib import Path

import pytest

from amplint.catalogue import catalogue
from amplint.static.api import lint_source
from amplint.static.gate import possible_rules

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "static"
CODES = [f"AMP{n:03d}" for n in range(6, 18)]
ALL = frozenset(catalogue())


def _cases() -> list[Path]:
    return sorted(p for code in CODES for p in (FIXTURES / code).glob("*.py"))


def _expected(path: Path) -> set[tuple[str, int]]:
    found = set()
    for line in path.with_suffix(".expected").read_text(encoding="utf-8").splitlines():
        if line.strip():
            code, number = line.split()
            found.add((code, int(number)))
    return found


@pytest.mark.parametrize("path", _cases(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixture_findings_all_rules(path: Path) -> None:
    findings = lint_source(path.read_bytes(), str(path))
    assert {(f.code, f.line) for f in findings} == _expected(path)


@pytest.mark.parametrize("code", CODES)
def test_rule_has_bad_and_good_fixtures(code: str) -> None:
    folder = FIXTURES / code
    bad = sorted(folder.glob("bad_*.py"))
    good = sorted(folder.glob("good_*.py"))
    assert len(bad) >= 5 and len(good) >= 5, (code, len(bad), len(good))
    for path in bad:
        assert any(c == code for c, _ in _expected(path)), f"{path.name} expects no {code}"
    for path in good:
        assert all(c != code for c, _ in _expected(path)), f"{path.name} expects {code}"


@pytest.mark.parametrize("path", _cases(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixture_passes_gates(path: Path) -> None:
    """The byte prefilter lets through every rule a fixture expects, and gating changes nothing."""
    source = path.read_bytes()
    possible = possible_rules(source, ALL)
    for code, _ in _expected(path):
        assert code in possible, code
    gated = {(f.code, f.line) for f in lint_source(source, str(path), possible | {"AMP000"})}
    assert gated == _expected(path)
