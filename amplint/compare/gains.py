"""Time and peak memory of the baseline and a trial, measured only after the trial passed.

The guide (SEED.md §7): measure gains without diagnostics, with shapes, batch, model and quality
fixed; scalar reads, synchronisation and profilers change timings. So this pass:

- runs the same fresh model copies on the same device-resident inputs as the validation pass, with
  one autocast context per case (as a service wraps each request), in inference mode;
- warms up first (lazy initialisation, allocator growth, kernel selection), then times `repeats`
  passes over every case, alternating baseline and trial so drift (clock boost, thermal) hits both;
- reads nothing inside a timed pass: no `.item()`, no `isfinite`, no copies to the host; on CUDA it
  synchronises only at the two ends of each timed pass; the outputs are simply dropped;
- reports the median pass time (robust to a stray slow pass);
- measures memory in a separate pass after timing, because the CPU method uses the profiler.

Peak memory is the most bytes allocated at once during one pass over every case, above what was
allocated before the pass (so resident weights and inputs, identical for both, are not counted; the
activations, autocast's weight casts and outputs are). On CUDA it comes from
`torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`. On CPU, `tracemalloc` cannot see
torch's allocator and an RSS delta mostly measures glibc's free lists, so amplint replays the CPU
allocator's own allocation and free events recorded by `torch.profiler(profile_memory=True)`. If
those events are unavailable (a torch without the private event tree), memory is null: never a guess.
"""

from __future__ import annotations

import copy
import statistics
import time
import warnings

import torch

from amplint.compare import outputs as out
from amplint.compare.run import Prepared, autocast_context, full_fp32_precision
from amplint.native_stderr import native_stderr_without


def measure(prepared: Prepared, dtype: str, *, warmup: int = 3, repeats: int = 10) -> tuple[dict | None, dict | None]:
    baseline_model = prepared.fresh_model()
    trial_model = prepared.fresh_model()
    variants = {"baseline": (baseline_model, None), "trial": (trial_model, dtype)}
    # The trials recorded the model's warnings; the timed passes repeat them to no purpose.
    with full_fp32_precision(), torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(warmup):
            for model, autocast_dtype in variants.values():
                _one_pass(prepared, model, autocast_dtype)
        times: dict[str, list[float]] = {"baseline": [], "trial": []}
        for repeat in range(repeats):
            order = ("baseline", "trial") if repeat % 2 == 0 else ("trial", "baseline")
            for name in order:
                model, autocast_dtype = variants[name]
                times[name].append(_timed_pass(prepared, model, autocast_dtype))
        memory = {name: peak_bytes(prepared, model, autocast_dtype) for name, (model, autocast_dtype) in variants.items()}

    timing = None
    if repeats > 0:
        baseline_ms = statistics.median(times["baseline"]) * 1e3
        trial_ms = statistics.median(times["trial"]) * 1e3
        timing = {
            "baseline_ms": _significant(baseline_ms),
            "trial_ms": _significant(trial_ms),
            "speedup": _significant(baseline_ms / trial_ms) if trial_ms > 0 else None,
            "warmup": warmup,
            "repeats": repeats,
            "statistic": "median ms per pass over all cases",
            # CPU timings depend on the intra-op thread count (and suffer when those threads compete
            # with other processes for cores), so the count is part of the measurement.
            "cpu_threads": torch.get_num_threads() if prepared.device.type == "cpu" else None,
        }
    memory_report = None
    if memory["baseline"] is not None and memory["trial"] is not None:
        memory_report = {
            "baseline_bytes": memory["baseline"],
            "trial_bytes": memory["trial"],
            "method": "torch.cuda.max_memory_allocated" if prepared.device.type == "cuda" else "torch.profiler CPU allocator events",
        }
    return timing, memory_report


def _significant(value: float, digits: int = 4) -> float:
    """Timer noise makes more digits meaningless; keep 4 significant ones at any magnitude."""
    return float(f"{value:.{digits}g}")


def _one_pass(prepared: Prepared, model: torch.nn.Module, dtype: str | None, inputs: list | None = None) -> None:
    device_type = prepared.device.type
    for case_input in inputs if inputs is not None else _fresh_inputs(prepared):
        with autocast_context(device_type, dtype):
            out.call_model(model, case_input)


def _fresh_inputs(prepared: Prepared) -> list:
    """Copies of the inputs for one pass: a model that changes its input in place (an in-place
    normalisation) would otherwise be fed drifting values pass after pass."""
    return [copy.deepcopy(case_input) for _, case_input in prepared.cases]


def _synchronize(prepared: Prepared) -> None:
    if prepared.device.type == "cuda":
        torch.cuda.synchronize(prepared.device)


def _timed_pass(prepared: Prepared, model: torch.nn.Module, dtype: str | None) -> float:
    inputs = _fresh_inputs(prepared)  # copied before the clock starts
    _synchronize(prepared)
    start = time.perf_counter()
    _one_pass(prepared, model, dtype, inputs)
    _synchronize(prepared)
    return time.perf_counter() - start


def peak_bytes(prepared: Prepared, model: torch.nn.Module, dtype: str | None) -> int | None:
    inputs = _fresh_inputs(prepared)  # copied before the measurement: they are not the pass's memory
    if prepared.device.type == "cuda":
        _synchronize(prepared)
        torch.cuda.reset_peak_memory_stats(prepared.device)
        before = torch.cuda.memory_allocated(prepared.device)
        _one_pass(prepared, model, dtype, inputs)
        _synchronize(prepared)
        return int(torch.cuda.max_memory_allocated(prepared.device) - before)
    return _cpu_peak_bytes(prepared, model, dtype, inputs)


def _cpu_peak_bytes(prepared: Prepared, model: torch.nn.Module, dtype: str | None, inputs: list) -> int | None:
    try:
        from torch._C._profiler import _EventType
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    try:
        with native_stderr_without(_profiler_chatter), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            _one_pass(prepared, model, dtype, inputs)
        roots = prof.profiler.kineto_results.experimental_event_tree()
    except Exception:  # the private event tree moved or the profiler is unavailable: no number  # noqa: BLE001 - user code or torch internals may raise anything
        return None
    allocations: list[tuple[int, int]] = []
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and str(node.extra_fields.device.type) == "cpu":
            allocations.append((node.start_time_ns, int(node.extra_fields.alloc_size)))
        stack.extend(node.children)
    if not allocations:
        return None
    live = peak = 0
    for _, size in sorted(allocations):
        live += size
        peak = max(peak, live)
    return peak


def _profiler_chatter(line: bytes) -> bool:
    """Kineto's 'USDT: ... profiler_start' and 'STAGE:' lines."""
    return b"profiler_st" in line or line.startswith(b"STAGE:")
