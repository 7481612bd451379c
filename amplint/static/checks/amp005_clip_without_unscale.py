"""AMP005 clip-without-unscale: clipping or reading gradients that are still multiplied by the scale."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

import libcst as cst

from amplint.static import autofix, names
from amplint.static.checks import Hit
from amplint.static.checks import _training_step as ts
from amplint.static.semantics import (
    AmpFacts,
    CallSite,
    Context,
    Scope,
    dotted_name,
    mutually_exclusive,
    statement_code,
)

CODE = "AMP005"

# A statement that computes with `.grad` (a norm, a max, a finiteness test, a clamp), not one that
# only tests it for None or resets it.
_GRAD_COMPUTATION = re.compile(
    r"\.grad(\.data)?\.(norm|abs|max|min|sum|mean|pow|square|float|item|detach|clone|cpu|numpy|isfinite|isnan|isinf|clamp_)\b"
    r"|\b(norm|isfinite|isnan|isinf|abs|amax|max|stack|sum|clamp_)\(\s*[\w.\[\]]*\.grad(\.data)?\s*[,)]"
)
# `p.grad.mul_(factor)` / `div_(factor)` is clipping by hand when the factor is named for a norm
# or a clip (`clip_coef = max_norm / total_norm`); any other factor (`world_size`,
# `gradient_accumulation_steps`) commutes with the loss scale.
_GRAD_RESCALE = re.compile(
    r"\.grad(?:\.data)?\.(?:mul_|div_)\(([^()]*(?:\([^()]*\))?[^()]*)\)"
    r"|\.grad(?:\.data)?\s*[*/]=\s*(.+)$"  # `p.grad *= clip_coef`, the same in place
)
_FROM_GRADIENTS = re.compile(r"norm(?![a-z])|clip|coef", re.IGNORECASE)
# A gradient divided by the scale, or multiplied by its inverse, where it is read: unscaled by
# hand (`(p.grad.detach().data / scale).norm(2)` in a norm helper handed `scaler._scale`,
# `p.grad * inv_scale` with `inv_scale = 1.0 / scaler.get_scale()`).
_GRAD_TIMES = re.compile(r"\.grad\b(?:\.(?:data|detach\(\)))*\s*([*/])\s*\(?\s*([\w.]+(?:\(\))?)")
_INVERSE_OF_THE_SCALE = re.compile(r"^\(?\s*1(?:\.0*)?\s*/.*scale", re.IGNORECASE)


@dataclass(frozen=True)
class _Event:
    # "scale" | "unscale" | "step" | "update" | "optimizer_step" (a plain `optimizer.step()`) | "clip" |
    # "grad" | "norm" (a norm taken, nothing clipped)
    kind: str
    node: cst.CSTNode
    scaler: str | None
    optimizer: str | None
    where: Context
    at: Context | None = None  # where it happens in the function being checked (the call site, for a helper's event)
    framework: str | None = None  # "accelerate", "fabric", "lightning": the framework's own scaling or unscaling
    helper: bool = False  # a norm or clipping helper of another file, which may be a framework's own

    @property
    def position(self) -> Context:
        return self.at or self.where


def _own_events(function: Scope, facts: AmpFacts, lightning_fp16: bool) -> list[_Event]:
    """`lightning_fp16`: a Lightning Trainer of the file may run in 16-bit mixed precision."""
    events: list[_Event] = []
    for call in function.calls:
        key = call.receiver_key
        if call.method in ("scale", "unscale_", "step", "update") and facts.is_scaler(key, call.scope):
            if facts.scaler_disabled(key, call.scope):
                continue
            kind = {"scale": "scale", "unscale_": "unscale", "step": "step", "update": "update"}[call.method]
            optimizer = dotted_name(call.arg(0, "optimizer")) if kind in ("unscale", "step") else None
            events.append(_Event(kind, call.node, key, optimizer, call.where))
        elif call.method in _ACCELERATOR_EVENTS and _scaling_framework(facts, call, names.ACCELERATORS, "accelerator", "mixed_precision"):
            events.append(_Event(_ACCELERATOR_EVENTS[call.method], call.node, key, None, call.where, framework="accelerate"))
        elif call.method in _FABRIC_EVENTS and _scaling_framework(facts, call, names.FABRICS, "fabric", "precision"):
            events.append(_Event(_FABRIC_EVENTS[call.method], call.node, key, None, call.where, framework="fabric"))
        elif call.method in _LIGHTNING_EVENTS and key == "self" and lightning_fp16:
            events.append(_Event(_LIGHTNING_EVENTS[call.method], call.node, key, None, call.where, framework="lightning"))
        elif call.method == "step" and facts.is_optimizer(key, call.scope):
            events.append(_Event("optimizer_step", call.node, None, key, call.where))
        elif (handed := _scaler_handed_to_a_stepping_helper(call, facts)) is not None:
            events.append(_Event("step", call.node, handed, None, call.where))
        elif call.qualname in names.GRAD_NORM:
            events.append(_Event("norm", call.node, None, None, call.where))
        elif call.qualname in names.CLIP_GRAD or _clips_its_own_gradients(call):
            events.append(_Event("clip", call.node, None, None, call.where))
        elif _GRAD_NORM_HELPER.search(call.callee or "") and facts.called_function(call) is None:
            events.append(_Event("norm", call.node, None, None, call.where, helper=True))
    for read in facts.grad_reads:
        if read.where.scope.function_scope is function and _computes_with_grad(read.where.statement, facts):
            events.append(_Event("grad", read.where.statement, None, None, read.where))
    events.sort(key=lambda e: e.where.order)
    return events


# accelerate scales the loss in `accelerator.backward` under fp16 mixed precision, and unscales
# every prepared optimizer's gradients in `unscale_gradients` and its own `clip_grad_norm_`.
_ACCELERATOR_EVENTS = {"backward": "scale", "unscale_gradients": "unscale", "clip_grad_norm_": "unscale", "clip_grad_value_": "unscale"}


# Lightning Fabric scales the loss in `fabric.backward` under 16-bit mixed precision and unscales
# in `fabric.clip_gradients`; so do a LightningModule's `self.manual_backward` and
# `self.clip_gradients` under a Trainer's `precision="16-mixed"` (manual optimization).
_FABRIC_EVENTS = {"backward": "scale", "clip_gradients": "unscale"}
_LIGHTNING_EVENTS = {"manual_backward": "scale", "clip_gradients": "unscale"}


def _scaling_framework(facts: AmpFacts, call: CallSite, classes: frozenset[str], usual_name: str, keyword: str) -> bool:
    """`accelerator.backward(loss)` / `fabric.backward(loss)` on an object that may run in fp16:
    one built here with such a precision or one not written as a literal, or a name
    `accelerator` / `fabric` handed in."""
    key = call.receiver_key
    if key is None:
        return False
    built = [value for value, qualified in facts.constructed(key, call.scope) if qualified in classes]
    if built:
        # Left out, accelerate's precision comes from the launch configuration; Fabric's is 32-bit.
        return any(ts.may_scale_in_fp16(value, keyword, when_left_out=keyword == "mixed_precision") for value in built)
    return key.rsplit(".", 1)[-1] == usual_name and facts.called_function(call) is None


def _lightning_may_run_in_fp16(facts: AmpFacts) -> bool:
    """A Lightning Trainer built in the file may run in 16-bit mixed precision."""
    return any(
        c.qualname in names.LIGHTNING_TRAINERS and ts.may_scale_in_fp16(c.node, "precision", when_left_out=False) for c in facts.calls
    )


# A gradient-norm or clipping helper from another file (Swin's `get_grad_norm(model.parameters())`
# from utils_simmim, DINO's and iBOT's `utils.clip_gradients(model, clip)`): it reads `.grad`. One
# defined here is followed into instead.
_GRAD_NORM_HELPER = re.compile(r"(?:^|\.|_)grad_?norm$|(?:^|\.)clip_gradients$", re.IGNORECASE)


# A function of another file that is handed the scaler and named for stepping or unscaling
# (nerfstudio's `optimizers.optimizer_scaler_step_some(grad_scaler, groups)`, which calls
# `unscale_` and `step` on each optimizer): it has unscaled the gradients of every optimizer it
# steps, since `scaler.step(opt)` unscales them in place. One of this file is followed into instead.
# Whole parts of the name (`optimizer_scaler_step_some`, `unscale_and_step`), not `steps_per_epoch`,
# and not a helper that only reports (`log_step_stats(writer, step, scaler)`).
_STEPS_OR_UNSCALES = re.compile(r"(?:^|_)(?:step|unscale)(?:_|$)", re.IGNORECASE)
_REPORTS = re.compile(r"log|print|record|report|track", re.IGNORECASE)


def _scaler_handed_to_a_stepping_helper(call: CallSite, facts: AmpFacts) -> str | None:
    """The scaler handed to such a call, if any."""
    if not _STEPS_OR_UNSCALES.search(call.name) or _REPORTS.search(call.name) or facts.called_function(call) is not None:
        return None
    handed = (dotted_name(arg.value) for arg in call.node.args)
    return next((key for key in handed if facts.is_scaler(key, call.scope) and not facts.scaler_disabled(key, call.scope)), None)


def _clips_its_own_gradients(call: CallSite) -> bool:
    """FSDP's `model.clip_grad_norm_(max_norm)`: a module clipping its (still scaled) gradients.
    Not a framework object's (`accelerator.clip_grad_norm_`), which unscales them first."""
    return (
        call.method in ("clip_grad_norm_", "clip_grad_value_")
        and call.receiver_key is not None
        and call.receiver_key.split(".")[-1] not in names.FRAMEWORK_OWNERS
    )


