"""The trace report: DESIGN.md's fixed JSON contract (extended, never broken), per-rank files under
torchrun, and the merged summary of all ranks.

Extensions beyond the contract (consumers may ignore them): `name`/`summary` on findings,
`node`/`policy` on ops, `policy_departures`, `scaler.timeline/enabled/notes/optimizer_steps/steps_raised`,
`scaler.constructions[].steps_attempted/steps_applied/steps_skipped/scale_history/device/init_scale`,
`nonfinite.check/handled_by_scaler/node/module/detail/hint`, `kernels[].status/signatures`,
`simulation`, `unchecked_findings`, `notes`, `rank`, `ranks`.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from bisect import bisect_right
from collections import defaultdict
from operator import attrgetter

from amplint.trace import policy


def _dtype(dtype) -> str:
    return str(dtype).replace("torch.", "")


def op_rows(state, display) -> list[dict]:
    rows = []
    for key, count in state.ops.items():
        op, in_dtypes, out_dtypes, autocast, phase, site, node = key
        name = op[: -len(".default")] if op.endswith(".default") else op
        inputs = [_dtype(d) for d in in_dtypes]
        outputs = [_dtype(d) for d in out_dtypes]
        autocast_json = None if autocast is None else {"device": autocast[0], "dtype": autocast[1]}
        row = {
            "op": name,
            "path": display(site[0]) if site else "<unknown>",
            "line": site[1] if site else 0,
            "count": count,
            "autocast": autocast_json,
            "input_dtypes": inputs,
            "output_dtypes": outputs,
            "phase": phase,
        }
        if node:
            row["node"] = node
        if key in state.raised_ops:
            row["raised"] = state.raised_ops[key]  # no outputs: the call failed
            rows.append(row)
            continue
        verdict = policy.check(name, autocast_json, inputs, outputs) if phase == "forward" else None
        if verdict:
            row["policy"] = verdict
        rows.append(row)
    rows.sort(key=lambda r: (r["path"], r["line"], r["phase"] != "forward", r["op"], -r["count"]))
    return rows


def needed_missing(kernels: list[dict]) -> list[dict]:
    """The missing kernels the script needs: in a run that computed in float16/bfloat16, those of
    the ops it ran in low precision; in a float32 run (asking whether it could switch), all."""
    missing = [k for k in kernels if k.get("available") is False]
    if any(k.get("ran_in_low_precision") for k in kernels):
        return [k for k in missing if k.get("ran_in_low_precision")]
    return missing


def policy_departures(rows: list[dict]) -> list[dict]:
    found = []
    for row in rows:
        verdict = row.get("policy")
        if verdict and not verdict["matches"]:
            found.append(
                {
                    "op": row["op"],
                    "path": row["path"],
                    "line": row["line"],
                    "device": verdict["device"],
                    "autocast_dtype": row["autocast"]["dtype"],
                    "category": verdict["category"],
                    "expected": verdict["expected"],
                    "observed": [d for d in row["output_dtypes"]],
                    "input_dtypes": row["input_dtypes"],
                    "count": row["count"],
                }
            )
    return found


def float64_in_regions(rows: list[dict]) -> str | None:
    """A note for the ops autocast lists for float16/bfloat16 that ran in float64 inside an
    enabled region: autocast casts only float32 tensors, so a float64 model or input
    (`torch.set_default_dtype(torch.float64)`, `model.double()`) keeps them in float64."""
    from amplint.trace.policy import category

    rows = [
        r for r in rows
        if r["autocast"] and r["autocast"]["dtype"] in ("float16", "bfloat16") and "float64" in r["input_dtypes"]
        and "float64" in r["output_dtypes"] and category(r["op"], r["autocast"]["device"]) == "lower_precision"
    ]
    if not rows:
        return None
    first = rows[0]
    return (
        f"{sum(r['count'] for r in rows)} call(s) of ops autocast runs in {first['autocast']['dtype']} got float64 inputs "
        f"and ran in float64 (first {first['op']} at {first['path']}:{first['line']}): autocast casts only float32 "
        "tensors, so a float64 model or input (`torch.set_default_dtype(torch.float64)`, `.double()`) computes in "
        "float64 under it"
    )


def _scaler_label(path: str, line: int, sibling: int) -> str:
    """`train.py:30`, or `train.py:30#2` for the second scaler that line built side by side."""
    return f"{path}:{line}" + (f"#{sibling + 1}" if sibling else "")


def scaler_section(state, facts, display) -> dict:
    values = facts.values
    applied_of = facts.applied

    def place(scaler) -> tuple:
        where = (display(scaler.callsite[0]), scaler.callsite[1]) if scaler.callsite else ("<unknown>", 0)
        return (*where, scaler.sibling)

    # One entry per construction line, with that line's own steps and scales: several scalers
    # (one per optimizer of a GAN) each back off on their own, and one history of all of them
    # would interleave their scales. Scalers built at one line one after another (one per epoch)
    # share its entry; those it builds side by side (`scaler_g, scaler_d = GradScaler(),
    # GradScaler()`) each have their own, numbered on the line (`nth_on_line`).
    constructions: dict = defaultdict(
        lambda: {"count": 0, "enabled": False, "steps_attempted": 0, "steps_applied": 0, "steps_skipped": 0, "scale_history": []}
    )
    place_of = {}
    for scaler in state.scalers:
        place_of[scaler.index] = key = place(scaler)
        entry = constructions[key]
        entry["count"] += 1
        entry["enabled"] = entry["enabled"] or scaler.enabled
        entry.setdefault("device", scaler.device)
        entry.setdefault("init_scale", scaler.init_scale)
    steps = state.scaler_steps
    for s in steps:
        entry = constructions[place_of[s.scaler]]
        entry["steps_attempted"] += 1
        entry["steps_applied"] += applied_of.get(id(s)) is True
        entry["steps_skipped"] += applied_of.get(id(s)) is False
    updates_of: dict = defaultdict(list)  # scaler index -> its updates, in call order
    for u in state.updates:
        updates_of[u.scaler].append(u)
        constructions[place_of[u.scaler]]["scale_history"].append(values[u.scale_slot])
    applied = sum(entry["steps_applied"] for entry in constructions.values())
    skipped = sum(entry["steps_skipped"] for entry in constructions.values())
    # Neither applied nor skipped, with no found_inf to read: the call raised before the optimizer ran.
    raised = [s for s in steps if s.applied is None and s.found_inf_slot is None]
    scale_history = [values[u.scale_slot] for u in state.updates]  # every scaler's, in call order
    after_skip = [s for s in state.scheduler_steps if s.after is not None and applied_of.get(id(s.after)) is False]

    def scale_after(step) -> float | None:
        """The scale after the same scaler's first update() that followed this step."""
        updates = updates_of[step.scaler]
        at = bisect_right(updates, step.step, key=attrgetter("step"))
        return values[updates[at].scale_slot] if at < len(updates) else None

    # One timeline entry per scaler.step, with its scaler's construction line.
    timeline = [
        {"step": s.step, "applied": applied_of.get(id(s)), "scale": scale_after(s), "scaler": _scaler_label(*place_of[s.scaler])}
        for s in steps
    ]
    notes = []
    on_request = [s for s in state.scalers if not s.enabled and s.disabled_on_request]
    unavailable = [s for s in state.scalers if not s.enabled and not s.disabled_on_request]
    if on_request and steps:
        notes.append(
            f"{len(on_request)} GradScaler(s) were built with enabled=False: scale() and step() passed "
            "through, gradients were not scaled"
        )
    if unavailable and steps:
        notes.append(
            f"{len(unavailable)} GradScaler(s) disabled themselves (device {unavailable[0].device!r} "
            "unavailable): scale() and step() did nothing, gradients were never scaled"
        )
    if raised:
        where = raised[0].callsite
        place = f" (first at {display(where[0])}:{where[1]}, step {raised[0].step})" if where else ""
        notes.append(
            f"{len(raised)} scaler.step() call(s) raised{place}: counted as attempted, neither applied nor skipped"
        )
    for (path, line, sibling), entry in sorted(constructions.items()):
        lowest = min((scale for scale in entry["scale_history"] if scale is not None), default=None)
        label = _scaler_label(path, line, sibling)
        if lowest is not None and lowest < min(1.0, entry["init_scale"] or 1.0) and entry["steps_skipped"]:
            # Below 1 the gradients held inf/NaN however small the scale: not float16's range,
            # which loss scaling is for, but a diverged learning rate or bad data.
            last = [s for s in steps if place_of[s.scaler] == (path, line, sibling)][-1]
            outcome = (
                "its gradients held inf/NaN at any scale, which loss scaling cannot fix, so the run stopped training"
                if applied_of.get(id(last)) is False
                else "on those steps its gradients held inf/NaN at any scale, which loss scaling cannot fix; the "
                "steps after the last skip applied"
            )
            notes.append(
                f"the GradScaler built at {label} skipped {entry['steps_skipped']} of {entry['steps_attempted']} "
                f"steps and its scale fell to {lowest:g}: {outcome} (look at the learning rate and the data; "
                "`--nan op` finds the first op)"
            )
        elif _skipped_every_step(entry):
            notes.append(f"{_never_applied_note(label, entry, lowest)} (`--nan op` finds the first op)")
    return {
        "constructions": [
            {"path": path, "line": line, **({"nth_on_line": sibling + 1} if (path, line, 1) in constructions else {}), **entry}
            for (path, line, sibling), entry in sorted(constructions.items())
        ],
        "steps_attempted": len(steps),
        "steps_applied": applied,
        "steps_skipped": skipped,
        "steps_raised": len(raised),
        "scale_history": scale_history,
        "scheduler_steps_after_skip": len(after_skip),
        "scheduler_steps": len(state.scheduler_steps),
        "optimizer_steps_without_scaler": sum(state.direct_steps.values()),
        # Of those, the ones on still-scaled gradients (AMP006): applied, but by scale x the step.
        "optimizer_steps_bypassing_scaler": sum(state.bypass_steps.values()),
        "bypassed_at": [
            {"path": display(site[0]), "line": site[1], "count": count} for site, count in state.bypass_steps.items() if site and count
        ],
        "enabled": any(s.enabled for s in state.scalers),
        "timeline": timeline,
        "notes": notes,
    }


