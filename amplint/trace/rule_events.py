"""The runtime evidence of AMP007-AMP010 and AMP012-AMP017, as events a static finding joins with.

An event has the places it can be matched against (callsites, or a span of lines such as a class
body, and the user lines that were on the call stack above its callsites: `callers`), the place a
runtime-only finding is reported at (`anchor`), a count (0: the code ran and the problem did not
happen there, which refutes a finding, unless `unjudged` says what the rule judges did not run)
and its evidence. Built after the run from the records in `TraceState` (see probes.py and
amp_probes.py for what records them).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from amplint.trace.callsite import Callsite

# The end of every note on a finding the run could not judge.
NOT_RUN = "the case the finding is about did not run"


@dataclass
class RuleEvent:
    code: str
    anchor: Callsite | None
    count: int
    evidence: dict
    message: str
    sites: tuple = ()
    spans: tuple = ()  # (filename, first line, last line)
    runtime_only: bool = True  # may stand as a finding of its own where no static finding points
    # User lines on the call stack above `sites` when it happened: a problem seen inside a helper
    # (the `torch.save` of `save_checkpoint(...)`) joins the static finding at the helper's call.
    callers: tuple = ()
    # What the rule judges that did not run here (a backward that never came): the event then
    # refutes nothing, and this is the note of the `not-reached` finding it joins.
    unjudged: str | None = None
    # (what ran, where the region around it was entered) when it ran only inside autocast regions
    # the script left off: the note then names that region and the option that would turn it on.
    off_around: tuple[str, Callsite] | None = None


def _first(items):
    return next(iter(items), None)


def backward_calls(state) -> int:
    """The run's backward() and torch.autograd.grad calls, with autocast on or off."""
    return sum(sum(calls) for calls in state.backward_calls.values())


def _scaler_event_groups(records: list[dict]):
    """The scaler probes' events grouped by (kind, site): kind, site, the group, its first event
    and the evidence every such group carries."""
    groups: dict = defaultdict(list)
    for event in records:
        groups[(event["kind"], event["site"])].append(event)
    for (kind, site), group in groups.items():
        first = group[0]
        yield kind, site, group, first, {"kind": kind, "first_step": first["step"], "scaler_enabled": first["enabled"]}


def _note_torch_error(evidence: dict, group: list[dict]) -> None:
    """The error torch raised at the first of these events, when it raised one."""
    raised = _first(e["torch_raised"] for e in group if "torch_raised" in e)
    if raised:
        evidence["torch_raised"] = raised


def _amp007(facts) -> list[RuleEvent]:
    state = facts.state
    events: list[RuleEvent] = []
    for kind, site, group, first, evidence in _scaler_event_groups(state.pairing):
        if kind == "missing-update":
            evidence["steps_without_update"] = len(group)
            evidence["next_step_at"] = facts.where(first["again_at"])
            sites = tuple({s for e in group for s in e["sites"]} | {site})
            message = "scaler.step() ran again with no scaler.update() since the previous step; call update() once per iteration, after the last step()"
        else:
            evidence["updates_without_step"] = len(group)
            sites = (site,)
            message = "scaler.update() ran with no scaler.step() since the previous update()"
        _note_torch_error(evidence, group)
        if not first["enabled"]:
            message += " (the scaler was disabled in this run; enabled, torch raises here)"
        events.append(RuleEvent("AMP007", site, len(group), evidence, message, sites))

    # update() between the steps of several optimizers: an update after which the next window
    # steps other optimizers, before the scaler's first optimizer steps again (a new iteration),
    # with gradients scaled before that update (a window whose loss was scaled after it is a
    # round of its own: MONAI's DiNTS, a GAN's generator phase).
    for info in state.scalers:
        windows = info.windows
        first_optimizer = _first(opts[0] for _site, opts, _rescaled in windows if opts)
        if first_optimizer is None:
            continue
        optimizers = {o for _site, opts, _rescaled in windows for o in opts}
        if len(optimizers) < 2:
            continue
        last_with_first = max(i for i, (_s, opts, _r) in enumerate(windows) if first_optimizer in opts)
        between: dict = defaultdict(int)
        for i in range(len(windows) - 1):
            site, opts, _rescaled = windows[i]
            _next_site, following, rescaled = windows[i + 1]
            # (the run's last window counts too: its update closed an iteration's second half)
            later = i + 1 < last_with_first or (i + 1 == len(windows) - 1 and last_with_first == i)
            if opts and following and first_optimizer not in following and later and not rescaled:
                between[site] += 1
        for site, count in between.items():
            evidence = {"kind": "update-between-optimizers", "updates_between_steps": count, "optimizers": len(optimizers), "scaler_enabled": info.enabled}
            events.append(
                RuleEvent("AMP007", site, count, evidence, f"scaler.update() ran between the steps of {len(optimizers)} optimizers {count} time(s); call it once per iteration, after the last scaler.step()", (site,))
            )
    return events


