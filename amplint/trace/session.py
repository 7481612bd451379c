"""One traced run, start to end: lint, run (instrumented from the script's own `import torch` on),
resolve, confirm, report.

The report is written whatever way the script ends (return, exception, sys.exit, Ctrl-C, SIGTERM),
after what Python runs at the script's end (its traceback, the wait for its threads, its atexit
handlers: see launcher.py),
and the script's exit status returned (or 1 under --strict when something was confirmed).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

from amplint.trace.children import ChildProcesses
from amplint.trace.launcher import RunOutcome, resolve_target, run_target
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
    session = TraceSession(options, path, module_name)
    status = session.run()
    # Python ends a script stopped by Ctrl-C by SIGINT itself, so that a shell loop over runs stops
    # too: the command line does the same once the report is written (a negative status says so).
    return -signal.SIGINT if session.interrupted else status


def _set_active_state(state) -> None:
    global _ACTIVE_STATE
    _ACTIVE_STATE = state


# What a script that tests its values stops with (`assert torch.isfinite(loss)`, `raise
# ValueError("loss is nan")`, numpy's FloatingPointError): an exit or an exception that may come
# from a value the cheap check does not watch. Ctrl-C, torchrun's SIGTERM, an I/O error or the
# GradScaler's own assertions (`No inf checks were recorded...`) say nothing about inf/NaN.
_NONFINITE_WORDS = re.compile(r"\b(?:nan|inf|infinity|infinite|(?:non-?)?finite|diverg\w*|overflow\w*|explod\w*)\b", re.IGNORECASE)
# torch.autograd.set_detect_anomaly(True) stopping a backward: "Function 'SqrtBackward0' returned nan values".
_ANOMALY = re.compile(r"Function '(\w+)' returned nan values")


def early_stop_note(outcome: RunOutcome, step: int) -> str | None:
    """The note for a run that `--nan cheap` saw no unhandled inf/NaN in and that stopped in a
    way a non-finite value can explain; `step`: the optimizer steps attempted when it stopped."""
    if outcome.status == "exit":
        if not outcome.code or outcome.code == 128 + signal.SIGTERM:
            return None
    elif outcome.status == "exception":
        exc = outcome.exception
        message = str(exc)
        anomaly = _ANOMALY.search(message)
        if anomaly:
            return (
                f"the run stopped on a NaN that anomaly mode found in the backward of {anomaly.group(1)}, where "
                f"--nan cheap does not look; rerun with `--nan op --nan-from-step {step}` to find the op and line that produced it"
            )
        if isinstance(exc, KeyboardInterrupt) or _raised_in_torch_amp(exc):
            return None
        if not (isinstance(exc, (AssertionError, FloatingPointError)) or _NONFINITE_WORDS.search(message)):
            return None
    else:
        return None
    stopped = f"the script exited with status {outcome.code}" if outcome.status == "exit" else "the run stopped on an exception"
    return (
        f"{stopped} and no unhandled inf/NaN was seen; if it stopped on a non-finite value: --nan cheap "
        "checks only the losses that reached backward() and the gradients at optimizer steps, so a value that went "
        "non-finite before that (a loss the script tests and stops on) is not seen; `--nan op` finds the first op "
        "that produced one"
    )


def _raised_in_torch_amp(exc: BaseException | None) -> bool:
    """Raised by torch's AMP code itself (a GradScaler used out of order): AMP007/AMP008 tell why."""
    tb = exc.__traceback__ if exc is not None else None
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}torch{os.sep}amp{os.sep}" in tb.tb_frame.f_code.co_filename


