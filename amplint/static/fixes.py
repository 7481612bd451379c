"""Apply fixes to a source file: byte-faithful outside each edit, re-parsed before it is kept.

A fix is a list of edits in 1-based (line, column) character positions of the decoded text.
Edits of different findings that overlap are left for the next round; rounds repeat until no
fix applies (at most a few times), as ruff does, so a second `--fix` finds nothing to change.
"""

from __future__ import annotations

import errno
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from amplint.model import Applicability, Edit, Finding
from amplint.static.source import LINE_BREAK

_MAX_ROUNDS = 5


@dataclass
class FixResult:
    source: bytes  # the fixed file
    applied: int  # how many findings were fixed
    remaining: list[Finding]  # findings after fixing


def _lines(text: str) -> tuple[list[int], list[str]]:
    """Where each line starts (1-based line numbers index it directly) and how it ends. A line
    ends at `\r\n`, `\r` or `\n`, as Python and libcst count lines."""
    starts, endings = [0, 0], [""]
    for match in LINE_BREAK.finditer(text):
        starts.append(match.end())
        endings.append(match.group())
    endings.append("")
    return starts, endings


def apply_edits(text: str, edits: list[Edit]) -> str:
    starts, endings = _lines(text)
    spans = sorted(
        ((starts[e.line] + e.column - 1, starts[e.end_line] + e.end_column - 1, e.content, e.line) for e in edits),
        reverse=True,
    )
    for start, end, content, line in spans:
        # Inserted lines end as the edited line does (libcst's code uses "\n"; a file may not).
        newline = endings[line] or next((ending for ending in reversed(endings[:line]) if ending), "\n")
        if newline != "\n":
            content = content.replace("\r\n", "\n").replace("\n", newline)
        text = text[:start] + content + text[end:]
    return text


def _wanted(finding: Finding, unsafe: bool) -> bool:
    return finding.fix is not None and (unsafe or finding.fix.applicability is Applicability.SAFE)


def fix_source(source: bytes, path: str, select, unsafe: bool, min_torch: tuple[int, ...] | None = None) -> FixResult:
    from amplint.static.analyse import analyse_source, parse
    from amplint.static.source import SourceError, decode_source

    try:
        text, encoding = decode_source(source)
    except SourceError:
        return FixResult(source, 0, analyse_source(source, path, select, min_torch))
    applied = 0
    findings = analyse_source(text, path, select, min_torch)
    for _ in range(_MAX_ROUNDS):
        chosen: list[Finding] = []
        taken: list[tuple[tuple[int, int], tuple[int, int]]] = []
        for finding in findings:
            if not _wanted(finding, unsafe):
                continue
            spans = [((e.line, e.column), (e.end_line, e.end_column)) for e in finding.fix.edits]
            if any(_overlaps(span, other) for span in spans for other in taken):
                continue
            taken.extend(spans)
            chosen.append(finding)
        if not chosen:
            break
        candidate = apply_edits(text, [e for f in chosen for e in f.fix.edits])
        try:
            parse(candidate)
        except SourceError:
            break  # never write a file that no longer parses
        text = candidate
        applied += len(chosen)
        findings = analyse_source(text, path, select, min_torch)
    if applied == 0:
        return FixResult(source, 0, findings)
    return FixResult(text.encode(encoding), applied, findings)


def _overlaps(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1] or a == b


def write_atomically(path: Path, data: bytes) -> None:
    """Replace a file's bytes as an editor would. A file the user may not write is refused. A
    file with other hard links, or in a folder the user may not write, is rewritten in place
    (a rename would split the link, or is not allowed). Otherwise the bytes go to a temporary
    file that takes the file's mode, owner and group and is renamed over it, so that a crash
    never leaves half a file; where the temporary cannot take the owner or group (a file of a
    group the user is not in, shared through its permissions), the file is rewritten in place
    rather than handed to the user's own group. Through a symlink, the target is written."""
    path = path.resolve()
    info = path.stat()
    if not os.access(path, os.W_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
    if info.st_nlink > 1 or not os.access(path.parent, os.W_OK):
        _write_in_place(path, data)
        return
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".amplint")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chmod(temporary, info.st_mode & 0o7777)
        if not _takes_owner(temporary, info):
            os.unlink(temporary)
            _write_in_place(path, data)
            return
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def _write_in_place(path: Path, data: bytes) -> None:
    with open(path, "r+b") as out:
        out.write(data)
        out.truncate()


def _takes_owner(temporary: str, info: os.stat_result) -> bool:
    """Give the temporary file the owner and group of the file it replaces; whether it has them."""
    made = os.stat(temporary)
    if (made.st_uid, made.st_gid) == (info.st_uid, info.st_gid):
        return True
    try:  # (Windows reports no owner: the first test answers there)
        os.chown(temporary, info.st_uid, info.st_gid)
    except OSError:  # not allowed: another user's file, or a group the user is not in
        return False
    return True
