"""`--add-noqa`: suppress a file's current findings with `# noqa: CODE` comments, as ruff does when
a linter is adopted on an existing code base (fix what matters, silence the rest, keep CI green).

Only whole comments are added, byte for byte: line endings, the encoding and every other
character stay as they were. A comment goes on the reported line, else on the first line of its
statement (where `# noqa` is also read), and only on a line that ends outside a string and
without a backslash continuation, where a comment is valid Python.
"""

from __future__ import annotations

import codecs
import io
import re
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass

from amplint.model import Finding
from amplint.static.source import NOQA, SourceError, decode_source, noqa_codes, noqa_covers, python_tree

_LINE_BREAK = re.compile(rb"(\r\n|\r|\n)")  # the line breaks Python's tokenizer counts


@dataclass
class Added:
    source: bytes
    comments: int  # findings newly covered
    skipped: int  # findings on lines that cannot take a comment


def add_noqa(source: bytes, findings: Iterable[Finding]) -> Added:
    """`source` with each finding covered by a `# noqa` comment. Raises SourceError for a file that
    cannot be decoded or tokenized, and when the result would not parse where the source did."""
    findings = [f for f in findings if f.code != "AMP000"]  # a file that does not parse has no line for one
    if not findings:
        return Added(source, 0, 0)
    text, encoding = decode_source(source)
    if codecs.lookup(encoding).name == "utf-8-sig":
        encoding = "utf-8"  # the mark stays where it is, at the start of the first line
    if "#".encode(encoding) != b"#":
        raise SourceError(f"cannot add comments to a file encoded as {encoding}")
    open_lines, comments = _lines_that_take_a_comment(text)
    wanted: dict[int, list[str]] = {}
    skipped = 0
    for finding in findings:
        line = next((n for n in (finding.line, finding.noqa_line) if n in open_lines), None)
        if line is None:
            skipped += 1
            continue
        codes = wanted.setdefault(line, [])
        if finding.code not in codes:
            codes.append(finding.code)
    parts = _LINE_BREAK.split(source)  # content, break, content, ..., content (maybe empty)
    lines = list(zip(parts[0::2], [*parts[1::2], b""]))
    added = 0
    for number, codes in sorted(wanted.items()):
        content, ending = lines[number - 1]
        comment = comments.get(number)
        new_codes = [code for code in codes if not _covered(comment, code)]
        if not new_codes:
            continue
        lines[number - 1] = (_with_codes(content, comment, new_codes, encoding), ending)
        added += len(new_codes)
    result = b"".join(content + ending for content, ending in lines)
    if added and not _still_parses(result, text):
        raise SourceError("adding the comments would break the file's syntax; nothing was written")
    return Added(result, added, skipped)


def _lines_that_take_a_comment(text: str) -> tuple[set[int], dict[int, str]]:
    """Lines that end outside a string and a continuation, and the comment each already has."""
    open_lines: set[int] = set()
    comments: dict[int, str] = {}
    try:
        # Universal newlines: a lone CR ends a line, as in Python's tokenizer and _LINE_BREAK.
        for token in tokenize.generate_tokens(io.StringIO(text, newline=None).readline):
            if token.type in (tokenize.NEWLINE, tokenize.NL):
                open_lines.add(token.start[0])
            elif token.type == tokenize.COMMENT:
                comments[token.start[0]] = token.string
    except (tokenize.TokenError, SyntaxError) as exc:
        raise SourceError(f"cannot tokenize: {exc}") from None
    return open_lines, comments


def _covered(comment: str | None, code: str) -> bool:
    codes = noqa_codes(comment or "")
    return codes is not False and noqa_covers(codes, code)


def _with_codes(content: bytes, comment: str | None, codes: list[str], encoding: str) -> bytes:
    """The line with `codes` added to its `# noqa: ...`, or a new `# noqa: ...` at its end."""
    match = NOQA.search(comment or "")
    if match is None:
        return content.rstrip(b" \t") + f"  # noqa: {', '.join(codes)}".encode(encoding)
    old = comment.encode(encoding)
    start = content.rindex(old)
    end_of_codes = start + len(comment[: match.end()].encode(encoding))
    return content[:end_of_codes] + f", {', '.join(codes)}".encode(encoding) + content[end_of_codes:]


def _still_parses(result: bytes, text: str) -> bool:
    """Whether `result` parses where the source (`text`, decoded once) did."""
    try:
        python_tree(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError, SourceError):
        return True  # it did not parse before either; libcst read it, and comments change no code
    try:
        python_tree(decode_source(result)[0])
    except (SyntaxError, ValueError, RecursionError, MemoryError, SourceError):
        return False
    return True
