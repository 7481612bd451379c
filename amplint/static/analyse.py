"""One file from bytes to findings: decode, parse, build facts, run the selected checks."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterable, Iterator

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, MetadataWrapper, PositionProvider

from amplint.catalogue import rule_info
from amplint.model import Edit, Finding, Fix
from amplint.static.source import SourceError, decode_source, parse_error_finding
from amplint.static.checks import Hit, Insertion, all_checks
from amplint.static.semantics import AmpFacts
from amplint.static.slicing import prepare

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Za-z]+\d*(?:[\s,]+[A-Za-z]+\d*)*))?", re.IGNORECASE)
_FILE_NOQA = re.compile(r"^#\s*amplint:\s*noqa\s*$", re.IGNORECASE | re.MULTILINE)


def parse(text: str) -> cst.Module:
    try:
        return cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        raise _syntax_error(text, exc) from None
    except RecursionError:
        raise SourceError("cannot parse: the file nests too deeply") from None


def _syntax_error(text: str, exc: cst.ParserSyntaxError) -> SourceError:
    """Report where CPython would: libcst's native parser can point a line or two off."""
    try:
        ast.parse(text)
    except SyntaxError as error:
        return SourceError(f"cannot parse: {error.msg}", error.lineno or 1, error.offset or 1)
    except (ValueError, RecursionError, MemoryError):
        pass
    return SourceError(f"cannot parse: {exc.message}", exc.raw_line, exc.raw_column + 1)


def analyse_source(
    source: bytes | str,
    path: str,
    select: Iterable[str] | None = None,
    min_torch: tuple[int, ...] | None = None,
    slicing: bool = True,
) -> list[Finding]:
    """Findings for one file. `slicing=False` analyses every function even in a large file."""
    wanted = frozenset(select) if select is not None else frozenset(all_checks()) | {"AMP000"}
    try:
        text, _encoding = decode_source(source)
    except SourceError as error:
        return [parse_error_finding(path, error)] if "AMP000" in wanted else []
    if _FILE_NOQA.search(text):
        return []
    sliced = None
    if slicing:
        wanted, sliced = prepare(text, wanted)
        if not wanted - {"AMP000"}:
            return []  # parsed by CPython already, and no rule is left that could fire
    try:
        module = parse(sliced if sliced is not None else text)
    except SourceError as error:
        if sliced is None:
            return [parse_error_finding(path, error)] if "AMP000" in wanted else []
        return analyse_source(source, path, select, min_torch, slicing=False)
    return analyse_module(module, sliced if sliced is not None else text, path, wanted, min_torch)


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
    facts = AmpFacts(module, min_torch, text)
    hits: list[tuple[str, Hit]] = []
    seen: set[tuple[str, int]] = set()
    for code in codes:
        for hit in checks[code](facts):
            if (code, id(hit.node)) not in seen:
                seen.add((code, id(hit.node)))
                hits.append((code, hit))
    if not hits:
        return []
    positions = _Locator(module, text, facts.top_level)
    suppressions = _noqa_by_line(text)
    findings = []
    lines = text.splitlines()
    for code, hit in hits:
        finding = _finding(code, hit, path, positions, lines)
        if not _suppressed(finding, suppressions):
            findings.append(finding)
    return sorted(findings, key=Finding.sort_key)


class _Locator:
    """Positions of reported nodes, computed one top-level statement at a time.

    libcst's PositionProvider re-generates the code of the whole file, which costs more than
    parsing it; a finding needs the positions of a few statements only. Each top-level
    statement's first line comes from CPython's parser (a C pass, ~3% of libcst's parse), and
    libcst positions within the statement are computed on a module holding just that statement.
    Columns need no offset: top-level statements start at column 0.
    """

    def __init__(self, module: cst.Module, text: str, top_level: dict[int, int]) -> None:
        self.module, self.text, self.top_level = module, text, top_level
        self._by_statement: dict[int, tuple[int, object]] = {}
        self._first_lines = _first_lines(module, text)
        self._whole = None

    def __contains__(self, node) -> bool:
        return node is not None and id(node) in self.top_level

    def __getitem__(self, node):
        index = self.top_level.get(id(node))
        if index is None or index < 0 or self._first_lines is None:
            return self._whole_file()[node]
        if index not in self._by_statement:
            statement = self.module.body[index]
            alone = self.module.with_changes(body=[statement], header=[], footer=[])
            positions = MetadataWrapper(alone, unsafe_skip_copy=True).resolve(PositionProvider)
            # A decorated definition's position starts at `def`/`class`; CPython's first line is the decorator's.
            anchor = statement.decorators[0] if getattr(statement, "decorators", None) else statement
            offset = self._first_lines[index] - positions[anchor].start.line
            self._by_statement[index] = (offset, positions)
        offset, positions = self._by_statement[index]
        where = positions[node]
        return CodeRange(
            CodePosition(where.start.line + offset, where.start.column),
            CodePosition(where.end.line + offset, where.end.column),
        )

    def _whole_file(self):
        if self._whole is None:
            self._whole = MetadataWrapper(self.module, unsafe_skip_copy=True).resolve(PositionProvider)
        return self._whole


def _first_lines(module: cst.Module, text: str) -> list[int] | None:
    """The first line of each top-level libcst statement, from CPython's own parser."""
    try:
        body = ast.parse(text).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    lines: list[int] = []
    position = 0
    for statement in module.body:
        count = len(statement.body) if isinstance(statement, cst.SimpleStatementLine) else 1
        if position + count > len(body):
            return None
        first = body[position]
        lines.append(min([first.lineno, *(d.lineno for d in getattr(first, "decorator_list", ()))]))
        position += count
    return lines if position == len(body) else None


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
        hit.severity or info.severity,
        path,
        where.start.line,
        where.start.column + 1,
        where.end.line,
        where.end.column + 1,
        message,
        fix,
        noqa_line=statement_line,
    )


def _comments(text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every real comment: a `# noqa` inside a string literal suppresses nothing."""
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                yield token.start[0], token.string
    except (tokenize.TokenError, SyntaxError):
        return


def _noqa_by_line(text: str) -> dict[int, set[str] | None]:
    """Line -> codes or code prefixes suppressed there (None: every code)."""
    table: dict[int, set[str] | None] = {}
    if "noqa" not in text.lower():
        return table
    for number, comment in _comments(text):
        match = _NOQA.search(comment)
        if match:
            codes = match.group("codes")
            table[number] = None if codes is None else {c.upper() for c in re.split(r"[\s,]+", codes) if c}
    return table


def _suppressed(finding: Finding, suppressions: dict[int, set[str] | None]) -> bool:
    for line in {finding.line, finding.noqa_line}:
        if line in suppressions:
            codes = suppressions[line]
            if codes is None or any(finding.code.startswith(code) for code in codes):
                return True
    return False
