"""GitHub Actions workflow commands: each finding becomes an annotation on the pull request."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TextIO

from amplint.model import Finding


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _annotated_path(path: str) -> str:
    """The path as GitHub matches it against the pull request's files: relative to the checkout
    (`GITHUB_WORKSPACE`, else the current folder), without the `./` of `amplint --format github .`
    (GitHub shows no annotation for `./src/a.py`, nor for `a.py` run from inside `src/`)."""
    # abspath, not resolve(): a link is annotated where the pull request shows it, not at its target.
    candidate = Path(os.path.abspath(path))
    for root in (os.environ.get("GITHUB_WORKSPACE"), os.getcwd()):
        if root:
            try:
                return candidate.relative_to(os.path.abspath(root)).as_posix()
            except ValueError:
                continue
    return Path(path).as_posix()


def render(findings: list[Finding], out: TextIO, context: dict) -> None:
    for f in findings:
        out.write(
            f"::error file={_escape_property(_annotated_path(f.path))},line={f.line},col={f.column},"
            f"endLine={f.end_line},endColumn={f.end_column},title={f.code}::"
            f"{_escape_data(f'{f.code} {f.message}')}\n"
        )
