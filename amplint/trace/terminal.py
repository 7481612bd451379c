"""The terminal summary (rich, on stderr so the script's stdout stays the script's)."""

from __future__ import annotations

import linecache
import os
import sys
from collections import defaultdict

from rich.console import Console
from rich.table import Table
from rich.text import Text

from amplint.trace.report import CHEAP_COVERAGE_NOTE_START, SCALED_LOSS, found_in, needed_missing, never_applied, none_seen, skipped_by_scaler

STATUS_STYLE = {"confirmed": "bold red", "refuted": "green", "not-reached": "yellow"}
MAX_OP_LINES = 30
MAX_OPS_PER_LINE = 8
_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int64": "i64", "int32": "i32", "bool": "bool"}


def _short(dtypes: list[str]) -> str:
    """`f32,bf16`; a run of one dtype over three long is counted (a foreach op's thirty tensors:
    `f32 x30`)."""
    runs = _runs([_SHORT.get(d, d) for d in dtypes])
    return ",".join(short if n == 1 else f"{short} x{n}" if n > 3 else ",".join([short] * n) for short, n in runs) or "-"


def _runs(values: list) -> list[list]:
    """[value, how many times in a row] for each run of equal values."""
    runs: list[list] = []
    for value in values:
        if runs and runs[-1][0] == value:
            runs[-1][1] += 1
        else:
            runs.append([value, 1])
    return runs


def _evidence_text(finding: dict) -> str:
    ev = finding.get("evidence") or {}
    code = finding["code"]
    if finding["status"] == "not-reached":
        return ev.get("note", "the line never ran")  # a note: it ran, but not the case the finding is about
    if code == "AMP003":
        if finding["count"]:
            ac = ev.get("autocast") or {}
            where = f", autocast entered at {ev['autocast_entered_at']}" if ev.get("autocast_entered_at") else ""
            calls = f"{ev['call']} call(s)" if ev.get("call") else "call(s)"
            return f"{finding['count']} {calls} with autocast({ac.get('device')}, {ac.get('dtype')}) on{where}"
        return f"{ev.get('calls', 0)} call(s), autocast off each time"
    if code == "AMP004":
        return (
            f"{ev.get('constructions', 0)} scaler(s) built here, at most {ev.get('max_steps_per_scaler', 0)} step(s) each, "
            f"{ev.get('steps_skipped', 0)}/{ev.get('steps', 0)} steps skipped"
        )
    if code == "AMP005":
        # A finding on a `.grad` read is judged by the reads (`executions`), not by clips.
        what, when = ("read(s) of", "read") if "executions" in ev or "reads" in ev else ("clip(s) on", "clipped")
        if finding["count"]:
            scale = ev.get("scale")
            extra = f" (scale {scale:g})" if isinstance(scale, (int, float)) else ""
            if "total_norm_unscaled" in ev:
                at = f" at step {ev['norm_step']} (scale {ev['norm_scale']:g})" if "norm_step" in ev else ""
                extra += f"; norm {ev['total_norm_seen']:.4g} seen{at}, {ev['total_norm_unscaled']:.4g} unscaled"
            return f"{finding['count']} {what} still-scaled gradients{extra}"
        return f"gradients were unscaled (or no enabled scaler) when {when}"
    if code == "AMP002":
        if finding["count"]:
            ac = ev.get("autocast") or {}
            return (
                f"{ev.get('module')} with {ev.get('parameter_dtype')} parameters ran forward {finding['count']}x "
                f"under autocast({ac.get('device')}, {ac.get('dtype')})"
            )
        if ev.get("forwards_frozen"):
            return f"converted module ran forward {ev['forwards_frozen']}x under autocast, frozen or with gradients off"
        return "converted module never ran forward under autocast"
    if code == "AMP001":
        if finding["count"]:
            return f"{finding['count']} deprecation warning(s): {', '.join(ev.get('api', []))}"
        return "no deprecation warning raised here"
    if code == "AMP006":
        after_unscale = ev.get("after_unscale", 0)
        if after_unscale:
            return f"{finding['count']} optimizer step(s) past the scaler, {after_unscale} after unscale_(): inf/NaN steps applied, not skipped"
        return f"{finding['count']} optimizer step(s) on scaled gradients"
    if code == "AMP011":
        return f"{finding['count']} scheduler step(s) right after a skipped step"
    return _evidence_text_amp007_017(code, finding["count"], ev)


