"""One traced run, start to end: lint, instrument, run, resolve, confirm, report.

The report is written whatever way the script ends (return, exception, sys.exit, Ctrl-C, SIGTERM),
after what Python runs at the script's end (its traceback, its atexit handlers: see launcher.py),
and the script's exit status returned (or 1 under --strict when something was confirmed).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

from amplint.trace.launcher import RunOutcome, resolve_target, run_target, script_import_folder
from amplint.trace.options import TraceOptions

_ACTIVE_STATE = None  # the state a fork must switch off; os.register_at_fork cannot be undone


def _after_fork_in_child() -> None:
    # DataLoader workers (fork) inherit the mode and the patches: pass everything through there,
    # so the worker is not traced twice and pays (almost) nothing.
    if _ACTIVE_STATE is not None:
        _ACTIVE_STATE.stop_in_forked_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _flush_replaced_streams(ours: tuple) -> None:
    """Flush the streams the script put in place of ours (a "tee" logger), as Python's shutdown
    would at the end of a plain run: the tail of its log file is written."""
    for stream in (sys.stdout, sys.stderr):
        if stream in ours or getattr(stream, "closed", False):
            continue
        with contextlib.suppress(Exception):  # the script's own object; a plain run ignores this too
            stream.flush()


def _error(message: str) -> int:
    print(f"amplint trace: error: {message}", file=sys.stderr)
    return 2


def run_trace(options: TraceOptions) -> int:
    try:
        path, module_name = resolve_target(options.target, options.module, options.cwd)
    except LookupError as exc:
        return _error(str(exc))
    try:
        import torch  # noqa: F401 - the slow import, after validation
    except ImportError as exc:
        return _error(f"`amplint trace` needs PyTorch ({exc})")
    return TraceSession(options, path, module_name).run()


class TraceSession:
    def __init__(self, options: TraceOptions, path: str, module_name: str | None):
        self.options = options
        self.path = path
        self.module_name = module_name
        self.cwd = options.cwd
        self.notes: list[str] = []

    def display(self, filename: str) -> str:
        from amplint.trace.callsite import display_path

        return display_path(filename, self.cwd)

    # -- static side -------------------------------------------------------------------------
    def lint(self, filename: str) -> list:
        try:
            from amplint.static.api import lint_source

            with open(filename, "rb") as handle:
                source = handle.read()
            findings = lint_source(source, self.display(filename))
        except Exception as exc:  # noqa: BLE001 - the run's evidence is still worth reporting
            self._note(f"static checker unavailable ({type(exc).__name__}: {exc}); only runtime findings are reported")
            return []
        for unreadable in (f for f in findings if f.code == "AMP000"):
            self._note(f"the static checker cannot read {unreadable.path} (line {unreadable.line}: {unreadable.message}); it has no findings to confirm")
        return [f for f in findings if f.code != "AMP000"]

    def _note(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> int:
        global _ACTIVE_STATE
        import torch

        from amplint.trace.callsite import CodeClassifier
        from amplint.trace.nonfinite import NonFiniteMonitor
        from amplint.trace.probes import Probes
        from amplint.trace.recorder import DispatchRecorder
        from amplint.trace.state import TraceState

        options = self.options
        roots = list(dict.fromkeys([os.path.dirname(self.path), script_import_folder(self.path)]))
        roots += [self.cwd] if self.module_name else []
        classifier = CodeClassifier(roots)
        state = TraceState()
        state.classifier = classifier
        self.state, self.classifier = state, classifier

        script_findings = self.lint(self.path)
        monitor = NonFiniteMonitor(state, options.nan, options.nan_from_step)
        probes = Probes(state, classifier, monitor)
        self.probes, self.monitor = probes, monitor
        for finding in script_findings:
            if finding.code == "AMP005":
                for line in range(finding.line, (finding.end_line or finding.line) + 1):
                    state.watch[(self.path, line)] = probes.watch_scaled_gradient_use

        simulator = None
        if options.simulate:
            from amplint.trace.simulate import CudaSimulator

            simulator = CudaSimulator(state, classifier)

        need_mode = options.record_ops or options.nan == "op" or bool(options.probe_dtypes)
        recorder = DispatchRecorder(
            state,
            monitor,
            record=options.record_ops or bool(options.probe_dtypes),
            check_ops=options.nan == "op",
            keep_templates=bool(options.probe_dtypes),
        ) if need_mode else None

        _ACTIVE_STATE = state
        started = time.process_time()
        outcome: RunOutcome
        streams = sys.stdout, sys.stderr  # a script may replace (and close) them: ours are these
        try:
            probes.install()
            if options.nan == "module":
                probes.install_module_nan_hook()
            if simulator is not None:
                simulator.install(probes)
            argv0 = None if self.module_name else options.target
            if recorder is not None:
                with recorder:
                    outcome = run_target(self.path, self.module_name, options.args, argv0)
            else:
                outcome = run_target(self.path, self.module_name, options.args, argv0)
        finally:
            probes.remove()
            if simulator is not None:
                simulator.remove()
            _ACTIVE_STATE = None
        self.cpu_seconds = time.process_time() - started
        del torch

        unwritten = None
        try:
            report = self.build_report(outcome, script_findings, simulator)
            self.write(report)
        except KeyboardInterrupt:
            print("amplint trace: interrupted while writing the report", file=sys.stderr)
            return outcome.exit_code
        except OSError as exc:  # the script removed the report's folder, or it is not writable
            unwritten = f"cannot write the report: {exc.filename or ''}: {exc.strerror or exc}"
        _flush_replaced_streams(streams)
        sys.stdout, sys.stderr = streams
        if not options.quiet and self.prints_summary:
            from amplint.trace.terminal import print_summary

            print_summary(self.summary_report, self.cwd)
        if unwritten is not None:
            error_status = _error(unwritten)
            return outcome.exit_code or error_status  # the script's own failure comes first
        if options.strict and outcome.exit_code == 0:
            return 1 if self.strict_failure(report) else 0
        return outcome.exit_code

    # -- after the run ---------------------------------------------------------------------------
    def executed_project_files(self) -> list[str]:
        files = set()
        for module in list(sys.modules.values()):
            filename = getattr(module, "__file__", None)
            # some torch modules report a bare "_ops.py": only real absolute paths count
            if (
                isinstance(filename, str)
                and os.path.isabs(filename)
                and filename.endswith(".py")
                and os.path.isfile(filename)
                and self.classifier.is_project_file(filename)
            ):
                files.add(os.path.abspath(filename))
        for filename, _line in self.state.lines_seen:
            if os.path.isabs(filename) and os.path.isfile(filename) and self.classifier.is_project_file(filename):
                files.add(os.path.abspath(filename))
        files.discard(os.path.abspath(self.path))
        return sorted(files)

    def build_report(self, outcome: RunOutcome, script_findings: list, simulator) -> dict:
        import torch

        from amplint.trace import report as rpt
        from amplint.trace.confirm import Facts, confirm_findings

        state = self.state
        values = state.deferred.resolve()
        facts = Facts(state=state, values=values, display=self.display, callers=self.probes.callers)
        for step in state.scaler_steps:
            if step.applied is None and step.found_inf_slot is not None:
                found_inf = values[step.found_inf_slot]
                facts.applied[id(step)] = None if found_inf is None else found_inf == 0
            else:
                facts.applied[id(step)] = step.applied
        nonfinite = self.monitor.resolve(values)

        findings = list(script_findings)
        absolute_of = {self.display(self.path): self.path}
        for filename in self.executed_project_files():
            absolute_of[self.display(filename)] = filename
            findings.extend(self.lint(filename))
        confirmed, unchecked = confirm_findings(findings, absolute_of, facts)

        ops = rpt.op_rows(state, self.display)
        devices = {row["autocast"]["device"] for row in ops if row["autocast"]}
        used_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        device = "cuda" if used_cuda else "cpu"
        notes = list(self.notes) + state.notes
        autocast_disabled = [w for w in state.warnings.values() if "Disabling" in w.message and "autocast" in w.message.lower()]
        if autocast_disabled:
            w = autocast_disabled[0]
            cuda = "CUDA" in w.message and not self.options.simulate
            notes.append(
                f"autocast was disabled at {self.display(w.callsite[0])}:{w.callsite[1]} ({w.message.strip()}): "
                "that region ran in float32, and findings about it were judged on that run"
                + ("; `--simulate cuda` shows CUDA's dtypes for it" if cuda else "")
            )

        kernels: list = []
        if self.options.probe_dtypes:
            from amplint.trace.kernels import probe_kernels

            target = self.options.probe_device or device
            kernels = probe_kernels(state.op_templates, self.options.probe_dtypes, target)

        rank, world = rpt.rank_info()
        script = self.display(self.path) if self.module_name is None else self.module_name
        report = {
            "script": script,
            "argv": [script, *self.options.args],
            "exit": {"status": outcome.status, "code": outcome.exit_code, "exception": outcome.message if outcome.status == "exception" else None},
            "environment": rpt.environment(device),
            "findings": confirmed,
            "ops": ops,
            "scaler": rpt.scaler_section(state, facts, self.display),
            "nonfinite": rpt.nonfinite_section(nonfinite, self.display, state),
            "kernels": kernels,
            "nan_mode": self.options.nan,
            "policy_departures": rpt.policy_departures(ops),
            "autocast_policy_label": (
                "dtypes below follow the CPU autocast policy, which differs from CUDA's (see --simulate cuda)"
                if devices == {"cpu"}
                else None
            ),
            "unchecked_findings": unchecked,
            "traced_files": sorted({self.display(f) for f in absolute_of.values()}),
            "cpu_seconds": round(self.cpu_seconds, 3),
            "notes": notes,
            "rank": rank,
        }
        if simulator is not None:
            report["simulation"] = simulator.results(self.display, ops)
        return report

    def write(self, report: dict) -> None:
        from amplint.trace import report as rpt

        rank, world = report["rank"], rpt.rank_info()[1]
        self.summary_report = report
        self.prints_summary = True
        json_path = self.options.json_path
        if json_path is not None:
            json_path = os.path.join(self.cwd, json_path)
        if rank is None:
            if json_path:
                rpt.write_json(report, json_path)
            if self.options.html_path:
                from amplint.trace.html import write_html

                write_html(report, os.path.join(self.cwd, self.options.html_path), self.cwd)
            return
        # torchrun: every rank writes its own file; rank 0 waits for the others and merges.
        json_path = json_path or os.path.join(self.cwd, "amplint-trace.json")
        rpt.write_json(report, rpt.rank_path(json_path, rank))
        if rank != 0:
            self.prints_summary = False
            return
        reports = rpt.wait_for_ranks(json_path, world)
        merged = rpt.merge_reports(reports, world)
        rpt.write_json(merged, json_path)
        self.summary_report = merged
        if self.options.html_path:
            from amplint.trace.html import write_html

            write_html(merged, os.path.join(self.cwd, self.options.html_path), self.cwd)

    @staticmethod
    def strict_failure(report: dict) -> bool:
        nonfinite = report["nonfinite"]
        return (
            any(f["status"] == "confirmed" for f in report["findings"])
            or any(k.get("available") is False for k in report["kernels"])
            # An overflow the GradScaler handled (step skipped, scale backed off) is fp16 working
            # as designed, not a failure.
            or (nonfinite is not None and not nonfinite.get("handled_by_scaler"))
        )
