"""Fix builders for the rules that have one (AMP001, AMP005); each returns a FixPlan or None."""

from __future__ import annotations

from amplint.static.checks import FixPlan


def deprecated_import(ref, facts) -> FixPlan | None:
    return None


def deprecated_call(call, facts) -> FixPlan | None:
    return None


def deprecated_reference(ref, qualname, facts) -> FixPlan | None:
    return None


def unscale_before(event, scaler, owner, events, facts) -> FixPlan | None:
    return None
