"""Prove that speed never trades correctness: `amplint check` == the full analysis, file by file.

    python bench/check_stages.py [TREE] [--jobs N]

"Staged" is `amplint check TREE --no-cache` as a user runs it: the walk, the byte gates, the
screens, relevance slicing, worker processes. "Full" parses every Python file under TREE with
libcst and runs every rule on the whole file (a file without AMP code gets no syntax check in
a folder, as documented, so its AMP000 is left out). Findings (position, message and fix) must be the
same for every file; any difference is printed and the exit status is 1. TREE defaults to the
installed torch package. On it this takes a few minutes of CPU (the full analysis is the slow
part); `tests/test_stages.py` runs it on the fixtures and on the torch tree.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from amplint.static.analyse import analyse_source
from amplint.static.checks import all_checks
from amplint.static.discovery import PYTHON_SUFFIXES, SKIPPED_DIRS
from amplint.static.gate import possible_rules
from amplint.static.source import SourceError, decode_source

Key = tuple  # (code, line, column, end line, end column, message, fix)


def _key(finding: dict) -> Key:
    return tuple(finding[k] for k in ("code", "line", "column", "end_line", "end_column", "message")) + (
        json.dumps(finding["fix"], sort_keys=True),
    )


def staged(tree: Path, jobs: int) -> dict[str, list[Key]]:
    """What `amplint check` reports, by file; every rule on, .gitignore files not consulted."""
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "amplint.toml"
        config.write_text("respect-gitignore = false\n", encoding="utf-8")
        command = [sys.executable, "-m", "amplint", "check", str(tree), "--no-cache", "--exit-zero"]
        command += ["--format", "json", "--config", str(config), "--jobs", str(jobs)]
        result = subprocess.run(command, capture_output=True, text=True, cwd=folder, check=False)
    if result.returncode != 0:
        raise SystemExit(f"amplint check failed (exit {result.returncode}): {result.stderr.strip()}")
    found: dict[str, list[Key]] = defaultdict(list)
    for finding in json.loads(result.stdout):
        found[str(Path(finding["path"]).resolve())].append(_key(finding))
    return {path: sorted(keys) for path, keys in found.items()}


def full(path: Path) -> tuple[str, list[Key], float]:
    start = time.perf_counter()
    source = path.read_bytes()
    codes = frozenset({*all_checks(), "AMP000"})
    gc.disable()  # as amplint's workers do: libcst's trees are acyclic, and collecting them costs ~20%
    try:
        findings = analyse_source(source, str(path), codes, slicing=False)
    finally:
        gc.enable()
    if _without_amp_code(source, codes):
        # As documented (README, "Files with no AMP code"): in a folder, such a file is decoded
        # but its syntax is left to Python and the other linters.
        findings = [f for f in findings if f.code != "AMP000"]
    return str(path.resolve()), sorted(_key(f.to_json()) for f in findings), time.perf_counter() - start


def _without_amp_code(source: bytes, codes: frozenset[str]) -> bool:
    try:
        decode_source(source)
    except SourceError:
        return False  # reported in a folder too
    return not possible_rules(source, codes)


def python_files(tree: Path) -> list[Path]:
    """The files a walk checks, biggest first so that workers finish together."""
    files = [
        p for p in tree.rglob("*")
        if p.suffix in PYTHON_SUFFIXES and p.is_file() and not SKIPPED_DIRS.intersection(p.relative_to(tree).parts[:-1])
    ]
    return sorted(files, key=lambda p: -p.stat().st_size)


def compare(tree: Path, jobs: int) -> int:
    """Print every file whose findings differ and a summary line; the number of such files."""
    start = time.perf_counter()
    reported = staged(tree, jobs)
    staged_seconds = time.perf_counter() - start
    files = python_files(tree)
    differences = findings = 0
    full_seconds = 0.0
    with ProcessPoolExecutor(jobs) as pool:
        for path, expected, seconds in pool.map(full, files):
            full_seconds += seconds
            findings += len(expected)
            got = reported.pop(path, [])
            if got != expected:
                differences += 1
                print(f"DIFFERENT {path}\n  full:   {expected}\n  staged: {got}")
    for path, got in reported.items():  # reported for a file the full analysis never saw
        differences += 1
        print(f"DIFFERENT {path}\n  full:   (not a file under the tree)\n  staged: {got}")
    print(
        f"{len(files)} files, {findings} findings; {differences} files differ; "
        f"full analysis {full_seconds:.1f} s of CPU, amplint check {staged_seconds:.1f} s"
    )
    return differences


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tree", nargs="?", type=Path)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    if args.tree is None:
        import importlib.util

        args.tree = Path(importlib.util.find_spec("torch").submodule_search_locations[0])
    return 1 if compare(args.tree.resolve(), args.jobs) else 0


if __name__ == "__main__":
    sys.exit(main())