def _computes_with_grad(statement: cst.CSTNode, facts: AmpFacts) -> bool:
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    code = statement_code(statement)
    if _unscaled_by_hand(code, facts):
        return False
    return bool(_GRAD_COMPUTATION.search(code)) or any(
        _FROM_GRADIENTS.search(factor) for factors in _GRAD_RESCALE.findall(code) for factor in factors if factor
    )


def _unscaled_by_hand(code: str, facts: AmpFacts) -> bool:
    """Whether the statement divides its gradients by the scale, or multiplies them by a name
    bound to its inverse."""
    for operator, operand in _GRAD_TIMES.findall(code):
        if operator == "/" and "scale" in operand.lower():
            return True
        if operator == "*" and any(
            a.key == operand and _INVERSE_OF_THE_SCALE.search(facts.module.code_for_node(a.value)) for a in facts.assignments
        ):
            return True
    return False


def _exclusive(facts: AmpFacts, a: _Event, b: _Event) -> bool:
    """Never in the same pass: two branches of one `if`, or of two `if`s on one condition (the
    scaled backward under a helper's `if args.fp16:`, the clip under `else:` of the caller's)."""
    return mutually_exclusive(a.position, b.position) or facts.contradictory(_places(a), _places(b))


def _runs_whenever(facts: AmpFacts, unscale: _Event, read: _Event, scale: _Event) -> bool:
    """The `unscale_` runs on every pass the gradients are read scaled on: each condition it is
    under holds there too, switches AMP (`if scaler is not None:`, whose other outcome scaled
    nothing), is one the scaled backward is under as well (torchrl's `if dtype:` around both, or
    two `if`s on one condition: on the other outcome nothing was scaled), or asks whether the
    optimizer is unscaled already (`if state["stage"] is not OptState.UNSCALED:`).
    `if args.log_norm: scaler.unscale_(opt)` does not cover a clip that runs always."""
    held, failed = facts.outcomes_at(_places(unscale))
    read_held, read_failed = facts.outcomes_at(_places(read))
    scale_held, scale_failed = facts.outcomes_at(_places(scale))
    return all(c in read_held or c in scale_held or _COVERS_EITHER_WAY.search(c) for c in held) and all(
        c in read_failed or c in scale_failed or _COVERS_EITHER_WAY.search(c) for c in failed
    )


