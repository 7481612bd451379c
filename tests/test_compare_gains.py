"""Gains: measured only for passing trials, in a separate pass, without diagnostic reads."""

from __future__ import annotations

import pathlib
import textwrap

import pytest
import torch

from amplint.compare import gains, run
from amplint.compare.spec import load_spec

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "compare"


def prepared_from(tmp_path, body: str) -> run.Prepared:
    path = tmp_path / "spec.py"
    path.write_text(textwrap.dedent(body))
    return run.prepare(load_spec(str(path)))


def test_only_passing_trials_get_timing_and_memory():
    prepared = run.prepare(load_spec(str(FIXTURES / "overflow_fp16.py")))
    report = run.run_compare(prepared, run.compute_baseline(prepared), warmup=1, repeats=3)
    bf16, fp16 = report["trials"]
    assert bf16["passed"] and not fp16["passed"]
    assert fp16["timing"] is None and fp16["memory"] is None
    assert bf16["timing"]["baseline_ms"] > 0 and bf16["timing"]["trial_ms"] > 0
    assert bf16["timing"]["speedup"] == pytest.approx(bf16["timing"]["baseline_ms"] / bf16["timing"]["trial_ms"], rel=1e-2)
    assert (bf16["timing"]["warmup"], bf16["timing"]["repeats"]) == (1, 3)
    assert bf16["memory"]["baseline_bytes"] > 0 and bf16["memory"]["trial_bytes"] > 0


def test_no_gains_when_asked_not_to_measure():
    prepared = run.prepare(load_spec(str(FIXTURES / "visible_difference.py")))
    report = run.run_compare(prepared, run.compute_baseline(prepared), measure_gains=False)
    assert all(t["passed"] and t["timing"] is None and t["memory"] is None for t in report["trials"])


def test_the_timed_passes_make_no_diagnostic_reads(tmp_path, monkeypatch):
    prepared = prepared_from(tmp_path, """
        import torch
        def model():
            return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
        def cases():
            return [("a", torch.ones(2, 8)), ("b", torch.zeros(2, 8))]
    """)

    def forbidden(*args, **kwargs):
        raise AssertionError("diagnostic read inside the gains measurement")

    # Timing alone (the memory pass is separate): no .item(), no isfinite, no copies to the host.
    monkeypatch.setattr(gains, "peak_bytes", lambda *args: 1)
    monkeypatch.setattr(torch.Tensor, "item", forbidden)
    monkeypatch.setattr(torch.Tensor, "tolist", forbidden)
    monkeypatch.setattr(torch.Tensor, "cpu", forbidden)
    monkeypatch.setattr(torch, "isfinite", forbidden)
    timing, memory = gains.measure(prepared, "bfloat16", warmup=1, repeats=2)
    assert timing["repeats"] == 2 and memory == {"baseline_bytes": 1, "trial_bytes": 1, "method": "torch.profiler CPU allocator events"}


def test_warmup_and_repeats_run_each_variant_the_stated_number_of_times(tmp_path):
    prepared = prepared_from(tmp_path, """
        import torch
        CALLS = []
        class Counting(torch.nn.Module):
            def forward(self, x):
                CALLS.append(torch.is_autocast_enabled("cpu"))
                return x * 2
        def model():
            return Counting()
        def cases():
            return [("a", torch.ones(2)), ("b", torch.ones(2)), ("c", torch.ones(2))]
    """)
    calls = prepared.model.forward.__globals__["CALLS"]
    gains.measure(prepared, "bfloat16", warmup=2, repeats=3)
    # (2 warm-up + 3 timed + 1 memory pass) x 3 cases, once under autocast and once without.
    assert calls.count(True) == calls.count(False) == (2 + 3 + 1) * 3


def test_cpu_peak_memory_sees_torch_allocations(tmp_path):
    prepared = prepared_from(tmp_path, """
        import torch
        class Wasteful(torch.nn.Module):
            def forward(self, x):
                scratch = torch.ones(1024, 1024)  # 4 MiB alive at once, freed at the end of forward
                return x + scratch[0, :2].sum()
        def model():
            return Wasteful()
        def cases():
            return [("a", torch.ones(2))]
    """)
    peak = gains.peak_bytes(prepared, prepared.fresh_model(), None)
    assert 4 * 1024 * 1024 <= peak < 5 * 1024 * 1024


def test_cpu_peak_memory_counts_autocast_weight_casts(tmp_path):
    prepared = prepared_from(tmp_path, """
        import torch
        def model():
            return torch.nn.Linear(512, 512, bias=False)
        def cases():
            return [("a", torch.ones(1, 512))]
    """)
    baseline = gains.peak_bytes(prepared, prepared.fresh_model(), None)
    trial = gains.peak_bytes(prepared, prepared.fresh_model(), "bfloat16")
    # float32 only allocates the 2 KiB output; bfloat16 first casts the 512x512 weight (512 KiB).
    assert baseline < 16 * 1024 and trial >= 512 * 512 * 2


def test_memory_is_null_rather_than_guessed_when_the_profiler_gives_nothing(tmp_path, monkeypatch):
    prepared = prepared_from(tmp_path, """
        import torch
        def model():
            return torch.nn.Linear(2, 2)
        def cases():
            return [("a", torch.ones(2))]
    """)
    monkeypatch.setattr(gains, "_cpu_peak_bytes", lambda *args: None)
    timing, memory = gains.measure(prepared, "bfloat16", warmup=0, repeats=1)
    assert timing is not None and memory is None


def test_profiler_chatter_does_not_reach_stderr(tmp_path, capfd):
    prepared = prepared_from(tmp_path, """
        import torch
        def model():
            return torch.nn.Linear(2, 2)
        def cases():
            return [("a", torch.ones(2))]
    """)
    capfd.readouterr()
    gains.peak_bytes(prepared, prepared.fresh_model(), "bfloat16")
    assert "profiler_st" not in capfd.readouterr().err


def test_each_timed_pass_gets_fresh_copies_of_the_inputs(tmp_path):
    """A model that normalises its input in place would otherwise be timed on drifting values."""
    prepared = prepared_from(tmp_path, """
        import torch
        SEEN = []
        class InPlace(torch.nn.Module):
            def forward(self, x):
                SEEN.append(float(x.max()))
                return x.sub_(0.5).div_(0.25)
        def model():
            return InPlace()
        def cases():
            return [("a", torch.ones(4))]
    """)
    seen = prepared.model.forward.__globals__["SEEN"]
    gains.measure(prepared, "bfloat16", warmup=1, repeats=3)
    assert seen and set(seen) == {1.0}
