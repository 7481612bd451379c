"""The default human format: location, code, message and the source line, coloured on a terminal."""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from amplint.model import Finding, Severity

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "bold yellow", Severity.INFO: "bold blue"}


def _source_line(path: str, line: int, cache: dict[str, list[str]]) -> str | None:
    if path not in cache:
        try:
            cache[path] = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            cache[path] = []
    lines = cache[path]
    return lines[line - 1] if 0 < line <= len(lines) else None


def render(findings: list[Finding], out: TextIO, context: dict) -> None:
    if not findings:
        return
    from rich.console import Console
    from rich.markup import escape

    console = Console(file=out, highlight=False, soft_wrap=True, force_terminal=context.get("color"), no_color=not context.get("color", out.isatty()))
    sources: dict[str, list[str]] = context.get("sources_text", {})
    for f in findings:
        fixable = " [cyan]\\[*][/]" if f.fix is not None else ""
        console.print(f"[bold]{escape(f.path)}[/]:{f.line}:{f.column}: [{_STYLE[f.severity]}]{f.code}[/]{fixable} {escape(f.message)}")
        text = _source_line(f.path, f.line, sources) if f.code != "AMP000" else None
        if text is not None:
            gutter = str(f.line)
            width = (f.end_column - f.column) if f.end_line == f.line else len(text) - f.column + 1
            console.print(f"[blue]{gutter} |[/] {escape(text)}")
            console.print(f"[blue]{' ' * len(gutter)} |[/] {' ' * (f.column - 1)}[{_STYLE[f.severity]}]{'^' * max(1, width)}[/]")
        console.print()
