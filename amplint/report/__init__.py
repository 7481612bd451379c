"""Reporters: findings in, text out. One module per format, chosen by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import TextIO

from amplint.model import Finding

Renderer = Callable[[list[Finding], TextIO, dict], None]


def renderer(name: str) -> Renderer:
    if name == "text":
        from amplint.report.text import render
    elif name == "concise":
        from amplint.report.concise import render
    elif name == "json":
        from amplint.report.json_format import render
    elif name == "sarif":
        from amplint.report.sarif import render
    elif name == "github":
        from amplint.report.github import render
    else:  # the CLI's choices make this unreachable
        raise ValueError(f"unknown format {name!r}")
    return render
