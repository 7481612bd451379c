"""Join the static findings with what the run saw, and turn runtime-only problems into findings.

A static finding matches runtime events whose user callsite lies in the finding's file and line
range, or whose call stack went through it (a helper's call: the event inside the helper confirms
the finding at the call, rather than standing as a second finding). Status: `confirmed` when the
problem happened there; `refuted` only when the run performed the action the rule judges (the
backward, the clip, the scaler's step and update) there and the problem did not occur;
`not-reached` when the lines never ran, or ran without that action or without the case the finding
is about (the run crashed or ended first, a GradScaler that was off or disabled itself and scaled
nothing, no autocast region on in the whole run, CUDA autocast on a machine without CUDA), which
the evidence's `note` says.
Rules the tracer has no runtime check for are not given a status (they are listed under
`unchecked_findings` in the report).
"""

from __future__ import annotations

import ast
import math
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property

from amplint.trace.callsite import Callsite
from amplint.trace.probes import deprecated_api_of
from amplint.trace.rule_events import NOT_RUN, RuleEvent, backward_calls, rule_events
from amplint.trace.state import Conversion, TraceState

CHECKED_CODES = tuple(f"AMP{n:03d}" for n in range(1, 18))
RUNTIME_NAMES = {
    "AMP001": "deprecated-amp-api",
    "AMP002": "half-with-autocast",
    "AMP003": "backward-in-autocast",
    "AMP004": "scaler-per-iteration",
    "AMP005": "clip-without-unscale",
    "AMP006": "optimizer-step-bypasses-scaler",
    "AMP007": "scaler-step-update-pairing",
    "AMP008": "unscale-per-microbatch",
    "AMP009": "fp16-autocast-without-scaler",
    "AMP010": "scaler-with-bf16",
    "AMP011": "scheduler-on-skipped-step",
    "AMP012": "checkpoint-without-scaler-state",
    "AMP013": "custom-function-without-custom_fwd",
    "AMP014": "disabled-region-uncast-inputs",
    "AMP015": "autocast-not-in-thread",
    "AMP016": "autocast-dtype-misuse",
    "AMP017": "compile-backward-autocast-mismatch",
}
_API_NAMES = ("autocast", "GradScaler", "custom_fwd", "custom_bwd")


@dataclass
class Facts:
    """The run's records with device values resolved (see session.resolve_facts)."""

    state: TraceState
    values: list  # DeferredValues.resolve()
    applied: dict = field(default_factory=dict)  # id(ScalerStep) -> bool
    display: callable = str  # absolute filename -> report path
    events: dict = field(default_factory=dict)  # code -> [RuleEvent] (rule_events, built by confirm_findings)
    callers: dict = field(default_factory=dict)  # probe callsite -> user lines above it (Probes.callers)
    direct_callers: dict = field(default_factory=dict)  # probe callsite -> the user lines right above it
    ops_recorded: bool = True  # off under --no-ops: lines that run only ops are not seen then

    def where(self, site: Callsite | None) -> str | None:
        return None if site is None else f"{self.display(site[0])}:{site[1]}"

    @cached_property
    def autocast_was_on(self) -> bool:
        """Any sign of an enabled autocast region in the run: one entered, or work recorded under
        one (a region inside a compiled function is entered by the compiled graph, not by
        Python's `with`). Asked once per unjudged finding; the op table can be large."""
        state = self.state
        return bool(state.autocast_entries) or any(
            calls[0] for table in (state.backward_calls, state.step_calls) for calls in table.values()
        ) or any(record.get("calls_under_autocast") for record in state.compiled) or any(key[3] for key in state.ops)

    @cached_property
    def lines_run(self) -> set:
        """The lines the run was seen on: the watched calls' own lines and the lines that called them."""
        return self.state.lines_seen.union(*self.callers.values())

    @property
    def autocast_ran(self) -> bool:
        """Autocast was on somewhere in the run, or `--simulate cuda` stood in for a CUDA region
        that turned itself off: the findings about work under autocast could be judged."""
        state = self.state
        return self.autocast_was_on or bool(state.simulating and state.autocast_without_device_entries)


class _Site:
    """A static finding's place: its file and line range, and what its span calls: `backward` of
    `loss.backward()`, "" for a span that is no single call (a statement reading `.grad`), None
    where the source cannot say. Two findings of a rule on one line (`loss.backward(); opt.step()`)
    are told apart by it."""

    def __init__(self, filename: str, line: int, end_line: int, called: str | None = None):
        self.filename = os.path.normcase(os.path.abspath(filename))
        self.lines = range(line, max(line, end_line) + 1)
        self.called = called

    def matches(self, site: Callsite | None) -> bool:
        return site is not None and site[1] in self.lines and os.path.normcase(os.path.abspath(site[0])) == self.filename

    def overlaps(self, span: tuple) -> bool:
        filename, first, last = span
        return first <= self.lines[-1] and self.lines[0] <= last and os.path.normcase(os.path.abspath(filename)) == self.filename

    def reaches(self, callsite: Callsite | None, facts: "Facts") -> bool:
        """The callsite is on the finding's lines, or a helper called from them ran it (a static
        finding may point at the call of a helper, in this module or another)."""
        return self.matches(callsite) or any(self.matches(caller) for caller in facts.callers.get(callsite, ()))

    def joins(self, event: RuleEvent) -> bool:
        return self.joins_directly(event) or any(self.matches(caller) for caller in event.callers)

    def joins_directly(self, event: RuleEvent) -> bool:
        return any(self.matches(s) for s in event.sites) or any(self.overlaps(span) for span in event.spans)


