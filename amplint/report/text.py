"""The default human format: location, code, message and the source line, coloured on a terminal."""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from amplint.model import Finding, Severity
from amplint.static.source import SourceError, decode_source, physical_lines

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "bold yellow", Severity.INFO: "bold blue"}


def wants_color(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Colour only on a terminal; NO_COLOR (https://no-color.org) turns it off, FORCE_COLOR on."""
    environ = os.environ if environ is None else environ
    if environ.get("NO_COLOR"):
        return False
    if environ.get("FORCE_COLOR"):
        return True
    if environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream
        return False


def _source_line(path: str, line: int, cache: dict[str, list[str]]) -> str | None:
    if path not in cache:
        try:
            cache[path] = physical_lines(_decoded(Path(path).read_bytes()))
        except OSError:
            cache[path] = []
    lines = cache[path]
    return lines[line - 1] if 0 < line <= len(lines) else None


def _decoded(source: bytes) -> str:
    """The text as the checker read it (a PEP 263 coding line, a BOM), so that the line shown and
    the carets under it match the reported columns."""
    try:
        return decode_source(source)[0]
    except SourceError:
        return source.decode("utf-8", errors="replace")


def render(findings: list[Finding], out: TextIO, context: dict) -> None:
    """`context["color"]`: True/False; when absent, decided by `wants_color(out)`. Plain text is
    written directly: pre-commit and CI read a pipe, and rich costs a tenth of a one-file run."""
    if not findings:
        return
    color = context.get("color")
    if color is None:
        color = wants_color(out)
    lines = _lines(findings, dict(context.get("sources_text") or {}), context.get("unsafe_fixes", False))
    if not color:
        out.write("".join("".join(text for text, _style in line).expandtabs(8) + "\n" for line in lines))
        return
    from rich.console import Console
    from rich.text import Text

    console = Console(file=out, force_terminal=True, color_system="auto", highlight=False, emoji=False, soft_wrap=True)
    for line in lines:
        console.print(Text.assemble(*line))


_Line = list[tuple[str, str | None]]  # pieces of text and their style


def _display_width(text: str) -> int:
    """Terminal columns: wide East Asian characters take two, combining marks none."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _lines(findings: list[Finding], sources: dict[str, list[str]], unsafe: bool) -> list[_Line]:
    lines: list[_Line] = []
    for f in findings:
        style = _STYLE[f.severity]
        fixable = [(" ", None), ("[*]", "cyan")] if f.fixable(unsafe) else []
        lines.append([(f.path, "bold"), (f":{f.line}:{f.column}: ", None), (f.code, style), *fixable, (f" {f.message}", None)])
        text = _source_line(f.path, f.line, sources) if f.code != "AMP000" else None
        if text is not None:
            gutter = str(f.line)
            prefix = text[: f.column - 1]
            flagged = text[f.column - 1 : f.end_column - 1] if f.end_line == f.line else text[f.column - 1 :]
            width = _display_width(flagged)
            # Tabs before the finding keep their width, so the carets stay under the code.
            pad = "".join(ch if ch == "\t" else " " * _display_width(ch) for ch in prefix)
            lines.append([(f"{gutter} |", "blue"), (f" {text}", None)])
            lines.append([(f"{' ' * len(gutter)} |", "blue"), (f" {pad}", None), ("^" * max(1, width), style)])
        lines.append([])
    return lines
