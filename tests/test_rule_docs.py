"""The rule catalogue: every document is complete and its code blocks behave as they claim."""

from __future__ import annotations

import pytest

from amplint.catalogue import catalogue, code_examples, doc_section, rules_dir
from amplint.model import Severity
from amplint.static.api import lint_source

RULES = sorted(catalogue().values(), key=lambda r: r.code)
SECTIONS = ("What it flags", "Why it matters", "Example", "Use instead", "Runtime confirmation", "Fix")


def _examples(heading: str) -> list[tuple[str, str]]:
    return [(rule.code, code) for rule in RULES for code in code_examples(rule, heading)]


def test_every_rule_file_is_catalogued() -> None:
    files = sorted(p.stem for p in rules_dir().glob("AMP*.md"))
    assert files == [r.code for r in RULES]
    assert {"AMP000", "AMP001", "AMP002", "AMP003", "AMP004", "AMP005"} <= set(files)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_front_matter(rule) -> None:
    assert rule.name and rule.name == rule.name.lower() and " " not in rule.name
    assert isinstance(rule.severity, Severity)
    assert rule.summary
    assert rule.fix in ("none", "safe", "unsafe")
    assert rule.doc.startswith(f"# {rule.code} {rule.name}\n")


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_sections_present_in_order(rule) -> None:
    positions = [rule.doc.find(f"\n## {heading}\n") for heading in SECTIONS]
    assert all(p >= 0 for p in positions), dict(zip(SECTIONS, positions))
    assert positions == sorted(positions)
    for heading in SECTIONS:
        assert doc_section(rule, heading), heading
    assert code_examples(rule, "Example") and code_examples(rule, "Use instead")


@pytest.mark.parametrize("code,source", _examples("Example"), ids=lambda v: v if str(v).startswith("AMP") else "")
def test_example_is_flagged(code: str, source: str) -> None:
    findings = lint_source(source, f"{code}_example.py")
    assert code in {f.code for f in findings}


@pytest.mark.parametrize("code,source", _examples("Use instead"), ids=lambda v: v if str(v).startswith("AMP") else "")
def test_use_instead_is_clean(code: str, source: str) -> None:
    findings = lint_source(source, f"{code}_use_instead.py")
    assert code not in {f.code for f in findings}