# The note a `--nan cheap` run that saw no inf/NaN gets: what its checks looked at, which is not
# everything (an inference run, a script that stops on a NaN loss before backward()). The
# summaries show it in place of "none seen" and find it by this start.
CHEAP_COVERAGE_NOTE_START = "--nan cheap checked"


def _skipped_every_step(construction: dict) -> bool:
    return construction["steps_attempted"] > 0 and construction["steps_skipped"] == construction["steps_attempted"]


def _never_applied_note(label: str, construction: dict, lowest: float | None) -> str:
    return (
        f"the GradScaler built at {label} skipped all {construction['steps_attempted']} of its steps"
        + (f" (its scale fell to {lowest:g})" if lowest is not None else "")
        + ": the model was never updated in this run. A GradScaler skips steps while it calibrates its scale, each skip "
        "halving it; if a longer run applies none either, its gradients hold inf/NaN at any scale"
    )


def never_applied(report: dict) -> list[str]:
    """What `--strict` and the non-finite summary say of each GradScaler that skipped every step it
    was given: a run that never updated the model checked no training, whatever the cause."""
    scaler = report.get("scaler") or {}
    return [
        f"the GradScaler built at {_scaler_label(c['path'], c['line'], c.get('nth_on_line', 1) - 1)} applied none of its "
        f"{c['steps_attempted']} steps (each skipped for inf/NaN gradients): the model never trained"
        for c in scaler.get("constructions", [])
        if _skipped_every_step(c)
    ]


