"""AMP007 scaler-step-update-pairing: `scaler.step` without `update()`, or `update()` at the wrong place."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from amplint.model import Applicability
from amplint.static.checks import FixPlan, Hit
from amplint.static.checks import _training_step as ts
from amplint.static.semantics import AmpFacts, Loop, ends_with

CODE = "AMP007"


def check(facts: AmpFacts) -> Iterator[Hit]:
    own = ts.own_events(facts)
    all_updates = [e for events in own.values() for e in events if e.kind == "update"]
    reported: set[int] = set()
    for function in ts.functions_with_events(facts):
        events = [e for e in ts.iteration_events(facts, function) if e.kind in ("step", "update", "unscale", "scale_backward")]
        for key in {_canonical(e.scaler) for e in events}:
            mine = [e for e in events if _canonical(e.scaler) == key]
            for hit in _check_scaler(facts, mine, all_updates):
                if id(hit.node) not in reported:
                    reported.add(id(hit.node))
                    yield hit


def _canonical(key: str | None) -> str | None:
    return key.split(".")[-1] if key else None


def _check_scaler(facts: AmpFacts, events: list[ts.Event], all_updates: list[ts.Event]) -> Iterator[Hit]:
    steps = [e for e in events if e.kind == "step"]
    updates = [e for e in events if e.kind == "update"]
    if not steps:
        return
    scaler = steps[-1].scaler
    if not any(ts.same_object(u.scaler, scaler) for u in all_updates):
        if not _handed_in(steps):
            yield from _missing_update(facts, steps, scaler)
        return
    # Also where every update() is in a caller: a helper that steps on each batch of its own loop
    # still gets one update() per call.
    yield from _update_outside_loop(facts, steps, updates, scaler)
    yield from _update_placement(facts, events, scaler)
    yield from _update_skipped_after_a_step(facts, steps, updates, scaler)


def _handed_in(steps: list[ts.Event]) -> bool:
    """Every step is on a scaler the function receives as a parameter (nerfstudio's
    `optimizer_scaler_step_all(self, grad_scaler)`): its caller, in another file, owns the scaler
    and updates it once after the helper; an `update()` added here would be a second one."""
    return all(
        step.scaler is not None
        and step.scaler in step.call.where.scope.function_scope.params
        and ts.iteration_loop(step) is None  # a function with its own training loop must update in it
        for step in steps
    )


def _missing_update(facts: AmpFacts, steps: list[ts.Event], scaler: str) -> Iterator[Hit]:
    """No `update()` anywhere: report the last step of each block, with a fix that adds it."""
    by_block: dict[int, ts.Event] = {}
    for step in steps:
        block = ts.parents(facts).get(id(step.anchor.statement))
        by_block[id(block)] = step  # program order: the last one wins
    for step in by_block.values():
        # In a helper the scaler's name may not be bound, nor a comprehension's element after it
        # (`[s.step(o) for s, o in zip(scalers, opts)]`); after a compound statement, nowhere to
        # add it; in a loop over the optimizers, the update belongs after the loop, not per optimizer.
        in_optimizer_loop = any(ts.over_optimizers(loop) for loop in step.anchor.statement_loops)
        fixable = step.anchor is step.call.where and not in_optimizer_loop and not ts.in_a_comprehension(facts, step.call)
        update = ts.insert_after(facts, step.call.where.statement, f"{scaler}.update()") if fixable else None
        fix = FixPlan(Applicability.SAFE, (update,)) if update else None
        yield Hit(
            step.call.node,
            f"`{scaler}.step()` is never followed by `{scaler}.update()`: the loss scale never adapts "
            f"and the next iteration's `step()` raises \"step() has already been called since the last "
            f"update()\"; call `{scaler}.update()` once after the last `step()` of each iteration",
            step.call.where.statement,
            fix,
        )


def _update_outside_loop(facts: AmpFacts, steps, updates, scaler: str) -> Iterator[Hit]:
    for step in steps:
        loop = ts.iteration_loop(step)
        if loop is None:
            continue
        if any(loop in u.anchor.loops for u in updates):
            continue
        yield Hit(
            step.call.node,
            f"`{scaler}.step()` runs on every iteration of the loop on line {{0}} but "
            f"`{scaler}.update()` runs outside that loop; the second iteration raises \"step() has "
            f"already been called since the last update()\"; move `update()` into the loop, after the "
            f"last `step()`",
            step.call.where.statement,
            related=(loop.node,),
        )


def _update_skipped_after_a_step(facts: AmpFacts, steps: list[ts.Event], updates: list[ts.Event], scaler: str) -> Iterator[Hit]:
    """A step on every pass of its loop whose one `update()` after it runs only on some: under a
    condition the step does not require (`if step % log_every == 0:`), or after an `if` that
    `continue`s first. A test that switches AMP (`if scaler is not None:`) is not such a
    condition."""
    for step in steps:
        loop = ts.iteration_loop(step)
        if loop is None:
            continue
        after = [
            u for u in updates
            if ts.iteration_loop(u) is loop and u.order > step.order and not ts.exclusive(facts, u, step, by_condition=False)
        ]
        if len(after) != 1:
            continue  # none (reported above), or several that may cover each other's iterations
        (update,) = after
        step_guards = ts.guards_inside(facts, step.anchor, loop)
        guard = next(
            (
                g for g in ts.guards_inside(facts, update.anchor, loop)
                if not ts.implied_by(facts, g, step_guards) and not ts.mentions(facts, g.test, ts.AMP_SWITCH)
            ),
            None,
        ) or ts.skip_between(facts, loop, step, update)
        if guard is None:
            continue
        yield Hit(
            update.call.node,
            f"`{scaler}.update()` is skipped on iterations where `{scaler}.step()` (line {{0}}) runs (the `if` "
            f"on line {{1}}); the next iteration's `step()` then raises \"step() has already been called since "
            f"the last update()\"; call `{scaler}.update()` right after the step, under the step's own conditions",
            update.call.where.statement,
            related=(step.call.node, guard),
        )


def _update_placement(facts: AmpFacts, events: list[ts.Event], scaler: str) -> Iterator[Hit]:
    """`update()` between the steps of several optimizers, twice, or where no step ran."""
    iteration = {id(e): ts.iteration_loop(e) for e in events}  # asked of every event for every update
    for event in events:
        if event.kind != "update":
            continue
        loop = iteration[id(event)]
        # Not by condition: an update under `if not amp:` and a step under `if amp:` are the very
        # mismatch reported below, not two runs.
        same_iteration = [
            e for e in events
            if iteration[id(e)] is loop and not ts.exclusive(facts, e, event, by_condition=False) and e is not event
        ]
        later = [e for e in same_iteration if e.order > event.order and not ts.cut_off_after(facts, event, e)]
        earlier = [e for e in same_iteration if e.order < event.order]
        # A step under the opposite outcome of the update's condition runs in other iterations (a
        # GAN's `if not train_critic:` generator step and update, then `if train_critic:` its own).
        if _steps_another_optimizer_after(*_in_the_same_pass(facts, event, earlier, later)) or _in_the_optimizer_loop_of_a_step(facts, event, same_iteration):
            yield Hit(
                event.call.node,
                f"`{scaler}.update()` runs between the `step()` calls of several optimizers; call it "
                f"once per iteration, after the last `{scaler}.step()`",
                event.call.where.statement,
            )
            continue
        since = []
        for e in reversed(earlier):
            if e.kind == "update":
                break
            since.append(e)
        if earlier and not any(e.kind in ("step", "unscale") for e in since) and any(e.kind == "update" for e in earlier):
            if any(isinstance(a, cst.ExceptHandler) for a in facts.ancestors(event.call.node)):
                # `except OutOfMemoryError: scaler.update()`: the try failed before its step, so
                # this is the only update of the iteration, with no step before it.
                message = (
                    f"`{scaler}.update()` in this `except` runs when the `try` failed, before "
                    f"`{scaler}.step()` recorded any inf checks, which raises \"No inf checks were "
                    f"recorded prior to update\"; drop it: the next iteration's step and update suffice"
                )
            else:
                message = (
                    f"`{scaler}.update()` is called a second time in the same iteration; call it once, "
                    f"after the last `{scaler}.step()`"
                )
            yield Hit(event.call.node, message, event.call.where.statement)
            continue
        yield from _update_without_step(facts, event, same_iteration, loop, scaler)


def _in_the_same_pass(facts: AmpFacts, update: ts.Event, *events: list[ts.Event]) -> list[list[ts.Event]]:
    return [[e for e in group if not ts.exclusive(facts, e, update)] for group in events]


def _steps_another_optimizer_after(earlier: list[ts.Event], later: list[ts.Event]) -> bool:
    """A step after the update of an optimizer the steps before it did not step, with gradients
    scaled before that update. The same optimizer stepped and updated twice in a row (two
    iterations written out, or a step helper called twice) is two iterations, which torch allows;
    a step after a scaled backward of its own is a round of its own (MONAI's DiNTS: scale,
    backward, step and update for the weights, then all four for the architecture; a GAN's
    generator phase after its discriminator's), computed at the scale that update left."""
    before: list[ts.Event] = []
    for event in reversed(earlier):  # the steps since the previous update
        if event.kind == "update":
            break
        if event.kind == "step":
            before.append(event)
    after: list[ts.Event] = []
    for event in later:  # the steps until the next update or the next round's scaled backward
        if event.kind in ("update", "scale_backward"):
            break
        if event.kind == "step":
            after.append(event)
    if not before:
        return bool(after)
    return any(not any(ts.same_object(a.target, b.target) for b in before) for a in after)


def _in_the_optimizer_loop_of_a_step(facts: AmpFacts, update: ts.Event, same_iteration: list[ts.Event]) -> bool:
    """`for opt in optimizers: scaler.step(opt); scaler.update()`: one update per optimizer."""
    inner = ts.innermost_loop(update.anchor)
    if inner is None or not ts.over_optimizers(inner):
        return False
    if inner.binds(update.scaler):
        return False  # `for scaler, opt in zip(scalers, optimizers)`: a scaler of its own per optimizer
    if _one_optimizer_per_pass(facts, inner, update):
        return False
    return any(e.kind == "step" and inner in e.anchor.loops for e in same_iteration)


def _one_optimizer_per_pass(facts: AmpFacts, loop: Loop, update: ts.Event) -> bool:
    """A loop over optimizers that steps only the one chosen for this pass: `if i != optim_idx:
    continue` before the update (espnet's GAN trainer: the model names the optimizer of each
    turn), or the update under `if i == optim_idx:`. Its update follows the pass's only step."""
    if any(_compares_loop_variable(loop, g.test, (cst.Equal, cst.Is)) for g in ts.guards_inside(facts, update.anchor, loop)):
        return True
    statements = loop.node.body.body if isinstance(loop.node.body, cst.IndentedBlock) else ()
    for statement in statements:
        if statement is update.anchor.statement or ts.within(facts, update.anchor.statement, statement):
            return False
        if isinstance(statement, cst.If) and ends_with(statement.body, (cst.Continue,)):
            if _compares_loop_variable(loop, statement.test, (cst.NotEqual, cst.IsNot)):
                return True
    return False


def _compares_loop_variable(loop: Loop, test: cst.BaseExpression, operators: tuple[type, ...]) -> bool:
    """`i != optim_idx` (with one of `operators`) on a loop variable, alone or among `and`ed conditions."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _compares_loop_variable(loop, test.left, operators) or _compares_loop_variable(loop, test.right, operators)
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1):
        return False
    comparison = test.comparisons[0]
    return isinstance(comparison.operator, operators) and any(
        isinstance(side, cst.Name) and loop.binds(side.value) for side in (test.left, comparison.comparator)
    )


def _update_without_step(facts: AmpFacts, update: ts.Event, same_iteration, loop, scaler: str) -> Iterator[Hit]:
    steps = [e for e in same_iteration if e.kind == "step"]
    if not steps:
        return  # without a loop, each call of the function is one iteration (a `train_step` method)
    update_guards = ts.guards_inside(facts, update.anchor, loop)

    def unshared(event: ts.Event) -> list:
        """The `if`s around `event` whose conditions the update does not also require."""
        return [g for g in ts.guards_inside(facts, event.anchor, loop) if not ts.implied_by(facts, g, update_guards)]

    # Each step, and each unscale_ before the update, records inf checks; the update raises when
    # none of them ran. Only a condition every one of them requires is sure to leave it without:
    # steps and unscales skipped under flags of their own (DLRM's `freeze_mlps` and
    # `freeze_embeddings`) all fail together only when nothing trains.
    checks = steps + [e for e in same_iteration if e.kind == "unscale" and e.order < update.order]
    guards_of = [unshared(e) for e in checks]
    if not all(guards_of):
        return
    common = set.intersection(*({c for g in guards for c in facts.conjuncts(g.test)} for guards in guards_of))
    guard = next((g for g in guards_of[0] if facts.conjuncts(g.test) & common), None)
    if guard is None:
        return
    yield Hit(
        update.call.node,
        f"`{scaler}.update()` runs on iterations where `{scaler}.step()` (guarded by the `if` on line "
        f"{{0}}) does not, which raises \"No inf checks were recorded prior to update\"; move it under "
        f"the same condition, after the step",
        update.call.where.statement,
        related=(guard,),
    )