def _sum_where(site: _Site, table: dict, index: int | None = None) -> int:
    total = 0
    for callsite, value in table.items():
        if site.matches(callsite):
            total += value[index] if index is not None else value
    return total


def _reached(site: _Site, facts: Facts) -> bool:
    return any(site.matches(s) for s in facts.lines_run)


# The note of a finding whose lines the run never reached. Lines are seen by the ops and probes
# they run: without op recording, a line that runs only tensor ops is not seen.
LINE_NEVER_RAN = "the line never ran in this run"
LINE_NOT_SEEN_WITHOUT_OPS = (
    "nothing the tracer watches ran on the line: with --no-ops only GradScaler, optimizer, backward and "
    "API calls are seen, so a line that runs only tensor ops may have run"
)


def _status(confirmed: int, reached: bool) -> str:
    return "confirmed" if confirmed else ("refuted" if reached else "not-reached")


def _not_judged(site: _Site, facts: Facts, evidence: dict, what_did_not_run: str):
    """The action the rule judges did not run at the finding's lines, so the run cannot refute
    it: `not-reached`, with a note saying what did not run when the lines themselves ran."""
    if _reached(site, facts):
        evidence["note"] = what_did_not_run
    return 0, False, evidence


# -- one function per rule: (static site or None) -> (count, reached, evidence) ---------------------
# The calls an AMP003 finding's span may make, by the name it calls: a backward (`torch.autograd.grad`
# is counted with them) or a step; a helper's call may make both.
_AMP003_CALLS = {"backward": ("backward",), "grad": ("backward",), "step": ("step",)}


def _amp003(site: _Site, facts: Facts):
    state = facts.state
    kinds = _AMP003_CALLS.get(site.called or "", ("backward", "step"))
    calls = [table for kind, table in (("backward", state.backward_calls), ("step", state.step_calls)) if kind in kinds]
    in_autocast = sum(_sum_where(site, table, 0) for table in calls)
    total = in_autocast + sum(_sum_where(site, table, 1) for table in calls)
    evidence: dict = {"calls": total, "calls_with_autocast": in_autocast}
    firsts = [table for kind, table in (("backward", state.backward_autocast), ("step", state.step_autocast)) if kind in kinds]
    first = next((ev for table in firsts for s, ev in table.items() if site.matches(s)), None)
    if first:
        evidence["autocast"] = {"device": first["device"], "dtype": first["dtype"]}
        evidence["autocast_entered_at"] = facts.where(first.get("entered_at"))
        evidence["autocast_created_at"] = facts.where(first.get("created_at"))
        evidence["first_step"] = first["step"]
        if "function" in first:
            evidence["call"] = first["function"]
        elif kinds == ("backward",):
            evidence["call"] = "backward()"
    if not total:
        return _not_judged(site, facts, evidence, "the line ran, but no backward() or optimizer step was called there")
    off = _sum_where(site, state.calls_in_off_region)
    if not in_autocast and off == total:  # every call ran inside an autocast region entered disabled
        entered = next(region for at, region in state.off_region_of.items() if site.matches(at))
        note = _off_around("it", entered, facts)
        if note:
            evidence["note"] = note
            return 0, False, evidence
    return in_autocast, True, evidence


def _off_around(what: str, entered: Callsite, facts: Facts) -> str | None:
    """Why a finding whose action ran only inside an autocast region entered disabled is not
    judged, whatever other regions of the run did; None where `--simulate cuda` ran that case."""
    state = facts.state
    if state.simulating and entered in state.autocast_without_device_entries:
        return None
    return f"autocast was off around {what}: {_region_off(entered, facts, {})}; {NOT_RUN}"


def _unjudged_note(event: RuleEvent, facts: Facts) -> str:
    """What the run did not judge at an event, naming the region left off around it if any."""
    if event.off_around is not None:
        return _off_around(*event.off_around, facts) or event.unjudged
    return event.unjudged


def _scalers_at(site: _Site, facts: Facts):
    return [s for s in facts.state.scalers if site.reaches(s.callsite, facts)]


def _scaler_evidence(scalers, facts: Facts) -> tuple[int, dict]:
    steps = [s for s in facts.state.scaler_steps if s.scaler in {x.index for x in scalers}]
    skipped = sum(1 for s in steps if facts.applied.get(id(s)) is False)
    per_scaler = [s.steps for s in scalers]
    # Built per iteration: several scalers from one line, none used for more than one step, or
    # taking turns on one optimizer (rebuilt per epoch: each starts again at init_scale). A
    # scaler per fold, with the fold's own optimizer, steps many times and is correct.
    stepped_by: dict = defaultdict(set)  # optimizer serial -> the scalers that stepped it
    for step in steps:
        if step.optimizer_serial is not None:
            stepped_by[step.optimizer_serial].add(step.scaler)
    one_optimizer = any(len(users) >= 2 for users in stepped_by.values())
    per_iteration = len(scalers) >= 2 and (max(per_scaler, default=0) <= 1 or one_optimizer)
    evidence = {
        "constructions": len(scalers),
        "max_steps_per_scaler": max(per_scaler, default=0),
        "steps": len(steps),
        "steps_skipped": skipped,
        "enabled": any(s.enabled for s in scalers) if scalers else None,  # (none built: neither)
        "init_scale": scalers[0].init_scale if scalers else None,
    }
    callers = {facts.where(s.called_from) for s in scalers if s.called_from}
    if callers:
        evidence["called_from"] = sorted(c for c in callers if c)
    if per_iteration and skipped == len(steps) and steps:
        evidence["note"] = "every step was skipped: each new scaler starts again at init_scale"
    elif per_iteration and one_optimizer and evidence["max_steps_per_scaler"] > 1:
        evidence["note"] = "the scalers took turns on the same optimizer: each new one started again at init_scale" + (
            ", dropping the scale the previous one had reached" if _a_reached_scale_was_dropped(scalers, facts) else ""
        )
    return (len(scalers) if per_iteration else 0), evidence