def _evidence_text_amp007_017(code: str, count: int, ev: dict) -> str:
    kind = ev.get("kind")
    if code == "AMP007":
        if not count:
            return "step() and update() paired correctly"
        text = {
            "missing-update": f"{count} step(s) with no update() before the next step",
            "update-without-step": f"{count} update() call(s) with no step since the last",
            "update-between-optimizers": f"{count} update() call(s) between the steps of {ev.get('optimizers')} optimizers",
        }.get(kind, f"{count} pairing error(s)")
        return text + ("; torch then raised" if ev.get("torch_raised") else "")
    if code == "AMP008":
        if not count:
            return "unscale_ once per step"
        if kind == "unscale-twice":
            return f"unscale_ again after {ev.get('micro_batches_between')} micro-batch(es)" + ("; torch then raised" if ev.get("torch_raised") else "")
        return f"{count} unscale_ call(s) with no step before update()"
    if code == "AMP009":
        if not count:
            if ev.get("hand_scale") is not None:
                return f"every float16 loss was scaled by hand (x{ev['hand_scale']:g} before backward), not by a GradScaler"
            return "every float16 loss was scaled"  # refuted only once a backward took a loss from the region
        text = f"{count} backward() on unscaled float16 loss(es)"
        if ev.get("disabled_scaler"):
            text += f"; the scaler at {ev['disabled_scaler']['built_at']} is disabled ({ev['disabled_scaler']['why']})"
        if "subnormal_grad_fraction" in ev:
            text += f"; grads: {100 * ev['subnormal_grad_fraction']:.1f}% of non-zero ones below float16's normal range"
        return text
    if code == "AMP010":
        if not count:
            by_dtype = ev.get("scaled_losses_by_autocast_dtype") or {}
            dtypes = ", ".join(f"{k}: {v}" for k, v in by_dtype.items()) or "none"
            own = ev.get("steps_skipped_by_the_scale", 0)
            if not ev.get("scaler_enabled"):
                return f"the scaler is off; scaled losses {dtypes}"
            if set(by_dtype) == {"bfloat16"} and ev.get("steps_skipped", 0) > own:
                return (
                    f"{ev['steps_skipped'] - own} step(s) skipped on inf/NaN gradients, which bfloat16 has at any scale: "
                    f"the scaler's inf check guarded the weights, not its scale; scaled losses {dtypes}"
                )
            return f"losses not all from bfloat16 autocast: scaled losses {dtypes}"
        skips = f"{ev['steps_skipped_by_the_scale']} skip(s) made by the scale itself" if ev.get("steps_skipped_by_the_scale") else "no skip"
        return f"{count} scale() calls, all from bfloat16, {skips}; {1000 * ev.get('scaler_seconds', 0):.1f} ms in the scaler"
    if code == "AMP012":
        return f"{ev.get('missing_scaler_state', 0)}/{ev.get('saves', 0)} save(s) with optimizer state and no scaler state"
    if code == "AMP013":
        if kind:
            return f"{count} forward(s) under autocast with custom_fwd, backward outside it"
        calls = ev.get("calls_under_autocast", 0)
        if not count:
            return f"{calls} call(s) under autocast, none mixing float32 with float16/bfloat16 inputs"
        return f"{count}/{calls} call(s) under autocast got {', '.join(ev.get('input_dtypes', []))} together"
    if code == "AMP014":
        return f"{count} op call(s) got float16/bfloat16 inputs with autocast disabled" if count else "inputs were float32"
    if code == "AMP015":
        return f"{ev.get('fp32_matmuls', 0)} float32 matmul(s) in {ev.get('workers_with_fp32_matmuls', 0)}/{ev.get('workers', 0)} worker(s)"
    if code == "AMP016":
        if kind == "dtype-disabled":
            return f"autocast disabled itself for {ev.get('dtype')} ({count}x)"
        return ev.get("error", "") if count else "autocast dtype accepted"
    if code == "AMP017":
        if not count:
            return f"{ev.get('calls_under_autocast', 0)} compiled call(s) under autocast; backward_pass_autocast={ev.get('backward_pass_autocast')}"
        return f"{count} backward(s) outside autocast after compiled forward under autocast (backward_pass_autocast={ev.get('backward_pass_autocast')})"
    return ""


