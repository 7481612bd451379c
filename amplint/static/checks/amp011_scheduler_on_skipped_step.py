"""AMP011 scheduler-on-skipped-step: the LR scheduler advances even when the scaler skipped the step."""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from amplint.static import names
from amplint.static.checks import Hit
from amplint.static.checks import _training_step as ts
from amplint.static.semantics import AmpFacts, Loop, dotted_name, is_false, is_true

CODE = "AMP011"

_SKIP_CHECK = re.compile(
    r"get_scale|_scale\b|\bscale\b|scale_(before|after)|was_skipped|skipped_step|found_inf|isfinite|isnan|isinf|overflow"
    r"|_step_count|was_run|stepped|step_was|optimizer_was|did_step|is_finite|nonfinite|non_finite"
)


def check(facts: AmpFacts) -> Iterator[Hit]:
    reported: set[int] = set()
    for function in ts.functions_with_events(facts):
        events = ts.iteration_events(facts, function)
        skip_flags = _skip_flags(facts, function)
        for index, event in enumerate(events):
            if event.kind != "sched_step" or id(event.call.node) in reported or _steps_on_a_metric(facts, event):
                continue
            if _handed_the_epoch(event):
                continue
            scaler_step = _last_scaler_event(facts, events[:index], event)
            scaler_event = scaler_step or _next_scaler_step(facts, function, events[index + 1:], event)
            if scaler_event is None or _gated(facts, event, skip_flags | {scaler_event.scaler.split(".")[-1]}):
                continue
            reported.add(id(event.call.node))
            repeat = _repeating_loop(event)
            yield Hit(
                event.call.node,
                _message(facts, event, scaler_event, after=scaler_step is not None, repeated=repeat is not None),
                event.call.where.statement,
                related=(scaler_event.call.node, *((repeat.node,) if repeat else ())),
            )


def _handed_the_epoch(sched: ts.Event) -> bool:
    """`scheduler.step(epoch)` in the batch loop (PointNeXt): a schedule of the epoch index,
    which a skipped step cannot move, handed a variable of a loop around the batch loop."""
    if sched.target is None or not sched.call.node.args:
        return False
    epoch = sched.call.arg(0, "epoch")
    loop = ts.iteration_loop(sched)
    if not isinstance(epoch, cst.Name) or loop is None or loop.binds(epoch.value):
        return False
    return any(outer.binds(epoch.value) for outer in sched.anchor.statement_loops if outer is not loop) and bool(
        names.EPOCH.search(epoch.value.lower())
    )


def _repeating_loop(sched: ts.Event) -> Loop | None:
    """The loop that repeats the scheduler's step within the iteration (`for _ in range(accum):
    scheduler.step()`), if any: the schedule then moves that many times per step, skipped or not."""
    return next((loop for loop in sched.anchor.statement_loops if ts.repeats_the_schedule(loop, sched)), None)


def _message(facts: AmpFacts, sched: ts.Event, scaler_event: ts.Event, *, after: bool, repeated: bool) -> str:
    scaler = _scaler_seen_from(sched, scaler_event)
    called = f"{sched.target}.{sched.call.method}()" if sched.call.method else f"{sched.target}(...)"
    subject = f"`{called}`" + (", repeated by the loop on line {1}," if repeated else "")
    if after:
        when = f"runs after `{scaler_event.scaler}.{scaler_event.call.method}()` (line {{0}}) whether or not the scaler skipped the optimizer step"
    else:
        when = (
            f"runs in every iteration before `{scaler_event.scaler}.step()` (line {{0}}), whether or not the "
            f"scaler skipped the previous iteration's optimizer step"
        )
    # A scheduler handed its position (`scheduler.step(train_step)`, timm's
    # `step_update(num_updates)`) jumps to it: skipping the call changes nothing while the count
    # still includes the skipped steps.
    position = _position_argument(facts, sched)
    if position:
        # The loop's position cannot be held back: a count of the applied steps replaces it.
        fix = (
            f"hand it a count of the steps the scaler applied in place of `{position}` (after `{scaler}.update()`: "
            f"`applied += {scaler}.get_scale() >= scale_before`)"
        )
    elif after:
        fix = f"step the scheduler only when the scale did not drop (`if {scaler}.get_scale() >= scale_before:`)"
    else:
        fix = (
            f"step the scheduler after `{scaler}.update()`, only when the scale did not drop "
            f"(`if {scaler}.get_scale() >= scale_before:`)"
        )
    return (
        f"{subject} {when} for inf/NaN gradients, so what it schedules (a learning rate, a weight decay) "
        f"advances on steps that did nothing; {fix}"
    )