def _a_reached_scale_was_dropped(scalers, facts: Facts) -> bool:
    """Whether a scaler left a scale other than the next one's init_scale (one that never moved
    from 65536 lost nothing by being rebuilt)."""
    last_scale: dict[int, float] = {}
    for update in facts.state.updates:
        value = facts.values[update.scale_slot]
        if value is not None:
            last_scale[update.scaler] = value
    ordered = sorted(scalers, key=lambda s: s.index)
    return any(
        last_scale.get(previous.index) not in (None, following.init_scale) for previous, following in zip(ordered, ordered[1:])
    )


def _amp004(site: _Site, facts: Facts):
    scalers = _scalers_at(site, facts)
    _per_iteration, evidence = _scaler_evidence(scalers, facts)
    # The static finding already says the line rebuilds the scaler per batch or per epoch; the
    # run confirms it whenever it built more than one there. (A runtime-only finding needs the
    # stricter per-iteration evidence: a scaler per fold steps many times and is right.) One
    # construction refutes nothing: the loop around the line did not come round (a one-epoch
    # run, a crash), and the tracer does not see a loop that comes round without the line.
    if len(scalers) >= 2:
        return len(scalers), True, evidence
    if scalers:
        evidence["note"] = (
            f"one GradScaler was built here and took {scalers[0].steps} step(s): the loop around the line "
            "did not come round to build another in this run"
        )
        return 0, False, evidence
    return _not_judged(site, facts, evidence, "the line ran, but built no GradScaler")


def _clip_evidence(clips, facts: Facts) -> dict:
    scaled = [c for c in clips if c.still_scaled]
    evidence: dict = {"clip_calls": len(clips), "on_scaled_gradients": len(scaled)}
    if scaled:
        first = scaled[0]
        evidence.update({"function": first.function, "first_step": first.step, "scale": _value(facts, first.scale_slot)})
        # The norm shown is the first finite one: an overflowed step's inf says nothing of the scale.
        shown = next((c for c in scaled if math.isfinite(_value(facts, c.norm_slot) or math.inf)), first)
        norm, scale = _value(facts, shown.norm_slot), _value(facts, shown.scale_slot)
        if norm is not None:
            evidence["total_norm_seen"] = norm
            if scale:
                evidence["total_norm_unscaled"] = norm / scale
            if shown is not first:  # with its own scale: a skip between them halved it
                evidence["norm_step"] = shown.step
                evidence["norm_scale"] = scale
    return evidence


def _amp005(site: _Site, facts: Facts):
    # A finding on a statement that reads `.grad` is judged by the reads, not by a clip beside it.
    clips = [c for c in facts.state.clips if site.reaches(c.callsite, facts)] if site.called != "" else []
    evidence = _clip_evidence(clips, facts)
    in_callees = sorted({facts.where(c.callsite) for c in clips if not site.matches(c.callsite)})
    if in_callees:
        evidence["seen_in_callee_at"] = in_callees  # where the helper called from this line clipped
    if clips:
        return evidence["on_scaled_gradients"], True, evidence
    hits = [h for s, hs in facts.state.watched_hits.items() if site.matches(s) for h in hs]
    if not hits:
        return _not_judged(site, facts, evidence, "the line ran, but clipped or changed no gradient")
    scaled = [h for h in hits if h["still_scaled"]]  # a `.grad` read/write rather than a clip call
    evidence = {"executions": len(hits), "on_scaled_gradients": len(scaled)}
    if scaled:
        evidence.update({"first_step": scaled[0]["step"], "scale": _value(facts, scaled[0]["scale_slot"])})
    return len(scaled), True, evidence


def _value(facts: Facts, slot):
    return None if slot is None else facts.values[slot]


def _amp002(site: _Site, facts: Facts):
    conversions = [c for c in facts.state.conversions if site.reaches(c.callsite, facts)]
    forwards = sum(c.forwards_under_autocast for c in conversions)
    evidence: dict = {"conversions": len(conversions), "forwards_under_autocast": forwards}
    hit = next((c for c in conversions if c.forwards_under_autocast), None)
    if hit:
        evidence.update(
            {
                "module": hit.module,
                "converted_to": hit.dtype,
                "parameter_dtype": hit.param_dtype,
                "autocast": {"device": hit.autocast[0], "dtype": hit.autocast[1]},
            }
        )
    elif conversions:
        evidence["module"] = conversions[0].module
        evidence["converted_to"] = conversions[0].dtype
        off = next((c for c in conversions if c.forwards_in_off_region), None)
        note = off and _off_around("its forwards", off.off_region, facts)
        if note:  # it ran where autocast would have been, had the region not been disabled
            evidence["note"] = note
            return 0, False, evidence
        frozen = sum(c.forwards_frozen for c in conversions)
        if frozen:
            evidence["forwards_frozen"] = frozen
            evidence["note"] = (
                "it ran under autocast only with gradients off or its low-precision parameters frozen "
                "(a frozen model, such as a distillation teacher): nothing trains those weights"
            )
    return forwards, bool(conversions) or _reached(site, facts), evidence


