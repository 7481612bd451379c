"""The report: the guide's table per trial, the cases worth reviewing, and the JSON file.

The table has the guide's shape (SEED.md §4): criterion / reference / AMP trial / decision. Below it,
the cases that changed decision, turned non-finite or fell outside tolerance come first, then the
near ties (the cases a different numeric path could swap), then one line for the rest.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from amplint.compare.criteria import (
    FAILED_DECISIONS,
    FAILED_ERROR,
    FAILED_NONFINITE,
    FAILED_QUALITY,
    FAILED_TOLERANCE,
)

PASS = Text("pass", style="green")


def write_json(report: dict, path: str, stdout=None) -> None:
    """The report as JSON in `path`, or on `stdout` (default: sys.stdout) for "-"."""
    text = json.dumps(_json_safe(report), indent=2, allow_nan=False) + "\n"
    if path == "-":
        (stdout or sys.stdout).write(text)
        return
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _json_safe(value: Any) -> Any:
    """JSON has no inf/NaN: a non-finite number becomes null (its case says finite: false)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    return value


def make_console(file: TextIO | None = None) -> Console:
    stream = file or sys.stdout
    interactive = hasattr(stream, "isatty") and stream.isatty()
    # Piped or redirected output is read in logs and CI, not an 80-column terminal: give the tables room.
    return Console(file=stream, highlight=False, soft_wrap=False, width=None if interactive else 120)


def render(report: dict, console: Console, *, all_cases: bool = False) -> None:
    baseline = report["baseline"]
    for trial in report["trials"]:
        console.print()
        console.print(_trial_table(report, baseline, trial))
        cases = _cases_table(baseline, trial, all_cases=all_cases)
        if cases.row_count:
            console.print(cases)
        rest = _unremarkable_count(baseline, trial, all_cases)
        if rest:
            console.print(f"  {rest} other case(s): {_unremarkable_means(baseline)}", markup=False)
        if trial.get("note"):
            console.print(Text(f"  note: {trial['note']}", style="yellow"))
        for warning in trial.get("warnings", []):
            console.print(Text(f"  warning during the trial: {warning}", style="yellow"))
    console.print()
    console.print(summary_line(report))


def summary_line(report: dict) -> Text:
    trials = report["trials"]
    failed = [t for t in trials if not t["passed"]]
    # A verdict under criteria changed after the reference was kept must say so (SEED.md §4).
    changed = report["baseline"].get("criteria_changes")
    if not failed:
        if changed:
            return Text(
                f"All {len(trials)} trial(s) passed, but under criteria changed since the baseline was saved: "
                f"{'; '.join(changed)}.",
                style="bold yellow",
            )
        return Text(f"All {len(trials)} trial(s) passed the criteria fixed before the run.", style="bold green")
    names = ", ".join(f"{t['dtype']} ({', '.join(t['failed_criteria'])})" for t in failed)
    caveat = f" Criteria changed since the baseline was saved: {'; '.join(changed)}." if changed else ""
    return Text(f"{len(failed)} of {len(trials)} trial(s) failed: {names}. No gains are reported for a failed trial.{caveat}", style="bold red")


def _changed_positions(base, trial, path: tuple = ()) -> list[tuple[tuple, object, object]]:
    """Where two decisions of the same nested-list shape differ: (index path, fp32, trial)."""
    if isinstance(base, list) and isinstance(trial, list) and len(base) == len(trial):
        return [found for index, (b, t) in enumerate(zip(base, trial)) for found in _changed_positions(b, t, (*path, index))]
    return [] if base == trial or not path else [(path, base, trial)]


