"""The rules: each module is a small query over `AmpFacts` that yields `Hit`s.

A rule module defines `CODE` and `check(facts) -> Iterable[Hit]`. Name, severity and
documentation come from the rule's Markdown file in `rules/`, so they are written once.
"""

from __future__ import annotations

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
    statement: cst.CSTNode | None = None  # whose first line may carry the `# noqa`
    fix: FixPlan | None = None
    # Nodes whose line numbers fill the message's `{0}`, `{1}`... once positions are known.
    related: tuple[cst.CSTNode, ...] = ()
    # A finding less certain than its rule's default (e.g. AMP016's hardware check) says so here.
    severity: Severity | None = None


Check = Callable[["AmpFacts"], Iterable[Hit]]  # noqa: F821 (forward reference for readers)


def all_checks() -> dict[str, Check]:
    from amplint.static.checks import (
        amp001_deprecated_api,
        amp002_half_with_autocast,
        amp003_backward_in_autocast,
        amp004_scaler_per_iteration,
        amp005_clip_without_unscale,
        amp006_optimizer_step_bypasses_scaler,
        amp007_scaler_step_update_pairing,
        amp008_unscale_per_microbatch,
        amp009_fp16_autocast_without_scaler,
        amp010_scaler_with_bf16,
        amp011_scheduler_on_skipped_step,
        amp012_checkpoint_without_scaler_state,
        amp013_custom_function_without_custom_fwd,
        amp014_disabled_region_uncast_inputs,
        amp015_autocast_not_in_thread,
        amp016_autocast_dtype_misuse,
        amp017_compile_backward_autocast_mismatch,
    )

    modules = (
        amp001_deprecated_api,
        amp002_half_with_autocast,
        amp003_backward_in_autocast,
        amp004_scaler_per_iteration,
        amp005_clip_without_unscale,
        amp006_optimizer_step_bypasses_scaler,
        amp007_scaler_step_update_pairing,
        amp008_unscale_per_microbatch,
        amp009_fp16_autocast_without_scaler,
        amp010_scaler_with_bf16,
        amp011_scheduler_on_skipped_step,
        amp012_checkpoint_without_scaler_state,
        amp013_custom_function_without_custom_fwd,
        amp014_disabled_region_uncast_inputs,
        amp015_autocast_not_in_thread,
        amp016_autocast_dtype_misuse,
        amp017_compile_backward_autocast_mismatch,
    )
    return {module.CODE: module.check for module in modules}