def skipped_by_scaler(report: dict) -> str:
    """How the summaries describe a non-finite value whose step the GradScaler skipped: handled,
    unless no step of the run was ever applied."""
    if never_applied(report):
        return "step skipped by the GradScaler, which applied none of its steps in this run"
    return "handled by GradScaler (step skipped)"


def cheap_coverage_note(losses: int, gradient_checks: int, children_untraced: bool = False) -> str:
    rerun = "`--nan module` or `--nan op` check every module's or op's output"
    if not losses and not gradient_checks and children_untraced:
        return (
            f"{CHEAP_COVERAGE_NOTE_START} nothing in this process: no loss reached backward() here, and the processes "
            f"the script started, where it may have trained, are not traced"
        )
    if not losses and not gradient_checks:
        return (
            f"{CHEAP_COVERAGE_NOTE_START} nothing: no loss reached backward() and no gradient an optimizer step or "
            f"zero_grad() (inference, a run that ended before its first backward(), or gradients taken with "
            f"torch.func.grad, which it does not check); {rerun}"
        )
    return (
        f"{CHEAP_COVERAGE_NOTE_START} the losses of {losses} backward() call(s) and the gradients in {gradient_checks} "
        f"check(s) (at optimizer steps, zero_grad() and later backward() calls) and saw no inf/NaN; it does not check "
        f"the forward pass, nor the parameters an optimizer step writes: `--nan module` checks every module's output, "
        f"`--nan op` every op's, the optimizer's updates included"
    )


