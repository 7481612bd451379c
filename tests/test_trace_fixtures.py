"""End-to-end: every fixtures/runtime/*.expected.json names a CPU training script with known facts
(finding statuses and counts, scaler accounting, the first non-finite op); the real CLI runs it in
a subprocess and the JSON report must state exactly those facts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "runtime"
CASES = sorted(FIXTURES.glob("*.expected.json"))


def run_trace(script: str, options: list[str], tmp_path: Path, cwd: Path = FIXTURES) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "report.json"
    env = dict(os.environ, PYTHONWARNINGS="ignore::UserWarning")
    proc = subprocess.run(
        [sys.executable, "-m", "amplint", "trace", "-q", "--json", str(out), *options, script],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.exists(), f"no report written; stderr:\n{proc.stderr}"
    return proc, json.loads(out.read_text())


def assert_subset(expected, actual, where: str) -> None:
    """Every key/value in `expected` is in `actual` (dicts recursively, lists exactly)."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: expected an object, got {actual!r}"
        for key, value in expected.items():
            assert key in actual, f"{where}: missing {key!r} in {actual!r}"
            assert_subset(value, actual[key], f"{where}.{key}")
    elif isinstance(expected, list) and expected and isinstance(expected[0], dict):
        assert isinstance(actual, list) and len(actual) == len(expected), f"{where}: {actual!r} != {expected!r}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_subset(e, a, f"{where}[{i}]")
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def _key(finding: dict) -> tuple:
    return finding["code"], finding["path"], finding["line"]


def _matching(want: dict, findings: list[dict]) -> dict | None:
    """The reported finding `want` describes: by code, path and line; of two findings of a rule
    on one line, the one whose facts it states (else the first, for the assertion to show)."""
    candidates = [f for f in findings if _key(f) == _key(want)]
    for finding in candidates:
        try:
            assert_subset(want, finding, "")
        except AssertionError:
            continue
        return finding
    return candidates[0] if candidates else None


@pytest.mark.parametrize("case", CASES, ids=[c.name.removesuffix(".expected.json") for c in CASES])
def test_fixture_facts(case: Path, tmp_path: Path) -> None:
    expected = json.loads(case.read_text())
    if expected.get("skip_if_cuda"):
        import torch

        if torch.cuda.is_available():
            pytest.skip("states facts of a machine without CUDA")
    script = expected.get("script", case.name.removesuffix(".expected.json") + ".py")
    proc, report = run_trace(script, expected.get("options", []), tmp_path)
    assert proc.returncode == expected["exit_code"], proc.stderr

    for want in expected["findings"]:
        got = _matching(want, report["findings"])
        assert got is not None, f"{_key(want)} not reported; findings: {sorted(map(_key, report['findings']))}\n{proc.stderr}"
        assert_subset(want, got, f"finding {_key(want)}")
    # No confirmation beyond the known facts: a clean script must stay clean.
    listed = {_key(f) for f in expected["findings"]}
    extra = [f for f in report["findings"] if f["status"] == "confirmed" and _key(f) not in listed]
    assert not extra, f"unexpected confirmed findings: {extra}"

    if "scaler" in expected:
        assert_subset(expected["scaler"], report["scaler"], "scaler")
    if "nonfinite" in expected:
        if expected["nonfinite"] is None:
            assert report["nonfinite"] is None, report["nonfinite"]
        else:
            assert_subset(expected["nonfinite"], report["nonfinite"], "nonfinite")
    for want in expected.get("kernels_include", []):
        assert any(all(k.get(f) == v for f, v in want.items()) for k in report["kernels"]), (
            f"no kernel entry matching {want}: {report['kernels']}"
        )
    if "kernels_all" in expected:
        assert report["kernels"], "no kernel entries"
        for entry in report["kernels"]:
            assert_subset(expected["kernels_all"], entry, f"kernel {entry['op']}")
    for want in expected.get("policy_departures_include", []):
        departures = report["policy_departures"]
        assert any(all(d.get(f) == v for f, v in want.items()) for d in departures), f"no departure matching {want}: {departures}"
    if "policy_departures_include" not in expected:
        assert report["policy_departures"] == [], report["policy_departures"]
    for want in expected.get("simulation_include", []):
        calls = report["simulation"]["calls"]
        assert any(all(c.get(f) == v for f, v in want.items()) for c in calls), f"no simulated call matching {want}: {calls}"
    if "simulation_not_simulated" in expected:
        assert len(report["simulation"]["not_simulated"]) == expected["simulation_not_simulated"], report["simulation"]["not_simulated"]
    if "notes_include" in expected:
        assert any(expected["notes_include"] in note for note in report["notes"]), report["notes"]
    if "notes_in_scaler_include" in expected:
        assert any(expected["notes_in_scaler_include"] in note for note in report["scaler"]["notes"]), report["scaler"]["notes"]
    for noise in expected.get("stderr_excludes", []):
        assert noise not in proc.stderr, proc.stderr
    for said in expected.get("stderr_includes", []):
        assert said in proc.stderr, proc.stderr
    for want in expected.get("ops_include", []):
        assert any(
            all(row.get(k) == v for k, v in want.items()) for row in report["ops"]
        ), f"no op row matching {want}"