def _warnings_for(facts: Facts, predicate):
    return [w for w in facts.state.warnings.values() if deprecated_api_of(w.message) and predicate(w)]


def _amp001(site: _Site, facts: Facts, source_line: str = "", column: int = 1):
    here = _warnings_for(facts, lambda w: site.matches(w.callsite))
    if not here and re.match(r"\s*(from|import)\s", source_line):
        # An import is never warned about itself: it is confirmed by the uses it enables, those
        # of the name the finding points at (`from torch.cuda.amp import autocast, GradScaler`
        # has a finding per name).
        named = re.match(r"\w+", source_line[max(column, 1) - 1 :])
        names = [named.group(0)] if named and named.group(0) in _API_NAMES else []
        names = names or [n for n in _API_NAMES if re.search(rf"\b{n}\b", source_line)] or list(_API_NAMES)
        here = _warnings_for(
            facts,
            lambda w: os.path.normcase(os.path.abspath(w.callsite[0])) == site.filename
            and any(deprecated_api_of(w.message).endswith("." + n) for n in names),
        )
    count = sum(w.count for w in here)
    evidence: dict = {"warnings": count}
    if here:
        evidence["api"] = sorted({deprecated_api_of(w.message) for w in here})
        evidence["message"] = here[0].message
        evidence["at"] = sorted({facts.where(w.callsite) for w in here})
    return count, bool(here) or _reached(site, facts), evidence


def _bypass_evidence(steps: int, after_unscale: int) -> dict:
    """AMP006's evidence: the steps past the scaler, and how many of them followed `unscale_()`
    (their gradients were unscaled, but the scaler's inf check skipped nothing)."""
    return {"steps_bypassing_scaler": steps, **({"after_unscale": after_unscale} if after_unscale else {})}


def _amp006(site: _Site, facts: Facts):
    bypass = _sum_where(site, facts.state.bypass_steps)
    evidence = _bypass_evidence(bypass, _sum_where(site, facts.state.bypass_steps_after_unscale))
    if not bypass and not _sum_where(site, facts.state.direct_steps):
        return _not_judged(site, facts, evidence, "the line ran, but no optimizer.step() was called there")
    return bypass, True, evidence


def _scheduler_after_skip(steps, facts: Facts) -> list:
    return [s for s in steps if s.after is not None and facts.applied.get(id(s.after)) is False]


def _amp011(site: _Site, facts: Facts):
    steps = [s for s in facts.state.scheduler_steps if site.reaches(s.callsite, facts)]
    after_skip = _scheduler_after_skip(steps, facts)
    evidence = {"scheduler_steps": len(steps), "right_after_skipped_step": len(after_skip)}
    if after_skip:
        evidence["skipped_steps"] = [s.after.step for s in after_skip][:20]
        return len(after_skip), True, evidence
    if not steps:
        return _not_judged(site, facts, evidence, "the line ran, but no scheduler step was called there")
    # What the scheduler does after a skipped step is the question: a run whose scaler skipped
    # none of its optimizers' steps never asked it.
    optimizers = {s.optimizer for s in steps}
    skips = sum(1 for s in facts.state.scaler_steps if s.optimizer in optimizers and facts.applied.get(id(s)) is False)
    if not skips:
        evidence["note"] = f"the scaler skipped no step of this scheduler's optimizer in this run ({len(steps)} scheduler step(s)): no skip for it to follow"
        return 0, False, evidence
    evidence["skipped_steps_of_its_optimizer"] = skips
    return 0, True, evidence


def _scaler_went_round(facts: Facts) -> str | None:
    """AMP007 judges the step()/update() sequence from one iteration to the next: None when a
    scaler stepped or updated more than once, else what did not run."""
    if any(s.steps >= 2 or len(s.windows) >= 2 for s in facts.state.scalers):
        return None
    return "no GradScaler stepped or updated more than once in this run: the next iteration, which the pairing is about, did not run"


def _unscale_reached_update(facts: Facts) -> str | None:
    """AMP008 judges the unscale_() calls before an update(): None when some scaler ran both."""
    if any(s.last_unscale and s.windows for s in facts.state.scalers):
        return None
    return "scaler.unscale_() and a later update() did not both run in this run"


def _no_backward_from_region(site: _Site, facts: Facts) -> str:
    state = facts.state
    off = next((at for at in state.autocast_off_entries if site.matches(at)), None)
    if off is not None and not any(site.matches(at) for at in state.autocast_entries):
        return f"{_region_off(off, facts, {})}; {NOT_RUN}"  # the script's flag left it off
    calls = backward_calls(state)
    if not calls:
        return "no backward() ran in this run: no loss from this float16 region was backpropagated"
    return f"backward() ran {calls} time(s), never on a loss computed in this float16 region"


def _never_suppressed(site: _Site, facts: Facts) -> str | None:
    """AMP014 judges a region that disables autocast inside an enabled one: entered only where
    nothing around it was on (the enclosing region's flag left off), it judged nothing."""
    if any(site.matches(at) for at in facts.state.suppressing_regions):
        return None
    for at, (device, around, dtype) in facts.state.misdirected_disables.items():
        if site.matches(at):
            return (
                f"the region switches off {device} autocast, but the enabled region around it is {around} autocast "
                f"({dtype}), which it leaves on: the ops inside ran in {dtype} all the same"
            )
    return f"the region never ran inside an enabled autocast region in this run: {NOT_RUN}"


