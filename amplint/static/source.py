"""Decoding a source file and reporting one that cannot be read: no libcst needed here."""

from __future__ import annotations

import ast
import io
import re
import tokenize
import warnings

from amplint.catalogue import rule_info
from amplint.model import Finding


class SourceError(Exception):
    """The file cannot be decoded or parsed; carries a 1-based position."""

    def __init__(self, message: str, line: int = 1, column: int = 1) -> None:
        super().__init__(message)
        self.message, self.line, self.column = message, line, column


# What CPython's own parser cannot hold: libcst would take minutes over it, or crash.
TOO_DEEP_FOR_PYTHON = "cannot analyse: the file nests too deeply for Python's parser"
# CPython's limits on nesting, which libcst's native parser does not share: past about 1,100
# brackets it overflows the C stack and the process dies. Such a refusal is final.
_NESTING_LIMITS = ("too many nested parentheses", "too many statically nested blocks", "too many nested f-strings")


def nesting_error(error: Exception) -> SourceError | None:
    """The AMP000 error for a file CPython refuses for its nesting, which no parser is asked again;
    None for any other error CPython's parse raised."""
    if not (isinstance(error, SyntaxError) and any(limit in (error.msg or "") for limit in _NESTING_LIMITS)):
        return None
    return SourceError(f"cannot parse: {error.msg}", error.lineno or 1, error.offset or 1)


def decode_source(source: bytes | str) -> tuple[str, str]:
    """Text and encoding name of a Python source, honouring a BOM and a PEP 263 coding line."""
    if isinstance(source, str):
        return source, "utf-8"
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
    except SyntaxError as exc:
        raise SourceError(f"cannot decode: {exc.msg}") from None
    try:
        return source.decode(encoding), encoding
    except (UnicodeDecodeError, LookupError) as exc:
        line = source[: getattr(exc, "start", 0)].count(b"\n") + 1
        raise SourceError(f"cannot decode as {encoding}: {exc.reason if hasattr(exc, 'reason') else exc}", line) from None


NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Za-z]+\d*(?:[\s,]+[A-Za-z]+\d*)*))?", re.IGNORECASE)


def noqa_codes(comment: str) -> set[str] | None | bool:
    """What a comment's `# noqa` suppresses: its codes or code prefixes, None for a bare `# noqa`
    (every code), False when the comment has none."""
    match = NOQA.search(comment)
    if match is None:
        return False
    codes = match.group("codes")
    return None if codes is None else {c.upper() for c in re.split(r"[\s,]+", codes) if c}


def noqa_covers(suppressed: set[str] | None, code: str) -> bool:
    """Whether a `# noqa` that suppresses `suppressed` (None: every code) covers `code`."""
    return suppressed is None or any(code.startswith(prefix) for prefix in suppressed)


def python_tree(text: str) -> ast.Module:
    """CPython's tree of a user's file, without the warnings compiling it prints (`1()`, an
    invalid escape): those are the user's Python's to give, not a linter's. Raises SyntaxError,
    ValueError and RecursionError as ast.parse does."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(text)


def parse_error_finding(path: str, error: SourceError) -> Finding:
    info = rule_info("AMP000")
    return Finding(
        "AMP000", info.name, info.severity, path, error.line, error.column, error.line, error.column, error.message
    )


# Lines as Python numbers them: `str.splitlines` also breaks at form feeds and other separators,
# which would shift every line after them.
LINE_BREAK = re.compile(r"\r\n|\r|\n")  # as Python and libcst end lines
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def physical_lines(text: str) -> list[str]:
    """The lines without their endings (a final line break leaves an empty last line)."""
    return LINE_BREAK.split(text)


def lines_with_endings(text: str) -> list[str]:
    """The lines, each with its own ending."""
    return _LINE.findall(text)


def code_only(text: str, *, keep_strings: bool = False) -> str:
    """The text with its comments and string literals blanked (lines and columns kept): what a
    text search for code reads, so that a word in a comment, a docstring or a message never
    counts as code. `keep_strings` blanks the comments only (a dict's string keys still name its
    entries). Text that does not tokenize (a fragment) is returned as it is."""
    if "#" not in text and (keep_strings or not any(quote in text for quote in "'\"")):
        return text  # nothing to blank
    blanked_types = (tokenize.COMMENT,) if keep_strings else (tokenize.COMMENT, tokenize.STRING)
    lines = lines_with_endings(text)
    blanked = [list(line) for line in lines]
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type not in blanked_types:
                continue
            (first, start), (last, end) = token.start, token.end
            for row in range(first - 1, last):
                line = blanked[row]
                stop = end if row == last - 1 else len(line)
                for column in range(start if row == first - 1 else 0, stop):
                    if line[column] not in "\r\n":
                        line[column] = " "
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return text
    return "".join("".join(line) for line in blanked)