# The op of a find made by the GradScaler's multiplication of a finite loss (nonfinite._scaled_from).
SCALED_LOSS = "scaler.scale"


def none_seen(report: dict) -> str:
    """What the summaries say when the checks found no non-finite value."""
    where = " in this process" if report.get("untraced_processes") else ""  # its children ran untraced
    checks = "checks off" if report.get("nan_mode") == "off" else f"--nan {report.get('nan_mode')}"
    return f"none seen{where} ({checks})"


def found_in(nonfinite: dict) -> str:
    """` [MulBackward0]`, ` [block2]`: the autograd node or the module instance of a find."""
    where = nonfinite.get("node") or nonfinite.get("module")
    return f" [{where}]" if where else ""


def nonfinite_section(item, display, state) -> dict | None:
    if item is None:
        return None
    out = {
        "op": item.op,
        "path": display(item.callsite[0]) if item.callsite else "<unknown>",
        "line": item.callsite[1] if item.callsite else 0,
        "phase": item.phase,
        "step": item.step,
        "dtype": item.dtype,
        "inputs_finite": item.inputs_finite,
        "check": item.check,
        "handled_by_scaler": item.handled_by_scaler,
        "handled_overflows": len(state.handled_overflow_steps),
    }
    if item.node:
        out["node"] = item.node
    if item.module:
        out["module"] = item.module
    if item.detail:
        out["detail"] = item.detail
    if item.check == "cheap" and item.rerun_from_step is not None:  # None: this run's op check already looked there
        out["hint"] = f"rerun with `--nan op --nan-from-step {item.rerun_from_step}` to find the op and line that produced it"
    return out


def environment(device: str) -> dict:
    import torch

    backend = "cpu"
    gpu = None
    if device == "cuda":
        backend = "rocm" if getattr(torch.version, "hip", None) else "cuda"
        try:
            gpu = torch.cuda.get_device_name()
        except Exception:  # noqa: BLE001 - informative only
            gpu = None
    return {
        "torch": torch.__version__.split("+")[0],
        "torch_build": torch.__version__,
        "python": platform.python_version(),
        "device": device,
        "backend": backend,
        "gpu": gpu,
    }


# -- files -----------------------------------------------------------------------------------------
def rank_info() -> tuple[int | None, int]:
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ["RANK"]) if "RANK" in os.environ else None
    except ValueError:
        return None, 1
    return (rank if world > 1 else None), world


def launch_token() -> str | None:
    """What the ranks of one torchrun launch on one machine share and the next launch does not:
    the launcher process that started them. A rank's file from an earlier run is not this run's.
    Ranks on several machines share no such process: any file there counts, as before."""
    try:
        single_machine = int(os.environ.get("LOCAL_WORLD_SIZE", "0")) == int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return None
    return str(os.getppid()) if single_machine else None


def rank_path(path: str, rank: int) -> str:
    stem, ext = os.path.splitext(path)
    return f"{stem}.rank{rank}{ext or '.json'}"