def _findings_table(report: dict) -> Table:
    table = Table(title="Findings", title_justify="left", expand=False)
    for column in ("code", "status", "count", "where", "source", "evidence"):
        table.add_column(column, overflow="fold")
    for f in report["findings"]:
        table.add_row(
            f["code"],
            Text(f["status"], style=STATUS_STYLE.get(f["status"], "")),
            str(f["count"]),
            f"{f['path']}:{f['line']}",
            f["source"],
            _evidence_text(f),
        )
    return table


def _ops_table(report: dict, cwd: str) -> Table | None:
    rows = report["ops"]
    if not rows:
        return None
    by_line: dict = defaultdict(list)
    for row in rows:
        by_line[(row["path"], row["line"])].append(row)
    table = Table(title="Op dtypes by source line (after autocast's casts)", title_justify="left")
    table.add_column("op", overflow="ellipsis", no_wrap=True, max_width=32)
    table.add_column("phase", no_wrap=True, min_width=3)
    table.add_column("autocast", no_wrap=True, min_width=8)
    table.add_column("in -> out", overflow="fold", min_width=14)
    table.add_column("count", no_wrap=True, justify="right")
    table.add_column("policy", overflow="fold")
    shown = 0
    for (path, line), group in by_line.items():
        if shown >= MAX_OP_LINES:
            break
        shown += 1
        absolute = path if os.path.isabs(path) else os.path.join(cwd, path)
        source = linecache.getline(absolute, line).strip()
        table.add_section()
        # The place folds (its line number must show however long the path); the source is cut.
        table.add_row(Text(f"{path}:{line}", style="bold", no_wrap=False, overflow="fold"), "", "", "", "", "")
        if source:
            table.add_row(Text(source, style="dim"), "", "", "", "", "")
        for row in sorted(group, key=op_interest)[:MAX_OPS_PER_LINE]:
            ac = row["autocast"]
            verdict = row.get("policy")
            mark = ""
            if verdict:
                mark = Text("ok", style="green") if verdict["matches"] else Text(f"expected {verdict['expected']}", style="bold red")
            if row.get("raised"):
                raised = row["raised"]
                mark = Text(raised if len(raised) <= 100 else raised[:99] + "…", style="bold red")
            name = row["op"].replace("aten::", "")
            if row.get("node"):
                name += f" ({row['node']})"
            table.add_row(
                "  " + name,
                {"forward": "fwd", "backward": "bwd"}.get(row["phase"], row["phase"]),
                f"{ac['device']}/{_SHORT.get(ac['dtype'], ac['dtype'])}" if ac else "-",
                f"{_short(row['input_dtypes'])} -> {'raised' if row.get('raised') else _short(row['output_dtypes'])}",
                str(row["count"]),
                mark,
            )
        if len(group) > MAX_OPS_PER_LINE:
            table.add_row(
                Text(f"  ... {len(group) - MAX_OPS_PER_LINE} more", style="dim"), "", "", Text("in the JSON report (--json FILE)", style="dim"), "", ""
            )
    if len(by_line) > MAX_OP_LINES:
        table.caption = f"{len(by_line) - MAX_OP_LINES} more source lines in the JSON report"
    return table