class TraceSession:
    def __init__(self, options: TraceOptions, path: str, module_name: str | None):
        self.options = options
        self.path = path
        self.module_name = module_name
        self.cwd = options.cwd
        self.interrupted = False  # the script was stopped by Ctrl-C
        self.notes: list[str] = []
        self._configurations: dict = {}  # folder -> amplint settings (config.discover's memo)
        self.classifier = None
        self.probes = None

    def display(self, filename: str) -> str:
        from amplint.trace.callsite import display_path

        return display_path(filename, self.cwd, self.classifier.project_roots if self.classifier else ())

    # -- static side -------------------------------------------------------------------------
    def lint(self, filename: str) -> list:
        """The static findings of one file, under the project's configuration as `amplint check`
        reads it: its rule selection, per-file ignores, `exclude` and oldest torch."""
        try:
            from amplint.static.api import lint_source

            settings, rules = self._rules_for(filename)
            if not rules:
                return []
            with open(filename, "rb") as handle:
                source = handle.read()
            findings = lint_source(source, self.display(filename), rules, settings.min_torch)
        except Exception as exc:  # noqa: BLE001 - the run's evidence is still worth reporting
            self._note(f"static checker unavailable ({type(exc).__name__}: {exc}); only runtime findings are reported")
            return []
        for unreadable in (f for f in findings if f.code == "AMP000"):
            self._note(f"the static checker cannot read {unreadable.path} (line {unreadable.line}: {unreadable.message}); it has no findings to confirm")
        return [f for f in findings if f.code != "AMP000"]

    def silenced(self, finding: dict) -> bool:
        """A runtime-only finding the project turned off as it turns off static ones: its rule
        not selected for the file, the file excluded, or a `# noqa` for the rule on its line."""
        from amplint.static.analyse import noqa_by_line
        from amplint.static.source import noqa_covers

        filename = os.path.join(self.cwd, finding["path"])
        if not os.path.isfile(filename):
            return False
        if finding["code"] not in self._rules_for(filename)[1]:
            return True
        try:
            with open(filename, encoding="utf-8", errors="replace") as handle:
                suppressed = noqa_by_line(handle.read())
        except OSError:
            return False
        line = finding["line"]
        return line in suppressed and noqa_covers(suppressed[line], finding["code"])

    def _rules_for(self, filename: str) -> tuple:
        """(settings, the rules on for the file) under the nearest configuration above it: none
        for a file it excludes. An unreadable configuration is noted, and the defaults used."""
        from amplint.config import ConfigError, Settings, discover, known_codes
        from amplint.static.discovery import Excluder

        try:
            settings = discover(Path(filename), self._configurations)
        except ConfigError as error:
            self._note(f"the project's amplint configuration cannot be used ({error}); its files are linted with every rule")
            settings = Settings()
        if Excluder(settings.exclude, settings.root).excludes(Path(filename)):
            return settings, frozenset()
        return settings, settings.codes_for(filename, known_codes())

    def _note(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> int:
        from amplint.trace.state import TraceState

        options = self.options
        self.state = TraceState()
        self.script_findings = self.lint(self.path)
        started = time.process_time()
        outcome: RunOutcome
        streams = sys.stdout, sys.stderr  # a script may replace (and close) them: ours are these
        argv0 = None if self.module_name else options.target
        # torch is imported by the script, not before it; the instrumentation goes in when it is
        # (see launcher._AfterFirstImport), and is removed (the stack closed) however the run ends.
        with contextlib.ExitStack() as self._installed, ChildProcesses(self):
            outcome = run_target(self.path, self.module_name, options.args, argv0, ("torch", self.instrument), options.strict)
        self.cpu_seconds = time.process_time() - started
        self.interrupted = isinstance(outcome.exception, KeyboardInterrupt)
        if self.probes is None:  # the script never imported torch, or its import failed
            # torch cannot be imported twice in one process once its first import failed part-way
            # (a bad TORCH_LOGS, warnings as errors, a module shadowed by the script's): a second
            # import after its C extension registered its types aborts the process.
            failed = "torch._C" in sys.modules
            if not failed:
                try:
                    import torch  # noqa: F401
                except ImportError as exc:
                    return outcome.exit_code or _error(f"`amplint trace` needs PyTorch ({exc})")
                except Exception:  # noqa: BLE001 - torch's own import may raise anything
                    failed = True
            if failed:
                _error("no report: the script's `import torch` failed (its traceback is above), so nothing could be traced")
                return outcome.exit_code or 2
            self.build_instruments()
            self._note("the script did not import torch in this process: nothing was traced")

        unwritten = None
        try:
            report = self.build_report(outcome, self.script_findings, self.simulator)
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
        # Under torchrun only rank 0 judges, on the merged report: another rank exiting 1 here
        # would make torchrun stop the ranks still running.
        if options.strict and outcome.exit_code == 0 and self.prints_summary:
            reasons = self.strict_failures(self.summary_report)
            if reasons:
                print(f"amplint trace: --strict: exit 1: {'; '.join(reasons)}", file=sys.stderr)
                return 1
        return outcome.exit_code

    def build_instruments(self) -> None:
        """The classifier, probes, monitor, simulator and op recorder of the run (they need torch)."""
        from amplint.trace.callsite import CodeClassifier, project_roots
        from amplint.trace.nonfinite import NonFiniteMonitor
        from amplint.trace.probes import Probes
        from amplint.trace.recorder import DispatchRecorder

        options, state = self.options, self.state
        self.classifier = state.classifier = CodeClassifier(project_roots(self.path, self.cwd, self.module_name is not None))
        self.monitor = NonFiniteMonitor(state, options.nan, options.nan_from_step)
        self.probes = Probes(state, self.classifier, self.monitor)
        for finding in self.script_findings:
            if finding.code == "AMP005":
                for line in range(finding.line, (finding.end_line or finding.line) + 1):
                    state.watch[(self.path, line)] = self.probes.watch_scaled_gradient_use

        self.simulator = None
        state.simulating = bool(options.simulate)
        if options.simulate:
            from amplint.trace.simulate import CudaSimulator

            self.simulator = CudaSimulator(state, self.classifier)

        need_mode = options.record_ops or options.nan == "op" or bool(options.probe_dtypes)
        self.recorder = DispatchRecorder(
            state,
            self.monitor,
            record=options.record_ops or bool(options.probe_dtypes),
            check_ops=options.nan == "op",
            keep_templates=bool(options.probe_dtypes),
        ) if need_mode else None

    def instrument(self) -> None:
        """Build and install the instrumentation, the moment the script's `import torch` has
        loaded torch. The probes patch torch for every thread; the op recorder and the CUDA
        simulator are modes, which hold for the thread that enters them: the script's thread."""
        installed = self._installed
        self.build_instruments()
        _set_active_state(self.state)
        installed.callback(_set_active_state, None)
        installed.callback(self.probes.remove)
        self.probes.install()
        if self.options.nan == "module":
            self.probes.install_module_nan_hook()
        has_modes = self.simulator is not None or self.recorder is not None
        if has_modes and threading.current_thread() is not self.state.script_thread:
            self._note(
                f"torch was first imported by the thread {threading.current_thread().name!r}, not by the script's main "
                "thread: the per-op recording (op dtypes, --nan op, --simulate) had to stay off"
            )
            self.simulator = self.recorder = None
            return
        if self.simulator is not None:
            installed.callback(self.simulator.remove)
            self.simulator.install(self.probes)
        if self.recorder is not None:
            installed.enter_context(self.recorder)
        self.state.dispatch_modes_on = has_modes

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
        facts = Facts(
            state=state, values=values, display=self.display, callers=self.probes.callers, direct_callers=self.probes.direct_callers, ops_recorded=self.options.record_ops
        )
        for step in state.scaler_steps:
            if step.applied is None and step.found_inf_slot is not None:
                found_inf = values[step.found_inf_slot]
                facts.applied[id(step)] = None if found_inf is None else found_inf == 0
            else:
                facts.applied[id(step)] = step.applied
        nonfinite = self.monitor.resolve(values)
        if self.options.args[:1] == ["--"] and outcome.status == "exit" and outcome.code == 2:
            # `amplint trace train.py -- --lr 3e-4`, as uv and cargo take arguments: argparse refuses the `--`.
            self._note(
                "the script exited 2 (argparse's usage error?) with `--` as its first argument: amplint passes "
                "everything after SCRIPT unchanged, as `python train.py ...` does; drop the `--`, or put it before SCRIPT"
            )
        if self.options.nan == "cheap" and self.monitor.checked_anything and (nonfinite is None or nonfinite.handled_by_scaler):
            note = early_stop_note(outcome, state.step)
            if note:
                self._note(note)

        findings = list(script_findings)
        absolute_of = {self.display(self.path): self.path}
        for filename in self.executed_project_files():
            absolute_of[self.display(filename)] = filename
            findings.extend(self.lint(filename))
        confirmed, unchecked = confirm_findings(findings, absolute_of, facts)
        confirmed = [f for f in confirmed if f["source"] != "runtime" or not self.silenced(f)]
        untraced = self.untraced_processes()
        if untraced:
            self._say_what_ran_untraced(untraced, confirmed)

        ops = rpt.op_rows(state, self.display)
        devices = {row["autocast"]["device"] for row in ops if row["autocast"]}
        used_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        device = "cuda" if used_cuda else "cpu"
        notes = list(self.notes) + state.notes
        relaxed = [record["site"] for record in state.compiled if record["fullgraph_dropped"]]
        if relaxed:
            notes.append(
                f"torch.compile(fullgraph=True) at {self.display(relaxed[0][0])}:{relaxed[0][1]} ran with fullgraph=False: "
                "amplint's op recording makes Dynamo skip every frame, which fullgraph=True turns into an error the "
                "untraced script does not raise; rerun with --no-ops to trace the compiled program"
            )
        if state.other_threads and self.recorder is not None:
            name, site = next(iter(state.other_threads.items()))
            where = f" (first at {self.display(site[0])}:{site[1]})" if site else ""
            more = f" and {len(state.other_threads) - 1} other thread(s)" if len(state.other_threads) > 1 else ""
            notes.append(
                f"the thread {name!r}{more} ran autocast or backward{where}: the op recording (op dtypes, "
                "--nan op, --simulate) follows the script's main thread only, so the ops of those threads are not "
                "in the op table (their GradScaler steps and the findings on their lines are)"
            )
        eager = [r["site"] for r in state.compiled if r["calls"] and not r["fullgraph_dropped"]]
        if eager and self.recorder is not None:
            from amplint.trace.rule_events import dynamo_made_graphs

            if not dynamo_made_graphs():
                notes.append(
                    f"the model compiled at {self.display(eager[0][0])}:{eager[0][1]} ran eagerly: amplint's op recording "
                    "makes Dynamo skip every frame, so the op table shows the eager run; rerun with --no-ops to trace "
                    "the compiled program"
                )
        autocast_disabled = [w for w in state.warnings.values() if "Disabling" in w.message and "autocast" in w.message.lower()]
        if autocast_disabled:
            w = autocast_disabled[0]
            cuda = "CUDA" in w.message and not self.options.simulate
            notes.append(
                f"autocast was disabled at {self.display(w.callsite[0])}:{w.callsite[1]} ({w.message.strip()}): "
                "that region ran in float32, and findings about it were judged on that run"
                + ("; `--simulate cuda` shows CUDA's dtypes for it" if cuda else "")
            )

        float64 = rpt.float64_in_regions(ops)
        if float64:
            notes.append(float64)
        for (filename, line), (switched_off, around, dtype) in state.misdirected_disables.items():
            notes.append(
                f"autocast(\"{switched_off}\", enabled=False) at {self.display(filename)}:{line} ran inside an enabled {around} "
                f"autocast region ({dtype}) and switched nothing off: the ops inside ran in {dtype}; switch off the device "
                f"the tensors are on (`torch.autocast(x.device.type, enabled=False)`)"
            )

        kernels: list = []
        if self.options.probe_dtypes:
            from amplint.trace.kernels import probe_kernels

            target = self.options.probe_device or device
            kernels = probe_kernels(state.op_templates, self.options.probe_dtypes, target, frozenset(state.raised_signatures))

        rank, world = rpt.rank_info()
        typed = ["-m", self.module_name] if self.module_name else [self.options.target]
        report = {
            "script": self.display(self.path) if self.module_name is None else self.module_name,
            "argv": [*typed, *self.options.args],  # as typed after `amplint trace`
            "exit": {"status": outcome.status, "code": outcome.exit_code, "exception": outcome.message},
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
            "untraced_processes": untraced,
            "rank": rank,
        }
        if rank is not None:
            report["launch"] = rpt.launch_token()
        if simulator is not None:
            report["simulation"] = simulator.results(self.display, ops)
        return report

    def untraced_processes(self) -> list[dict]:
        """Where the script started processes that ran untraced, how, and how many."""
        return [
            {"path": self.display(site[0]) if site else None, "line": site[1] if site else None, "count": count, "how": how}
            for how, counter in (("multiprocessing", self.state.untraced_processes), ("program", self.state.untraced_programs))
            for site, count in counter.items()
        ]

    def _say_what_ran_untraced(self, untraced: list[dict], findings: list[dict]) -> None:
        """This process saw only its own part of the run: a line it did not reach may have run in
        a child, so a finding it did not reach says so instead of "the line never ran"."""
        from amplint.trace.confirm import LINE_NEVER_RAN

        def where(entries: list[dict]) -> str:
            places = ", ".join(f"{p['path']}:{p['line']}" for p in entries if p["path"])
            return f" ({places})" if places else ""

        children = [p for p in untraced if p["how"] == "multiprocessing"]
        programs = [p for p in untraced if p["how"] == "program"]
        if children:
            self._note(
                f"the script started {sum(p['count'] for p in children)} process(es) that amplint does not trace{where(children)}: "
                "what ran there (ops, GradScaler steps, non-finite values) is not in this report"
            )
        if programs:
            self._note(
                f"the script ran {sum(p['count'] for p in programs)} Python program(s) that amplint does not trace{where(programs)}: "
                "what ran there is not in this report; run `amplint trace` on the program itself to trace it"
            )
        for finding in findings:
            if finding["status"] == "not-reached" and finding["evidence"].get("note", LINE_NEVER_RAN) == LINE_NEVER_RAN:
                finding["evidence"]["note"] = f"not reached in the traced process; it may have run in a process the script started{where(untraced)}"

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
        reports = rpt.wait_for_ranks(json_path, world, report.get("launch"))
        merged = rpt.merge_reports(reports, world)
        rpt.write_json(merged, json_path)
        self.summary_report = merged
        if self.options.html_path:
            from amplint.trace.html import write_html

            write_html(merged, os.path.join(self.cwd, self.options.html_path), self.cwd)

    @staticmethod
    def strict_failures(report: dict) -> list[str]:
        """What makes `--strict` fail the run, in words: confirmed findings, missing kernels, a
        non-finite value the GradScaler did not handle, a GradScaler that skipped every step."""
        from amplint.trace.report import needed_missing, never_applied

        reasons = [
            f"{f['code']} confirmed at {f['path']}:{f['line']}" for f in report["findings"] if f["status"] == "confirmed"
        ]
        reasons += [f"no {k['dtype']} kernel for {k['op']} on {k['device']}" for k in needed_missing(report["kernels"])]
        nonfinite = report["nonfinite"]
        # An overflow the GradScaler handled (step skipped, scale backed off) is fp16 working as
        # designed, not a failure.
        if nonfinite is not None and not nonfinite.get("handled_by_scaler"):
            reasons.append(f"a non-finite {nonfinite['op']} at {nonfinite.get('path')}:{nonfinite.get('line')}")
        return reasons + never_applied(report)
