"""A whole check run: discovery, cache, the byte gate, parallel analysis, per-file ignores."""

from __future__ import annotations

import errno
import gc
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
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
    # display path -> the settings of a project nested below a walked folder, or the walked ones
    # with the oldest torch of a sub-project's requirements, for its files only
    nested: dict[str, Settings] = field(default_factory=dict)

    def settings_for(self, display: str, default: Settings) -> Settings:
        return self.nested.get(display, default)


@dataclass(frozen=True)
class _Job:
    display: str
    source: bytes
    codes: frozenset[str]
    min_torch: tuple[int, ...] | None = None
    named: bool = True  # named on the command line (or stdin): its syntax is always checked


@dataclass(frozen=True)
class _Task:
    """A file the cache could not answer by its stat: read, hashed, gated and analysed where
    the work is shared out, so the main process only walks the tree."""

    key: str  # its absolute path: what it is read from and cached under
    display: str
    named: bool
    enabled: frozenset[str]
    min_torch: tuple[int, ...] | None
    previous: tuple[str, list[dict]] | None  # cached digest and findings, reused if the bytes match
    cached: bool = True  # its result is stored: it needs the digest of its bytes


@dataclass
class _Outcome:
    findings: list[Finding]
    digest: str = ""
    error: str | None = None


def all_codes() -> list[str]:
    from amplint.catalogue import catalogue

    return sorted(catalogue())


def collect_files(
    arguments: list[str], settings: Settings, force_exclude: bool, result: RunResult, elsewhere: frozenset[str] = frozenset()
) -> list[SourceFile]:
    """Files to check: those named, and the Python files below the folders named, except those
    `elsewhere` (the keys of files named on the command line and checked under other settings)."""
    excluder = Excluder(settings.exclude, settings.root)
    files: list[SourceFile] = []
    seen: dict[str, int] = {}  # key -> its place in `files`
    for argument in arguments:
        path = Path(argument)
        if path.is_dir():
            if force_exclude and excluder.excludes(path, is_dir=True):
                continue
            for source in walk(argument, excluder, settings.respect_gitignore, result.errors):
                if source.key not in elsewhere:
                    _add_once(files, seen, source)
        elif path.is_file():
            if force_exclude and excluder.excludes(path):
                continue
            _add_once(files, seen, SourceFile(path, argument, named=True))
        else:
            if path.is_symlink() and not path.exists():
                reason = _broken_link(path)
            else:
                reason = "no such file or directory" if not path.exists() else "not a file or directory"
            result.errors.append(f"{argument}: {reason}")
    return files


