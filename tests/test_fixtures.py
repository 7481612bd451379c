"""Every fixture under fixtures/static/ yields exactly the findings listed in its `.expected` file.

A fixture `name.py` (or any other extension) has a sibling `name.expected` with one `CODE LINE`
per expected finding, of any rule; an empty `.expected` means the file is clean.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from amplint.static.api import lint_source

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "static"
# The rules the `.expected` files are labelled for. A new rule joins this set once every fixture
# has been labelled for it too, so work on it in progress cannot break these expectations.
LABELLED = frozenset({"AMP000", "AMP001", "AMP002", "AMP003", "AMP004", "AMP005"})


def _cases() -> list[Path]:
    # AMP000's inputs (undecodable, unparsable) run through the real CLI in test_robustness.py.
    return sorted(p for p in FIXTURES.glob("AMP00[1-9]/*") if p.suffix != ".expected" and p.with_suffix(".expected").exists())


def _expected(path: Path) -> set[tuple[str, int]]:
    found = set()
    for line in path.with_suffix(".expected").read_text(encoding="utf-8").splitlines():
        if line.strip():
            code, number = line.split()
            found.add((code, int(number)))
    return found


@pytest.mark.parametrize("path", _cases(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixture_findings(path: Path) -> None:
    rules = LABELLED | {path.parent.name}
    findings = lint_source(path.read_bytes(), str(path), rules)
    assert {(f.code, f.line) for f in findings} == {e for e in _expected(path) if e[0] in rules}


def test_every_rule_has_enough_fixtures() -> None:
    for code in ("AMP001", "AMP002", "AMP003", "AMP004", "AMP005"):
        folder = FIXTURES / code
        bad = list(folder.glob("bad_*.py"))
        good = list(folder.glob("good_*.py"))
        assert len(bad) >= 8 and len(good) >= 8, (code, len(bad), len(good))
        for path in bad:
            assert any(c == code for c, _ in _expected(path)), f"{path.name} expects no {code}"
        for path in good:
            assert all(c != code for c, _ in _expected(path)), f"{path.name} expects {code}"


def test_every_fixture_has_expectations() -> None:
    for path in FIXTURES.glob("AMP*/*"):
        if path.suffix != ".expected":
            assert path.with_suffix(".expected").exists(), path
