"""A self-contained HTML page with the terminal summary's content and an inline SVG plot of the
loss scale (log2 axis) per step, skipped steps marked. No scripts, no external resources."""

from __future__ import annotations

import html
import linecache
import math
import os
from collections import defaultdict

from amplint.trace.report import found_in, never_applied, none_seen, skipped_by_scaler

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;max-width:1200px}
h1{font-size:20px}h2{font-size:16px;margin-top:1.6em;border-bottom:1px solid #ddd}h3{font-size:14px;margin:1em 0 .3em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}code,.mono{font-family:ui-monospace,monospace;font-size:12px}
.confirmed{color:#b00;font-weight:bold}.refuted{color:#070}.not-reached{color:#a60}
.src{background:#f8f8f8;font-weight:bold}.bad{color:#b00}.note{color:#a60}
"""


def _e(value) -> str:
    return html.escape("" if value is None else str(value))


def scale_plot(timeline: list[dict], width: int = 760, height: int = 220) -> str:
    """Loss scale after each step's update (log2 y axis); red crosses at skipped steps."""
    points = [(t["step"], t["scale"], t["applied"]) for t in timeline if t.get("scale")]
    skipped = [t["step"] for t in timeline if t.get("applied") is False]
    if not points and not skipped:
        return "<p>No GradScaler steps.</p>"
    left, right, top, bottom = 60, 20, 20, 35
    steps = [p[0] for p in points] + skipped
    x_min, x_max = min(steps), max(max(steps), min(steps) + 1)
    logs = [math.log2(p[1]) for p in points if p[1] > 0] or [0.0]
    y_min, y_max = math.floor(min(logs)) - 1, math.ceil(max(logs)) + 1

    def x(step: float) -> float:
        return left + (step - x_min) / (x_max - x_min) * (width - left - right)

    def y(log_value: float) -> float:
        return top + (y_max - log_value) / (y_max - y_min) * (height - top - bottom)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="loss scale per step">',
        f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{height - top - bottom}" fill="#fafafa" stroke="#ccc"/>',
    ]
    tick_every = max(1, (y_max - y_min) // 6)
    for value in range(int(y_min), int(y_max) + 1, int(tick_every)):
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(value):.1f}" y2="{y(value):.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{left - 6}" y="{y(value) + 4:.1f}" font-size="11" text-anchor="end">2^{value}</text>')
    for step in sorted({x_min, x_max, (x_min + x_max) // 2}):
        parts.append(f'<text x="{x(step):.1f}" y="{height - 12}" font-size="11" text-anchor="middle">{step}</text>')
    parts.append(f'<text x="{(left + width - right) / 2:.1f}" y="{height - 1}" font-size="11" text-anchor="middle">step</text>')
    if points:
        path = " ".join(f"{x(s):.1f},{y(math.log2(v)):.1f}" for s, v, _ in points if v > 0)
        parts.append(f'<polyline points="{path}" fill="none" stroke="#2a6" stroke-width="2"/>')
    for step in skipped:
        cx, cy = x(step), top + 8
        parts.append(
            f'<path d="M{cx - 4:.1f},{cy - 4:.1f} L{cx + 4:.1f},{cy + 4:.1f} M{cx - 4:.1f},{cy + 4:.1f} L{cx + 4:.1f},{cy - 4:.1f}" '
            f'stroke="#c00" stroke-width="2"><title>step {step} skipped</title></path>'
        )
    parts.append("</svg>")
    return "".join(parts)


def render(report: dict, cwd: str) -> str:
    from amplint.trace.terminal import _attempted, _evidence_text, bypass_line, construction_label, op_interest, split_cheap_coverage  # same wording as the terminal

    env, exit_ = report["environment"], report["exit"]
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>amplint trace: {_e(report['script'])}</title><style>{_CSS}</style></head><body>",
        f"<h1>amplint trace: <code>{_e(report['script'])}</code></h1>",
        f"<p>exit {_e(exit_['code'])} ({_e(exit_['status'])}){': ' + _e(exit_['exception']) if exit_.get('exception') else ''}; "
        f"torch {_e(env['torch'])}, Python {_e(env['python'])}, device {_e(env['device'])} ({_e(env['backend'])})"
        f"{', ' + _e(env['gpu']) if env.get('gpu') else ''}</p>",
    ]
    notes, cheap_coverage = split_cheap_coverage(report)
    for note in notes:
        out.append(f'<p class="note">note: {_e(note)}</p>')

    out.append("<h2>Findings</h2>")
    if report["findings"]:
        out.append("<table><tr><th>code</th><th>status</th><th>count</th><th>where</th><th>source</th><th>evidence</th><th>message</th></tr>")
        for f in report["findings"]:
            out.append(
                f"<tr><td>{_e(f['code'])}</td><td class=\"{_e(f['status'])}\">{_e(f['status'])}</td><td>{_e(f['count'])}</td>"
                f"<td class=\"mono\">{_e(f['path'])}:{_e(f['line'])}</td><td>{_e(f['source'])}</td>"
                f"<td>{_e(_evidence_text(f))}</td><td>{_e(f['message'])}</td></tr>"
            )
        out.append("</table>")
    else:
        out.append("<p>None.</p>")

    scaler = report["scaler"]
    out.append("<h2>GradScaler</h2>")
    places = ", ".join(f"{construction_label(c)} x{c['count']}" for c in scaler["constructions"]) or "-"
    out.append(
        f"<p>built at: <span class=\"mono\">{_e(places)}</span><br>steps: {_e(_attempted(scaler))}, "
        f"{scaler['steps_applied']} applied, <b>{scaler['steps_skipped']} skipped</b>; scheduler steps right after a "
        f"skip: {scaler['scheduler_steps_after_skip']}</p>"
    )
    bypassed = bypass_line(scaler)
    if bypassed:
        out.append(f'<p class="bad">{_e(bypassed)}</p>')
    for note in scaler.get("notes", []):
        out.append(f'<p class="note">note: {_e(note)}</p>')
    timeline = scaler.get("timeline", [])
    if len(scaler["constructions"]) > 1:  # one plot per scaler: each backs off on its own
        for c in scaler["constructions"]:
            label = construction_label(c)
            out.append(f'<h3>scaler built at <span class="mono">{_e(label)}</span></h3>')
            out.append(scale_plot([t for t in timeline if t.get("scaler") == label]))
    else:
        out.append(scale_plot(timeline))

    out.append("<h2>First non-finite value</h2>")
    nf = report["nonfinite"]
    if cheap_coverage:
        out.append(f'<p class="note">{_e(cheap_coverage)}</p>')
    elif nf is None:
        said = none_seen(report)
        out.append(f"<p>{_e(said[0].upper() + said[1:])}.</p>")
    else:
        handled = f" &mdash; {_e(skipped_by_scaler(report))}" if nf.get("handled_by_scaler") else ""
        out.append(
            f'<p class="{"note" if nf.get("handled_by_scaler") and not never_applied(report) else "bad"}"><code>{_e(nf["op"])}</code>'
            f"{_e(found_in(nf))} at <span class=\"mono\">{_e(nf['path'])}:{_e(nf['line'])}</span>, "
            f"{_e(nf['phase'])}, step {_e(nf['step'])}, {_e(nf['dtype'])}{handled}</p>"
        )
        # A cheap find's rerun hint, or why this run's op check did not find it; an op find's cause.
        if nf.get("hint") or nf.get("detail"):
            out.append(f"<p>{_e(nf.get('hint') or nf['detail'])}</p>")

    out.append("<h2>Op dtypes by source line (after autocast's casts)</h2>")
    if report.get("autocast_policy_label"):
        out.append(f'<p class="note">{_e(report["autocast_policy_label"])}</p>')
    by_line: dict = defaultdict(list)
    for row in report["ops"]:
        by_line[(row["path"], row["line"])].append(row)
    out.append("<table><tr><th>op</th><th>phase</th><th>autocast</th><th>inputs</th><th>outputs</th><th>count</th><th>policy</th></tr>")
    for (path, line), rows in by_line.items():
        absolute = path if os.path.isabs(path) else os.path.join(cwd, path)
        source = linecache.getline(absolute, line).strip()
        out.append(f'<tr class="src"><td colspan="7" class="mono">{_e(path)}:{_e(line)} &nbsp; {_e(source)}</td></tr>')
        for row in sorted(rows, key=op_interest):
            ac = row["autocast"]
            verdict = row.get("policy")
            mark = "" if not verdict else ("ok" if verdict["matches"] else f'<span class="bad">expected {_e(verdict["expected"])}</span>')
            if row.get("raised"):
                mark = f'<span class="bad">{_e(row["raised"])}</span>'
            outputs = "raised" if row.get("raised") else ", ".join(row["output_dtypes"])
            node = f" ({_e(row['node'])})" if row.get("node") else ""
            out.append(
                f"<tr><td class=\"mono\">{_e(row['op'])}{node}</td><td>{_e(row['phase'])}</td>"
                f"<td>{_e(ac['device'] + '/' + ac['dtype']) if ac else '-'}</td><td>{_e(', '.join(row['input_dtypes']))}</td>"
                f"<td>{_e(outputs)}</td><td>{_e(row['count'])}</td><td>{mark}</td></tr>"
            )
    out.append("</table>")

    if report.get("kernels"):
        out.append("<h2>Kernel probe</h2><table><tr><th>op</th><th>dtype</th><th>device</th><th>available</th><th>error</th></tr>")
        for k in report["kernels"]:
            state = {True: "yes", False: '<span class="bad">no</span>'}.get(k.get("available"), _e(k.get("status") or "unverified"))
            out.append(
                f"<tr><td class=\"mono\">{_e(k['op'])}</td><td>{_e(k['dtype'])}</td><td>{_e(k['device'])}</td><td>{state}</td><td>{_e(k.get('error'))}</td></tr>"
            )
        out.append("</table>")
    sim = report.get("simulation")
    if sim:
        out.append(f"<h2>Simulated {_e(sim['device'])} autocast (fake tensors)</h2>")
        out.append(f"<p>{len(sim['ops'])} op signature(s) simulated, {len(sim['not_simulated'])} not simulated.</p>")
        if sim.get("differences"):
            out.append("<table><tr><th>where</th><th>op</th><th>this run</th><th>simulated</th></tr>")
            for d in sim["differences"]:
                out.append(
                    f"<tr><td class=\"mono\">{_e(d['path'])}:{_e(d['line'])}</td><td>{_e(d['op'])}</td>"
                    f"<td>{_e(', '.join(d['run_output_dtypes']))}</td><td>{_e(', '.join(d['simulated_output_dtypes']))}</td></tr>"
                )
            out.append("</table>")
    out.append("</body></html>\n")
    return "\n".join(out)


def write_html(report: dict, path: str, cwd: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(render(report, cwd))