_COVERS_EITHER_WAY = re.compile(ts.AMP_SWITCH.pattern + r"|OptState|_per_optimizer_states|\bstage\b|unscaled", re.IGNORECASE)


def _places(event: _Event) -> tuple[Context, ...]:
    return (event.where,) if event.at is None else (event.at, event.where)


def _events_with_helpers(function: Scope, facts: AmpFacts, own: dict[int, list[_Event]]) -> list[_Event]:
    """The function's events in program order, with same-file helpers' events spliced in (one level)."""
    merged: list[tuple[int, int, _Event]] = [(e.where.order, 0, e) for e in own[id(function)]]
    for call in function.calls:
        helper = facts.called_function(call)
        if helper is None or helper is function:
            continue
        spliced = (replace(e, at=call.where) for e in own.get(id(helper), ()))
        merged.extend((call.where.order, i + 1, e) for i, e in enumerate(spliced))
    merged.sort(key=lambda item: (item[0], item[1]))
    return [event for _, _, event in merged]


def check(facts: AmpFacts) -> Iterator[Hit]:
    if not facts.calls:
        return
    functions = [facts.module_scope, *facts.functions]
    lightning_fp16 = _lightning_may_run_in_fp16(facts)
    own = {id(f): _own_events(f, facts, lightning_fp16) for f in functions}
    if not any(e.kind == "scale" for events in own.values() for e in events):
        return
    reported: set[int] = set()
    for function in functions:
        events = _events_with_helpers(function, facts, own)
        stepped_optimizers = {e.optimizer for e in events if e.kind == "step" and e.optimizer}
        scales: list[_Event] = _scaled_on_entry(events)  # scaled backwards since the last update()
        unscales: list[_Event] = []  # unscale_ calls since then that no clip has used yet
        unscaled: set[str | None] = set()  # every optimizer unscaled since then
        for index, event in enumerate(events):
            if event.kind == "scale":
                scales.append(event)
            elif event.kind in ("unscale", "step"):
                # `scaler.step(opt)` unscales opt's gradients in place (unless `unscale_` did): a
                # norm logged after the step, before `update()`, reads true gradients.
                unscales.append(event)
                unscaled.add(event.optimizer)
            elif event.kind == "update" or (event.kind == "optimizer_step" and scales and all(s.framework for s in scales)):
                # A framework's prepared optimizer steps through its scaler and updates it
                # (accelerate's AcceleratedOptimizer, Fabric's and Lightning's optimizer wrappers):
                # what is read after `optimizer.step()` there is unscaled.
                scales, unscales, unscaled = [], [], set()
            elif event.kind in ("clip", "grad", "norm") and id(event.node) not in reported:
                # Only what can run in the same pass: `if amp: scale... else: backward; clip` is fine.
                scale = next((e for e in reversed(scales) if not _exclusive(facts, e, event)), None)
                if scale is None or (scale.framework is not None and event.helper):
                    continue  # a norm helper next to a framework's backward is often the framework's own (DeepSpeed's)
                if scale.at is not None and scale.at is event.at:
                    continue  # scaled and read in one helper: reported there, where the unscale_ goes
                fresh: list[_Event] = []
                partial: list[_Event] = []  # an `unscale_` on some of the read's passes only
                for unscale in unscales:
                    if not _exclusive(facts, unscale, event):
                        (fresh if _runs_whenever(facts, unscale, event, scale) else partial).append(unscale)
                later_steps = [e.optimizer for e in events[index + 1 :] if e.kind == "step"]
                owner = later_steps[0] if later_steps else None
                covering = _covering_unscale(owner, fresh, stepped_optimizers, unscaled)
                if covering is not None:
                    if len(stepped_optimizers) > 1:
                        # Several optimizers: one `unscale_` covers the clip of its own model, not
                        # a second clip of another model's (still scaled) gradients.
                        unscales.remove(covering)
                    continue
                reported.add(id(event.node))
                # Advise the next optimizer stepped that is still scaled: after `unscale_(a)`,
                # clip a, clip b, `step(a)`, `step(b)`, the second clip wants `unscale_(b)`.
                advised = next((o for o in later_steps if o not in unscaled), owner)
                # An `unscale_` on some passes only: another before the read would unscale twice.
                sometimes = next((e for e in partial if e.kind == "unscale"), None)
                # Named in the message even when stepped directly (AMP006's case): not a fix's target,
                # since an unscale_ with no scaler.step() and update() after it raises the next time.
                named = advised or next((e.optimizer for e in events[index + 1 :] if e.kind == "optimizer_step"), None)
                if scale.framework is not None:
                    yield _framework_hit(event, scale)
                elif sometimes is not None:
                    yield _sometimes_unscaled_hit(event, sometimes)
                elif _in_a_micro_batch_loop(event, scale, events[index + 1 :]):
                    yield _hit(event, scale.scaler, named, None, micro_batches=True)
                else:
                    yield _hit(event, scale.scaler, named, autofix.unscale_before(event, scale.scaler, advised, events, facts))


