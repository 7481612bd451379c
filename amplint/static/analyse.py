"""One file from bytes to findings: decode, parse, build facts, run the selected checks."""

from __future__ import annotations

import ast
import dataclasses
import io
import re
import tokenize
from collections.abc import Iterable, Iterator, Mapping
from functools import cached_property

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, PositionProvider
from libcst.metadata.position_provider import PositionProvidingCodegenState

from amplint.catalogue import rule_info
from amplint.model import Edit, Finding, Fix
from amplint.project import oldest_torch_checked
from amplint.static.checks import Hit, Insertion, all_checks
from amplint.static.screen import nodes
from amplint.static.semantics import AmpFacts
from amplint.static.slicing import first_line, prepare
from amplint.static.source import (
    LINE_BREAK,
    SourceError,
    decode_source,
    noqa_codes,
    noqa_covers,
    parse_error_finding,
    physical_lines,
    python_tree,
)

# `# amplint: noqa` alone on its line, at any indentation; a string holding it suppresses nothing.
_FILE_NOQA = re.compile(r"(?:^|(?<=[\r\n]))[ \t]*#\s*amplint:\s*noqa[ \t]*(?=[\r\n]|$)", re.IGNORECASE)


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
        python_tree(text)
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
    check_syntax: bool = True,
) -> list[Finding]:
    """Findings for one file. `slicing=False` analyses every function even in a large file;
    `check_syntax=False` leaves a file whose code holds nothing a rule looks for unparsed (a file
    found in a folder rather than named)."""
    try:
        return _analyse_source(source, path, select, min_torch, slicing, check_syntax)
    except RecursionError:
        error = SourceError("cannot analyse: an expression nests too deeply")
        wanted = frozenset(select) if select is not None else frozenset({"AMP000"})
        return [parse_error_finding(path, error)] if "AMP000" in wanted else []


# libcst's code generation takes several Python frames per level of a nested expression, so a
# 300-term sum (`x1 + x2 + ...`) exceeds Python's default limit of 1,000 frames.
_DEEP_RECURSION_LIMIT = 50_000
_DEEP_STACK_BYTES = 512 * 1024 * 1024  # reserved, not committed: only the pages used are


def _with_a_deep_stack(function, arguments: tuple):
    """`function(*arguments)` on a thread whose stack and recursion limit fit deep nesting."""
    import sys
    import threading

    outcome: list = []

    def run() -> None:
        try:
            outcome.append((True, function(*arguments)))
        except BaseException as exc:  # noqa: BLE001 - handed back to the calling thread
            outcome.append((False, exc))

    old_limit, old_size = sys.getrecursionlimit(), threading.stack_size(_DEEP_STACK_BYTES)
    sys.setrecursionlimit(_DEEP_RECURSION_LIMIT)
    try:
        thread = threading.Thread(target=run, name="amplint-deep")
        thread.start()
        thread.join()
    finally:
        threading.stack_size(old_size)
        sys.setrecursionlimit(old_limit)
    succeeded, value = outcome[0]
    if not succeeded:
        raise value
    return value


# A module written for another framework and never importing torch (insightface's PaddlePaddle
# training, whose `GradScaler` subclass updates the scale inside its own `step()`).
_OTHER_FRAMEWORK = re.compile(r"^[ \t]*(?:import|from)[ \t]+(?:paddle|mindspore|oneflow|jittor|megengine)\b", re.MULTILINE)
_TORCH_IMPORT = re.compile(r"^[ \t]*(?:import|from)[ \t]+torch\b", re.MULTILINE)


def _analyse_source(
    source: bytes | str,
    path: str,
    select: Iterable[str] | None,
    min_torch: tuple[int, ...] | None,
    slicing: bool,
    check_syntax: bool,
) -> list[Finding]:
    wanted = frozenset(select) if select is not None else frozenset(all_checks()) | {"AMP000"}
    try:
        text, _encoding = decode_source(source)
    except SourceError as error:
        return [parse_error_finding(path, error)] if "AMP000" in wanted else []
    if _file_noqa(text):
        return []
    min_torch = oldest_torch_checked(text, min_torch)  # read on the whole file: a slice may blank the check
    if _OTHER_FRAMEWORK.search(text) and not _TORCH_IMPORT.search(text):
        wanted &= {"AMP000"}  # its `scaler.step`, `auto_cast` and `GradScaler` are not torch's
        if not wanted or not check_syntax:
            return []
    sliced = None
    if slicing:
        try:
            wanted, sliced = prepare(text, wanted, check_syntax)
        except SourceError as error:
            return [parse_error_finding(path, error)] if "AMP000" in wanted else []
        if not wanted - {"AMP000"}:
            return []  # parsed by CPython already (or not asked for), and no rule is left that could fire
    try:
        module = parse(sliced if sliced is not None else text)
    except SourceError as error:
        if sliced is None:
            return [parse_error_finding(path, error)] if "AMP000" in wanted else []
        return _analyse_source(source, path, select, min_torch, False, check_syntax)
    arguments = (module, sliced if sliced is not None else text, path, wanted, min_torch)
    try:
        return analyse_module(*arguments)
    except RecursionError:
        return _with_a_deep_stack(analyse_module, arguments)