def _broken_link(path: Path) -> str:
    """Why a symbolic link leads nowhere: its target is missing, or the links go round in a loop."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link in a loop of links"
    return f"a symbolic link to {os.readlink(path)}, which does not exist"


def _add_once(files: list[SourceFile], seen: dict[str, int], source: SourceFile) -> None:
    """A file reached twice (through a link) is checked once: as named on the command line, else
    under its own name rather than a link's found in a folder, so that findings, SARIF locations
    and patches name the file that holds the code (`git apply` does not patch through a link)."""
    place = seen.get(source.key)
    if place is None:
        seen[source.key] = len(files)
        files.append(source)
    elif not files[place].named and files[place].path.is_symlink() and not source.path.is_symlink():
        files[place] = source


def check_paths(
    arguments: list[str],
    settings: Settings,
    *,
    use_cache: bool = True,
    jobs: int | None = None,
    force_exclude: bool = False,
    elsewhere: frozenset[str] = frozenset(),
    nearest: Callable[[str], Settings] | None = None,
) -> RunResult:
    """`nearest(folder)`: the settings of the nearest configuration above a resolved folder. Given, a file
    found in a folder that lies in a project nested below `settings`' own (its own
    pyproject.toml with [tool.amplint]) is checked under that project's settings, as ruff does;
    files named on the command line were grouped by their own settings already."""
    result = RunResult()
    codes = all_codes()
    files = collect_files(arguments, settings, force_exclude, result, elsewhere)
    caches: dict[tuple[Path, str], ResultCache] = {}
    excluders: dict[Path | None, Excluder] = {}  # a nested project's `exclude`, from its folder
    enabled: dict[int, frozenset[str]] = {}  # id(settings) -> its rules: 0.1 s a tree if asked per file
    # The walked settings with a sub-project's oldest torch: a folder of examples whose own
    # requirements pin an older torch than the root's (`app/requirements.txt: torch==1.13.1`).
    bounded: dict[tuple[int, ...] | None, Settings] = {settings.min_torch: settings}
    tasks: list[_Task] = []
    stats: list[os.stat_result] = []
    entries: list[tuple[ResultCache | None, str]] = []  # each task's cache and key in it
    for source_file in files:
        own = settings if nearest is None or source_file.named else nearest(os.path.dirname(source_file.key))
        if own.source != settings.source:
            if own.source not in excluders:
                excluders[own.source] = Excluder(own.exclude, own.root)
            if excluders[own.source].excludes(source_file.path):
                continue
            result.nested[source_file.display] = own
        else:
            if own.min_torch not in bounded:
                bounded[own.min_torch] = replace(settings, min_torch=own.min_torch)
            own = bounded[own.min_torch]
            if own is not settings:
                result.nested[source_file.display] = own  # what its fixes are written for
        result.files_checked += 1
        result.sources[source_file.display] = source_file
        try:
            stat = source_file.path.stat()
        except OSError as exc:
            result.errors.append(f"{source_file.display}: cannot read: {exc.strerror or exc}")
            continue
        cache = _cache_of(caches, own) if use_cache else None
        entry = _cache_key(source_file.key, source_file.named)
        cached = cache.lookup_stat(entry, stat) if cache else None
        if cached is not None:
            result.findings.extend(_with_path(cached, source_file.display))
            continue
        previous = cache.previous(entry) if cache else None
        if id(own) not in enabled:
            enabled[id(own)] = own.enabled_codes(codes)
        tasks.append(_Task(source_file.key, source_file.display, source_file.named, enabled[id(own)], own.min_torch, previous, cache is not None))
        stats.append(stat)
        entries.append((cache, entry))
    for task, stat, (cache, entry), outcome in zip(tasks, stats, entries, _check_all(tasks, stats, jobs)):
        if outcome.error is not None:
            result.errors.append(f"{task.display}: cannot read: {outcome.error}")
            continue
        if cache:
            cache.store(entry, stat, outcome.digest, [f.to_json() for f in outcome.findings])
        result.findings.extend(outcome.findings)
    for cache in caches.values():
        cache.save()
    kept = [f for f in result.findings if _not_ignored(f, result.settings_for(f.path, settings))]
    result.findings = sorted(kept, key=Finding.sort_key)
    return result


def _cache_of(caches: dict[tuple[Path, str], ResultCache], settings: Settings) -> ResultCache:
    """One cache per project, in its own folder, as ruff keeps one per project."""
    key = (settings.root, settings.fingerprint())
    if key not in caches:
        caches[key] = ResultCache(settings.root / ".amplint_cache", key[1])
    return caches[key]


def check_stdin(source: bytes, display: str, settings: Settings) -> RunResult:
    enabled = settings.enabled_codes(all_codes())
    found = _analyse(_Job(display, source, possible_rules(source, enabled) | (enabled & {"AMP000"}), settings.min_torch))
    return RunResult(findings=[f for f in found if _not_ignored(f, settings)], files_checked=1)


def _cache_key(path: str, named: bool) -> str:
    """A file named on the command line gets a syntax check a file found in a folder may not
    (README, "Files with no AMP code"): its results are kept apart."""
    return f"{path}\0named" if named else path


def _with_path(cached: list[dict], display: str) -> list[Finding]:
    return [Finding.from_json({**item, "path": display}) for item in cached]


def _analyse(job: _Job) -> list[Finding]:
    """The selected rules on one file; a file no rule can flag only gets CPython's syntax check."""
    if not job.codes - {"AMP000"}:
        return _syntax_only(job.source, job.display) if job.codes else []
    # libcst allocates hundreds of thousands of acyclic nodes per large file (and thousands of
    # classes when it is imported), and each burst of allocations triggers a pass of the cyclic
    # collector over all of them: ~20% of the time. Reference counting frees the trees; any
    # cycles are collected once it is back on.
    enabled = gc.isenabled()
    gc.disable()
    try:
        from amplint.static.analyse import analyse_source

        return analyse_source(job.source, job.display, job.codes, job.min_torch, check_syntax=job.named)
    finally:
        if enabled:
            gc.enable()


