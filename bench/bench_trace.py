"""Overhead of `amplint trace` against the same script run plainly.

The workload: a small CNN (3 conv blocks + linear, 32x32 RGB, batch 32), bf16 autocast on CPU,
SGD with momentum, 60 steps, one thread. Each configuration runs in its own process, interleaved,
`--repeats` times; the median CPU time is reported two ways:
  loop     CPU seconds of the 60 training steps, measured by the script itself (the steady-state
           cost per step, what a long run pays)
  process  CPU seconds of the whole child process (torch import and tracer start-up included)

    python bench/bench_trace.py [--repeats 5] [--steps 60] [--json out.json]

Targets (issue 5): default mode <= 1.3x, `--nan module` <= 2x.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

WORKLOAD = '''
import os, sys, time
import torch
from torch import nn

torch.set_num_threads(1)
torch.manual_seed(0)
steps = int(sys.argv[1])

def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2))

model = nn.Sequential(block(3, 16), block(16, 32), block(32, 64), nn.Flatten(), nn.Linear(64 * 4 * 4, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
data = [(torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))) for _ in range(8)]

start = time.process_time()
for step in range(steps):
    x, y = data[step % len(data)]
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
loop = time.process_time() - start
with open(os.environ["BENCH_OUT"], "w") as handle:
    handle.write(repr(loop))
'''

CONFIGS = {
    "plain": [],
    "trace (default: ops + cheap NaN checks)": ["-m", "amplint", "trace", "-q"],
    "trace --nan module": ["-m", "amplint", "trace", "-q", "--nan", "module"],
    "trace --nan op": ["-m", "amplint", "trace", "-q", "--nan", "op"],
}


def run_once(prefix: list[str], script: str, steps: int, folder: str) -> tuple[float, float]:
    out = os.path.join(folder, "loop.txt")
    env = dict(os.environ, BENCH_OUT=out, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    command = [sys.executable, *prefix, script, str(steps)] if prefix else [sys.executable, script, str(steps)]
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=folder)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    process = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with open(out) as handle:
        return float(handle.read()), process


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--configs", help="comma-separated subset: plain,default,module,op")
    args = parser.parse_args()
    chosen = dict(CONFIGS)
    if args.configs:
        keys = {"plain": "plain", "default": list(CONFIGS)[1], "module": list(CONFIGS)[2], "op": list(CONFIGS)[3]}
        chosen = {keys[k]: CONFIGS[keys[k]] for k in ["plain", *args.configs.split(",")] if k in keys}

    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "cnn_bf16.py")
        with open(script, "w") as handle:
            handle.write(WORKLOAD)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in chosen}
        for _ in range(args.repeats):  # interleaved, so load changes hit every config alike
            for name, prefix in chosen.items():
                samples[name].append(run_once(prefix, script, args.steps, folder))

    plain_loop = statistics.median(s[0] for s in samples["plain"])
    plain_process = statistics.median(s[1] for s in samples["plain"])
    results = {}
    print(f"{args.steps} steps, {args.repeats} runs each, median CPU seconds (ratio to plain)")
    print(f"{'configuration':44} {'loop':>16} {'process':>16}")
    for name, runs in samples.items():
        loop = statistics.median(s[0] for s in runs)
        process = statistics.median(s[1] for s in runs)
        results[name] = {
            "loop_s": loop,
            "process_s": process,
            "loop_ratio": loop / plain_loop,
            "process_ratio": process / plain_process,
            "ms_per_step": 1000 * loop / args.steps,
        }
        print(f"{name:44} {loop:7.3f} ({loop / plain_loop:4.2f}x) {process:7.3f} ({process / plain_process:4.2f}x)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"steps": args.steps, "repeats": args.repeats, "results": results}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
