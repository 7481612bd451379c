"""`amplint check`: options in, exit status out. The click layer in cli.py only forwards here.

The steps: resolve the settings (file, then flags), collect findings (files or stdin), apply or
preview fixes, render the report, choose the exit status. Exit 0 clean, 1 findings, 2 usage error,
bad configuration, unreadable path, unwritable output or internal error.
"""

from __future__ import annotations

import io
import os
import re
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from amplint.config import ConfigError, Settings, discover, load_config_file, parse_codes_option, with_overrides
from amplint.model import Finding
from amplint.report import renderer
from amplint.static.runner import RunResult, all_codes, check_paths, check_stdin
from amplint.static.source import physical_lines

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
STDIN = "-"


def _error(message: str) -> None:
    print(f"amplint: error: {message}", file=sys.stderr)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def resolve_settings(paths: tuple[str, ...], config_file: str | None, select: str | None, ignore: str | None,
                     extend_select: str | None, stdin_filename: str | None = None) -> list[tuple[Settings, list[str]]]:
    """The settings of each path named, and the paths that share them, in the order first named:
    the configuration file (given, or the nearest pyproject.toml with [tool.amplint] above each
    path, as pre-commit names the files of every project in a repository at once), then the
    command-line selection on top. Raises ConfigError."""
    selected = parse_codes_option(select, "--select")
    ignored = parse_codes_option(ignore, "--ignore")
    extended = parse_codes_option(extend_select, "--extend-select")
    named = list(paths) or ["."]
    if config_file:
        settings = load_config_file(Path(config_file))
        return [(with_overrides(settings, selected, ignored, extended), named)]
    known: dict[Path, Settings] = {}
    # One group per configuration, and per oldest torch a project declares under it.
    groups: dict[tuple, tuple[Settings, list[str]]] = {}
    for path in named:
        start = Path((stdin_filename or ".") if path == STDIN else path)
        while not start.exists() and start != start.parent:  # a stdin name need not exist
            start = start.parent
        settings = discover(start if start.exists() else Path.cwd(), known)
        groups.setdefault((settings.source, settings.min_torch), (settings, []))[1].append(path)
    return [(with_overrides(settings, selected, ignored, extended), group) for settings, group in groups.values()]


@dataclass
class _Outcome:
    findings: list[Finding]
    errors: list[str] = field(default_factory=list)
    fixed: int = 0
    patches: list[str] = field(default_factory=list)  # --diff: one per file

    def add(self, other: _Outcome) -> None:
        self.findings.extend(other.findings)
        self.errors.extend(other.errors)
        self.fixed += other.fixed
        self.patches.extend(other.patches)


def run_check_command(paths: tuple[str, ...], **o) -> int:
    o.setdefault("force_exclude", False)
    if o["stdin_filename"] and not paths:
        paths = (STDIN,)  # as ruff: a --stdin-filename alone means "read standard input"
    if o["add_noqa"] and (o["fix"] or o["diff"] or STDIN in paths):
        _error("--add-noqa cannot be combined with --fix, --diff or standard input")
        return EXIT_ERROR
    if STDIN in paths and len(paths) > 1:
        _error("`-` (standard input) cannot be combined with other paths")
        return EXIT_ERROR
    if o["statistics"] and (o["diff"] or o["output_format"] in ("sarif", "github")):
        # Counts are neither a patch, nor SARIF a code-scanning upload could read, nor annotations.
        _error(f"--statistics cannot be combined with {'--diff' if o['diff'] else '--format ' + o['output_format']}")
        return EXIT_ERROR
    try:
        groups = resolve_settings(paths, o["config_file"], o["select"], o["ignore"], o["extend_select"], o["stdin_filename"])
    except ConfigError as exc:
        _error(str(exc))
        return EXIT_ERROR
    output_format = o["output_format"] or "text"
    if paths == (STDIN,):
        return _check_stdin(groups[0][0], o, output_format)

    fixing = o["fix"] or o["diff"]
    outcome = _Outcome([])
    files_checked = 0
    named_files = [{str(Path(p).resolve()) for p in group if Path(p).is_file()} for _, group in groups]
    nearest = None if o["config_file"] else _nearest_settings(o["select"], o["ignore"], o["extend_select"])
    for index, (settings, group) in enumerate(groups):
        # `amplint . sub/a.py`: the walk of `.` leaves `sub/a.py` to its own settings.
        elsewhere = frozenset().union(*(keys for other, keys in enumerate(named_files) if other != index))
        try:
            result = check_paths(
                group,
                settings,
                use_cache=not o["no_cache"] and not fixing and not o["add_noqa"],  # fixes and comments need fresh positions
                jobs=o["jobs"],
                force_exclude=o["force_exclude"],
                elsewhere=elsewhere,
                nearest=nearest,
            )
        except ConfigError as exc:  # a nested project's configuration
            _error(str(exc))
            return EXIT_ERROR
        for message in result.errors:
            _error(message)
        files_checked += result.files_checked
        outcome.errors.extend(result.errors)
        if o["add_noqa"]:
            outcome.add(_add_noqa_to_files(result))
        else:
            outcome.add(_fix_files(result, settings, o) if fixing else _Outcome(result.findings))
    if o["add_noqa"]:
        if not o["quiet"]:
            print(f"Added {_plural(outcome.fixed, 'noqa directive')}.", file=sys.stderr)
        return EXIT_ERROR if outcome.errors else EXIT_CLEAN
    outcome.findings.sort(key=Finding.sort_key)
    if fixing:
        _finish_fixes(outcome, o)
    if not _report(outcome, files_checked, o, output_format):
        return EXIT_ERROR
    if outcome.errors:
        return EXIT_ERROR
    return EXIT_FINDINGS if outcome.findings and not o["exit_zero"] else EXIT_CLEAN


