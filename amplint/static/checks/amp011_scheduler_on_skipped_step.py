"""AMP011 scheduler-on-skipped-step: the LR scheduler advances even when the scaler skipped the step."""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from amplint.static import names
from amplint.static.checks import Hit
from amplint.static.checks import _training_step as ts
from amplint.static.semantics import AmpFacts, dotted_name

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
            scaler_step = _last_scaler_event(facts, events[:index], event)
            if scaler_step is None or _gated(facts, event, skip_flags | {scaler_step.scaler.split(".")[-1]}):
                continue
            reported.add(id(event.call.node))
            yield Hit(
                event.call.node,
                f"`{event.target}.{event.call.method}()` runs after `{scaler_step.scaler}.{scaler_step.call.method}()` (line {{0}}) whether or "
                f"not the scaler skipped the optimizer step for inf/NaN gradients, so the learning rate "
                f"advances on steps that did nothing; step the scheduler only when the scale did not "
                f"drop (`if {_scaler_seen_from(event, scaler_step)}.get_scale() >= scale_before:`)",
                event.call.where.statement,
                related=(scaler_step.call.node,),
            )


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
    loop = ts.iteration_loop(sched)
    for event in reversed(before):
        if event.kind not in ("step", "update"):
            continue
        if ts.iteration_loop(event) is not loop or ts.exclusive(facts, event, sched) or _per_element(facts, event, sched):
            continue
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


def _skip_flags(facts: AmpFacts, function) -> set[str]:
    """Names assigned from the scale (`skip = scale > scaler.get_scale()`), or from a same-file
    step helper that returns such a test (K-Planes: `step_successful = self.train_step(data)`,
    which returns `scale <= self.gscaler.get_scale()`): tests on them are skip checks."""
    flags = set()
    calls = {id(call.node): call for call in function.calls}
    for assignment in facts.assignments:
        if assignment.where.scope.function_scope is not function:
            continue
        helper = facts.called_function(calls[id(assignment.value)]) if id(assignment.value) in calls else None
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
        return isinstance(value, cst.Name) and value.value in ("True", "False")

    tests = [value for value in helper.returns if not is_constant(value)]
    return bool(tests) and all(is_test(value) for value in tests)


def _gated(facts: AmpFacts, sched: ts.Event, flags: set[str]) -> bool:
    guards = [*sched.anchor.ifs]
    if sched.call.where is not sched.anchor:
        guards.extend(sched.call.where.ifs)
    for guard in guards:
        test = facts.module.code_for_node(guard.test)
        if _SKIP_CHECK.search(test) or any(re.search(rf"\b{re.escape(f)}\b", test) for f in flags):
            return True
    return False
