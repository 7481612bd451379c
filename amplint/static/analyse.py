"""One file from bytes to findings: decode, parse, build facts, run the selected checks."""

from __future__ import annotations

import re
from collections.abc import Iterable

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from amplint.catalogue import rule_info
from amplint.model import Edit, Finding, Fix
from amplint.static.source import SourceError, decode_source, parse_error_finding
from amplint.static.checks import Hit, Insertion, all_checks
from amplint.static.semantics import AmpFacts

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Za-z]+\d+(?:[\s,]+[A-Za-z]+\d+)*))?", re.IGNORECASE)
_FILE_NOQA = re.compile(r"^#\s*amplint:\s*noqa\s*$", re.IGNORECASE | re.MULTILINE)


def parse(text: str) -> cst.Module:
    try:
        return cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        raise SourceError(f"cannot parse: {exc.message}", exc.raw_line, exc.raw_column + 1) from None
    except RecursionError:
        raise SourceError("cannot parse: the file nests too deeply") from None


def analyse_source(
    source: bytes | str, path: str, select: Iterable[str] | None = None, min_torch: tuple[int, ...] | None = None
) -> list[Finding]:
    try:
        text, _encoding = decode_source(source)
        module = parse(text)
    except SourceError as error:
        wanted = None if select is None else set(select)
        return [] if wanted is not None and "AMP000" not in wanted else [parse_error_finding(path, error)]
    return analyse_module(module, text, path, select, min_torch)


def analyse_module(
    module: cst.Module,
    text: str,
    path: str,
    select: Iterable[str] | None = None,
    min_torch: tuple[int, ...] | None = None,
) -> list[Finding]:
    if _FILE_NOQA.search(text):
        return []
    checks = all_checks()
    codes = [code for code in checks if select is None or code in set(select)]
    if not codes:
        return []
    facts = AmpFacts(module, min_torch)
    hits: list[tuple[str, Hit]] = []
    seen: set[tuple[str, int]] = set()
    for code in codes:
        for hit in checks[code](facts):
            if (code, id(hit.node)) not in seen:
                seen.add((code, id(hit.node)))
                hits.append((code, hit))
    if not hits:
        return []
    # Positions cost a full pass over the tree: paid only when there is something to report.
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    suppressions = _noqa_by_line(text)
    findings = []
    lines = text.splitlines()
    for code, hit in hits:
        finding = _finding(code, hit, path, positions, lines)
        if not _suppressed(finding, suppressions):
            findings.append(finding)
    return sorted(findings, key=Finding.sort_key)


def _edit(replacement, positions, lines: list[str]) -> Edit:
    where = positions[replacement.node]
    if isinstance(replacement, Insertion):
        line_text = lines[where.start.line - 1] if where.start.line <= len(lines) else ""
        indent = line_text[: len(line_text) - len(line_text.lstrip(" \t"))]
        if replacement.before:
            return Edit(where.start.line, len(indent) + 1, where.start.line, len(indent) + 1, f"{replacement.text}\n{indent}")
        return Edit(where.end.line, where.end.column + 1, where.end.line, where.end.column + 1, f"\n{indent}{replacement.text}")
    return Edit(where.start.line, where.start.column + 1, where.end.line, where.end.column + 1, replacement.content)


def _finding(code: str, hit: Hit, path: str, positions, lines: list[str]) -> Finding:
    info = rule_info(code)
    where = positions[hit.node]
    statement_line = positions[hit.statement].start.line if hit.statement in positions else where.start.line
    message = hit.message.format(*(positions[n].start.line for n in hit.related)) if hit.related else hit.message
    fix = None
    if hit.fix is not None:
        edits = tuple(_edit(r, positions, lines) for r in hit.fix.replacements)
        fix = Fix(hit.fix.applicability, edits)
    return Finding(
        code,
        info.name,
        info.severity,
        path,
        where.start.line,
        where.start.column + 1,
        where.end.line,
        where.end.column + 1,
        message,
        fix,
        noqa_line=statement_line,
    )


def _noqa_by_line(text: str) -> dict[int, set[str] | None]:
    """Line -> codes suppressed there (None: every code)."""
    table: dict[int, set[str] | None] = {}
    if "noqa" not in text.lower():
        return table
    for number, line in enumerate(text.splitlines(), start=1):
        match = _NOQA.search(line)
        if match:
            codes = match.group("codes")
            table[number] = None if codes is None else {c.upper() for c in re.split(r"[\s,]+", codes) if c}
    return table


def _suppressed(finding: Finding, suppressions: dict[int, set[str] | None]) -> bool:
    for line in {finding.line, finding.noqa_line}:
        if line in suppressions:
            codes = suppressions[line]
            if codes is None or finding.code in codes:
                return True
    return False
