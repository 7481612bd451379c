#!/usr/bin/env bash
# The tracer's CUDA checks in one command (issue 5, item 9). Needs a CUDA GPU and a CUDA build of
# torch; run from the repository root:
#
#     bench/gpu_check.sh            # or PYTHON=/path/to/python bench/gpu_check.sh
#
# It traces small CUDA training scripts through the real CLI and checks the reports:
#   1. fp16 autocast + GradScaler on CUDA: op dtypes follow the CUDA policy (mm in float16,
#      softmax/layer_norm in float32), scaler steps/skips are counted, no policy departures;
#   2. bf16 autocast on CUDA (skipped, with a note, where the GPU has no bf16);
#   3. --nan op on CUDA: the first non-finite op is found at the known line and step;
#   4. the kernel probe on CUDA (--probe-dtype float16,bfloat16 --probe-device cuda): every
#      signature gets a real answer (nothing "unverified"), missing kernels are listed;
#   5. --simulate cuda (run on CPU) agrees with what the real CUDA run recorded;
#   6. amplint compare on CUDA: both trials validated, then timed with CUDA events and measured
#      with the CUDA allocator's peak (the gains pass that never runs on a CPU-only machine).
# Exit status: 0 all checks passed, 1 a check failed, 2 no GPU (nothing checked).
set -u
PYTHON="${PYTHON:-python}"
cd "$(dirname "$0")/.."
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check: no CUDA device visible to $PYTHON (torch.cuda.is_available() is False): nothing checked"
    exit 2
fi

cat > "$WORK/cuda_fp16.py" <<'EOF'
import torch
from torch import nn
torch.manual_seed(0)
dev = "cuda"
model = nn.Sequential(nn.Linear(64, 128), nn.LayerNorm(128), nn.GELU(), nn.Linear(128, 10)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cuda", init_scale=2.0**24)
for step in range(8):
    x, y = torch.randn(32, 64, device=dev), torch.randint(0, 10, (32,), device=dev)
    opt.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        logits = model(x)  # line 12
        probs = torch.softmax(logits, dim=-1)  # line 13
        loss = nn.functional.cross_entropy(logits, y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
EOF

cat > "$WORK/cuda_bf16.py" <<'EOF'
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(4):
    x, y = torch.randn(32, 64, device="cuda"), torch.randint(0, 10, (32,), device="cuda")
    opt.zero_grad()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(x), y)  # line 10
    loss.backward()
    opt.step()
EOF

cat > "$WORK/cuda_overflow.py" <<'EOF'
import torch
from torch import nn
fc1 = nn.Linear(8, 16).cuda()
nn.init.constant_(fc1.weight, 1.0)
opt = torch.optim.SGD(fc1.parameters(), lr=1e-6)
for step in range(5):
    x = torch.full((4, 8), 1e4 if step == 3 else 1.0, device="cuda")
    opt.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        h = fc1(x)  # line 10: inf at step 3
        loss = h.float().mean()
    loss.backward()
    opt.step()
EOF

cat > "$WORK/cuda_probe.py" <<'EOF'
import torch
x = torch.randn(16, 16, device="cuda")
a = torch.special.zeta(x.abs() + 2, 2.0)
b = torch.linalg.inv(x + 16 * torch.eye(16, device="cuda"))
c = torch.fft.rfft(x)
d = torch.cdist(x, x)
print(float(a.sum() + b.sum() + c.abs().sum() + d.sum()) != 0)
EOF

cp fixtures/runtime/simulate_policy.py "$WORK/sim_cpu.py"
sed -e 's/torch.autocast("cpu"/torch.autocast("cuda"/' -e 's/^model = \(.*\)$/model = \1.cuda()/' \
    -e 's/torch.randn(4, 8)/torch.randn(4, 8, device="cuda")/' fixtures/runtime/simulate_policy.py > "$WORK/sim_cuda.py"

run() { "$PYTHON" -m amplint trace -q "$@"; }
run --json "$WORK/fp16.json" "$WORK/cuda_fp16.py" || echo "trace of cuda_fp16.py exited $?"
run --json "$WORK/bf16.json" "$WORK/cuda_bf16.py" || echo "trace of cuda_bf16.py exited $?"
run --nan op --json "$WORK/overflow.json" "$WORK/cuda_overflow.py" || echo "trace of cuda_overflow.py exited $?"
run --probe-dtype float16,bfloat16 --probe-device cuda --json "$WORK/probe.json" "$WORK/cuda_probe.py" || echo "trace of cuda_probe.py exited $?"
CUDA_VISIBLE_DEVICES="" run --simulate cuda --json "$WORK/sim.json" "$WORK/sim_cpu.py" || echo "trace of sim_cpu.py exited $?"
run --json "$WORK/sim_real.json" "$WORK/sim_cuda.py" || echo "trace of sim_cuda.py exited $?"
"$PYTHON" -m amplint compare fixtures/compare/visible_difference.py --device cuda --json "$WORK/compare.json" \
    || echo "compare on cuda exited $?"

"$PYTHON" - "$WORK" <<'EOF'
import json, os, sys
import torch

work = sys.argv[1]
failures = 0


def load(name):
    path = os.path.join(work, name)
    return json.load(open(path)) if os.path.exists(path) else None


def check(label, ok, detail=""):
    global failures
    print(f"{'PASS' if ok else 'FAIL'}  {label}" + (f"  ({detail})" if detail else ""))
    failures += 0 if ok else 1


def rows(report, line, op):
    return [r for r in report["ops"] if r["line"] == line and r["op"] == op and r["phase"] == "forward"]


print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}, HIP {torch.version.hip}")
r = load("fp16.json")
check("fp16: report written", r is not None)
if r:
    check("fp16: environment says cuda", r["environment"]["device"] == "cuda", r["environment"])
    mm = rows(r, 12, "aten::addmm")
    check("fp16: linear's addmm ran in float16 under cuda autocast", bool(mm) and all(x["output_dtypes"] == ["float16"] and x["autocast"] == {"device": "cuda", "dtype": "float16"} for x in mm), mm)
    ln = [x for x in r["ops"] if x["line"] == 12 and x["op"] == "aten::native_layer_norm"]
    check("fp16: layer_norm ran in float32 (CUDA policy)", bool(ln) and ln[0]["output_dtypes"][0] == "float32", ln)
    sm = rows(r, 13, "aten::_softmax")
    check("fp16: softmax ran in float32 (CUDA policy)", bool(sm) and sm[0]["output_dtypes"] == ["float32"], sm)
    s = r["scaler"]
    check("fp16: 8 scaler steps counted, skips + applied add up", s["steps_attempted"] == 8 and s["steps_applied"] + s["steps_skipped"] == 8, s)
    check("fp16: init_scale 2**24 overflowed at least once and backed off", s["steps_skipped"] >= 1 and min(s["scale_history"]) < 2.0**24, s["scale_history"])
    check("fp16: no policy departures", r["policy_departures"] == [], r["policy_departures"][:3])