def _nearest_settings(select: str | None, ignore: str | None, extend_select: str | None) -> Callable[[str], Settings]:
    """The settings of the nearest configuration above a (resolved) folder, with the command
    line's selection on top; each folder is looked up once."""
    known: dict[Path, Settings] = {}
    layers = (parse_codes_option(select, "--select"), parse_codes_option(ignore, "--ignore"), parse_codes_option(extend_select, "--extend-select"))
    by_folder: dict[str, Settings] = {}

    def nearest(folder: str) -> Settings:
        if folder not in by_folder:
            by_folder[folder] = with_overrides(discover(Path(folder), known, folder_resolved=True), *layers)
        return by_folder[folder]

    return nearest


def _excluded_stdin(settings: Settings, name: str | None) -> bool:
    if not name:
        return False
    from amplint.static.discovery import Excluder

    return Excluder(settings.exclude, settings.root).excludes(Path(name))


def _check_stdin(settings: Settings, o, output_format: str) -> int:
    """Editors pipe the buffer in: `amplint - --stdin-filename path.py [--fix]`."""
    display = o["stdin_filename"] or STDIN
    source = sys.stdin.buffer.read()
    fixing = o["fix"] or o["diff"]
    if o["force_exclude"] and _excluded_stdin(settings, o["stdin_filename"]):
        if o["fix"] and not o["diff"]:
            _write_stdout_bytes(source)  # an excluded file comes back unchanged
        return EXIT_CLEAN
    result = check_stdin(source, display, settings)
    findings = result.findings
    if fixing:
        from amplint.static.fixes import fix_source

        fixed = fix_source(source, display, settings.codes_for(display, all_codes()), o["unsafe_fixes"], settings.min_torch)
        if o["diff"]:
            if problem := _write_output(_unified_diff(display, source, fixed.source), o["output_file"], patch=True):
                _error(problem)
                return EXIT_ERROR
            if not o["quiet"] and fixed.applied:
                print(f"Would fix {_plural(_fixed_count(findings, fixed), 'finding')}.", file=sys.stderr)
            # Nothing was written, so every finding is still there.
            return EXIT_FINDINGS if findings and not o["exit_zero"] else EXIT_CLEAN
        _write_stdout_bytes(fixed.source)
        # stdout holds the fixed source only; what is left goes to stderr.
        remaining = fixed.remaining
        text = physical_lines(fixed.source.decode("utf-8", errors="replace"))
        _render(remaining, sys.stderr, o, output_format, {display: text}, to_terminal=sys.stderr)
        return EXIT_FINDINGS if remaining and not o["exit_zero"] else EXIT_CLEAN
    text = physical_lines(_decoded(source))
    outcome = _Outcome(findings)
    if not _report(outcome, 1, o, output_format, {display: text}):
        return EXIT_ERROR
    return EXIT_FINDINGS if findings and not o["exit_zero"] else EXIT_CLEAN


def _write_stdout_bytes(data: bytes) -> None:
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def _patch_text(source: bytes) -> str:
    """A file's text for its patch, holding the file's own bytes: patch and `git apply` match a
    hunk byte for byte, so a latin-1 or Shift-JIS file's lines stay in its encoding (carried as
    surrogate escapes, written back as they were) rather than become UTF-8. An encoding whose line
    break is not the byte `\n` is diffed as text."""
    from amplint.static.source import SourceError, decode_source

    try:
        text, encoding = decode_source(source)
    except SourceError:
        return source.decode("utf-8", errors="surrogateescape")
    return text if "\n".encode(encoding) != b"\n" else source.decode("utf-8", errors="surrogateescape")


