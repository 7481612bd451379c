"""AMP008 unscale-per-microbatch: `unscale_` on micro-batches where the step does not run, or twice."""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from amplint.static.checks import Hit
from amplint.static.checks import _training_step as ts
from amplint.static import names
from amplint.static.semantics import AmpFacts, dotted_name

CODE = "AMP008"


def check(facts: AmpFacts) -> Iterator[Hit]:
    reported: set[int] = set()
    for function in ts.functions_with_events(facts):
        events = [e for e in ts.iteration_events(facts, function) if e.kind in ("unscale", "step", "update")]
        for event in events:
            if event.kind != "unscale" or id(event.call.node) in reported:
                continue
            hit = _microbatch(facts, event, events) or _twice(facts, event, events)
            if hit is not None:
                reported.add(id(event.call.node))
                yield hit
    for hit in _wrapper_and_wrapped(facts):
        if id(hit.node) not in reported:
            yield hit


def _wrapper_and_wrapped(facts: AmpFacts) -> Iterator[Hit]:
    """`scaler.unscale_(X)` and `scaler.step(Y)` where one of X and Y is an optimizer wrapper and
    the other the optimizer it holds (fairseq's AMPOptimizer: `unscale_(self.optimizer)`, a property
    returning `self.fp32_optimizer.optimizer`, then `step(self.fp32_optimizer)`), in one function
    or in the methods of one class: the scaler records what it unscaled per optimizer object."""
    events = [e for f in (facts.module_scope, *facts.functions) for e in ts.own_events(facts).get(id(f), ())]
    steps = [(e, _through_properties(facts, e.target, e.call.scope)) for e in events if e.kind == "step" and e.target is not None]
    for unscale in (e for e in events if e.kind == "unscale" and e.target is not None):
        held = _through_properties(facts, unscale.target, unscale.call.scope)
        for step, stepped in steps:
            if not (ts.same_object(step.scaler, unscale.scaler) and _one_holds_the_other(held, stepped)):
                continue
            if not _same_owner(unscale, step):
                continue
            yield Hit(
                unscale.call.node,
                f"`{unscale.scaler}.unscale_({unscale.target})` unscales `{held}`, but `{step.scaler}.step({step.target})` "
                f"(line {{0}}) steps `{stepped}`, "
                + ("the wrapper that holds it" if held.startswith(stepped + ".") else "the optimizer it holds")
                + ": the GradScaler records unscaling per optimizer object, so `step()` unscales the same "
                "gradients again (divided by the scale twice: updates far too small, which Adam's normalisation "
                "mostly hides and SGD does not); pass the same object to `unscale_` and `step`",
                unscale.call.where.statement,
                related=(step.call.node,),
            )
            break


def _one_holds_the_other(a: str, b: str) -> bool:
    return a.startswith(b + ".") or b.startswith(a + ".")


def _same_owner(a: ts.Event, b: ts.Event) -> bool:
    """Both in one function, or in methods of one class (`self` is the same object)."""
    fa, fb = a.call.scope.function_scope, b.call.scope.function_scope
    return fa is fb or (fa.class_name is not None and fa.class_name == fb.class_name)


def _through_properties(facts: AmpFacts, key: str, scope) -> str:
    """`self.optimizer` as the `@property` of the class returns it (`self.fp32_optimizer.optimizer`)."""
    class_name = scope.function_scope.class_name
    for _depth in range(names.CALL_DEPTH):  # a property returning another property's attribute
        head, _dot, attribute = key.partition(".")
        if head != "self" or not attribute or class_name is None:
            break
        first, _, rest = attribute.partition(".")
        getter = next((
            f for f in facts.functions_by_name.get(first, ())
            if f.class_name == class_name and any(dotted_name(d.decorator) == "property" for d in f.decorators)
        ), None)
        returned = dotted_name(getter.returns[0]) if getter is not None and len(getter.returns) == 1 else None
        if returned is None or not returned.startswith("self."):
            break
        key = f"{returned}.{rest}" if rest else returned
    return key