def _never_under_autocast(site: _Site, facts: Facts) -> str | None:
    """AMP015 records work handed to a thread only from lines that ran with autocast on: lines
    that never did, in a run where autocast was on elsewhere (their region's flag left off, an
    evaluation region on), judged nothing. Where it ran nowhere, the whole-run note says more."""
    if not facts.autocast_ran or any(site.matches(at) for at in facts.state.lines_under_autocast):
        return None
    return f"its lines ran, but never with autocast on (it was on elsewhere in this run): {NOT_RUN}"


# Why a run with no event at a finding's lines that ran did not judge it: the rules whose events
# record the action they judge (a backward on the region's loss, a scaler built, a save, a
# compiled call), or whose problem needs a sequence the run may not have got to. None (and rules
# not listed, whose events are the problem only) means the lines that ran refute the finding.
_WITHOUT_EVENTS = {
    "AMP007": lambda site, facts: _scaler_went_round(facts),
    "AMP008": lambda site, facts: _unscale_reached_update(facts),
    "AMP009": _no_backward_from_region,
    "AMP010": lambda site, facts: "the line ran, but built no GradScaler",
    "AMP012": lambda site, facts: "the line ran, but torch.save() was not called there",
    "AMP014": _never_suppressed,
    "AMP015": _never_under_autocast,
    "AMP017": lambda site, facts: "the line ran, but the compiled model was never called",
}


def _first(items):
    return next(iter(items), None)


def _event_check(code: str):
    """AMP007-AMP010, AMP012-AMP017: the events joined with the finding's lines."""

    def check(site: _Site, facts: Facts):
        events = [e for e in facts.events.get(code, ()) if site.joins(e)]
        count = sum(e.count for e in events)
        judged = [e for e in events if e.unjudged is None]
        hit = next((e for e in events if e.count), None) or _first(judged) or _first(events)
        evidence = dict(hit.evidence) if hit else {}
        if len(events) > 1:
            evidence["places"] = len(events)
        in_callees = sorted({facts.where(e.anchor) for e in events if e.anchor and not site.joins_directly(e)})
        if in_callees:
            evidence["seen_in_callee_at"] = in_callees  # where the helper called from this line did it
        if count or judged:
            return count, True, evidence
        if events:
            evidence["note"] = _unjudged_note(events[0], facts)
            return 0, False, evidence
        unjudged = _WITHOUT_EVENTS.get(code, lambda site, facts: None)(site, facts)
        if unjudged is None:
            return 0, _reached(site, facts), evidence
        return _not_judged(site, facts, evidence, unjudged)

    return check


_amp016_events = _event_check("AMP016")

# These problems need losses a GradScaler scaled: a scaler that scaled nothing (built with
# enabled=False by the script's flag, disabled for want of its device on a CPU-only machine, or
# whose scale() was never called before the run ended) leaves the run unable to refute them.
_NEED_SCALED_GRADIENTS = ("AMP005", "AMP006", "AMP010", "AMP011", "AMP012")


def _scaled_nothing_note(code: str, site: _Site, facts: Facts, sources: dict) -> str | None:
    """Why the run cannot judge this finding, when no GradScaler scaled a loss in it."""
    if code not in _NEED_SCALED_GRADIENTS:
        return None
    scalers = _scalers_at(site, facts) if code == "AMP010" else facts.state.scalers
    if any(s.enabled and s.scale_calls for s in scalers):
        return None
    if not scalers:  # (AMP010's own check says its line built none)
        return None if code == "AMP010" else f"no GradScaler was built in this run, so no loss was scaled: {NOT_RUN}"
    if any(s.enabled for s in scalers):
        return f"the GradScaler never scaled a loss in this run (scaler.scale() was not called): {NOT_RUN}"
    switched_off = next((s for s in scalers if s.disabled_on_request), None)
    if switched_off is not None:
        return f"the GradScaler built at {facts.where(switched_off.callsite)} was off in this run{_switch(switched_off.callsite, sources, 'GradScaler')} and scaled nothing: {NOT_RUN}"
    device = scalers[0].device
    return f"the GradScaler disabled itself (no {device} device on this machine) and scaled nothing: the {device} case did not run"


# These problems happen under an enabled autocast region: a run that entered none (autocast
# switched off by the script's flag, a nullcontext in its place, CUDA autocast on a machine
# without CUDA and no --simulate cuda) cannot refute them.
_NEED_AUTOCAST = ("AMP002", "AMP003", "AMP009", "AMP013", "AMP014", "AMP015", "AMP017")


def _autocast_off_note(code: str, facts: Facts, sources: dict) -> str | None:
    """Why the run cannot judge this finding, when no autocast region was on in it."""
    state = facts.state
    if code not in _NEED_AUTOCAST or facts.autocast_ran:
        return None
    entered = state.autocast_off_entries or state.autocast_without_device_entries
    if entered:
        site, _count = entered.most_common(1)[0]
        return f"autocast was off in this run: {_region_off(site, facts, sources)}; {NOT_RUN}"
    return f"no autocast region was entered in this run: {NOT_RUN}"


def _region_off(entered, facts: Facts, sources: dict) -> str:
    """`the region entered at train.py:20 was disabled (enabled=args.amp, set by the script
    option --amp)`, quoting the call that built it; or that CUDA autocast turned itself off."""
    state = facts.state
    if entered in state.autocast_without_device_entries:
        return f"CUDA autocast disabled itself at {facts.where(entered)} (no CUDA on this machine; --simulate cuda shadows it)"
    if entered in state.autocast_refused_dtype:
        device, dtype = state.autocast_refused_dtype[entered]
        return f"the region entered at {facts.where(entered)} turned itself off ({device} autocast does not support {dtype})"
    built = state.autocast_created_at.get(entered) or entered
    return f"the region entered at {facts.where(entered)} was disabled{_switch(built, sources, 'autocast')}"


