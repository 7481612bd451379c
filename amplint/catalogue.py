"""The rule catalogue: metadata and documentation read from `rules/AMPxxx.md`.

The Markdown files are the single source of a rule's name, severity and documentation; they ship
inside the wheel as `amplint/_rules` and are read from the repository in a source checkout.
"""

from __future__ import annotations

import json
import re
import sys
from functools import lru_cache
from pathlib import Path

from amplint.model import RuleInfo, Severity

_FRONT_MATTER = re.compile(r"\A---\n(?P<meta>.*?)\n---\n(?P<body>.*)\Z", re.DOTALL)
_CODE_BLOCK = re.compile(r"```python\n(?P<code>.*?)```", re.DOTALL)


def rules_dir() -> Path:
    package = Path(__file__).resolve().parent
    shipped = package / "_rules"
    return shipped if shipped.is_dir() else package.parent / "rules"


def _parse(path: Path) -> RuleInfo:
    match = _FRONT_MATTER.match(path.read_text(encoding="utf-8"))
    if match is None:
        raise ValueError(f"{path}: no front matter")
    meta = {}
    for line in match.group("meta").splitlines():
        key, _, value = line.partition(":")
        meta[key.strip()] = value.strip()
    return RuleInfo(
        code=meta["code"],
        name=meta["name"],
        severity=Severity(meta["severity"]),
        summary=meta["summary"],
        fix=meta.get("fix", "none"),
        runtime=meta.get("runtime", ""),
        doc=match.group("body").strip() + "\n",
    )


@lru_cache(maxsize=1)
def catalogue() -> dict[str, RuleInfo]:
    rules = {rule.code: rule for rule in (_parse(path) for path in sorted(rules_dir().glob("AMP*.md")))}
    if not rules:  # a broken installation would otherwise check nothing and report success
        raise RuntimeError(f"no rule documentation in {rules_dir()}; reinstall amplint")
    return rules


def rule_info(code: str) -> RuleInfo:
    return catalogue()[code]


def doc_section(rule: RuleInfo, heading: str) -> str:
    """The text under `## heading` in a rule's documentation."""
    match = re.search(rf"^## {re.escape(heading)}\n(?P<text>.*?)(?=^## |\Z)", rule.doc, re.DOTALL | re.MULTILINE)
    return match.group("text").strip() if match else ""


def code_examples(rule: RuleInfo, heading: str) -> list[str]:
    """The Python code blocks under a heading ("Example" must flag, "Use instead" must not)."""
    return [m.group("code") for m in _CODE_BLOCK.finditer(doc_section(rule, heading))]


def render_rule_command(code: str | None, output_format: str) -> int:
    rules = catalogue()
    if code is None:
        if output_format == "json":
            print(json.dumps([_rule_json(r) for r in rules.values()], indent=2))
        else:
            width = max(len(r.name) for r in rules.values())
            for rule in rules.values():
                print(f"{rule.code}  {rule.name:<{width}}  {rule.severity.value:<7}  {rule.summary}")
        return 0
    rule = rules.get(code.upper())
    if rule is None:
        print(f"amplint: error: unknown rule code {code!r} (run `amplint rule` for the list)", file=sys.stderr)
        return 2
    if output_format == "json":
        print(json.dumps(_rule_json(rule), indent=2))
    elif sys.stdout.isatty():
        from rich.console import Console
        from rich.markdown import Markdown

        Console().print(Markdown(rule.doc))
    else:
        print(rule.doc, end="")
    return 0


def _rule_json(rule: RuleInfo) -> dict:
    return {
        "code": rule.code,
        "name": rule.name,
        "severity": rule.severity.value,
        "summary": rule.summary,
        "fix": rule.fix,
        "runtime": rule.runtime,
        "doc": rule.doc,
    }