def _partners(facts: AmpFacts, event: ts.Event, events: list[ts.Event]) -> list[ts.Event]:
    """The steps that can run in the same call as `event` (not in another branch of an `if`)."""
    return [
        e for e in events
        if e.kind == "step" and ts.same_object(e.scaler, event.scaler)
        and (event.target is None or e.target is None or ts.same_object(e.target, event.target))
        and not ts.exclusive(facts, e, event)
    ]


def _over_its_optimizers(loop, unscale: ts.Event) -> bool:
    """`for opt in optimizers: scaler.unscale_(opt)`: each pass unscales another optimizer once
    (SpeechBrain unscales, clips and steps its optimizers in three such loops)."""
    return loop.binds(unscale.target)


def _microbatch(facts: AmpFacts, unscale: ts.Event, events: list[ts.Event]) -> Hit | None:
    steps = _partners(facts, unscale, events)
    if not steps:
        return None
    # The step the unscale_ is for: one of the same helper call (a `train_step` called from a
    # training and another loop), else the first after it (minimind steps under its accumulation
    # guard, then once more after the loop for a last partial batch), else the last before it.
    same_call = [s for s in steps if s.anchor is unscale.anchor]
    after = [s for s in same_call or steps if s.order > unscale.order]
    step = after[0] if after else (same_call or steps)[-1]
    unscale_loops, step_loops = unscale.anchor.statement_loops, step.anchor.statement_loops
    deeper = [loop for loop in unscale_loops if loop not in step_loops and not _over_its_optimizers(loop, unscale)]
    if deeper:
        return _hit(facts, unscale, step, "inside the micro-batch loop on line {1}", deeper[-1].node)
    loops = [loop for loop in step_loops if loop in unscale_loops]
    if not loops and (step_loops or unscale_loops):
        return None
    # Without a loop, each call of the function is one micro-batch (a `train_step` method).
    loop = loops[-1] if loops else None
    # The update that commits this `unscale_` comes after it: an earlier one (a GAN's generator
    # step and update under `if not train_critic:`) reset the scaler before this unscale_ ran.
    commit = next(
        (
            e for e in events
            if e.kind == "update" and e.order > unscale.order and ts.same_object(e.scaler, unscale.scaler)
            and (loop is None or loop in e.anchor.statement_loops)
            and not ts.exclusive(facts, e, unscale)
            and not ts.cut_off_after(facts, e, step)  # an update before giving up on the step resets the scaler
        ),
        step,
    )
    mine = ts.guards_inside(facts, unscale.anchor, loop)
    if unscale.anchor is not unscale.call.where:
        # In a helper the step's function calls (neosr's `closure`), the helper's own `if`s guard
        # it too: `if self.n % self.accum == 0: unscale_` there, the same test around the step here.
        mine = [*mine, *unscale.call.where.ifs]
    for guard in ts.guards_inside(facts, commit.anchor, loop):
        if ts.implied_by(facts, guard, mine):
            continue  # whenever `unscale_` runs, so does the step (`if a and b: unscale_` then `if b: step`)
        if ts.AMP_SWITCH.search(_test(facts, guard)) or ts.exclusive(facts, unscale, commit):
            continue
        if _commits_in_its_else(facts, guard, unscale, events, mine):
            continue
        return _hit(facts, unscale, step, "outside the `if` on line {1} that guards the step", guard)
    guard = ts.skip_between(facts, loop, unscale, commit) if loop is not None else None
    # An `if` that updates before it skips the step resets the scaler for the next `unscale_`.
    if guard is not None and not any(e.kind == "update" and ts.within(facts, e.anchor.statement, guard) for e in events):
        return _hit(facts, unscale, step, "before the `if ...: continue` on line {1} that skips the step", guard)
    return None