def _amp008(facts) -> list[RuleEvent]:
    events = []
    for kind, site, group, first, evidence in _scaler_event_groups(facts.state.unscales):
        if kind == "unscale-twice":
            evidence["unscale_again"] = len(group)
            evidence["again_at"] = facts.where(first["again_at"])
            evidence["micro_batches_between"] = first["scale_calls_between"]
            sites = tuple({site} | {e["again_at"] for e in group})
            message = f"scaler.unscale_() ran again for the same optimizer after {first['scale_calls_between']} more scaled micro-batch(es), before step()/update()"
        elif kind == "unscale-through-another-object":
            evidence["unscale_again"] = len(group)
            evidence["again_at"] = facts.where(first["again_at"])
            sites = tuple({site} | {e["again_at"] for e in group})
            message = (
                "the gradients scaler.unscale_() unscaled were unscaled again through another object holding the same "
                "parameters (an optimizer wrapper and the optimizer it holds), before update(): divided by the scale twice"
            )
        else:
            evidence["iterations_without_step"] = len(group)
            evidence["update_at"] = facts.where(first["update_at"])
            sites = (site,)
            message = "scaler.unscale_() ran on iterations where no scaler.step() followed before update()"
        _note_torch_error(evidence, group)
        events.append(RuleEvent("AMP008", site, len(group), evidence, message, sites))
    return events


def _amp009(facts) -> list[RuleEvent]:
    """One event per float16 region (where it was entered and where the autocast object was built:
    a `with ctx:` of a context kept in a variable, a decorated function's call), counting the
    unscaled backward() calls of the training steps it ran in; one whose losses were all scaled
    refutes a finding there."""
    events = []
    for record in facts.state.fp16_backwards.values():
        region = record["region"]
        evidence = {
            "backward_calls_unscaled": record["unscaled"],
            "backward_calls_scaled": record["scaled"],
            "backward_calls_scaled_by_hand": record["scaled_by_hand"],
            "autocast": {"device": region.device, "dtype": "float16"},
            "autocast_entered_at": facts.where(region.entered_at),
            "autocast_created_at": facts.where(region.created_at),
        }
        if record["unscaled"]:
            evidence["first_step"] = record["first_step"]
            evidence["backward_at"] = facts.where(record["backward_at"])
        if record["scaled_by_hand"]:
            evidence["hand_scale"] = record["hand_scale"]
            evidence["note"] = (
                f"backward() took the loss scaled by {record['hand_scale']:g} by hand: a constant loss scale lifts small "
                "gradients as a GradScaler does, but neither skips a step whose gradients overflowed to inf/NaN nor "
                "adapts the scale; a GradScaler does both"
            )
        for key in ("zero_grad_fraction", "subnormal_grad_fraction"):
            if key in record:
                evidence[key] = record[key]
        message = (
            f"backward() ({evidence.get('backward_at')}) ran {record['unscaled']} time(s) on a loss computed under this "
            "float16 autocast region with no GradScaler.scale()"
        )
        disabled = record.get("disabled_scaler")
        if disabled is not None:
            why = "built with enabled=False" if disabled.disabled_on_request else f"device {disabled.device!r} unavailable"
            evidence["disabled_scaler"] = {"built_at": facts.where(disabled.callsite), "device": disabled.device, "why": why}
            message = (
                f"backward() ({evidence.get('backward_at')}) ran {record['unscaled']} time(s) on a loss computed under this "
                f"float16 autocast region ({region.device}); the loss went through scale() of the GradScaler built at "
                f"{evidence['disabled_scaler']['built_at']}, which is disabled ({why}), so nothing was scaled"
                + (f": build it for the autocast's device, GradScaler({region.device!r})" if not disabled.disabled_on_request and region.device else "")
            )
        sites = tuple(site for site in (region.entered_at, region.created_at) if site)
        events.append(RuleEvent("AMP009", region.entered_at, record["unscaled"], evidence, message, sites))
    return events