def _check_file(task: _Task) -> _Outcome:
    try:
        with open(task.key, "rb", buffering=0) as handle:  # one read, no buffer: half of Path.read_bytes()
            data = handle.read()
    except OSError as exc:
        return _Outcome([], error=exc.strerror or str(exc))
    digest = content_hash(data) if task.cached else ""
    if task.previous is not None and task.previous[0] == digest:  # touched, not changed
        return _Outcome(_with_path(task.previous[1], task.display), digest)
    possible = possible_rules(data, task.enabled)
    if not possible and not task.named:
        # In a folder, a file no rule can flag is decoded but not parsed: CPython's syntax check
        # of every file costs ~10x ruff's whole run on a large tree. A file named on the command
        # line (pre-commit, editors) always gets its syntax checked.
        return _Outcome(_undecodable(data, task.display) if "AMP000" in task.enabled else [], digest)
    codes = possible | (task.enabled & {"AMP000"})
    return _Outcome(_analyse(_Job(task.display, data, codes, task.min_torch, task.named)), digest)


def _check_batch(batch: list[_Task]) -> list[_Outcome]:
    return [_check_file(task) for task in batch]


# Files this large go to a worker on their own; smaller ones travel in batches of this many.
_ALONE_BYTES = 32_000
_BATCH = 16


def _check_all(tasks: list[_Task], stats: list[os.stat_result], workers: int | None) -> list[_Outcome]:
    workers = workers or os.cpu_count() or 1
    if workers <= 1 or len(tasks) < 2 or sum(s.st_size for s in stats) < _PARALLEL_MIN_BYTES:
        return [_check_file(task) for task in tasks]
    # Biggest files first, each alone, so that one large file does not finish last on its own;
    # then the small ones in batches, so that a tree of thousands costs few round trips.
    order = sorted(range(len(tasks)), key=lambda i: -stats[i].st_size)
    alone = [[i] for i in order if stats[i].st_size >= _ALONE_BYTES]
    small = [i for i in order if stats[i].st_size < _ALONE_BYTES]
    batches = alone + [small[k : k + _BATCH] for k in range(0, len(small), _BATCH)]
    import multiprocessing  # only a run big enough to share out pays for these imports
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    outcomes: list[_Outcome | None] = [None] * len(tasks)
    with ProcessPoolExecutor(max_workers=min(workers, len(batches)), mp_context=context) as pool:
        for batch, results in zip(batches, pool.map(_check_batch, [[tasks[i] for i in b] for b in batches])):
            for index, outcome in zip(batch, results):
                outcomes[index] = outcome
    return outcomes


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
    from amplint.static.source import (
        TOO_DEEP_FOR_PYTHON,
        SourceError,
        decode_source,
        nesting_error,
        parse_error_finding,
        python_tree,
    )

    try:
        text, _ = decode_source(source)
        python_tree(text)
    except SourceError as error:
        return [parse_error_finding(display, error)]
    except (RecursionError, MemoryError):
        return [parse_error_finding(display, SourceError(TOO_DEEP_FOR_PYTHON))]
    except (SyntaxError, ValueError) as error:
        too_deep = nesting_error(error)
        if too_deep is not None:
            return [parse_error_finding(display, too_deep)]
        from amplint.static.analyse import parse

        try:
            parse(text)
        except SourceError as error:
            return [parse_error_finding(display, error)]
    return []


def _not_ignored(finding: Finding, settings: Settings) -> bool:
    ignored = settings.ignored_for(finding.path)
    return not any(finding.code.startswith(prefix) for prefix in ignored)
