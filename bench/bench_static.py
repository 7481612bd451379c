"""Benchmark the static checker against ruff and TorchFix on the same trees, side by side.

Run by hand (numbers depend on the machine; timed tests would be flaky):

    python bench/bench_static.py                  # torch's own sources, 5 rounds
    python bench/bench_static.py --rounds 3 --torchfix-runs 1 --tree /path/to/tree

Each round runs every command once, alternating, so a busy machine slows them alike; the table
shows medians of wall time and of peak resident memory (GNU time's %M: the largest process), and
ratios against ruff measured in the same run. TorchFix takes minutes, so it runs on the files of
the tree that mention AMP (the "amp subset"), against amplint on the same files.

Commands run as an installed tool does, with Python's bytecode cache (pip compiles it at install;
an editable install writes it on first import): PYTHONDONTWRITEBYTECODE, set on some machines,
is left out of their environment, and a first run outside the measurements writes the cache.
Without it every run compiles amplint's modules again (0.1 s of the training script's 0.5 s).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

AMP_WORDS = re.compile(rb"autocast|GradScaler|\bamp\b")
HERE = Path(__file__).resolve().parent


def torch_tree() -> Path:
    found = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; print(u.find_spec('torch').submodule_search_locations[0])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(found.stdout.strip())


def copy_python_files(source: Path, target: Path, only_amp: bool = False) -> int:
    count = 0
    for path in source.rglob("*.py"):
        if only_amp and not AMP_WORDS.search(path.read_bytes()):
            continue
        destination = target / path.relative_to(source)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, destination)
        count += 1
    return count


_INSTALLED = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}


def measure(command: list[str], cwd: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS in MiB of one run."""
    timer = ["/usr/bin/time", "-f", "%M"] if Path("/usr/bin/time").exists() else []
    start = time.perf_counter()
    done = subprocess.run([*timer, *command], cwd=cwd, capture_output=True, text=True, env=_INSTALLED)
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    peak = float(done.stderr.strip().splitlines()[-1]) / 1024 if timer else float("nan")
    return wall, peak


def row(name: str, runs: list[tuple[float, float]], reference: float | None) -> str:
    wall = statistics.median(w for w, _ in runs)
    peak = statistics.median(m for _, m in runs)
    ratio = f"{wall / reference:8.2f}x" if reference else " " * 9
    return f"| {name:<44} | {len(runs):>4} | {wall:9.3f} | {peak:8.0f} | {ratio} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, help="tree to check (default: the installed torch package)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--torchfix-runs", type=int, default=1, help="0 skips TorchFix")
    args = parser.parse_args()

    # The console script, not `python -m`: that would put the tree (torch has a types.py) on sys.path.
    amplint = [str(Path(sys.executable).with_name("amplint"))]
    beside = Path(sys.executable).with_name("ruff")  # the bench extra installs it in the same environment
    found = str(beside) if beside.exists() else shutil.which("ruff")
    missing = [name for name, there in (("ruff", found), ("torchfix", importlib.util.find_spec("torchfix"))) if not there]
    if "ruff" in missing or ("torchfix" in missing and args.torchfix_runs):
        sys.exit(f"bench_static: {' and '.join(missing)} not installed: pip install -e '.[bench]' (or --torchfix-runs 0)")
    ruff = [found]
    with tempfile.TemporaryDirectory(prefix="amplint-bench-") as scratch:
        root = Path(scratch)
        tree, subset = root / "tree", root / "amp"
        files = copy_python_files(args.tree or torch_tree(), tree)
        amp_files = copy_python_files(tree, subset, only_amp=True)
        precommit = root / "precommit"
        precommit.mkdir()
        shutil.copy(HERE / "data" / "train_300_lines.py", precommit / "train.py")
        shutil.copy(HERE / "data" / "no_amp.py", precommit / "utils.py")
        print(f"tree: {files} files; amp subset: {amp_files} files; machine: {os.cpu_count()} CPUs\n")

        commands = {
            "ruff check --select F --no-cache (tree)": (ruff + ["check", "--select", "F", "--no-cache", "-q", "."], tree),
            "ruff check --select F, warm cache (tree)": (ruff + ["check", "--select", "F", "-q", "."], tree),
            "amplint --no-cache (tree, cold)": (amplint + ["--no-cache", "-q", "--format", "concise", "."], tree),
            "amplint --no-cache --jobs 1 (tree, cold)": (amplint + ["--no-cache", "-j", "1", "-q", "--format", "concise", "."], tree),
            "amplint, warm cache (tree)": (amplint + ["-q", "--format", "concise", "."], tree),
            "amplint --no-cache (amp subset)": (amplint + ["--no-cache", "-q", "--format", "concise", "."], subset),
            "amplint, one 300-line script with findings": (amplint + ["--no-cache", "-q", "train.py"], precommit),
            "amplint, one file without AMP code": (amplint + ["--no-cache", "-q", "utils.py"], precommit),
        }
        # Prime the warm caches (and the bytecode cache) once, outside the measurements.
        measure(commands["ruff check --select F, warm cache (tree)"][0], tree)
        measure(commands["amplint, warm cache (tree)"][0], tree)
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for round_number in range(args.rounds):
            for name, (command, cwd) in commands.items():
                results[name].append(measure(command, cwd))
            print(f"round {round_number + 1}/{args.rounds} done", file=sys.stderr)
        torchfix_runs = []
        for _ in range(args.torchfix_runs):
            torchfix_runs.append(measure([sys.executable, "-m", "torchfix", "."], subset))

        ruff_cold = statistics.median(w for w, _ in results["ruff check --select F --no-cache (tree)"])
        ruff_warm = statistics.median(w for w, _ in results["ruff check --select F, warm cache (tree)"])
        print("| command | runs | wall s (median) | peak MiB | ratio |")
        print("|---|---|---|---|---|")
        for name, runs in results.items():
            reference = ruff_warm if "warm" in name else ruff_cold if "tree" in name else None
            print(row(name, runs, reference))
        if torchfix_runs:
            torchfix = statistics.median(w for w, _ in torchfix_runs)
            amp = statistics.median(w for w, _ in results["amplint --no-cache (amp subset)"])
            print(row("torchfix (amp subset)", torchfix_runs, None))
            print(f"\namplint is {torchfix / amp:.1f}x faster than TorchFix on the amp subset.")
        print("Ratios: cold rows against ruff --no-cache, warm rows against ruff's warm cache.")


if __name__ == "__main__":
    main()