def _trial_table(report: dict, baseline: dict, trial: dict) -> Table:
    criteria = report["criteria"]
    verdict = Text("PASSED", style="bold green") if trial["passed"] else Text("FAILED", style="bold red")
    title = Text.assemble(f"{trial['dtype']} autocast trial on {report['device']}: ", verdict)
    table = Table(title=title, title_justify="left", show_lines=False)
    table.add_column("criterion")
    table.add_column("reference (float32)")
    table.add_column(f"AMP trial ({trial['dtype']})")
    table.add_column("decision")
    failed = set(trial["failed_criteria"])
    total = len(baseline["cases"])

    if FAILED_ERROR in failed:
        table.add_row("trial run", f"{total} cases ran", Text(trial["error"] or "", style="red"), _fail("the trial did not run"))
        return table

    finite = total - trial["nonfinite_cases"]
    with_inf = sum(not case["finite"] for case in baseline["cases"])  # a baseline with NaN never gets here
    table.add_row(
        "finite output",
        f"{total - with_inf}/{total} finite" + (f"; ±inf in {with_inf}, to be matched" if with_inf else ""),
        f"{finite}/{total} finite" + (" or matching" if with_inf else ""),
        _fail("reject unexplained non-finite") if FAILED_NONFINITE in failed else PASS,
    )
    table.add_row(
        "numeric gap",
        f"tolerance {_tolerance(criteria)}",
        f"max |diff| {_num(trial['max_abs_diff'], none=_no_gap(trial))}; {trial['out_of_tolerance_cases']} outside",
        _fail(f"more than {criteria['max_out_of_tolerance_cases']} outside the fixed tolerance")
        if FAILED_TOLERANCE in failed
        else PASS,
    )
    decisions = sum(case["decision_count"] for case in baseline["cases"])
    near = sum(case["near_tie"] for case in trial["cases"])
    if decisions:
        decided_cases = sum(case["decision_count"] > 0 for case in baseline["cases"])
        changed_cases = sum(case["decision_changed"] for case in trial["cases"])
        table.add_row(
            "application decision",
            f"{_in_cases(decisions, 'decision(s)', decided_cases)}; {_near_ties(baseline, near, criteria)}",
            f"{_in_cases(trial['decision_changes'], 'changed', changed_cases)} (allowed {criteria['max_decision_changes']})",
            _fail("review the changed decisions") if FAILED_DECISIONS in failed else PASS,
        )
    else:
        table.add_row(
            "application decision",
            "no case has a decision",
            "not compared",
            Text("define decide(output) to compare decisions", style="yellow"),
        )
    if baseline["quality"] is not None or trial["quality"] is not None:
        minimum = criteria["min_quality"]
        table.add_row(
            "quality on the fixed dataset",
            _num(baseline["quality"]),
            Text(
                _num(trial["quality"], none=trial.get("quality_error") or "not computable")
                + (f" (min {_num(minimum)})" if minimum is not None else "")
            ),
            (_fail("not a finite number" if trial["quality"] is None else "below the project threshold") if FAILED_QUALITY in failed else PASS),
        )
    if trial["passed"]:
        timing, memory = trial.get("timing"), trial.get("memory")
        if timing:
            table.add_row(
                "time per pass (median)",
                f"{timing['baseline_ms']:.3f} ms",
                f"{timing['trial_ms']:.3f} ms",
                _speedup(timing),
            )
        if memory:
            ratio = memory["trial_bytes"] / memory["baseline_bytes"] if memory["baseline_bytes"] else None
            table.add_row(
                "peak memory per pass",
                _bytes(memory["baseline_bytes"]),
                _bytes(memory["trial_bytes"]),
                f"{ratio:.2f}x of float32" if ratio is not None else "",
            )
        elif timing:
            table.add_row("peak memory per pass", "not measurable here", "not measurable here", "")
    return table


def _no_gap(trial: dict) -> str:
    """Why a trial has no largest gap: a non-finite one, or no case whose outputs compare."""
    return "non-finite" if trial["nonfinite_cases"] else "n/a (outputs differ in shape)"


def _in_cases(count: int, what: str, cases: int) -> str:
    """"14 changed in 12 cases": the cases are named only when they are not one decision each."""
    return f"{count} {what}" + (f" in {cases} case(s)" if cases != count else "")


def _near_ties(baseline: dict, near: int, criteria: dict) -> str:
    if not any(case["margin"] is not None for case in baseline["cases"]):
        return "near ties not judged: no margin (define margin(output))"
    return f"{near} case(s) near a tie (margin < {_num(criteria['near_tie_margin'])})"


def _unremarkable_means(baseline: dict) -> str:
    """What the cases left out of the table have in common, claiming nothing that was not compared."""
    parts = ["finite", "within tolerance"]
    if any(case["decision_count"] for case in baseline["cases"]):
        parts.append("decision unchanged")
    if any(case["margin"] is not None for case in baseline["cases"]):
        parts.append("no near tie")
    return ", ".join(parts)