# Ops that move or make data rather than compute with it: autocast's own casts, copies, views,
# fills, random numbers. Shown after the compute ops of a line.
_BOOKKEEPING = frozenset({
    "_to_copy", "copy_", "clone", "contiguous", "detach", "alias", "lift_fresh", "view", "_unsafe_view", "reshape",
    "_reshape_alias", "as_strided", "expand", "t", "transpose", "permute", "unsqueeze", "squeeze", "split", "slice",
    "select", "cat", "stack", "empty", "empty_like", "zeros", "zeros_like", "ones", "ones_like", "full", "fill_",
    "zero_", "rand", "randn", "randint", "randperm", "bernoulli_", "normal_", "uniform_",
})
_LOW_PRECISION = ("float16", "bfloat16")


def op_interest(row: dict) -> tuple:
    """What an AMP user looks for first on a line: an op against the policy, then a compute op that
    ran in float32 in a float16/bfloat16 region, then the other compute ops, then casts, copies
    and random numbers; the most called first within each."""
    verdict = row.get("policy")
    bookkeeping = row["op"].replace("aten::", "").split(".")[0] in _BOOKKEEPING
    autocast = row.get("autocast")
    float32_in_region = bool(autocast) and autocast["dtype"] in _LOW_PRECISION and "float32" in row["output_dtypes"]
    if row.get("raised"):
        return -1, -row["count"]  # the call that failed: what the run died of, perhaps
    rank = 0 if verdict and not verdict["matches"] else 3 if bookkeeping else 1 if float32_in_region else 2
    return rank, -row["count"]


def construction_label(construction: dict) -> str:
    """`train.py:30`, `train.py:30#2` for the second scaler a line built side by side: the label
    the scaler timeline names it by."""
    nth = construction.get("nth_on_line", 1)
    return f"{construction['path']}:{construction['line']}" + (f"#{nth}" if nth > 1 else "")


def bypass_line(scaler: dict) -> str | None:
    """The plain optimizer steps made past the scaler, with their places (terminal and HTML)."""
    if not scaler.get("optimizer_steps_bypassing_scaler"):
        return None
    places = ", ".join(f"{b['path']}:{b['line']} x{b['count']}" for b in scaler.get("bypassed_at", []))
    return (
        f"{scaler['optimizer_steps_bypassing_scaler']} optimizer.step() call(s) bypassed the scaler "
        f"(applied as they were, never skipped on inf/NaN): {places}"
    )


def _scale_runs(history: list) -> str:
    """65536.0 x3, 32768.0 x1, ... (the scale after each update, run-length encoded)."""
    runs = _runs(history)
    text = ", ".join(f"{v:g}" + (f" x{n}" if n > 1 else "") for v, n in runs[:12])
    return text + (", ..." if len(runs) > 12 else "")


def split_cheap_coverage(report: dict) -> tuple[list[str], str | None]:
    """The report's notes, less the one saying what `--nan cheap` checked when it saw nothing:
    that one is shown where the non-finite values are, in place of "none seen"."""
    notes, coverage = [], None
    for note in report.get("notes", []):
        if note.startswith(CHEAP_COVERAGE_NOTE_START) and report.get("nonfinite") is None:
            coverage = note
        else:
            notes.append(note)
    return notes, coverage


def _attempted(scaler: dict) -> str:
    """"3 attempted", or "3 attempted (1 raised)": a call that raised is neither applied nor skipped."""
    raised = scaler.get("steps_raised", 0)
    return f"{scaler['steps_attempted']} attempted" + (f" ({raised} raised)" if raised else "")


def _per_op(kernels: list[dict]) -> list[str]:
    """One line per op and device, its dtypes together, with the first one's error: a probe that
    cannot run an op usually fails alike in every target dtype."""
    grouped: dict = {}
    for k in kernels:
        grouped.setdefault((k["op"], k["device"]), []).append(k)
    return [
        f"{op} {', '.join(k['dtype'] for k in entries)} on {device}: {entries[0].get('error')}"
        for (op, device), entries in grouped.items()
    ]


def _float32_only(kernel: dict) -> str:
    """Why a kernel missing in low precision is not needed by this run, and when it would be."""
    if kernel.get("custom"):
        # Autocast casts no custom op: it gets the dtypes it is given, inside a region too.
        return (
            "the run called it with float32 inputs only; autocast does not cast custom ops, so it gets "
            f"{kernel['dtype']} wherever its inputs are: keep the casts that feed it float32"
        )
    return "the run computed it in float32 only: autocast keeps it there, not needed unless the model is converted"


