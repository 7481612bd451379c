"""`amplint check`: options in, exit status out. The click layer in cli.py only forwards here."""

from __future__ import annotations

import difflib
import io
import sys
from collections import Counter
from pathlib import Path

from amplint.config import ConfigError, discover, load_config_file, parse_codes_option, with_overrides
from amplint.model import Finding
from amplint.report import renderer
from amplint.static.runner import RunResult, check_paths, check_stdin

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def _error(message: str) -> None:
    print(f"amplint: error: {message}", file=sys.stderr)


def run_check_command(paths: tuple[str, ...], **o) -> int:
    try:
        select = parse_codes_option(o["select"], "--select")
        ignore = parse_codes_option(o["ignore"], "--ignore")
        extend = parse_codes_option(o["extend_select"], "--extend-select")
        if o["config_file"]:
            settings = load_config_file(Path(o["config_file"]))
        else:
            first = next((p for p in paths if p != "-"), ".")
            settings = discover(Path(first) if Path(first).exists() else Path.cwd())
        settings = with_overrides(settings, select, ignore, extend)
    except ConfigError as exc:
        _error(str(exc))
        return EXIT_ERROR

    output_format = o["output_format"] or "text"
    fixing = o["fix"] or o["diff"]
    if paths == ("-",) or "-" in paths:
        if len(paths) > 1:
            _error("`-` (standard input) cannot be combined with other paths")
            return EXIT_ERROR
        return _check_stdin(settings, o, output_format)

    result = check_paths(
        list(paths or (".",)),
        settings,
        use_cache=not o["no_cache"] and not fixing,
        jobs=o["jobs"],
        force_exclude=o["force_exclude"],
    )
    for message in result.errors:
        _error(message)
    if fixing:
        result.findings = _fix_files(result, settings, o)
    _report(result.findings, result, o, output_format)
    if result.errors:
        return EXIT_ERROR
    return EXIT_FINDINGS if result.findings and not o["exit_zero"] else EXIT_CLEAN


def _check_stdin(settings, o, output_format: str) -> int:
    display = o["stdin_filename"] or "-"
    source = sys.stdin.buffer.read()
    result = check_stdin(source, display, settings)
    context_sources = {display: source.decode("utf-8", errors="replace").splitlines()}
    if o["fix"] or o["diff"]:
        from amplint.static.fixes import fix_source

        fixed = fix_source(source, display, settings.enabled_codes(_codes()), o["unsafe_fixes"], settings.min_torch)
        if o["diff"]:
            sys.stdout.write(_unified_diff(display, source, fixed.source))
        else:
            sys.stdout.buffer.write(fixed.source)
            sys.stdout.flush()
        remaining = [f for f in fixed.remaining if f.fix is None or not o["fix"]]
        for finding in remaining:
            print(f"{finding.path}:{finding.line}:{finding.column}: {finding.code} {finding.message}", file=sys.stderr)
        return EXIT_FINDINGS if remaining and not o["exit_zero"] else EXIT_CLEAN
    _report(result.findings, result, o, output_format, context_sources)
    return EXIT_FINDINGS if result.findings and not o["exit_zero"] else EXIT_CLEAN


def _codes() -> list[str]:
    from amplint.static.runner import all_codes

    return all_codes()


def _fix_files(result: RunResult, settings, o) -> list[Finding]:
    """Fix (or diff) every file with a fixable finding; returns the findings left afterwards."""
    from amplint.static.fixes import fix_source, write_atomically

    unsafe = o["unsafe_fixes"]
    codes = settings.enabled_codes(_codes())
    by_file: dict[str, list[Finding]] = {}
    for finding in result.findings:
        by_file.setdefault(finding.path, []).append(finding)
    remaining: list[Finding] = []
    fixed_count = 0
    for display, findings in by_file.items():
        if not any(f.fix is not None for f in findings):
            remaining.extend(findings)
            continue
        path = result.sources[display].path
        original = path.read_bytes()
        fixed = fix_source(original, display, codes, unsafe, settings.min_torch)
        kept = {(f.code, f.line, f.column) for f in fixed.remaining}
        if fixed.applied and fixed.source != original:
            if o["diff"]:
                sys.stdout.write(_unified_diff(display, original, fixed.source))
            else:
                write_atomically(path, fixed.source)
            fixed_count += fixed.applied
        remaining.extend(fixed.remaining if not o["diff"] else findings)
        del kept
    if not o["quiet"] and not o["diff"] and fixed_count:
        print(f"Fixed {fixed_count} finding{'s' if fixed_count != 1 else ''}.", file=sys.stderr)
    return sorted(remaining, key=Finding.sort_key)


def _unified_diff(display: str, before: bytes, after: bytes) -> str:
    old = before.decode("utf-8", errors="replace").splitlines(keepends=True)
    new = after.decode("utf-8", errors="replace").splitlines(keepends=True)
    return "".join(difflib.unified_diff(old, new, fromfile=f"a/{display}", tofile=f"b/{display}"))


def _report(findings: list[Finding], result: RunResult, o, output_format: str, sources=None) -> None:
    if o["diff"]:
        return
    output_file = o["output_file"]
    out = io.StringIO() if output_file else sys.stdout
    context = {"color": None if output_file is None and sys.stdout.isatty() else False, "sources_text": sources or {}}
    if o["statistics"]:
        _statistics(findings, out, output_format)
    else:
        renderer(output_format)(findings, out, context)
    if output_file:
        try:
            Path(output_file).write_text(out.getvalue(), encoding="utf-8")
        except OSError as exc:
            _error(f"{output_file}: cannot write: {exc.strerror or exc}")
    if not o["quiet"] and output_format in ("text", "concise") and not result.errors:
        summary = sys.stdout if output_file is None else sys.stderr
        if findings:
            fixable = sum(1 for f in findings if f.fix is not None)
            files = len({f.path for f in findings})
            hint = f" ({fixable} fixable with `amplint --fix`)" if fixable else ""
            print(f"Found {len(findings)} finding{'s' if len(findings) != 1 else ''} in {files} file{'s' if files != 1 else ''}{hint}.", file=summary)
        else:
            print(f"All checks passed ({result.files_checked} file{'s' if result.files_checked != 1 else ''} checked).", file=summary)


def _statistics(findings: list[Finding], out, output_format: str) -> None:
    import json

    counts = Counter(f.code for f in findings)
    names = {f.code: f.name for f in findings}
    fixable = Counter(f.code for f in findings if f.fix is not None)
    rows = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    if output_format == "json":
        json.dump([{"code": c, "name": names[c], "count": n, "fixable": fixable[c]} for c, n in rows], out, indent=2)
        out.write("\n")
        return
    for code, count in rows:
        marker = "[*]" if fixable[code] else "   "
        out.write(f"{count:>5}  {code}  {marker} {names[code]}\n")
