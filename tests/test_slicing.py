"""Relevance slicing never changes results: sliced analysis == whole-file analysis."""

from __future__ import annotations

from pathlib import Path

import pytest

from amplint.static import slicing
from amplint.static.analyse import analyse_source

ROOT = Path(__file__).parent.parent
SOURCES = sorted(
    p for p in [*ROOT.glob("fixtures/static/*/*.py"), *ROOT.glob("fixtures/fix/*.py"), *ROOT.glob("examples/*.py")]
)
FILLER = "".join(
    f"\n\ndef unrelated_helper_{i}(values):\n    total = 0\n    for v in values:\n        total += v * {i}\n    return total\n"
    for i in range(400)
)


def _codes() -> frozenset[str]:
    from amplint.static.checks import all_checks

    return frozenset({*all_checks(), "AMP000"})


def _result(source: str | bytes, name: str, sliced: bool) -> list[tuple]:
    return [(f.code, f.line, f.column, f.message) for f in analyse_source(source, name, _codes(), slicing=sliced)]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_slicing_a_fixture_keeps_its_findings(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slicing, "SLICE_MIN_CHARS", 0)
    source = path.read_bytes()
    assert _result(source, path.name, sliced=True) == _result(source, path.name, sliced=False)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_slicing_a_fixture_buried_in_a_large_module_keeps_its_findings(path: Path) -> None:
    try:
        source = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        pytest.skip("not UTF-8: covered by the whole-file test above")
    if source.startswith(("#!", "# -*-", "\ufeff")) or "from __future__" in source:
        pytest.skip("a coding line or future import must stay first")
    large = source + FILLER
    assert len(large) > slicing.SLICE_MIN_CHARS
    assert _result(large, path.name, sliced=True) == _result(large, path.name, sliced=False)


def test_slicing_blanks_functions_that_no_rule_can_see() -> None:
    source = "import torch\n\n\ndef train():\n    with torch.autocast('cuda'):\n        loss.backward()\n" + FILLER
    codes, sliced = slicing.prepare(source, frozenset({"AMP003"}))
    assert codes == {"AMP003"}
    assert sliced is not None
    assert "unrelated_helper_7" not in sliced
    assert sliced.count("\n") == source.count("\n")


def test_a_rule_without_triggers_turns_slicing_off() -> None:
    source = "import torch\n" + FILLER
    assert slicing.prepare(source, frozenset({"AMP999"}))[1] is None


def test_rules_mentioned_only_in_strings_are_set_aside_for_a_large_file() -> None:
    docstring = '"""Call loss.backward() outside torch.autocast, and build one GradScaler."""\n'
    source = docstring + "import torch\n" + FILLER
    codes, _ = slicing.prepare(source, frozenset({"AMP000", "AMP003", "AMP004", "AMP010"}))
    assert codes == {"AMP000"}


def test_a_string_sensitive_rule_stays_when_its_subject_is_named_in_code() -> None:
    """AMP010 reads the device from a string ("cpu"), but its GradScaler must be named in code."""
    source = 'import torch\nscaler = torch.amp.GradScaler("cpu")  # GradScaler\n' + FILLER
    codes, _ = slicing.prepare(source, frozenset({"AMP000", "AMP010"}))
    assert codes == {"AMP000", "AMP010"}
    only_in_a_comment = "import torch\n# GradScaler('cpu') is not used here\n" + FILLER
    assert slicing.prepare(only_in_a_comment, frozenset({"AMP000", "AMP010"}))[0] == {"AMP000"}


@pytest.mark.parametrize(
    ("source", "view"),
    [
        ('x = "autocast"  # GradScaler\n', "x = " + " " * 24 + "\n"),
        ("s = 'it\\'s # not a comment'; y = 1\n", "s = " + " " * 23 + "; y = 1\n"),
        ('"""doc\nautocast"""\nz = 2\n', '      \n           \nz = 2\n'),
        ("b = rb'\\d+' + Rb\"#\"\n", "b = " + " " * 7 + " + " + " " * 5 + "\n"),  # prefixes too
        ('if"autocast"in x: pass\n', "if" + " " * 10 + "in x: pass\n"),  # a keyword, not a prefix
        ('f"{torch.autocast}" # c\n', 'f"{torch.autocast}"    \n'),  # an f-string's fields are code
        ('t = ("a" f"{x}"\n     "b")\n', 't = (    f"{x}"\n        )\n'),
    ],
)
def test_code_view_blanks_comments_and_plain_strings_only(source: str, view: str) -> None:
    assert slicing._code_view(source).decode() == view