def _forward_overflow_skipped(report: dict, nf: dict) -> str:
    """Why a non-finite forward value whose step the GradScaler skipped is still unhandled."""
    skipped = {entry["step"] for entry in (report.get("scaler") or {}).get("timeline", ()) if not entry.get("applied")}
    if nf.get("phase") != "forward" or nf.get("step") not in skipped or nf.get("op") == SCALED_LOSS:
        return ""
    return (
        " - the GradScaler skipped this step, but the forward was already inf/NaN (an overflow, or an inf/NaN in the "
        "inputs or weights): no loss scale fixes that"
    )


def print_summary(report: dict, cwd: str, console: Console | None = None) -> None:
    if console is None:
        # Piped or redirected (a CI log, `2> trace.log`): give the tables room rather than cut them
        # at 80 columns; COLUMNS still wins.
        interactive = sys.stderr.isatty() if hasattr(sys.stderr, "isatty") else False
        wide = None if interactive or os.environ.get("COLUMNS") else 160
        console = Console(stderr=True, highlight=False, width=wide)
    env = report["environment"]
    exit_ = report["exit"]
    console.rule(f"amplint trace: {report['script']}")
    status = f"exit {exit_['code']} ({exit_['status']})" + (f": {exit_['exception']}" if exit_.get("exception") else "")
    console.print(f"{status}; torch {env['torch']} on {env['device']} ({env['backend']})")
    notes, cheap_coverage = split_cheap_coverage(report)
    for note in notes:
        console.print(Text(f"note: {note}", style="yellow"))

    if report["findings"]:
        console.print(_findings_table(report))
    else:
        console.print("Findings: none")
    if report.get("unchecked_findings"):
        reasons = sorted({f"{u['code']}: {u.get('reason', 'the rule has no runtime check')}" for u in report["unchecked_findings"]})
        console.print(
            Text(
                f"{len(report['unchecked_findings'])} static finding(s) this run cannot verify ({'; '.join(reasons)}) "
                f"are not given a status; see `amplint check`.",
                style="dim",
            )
        )

    ops = _ops_table(report, cwd)
    if ops is not None:
        label = report.get("autocast_policy_label")
        if label:
            console.print(Text(label, style="cyan"))
        console.print(ops)
    for dep in report.get("policy_departures", [])[:10]:
        console.print(
            Text(
                f"policy: {dep['op']} at {dep['path']}:{dep['line']} gave {','.join(dep['observed'])} under "
                f"{dep['device']} autocast({dep['autocast_dtype']}); the documented {dep['device']} policy says {dep['expected']} ({dep['category']})",
                style="magenta",
            )
        )

    scaler = report["scaler"]
    if scaler["constructions"] or scaler["steps_attempted"]:
        console.rule("GradScaler", align="left", style="dim")
        places = ", ".join(f"{construction_label(c)} x{c['count']}" + ("" if c.get("enabled") else " (disabled)") for c in scaler["constructions"])
        console.print(f"built at: {places or '-'}")
        console.print(
            f"steps: {_attempted(scaler)}, {scaler['steps_applied']} applied, "
            f"[bold]{scaler['steps_skipped']} skipped[/bold]; scheduler steps right after a skip: {scaler['scheduler_steps_after_skip']}"
            + (" (harmless for a scheduler stepped per epoch; AMP011 reports per-batch ones)" if scaler["scheduler_steps_after_skip"] else "")
        )
        if len(scaler["constructions"]) > 1:  # the run's one history would interleave their scales
            for c in scaler["constructions"]:
                console.print(
                    f"scaler built at {construction_label(c)}: {c['steps_attempted']} step(s), {c['steps_skipped']} skipped; "
                    f"scale after each update: {_scale_runs(c['scale_history']) or '-'}"
                )
        elif scaler["scale_history"]:
            console.print(f"scale after each update: {_scale_runs(scaler['scale_history'])}")
        bypassed = bypass_line(scaler)
        if bypassed:
            console.print(Text(bypassed, style="bold"))
        skipped = [t["step"] for t in scaler.get("timeline", []) if t["applied"] is False]
        if skipped:
            shown = ", ".join(map(str, skipped[:20])) + (" ..." if len(skipped) > 20 else "")
            console.print(f"skipped at steps: {shown}")
        for note in scaler.get("notes", []):
            console.print(Text(f"note: {note}", style="yellow"))

    nf = report["nonfinite"]
    console.rule("Non-finite values", align="left", style="dim")
    if cheap_coverage:
        console.print(Text(cheap_coverage, style="yellow"))
    elif nf is None:
        console.print(none_seen(report))
    else:
        handled = f" - {skipped_by_scaler(report)}" if nf.get("handled_by_scaler") else _forward_overflow_skipped(report, nf)
        node = found_in(nf)
        # Gradients are checked where they are used (the step), not where backward made them.
        where = (
            f"gradients made in {nf['phase']}, seen at {nf['path']}:{nf['line']}"
            if nf["op"] == "gradients"
            else f"{nf['op']}{node} at {nf['path']}:{nf['line']}, {nf['phase']}"
        )
        console.print(
            Text(
                f"first: {where}, step {nf['step']}" + (f", rank {nf['rank']}" if nf.get("rank") is not None else "") + f", {nf['dtype']}"
                + (", inputs finite" if nf.get("inputs_finite") else "")
                + handled,
                style="bold red" if not nf.get("handled_by_scaler") or never_applied(report) else "yellow",
            )
        )
        # A cheap find's rerun hint, or why this run's op check did not find it; an op find's cause.
        if nf.get("hint") or nf.get("detail"):
            console.print(Text(nf.get("hint") or nf["detail"], style="dim"))

    kernels = report.get("kernels") or []
    if kernels:
        console.rule("Kernel probe", align="left", style="dim")
        missing = [k for k in kernels if k.get("available") is False]
        ok = [k for k in kernels if k.get("available") is True]
        # Not known either way: the probe could not run the op here ("inconclusive"), or the
        # target device is absent ("unverified").
        inconclusive = [k for k in kernels if k.get("available") is None and k.get("status") == "inconclusive"]
        unverified = [k for k in kernels if k.get("available") is None and k.get("status") != "inconclusive"]
        console.print(
            f"{len(ok)} available, {len(missing)} missing, {len(inconclusive)} inconclusive, {len(unverified)} unverified"
        )
        needed = {id(k) for k in needed_missing(kernels)}
        for k in sorted(missing, key=lambda k: id(k) not in needed)[:20]:
            if id(k) in needed:
                console.print(Text(f"missing: {k['op']} {k['dtype']} on {k['device']}: {k['error']}", style="red"))
            else:
                console.print(Text(f"missing: {k['op']} {k['dtype']} on {k['device']}: {k['error']} ({_float32_only(k)})", style="yellow"))
        for line in _per_op(inconclusive)[:20]:
            console.print(Text(f"inconclusive: {line}", style="yellow"))
        if unverified:
            reason = unverified[0].get("error") or "target device absent"
            console.print(Text(f"unverified on {unverified[0]['device']}: {reason}", style="yellow"))
    sim = report.get("simulation")
    if sim:
        console.rule(f"Simulated {sim['device']} autocast (fake tensors)", align="left", style="dim")
        console.print(f"{len(sim['ops'])} op signature(s) simulated, {len(sim['not_simulated'])} not simulated")
        for diff in sim.get("differences", [])[:15]:
            console.print(
                f"{diff['path']}:{diff['line']} {diff['op']}: {diff['run_device']} ran {','.join(diff['run_output_dtypes'])}, "
                f"{sim['device']} would give {','.join(diff['simulated_output_dtypes'])}"
            )
        for miss in sim["not_simulated"][:10]:
            console.print(Text(f"not simulated: {miss['op']} at {miss['path']}:{miss['line']}: {miss['error']}", style="yellow"))
