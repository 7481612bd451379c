"""AMP006 optimizer-step-bypasses-scaler: `opt.step()` after a scaled backward, without `scaler.step(opt)`."""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from amplint.model import Applicability
from amplint.static.checks import FixPlan, Hit
from amplint.static.checks import _training_step as ts
from amplint.static.semantics import AmpFacts, Scope, dotted_name, identifiers

CODE = "AMP006"


def check(facts: AmpFacts) -> Iterator[Hit]:
    reported: set[int] = set()
    scaled_in_file = any(c.method == "scale" and facts.is_scaler(c.receiver_key, c.scope) for c in facts.calls)
    # A step is judged first in the function it is written in, then as a helper's step seen from
    # its callers: the fix can only be built where `opt.step()` is written, and a caller analysed
    # earlier (`main()` called at module level) must not claim the step without one.
    for written_here in (True, False):
        for function in ts.functions_with_events(facts):
            yield from _steps_bypassing_the_scaler(facts, function, written_here, scaled_in_file, reported)


def _steps_bypassing_the_scaler(
    facts: AmpFacts, function: Scope, written_here: bool, scaled_in_file: bool, reported: set[int]
) -> Iterator[Hit]:
    """The optimizer steps of a function's events, those written in it or those of the helpers it
    calls, that follow a scaled backward without going through the scaler."""
    events = ts.events_of(facts, function)
    scaled = [e for e in events if e.kind == "scale_backward"]
    if not scaled:
        if scaled_in_file:
            yield from _stepped_after_an_unscale_alone(facts, events, written_here, reported)
        return
    scaler_steps = [e for e in events if e.kind == "step"]
    for event in events:
        if event.kind != "opt_step" or id(event.call.node) in reported or (event.anchor is event.call.where) != written_here:
            continue
        if "scaler" in identifiers(event.call.node).lower():
            # A custom optimizer that is handed the scaler (`opt.step(grad_scaler=...)`); a comment
            # in the call that names it hands nothing.
            continue
        again = _stepped_by_the_scaler_before(facts, event, scaler_steps)
        if again is not None:
            reported.add(id(event.call.node))
            yield Hit(
                event.call.node,
                f"`{event.target}.step()` runs again after `{again.scaler}.step({again.target})` (line "
                f"{{0}}) in the same iteration: the weights are updated twice, and the second update "
                f"applies the steps the scaler skipped for inf/NaN gradients; remove it, or make it "
                f"the other branch of the `if` that chooses AMP",
                event.call.where.statement,
                related=(again.call.node,),
            )
            continue
        if any(_the_other_amp_branch(facts, s, event) for s in scaler_steps) or _fed_by_its_own_backward(facts, event):
            continue
        # A scaled backward before the step, or after it in a loop both run in (the next
        # iteration's step follows it); one that only follows the step is not its partner.
        partners = [
            s for s in scaled
            if not ts.exclusive(facts, s, event) and (s.order < event.order or _share_a_loop(s, event))
            and not _own_plain_backward(facts, s, event, events)
            and not _regrown_by_a_plain_backward(facts, s, event, events)
        ]
        if not partners:
            continue
        reported.add(id(event.call.node))
        before = [s for s in partners if s.order < event.order]
        partner = before[-1] if before else partners[0]
        scaler = partner.scaler
        fix = _fix(facts, event, scaler, events) if _same_condition(partner, event) else None
        unscale = _unscaled_before(facts, event, partner, events)
        if unscale is not None:
            message = _after_unscale(event, unscale, scaler)
            before_step = unscale.call
        else:
            message = (
                f"`{event.target}.step()` is called directly after `{scaler}.scale(...).backward()` "
                f"(line {{0}}): the gradients are still multiplied by the scale and steps with inf/NaN "
                f"gradients are not skipped; call `{scaler}.step({event.target})` and then "
                f"`{scaler}.update()`"
            )
            before_step = partner.call
        yield Hit(event.call.node, message, event.call.where.statement, fix, related=(before_step.node,))


def _after_unscale(step: ts.Event, unscale: ts.Event, scaler: str) -> str:
    # The gradients are right; what is lost is the skip of a step whose gradients hold inf/NaN.
    return (
        f"`{step.target}.step()` is called directly after `{unscale.scaler}.unscale_({unscale.target})` "
        f"(line {{0}}): the gradients are unscaled, but a step whose gradients hold inf/NaN is applied "
        f"instead of skipped (the weights become NaN); call `{scaler}.step({step.target})` in its place"
    )