def strict_json(value):
    """The report with non-finite numbers as the strings "inf", "-inf" and "nan": JSON has no
    such numbers, and strict parsers (JavaScript's, jq --strict) refuse Python's `Infinity`."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(item) for item in value]
    return value


def write_json(report: dict, path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(strict_json(report), handle, indent=1, default=str, allow_nan=False)
            handle.write("\n")
        os.replace(tmp, path)  # readers (other ranks merging) never see half a file
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, path) from None  # name the report, not the temporary file


# How long rank 0 waits, once done, for the other ranks' reports.
RANK_WAIT_S = 60.0


def wait_for_ranks(path: str, world: int, launch: str | None, timeout_s: float = RANK_WAIT_S) -> list[dict]:
    """The reports of every rank of this launch (see `launch_token`), as they arrive."""
    deadline = time.monotonic() + timeout_s
    found: dict[int, dict] = {}
    while True:
        for rank in range(world):
            if rank in found:
                continue
            candidate = rank_path(path, rank)
            if os.path.exists(candidate):
                try:
                    with open(candidate, encoding="utf-8") as handle:
                        report = json.load(handle)
                except (OSError, ValueError):
                    continue
                if launch is None or report.get("launch") == launch:
                    found[rank] = report
        if len(found) == world or time.monotonic() > deadline:
            return [found[r] for r in sorted(found)]
        time.sleep(0.2)


def merge_reports(reports: list[dict], world: int) -> dict:
    """One report for all ranks: findings and ops summed per (code|op, place), scaler counts
    summed, the earliest non-finite op (by step, then rank); each rank's file stays the detail."""
    base = json.loads(json.dumps(reports[0]))
    findings: dict = {}
    order = {"confirmed": 2, "refuted": 1, "not-reached": 0}
    for report in reports:
        for f in report["findings"]:
            key = (f["code"], f["path"], f["line"], f["source"])
            merged = findings.get(key)
            if merged is None:
                merged = findings[key] = json.loads(json.dumps(f))
                merged["ranks"] = []
            else:
                merged["count"] += f["count"]  # how often the problem happened, on all ranks
                if order[f["status"]] > order[merged["status"]]:
                    merged["status"], merged["evidence"] = f["status"], f["evidence"]
            merged["ranks"].append(report.get("rank"))
    ops: dict = {}
    for report in reports:
        for op in report["ops"]:
            key = json.dumps({k: v for k, v in op.items() if k != "count"}, sort_keys=True)
            if key in ops:
                ops[key]["count"] += op["count"]
            else:
                ops[key] = dict(op)
    scaler = base["scaler"]
    summed = ("steps_attempted", "steps_applied", "steps_skipped", "steps_raised", "scheduler_steps_after_skip",
              "optimizer_steps_without_scaler", "optimizer_steps_bypassing_scaler")
    for field in summed:
        scaler[field] = sum(r["scaler"].get(field, 0) for r in reports)
    nonfinite = [dict(r["nonfinite"], rank=r.get("rank")) for r in reports if r.get("nonfinite")]
    # Within a step, a forward's value comes before the gradients it poisons on every rank through
    # the all-reduce: the rank where it began is the cause.
    phases = {"forward": 0, "backward": 1}
    nonfinite.sort(key=lambda n: (n.get("handled_by_scaler", False), n["step"], phases.get(n.get("phase"), 2), n["rank"] or 0))
    kernels: dict = {}
    for report in reports:
        for k in report["kernels"]:
            kernels.setdefault((k["op"], k["dtype"], k["device"]), k)
    missing = sorted(set(range(world)) - {r.get("rank") for r in reports})
    if missing:
        base["notes"] = [
            *base.get("notes", []),
            f"rank(s) {', '.join(map(str, missing))} of {world} wrote no report within {RANK_WAIT_S:g} s of rank 0's end "
            "(still running, or ended without one): their steps, findings and non-finite values are not in this merged report",
        ]
    base.update(
        {
            "findings": sorted(findings.values(), key=lambda f: (f["path"], f["line"], f["code"])),
            "ops": sorted(ops.values(), key=lambda r: (r["path"], r["line"], r["op"])),
            "scaler": scaler,
            "nonfinite": nonfinite[0] if nonfinite else None,
            "kernels": list(kernels.values()),
            "rank": None,
            "ranks": {
                "world_size": world,
                "reports": len(reports),
                "missing": missing,
                "exit": {str(r.get("rank")): r["exit"] for r in reports},
                "scale_history": {str(r.get("rank")): r["scaler"]["scale_history"] for r in reports},
            },
        }
    )
    return base
