"""The one exception type `amplint compare` turns into "amplint compare: error: ..." and exit 2."""

from __future__ import annotations


class CompareError(Exception):
    """A bad spec, a bad baseline file or a run that cannot give a trustworthy reference.

    ``report`` optionally carries a partial JSON report (e.g. a non-finite baseline) that is still
    worth writing to ``--json`` before exiting with status 2.
    """

    def __init__(self, message: str, report: dict | None = None) -> None:
        super().__init__(message)
        self.report = report


def one_line(text: str, limit: int = 400) -> str:
    """Collapse a message onto one line so stderr keeps the one-line error promise."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def describe_exception(exc: BaseException) -> str:
    message = one_line(str(exc))
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
