"""The command line: parse options, call the library, map results to exit codes.

Kept thin on purpose: every behaviour lives in a module a test can call directly. Heavy imports
(libcst, rich, torch) happen inside the commands, so `amplint --version` and a pre-commit run on
files without AMP code stay fast.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from amplint import __version__

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2

# Subcommands that live in their own package, imported only when named.
_LAZY_COMMANDS = {
    "trace": ("amplint.trace.command", "trace_command"),
    "compare": ("amplint.compare.command", "compare_command"),
}


class _DefaultToCheck(click.Group):
    """`amplint PATH...` means `amplint check PATH...`, as `ruff PATH` did before `ruff check`."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*self.commands, *_LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in _LAZY_COMMANDS and name not in self.commands:
            module_name, attr = _LAZY_COMMANDS[name]
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:  # the `trace` extra (torch) is not installed
                missing = exc.name or str(exc)
                raise click.UsageError(
                    f"`amplint {name}` needs PyTorch ({missing} could not be imported); "
                    "install it with `pip install 'amplint[trace]'`"
                ) from None
            self.add_command(getattr(module, attr), name)
        return super().get_command(ctx, name)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.list_commands(ctx) and args[0] not in ("--help", "-h", "--version"):
            args = ["check", *args]
        elif not args:
            args = ["check"]
        return super().parse_args(ctx, args)


class _OneLineErrors(click.Command):
    """Usage mistakes (an unknown option, a bad --format) get one line on stderr and exit 2."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            message = " ".join(exc.format_message().split())
            click.echo(f"amplint: error: {message} (see `amplint {self.name} --help`)", err=True)
            ctx.exit(EXIT_ERROR)


def _internal_error(exc: BaseException) -> int:
    """An unexpected exception is a bug: one line and exit 2 (AMPLINT_DEBUG=1 shows the traceback)."""
    if os.environ.get("AMPLINT_DEBUG"):
        raise exc
    detail = " ".join(str(exc).split())
    print(f"amplint: internal error: {type(exc).__name__}{': ' + detail if detail else ''}", file=sys.stderr)
    return EXIT_ERROR


@click.group(cls=_DefaultToCheck, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="amplint")
def main() -> None:
    """Find PyTorch automatic-mixed-precision mistakes, then prove them on a real run.

    `amplint PATH...` is `amplint check PATH...`.
    """


@main.command("check", cls=_OneLineErrors)
@click.argument("paths", nargs=-1, type=click.Path(path_type=str))
@click.option("--select", help="Comma-separated rule codes or prefixes to enable (replaces the default set).")
@click.option("--ignore", help="Comma-separated rule codes or prefixes to disable.")
@click.option("--extend-select", help="Comma-separated rule codes or prefixes to add to the selection.")
@click.option(
    "--format",
    "--output-format",  # ruff's spelling, for commands written for ruff
    "output_format",
    type=click.Choice(["text", "concise", "json", "sarif", "github"]),
    default=None,
    help="Output format (default: text).",
)
@click.option("--output-file", type=click.Path(dir_okay=False, path_type=str), help="Write the report here.")
@click.option("--fix", is_flag=True, help="Apply safe fixes in place.")
@click.option("--unsafe-fixes", is_flag=True, help="Also apply fixes that may change behaviour.")
@click.option("--diff", is_flag=True, help="Print the fixes as a unified diff; write nothing.")
@click.option("--add-noqa", is_flag=True, help="Suppress every current finding with a `# noqa: CODE` comment on its line.")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when there are findings.")
@click.option("--statistics", is_flag=True, help="Print a count per rule instead of the findings.")
@click.option("--no-cache", is_flag=True, help="Neither read nor write the result cache.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None, help="Worker processes (default: CPU count).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=str), help="A pyproject.toml or amplint.toml to use instead of discovery.")
@click.option("--stdin-filename", help="The file name to report for source read from `-`.")
@click.option("--quiet", "-q", is_flag=True, help="Print findings only: no summary line.")
@click.option("--force-exclude", is_flag=True, help="Apply `exclude` to paths named on the command line too (for pre-commit).")
def check_command(paths: tuple[str, ...], **options) -> None:
    """Check PATHS (files or directories; `-` reads standard input) for AMP mistakes."""
    from amplint.static.command import run_check_command

    if sys.stdout is None:  # started with standard output closed (`amplint src >&-`)
        click.echo("amplint: error: cannot write to standard output: it is closed", err=True)
        sys.exit(2)

    try:
        status = run_check_command(paths, **options)
    except BrokenPipeError:
        # `amplint src | head`: the reader left; stop quietly, as other command-line tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        status = EXIT_FINDINGS
    except KeyboardInterrupt:
        status = 130
    except Exception as exc:  # noqa: BLE001 - the last line of defence: never a traceback
        status = _internal_error(exc)
    sys.exit(status)


@main.command("rule", cls=_OneLineErrors)
@click.argument("code", required=False)
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text")
def rule_command(code: str | None, output_format: str) -> None:
    """List the rules, or print the documentation of rule CODE."""
    from amplint.catalogue import render_rule_command

    sys.exit(render_rule_command(code, output_format))


if __name__ == "__main__":
    main()