def _switch(callsite, sources: dict, constructor: str) -> str:
    """` (enabled=EXPR, set by the script option --OPT)`: the argument that switched a GradScaler
    or an autocast region off, as written at the call that starts on that line, and the argparse
    option of the same file it reads."""
    if callsite is None:
        return ""
    lines = _source_lines(callsite[0], sources)
    if not 0 < callsite[1] <= len(lines) or not re.search(rf"{constructor}\s*\(", lines[callsite[1] - 1]):
        return ""  # no such call starts on that line (`with amp_ctx:`): another line's would be quoted
    expression = _enabled_argument("\n".join(lines[callsite[1] - 1 : callsite[1] + 9]), constructor)
    if expression is None:
        return ""
    option = _option_read_by(expression, "\n".join(lines))
    return f" (enabled={expression}" + (f", set by the script option {option})" if option else ")")


def _enabled_argument(call_text: str, constructor: str) -> str | None:
    """The `enabled=` argument of the first `constructor(...)` call in the text, whitespace collapsed."""
    opening = re.search(rf"{constructor}\s*\(", call_text)
    if opening is None:
        return None
    depth, argument, arguments = 0, [], []
    for char in call_text[opening.end() :]:
        if char in ")]}" and depth == 0:  # the call's closing parenthesis
            arguments.append("".join(argument))
            break
        if char == "," and depth == 0:
            arguments.append("".join(argument))
            argument = []
            continue
        depth += (char in "([{") - (char in ")]}")
        argument.append(char)
    for text in arguments:
        named = re.match(r"\s*enabled\s*=(.*)", text, re.S)
        if named:
            return " ".join(named.group(1).split()) or None
    return None