def _position_argument(facts: AmpFacts, sched: ts.Event) -> str:
    """The argument that hands the scheduler the loop's position, as written, the only one a count
    of applied steps replaces (OneCycle's `step(it, epoch)` keeps its epoch): one the iteration
    loop binds (LAVIS's `step(cur_epoch=inner_epoch, cur_step=i)`) or one that counts in it
    (`accumulated_iter += 1`), else the first."""
    arguments = [arg for arg in sched.call.node.args if not arg.star]
    if not arguments:
        return ""
    loop = ts.iteration_loop(sched)
    chosen = arguments[0]
    if loop is not None:
        counted = {a.key for a in facts.assignments if ts.within(facts, a.where.statement, loop.node)}

        def moves_with_the_loop(arg: cst.Arg) -> bool:
            name = dotted_name(arg.value)
            return name is not None and (loop.binds(name) or name in counted)

        chosen = next((arg for arg in arguments if moves_with_the_loop(arg)), chosen)
    return (f"{chosen.keyword.value}=" if chosen.keyword else "") + facts.module.code_for_node(chosen.value)


def _scaler_seen_from(sched: ts.Event, scaler_step: ts.Event) -> str:
    """The scaler as the scheduler's code can name it: not `self._scaler` of a helper class whose
    method the scheduler's function only calls (a local `NativeScaler()` instance)."""
    name = scaler_step.scaler
    owner = scaler_step.call.scope.function_scope.class_name
    if name.startswith("self.") and owner != sched.call.scope.function_scope.class_name:
        return "scaler"
    return name


# A validation metric handed to the scheduler (`scheduler.step(val_loss)`, `metrics=`): a word of
# an identifier, so `step // accum_steps` or `eval_interval` is no metric.
_METRIC = re.compile(
    r"(?:^|_)(?:val|valid|validation|loss|metrics?|accuracy|acc|top1|score|perf|psnr|bleu|dice|iou|f1|error|wer|cer)(?:_|$)",
    re.IGNORECASE,
)


def _steps_on_a_metric(facts: AmpFacts, sched: ts.Event) -> bool:
    """ReduceLROnPlateau (or a scheduler in plateau mode) moves on a validation metric, not on
    optimizer steps: a step the scaler skipped does not advance it."""
    call = sched.call
    if call.arg(None, "metrics") is not None or call.arg(None, "metric") is not None:
        return True
    first = call.arg(0, None)
    if first is not None and any(_METRIC.search(word) for word in re.findall(r"\w+", facts.module.code_for_node(first))):
        return True
    return any((built or "").endswith("ReduceLROnPlateau") for _, built in facts.constructed(call.receiver_key, call.scope))


def _last_scaler_event(facts: AmpFacts, before: list[ts.Event], sched: ts.Event) -> ts.Event | None:
    for event in reversed(before):
        if event.kind in ("step", "update") and _same_iteration(facts, event, sched):
            return event
    return None


def _same_iteration(facts: AmpFacts, event: ts.Event, sched: ts.Event) -> bool:
    """The event runs in the scheduler's iteration, on the same runs, once per iteration."""
    return (
        ts.iteration_loop(event) is ts.iteration_loop(sched)
        and not ts.exclusive(facts, event, sched)
        and not _per_element(facts, event, sched)
    )


def _next_scaler_step(facts: AmpFacts, function, after: list[ts.Event], sched: ts.Event) -> ts.Event | None:
    """A `scaler.step(optimizer)` later in the same training iteration (NVIDIA's BERT:
    `lr_scheduler.step()` then `grad_scaler.step(optimizer)`): the next iteration's scheduler step
    follows it, skipped or not. Only where the body runs again: in the iteration loop, or in a
    function without one (a `take_optimizer_step()` called once per batch); a module-level script
    without a loop steps once. And only when the scaler is updated after it in that iteration: a
    scaler never updated raises on its second step (AMP007), no step is skipped quietly."""
    loop = ts.iteration_loop(sched)
    if loop is None and function is facts.module_scope:
        return None
    in_iteration = [e for e in after if _same_iteration(facts, e, sched)]
    for index, event in enumerate(in_iteration):
        if event.kind == "step" and any(
            later.kind == "update" and ts.same_object(later.scaler, event.scaler) for later in in_iteration[index + 1:]
        ):
            return event
    return None