def _amp010(facts) -> list[RuleEvent]:
    state = facts.state
    events = []
    for info in state.scalers:
        if info.callsite is None:
            continue
        steps = [s for s in state.scaler_steps if s.scaler == info.index]
        skipped = [s for s in steps if facts.applied.get(id(s)) is False]
        # A step skipped because the scale itself overflowed a finite loss: bfloat16 needed no scale there.
        by_the_scale = sum(1 for s in skipped if s.step in state.scale_overflow_steps)
        dtypes = {str(k): v for k, v in info.scale_dtypes.items()}
        evidence = {
            "scaler_enabled": info.enabled,
            "scale_calls": info.scale_calls,
            "scaled_losses_by_autocast_dtype": dtypes,
            "steps": len(steps),
            "steps_skipped": len(skipped),
            "steps_skipped_by_the_scale": by_the_scale,
        }
        wasted = info.enabled and info.scale_calls > 0 and set(info.scale_dtypes) == {"bfloat16"} and len(skipped) == by_the_scale
        if wasted:
            evidence["scaler_seconds"] = round(info.seconds, 6)
            evidence["scaler_ms_per_step"] = round(1000 * info.seconds / max(1, len(steps)), 4)
        count = info.scale_calls if wasted else 0
        skips = (
            f"its {by_the_scale} skipped step(s) were made by the scale itself (a finite loss times the scale overflowed)"
            if by_the_scale else "no step was skipped"
        )
        message = (
            f"every scaler.scale() of the run ({info.scale_calls}) came from bfloat16 autocast and {skips}: "
            f"the scaler cost {1000 * info.seconds:.2f} ms for nothing; build it with enabled=(dtype == torch.float16)"
        )
        events.append(RuleEvent("AMP010", info.callsite, count, evidence, message, (info.callsite,)))
    return events


def _amp012(facts) -> list[RuleEvent]:
    events = []
    for site, record in facts.state.saves.items():
        evidence = {k: v for k, v in record.items() if k not in ("site", "live_scaler")}
        if record.get("live_scaler"):
            evidence["live_scaler_built_at"] = facts.where(record["live_scaler"])
        count = record["missing_scaler_state"]
        unjudged = None
        if not count and not record["with_optimizer_state"]:
            unjudged = f"torch.save() ran here {record['saves']} time(s), never with an optimizer state in what it saved"
        elif not count and not record["with_scaler_state"] and not record.get("scaler_state_in_another_save"):
            unjudged = "torch.save() saved an optimizer state here while no enabled GradScaler was alive"
        message = "torch.save() wrote an optimizer state without the GradScaler's state while an enabled scaler was training; add scaler.state_dict()"
        events.append(RuleEvent("AMP012", site, count, evidence, message, (site,), unjudged=unjudged))
    return events


