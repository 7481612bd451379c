"""A whole check run: discovery, cache, the byte gate, parallel analysis, per-file ignores."""

from __future__ import annotations

import ast
import gc
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from amplint.config import Settings
from amplint.model import Finding
from amplint.static.cache import ResultCache, content_hash
from amplint.static.discovery import Excluder, SourceFile, walk
from amplint.static.gate import possible_rules

# Below this much source to parse, starting worker processes costs more than it saves.
_PARALLEL_MIN_BYTES = 300_000


@dataclass
class RunResult:
    findings: list[Finding] = field(default_factory=list)
    files_checked: int = 0
    errors: list[str] = field(default_factory=list)  # paths that could not be read
    sources: dict[str, SourceFile] = field(default_factory=dict)  # display path -> file, for fixes


@dataclass(frozen=True)
class _Job:
    display: str
    source: bytes
    codes: frozenset[str]
    min_torch: tuple[int, ...] | None = None


def all_codes() -> list[str]:
    from amplint.catalogue import catalogue

    return sorted(catalogue())


def collect_files(arguments: list[str], settings: Settings, force_exclude: bool, result: RunResult) -> list[SourceFile]:
    """Files to check: those named, and the Python files below the folders named."""
    excluder = Excluder(settings.exclude, settings.root)
    files: list[SourceFile] = []
    seen: set[str] = set()
    for argument in arguments:
        path = Path(argument)
        if path.is_dir():
            for source in walk(argument, excluder, settings.respect_gitignore):
                if source.key not in seen:
                    seen.add(source.key)
                    files.append(source)
        elif path.is_file():
            if force_exclude and excluder.excludes(path):
                continue
            named = SourceFile(path, argument, named=True)
            if named.key not in seen:
                seen.add(named.key)
                files.append(named)
        else:
            reason = "no such file or directory" if not path.exists() and not path.is_symlink() else "not a file or directory"
            result.errors.append(f"{argument}: {reason}")
    return files


def check_paths(
    arguments: list[str],
    settings: Settings,
    *,
    use_cache: bool = True,
    jobs: int | None = None,
    force_exclude: bool = False,
) -> RunResult:
    result = RunResult()
    enabled = settings.enabled_codes(all_codes())
    files = collect_files(arguments, settings, force_exclude, result)
    cache = ResultCache(settings.root / ".amplint_cache", settings.fingerprint()) if use_cache else None
    pending: list[tuple[_Job, str, os.stat_result, str]] = []
    for source_file in files:
        result.files_checked += 1
        result.sources[source_file.display] = source_file
        key = source_file.key
        try:
            stat = source_file.path.stat()
            cached = cache.lookup_stat(key, stat) if cache else None
            if cached is not None:
                result.findings.extend(_with_path(cached, source_file.display))
                continue
            data = source_file.path.read_bytes()
        except OSError as exc:
            result.errors.append(f"{source_file.display}: cannot read: {exc.strerror or exc}")
            continue
        digest = content_hash(data)
        cached = cache.lookup_hash(key, stat, digest) if cache else None
        if cached is not None:
            result.findings.extend(_with_path(cached, source_file.display))
            continue
        possible = possible_rules(data, enabled)
        if not possible and not source_file.named:
            # In a folder, a file no rule can flag is decoded but not parsed: CPython's syntax
            # check of every file costs ~7x ruff's whole run on a large tree. A file named on the
            # command line (pre-commit, editors) always gets its syntax checked.
            found = _undecodable(data, source_file.display) if "AMP000" in enabled else []
            if cache:
                cache.store(key, stat, digest, [f.to_json() for f in found])
            result.findings.extend(found)
            continue
        codes = possible | (enabled & {"AMP000"})
        pending.append((_Job(source_file.display, data, codes, settings.min_torch), key, stat, digest))
    for (_job, key, stat, digest), found in zip(pending, _analyse_all([p[0] for p in pending], jobs)):
        if cache:
            cache.store(key, stat, digest, [f.to_json() for f in found])
        result.findings.extend(found)
    if cache:
        cache.save()
    result.findings = sorted(_apply_per_file_ignores(result.findings, settings), key=Finding.sort_key)
    return result


