"""`path:line:col: CODE message`, one finding per line, as flake8 and ruff's concise format."""

from __future__ import annotations

from typing import TextIO

from amplint.model import Finding


def render(findings: list[Finding], out: TextIO, context: dict) -> None:
    for f in findings:
        marker = " [*]" if f.fixable(context.get("unsafe_fixes", False)) else ""
        out.write(f"{f.path}:{f.line}:{f.column}: {f.code}{marker} {f.message}\n")
