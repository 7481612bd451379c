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

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "runtime" / "ddp_gloo.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_torchrun_two_ranks(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
            "-m", "amplint", "trace", "--json", "d.json", str(FIXTURE),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env=dict(os.environ, PYTHONWARNINGS="ignore::UserWarning", OMP_NUM_THREADS="1"),
    )
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