def _stepped_after_an_unscale_alone(facts: AmpFacts, events: list[ts.Event], written_here: bool, reported: set[int]) -> Iterator[Hit]:
    """A function whose scaled backward runs elsewhere in the file (a callback handed to a
    wrapper, the caller) and that unscales an optimizer and steps it itself, with no
    `scaler.step` of it in between (DLRM's `weight_update`): `unscale_` is only ever called on
    scaled gradients, and the file scales a loss somewhere."""
    for event in events:
        if event.kind != "opt_step" or id(event.call.node) in reported or (event.anchor is event.call.where) != written_here:
            continue
        unscales = [
            e for e in events
            if e.kind == "unscale" and ts.same_object(e.target, event.target) and e.order < event.order
            and not ts.exclusive(facts, e, event)
        ]
        if not unscales or any(
            e.kind == "step" and ts.same_object(e.target, event.target) and unscales[-1].order < e.order < event.order
            for e in events
        ):
            continue
        reported.add(id(event.call.node))
        unscale = unscales[-1]
        yield Hit(
            event.call.node, _after_unscale(event, unscale, unscale.scaler), event.call.where.statement, related=(unscale.call.node,)
        )


def _unscaled_before(facts: AmpFacts, step: ts.Event, backward: ts.Event, events: list[ts.Event]) -> ts.Event | None:
    """The last `unscale_()` of the stepped optimizer, by the backward's scaler, between that
    backward and the step, on the same pass."""
    unscales = [
        e for e in events
        if e.kind == "unscale" and ts.same_object(e.target, step.target) and ts.same_object(e.scaler, backward.scaler)
        and backward.order < e.order < step.order and not ts.exclusive(facts, e, step)
    ]
    return unscales[-1] if unscales else None


def _the_other_amp_branch(facts: AmpFacts, scaler_step: ts.Event, step: ts.Event) -> bool:
    """Whether `scaler.step(opt)` of the same optimizer stands for this plain step on AMP runs:
    they are split by an `if` that switches AMP (`if scaler: ... else: opt.step()`, where a
    disabled scaler's `scale(loss)` returns the loss itself), or not split by any `if` of the
    function. Split by any other test (`if i % 2 == 0:`, `if torch.isfinite(loss):`, or `if not
    torch.isfinite(loss): opt.step(); continue` before the scaler's step), the plain step runs on
    scaled gradients in the same run."""
    if not ts.same_object(scaler_step.target, step.target):
        return False
    split = _splitting_if(facts, scaler_step, step)
    return split is None or ts.mentions(facts, split, ts.AMP_SWITCH)


def _splitting_if(facts: AmpFacts, a: ts.Event, b: ts.Event) -> cst.BaseExpression | None:
    """The test of the `if` of the function that puts the two calls in different branches, or
    whose body, holding `b`, leaves the pass before `a` runs."""
    if a.anchor is not a.call.where or b.anchor is not b.call.where:
        return None  # a helper's: its caller's branches are not seen here
    labels = dict(a.call.where.branches)
    for node_id, label in b.call.where.branches:
        if labels.get(node_id, label) != label:
            return facts.if_tests.get(node_id)
    if ts.cut_off_after(facts, b, a):
        outside = {node_id for node_id, _ in a.call.where.branches}
        inner = [node_id for node_id, _ in b.call.where.branches if node_id not in outside]
        return facts.if_tests.get(inner[-1]) if inner else None
    return None


def _stepped_by_the_scaler_before(facts: AmpFacts, step: ts.Event, scaler_steps: list[ts.Event]) -> ts.Event | None:
    """The `scaler.step(opt)` of the same optimizer that runs earlier in the same iteration of the
    same function (old torchvision: `scaler.step(optimizer)` under `if args.amp:`, then
    `optimizer.step()` for all). Not one in another helper the caller also calls: an AMP run and
    an fp32 run of the same model, one after the other, are separate loops."""
    function = step.call.where.scope.function_scope
    loop = ts.innermost_loop(step.anchor)
    return next(
        (
            s for s in reversed(scaler_steps)
            if ts.same_object(s.target, step.target) and s.order < step.order
            and s.call.where.scope.function_scope is function
            and not ts.exclusive(facts, s, step) and ts.innermost_loop(s.anchor) is loop
        ),
        None,
    )


_BACKWARD_CALL = re.compile(r"(^|_)backward$")