def _scaled_on_entry(events: list[_Event]) -> list[_Event]:
    """The evidence that the function was entered with scaled gradients: its first dealing with a
    GradScaler is `scaler.unscale_(optimizer)`, which is only ever called on scaled gradients (an
    optimizer wrapper's `backward(loss)` did the scaled backward, its `step()` unscales). That
    `unscale_` stands in for the scaled backward, so gradients read before it are reported."""
    first = next((e for e in events if e.kind in ("scale", "unscale", "step", "update")), None)
    return [first] if first is not None and first.kind == "unscale" and first.framework is None else []


def _covering_unscale(owner: str | None, fresh: list[_Event], stepped: set[str], unscaled: set[str | None]) -> _Event | None:
    """The `unscale_` that makes a clip safe, if any."""
    for event in fresh:
        if owner is not None and event.optimizer == owner:
            return event
    # One optimizer: any `unscale_` covers it even when spelled differently (`opt` vs `self.opt`).
    # Several: an `unscale_` not yet used by an earlier clip (`unscale_(a); unscale_(b)`, then
    # `clip(model_a); clip(model_b)`), once the optimizer that steps next was unscaled too: an
    # `unscale_(optimizerG)` alone does not cover a clip before `step(optimizerD)`.
    if len(stepped) > 1 and owner in stepped and owner not in unscaled:
        return None
    return fresh[0] if fresh else None