def check_stdin(source: bytes, display: str, settings: Settings) -> RunResult:
    enabled = settings.enabled_codes(all_codes())
    found = _analyse(_Job(display, source, possible_rules(source, enabled) | (enabled & {"AMP000"}), settings.min_torch))
    return RunResult(findings=_apply_per_file_ignores(found, settings), files_checked=1)


def _with_path(cached: list[dict], display: str) -> list[Finding]:
    return [Finding.from_json({**item, "path": display}) for item in cached]


def _analyse(job: _Job) -> list[Finding]:
    """The selected rules on one file; a file no rule can flag only gets CPython's syntax check."""
    if not job.codes - {"AMP000"}:
        return _syntax_only(job.source, job.display) if job.codes else []
    from amplint.static.analyse import analyse_source

    # libcst allocates hundreds of thousands of acyclic nodes per large file, and each burst of
    # allocations triggers a pass of the cyclic collector over all of them: ~20% of the time.
    # Reference counting frees the trees; any cycles are collected once it is back on.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return analyse_source(job.source, job.display, job.codes, job.min_torch)
    finally:
        if enabled:
            gc.enable()


def _analyse_all(jobs_to_run: list[_Job], workers: int | None) -> list[list[Finding]]:
    workers = workers or os.cpu_count() or 1
    total = sum(len(job.source) for job in jobs_to_run)
    if workers <= 1 or len(jobs_to_run) < 2 or total < _PARALLEL_MIN_BYTES:
        return [_analyse(job) for job in jobs_to_run]
    # Biggest files first so one large file does not finish last on its own.
    order = sorted(range(len(jobs_to_run)), key=lambda i: -len(jobs_to_run[i].source))
    import multiprocessing  # only a run big enough to share out pays for these imports
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs_to_run)), mp_context=context) as pool:
        results = list(pool.map(_analyse, [jobs_to_run[i] for i in order], chunksize=1))
    ordered: list[list[Finding]] = [[] for _ in jobs_to_run]
    for position, index in enumerate(order):
        ordered[index] = results[position]
    return ordered


def _undecodable(source: bytes, display: str) -> list[Finding]:
    """AMP000 for a file that cannot be decoded; no parse."""
    from amplint.static.source import SourceError, decode_source, parse_error_finding

    try:
        decode_source(source)
    except SourceError as error:
        return [parse_error_finding(display, error)]
    return []


def _syntax_only(source: bytes, display: str) -> list[Finding]:
    """AMP000 for a file no rule needs to analyse. CPython's own parser answers for almost every
    file without importing libcst; what it refuses is asked of libcst, the parser of record,
    which also reads syntax newer than the running Python (3.12's `def f[T]()`)."""
    from amplint.static.source import SourceError, decode_source, parse_error_finding

    try:
        text, _ = decode_source(source)
        ast.parse(text)
    except SourceError as error:
        return [parse_error_finding(display, error)]
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        from amplint.static.analyse import parse

        try:
            parse(text)
        except SourceError as error:
            return [parse_error_finding(display, error)]
    return []


def _apply_per_file_ignores(findings: list[Finding], settings: Settings) -> list[Finding]:
    if not settings.per_file_ignores:
        return findings
    import pathspec

    specs = [(pathspec.GitIgnoreSpec.from_lines([pattern]), codes) for pattern, codes in settings.per_file_ignores]
    kept = []
    for finding in findings:
        try:
            relative = Path(finding.path).resolve().relative_to(settings.root).as_posix()
        except ValueError:
            relative = Path(finding.path).as_posix()
        if not any(spec.match_file(relative) and any(finding.code.startswith(c) for c in codes) for spec, codes in specs):
            kept.append(finding)
    return kept