def analyse_module(
    module: cst.Module,
    text: str,
    path: str,
    select: Iterable[str] | None = None,
    min_torch: tuple[int, ...] | None = None,
) -> list[Finding]:
    if _file_noqa(text):
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
    positions = _Locator(module, text, facts)
    suppressions = noqa_by_line(text)
    findings = []
    lines = physical_lines(text)
    for code, hit in hits:
        finding = _finding(code, hit, path, positions, lines)
        if _suppressed(finding, suppressions):
            continue
        if finding.fix is not None and _fix_edits_a_suppressed_line(finding, suppressions):
            # A use's fix that rewrites its import too must not touch an import whose noqa comment covers it.
            finding = dataclasses.replace(finding, fix=None)
        findings.append(finding)
    return sorted(findings, key=Finding.sort_key)


class _Locator:
    """Positions of reported nodes, computed one small unit at a time.

    libcst's PositionProvider re-generates the code of whatever it is given, which costs more
    than parsing it; a finding needs the positions of a few nodes only. A node's unit is the
    innermost function or class holding it, else its top-level statement (recorded by the facts
    pass). The unit is positioned on a module holding just that unit, then moved to where
    CPython's parser (a C pass, ~3% of libcst's parse) says the unit starts. Anything that does
    not line up falls back to positions over the whole file, so a position is never a guess.
    """

    def __init__(self, module: cst.Module, text: str, facts: AmpFacts) -> None:
        self.module, self.text, self.facts = module, text, facts
        self.lines = physical_lines(text)
        self._units: dict[int, _UnitPositions | None] = {}
        self._whole = None

    @cached_property
    def _origins(self) -> dict[int, tuple[int, int]]:
        """id(unit) -> (first line, column) of every unit, decorators included, from CPython."""
        try:
            tree = python_tree(self.text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return {}
        origins: dict[int, tuple[int, int]] = {}
        position = 0
        for statement in self.module.body:
            count = len(statement.body) if isinstance(statement, cst.SimpleStatementLine) else 1
            if position + count > len(tree.body):
                return {}
            origins[id(statement)] = (first_line(tree.body[position]), 0)
            position += count
        kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        definitions = sorted((n for n in nodes(tree) if isinstance(n, kinds)), key=lambda n: (n.lineno, n.col_offset))
        if position == len(tree.body) and len(definitions) == len(self.facts.definitions):
            for ours, theirs in zip(self.facts.definitions, definitions):
                if ours.name.value != theirs.name:
                    break
                origins[id(ours)] = (first_line(theirs), theirs.col_offset)
        return origins

    def __contains__(self, node) -> bool:
        return node is not None and self.facts.unit_of.get(id(node)) is not None

    def locate(self, node, near: Iterable = ()) -> CodeRange:
        """`node`'s range; `near` are nodes of the same finding, for nodes the facts pass skipped."""
        for holder in (node, *near):
            unit = self.facts.unit_of.get(id(holder)) if holder is not None else None
            if unit is not None:
                where = self._unit_positions(unit)
                found = where.locate(node) if where is not None else None
                if found is not None:
                    return found
        return self._whole_file()[node]

    def _unit_positions(self, unit) -> _UnitPositions | None:
        if id(unit) not in self._units:
            origin = self._origins.get(id(unit))
            self._units[id(unit)] = _UnitPositions(self.module, unit, origin, self.lines) if origin else None
        return self._units[id(unit)]

    def _whole_file(self):
        if self._whole is None:
            self._whole, _code = _positions(self.module)
        return self._whole


def _positions(module: cst.Module) -> tuple[Mapping[cst.CSTNode, CodeRange], str]:
    """libcst's PositionProvider's positions of every node of `module`, and the code they refer
    to, from one code generation: resolving them through a MetadataWrapper walks the whole tree
    once more, and `module.code` generates it again (together two thirds of the cost)."""
    provider = PositionProvider()
    state = PositionProvidingCodegenState(default_indent=module.default_indent, default_newline=module.default_newline, provider=provider)
    module._codegen(state)
    return provider._computed, "".join(state.tokens)


class _UnitPositions:
    """libcst positions inside one unit, moved to the unit's place in the file.

    Lines move by a constant. Columns move by the unit's indentation on the lines libcst writes
    with its own indentation (statements, comments) and not at all on lines it copies verbatim
    (inside brackets or strings); comparing each generated line with the file's says which.
    """

    def __init__(self, module: cst.Module, unit, origin: tuple[int, int], lines: list[str]) -> None:
        self.positions, code = _positions(module.with_changes(body=[unit], header=[], footer=[]))
        self.generated = physical_lines(code)
        self.lines, self.indent = lines, origin[1]
        # A decorated definition's position starts at `def`/`class`; CPython's first line is the decorator's.
        anchor = unit.decorators[0] if getattr(unit, "decorators", None) else unit
        self.offset = origin[0] - self.positions[anchor].start.line

    def locate(self, node) -> CodeRange | None:
        where = self.positions.get(node)
        if where is None:
            return None
        start, end = self._move(where.start, False), self._move(where.end, True)
        return CodeRange(start, end) if start and end else None

    def _move(self, position: CodePosition, is_end: bool) -> CodePosition | None:
        line = position.line + self.offset
        if not 0 < position.line <= len(self.generated) or not 0 < line <= len(self.lines):
            return None
        generated, actual = self.generated[position.line - 1], self.lines[line - 1]
        if actual == generated:
            return CodePosition(line, position.column)
        if actual[self.indent :] == generated and not actual[: self.indent].strip():
            # An end at column 0 is right after a newline (column 0 here too), unless the line
            # starts at the unit's own level: then it ends after the unit's indentation, which
            # libcst writes empty (a bracket closed on its own line, `    ) -> Tensor:`).
            after_newline = is_end and position.column == 0 and not generated[:1].strip()
            return CodePosition(line, position.column if after_newline else position.column + self.indent)
        return None


def _edit(replacement, positions: _Locator, lines: list[str], near: tuple) -> Edit:
    where = positions.locate(replacement.node, near)
    if isinstance(replacement, Insertion):
        line_text = lines[where.start.line - 1] if where.start.line <= len(lines) else ""
        indent = line_text[: len(line_text) - len(line_text.lstrip(" \t"))]
        if replacement.before:
            return Edit(where.start.line, len(indent) + 1, where.start.line, len(indent) + 1, f"{replacement.text}\n{indent}")
        return Edit(where.end.line, where.end.column + 1, where.end.line, where.end.column + 1, f"\n{indent}{replacement.text}")
    return Edit(where.start.line, where.start.column + 1, where.end.line, where.end.column + 1, replacement.content)


def _finding(code: str, hit: Hit, path: str, positions: _Locator, lines: list[str]) -> Finding:
    info = rule_info(code)
    near = (hit.statement, hit.node)
    where = positions.locate(hit.node, near)
    statement_line = positions.locate(hit.statement).start.line if hit.statement in positions else where.start.line
    message = hit.message.format(*(positions.locate(n, near).start.line for n in hit.related)) if hit.related else hit.message
    fix = None
    if hit.fix is not None:
        edits = tuple(_edit(r, positions, lines, near) for r in hit.fix.replacements)
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
        # Universal newlines: a lone CR ends a line, as in Python's tokenizer and LINE_BREAK.
        for token in tokenize.generate_tokens(io.StringIO(text, newline=None).readline):
            if token.type == tokenize.COMMENT:
                yield token.start[0], token.string
    except (tokenize.TokenError, SyntaxError):
        return


def _file_noqa(text: str) -> bool:
    """`# amplint: noqa` on a line of its own, as a comment (tokenized only when the text has it)."""
    lines = {len(LINE_BREAK.findall(text, 0, m.start())) + 1 for m in _FILE_NOQA.finditer(text)}
    return bool(lines) and any(number in lines and _FILE_NOQA.match(comment) for number, comment in _comments(text))


def noqa_by_line(text: str) -> dict[int, set[str] | None]:
    """Line -> codes or code prefixes suppressed there (None: every code)."""
    table: dict[int, set[str] | None] = {}
    if "noqa" not in text.lower():
        return table
    for number, comment in _comments(text):
        codes = noqa_codes(comment)
        if codes is not False:
            table[number] = codes
    return table


def _suppressed(finding: Finding, suppressions: dict[int, set[str] | None]) -> bool:
    return any(_covers(suppressions, line, finding.code) for line in {finding.line, finding.noqa_line})


def _fix_edits_a_suppressed_line(finding: Finding, suppressions: dict[int, set[str] | None]) -> bool:
    lines = {line for edit in finding.fix.edits for line in range(edit.line, edit.end_line + 1)}
    return any(_covers(suppressions, line, finding.code) for line in lines)


def _covers(suppressions: dict[int, set[str] | None], line: int | None, code: str) -> bool:
    """Whether a `# noqa` on `line` covers `code`."""
    return line in suppressions and noqa_covers(suppressions[line], code)

