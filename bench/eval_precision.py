"""Per-rule precision and recall of the static checker on hand-labelled files.

Usage: python bench/eval_precision.py DIR [DIR...] [--rules AMP001,AMP002,...]

Every `*.py` under DIR needs a sibling `*.expected` listing its true findings as `CODE LINE`
lines (empty: a clean file). A finding counts as a true positive when code and line match.
Run it on files that were labelled before the rules were tuned on them (a held-out set), or on
local copies of public training scripts; do not commit fetched code.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from amplint.static.api import lint_source

DEFAULT_RULES = ("AMP001", "AMP002", "AMP003", "AMP004", "AMP005")


def labelled(path: Path) -> set[tuple[str, int]]:
    words = path.with_suffix(".expected").read_text(encoding="utf-8").split()
    return {(code, int(line)) for code, line in zip(words[0::2], words[1::2])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--rules", default=",".join(DEFAULT_RULES))
    parser.add_argument("--verbose", "-v", action="store_true", help="print every mismatch")
    args = parser.parse_args(argv)
    rules = tuple(args.rules.split(","))
    tp, fp, fn = Counter(), Counter(), Counter()
    files = sorted(p for d in args.dirs for p in d.rglob("*.py") if p.with_suffix(".expected").exists())
    for path in files:
        truth = {f for f in labelled(path) if f[0] in rules}
        found = {(f.code, f.line) for f in lint_source(path.read_bytes(), str(path), set(rules))}
        for code, line in found & truth:
            tp[code] += 1
        for code, line in found - truth:
            fp[code] += 1
            if args.verbose:
                print(f"FP {path}:{line} {code}")
        for code, line in truth - found:
            fn[code] += 1
            if args.verbose:
                print(f"FN {path}:{line} {code}")
    print(f"{len(files)} files")
    print(f"{'rule':<8} {'TP':>4} {'FP':>4} {'FN':>4} {'precision':>10} {'recall':>8}")
    for code in rules:
        t, f, n = tp[code], fp[code], fn[code]
        precision = t / (t + f) if t + f else 1.0
        recall = t / (t + n) if t + n else 1.0
        print(f"{code:<8} {t:>4} {f:>4} {n:>4} {precision:>10.3f} {recall:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