# What a computation on still-scaled gradients gets wrong, per kind of event.
_CONSEQUENCE = {
    "clip": ("clips gradients", "a clip threshold then compares against scale x norm"),
    "norm": ("takes the norm of gradients", "the norm comes out multiplied by the scale, 65536 at first"),
    "grad": ("reads gradients (`.grad`)", "whatever it computes, a norm, a maximum or an inf check, sees the scaled values"),
}


def _framework_hit(event: _Event, scale: _Event) -> Hit:
    what, consequence = _CONSEQUENCE[event.kind]
    owner = scale.scaler
    if scale.framework == "accelerate":
        scaled = f"that `{owner}.backward()` scaled when accelerate runs in fp16 mixed precision"
        advice = f"use `{owner}.clip_grad_norm_(...)`, which unscales them first, or call `{owner}.unscale_gradients()` before it"
    elif scale.framework == "fabric":
        scaled = f"that `{owner}.backward()` scaled when Fabric runs in 16-bit mixed precision"
        advice = f"use `{owner}.clip_gradients(model, optimizer, max_norm=...)`, which unscales them first"
    else:
        scaled = "that `self.manual_backward()` scaled when the Trainer runs in 16-bit mixed precision"
        advice = "use `self.clip_gradients(optimizer, gradient_clip_val=...)`, which unscales them first"
    if event.at is None:
        return Hit(event.node, f"{what} {scaled} ({consequence}); {advice}", event.where.statement)
    reached = "they reach this helper through the call on line {0}"
    return Hit(event.node, f"{what} {scaled} ({consequence}); {reached}: {advice}", event.where.statement, related=(event.at.statement,))


def _sometimes_unscaled_hit(event: _Event, unscale: _Event) -> Hit:
    what, consequence = _CONSEQUENCE[event.kind]
    return Hit(
        event.node,
        f"{what} that are still multiplied by the GradScaler's scale on the passes where "
        f"`{unscale.scaler}.unscale_({unscale.optimizer or 'optimizer'})` (line {{0}}) does not run, under a condition "
        f"this code is not ({consequence}); unscale on every pass that reads the gradients, or read them under the same condition",
        event.where.statement,
        related=(unscale.node,),
    )


def _in_a_micro_batch_loop(event: _Event, scale: _Event, later: list[_Event]) -> bool:
    """The read runs in the loop of the scaled backward, and the next `scaler.step` after that
    loop (gradient accumulation's micro-batches): an `unscale_` there would run on every
    micro-batch, and torch refuses a second one before `update()`. A loop over parameter groups
    around the clip alone is no such loop."""
    step = next((e for e in later if e.kind == "step"), None)
    loops = event.position.statement_loops
    return (
        step is not None and bool(loops) and loops[-1] in scale.position.statement_loops
        and loops[-1] not in step.position.statement_loops
    )


def _hit(event: _Event, scaler: str | None, owner: str | None, fix, *, micro_batches: bool = False) -> Hit:
    """In a helper, the call that reaches it with scaled gradients is named: another caller may
    unscale first, and the helper has no scaler to unscale with."""
    what, consequence = _CONSEQUENCE[event.kind]
    if micro_batches:
        where = (
            "once the micro-batch loop has ended, and move this after it: inside the loop, unscale_ would run on "
            "every micro-batch, which torch refuses before update()"
        )
    else:
        where = "before it" if event.at is None else "before the call on line {0} that reaches it with them"
    return Hit(
        event.node,
        f"{what} that are still multiplied by the GradScaler's scale ({consequence}); call "
        f"`{scaler or 'scaler'}.unscale_({owner or 'optimizer'})` {where}",
        event.where.statement,
        fix,
        related=(event.at.statement,) if event.at is not None else (),
    )