def _decoded(source: bytes) -> str:
    from amplint.static.source import SourceError, decode_source

    try:
        return decode_source(source)[0]
    except SourceError:
        return source.decode("utf-8", errors="replace")


def _fix_files(result: RunResult, settings: Settings, o) -> _Outcome:
    """Fix (or diff) every file with a wanted fix; the findings left afterwards.

    With --diff nothing is written, so every finding is still there afterwards."""
    from amplint.static.fixes import fix_source, write_atomically

    unsafe = o["unsafe_fixes"]
    codes = all_codes()
    by_file: dict[str, list[Finding]] = {}
    for finding in result.findings:
        by_file.setdefault(finding.path, []).append(finding)
    outcome = _Outcome([])
    for display, findings in by_file.items():
        source_file = result.sources.get(display)
        if source_file is None or not any(f.fixable(unsafe) for f in findings):
            outcome.findings.extend(findings)
            continue
        try:
            original = source_file.path.read_bytes()
        except OSError as exc:
            outcome.errors.append(f"{display}: cannot read: {exc.strerror or exc}")
            outcome.findings.extend(findings)
            continue
        own = result.settings_for(display, settings)
        fixed = fix_source(original, display, own.codes_for(display, codes), unsafe, own.min_torch)
        if not fixed.applied or fixed.source == original:
            outcome.findings.extend(findings)
            continue
        if o["diff"]:
            outcome.patches.append(_unified_diff(display, original, fixed.source))
            outcome.findings.extend(findings)
        else:
            try:
                write_atomically(source_file.path, fixed.source)
            except OSError as exc:
                outcome.errors.append(f"{display}: cannot write: {exc.strerror or exc}")
                outcome.findings.extend(findings)
                continue
            outcome.findings.extend(fixed.remaining)
        outcome.fixed += _fixed_count(findings, fixed)
    for message in outcome.errors:
        _error(message)
    return outcome


def _add_noqa_to_files(result: RunResult) -> _Outcome:
    """`# noqa` comments for every finding; `fixed` counts the comments added."""
    from amplint.static.fixes import write_atomically
    from amplint.static.noqa import add_noqa
    from amplint.static.source import SourceError

    by_file: dict[str, list[Finding]] = {}
    for finding in result.findings:
        by_file.setdefault(finding.path, []).append(finding)
    outcome = _Outcome([])
    for display, findings in sorted(by_file.items()):
        source_file = result.sources.get(display)
        if source_file is None:
            continue
        try:
            added = add_noqa(source_file.path.read_bytes(), findings)
            if added.comments:
                write_atomically(source_file.path, added.source)
        except SourceError as error:
            outcome.errors.append(f"{display}: cannot add noqa comments: {error.message}")
            continue
        except OSError as exc:
            outcome.errors.append(f"{display}: cannot write: {exc.strerror or exc}")
            continue
        if added.skipped:  # the next run still reports them: a warning, not a failure
            print(
                f"amplint: warning: {display}: {_plural(added.skipped, 'finding')} on lines that end inside a "
                "string or a continuation, where no comment can go; suppress them by hand",
                file=sys.stderr,
            )
        outcome.fixed += added.comments
    for message in outcome.errors:
        _error(message)
    return outcome


def _finish_fixes(outcome: _Outcome, o) -> None:
    """Once for the run: the patch (--diff) and how many findings were fixed."""
    if o["diff"] and (problem := _write_output("".join(outcome.patches), o["output_file"], patch=True)):
        _error(problem)
        outcome.errors.append(problem)
    if not o["quiet"] and outcome.fixed:
        verb = "Would fix" if o["diff"] else "Fixed"
        print(f"{verb} {_plural(outcome.fixed, 'finding')}.", file=sys.stderr)


def _fixed_count(before: list[Finding], fixed) -> int:
    """Findings a fix removed: one fix can carry others (an import's rewrite carries its uses)."""
    removed = len(before) - len(fixed.remaining)
    return removed if removed > 0 else fixed.applied


_PATCH_LINE = re.compile(r"[^\n]*\n|[^\n]+\Z")