r = load("bf16.json")
if not torch.cuda.is_bf16_supported():
    print("SKIP  bf16: this GPU has no bfloat16 support")
elif r is None:
    check("bf16: report written", False)
else:
    mm = rows(r, 10, "aten::addmm")
    check("bf16: addmm ran in bfloat16 under cuda autocast", bool(mm) and all(x["output_dtypes"] == ["bfloat16"] for x in mm), mm)
    check("bf16: AMP003 not confirmed (backward outside autocast)", not [f for f in r["findings"] if f["status"] == "confirmed"], r["findings"])

r = load("overflow.json")
nf = r and r["nonfinite"]
check("--nan op: first non-finite op is fc1's addmm at line 10, step 3, forward, float16",
      bool(nf) and (nf["op"], nf["line"], nf["step"], nf["phase"], nf["dtype"]) == ("aten::addmm", 10, 3, "forward", "float16"), nf)

r = load("probe.json")
if r:
    kernels = r["kernels"]
    check("probe: every signature answered on cuda (nothing unverified)", kernels and all(k["status"] != "unverified" for k in kernels), len(kernels))
    for k in kernels:
        if k["available"] is False:
            print(f"      missing on cuda: {k['op']} {k['dtype']}: {k['error']}")
else:
    check("probe: report written", False)

sim, real = load("sim.json"), load("sim_real.json")
if sim and real:
    simulated = {(c["line"], c["function"]): c["simulated_output_dtypes"] for c in sim["simulation"]["calls"]}
    want = {"torch.softmax": "aten::_softmax", "torch.nn.functional.layer_norm": "aten::native_layer_norm", "torch.nn.functional.linear": "aten::addmm"}
    for (line, function), dtypes in sorted(simulated.items()):
        op = want.get(function)
        if not op:
            continue
        seen = [x["output_dtypes"][0] for x in real["ops"] if x["line"] == line and x["op"] == op and x["phase"] == "forward"]
        check(f"simulate: {function} at line {line} simulated {dtypes[0]}, real CUDA ran {seen}", bool(seen) and seen[0] == dtypes[0])
else:
    check("simulate: both reports written", False)

r = load("compare.json")
if r:
    check("compare: ran on cuda", r["device"].startswith("cuda") and r["environment"]["gpu"] is not None, (r["device"], r["environment"]))
    for t in r["trials"]:
        timing, memory = t["timing"] or {}, t["memory"] or {}
        check(f"compare: {t['dtype']} passed, timed and measured on cuda",
              t["passed"] and timing.get("baseline_ms", 0) > 0 and timing.get("trial_ms", 0) > 0
              and (memory.get("baseline_bytes") or 0) > 0 and (memory.get("trial_bytes") or 0) > 0,
              (t["failed_criteria"], timing, memory))
else:
    check("compare: report written", False)

print(f"{failures} check(s) failed" if failures else "all CUDA checks passed")
sys.exit(1 if failures else 0)
EOF
status=$?
# KEEP_REPORTS=FILE.tar.gz keeps the scripts and JSON reports for a closer look.
if [ -n "${KEEP_REPORTS:-}" ]; then tar czf "$KEEP_REPORTS" -C "$WORK" .; fi
exit $status
