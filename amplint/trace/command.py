"""`amplint trace`: the click layer only. Options are validated before torch is imported, so a typo
costs milliseconds and prints one line; the work happens in `amplint.trace.session`."""

from __future__ import annotations

import difflib
import importlib.util
import sys

import click

from amplint.trace.options import NAN_MODES, TraceOptions, TraceUsageError, parse_dtype_list

# The CLI turns an ImportError raised here into "`amplint trace` needs PyTorch ...".
if importlib.util.find_spec("torch") is None:
    raise ModuleNotFoundError("No module named 'torch'", name="torch")


class TraceUsageFailure(click.ClickException):
    """Bad input: one line on stderr, exit status 2 (click's default prints the usage block)."""

    exit_code = 2

    def show(self, file=None) -> None:
        click.echo(f"amplint trace: error: {self.format_message()}", err=True)


class _TraceCommand(click.Command):
    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, self._split_off_script_args(ctx, args))
        except click.UsageError as exc:
            raise TraceUsageFailure(exc.format_message()) from None

    def _split_off_script_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """amplint's options end at SCRIPT or after `-m MODULE`: what follows is the script's, even
        `--json`. A `-`-word before the script is not a script name but a mistyped option."""
        options = [param for param in self.get_params(ctx) if isinstance(param, click.Option)]
        takes_value = {name for param in options if not param.is_flag for name in param.opts}
        known = [name for param in options for name in param.opts]
        position = 0
        while position < len(args):
            word = args[position]
            if word == "--" or word == "-" or not word.startswith("-"):
                return args  # SCRIPT is next (or is this word): click stops there by itself
            if word.startswith("--"):
                name = word.split("=", 1)[0]
                if name not in known:
                    raise TraceUsageFailure(f"no such option: {name}{_suggestion(name, known)}")
                position += 2 if name in takes_value and "=" not in word else 1
                continue
            # Short options, possibly bundled as click allows: `-q`, `-qm pkg.train`, `-mpkg.train`.
            for index, letter in enumerate(word[1:], start=1):
                name = f"-{letter}"
                if name not in known:
                    raise TraceUsageFailure(f"no such option: {name}{_suggestion(name, known)}")
                if name in takes_value:
                    value_end = position + 1 if index < len(word) - 1 else position + 2
                    if name == "-m":  # the module takes everything after its name
                        return [*args[:value_end], "--", *args[value_end:]] if value_end <= len(args) else args
                    position = value_end
                    break
            else:
                position += 1
        return args


def _suggestion(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


@click.command(
    "trace",
    cls=_TraceCommand,
    context_settings={
        "ignore_unknown_options": True,
        "allow_interspersed_args": False,
        "help_option_names": ["-h", "--help"],
    },
)
@click.option("-m", "module", metavar="MODULE", help="Run a module as __main__, like `python -m MODULE`.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the trace report (JSON) here.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), help="Write a self-contained HTML report here.")
@click.option(
    "--strict",
    is_flag=True,
    help="Exit 1 when a finding is confirmed, a kernel is missing, or a non-finite value appeared that the "
    "GradScaler did not handle (an overflow of the scaled gradients it skipped the step for is fp16 working as "
    "designed; a non-finite loss is not: the forward overflowed, and no scale fixes that).",
)
@click.option(
    "--nan",
    "nan_mode",
    type=click.Choice(NAN_MODES),
    default="cheap",
    show_default=True,
    help="Non-finite localisation: loss and gradients once per step (cheap), module outputs "
    "(module), or the first op (op).",
)
@click.option(
    "--nan-from-step",
    type=click.IntRange(min=0),
    default=0,
    help="With --nan module/op: start checking at this 0-based step (the one `cheap` flagged).",
)
@click.option("--probe-dtype", "probe_dtype", metavar="DTYPES", help="Replay the recorded ops in these dtypes (float16,bfloat16).")
@click.option(
    "--probe-device",
    type=click.Choice(["cpu", "cuda"]),
    default=None,
    help="Device for --probe-dtype (default: the device the run used).",
)
@click.option(
    "--simulate",
    type=click.Choice(["cuda"]),
    default=None,
    help="Also run the autocast regions on fake CUDA tensors to show CUDA's op policy without a GPU.",
)
@click.option("--no-ops", is_flag=True, help="Do not record per-op dtypes (lowest overhead).")
@click.option("--quiet", "-q", is_flag=True, help="No terminal summary (the JSON/HTML files are still written).")
@click.argument("target_and_args", nargs=-1, type=click.UNPROCESSED, metavar="[SCRIPT] [ARGS]...")
def trace_command(
    module: str | None,
    json_path: str | None,
    html_path: str | None,
    strict: bool,
    nan_mode: str,
    nan_from_step: int,
    probe_dtype: str | None,
    probe_device: str | None,
    simulate: str | None,
    no_ops: bool,
    quiet: bool,
    target_and_args: tuple[str, ...],
) -> None:
    """Run SCRIPT (or -m MODULE) with its ARGS under instrumentation and report what really happened:
    op dtypes, GradScaler steps, the first non-finite op, and the status of each static finding.

    Everything after SCRIPT (or after -m MODULE) goes to the script: `amplint trace train.py --lr 3`.
    """
    args = list(target_and_args)
    if module is None:
        if not args:
            raise TraceUsageFailure("missing SCRIPT (or -m MODULE)")
        target, args = args[0], args[1:]
    else:
        target = module
    options = TraceOptions(
        target=target,
        args=args,
        module=module is not None,
        json_path=json_path,
        html_path=html_path,
        strict=strict,
        nan=nan_mode,
        nan_from_step=nan_from_step,
        probe_dtypes=parse_dtype_list(probe_dtype),
        probe_device=probe_device,
        simulate=simulate,
        record_ops=not no_ops,
        quiet=quiet,
    )
    try:
        options.validate()
    except TraceUsageError as exc:
        raise TraceUsageFailure(str(exc)) from None

    from amplint.trace.session import run_trace

    status = run_trace(options)
    if status < 0:
        _end_by_signal(-status)
    sys.exit(status)


def _end_by_signal(number: int) -> None:
    """End the process by the signal that stopped the script, as Python does after Ctrl-C."""
    import os
    import signal

    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)
    sys.exit(128 + number)  # where the signal does not end the process