def _unified_diff(display: str, before: bytes, after: bytes) -> str:
    import difflib  # only `--diff` needs it

    # Lines as patch and git read them, ending at "\n" only: str.splitlines also breaks at form
    # feeds, U+2028 and a lone "\r", which makes hunks no tool can apply.
    old = _PATCH_LINE.findall(_patch_text(before))
    new = _PATCH_LINE.findall(_patch_text(after))
    # `git apply` refuses `.` and `..` in a path: `./src/a.py` is `src/a.py`, `sub/../a.py` is `a.py`;
    # an absolute path is written as git writes one, `a/tmp/x.py`, not `a//tmp/x.py`.
    name = Path(os.path.normpath(display)).as_posix().lstrip("/")
    # A name with a space ends at a tab, as git writes it: patch(1) would stop at the space.
    end = "\t" if " " in name else ""
    lines = []
    for line in difflib.unified_diff(old, new, fromfile=f"a/{name}{end}", tofile=f"b/{name}{end}"):
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        lines.append(line)
    return "".join(lines)


def _render(findings: list[Finding], out: TextIO, o, output_format: str, sources=None, to_terminal: TextIO | None = None) -> None:
    from amplint.report.text import wants_color

    color = wants_color(to_terminal) if to_terminal is not None else False
    context = {"color": color, "sources_text": sources or {}, "unsafe_fixes": o["unsafe_fixes"]}
    if o["statistics"]:
        _statistics(findings, out, output_format, o["unsafe_fixes"])
    else:
        renderer(output_format)(findings, out, context)


def _report(outcome: _Outcome, files_checked: int, o, output_format: str, sources=None) -> bool:
    """Render the findings (to stdout or --output-file) and the summary; False if unwritable."""
    if o["diff"]:
        return True
    output_file = o["output_file"]
    findings = outcome.findings
    if output_file:
        buffer = io.StringIO()
        _render(findings, buffer, o, output_format, sources)
        if problem := _write_output(buffer.getvalue(), output_file):
            _error(problem)
            return False
    else:
        _render(findings, sys.stdout, o, output_format, sources, to_terminal=sys.stdout)
    if not o["quiet"] and (output_format in ("text", "concise") or o["statistics"]) and not outcome.errors:
        # The summary never mixes into machine-readable output on stdout.
        machine = output_format not in ("text", "concise")
        summary = sys.stderr if output_file or machine else sys.stdout
        print(summary_line(findings, files_checked, o["unsafe_fixes"]), file=summary)
    return True


def _write_output(text: str, output_file: str | None, *, patch: bool = False) -> str | None:
    """The report or patch to --output-file, else standard output; why not, if it cannot be written.
    A patch goes out as the bytes it holds (each file's own encoding, see _patch_text)."""
    if not output_file or output_file == "-":  # `-`: standard output, as for the paths
        if patch and hasattr(sys.stdout, "buffer"):
            _write_stdout_bytes(text.encode("utf-8", errors="surrogateescape"))
            return None
        sys.stdout.write(text)
        sys.stdout.flush()
        return None
    blocking = next((p for p in Path(output_file).parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        return f"{output_file}: cannot write: {blocking} is a file, not a folder"
    try:
        Path(output_file).parent.mkdir(parents=True, exist_ok=True)  # `reports/amplint.sarif` in CI
        # A file name that is not UTF-8 keeps its bytes, as it does on standard output; a patch
        # keeps its line endings.
        Path(output_file).write_text(text, encoding="utf-8", errors="surrogateescape", newline="")
    except OSError as exc:
        return f"{output_file}: cannot write: {exc.strerror or exc}"
    return None


def summary_line(findings: list[Finding], files_checked: int, unsafe: bool = False) -> str:
    if not findings:
        return f"All checks passed ({_plural(files_checked, 'file')} checked)."
    files = len({f.path for f in findings})
    safe = sum(1 for f in findings if f.fixable(False))
    only_unsafe = sum(1 for f in findings if f.fix is not None) - safe
    hints = []
    if safe or (only_unsafe and unsafe):
        hints.append(f"{safe + (only_unsafe if unsafe else 0)} fixable with `amplint --fix{' --unsafe-fixes' if unsafe and only_unsafe else ''}`")
    if only_unsafe and not unsafe:
        hints.append(f"{only_unsafe} more with `--unsafe-fixes`")
    hint = f" ({'; '.join(hints)})" if hints else ""
    return f"Found {_plural(len(findings), 'finding')} in {_plural(files, 'file')}{hint}."


def _statistics(findings: list[Finding], out, output_format: str, unsafe: bool) -> None:
    import json

    counts = Counter(f.code for f in findings)
    names = {f.code: f.name for f in findings}
    fixable = Counter(f.code for f in findings if f.fixable(unsafe))
    rows = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    if output_format == "json":
        json.dump([{"code": c, "name": names[c], "count": n, "fixable": fixable[c]} for c, n in rows], out, indent=2)
        out.write("\n")
        return
    for code, count in rows:
        marker = "[*]" if fixable[code] else "   "
        out.write(f"{count:>5}  {code}  {marker} {names[code]}\n")