def _per_element(facts: AmpFacts, event: ts.Event, sched: ts.Event) -> bool:
    """A helper called in a comprehension (`losses = [self.train_step(b) for b in loader]`) in an
    epoch loop runs once per batch: its steps belong to that inner loop, and a scheduler after it
    is per epoch (not in a batch loop over micro-batches: `[step(c) for c in batch.chunk(4)]`)."""
    loop = ts.iteration_loop(sched)
    if event.anchor is event.call.where or loop is None or not names.EPOCH.search(loop.text):
        return False
    site = next((c for c in event.anchor.scope.calls if c.where is event.anchor), None)
    return site is not None and ts.in_a_comprehension(facts, site)


def _else_branches_around(facts: AmpFacts, node: cst.CSTNode) -> list[cst.If]:
    """The `if` statements of the node's function whose `else:` holds it."""
    found, child = [], node
    for parent in facts.ancestors(node):
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef)):
            break
        if isinstance(parent, cst.If) and child is parent.orelse:
            found.append(parent)
        child = parent
    return found


def _skip_flags(facts: AmpFacts, function) -> set[str]:
    """Names assigned from the scale (`skip = scale > scaler.get_scale()`), or from a same-file
    step helper that returns such a test (K-Planes: `step_successful = self.train_step(data)`,
    which returns `scale <= self.gscaler.get_scale()`): tests on them are skip checks."""
    flags = set()
    for assignment in facts.assignments:
        if assignment.where.scope.function_scope is not function:
            continue
        site = facts.call_site(assignment.value)
        helper = facts.called_function(site) if site is not None else None
        if _SKIP_CHECK.search(facts.module.code_for_node(assignment.value)) or (helper and _returns_a_skip_test(facts, helper)):
            flags.add(assignment.key.split(".")[-1])
    return flags


def _returns_a_skip_test(facts: AmpFacts, helper) -> bool:
    """Every `return` of the helper is a test of the scale (`return scale <= scaler.get_scale()`)
    or a name bound to one; a tuple holding one (`return loss, held`) is always true."""
    def is_test(value) -> bool:
        if isinstance(value, cst.Call) and dotted_name(value.func) == "bool" and value.args:
            return is_test(value.args[0].value)  # `return bool(scale <= scaler.get_scale())`
        if isinstance(value, cst.Name):
            values = [a.value for a in facts.assignments if a.key == value.value and a.where.scope is helper]
            return bool(values) and all(not isinstance(v, cst.Name) and is_test(v) for v in values)
        return isinstance(value, (cst.Comparison, cst.UnaryOperation)) and bool(_SKIP_CHECK.search(facts.module.code_for_node(value)))

    def is_constant(value) -> bool:  # an early `return False` before any step
        return is_true(value) or is_false(value)

    tests = [value for value in helper.returns if not is_constant(value)]
    return bool(tests) and all(is_test(value) for value in tests)


def _gated(facts: AmpFacts, sched: ts.Event, flags: set[str]) -> bool:
    """Under a skip check (`if scaler.get_scale() >= before: sched.step()`), or in the `else:`
    of a test that the scale dropped (`if scaler.get_scale() < before: skipped += 1`) or that the
    gradient norm is not finite (`if not torch.isfinite(grad_norm):`, espnet's trainer: the
    scaler skips exactly the steps whose gradients hold inf/NaN). Not in the `else:` of any other
    test: that the scale grew or collapsed, or a finite-loss test (`if torch.isnan(loss): raise`;
    a finite loss can still give float16 gradients that overflow, and the scaler then skips the
    step)."""
    guards = [*sched.anchor.ifs]
    elses = _else_branches_around(facts, sched.anchor.statement)
    if sched.call.where is not sched.anchor:
        guards.extend(sched.call.where.ifs)
        elses.extend(_else_branches_around(facts, sched.call.node))
    if any(_checks_for_a_skip(facts, guard.test, flags) for guard in guards):
        return True
    return any(_scale_dropped(facts, guard.test) or _gradients_not_finite(facts, guard.test) for guard in elses)