def _commits_in_its_else(facts: AmpFacts, guard: cst.If, unscale: ts.Event, events: list[ts.Event], mine: list[cst.If]) -> bool:
    """Whether the `else` of `guard` also steps the optimizer whenever `unscale_` runs, so the `if`
    picks how the step runs, not whether (transformers' Trainer: `elif on_tpu: if scaling:
    scaler.step(...)` then `elif scaling: scaler.step(...)`). An `else` that only updates (to
    silence the "already unscaled" error) still leaves gradients unscaled mid-accumulation."""
    orelse = guard.orelse
    if orelse is None:
        return False
    for event in _partners(facts, unscale, events):
        if not ts.within(facts, event.anchor.statement, orelse):
            continue
        inner = [g for g in event.anchor.ifs if g is orelse or ts.within(facts, g, orelse)]
        if all(ts.implied_by(facts, g, mine) or ts.AMP_SWITCH.search(_test(facts, g)) for g in inner):
            return True
    return False


def _test(facts: AmpFacts, guard: cst.If) -> str:
    return facts.module.code_for_node(guard.test)


# A test of the scaler's own record of what it did to an optimizer (allennlp: `if state["stage"] is
# not OptState.UNSCALED: scaler.unscale_(optimizer)`): an `unscale_` under it cannot run twice.
_UNSCALE_STATE = re.compile(r"\bOptState\b|_per_optimizer_states|\bUNSCALED\b")


def _twice(facts: AmpFacts, unscale: ts.Event, events: list[ts.Event]) -> Hit | None:
    if any(_UNSCALE_STATE.search(_test(facts, guard)) for guard in unscale.call.where.ifs):
        return None
    for earlier in events:
        if earlier.order >= unscale.order:
            break
        if earlier.kind != "unscale" or earlier is unscale or not ts.same_object(earlier.scaler, unscale.scaler):
            continue
        if not (earlier.target is None or unscale.target is None or ts.same_object(earlier.target, unscale.target)):
            continue
        if ts.exclusive(facts, earlier, unscale):
            continue
        between = [e for e in events if earlier.order < e.order < unscale.order and e.kind == "update" and ts.same_object(e.scaler, unscale.scaler)]
        if between:
            continue
        return Hit(
            unscale.call.node,
            f"`{unscale.scaler}.unscale_({unscale.target or ''})` is called a second time before "
            f"`update()` (first on line {{0}}), which raises \"unscale_() has already been called on "
            f"this optimizer since the last update()\"; unscale once, right before clipping and the step",
            unscale.call.where.statement,
            related=(earlier.call.node,),
        )
    return None


# An `if` that runs the step once per accumulated batch, not one that skips it now and then.
_ACCUMULATION = re.compile(r"accum|micro|sync_grad|update_freq|grad_acc|is_last|last_batch", re.IGNORECASE)


def _hit(facts: AmpFacts, unscale: ts.Event, step: ts.Event, where: str, node) -> Hit:
    accumulates = not isinstance(node, cst.If) or _ACCUMULATION.search(_test(facts, node)) is not None
    when = (
        "runs only at the end of the accumulated batch: the second micro-batch raises"
        if accumulates
        else "does not run every time `unscale_()` does: the next `unscale_()` after a skipped step raises"
    )
    consequence = " and the gradients accumulated after it stay scaled" if accumulates else ""
    # A step skipped on what the unscaled gradients showed (a non-finite clip norm) cannot move the
    # unscale_ after that test: the scaler must be reset before the skip instead.
    advice = (
        "move `unscale_` (and clipping) into the step's block"
        if accumulates
        else f"call `{unscale.scaler}.update()` before skipping the step (or leave the skip to "
        f"`{step.scaler}.step()`, which skips steps with inf/NaN gradients itself)"
    )
    return Hit(
        unscale.call.node,
        f"`{unscale.scaler}.unscale_()` runs {where}, but `{step.scaler}.step()` (line {{0}}) {when} "
        f"\"unscale_() has already been called on this optimizer since the last update()\"{consequence}; {advice}",
        unscale.call.where.statement,
        related=(step.call.node, node),
    )
