"""AMP003 backward-in-autocast: backward or an optimizer step while autocast is still enabled."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from amplint.static import names
from amplint.static.checks import Hit
from amplint.static.checks import _regions as rg
from amplint.static.semantics import AmpFacts, Autocast, CallSite, Context

CODE = "AMP003"


def step_kind(call: CallSite, facts: AmpFacts) -> str | None:
    """"backward" or "step" for the calls that belong after the autocast region."""
    if facts.called_function(call) is not None:
        return None  # `self.backward(loss)`: the helper's own backward is what gets reported
    if call.method in ("backward", "manual_backward") or call.qualname in names.AUTOGRAD_BACKWARD:  # Lightning: self.manual_backward(loss)
        return "backward"
    if call.method == "step":
        if facts.is_scaler(call.receiver_key, call.scope):
            return "scaler step"
        if facts.is_optimizer(call.receiver_key, call.scope):
            return "optimizer step"
    return None


def check(facts: AmpFacts) -> Iterator[Hit]:
    if not facts.has_autocast:
        return
    for call in facts.calls:
        kind = step_kind(call, facts)
        if kind is None:
            continue
        # A helper called under no_grad builds no graph there, so its backward cannot run for
        # that call (torchao's tests run a train-or-eval helper that way for the eval half).
        region = facts.region_of(call.where, through=lambda site: not rg.in_no_grad(facts, site))
        if region is None:
            continue
        autocast, via = region
        opened = _entered_at(facts, via.where if via is not None else call.where, autocast)
        reached = " through the call on line {1}" if via is not None else ""
        by_hand = isinstance(opened, cst.Call) and isinstance(opened.func, cst.Attribute) and opened.func.attr.value == "__enter__"
        end = "call `__exit__()` on it" if by_hand else "end the autocast block"
        yield Hit(
            call.node,
            f"{kind} runs inside the autocast region opened on line {{0}}{reached}; {end} after the "
            f"forward pass and loss, and run backward and the optimizer step after it",
            call.where.statement,
            related=(opened, via.node) if via is not None else (opened,),
        )


def _entered_at(facts: AmpFacts, where: Context, autocast: Autocast) -> cst.CSTNode:
    """The `with` item that enters the region around `where` (`with autocast_cuda(...):` for
    `autocast_cuda = partial(torch.autocast, "cuda")`), else where the region is built (a
    decorator), or the `__enter__()` call that enters it by hand."""
    for item in reversed(where.withs):
        region = facts.autocast_of(item.item, where.scope)
        if region is not None and region.node is autocast.node:
            return item.item
    entered = facts.entered_by_hand(where)
    if entered is not None and entered[1].node is autocast.node:
        return entered[0].node
    return autocast.node