def _amp013(facts) -> list[RuleEvent]:
    state = facts.state
    backward_inside = sum(calls[0] for calls in state.backward_calls.values())
    backward_outside = sum(calls[1] for calls in state.backward_calls.values())
    events = []
    for record in state.custom_functions.values():
        if record is None:
            continue
        evidence: dict = {"class": record["class"], "calls_under_autocast": record["calls_under_autocast"]}
        spans = []
        if record.get("span"):
            spans.append(record["span"])
        unjudged = None
        if record["kind"] == "undecorated":
            count = record["mixed_calls"]
            evidence["mixed_dtype_calls"] = count
            if count:
                evidence["input_dtypes"] = record["input_dtypes"]
                device, dtype = record["autocast"]
                evidence["autocast"] = {"device": device, "dtype": dtype}
                evidence["first_step"] = record["first_step"]
            message = f"{record['class']}.forward (no custom_fwd) received {', '.join(record.get('input_dtypes', []))} tensors together under autocast {count} time(s)"
        else:
            evidence["kind"] = "custom_fwd-without-custom_bwd"
            device, dtype = record.get("autocast") or (None, None)  # the region forward ran in
            evidence["autocast"] = {"device": device, "dtype": dtype}
            # Its own backward's runs when they were watched, else any backward() of the run.
            runs = record.get("backward_runs", backward_calls(state))
            runs_on = record.get("backward_runs_under_autocast", backward_inside)
            runs_off = runs - runs_on if "backward_runs" in record else backward_outside
            if record.get("casts_inputs"):
                # Forward ran with autocast off: a backward outside autocast agrees with it.
                evidence["cast_inputs"] = True
                count = min(runs_on, record["calls_under_autocast"])
                message = (
                    f"{record['class']}.forward ran with autocast off (custom_fwd with cast_inputs) but backward has no "
                    f"custom_bwd: backward ran under autocast({device}, {dtype})"
                )
            else:
                count = min(runs_off, record["calls_under_autocast"])
                message = (
                    f"{record['class']}.forward ran under autocast({device}, {dtype}) with custom_fwd but backward has no "
                    "custom_bwd: backward ran with autocast off"
                )
            if "backward_runs" in record:
                evidence["backward_runs"], evidence["backward_runs_under_autocast"] = runs, runs_on
            if not runs:  # the run ended (or crashed) before that backward
                ran = (
                    f"{record['class']}.backward never ran after its forward"
                    if "backward_runs" in record
                    else f"no backward() ran after {record['class']}.forward"
                )
                unjudged = f"{ran} ran under autocast: the backward the finding is about did not run"
        off_around = None
        if not record["calls_under_autocast"]:  # applied only inside regions the script left off
            unjudged = f"{record['class']}.apply never ran under autocast in this run: {NOT_RUN}"
            off_around = (f"{record['class']}.apply", record["off_region"])
        sites = tuple(record["sites"]) + tuple(s for s in (record["defined_at"], record["forward_at"]) if s)
        evidence["called_at"] = sorted(filter(None, (facts.where(s) for s in record["sites"])))[:5]
        anchor = record["defined_at"] or record["forward_at"]
        events.append(RuleEvent("AMP013", anchor, count, evidence, message, sites, tuple(spans), unjudged=unjudged, off_around=off_around))
    return events


def _amp014(facts) -> list[RuleEvent]:
    groups: dict = defaultdict(list)
    for key, count in facts.state.disabled_region_ops.items():
        groups[key[0]].append((key, count))
    events = []
    for inner, rows in groups.items():
        total = sum(c for _k, c in rows)
        first = rows[0][0]
        ops = [
            {"op": key[2], "line": facts.where(key[1]), "input_dtypes": list(key[3]), "count": count}
            for key, count in sorted(rows, key=lambda r: -r[1])[:10]
        ]
        evidence = {
            "ops_with_low_precision_inputs": total,
            "ops": ops,
            "outer_autocast": {"device": first[6], "dtype": first[4]},
            "outer_entered_at": facts.where(first[5]),
        }
        low = sorted({dtype for key, _c in rows for dtype in key[3] if dtype in ("float16", "bfloat16")})
        message = f"ops in this autocast-disabled region received {' and '.join(low)} tensors made in the enclosing region ({total} op call(s)); cast them with .float() first"
        sites = (inner, *{key[1] for key, _c in rows})
        events.append(RuleEvent("AMP014", inner, total, evidence, message, sites))
    return events


def _amp015(facts) -> list[RuleEvent]:
    events = []
    for site, record in facts.state.threads.items():
        device, dtype = record["parent_autocast"]
        evidence = {
            "workers": record["workers"],
            "workers_with_fp32_matmuls": record["workers_with_fp32_matmuls"],
            "fp32_matmuls": record["fp32_matmuls"],
            "ops": dict(sorted(record["ops"].items())),
            "parent_autocast": {"device": device, "dtype": dtype},
        }
        if record.get("first_op_at"):
            evidence["first_op_at"] = facts.where(record["first_op_at"])
        count = record["workers_with_fp32_matmuls"]
        message = f"work started here while autocast ({dtype}) was on ran {record['fp32_matmuls']} matmul-class op(s) in float32 in its thread: autocast state is thread-local"
        events.append(RuleEvent("AMP015", site, count, evidence, message, (site, record["started_at"])))
    return events