def _option_read_by(expression: str, source: str) -> str | None:
    """The `add_argument("--name")` option of the source whose destination the expression reads
    (`args.amp`, `not args.no_amp`, a variable `use_amp`); not names under torch, os or sys."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        return None
    bases = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id not in ("torch", "os", "sys"):
            names.append(node.attr)  # `args.amp`: the option's destination
        elif isinstance(node, ast.Name) and id(node) not in bases:
            names.append(node.id)  # `use_amp`, `dtype`: a variable named like the option
    for name in names:
        spelled = "[-_]".join(re.escape(part) for part in name.split("_"))
        option = re.search(rf"""add_argument\(\s*(?:['"]-\w['"]\s*,\s*)?['"](--{spelled})['"]""", source)
        if option:
            return option.group(1)
    return None


_NO_CUDA = "CUDA is not available"  # torch's warning when it disables a CUDA autocast region


def _amp016(site: _Site, facts: Facts):
    count, reached, evidence = _amp016_events(site, facts)
    if not count and any(site.matches(w.callsite) and _NO_CUDA in w.message for w in facts.state.warnings.values()):
        # torch.autocast("cuda") turned itself off on this machine before any check the finding is about.
        return 0, False, {**evidence, "note": "CUDA autocast disabled itself here (no CUDA on this machine): the CUDA case did not run"}
    devices = {d for at, ran in facts.state.bce_devices.items() if site.matches(at) for d in ran}
    if not count and devices and "cuda" not in devices:
        # Binary cross-entropy ran only under CPU autocast, which allows it: the CUDA case the
        # finding is about did not run, which is not evidence that it is fine.
        evidence = {**evidence, "kind": "bce-under-autocast", "autocast_devices": sorted(devices),
                    "note": "binary_cross_entropy ran only under non-CUDA autocast, which allows it; CUDA autocast raises"}
        return 0, False, evidence
    return count, reached, evidence


_CHECKS = {
    "AMP001": _amp001,
    "AMP002": _amp002,
    "AMP003": _amp003,
    "AMP004": _amp004,
    "AMP005": _amp005,
    "AMP006": _amp006,
    "AMP011": _amp011,
    "AMP016": _amp016,
    **{code: _event_check(code) for code in ("AMP007", "AMP008", "AMP009", "AMP010", "AMP012", "AMP013", "AMP014", "AMP015", "AMP017")},
}


def _source_lines(filename: str, cache: dict) -> list[str]:
    if filename not in cache:
        try:
            with open(filename, encoding="utf-8", errors="replace") as handle:
                cache[filename] = handle.read().splitlines()
        except OSError:
            cache[filename] = []
    return cache[filename]


def _source_line(filename: str, line: int, cache: dict) -> str:
    lines = _source_lines(filename, cache)
    return lines[line - 1] if 0 < line <= len(lines) else ""


def _span(filename: str, finding, cache: dict) -> str:
    """The source text a finding points at (columns are 1-based, the end exclusive)."""
    lines = _source_lines(filename, cache)
    first, last = finding.line, finding.end_line or finding.line
    if not 0 < first <= last <= len(lines) or not finding.column or not finding.end_column:
        return ""
    if first == last:
        return lines[first - 1][finding.column - 1 : finding.end_column - 1]
    return "\n".join([lines[first - 1][finding.column - 1 :], *lines[first : last - 1], lines[last - 1][: finding.end_column - 1]])


def _called_in(text: str) -> str | None:
    """The name the span calls (`step` of `scaler.step(opt)`), "" when it is no single call."""
    if not text.strip():
        return None
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return ""  # a statement (`g = p.grad.abs()`), or several on one line
    if not isinstance(node, ast.Call):
        return ""
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def confirm_findings(static_findings: list, absolute_of: dict, facts: Facts) -> tuple[list[dict], list[dict]]:
    """(report findings, static findings the tracer cannot check)."""
    from amplint.static.checks.amp012_checkpoint_without_scaler_state import NEVER_RESTORES

    results: list[dict] = []
    unchecked: list[dict] = []
    claimed: dict[str, list[_Site]] = defaultdict(list)
    sources: dict = {}
    if not facts.events:
        facts.events = rule_events(facts)
    for finding in static_findings:
        filename = absolute_of.get(finding.path, finding.path)
        site = _Site(filename, finding.line, finding.end_line or finding.line, _called_in(_span(filename, finding, sources)))
        check = _CHECKS.get(finding.code)
        if check is None:
            unchecked.append(_unchecked(finding, "the rule has no runtime check"))
            continue
        if finding.code == "AMP012" and NEVER_RESTORES in finding.message:
            unchecked.append(_unchecked(finding, "it is about restoring a checkpoint; the runtime check follows torch.save()"))
            continue
        claimed[finding.code].append(site)
        if finding.code == "AMP001":
            count, reached, evidence = check(site, facts, _source_line(filename, finding.line, sources), finding.column)
        else:
            count, reached, evidence = check(site, facts)
        unjudged = None
        if not count and (reached or _reached(site, facts)):
            unjudged = _scaled_nothing_note(finding.code, site, facts, sources)
            if unjudged is None and "note" not in evidence:  # a note saying what did not run stays
                unjudged = _autocast_off_note(finding.code, facts, sources)
        if unjudged:
            reached = False
            evidence["note"] = unjudged
        if not count and not reached and "note" not in evidence and not _reached(site, facts):
            evidence["note"] = LINE_NEVER_RAN if facts.ops_recorded else LINE_NOT_SEEN_WITHOUT_OPS
        if finding.code == "AMP002" and reached and not evidence["conversions"]:
            # The line ran but converted no module: an input tensor cast by hand, which the runtime
            # check (it follows converted modules into autocast) cannot judge either way.
            unchecked.append(_unchecked(finding, "it converts a tensor, not a module; the runtime check follows modules"))
            continue
        severity = getattr(getattr(finding, "severity", None), "value", None)
        if finding.code == "AMP011" and count and severity == "info":
            severity = "warning"  # the rule's upgrade: a skip really happened before the scheduler step
            evidence["severity_upgraded"] = True
        results.append(
            {
                "code": finding.code,
                "name": finding.name,
                "path": finding.path,
                "line": finding.line,
                "column": finding.column,  # tells apart two findings of a rule on one line
                "source": "static",
                "status": _status(count, reached),
                "count": count,
                "severity": severity,
                "evidence": evidence,
                "message": finding.message,
            }
        )
    results.extend(_runtime_findings(claimed, facts))
    results.sort(key=lambda f: (f["path"], f["line"], f["code"]))
    return results, unchecked


def _unchecked(finding, reason: str) -> dict:
    return {"code": finding.code, "path": finding.path, "line": finding.line, "message": finding.message, "reason": reason}


def _claimed(claimed: dict, code: str, site: Callsite | None, facts: Facts) -> bool:
    """A static finding of the code points at the line or at a line that called it."""
    return any(s.reaches(site, facts) for s in claimed.get(code, ()))


def _severity(code: str) -> str | None:
    try:
        from amplint.catalogue import rule_info

        return rule_info(code).severity.value
    except Exception:  # noqa: BLE001 - a missing rule doc must not cost the report
        return None


def _runtime(code: str, site: Callsite, facts: Facts, count: int, evidence: dict, message: str) -> dict:
    severity = _severity(code)
    if code == "AMP011" and severity == "info":
        severity = "warning"
    return {
        "code": code,
        "name": RUNTIME_NAMES[code],
        "path": facts.display(site[0]),
        "line": site[1],
        "source": "runtime",
        "status": "confirmed",
        "count": count,
        "severity": severity,
        "evidence": evidence,
        "message": message,
    }


def _run_trained(state: TraceState) -> bool:
    """The run ran a backward or an optimizer step, or built a GradScaler: AMP002's "module that
    trains" (rules/AMP002.md), judged on what ran."""
    return (
        backward_calls(state) > 0
        or any(sum(calls) for calls in state.step_calls.values())
        or bool(state.scalers)
    )


def _note_untrained_conversion(state: TraceState, conversion: Conversion, facts: Facts) -> None:
    note = (
        f"{conversion.module} converted to {conversion.dtype} at {facts.where(conversion.callsite)} ran "
        f"{conversion.forwards_under_autocast} forward(s) under autocast; not an AMP002 finding: the run trained "
        "nothing (no backward, optimizer step or GradScaler), and low-precision inference is outside the rule"
    )
    if note not in state.notes:
        state.notes.append(note)


def _runtime_findings(claimed: dict, facts: Facts) -> list[dict]:
    """Problems the run saw at lines no static finding points at."""
    state = facts.state
    found: list[dict] = []

    # AMP003: backward/step with autocast enabled, e.g. a context opened in another module.
    for table, events, what in (
        (state.backward_calls, state.backward_autocast, "backward()"),
        (state.step_calls, state.step_autocast, "an optimizer step"),
    ):
        for site, (with_autocast, _without) in table.items():
            if not with_autocast or site is None or _claimed(claimed, "AMP003", site, facts):
                continue
            ev = events.get(site, {})
            evidence = {
                "calls_with_autocast": with_autocast,
                "autocast": {"device": ev.get("device"), "dtype": ev.get("dtype")},
                "autocast_entered_at": facts.where(ev.get("entered_at")),
                "autocast_created_at": facts.where(ev.get("created_at")),
                "first_step": ev.get("step"),
            }
            made = evidence["autocast_created_at"]
            entered = evidence["autocast_entered_at"] or "an autocast region"
            origin = f"entered at {entered}" + (f", created at {made}" if made and made != entered else "")
            found.append(_runtime("AMP003", site, facts, with_autocast, evidence, f"{what} ran inside autocast ({origin})"))

    # (AMP011 has no runtime-only finding: a scheduler step after a skipped step is counted in
    # scaler.scheduler_steps_after_skip; it becomes a finding only where the static rule points.)

    # AMP004: one construction line making a scaler per iteration (e.g. a helper called per batch).
    by_line: dict = defaultdict(list)
    for scaler in state.scalers:
        if scaler.callsite is not None:
            by_line[scaler.callsite].append(scaler)
    for site, scalers in by_line.items():
        if _claimed(claimed, "AMP004", site, facts):
            continue
        count, evidence = _scaler_evidence(scalers, facts)
        if count:
            caller = evidence.get("called_from")
            where = f", called from {', '.join(caller)}" if caller else ""
            found.append(
                _runtime("AMP004", site, facts, count, evidence, f"a new GradScaler was built {count} times here{where}; build it once per run")
            )

    # AMP005: clipping still-scaled gradients at an unflagged line.
    clips_by_line: dict = defaultdict(list)
    for clip in state.clips:
        if clip.still_scaled and clip.callsite is not None:
            clips_by_line[clip.callsite].append(clip)
    for site, clips in clips_by_line.items():
        if _claimed(claimed, "AMP005", site, facts):
            continue
        evidence = _clip_evidence(clips, facts)
        callers = sorted(filter(None, {facts.where(caller) for caller in facts.direct_callers.get(site, ())}))
        if callers:  # a clip in a helper: the lines that called it, where the unscale_ belongs (not their callers)
            evidence["called_from"] = callers
        found.append(
            _runtime(
                "AMP005", site, facts, len(clips), evidence,
                "gradients were clipped while still multiplied by the GradScaler scale"
                + (f" (here, called from {', '.join(callers)})" if callers else "")
                + "; call scaler.unscale_(optimizer) first",
            )
        )

    # AMP005: `.grad` read while still scaled at an unflagged line (a grad-norm logger in a
    # callback or a callable object the static pass cannot follow).
    for site, reads in facts.state.grad_reads.items():
        if not reads or _claimed(claimed, "AMP005", site, facts):
            continue
        evidence = {"reads": len(reads), "first_step": reads[0]["step"], "scale": _value(facts, reads[0]["scale_slot"])}
        callers = sorted(filter(None, {facts.where(r["called_from"]) for r in reads}))
        if callers:
            evidence["called_from"] = callers
        found.append(
            _runtime(
                "AMP005", site, facts, len(reads), evidence,
                "gradients were read while still multiplied by the GradScaler scale (a norm, a maximum or an inf check "
                "sees the scaled values)"
                + (f" (here, called from {', '.join(callers)})" if callers else "")
                + "; call scaler.unscale_(optimizer) before it",
            )
        )

    # AMP002: a converted module ran forward under autocast with low-precision parameters, in a
    # run that trains (the rule's scope: fully low-precision inference is not flagged).
    trained = _run_trained(state)
    for conversion in state.conversions:
        if conversion.forwards_under_autocast and conversion.callsite and not _claimed(claimed, "AMP002", conversion.callsite, facts):
            if not trained:
                _note_untrained_conversion(state, conversion, facts)
                continue
            evidence = {
                "module": conversion.module,
                "converted_to": conversion.dtype,
                "parameter_dtype": conversion.param_dtype,
                "autocast": {"device": conversion.autocast[0], "dtype": conversion.autocast[1]},
                "forwards_under_autocast": conversion.forwards_under_autocast,
            }
            found.append(
                _runtime("AMP002", conversion.callsite, facts, conversion.forwards_under_autocast, evidence, f"{conversion.module} was converted to {conversion.dtype} and then ran under autocast")
            )

    # AMP001: deprecation warnings attributed to unflagged user lines.
    for warning in state.warnings.values():
        api = deprecated_api_of(warning.message)
        if api and not _claimed(claimed, "AMP001", warning.callsite, facts):
            found.append(
                _runtime("AMP001", warning.callsite, facts, warning.count, {"api": [api], "message": warning.message, "warnings": warning.count}, f"{api} is deprecated")
            )

    # AMP006: optimizer.step() called directly while a scaled loss was in flight.
    for site, count in state.bypass_steps.items():
        if count and site is not None and not _claimed(claimed, "AMP006", site, facts):
            after_unscale = state.bypass_steps_after_unscale[site]
            evidence = _bypass_evidence(count, after_unscale)
            what = (
                "on gradients scaler.unscale_() had unscaled, so steps with inf/NaN gradients were applied, not skipped"
                if after_unscale == count
                else "on gradients still multiplied by the GradScaler scale"
            )
            found.append(_runtime("AMP006", site, facts, count, evidence, f"optimizer.step() ran {what}; use scaler.step(optimizer)"))

    # AMP007-AMP010, AMP012-AMP017: events at places no static finding joined.
    for code, events in facts.events.items():
        joined = claimed.get(code, ())
        for event in events:
            if not event.count or event.anchor is None or not event.runtime_only:
                continue
            if any(site.joins(event) for site in joined):
                continue
            found.append(_runtime(code, event.anchor, facts, event.count, event.evidence, event.message))

    return found