def _fed_by_its_own_backward(facts: AmpFacts, step: ts.Event) -> bool:
    """The optimizer was handed, earlier in the same function, to a call that back-propagates a loss
    of its own (insightface's partial-FC head: `x_grad, loss = partial_fc.forward_backward(labels,
    features, opt_pfc)`, while only the backbone's backward is scaled): its gradients never went
    through the scaler."""
    function = step.call.where.scope.function_scope
    for call in facts.calls:
        if call.node is step.call.node:
            return False
        if (
            call.where.scope.function_scope is function
            and _BACKWARD_CALL.search(call.name)
            and any(ts.same_object(dotted_name(a.value), step.target) for a in call.node.args)
            and not any(_scaled(facts, a.value, call) for a in call.node.args)
            and _plain_backward_inside(facts, call)
        ):
            return True
    return False


def _scaled(facts: AmpFacts, value, call) -> bool:
    """The scaler itself, or a loss it scaled (`scaler.scale(loss)`)."""
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "scale":
        return True
    return facts.is_scaler(dotted_name(value), call.scope)


def _plain_backward_inside(facts: AmpFacts, call) -> bool:
    """A helper of another file is taken at its word; one of this file back-propagates a loss of
    its own when it calls an unscaled backward and scales nothing."""
    helper = facts.called_function(call)
    if helper is None:
        return True
    return not any(c.method == "scale" for c in helper.calls) and any(
        c.method == "backward" and not isinstance(c.receiver, cst.Call) for c in helper.calls
    )


def _own_plain_backward(facts: AmpFacts, scaled: ts.Event, step: ts.Event, events: list[ts.Event]) -> bool:
    """The step's loop back-propagates a plain loss before the step, and the scaled backward runs
    outside that loop: an AMP loop, then a float32 one in the same scope (MONAI's tutorial
    notebooks train a diffusion model with a scaler, then a classifier in fp32, at module level),
    or in two functions called one after the other (a benchmark's GradScaler baseline, then the
    same loop through `accelerator.backward(loss)`). The loop is the step's own, in a helper too,
    or the caller's loop around the helper's call."""
    loops = {ts.innermost_loop(step.call.where), ts.innermost_loop(step.anchor)} - {None}
    return any(
        not _inside(loop, scaled) and any(
            e.kind == "backward" and _inside(loop, e) and e.order < step.order and _same_condition(e, step)
            for e in events
        )
        for loop in loops
    )


def _regrown_by_a_plain_backward(facts: AmpFacts, scaled: ts.Event, step: ts.Event, events: list[ts.Event]) -> bool:
    """The step's own function clears the optimizer's gradients (`opt_probe.zero_grad()`) and then
    back-propagates a plain loss before the step, with no scaled backward in between: an fp32
    probe or critic trained beside the AMP model, whose gradients the scaler never multiplied."""
    if step.anchor is not step.call.where:
        return False
    function = step.call.where.scope.function_scope
    loop = ts.innermost_loop(step.anchor)
    clears = [
        (c.where.order, c.where.order) for c in facts.calls
        if c.method == "zero_grad" and ts.same_object(c.receiver_key, step.target)
        and c.where.scope.function_scope is function and ts.innermost_loop(c.where) is loop
    ]
    return any(
        clear < e.order < step.order and not clear < scaled.order < step.order
        and e.kind == "backward" and e.anchor is e.call.where and _same_condition(e, step)
        for clear in clears for e in events
    )


def _inside(loop, event: ts.Event) -> bool:
    """Whether the event runs in the loop, written in its own function or around a helper's call."""
    return loop in event.call.where.loops or loop in event.anchor.loops


def _share_a_loop(a: ts.Event, b: ts.Event) -> bool:
    loop = ts.innermost_loop(a.anchor)
    return loop is not None and loop in b.anchor.loops


def _same_condition(backward: ts.Event, step: ts.Event) -> bool:
    """The backward runs whenever the step does (no `if scaler is not None:` around it alone)."""
    return all(any(guard is other for other in step.anchor.ifs) for guard in backward.anchor.ifs)


def _fix(facts: AmpFacts, event: ts.Event, scaler: str, events: list[ts.Event]) -> FixPlan | None:
    if event.anchor is not event.call.where:
        return None  # the step is in a helper, where the scaler's name may not be bound
    replacement = f"{scaler}.step({event.target})"
    # An update that runs after this step in the same pass (not one in the other branch of the
    # `if` that splits it from the scaler's own step, nor one after a block that leaves first).
    has_update = any(
        e.kind == "update" and ts.same_object(e.scaler, scaler) and e.order > event.order
        and not ts.exclusive(facts, e, event) and not ts.cut_off_after(facts, event, e)
        for e in events
    )
    if has_update:
        return FixPlan(Applicability.UNSAFE, (ts.Replacement(event.call.node, replacement),))
    edits = ts.add_statement_after_call(facts, event.call, replacement, f"{scaler}.update()")
    return FixPlan(Applicability.UNSAFE, edits) if edits else None
