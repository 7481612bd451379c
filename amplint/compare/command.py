"""`amplint compare SPEC`: the click layer only; the work happens in the sibling modules."""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
import warnings

import click

from amplint.compare.errors import CompareError, describe_exception, one_line

EXIT_PASSED, EXIT_FAILED, EXIT_ERROR = 0, 1, 2
# Whoever read the report closed the pipe (`| head -1`): end as a process SIGPIPE stops, quietly.
EXIT_OUTPUT_CLOSED = 128 + 13


def _raised_by_the_terminal(exc: SystemExit) -> bool:
    """rich's console raises SystemExit(1) when it finds its output pipe closed."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and f"{os.sep}rich{os.sep}" in frames[-1].filename


class _OneLineErrors(click.Command):
    """Usage mistakes get the same one-line stderr message and exit 2 as a bad spec."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            click.echo(f"amplint compare: error: {one_line(exc.format_message())}", err=True)
            ctx.exit(EXIT_ERROR)


@click.command("compare", cls=_OneLineErrors)
@click.argument("spec_path", metavar="SPEC")
@click.option("--json", "json_path", metavar="FILE", help="Write the JSON report here (`-` for stdout, which then holds only the JSON).")
@click.option("--save-baseline", metavar="FILE", help="Save the FP32 baseline outputs (with case ids and weight/input hashes) to FILE.")
@click.option("--baseline", "baseline_path", metavar="FILE", help="Compare against a baseline saved earlier with --save-baseline instead of recomputing it.")
@click.option("--device", help="Override the spec's DEVICE (cpu, cuda, cuda:N).")
@click.option("--trials", help="Override the spec's TRIALS, comma-separated (e.g. bfloat16,float16).")
@click.option("--no-gains", is_flag=True, help="Skip the time and memory measurement of passing trials.")
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True, help="Untimed passes before timing.")
@click.option("--repeats", type=click.IntRange(min=1), default=10, show_default=True, help="Timed passes per variant (the median is reported).")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU intra-op threads (torch.set_num_threads) for the whole run; default: torch's choice.")
@click.option("--all-cases", is_flag=True, help="List every case, not only the changed, non-finite, out-of-tolerance and near-tie ones.")
def compare_command(spec_path: str, **options) -> None:
    """Compare an FP32 baseline with AMP trials on the fixed dataset that SPEC defines.

    Exit status: 0 every trial passed, 1 a trial failed, 2 bad spec or error.
    """
    sys.exit(run_compare_command(spec_path, **options))


def run_compare_command(
    spec_path: str,
    *,
    json_path: str | None = None,
    save_baseline: str | None = None,
    baseline_path: str | None = None,
    device: str | None = None,
    trials: str | None = None,
    no_gains: bool = False,
    warmup: int = 3,
    repeats: int = 10,
    all_cases: bool = False,
    threads: int | None = None,
) -> int:
    if save_baseline and baseline_path:
        return _error("--save-baseline and --baseline cannot be combined: a stored baseline is compared against, never rewritten")
    if save_baseline and json_path and json_path != "-" and _same_file(save_baseline, json_path):
        return _error(f"--save-baseline and --json name the same file ({json_path}); the report would overwrite the baseline")
    if baseline_path and json_path and json_path != "-" and _same_file(baseline_path, json_path):
        return _error(f"--baseline and --json name the same file ({json_path}); the report would overwrite the baseline")
    # Checked before the run, which can take minutes: its files must be writable where they go, and
    # never over the spec or other Python source.
    for flag, path in (("--json", json_path), ("--save-baseline", save_baseline)):
        problem = _unwritable_output(path, spec_path) if path and path != "-" else None
        if problem:
            return _error(f"{flag}: {problem}")
    if json_path and json_path != "-" and _holds_a_baseline(json_path):
        return _error(f"--json: {json_path} holds a baseline saved by --save-baseline; the report would overwrite it")
    # The JSON on stdout must stay parseable, so `--json -` sends the human report, and whatever
    # the spec's own code prints, to stderr.
    stdout = sys.stdout
    stream = sys.stderr if json_path == "-" else sys.stdout
    quiet_stdout = contextlib.redirect_stdout(sys.stderr) if json_path == "-" else contextlib.nullcontext()
    try:
        with quiet_stdout:
            report = _run(
                spec_path, stdout, stream, json_path=json_path, save_baseline=save_baseline,
                baseline_path=baseline_path, device=device, trials=trials, no_gains=no_gains,
                warmup=warmup, repeats=repeats, all_cases=all_cases, threads=threads,
            )
    except CompareError as exc:
        if exc.report is not None and json_path:
            _write_partial(exc.report, json_path, stdout)
        return _error(f"{spec_path}: {exc}")
    except OSError as exc:
        return _error(f"{spec_path}: {describe_exception(exc)}")
    except SystemExit as exc:
        if _raised_by_the_terminal(exc):  # rich ends the run so when the reader went away (`| head -1`)
            return EXIT_OUTPUT_CLOSED
        # The spec's code called sys.exit(): never a silent pass.
        return _error(f"{spec_path}: the spec's code called sys.exit({exc.code!r}); a spec returns, it does not exit")
    except KeyboardInterrupt as interrupt:
        report = getattr(interrupt, "report", None)  # stopped while timing: the trials' verdicts stand
        kept = report is not None and bool(json_path)
        if kept:
            _write_partial(report, json_path, stdout)
        print("amplint compare: interrupted" + (" while measuring the gains; the report holds the verdicts" if kept else ""), file=sys.stderr)
        return 130
    except Exception as exc:  # a bug in amplint or an unexpected failure: still one line, exit 2  # noqa: BLE001 - user code or torch internals may raise anything
        return _error(f"{spec_path}: internal error: {describe_exception(exc)}")
    return EXIT_PASSED if all(trial["passed"] for trial in report["trials"]) else EXIT_FAILED