def ordered_cases(baseline: dict, trial: dict) -> list[tuple[dict, dict]]:
    """Problems first (changed, non-finite, out of tolerance), then near ties, then the rest."""
    pairs = list(zip(baseline["cases"], trial["cases"]))

    def rank(pair: tuple[dict, dict]) -> int:
        _, case = pair
        if case["decision_changed"] or not case["finite"] or not case["within_tolerance"]:
            return 0
        return 1 if case["near_tie"] else 2

    return sorted(pairs, key=rank)  # stable: the spec's order within each group


def _cases_table(baseline: dict, trial: dict, *, all_cases: bool) -> Table:
    table = Table(title=f"cases ({trial['dtype']}), problems first", title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("case", overflow="fold")  # never truncated: the id is what a reviewer looks up
    table.add_column("finite")
    table.add_column("max |diff|")
    table.add_column("tolerance")
    table.add_column("worst element for its tolerance: fp32 → trial")
    table.add_column("decision: fp32 → trial")
    table.add_column("fp32 margin")
    for base, case in ordered_cases(baseline, trial):
        remarkable = case["decision_changed"] or not case["finite"] or not case["within_tolerance"] or case["near_tie"]
        if not remarkable and not all_cases:
            continue
        worst = case.get("worst")
        worst_text = ""
        if worst:
            index = "[" + ",".join(str(i) for i in worst["index"]) + "]" if worst["index"] else ""
            name = "" if worst["output"] == "output" else worst["output"]
            worst_text = f"{_num(worst['baseline'])} → {_num(worst['trial'])} at {name}{index}" if name or index else f"{_num(worst['baseline'])} → {_num(worst['trial'])}"
        worst_text = "; ".join(text for text in (worst_text, case.get("note")) if text)
        decision = Text(f"{_short(base['decision'])} → {_short(case['decision'])}")
        if case["decision_changed"]:
            units = base["decision_count"]
            decision.append(f"  CHANGED ({case['decisions_changed']} of {units} decisions)" if units > 1 else "  CHANGED", style="bold red")
            changed = _changed_positions(base["decision"], case["decision"])
            if changed and units > 1:  # a long list is cut short above: say which entries changed
                shown = ", ".join(f"[{','.join(map(str, path))}] {_short(b)} → {_short(t)}" for path, b, t in changed[:3])
                decision.append(f": {shown}" + (" ..." if len(changed) > 3 else ""))
        margin = Text(_num(base["margin"]))
        if case["near_tie"]:
            margin.append("  near tie", style="yellow")
        table.add_row(
            Text(case["id"]),  # Text, not str: an id like "img[3]" is not rich markup
            Text("yes") if case["finite"] else Text("NO", style="bold red"),
            _gap(case["max_abs_diff"]),
            Text("within") if case["within_tolerance"] else Text("OUTSIDE", style="bold red"),
            Text(worst_text),
            decision,
            margin,
        )
    return table


def _unremarkable_count(baseline: dict, trial: dict, all_cases: bool) -> int:
    if all_cases:
        return 0
    return sum(
        1
        for case in trial["cases"]
        if not (case["decision_changed"] or not case["finite"] or not case["within_tolerance"] or case["near_tie"])
    )


def _speedup(timing: dict) -> str:
    speedup = timing["speedup"]
    if not speedup:
        return ""
    # Reported as measured: on CPUs without native bfloat16/float16 matmul AMP is often slower.
    word = "faster" if speedup >= 1 else "slower"
    count = timing.get("cpu_threads")
    threads = f", {count} CPU thread{'s' if count != 1 else ''}" if count else ""
    return f"{speedup:.3g}x: {word} ({timing['repeats']} timed passes{threads})"


def _fail(reason: str) -> Text:
    return Text(f"FAIL: {reason}", style="bold red")


def _tolerance(criteria: dict) -> str:
    def show(value) -> str:
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k}: {_num(v)}" for k, v in value.items()) + "}"
        return _num(value)

    return f"atol {show(criteria['atol'])}, rtol {show(criteria['rtol'])}"


def _num(value: Any, none: str = "n/a") -> str:
    if value is None:
        return none
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _gap(value: float | None) -> str:
    """One notation for the whole column, so 584 and 1.3e+03 do not sit side by side."""
    if value is None:
        return "n/a"
    return "0" if value == 0 else f"{value:.2e}"


def _short(value: Any, limit: int = 24) -> str:
    text = "none" if value is None else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{count} B"  # pragma: no cover
