"""Prove that speed never trades correctness: staged results == full analysis, file by file.

    python bench/check_stages.py [TREE] [--jobs N]

"Full" parses every file with libcst and runs every rule on the whole file; "staged" is what
`amplint check` does (byte gate per rule, syntax-only for files no rule can flag, relevance
slicing of large files). Any difference is printed and the exit status is 1. On the torch tree
this takes minutes (the full analysis is the slow part); the test suite runs the same
comparison on every fixture and on large synthetic files (tests/test_slicing.py, test_gate.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from amplint.static.analyse import analyse_source
from amplint.static.checks import all_checks
from amplint.static.discovery import PYTHON_SUFFIXES
from amplint.static.gate import possible_rules
from amplint.static.runner import _analyse, _Job


def _key(findings) -> list[tuple]:
    return sorted((f.code, f.line, f.column, f.end_line, f.end_column, f.message) for f in findings)


def compare(path: Path) -> tuple[str, list[tuple], list[tuple], float, float]:
    source = path.read_bytes()
    codes = frozenset({*all_checks(), "AMP000"})
    start = time.perf_counter()
    full = _key(analyse_source(source, str(path), codes, slicing=False))
    middle = time.perf_counter()
    staged = _key(_analyse(_Job(str(path), source, possible_rules(source, codes) | {"AMP000"})))
    return str(path), full, staged, middle - start, time.perf_counter() - middle


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tree", nargs="?", type=Path)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    if args.tree is None:
        import importlib.util

        args.tree = Path(importlib.util.find_spec("torch").submodule_search_locations[0])
    files = sorted(p for p in args.tree.rglob("*") if p.suffix in PYTHON_SUFFIXES and p.is_file())
    differences = findings = 0
    full_seconds = staged_seconds = 0.0
    with ProcessPoolExecutor(args.jobs) as pool:
        for path, full, staged, full_time, staged_time in pool.map(compare, files, chunksize=4):
            full_seconds += full_time
            staged_seconds += staged_time
            findings += len(full)
            if full != staged:
                differences += 1
                print(f"DIFFERENT {path}\n  full:   {full}\n  staged: {staged}")
    print(
        f"{len(files)} files, {findings} findings; {differences} files differ; "
        f"analysis CPU time: full {full_seconds:.1f} s, staged {staged_seconds:.1f} s"
    )
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