# A gradient norm: named so (`grad_norm`, `gnorm`, `total_norm`), or what a clipping helper returned.
_GRADIENT_NORM = re.compile(r"grad|gnorm|total_norm", re.IGNORECASE)
_NOT_FINITE = frozenset({"isnan", "isinf"})
_FINITE = frozenset({"isfinite", "is_finite"})


def _gradients_not_finite(facts: AmpFacts, test: cst.BaseExpression) -> bool:
    """A test that holds whenever the gradient norm is inf or NaN: `not torch.isfinite(grad_norm)`,
    `torch.isnan(gnorm) or torch.isinf(gnorm)`, `not math.isfinite(total_norm)`. Any `or`ed
    part that does suffices; an `and`ed one may fail on an overflow."""
    if isinstance(test, cst.BooleanOperation):
        return isinstance(test.operator, cst.Or) and (
            _gradients_not_finite(facts, test.left) or _gradients_not_finite(facts, test.right)
        )
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _checks_a_gradient_norm(facts, test.expression, _FINITE)
    return _checks_a_gradient_norm(facts, test, _NOT_FINITE)


def _checks_a_gradient_norm(facts: AmpFacts, check: cst.BaseExpression, kinds: frozenset[str]) -> bool:
    """`torch.isfinite(grad_norm)` / `grad_norm.isfinite()` (also with `.all()`, `.any()` or
    `.item()` after it) for one of `kinds`, on a gradient norm."""
    while isinstance(check, cst.Call) and isinstance(check.func, cst.Attribute) and check.func.attr.value in ("all", "any", "item"):
        check = check.func.value
    if not (isinstance(check, cst.Call) and isinstance(check.func, (cst.Name, cst.Attribute))):
        return False
    name = dotted_name(check.func)
    if name is None or name.rsplit(".", 1)[-1] not in kinds:
        return False
    if check.args:
        subject = check.args[0].value
    elif isinstance(check.func, cst.Attribute):
        subject = check.func.value
    else:
        return False
    if _GRADIENT_NORM.search(facts.module.code_for_node(subject)):
        return True
    held = dotted_name(subject)
    return held is not None and any(
        a.key == held and _GRADIENT_NORM.search(facts.module.code_for_node(a.value)) for a in facts.assignments
    )


def _checks_for_a_skip(facts: AmpFacts, test: cst.BaseExpression, flags: set[str]) -> bool:
    """Whether the test holds only on applied steps: a skip check, `and`ed with anything; not
    `or`ed with another condition (`grad_norm is None or torch.isfinite(grad_norm)` holds on
    every step when nothing clips)."""
    if isinstance(test, cst.BooleanOperation):
        sides = (_checks_for_a_skip(facts, test.left, flags), _checks_for_a_skip(facts, test.right, flags))
        return all(sides) if isinstance(test.operator, cst.Or) else any(sides)
    code = facts.module.code_for_node(test)
    return bool(_SKIP_CHECK.search(code)) or any(re.search(rf"\b{re.escape(f)}\b", code) for f in flags)


def _scale_dropped(facts: AmpFacts, test: cst.BaseExpression) -> bool:
    """`scaler.get_scale() < scale_before` or `scale_before > scaler.get_scale()`, where
    `scale_before` holds the scale read earlier: true when the step was skipped, so its `else:`
    runs only on applied steps (not `get_scale() < min_scale`, a collapse check)."""
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1):
        return False
    operator, right = test.comparisons[0].operator, test.comparisons[0].comparator
    if isinstance(operator, cst.LessThan):
        now, before = test.left, right
    elif isinstance(operator, cst.GreaterThan):
        now, before = right, test.left
    else:
        return False
    return "get_scale" in facts.module.code_for_node(now) and _holds_an_earlier_scale(facts, before)


def _holds_an_earlier_scale(facts: AmpFacts, value: cst.BaseExpression) -> bool:
    """A name bound to the scale (`scale_before = scaler.get_scale()`)."""
    name = dotted_name(value)
    return name is not None and any(
        a.key == name and "get_scale" in facts.module.code_for_node(a.value) for a in facts.assignments
    )
