"""Every fixture under fixtures/static/ yields exactly the findings listed in its `.expected` file.

A fixture `name.py` has a sibling `name.expected` with one `CODE LINE` per expected finding, of
any rule; an empty `.expected` means the file is clean. Every rule runs on every fixture, so a
rule's false positive shows up in the other rules' fixtures too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from amplint.catalogue import catalogue
from amplint.static.api import lint_source
from amplint.static.gate import possible_rules

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "static"
RULES = sorted(code for code in catalogue() if code != "AMP000")
# The five mission rules have the minimum of 8 bad and 8 good files; the others 5 each.
MINIMUM = {code: 8 if code <= "AMP005" else 5 for code in RULES}


def _cases() -> list[Path]:
    # AMP000's inputs (undecodable, unparsable) run through the real CLI in test_robustness.py.
    return sorted(p for code in RULES for p in (FIXTURES / code).glob("*.py"))


def _expected(path: Path) -> set[tuple[str, int]]:
    found = set()
    for line in path.with_suffix(".expected").read_text(encoding="utf-8").splitlines():
        if line.strip():
            code, number = line.split()
            found.add((code, int(number)))
    return found


@pytest.mark.parametrize("path", _cases(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixture_findings(path: Path) -> None:
    findings = lint_source(path.read_bytes(), str(path))
    assert {(f.code, f.line) for f in findings} == _expected(path)


@pytest.mark.parametrize("path", _cases(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_gates_let_through_every_expected_finding(path: Path) -> None:
    """The byte prefilter admits every rule a fixture expects, and gating changes nothing."""
    source = path.read_bytes()
    possible = possible_rules(source, frozenset(RULES))
    assert {code for code, _ in _expected(path)} <= possible
    gated = {(f.code, f.line) for f in lint_source(source, str(path), possible | {"AMP000"})}
    assert gated == _expected(path)


@pytest.mark.parametrize("code", RULES)
def test_every_rule_has_enough_bad_and_good_fixtures(code: str) -> None:
    folder = FIXTURES / code
    bad = sorted(folder.glob("bad_*.py"))
    good = sorted(folder.glob("good_*.py"))
    assert len(bad) >= MINIMUM[code] and len(good) >= MINIMUM[code], (len(bad), len(good))
    for path in bad:
        assert any(c == code for c, _ in _expected(path)), f"{path.name} expects no {code}"
    for path in good:
        assert all(c != code for c, _ in _expected(path)), f"{path.name} expects {code}"


def test_every_fixture_has_expectations() -> None:
    for path in FIXTURES.glob("AMP*/*"):
        if path.suffix != ".expected":
            assert path.with_suffix(".expected").exists(), path