def _run(
    spec_path: str, stdout, stream, *, json_path, save_baseline, baseline_path, device, trials, no_gains, warmup,
    repeats, all_cases, threads,
) -> dict:
    """The comparison and its report; errors are the caller's to word."""
    with warnings.catch_warnings():
        # A torch built without numpy warns on import; that is not the user's concern here.
        warnings.filterwarnings("ignore", message=".*Failed to initialize NumPy.*")
        import torch

    if threads is not None:
        torch.set_num_threads(threads)

    # Imported before the spec's folder goes first on sys.path: a helper beside the spec named
    # like a module these import later (a `statistics.py`) must not take its place.
    from amplint.compare import gains  # noqa: F401
    from amplint.compare import report as reporting
    from amplint.compare import run, store
    from amplint.compare import spec as specs

    trial_override = tuple(t.strip() for t in trials.split(",") if t.strip()) if trials is not None else None
    spec = specs.load_spec(spec_path, device=device, trials=trial_override)
    console = reporting.make_console(stream)
    def say(message: str) -> None:
        console.print(message, markup=False)  # ids and paths may hold [brackets]

    say(f"amplint compare {spec.path}: device {spec.device}, trials {', '.join(spec.trials)}")
    say(
        f"Criteria fixed before any trial: {spec.criteria.describe()}"
        + (" (amplint's defaults: the spec sets no CRITERIA; set the ones your use needs)" if spec.criteria_by_default else "")
    )

    prepared = run.prepare(spec)
    baseline = store.load_baseline(baseline_path, prepared) if baseline_path else run.compute_baseline(prepared)

    def keep_baseline() -> None:
        if save_baseline:
            store.save_baseline(save_baseline, prepared, baseline)
            say(f"Baseline saved to {save_baseline}")

    report = run.run_compare(
        prepared,
        baseline,
        measure_gains=not no_gains,
        warmup=warmup,
        repeats=repeats,
        progress=say,
        after_baseline=keep_baseline,
    )
    reporting.render(report, console, all_cases=all_cases)
    if json_path:
        reporting.write_json(report, json_path, stdout)
    return report


def _write_partial(report: dict, json_path: str, stdout) -> None:
    from amplint.compare.report import write_json

    try:
        write_json(report, json_path, stdout)
    except OSError:
        pass  # the error line that follows matters more than the partial report


# What every baseline file holds near its start, in the pickle of its payload (store.FORMAT).
_BASELINE_MARK = b"amplint-compare-baseline"


def _holds_a_baseline(path: str) -> bool:
    """A file --save-baseline wrote: the FP32 reference a mistyped --json must not destroy."""
    try:
        with open(path, "rb") as handle:
            return _BASELINE_MARK in handle.read(1 << 20)
    except OSError:
        return False


def _unwritable_output(path: str, spec_path: str) -> str | None:
    folder = os.path.dirname(path)
    if folder and not os.path.isdir(folder):
        return f"folder does not exist: {folder}"
    if os.path.isdir(path):
        return f"{path} is a directory"
    if _same_file(path, spec_path) or (path.endswith((".py", ".pyw")) and os.path.exists(path)):
        return f"{path} is Python source; the file written there would overwrite it"
    if not os.access(path if os.path.exists(path) else (folder or "."), os.W_OK):
        return f"{path}: permission denied"
    return None


def _same_file(first: str, second: str) -> bool:
    return os.path.abspath(first) == os.path.abspath(second) or (
        os.path.exists(first) and os.path.exists(second) and os.path.samefile(first, second)
    )


def _error(message: str) -> int:
    click.echo(f"amplint compare: error: {one_line(message)}", err=True)
    return EXIT_ERROR
