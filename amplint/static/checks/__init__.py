"""The rules: each module is a small query over `AmpFacts` that yields `Hit`s.

A rule module defines `CODE` and `check(facts) -> Iterable[Hit]`. Name, severity and
documentation come from the rule's Markdown file in `rules/`, so they are written once.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import libcst as cst

from amplint.model import Applicability, Severity


@dataclass(frozen=True)
class Replacement:
    """Replace one node's source with new text."""

    node: cst.CSTNode
    content: str


@dataclass(frozen=True)
class Insertion:
    """Insert a statement on its own line before (or after) the statement `node`, same indentation."""

    node: cst.CSTNode
    text: str
    before: bool = True


@dataclass(frozen=True)
class FixPlan:
    applicability: Applicability
    replacements: tuple[Replacement | Insertion, ...]


@dataclass(frozen=True)
class Hit:
    node: cst.CSTNode  # what the finding points at
    message: str
    statement: cst.CSTNode | None = None  # whose first line may carry a suppression comment
    fix: FixPlan | None = None
    # Nodes whose line numbers fill the message's `{0}`, `{1}`... once positions are known.
    related: tuple[cst.CSTNode, ...] = ()
    # A finding less certain than its rule's default (e.g. AMP016's hardware check) says so here.
    severity: Severity | None = None


Check = Callable[["AmpFacts"], Iterable[Hit]]  # noqa: F821 (forward reference for readers)


def all_checks() -> dict[str, Check]:
    """Every rule module in this package (`ampNNN_name.py`), by code."""
    return {module.CODE: module.check for module in _rule_modules()}


@functools.cache
def _rule_modules() -> tuple:
    names = sorted(info.name for info in pkgutil.iter_modules(__path__) if re.match(r"amp\d{3}_", info.name))
    return tuple(importlib.import_module(f"{__name__}.{name}") for name in names)