def _amp016(facts) -> list[RuleEvent]:
    state = facts.state
    events = []
    for record in state.autocast_constructions.values():
        evidence = {"kind": record["kind"], "dtype": record["dtype"], "constructions": record["count"]}
        if record.get("device"):
            evidence["device"] = record["device"]
        if record.get("error"):
            evidence["error"] = record["error"]
            message = f"autocast raised: {record['error']}"
        else:
            message = f"autocast({record.get('device')!r}, dtype={record['dtype']}) disabled itself (unsupported dtype): the region ran without autocast"
        events.append(RuleEvent("AMP016", record["site"], record["count"], evidence, message, (record["site"],)))
    for site, record in state.bce_errors.items():
        evidence = {"kind": "bce-under-autocast", "errors": record["count"], "error": record["error"]}
        if record["autocast"]:
            evidence["autocast"] = {"device": record["autocast"][0], "dtype": record["autocast"][1]}
        events.append(RuleEvent("AMP016", site, record["count"], evidence, "binary_cross_entropy raised under autocast; use binary_cross_entropy_with_logits", (site,)))
    return events


def dynamo_made_graphs() -> bool:
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return True  # no way to tell: say nothing
    return bool(counters["stats"].get("unique_graphs"))


def _amp017(facts) -> list[RuleEvent]:
    backward_ran = backward_calls(facts.state) > 0
    events = []
    try:
        import torch._functorch.config as functorch_config

        mismatch_option = hasattr(functorch_config, "on_backward_autocast_mismatch")
        setting_now = getattr(functorch_config, "backward_pass_autocast", None)
    except ImportError:
        mismatch_option, setting_now = False, None
    for record in facts.state.compiled:
        if not record["calls"]:
            continue
        setting = record.get("setting", setting_now if isinstance(setting_now, str) else repr(setting_now))
        evidence = {
            "compiled_calls": record["calls"],
            "calls_under_autocast": record["calls_under_autocast"],
            "backwards_outside_autocast": record["mismatched_backwards"] + record["backwards_with_setting"],
            "backward_pass_autocast": setting,
            "on_backward_autocast_mismatch_available": mismatch_option,
        }
        if record.get("autocast"):
            evidence["autocast"] = {"device": record["autocast"][0], "dtype": record["autocast"][1]}
        if record.get("backward_at"):
            evidence["backward_at"] = facts.where(record["backward_at"])
        count = record["mismatched_backwards"]
        if record["backend"] == "eager":
            # Dynamo's "eager" backend runs its graphs with eager autograd: no AOTAutograd backward
            # graph exists to re-enter autocast, whatever backward_pass_autocast says.
            evidence["backend"] = "eager"
            evidence["note"] = 'backend="eager" compiles no backward graph: backward runs as in eager mode'
            count = 0
        elif not dynamo_made_graphs():
            evidence["note"] = (
                "torch.compile built no graph in this run (amplint's op recording makes Dynamo run the "
                "model eagerly): the mismatch is read from where forward and backward ran; rerun with "
                "--no-ops to run the compiled program"
            )
        message = (
            f"the compiled model ran under autocast and backward ran outside it {count} time(s) with "
            f'backward_pass_autocast="{setting}": the compiled backward re-enters autocast, unlike eager; '
            'set torch._functorch.config.backward_pass_autocast = "off" (after `import torch._functorch.config`)'
        )
        unjudged, off_around = None, None
        if not record["calls_under_autocast"]:  # its region left off by the script's flag, say, while another was on
            unjudged = f"the compiled model was never called under autocast in this run: {NOT_RUN}"
            if record["off_region"] is not None:
                off_around = ("the compiled model's calls", record["off_region"])
        elif not backward_ran:  # the run ended (or crashed) before any backward
            unjudged = "no backward() ran after the compiled calls under autocast: the backward the finding is about did not run"
        sites = (record["site"],) + ((record["backward_at"],) if record.get("backward_at") else ())
        events.append(RuleEvent("AMP017", record["site"], count, evidence, message, sites, unjudged=unjudged, off_around=off_around))
    return events


BUILDERS = {
    "AMP007": _amp007,
    "AMP008": _amp008,
    "AMP009": _amp009,
    "AMP010": _amp010,
    "AMP012": _amp012,
    "AMP013": _amp013,
    "AMP014": _amp014,
    "AMP015": _amp015,
    "AMP016": _amp016,
    "AMP017": _amp017,
}


def rule_events(facts) -> dict[str, list[RuleEvent]]:
    events = {code: build(facts) for code, build in BUILDERS.items()}
    for event in (e for built in events.values() for e in built):
        event.callers = tuple({caller for site in event.sites for caller in facts.callers.get(site, ())})
    return events
