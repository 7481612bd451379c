"""The checker's library entry points, for the CLI, the tracer and tests."""

from __future__ import annotations

from collections.abc import Iterable

from amplint.model import Finding


def lint_source(
    source: bytes | str, path: str, select: Iterable[str] | None = None, min_torch: tuple[int, ...] | None = None
) -> list[Finding]:
    """All findings for one file's source, sorted by position, `# noqa` already applied.

    `select` is a set of rule codes to report (default: every rule); `min_torch` limits fixes to
    replacements that exist in that torch version.
    """
    from amplint.static.analyse import analyse_source

    return analyse_source(source, path, select, min_torch)
