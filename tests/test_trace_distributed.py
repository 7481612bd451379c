"""Under torchrun (CPU, gloo): one report per rank plus a merged summary; fork DataLoader workers
are not traced (their ops never reach a report)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not built in", allow_module_level=True)

RUNTIME = Path(__file__).resolve().parent.parent / "fixtures" / "runtime"
FIXTURE = RUNTIME / "ddp_gloo.py"
ONE_RANK_AMP003 = RUNTIME / "ddp_rank_one_backward_in_autocast.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_trace(tmp_path: Path, script: Path, *options: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
            "-m", "amplint", "trace", *options, "--json", "d.json", str(script),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env=dict(os.environ, PYTHONWARNINGS="ignore::UserWarning", OMP_NUM_THREADS="1", **env),
    )


def test_torchrun_two_ranks(tmp_path: Path) -> None:
    proc = torchrun_trace(tmp_path, FIXTURE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"d.rank{r}.json").read_text()) for r in (0, 1)]
    merged = json.loads((tmp_path / "d.json").read_text())
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["d.json", "d.rank0.json", "d.rank1.json"]
    for rank, report in enumerate(ranks):
        assert report["rank"] == rank
        amp003 = [f for f in report["findings"] if f["code"] == "AMP003"]
        assert [(f["line"], f["status"], f["count"]) for f in amp003] == [(30, "confirmed", 3)]
        # line 16 runs only inside the fork workers: never recorded
        assert not [op for op in report["ops"] if op["line"] == 16]
        assert any(op["op"].startswith("c10d::") for op in report["ops"])
    assert merged["ranks"]["world_size"] == 2 and merged["ranks"]["missing"] == []
    amp003 = [f for f in merged["findings"] if f["code"] == "AMP003"]
    assert [(f["count"], f["ranks"]) for f in amp003] == [(6, [0, 1])]
    # the merged summary is printed once, by rank 0
    assert proc.stderr.count("amplint trace: ") == 1


def test_strict_under_torchrun_is_judged_by_rank_0_on_the_merged_report(tmp_path: Path) -> None:
    """Rank 1's confirmed AMP003 fails the run, but only once rank 0 has finished and merged:
    rank 1 exiting 1 first would make torchrun stop rank 0 before it wrote done0."""
    proc = torchrun_trace(tmp_path, ONE_RANK_AMP003, "-q", "--strict")
    assert (tmp_path / "done0").exists(), proc.stderr[-3000:]
    assert proc.returncode == 1
    assert proc.stderr.count("amplint trace: --strict: exit 1") == 1
    merged = json.loads((tmp_path / "d.json").read_text())
    assert sorted(merged["ranks"]["exit"]) == ["0", "1"]
    assert {r["code"] for r in merged["ranks"]["exit"].values()} == {0}  # each rank ran to its end


def test_a_rank_report_left_by_an_earlier_run_is_not_merged(tmp_path: Path) -> None:
    """The earlier file is there while rank 0 waits for the late rank 1: it must wait for this run's."""
    (tmp_path / "d.rank1.json").write_text(json.dumps({"rank": 1, "launch": "an earlier launch", "findings": []}))
    proc = torchrun_trace(tmp_path, ONE_RANK_AMP003, "-q", RANK1_DELAY="4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    merged = json.loads((tmp_path / "d.json").read_text())
    assert merged["ranks"]["missing"] == []
    amp003 = [f for f in merged["findings"] if f["code"] == "AMP003" and f["status"] == "confirmed"]
    assert [f["ranks"] for f in amp003] == [[0, 1]]


@pytest.mark.parametrize("mode", ["op", "cheap"])
def test_an_fsdp2_script_runs_under_every_nan_mode_as_under_python(tmp_path: Path, mode: str) -> None:
    """FSDP2's DTensors are checked by their local shards: a DTensor's own `.item()` of a partial
    sum has no sharding rule and raised inside the script's `optimizer.step()`."""
    script = RUNTIME / "fsdp2_one_process.py"
    env = dict(os.environ, PYTHONWARNINGS="ignore::UserWarning", OMP_NUM_THREADS="1", MASTER_PORT=str(free_port()))
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=180, env=env)
    env["MASTER_PORT"] = str(free_port())
    traced = subprocess.run(
        [sys.executable, "-m", "amplint", "trace", "-q", "--nan", mode, "--json", "r.json", str(script)],
        capture_output=True, text=True, cwd=tmp_path, timeout=180, env=env,
    )
    assert plain.returncode == traced.returncode == 0, traced.stderr[-3000:]
    assert traced.stdout == plain.stdout
    assert json.loads((tmp_path / "r.json").read_text())["nonfinite"] is None
