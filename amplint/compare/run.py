"""The comparison itself: prepare the fixed inputs, run the FP32 baseline, run each AMP trial.

Every run starts from a deep copy of the same pristine model and the same inputs, with the same
seed, in eval mode and inference mode, so the only difference between the baseline and a trial is
the autocast context. The result is the report dict of DESIGN.md "Compare spec and report".
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import platform
import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from amplint.compare import outputs as out
from amplint.compare.criteria import (
    FAILED_DECISIONS,
    FAILED_ERROR,
    FAILED_NONFINITE,
    FAILED_QUALITY,
    FAILED_TOLERANCE,
    Criteria,
    changes_since,
)
from amplint.compare.errors import CompareError, describe_exception, one_line
from amplint.compare.spec import Spec, spec_exception

SEED = 0
Progress = Callable[[str], None]


@dataclass
class Prepared:
    """The frozen experiment: one model, one list of inputs, on the spec's device."""

    spec: Spec
    model: torch.nn.Module  # pristine, on the device, in eval mode; never run directly
    cases: list[tuple[str, Any]]  # (id, input on the device)
    device: torch.device
    weights_sha256: str
    inputs_sha256: str

    def fresh_model(self) -> torch.nn.Module:
        return copy.deepcopy(self.model)


@dataclass
class Baseline:
    """The reference outputs (plain CPU copies), computed now or loaded from a file."""

    outputs: list[Any]
    source: str  # "computed" or the baseline file's path
    criteria_at_save: dict | None = None
    torch_at_save: str | None = None


def seed_everything() -> None:
    random.seed(SEED)
    torch.manual_seed(SEED)


def prepare(spec: Spec) -> Prepared:
    """Build the model and the dataset once, check both are plain FP32, and move them to the device."""
    device = torch.device(spec.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise CompareError(f"the device is {spec.device!r} but CUDA is not available here (torch {torch.__version__})")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise CompareError(f"the device is {spec.device!r} but only {torch.cuda.device_count()} CUDA device(s) exist")
    spec_file = os.path.abspath(spec.path)

    seed_everything()
    if isinstance(spec.model, torch.nn.Module):
        model = copy.deepcopy(spec.model)
    else:
        try:
            model = spec.model()
        except Exception as exc:  # noqa: BLE001 - user code or torch internals may raise anything
            raise CompareError(spec_exception(exc, spec_file, "model()")) from None
    if not isinstance(model, torch.nn.Module):
        raise CompareError(f"model() must return a torch.nn.Module, got {type(model).__name__}")
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_meta:
            raise CompareError(
                f"model() returned {name!r} on the meta device, which holds shapes but no values: "
                "load the weights into the model (`load_state_dict(..., assign=True)`) before returning it"
            )
        if tensor.is_floating_point() and tensor.dtype != torch.float32:
            advice = (
                "do not call .half()/.bfloat16() on the model (autocast chooses the dtype per op)"
                if tensor.element_size() < 4
                else "build it in float32 (a float64 default dtype, or .double(), gives this)"
            )
            raise CompareError(f"model() returned {name!r} in {_dtype(tensor.dtype)}; the baseline must be FP32: {advice}")

    _check_copyable(model, "the model")
    seed_everything()
    cases = _read_cases(spec, spec_file)
    for case_id, case_input in cases:
        _check_copyable(case_input, f"case {case_id!r}: its input")
    weights_sha256 = out.weights_hash(model)
    inputs_sha256 = out.inputs_hash(cases)
    model = model.to(device).eval()
    return Prepared(
        spec=spec,
        model=model,
        cases=[(case_id, out.to_device(case_input, device)) for case_id, case_input in cases],
        device=device,
        weights_sha256=weights_sha256,
        inputs_sha256=inputs_sha256,
    )


def _check_copyable(value: Any, what: str) -> None:
    """Every run starts from deep copies of the model and the inputs (a run must not change the
    next): something that cannot be copied is the spec's to change, said before any run."""
    try:
        copy.deepcopy(value)
    except Exception as exc:  # noqa: BLE001 - __deepcopy__/__reduce__ of any object may raise anything
        raise CompareError(
            f"{what} cannot be copied ({describe_exception(exc)}); every run starts from a deep copy, so "
            "keep locks, open files and generators out of it (or give their owner a __deepcopy__)"
        ) from None


def _read_cases(spec: Spec, spec_file: str) -> list[tuple[str, Any]]:
    try:
        raw = spec.cases() if callable(spec.cases) else spec.cases
    except Exception as exc:  # noqa: BLE001 - user code or torch internals may raise anything
        raise CompareError(spec_exception(exc, spec_file, "cases()")) from None
    try:
        iterator = iter(raw)
    except TypeError:
        raise CompareError(f"`cases` must give an iterable of (id, input) pairs, got {type(raw).__name__}") from None
    try:
        items = list(iterator)  # a generator runs the spec's code here
    except Exception as exc:  # noqa: BLE001 - user code or torch internals may raise anything
        raise CompareError(spec_exception(exc, spec_file, "cases()")) from None
    if not items:
        raise CompareError("cases() returned no cases; the fixed dataset must not be empty")
    cases: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for position, item in enumerate(items):
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise CompareError(f"cases() item {position} is not an (id, input) pair: {one_line(repr(item), 80)}")
        case_id, case_input = item
        if isinstance(case_id, bool) or not isinstance(case_id, (str, int)):
            raise CompareError(f"cases() item {position}: the case id must be a string, got {type(case_id).__name__}")
        case_id = str(case_id)
        if case_id in seen:
            raise CompareError(f"cases(): duplicate case id {case_id!r}")
        seen.add(case_id)
        for name, leaf in out.leaves(case_input):
            which = "its input" if name == out.ROOT else f"input {name!r}"  # a bare tensor, or one part
            if isinstance(leaf, torch.Tensor) and leaf.is_meta:
                raise CompareError(f"case {case_id!r}: {which} is on the meta device, which holds a shape but no values")
            if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.dtype != torch.float32:
                raise CompareError(
                    f"case {case_id!r}: {which} is {_dtype(leaf.dtype)}; the baseline must be FP32 "
                    "(give float32 inputs and let autocast cast them)"
                )
        cases.append((case_id, case_input))
    return cases


@contextlib.contextmanager
def full_fp32_precision():
    """Keep "FP32" honest: no TF32 on CUDA and no reduced-precision float32 matmul on any device."""
    saved = (
        torch.get_float32_matmul_precision(),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cuda.matmul.allow_tf32 = saved[1]
        torch.backends.cudnn.allow_tf32 = saved[2]


def autocast_context(device_type: str, dtype: str | None):
    """The trial's context, or an explicitly disabled one for the FP32 baseline."""
    if dtype is None:
        return torch.autocast(device_type, enabled=False)
    return torch.autocast(device_type, dtype=getattr(torch, dtype))


class _NotAFiniteNumber(Exception):
    """quality() returned something other than a finite number; the message says what."""


class _NonFiniteBaseline(Exception):
    def __init__(self, message: str, summary: dict) -> None:
        super().__init__(message)
        self.summary = summary


class _RunFailed(Exception):
    def __init__(self, case_id: str, exc: BaseException) -> None:
        super().__init__(case_id)
        self.case_id = case_id
        self.exc = exc


def forward_all(prepared: Prepared, dtype: str | None) -> list[Any]:
    """Run every case once (fresh model copy, same seed per case); plain CPU copies of the outputs."""
    model = prepared.fresh_model()
    device_type = prepared.device.type
    results = []
    with full_fp32_precision(), torch.inference_mode():
        for case_id, case_input in prepared.cases:
            seed_everything()
            try:
                with autocast_context(device_type, dtype):
                    if dtype is not None and not torch.is_autocast_enabled(device_type):
                        raise RuntimeError(f"autocast did not engage for {dtype} on {device_type}")
                    output = out.call_model(model, copy.deepcopy(case_input))
            except Exception as exc:
                raise _RunFailed(case_id, exc) from exc
            results.append(out.plain(output))
    return results


def compute_baseline(prepared: Prepared) -> Baseline:
    try:
        outputs = forward_all(prepared, None)
    except _RunFailed as failed:
        where = f"the FP32 baseline failed on case {failed.case_id!r}"
        raise CompareError(spec_exception(failed.exc, os.path.abspath(prepared.spec.path), where)) from None
    return Baseline(outputs=outputs, source="computed")


def run_compare(
    prepared: Prepared,
    baseline: Baseline,
    *,
    measure_gains: bool = True,
    warmup: int = 3,
    repeats: int = 10,
    progress: Progress = lambda message: None,
    after_baseline: Callable[[], None] = lambda: None,
) -> dict:
    """The full report. Raises CompareError (with a partial report) when the baseline is unusable."""
    spec = prepared.spec
    criteria = spec.criteria
    spec_file = os.path.abspath(spec.path)
    ids = [case_id for case_id, _ in prepared.cases]
    decide = spec.decide or out.default_decide

    report: dict[str, Any] = {
        "spec": spec.path,
        "device": spec.device,
        "criteria": criteria.to_json(),
        "environment": environment(prepared.device),
        "baseline": None,
        "trials": [],
    }

    try:
        report["baseline"] = _judge_baseline(prepared, baseline, decide, spec_file)
    except _NonFiniteBaseline as bad:
        report["baseline"] = bad.summary
        raise CompareError(str(bad), report=report) from None
    baseline_cases = report["baseline"]["cases"]
    _check_repeatable(prepared, baseline, report)
    after_baseline()
    infinite = sum(not case["finite"] for case in baseline_cases)
    progress(
        f"Baseline float32 ({baseline.source}): {len(ids)} cases, "
        + (f"no NaN; ±inf in {infinite} case(s), which every trial must reproduce exactly" if infinite else "all finite")
        + ", repeated within tolerance by a second FP32 pass"
        + (f", quality {_fmt(report['baseline']['quality'])}" if report["baseline"]["quality"] is not None else "")
    )
    if report["baseline"].get("criteria_changes"):
        progress(f"warning: criteria changed: {'; '.join(report['baseline']['criteria_changes'])} since the baseline was saved")

    for dtype in spec.trials:
        progress(f"Trial {dtype}: running {len(ids)} cases under torch.autocast({spec.device_type!r}, {dtype})")
        trial = _run_trial(prepared, baseline, baseline_cases, dtype, decide, spec_file)
        report["trials"].append(trial)
        progress(f"Trial {dtype}: {'passed' if trial['passed'] else 'failed ' + ', '.join(trial['failed_criteria'])}")

    passing = [trial for trial in report["trials"] if trial["passed"]]
    if measure_gains and passing:
        from amplint.compare.gains import measure

        try:
            for trial in passing:
                progress(f"Gains {trial['dtype']}: timing {warmup} warm-up + {repeats} timed passes, then peak memory")
                trial["timing"], trial["memory"] = measure(prepared, trial["dtype"], warmup=warmup, repeats=repeats)
        except KeyboardInterrupt as interrupt:
            # Ctrl-C during the timing, which can take long: the verdicts are in, keep them.
            report["interrupted"] = "gains"
            interrupt.report = report
            raise
    return report


def _check_repeatable(prepared: Prepared, baseline: Baseline, report: dict) -> None:
    """A second FP32 pass must give the baseline's outputs within the criteria's tolerance, or no
    difference a trial shows can be put down to precision (SEED.md §1): a model that samples or
    keeps dropout on, or a stored baseline the model has moved away from in ways the weight and
    input hashes do not see (a setting, forward's code, preprocessing)."""
    again = compute_baseline(prepared).outputs
    for (case_id, _), first, second in zip(prepared.cases, baseline.outputs, again):
        result = compare_outputs(first, second, prepared.spec.criteria)
        if result["within_tolerance"]:
            continue
        worst = result["worst"]
        detail = result["note"] or (
            f"{_fmt(worst['baseline'])} → {_fmt(worst['trial'])} at {worst['output']}[{','.join(map(str, worst['index']))}]"
            if worst
            else f"max |diff| {_fmt(result['max_abs_diff'])}"
        )
        if baseline.source == "computed":
            message = (
                f"the FP32 model is not repeatable: two FP32 runs of case {case_id!r} differ beyond the tolerance "
                f"({detail}), so a trial's difference could not be put down to precision; make the model "
                "deterministic (no sampling, no dropout, seeds the spec does not reset)"
            )
        else:
            message = (
                f"baseline file {baseline.source} no longer matches the spec's FP32 outputs: case {case_id!r} differs "
                f"beyond the tolerance ({detail}) though the weights and inputs hash the same, so the model changed in a "
                "way the hashes do not see (a setting, forward's code, preprocessing); save a new baseline with --save-baseline"
            )
        raise CompareError(message, report=report)


def _holds_nothing(output: Any) -> bool:
    leaves = [leaf for _, leaf in out.all_leaves(output)]
    return bool(leaves) and all(isinstance(leaf, torch.Tensor) and leaf.numel() == 0 for leaf in leaves)


def _judge_baseline(prepared: Prepared, baseline: Baseline, decide, spec_file: str) -> dict:
    spec = prepared.spec
    criteria = spec.criteria
    names = sorted({name for output in baseline.outputs for name, _ in out.leaves(output)})
    if not names:
        raise CompareError("the model's outputs hold no tensors or numbers to compare")
    criteria.check_output_names(names)

    cases = []
    with_nan = []
    # A case with empty outputs (a detector that finds nothing in a black image) still compares its
    # shapes; a run where every case is empty (a filter that kept no row) would pass unseen.
    if all(_holds_nothing(output) for output in baseline.outputs):
        raise CompareError("every case's FP32 output is empty (tensors with no element), so the run would compare nothing")
    for (case_id, _), output in zip(prepared.cases, baseline.outputs):
        # ±inf is a value a trial can reproduce exactly (masked logits); NaN equals nothing.
        decision = margin = None
        decision_count = 0
        if out.has_nan(output):
            with_nan.append(case_id)
        else:
            decision = _call(lambda output=output: out.jsonable(decide(output)), spec_file, f"decide() on the baseline of case {case_id!r}")
            decision_count = out.count_decided(_decision_units(spec, decision, output))
            margin = _margin(spec, output, spec_file, case_id)
        cases.append({"id": case_id, "finite": out.is_finite(output), "decision": decision, "margin": margin, "decision_count": decision_count})

    summary = {"dtype": "float32", "finite": all(case["finite"] for case in cases), "quality": None, "source": baseline.source, "cases": cases}
    # A stored baseline remembers the criteria it was saved with: widening them later shows.
    changes = changes_since(baseline.criteria_at_save, criteria.to_json()) if baseline.criteria_at_save is not None else []
    if changes:
        summary["criteria_at_save"] = baseline.criteria_at_save
        summary["criteria_changes"] = changes
    if baseline.torch_at_save is not None and baseline.torch_at_save != torch.__version__:
        summary["torch_at_save"] = baseline.torch_at_save
    if with_nan:
        shown = ", ".join(repr(case_id) for case_id in with_nan[:5]) + (", ..." if len(with_nan) > 5 else "")
        raise _NonFiniteBaseline(
            f"the FP32 baseline holds NaN on {len(with_nan)} case(s) ({shown}); NaN equals nothing, not even "
            "another NaN, so it is no reference for a trial: fix the model or the cases first "
            "(±inf is accepted where every trial reproduces it, e.g. masked logits)",
            summary,
        )

    if spec.quality is not None:
        try:
            quality = _quality(spec, baseline.outputs, prepared)
        except _NotAFiniteNumber as bad:
            raise CompareError(f"{bad} on the baseline outputs; it must return a finite number") from None
        except Exception as exc:  # noqa: BLE001 - user code or torch internals may raise anything
            raise CompareError(spec_exception(exc, spec_file, "quality() on the baseline")) from None
        summary["quality"] = quality
        if criteria.min_quality is not None and quality < criteria.min_quality:
            raise CompareError(
                f"the FP32 baseline's quality {_fmt(quality)} is below min_quality {_fmt(criteria.min_quality)}; "
                "start from a baseline that meets the need"
            )
    return summary


def _run_trial(prepared: Prepared, baseline: Baseline, baseline_cases: list[dict], dtype: str, decide, spec_file: str) -> dict:
    spec = prepared.spec
    criteria = spec.criteria
    trial: dict[str, Any] = {
        "dtype": dtype,
        "passed": False,
        "failed_criteria": [],
        "decision_changes": 0,
        "nonfinite_cases": 0,
        "out_of_tolerance_cases": 0,
        "quality": None,
        "max_abs_diff": None,
        "error": None,
        "warnings": [],
        "cases": [],
        "timing": None,
        "memory": None,
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            outputs = forward_all(prepared, dtype)
        except _RunFailed as failed:
            trial["error"] = spec_exception(failed.exc, spec_file, f"case {failed.case_id!r}")
            outputs = None
    trial["warnings"] = sorted({one_line(str(w.message)) for w in caught})
    if outputs is None:
        trial["failed_criteria"] = [FAILED_ERROR]
        return trial

    worst: float | None = None  # none while no case's outputs could be compared
    for (case_id, _), base_output, trial_output, base_case in zip(prepared.cases, baseline.outputs, outputs, baseline_cases):
        case = compare_outputs(base_output, trial_output, criteria)
        try:
            decision = out.jsonable(decide(trial_output))
            decision_error = None
        except Exception as exc:  # noqa: BLE001 - user code or torch internals may raise anything
            if case["finite"]:
                # decide() that fails on finite outputs (one that asserts float32) is the spec's
                # error, not a decision the lower precision changed.
                trial["error"] = spec_exception(exc, spec_file, f"case {case_id!r}: decide() on the trial's outputs")
                trial["failed_criteria"] = [FAILED_ERROR]
                trial["cases"] = []
                return trial
            decision, decision_error = None, describe_exception(exc)  # a custom decide() meeting NaN
        decisions_changed = out.count_changed(
            _decision_units(spec, base_case["decision"], base_output), _decision_units(spec, decision, base_output)
        )
        entry = {
            "id": case_id,
            "finite": case["finite"],
            "max_abs_diff": _finite_or_none(case["max_abs_diff"]),
            "within_tolerance": case["within_tolerance"],
            "decision": decision,
            "decision_changed": decisions_changed > 0,
            "decisions_changed": decisions_changed,
            "near_tie": base_case["margin"] is not None and base_case["margin"] < criteria.near_tie_margin,
            "worst": case["worst"],
        }
        if decision_error:
            entry["decision_error"] = decision_error
        if case["note"]:
            entry["note"] = case["note"]
        trial["cases"].append(entry)
        trial["nonfinite_cases"] += not entry["finite"]
        trial["out_of_tolerance_cases"] += not entry["within_tolerance"]
        trial["decision_changes"] += entry["decisions_changed"]
        if not math.isnan(case["max_abs_diff"]):  # outputs of another structure or shape have no gap to rank
            worst = max(worst or 0.0, case["max_abs_diff"])
    trial["max_abs_diff"] = _finite_or_none(worst) if worst is not None else None
    if worst == 0.0 and not trial["nonfinite_cases"] and not any("note" in case for case in trial["cases"]):
        trial["note"] = (
            f"every output equals FP32's bit for bit: nothing the model computes ran in {dtype} under "
            f"{spec.device_type} autocast's policy (it keeps ops such as layer_norm and softmax in float32), "
            f"so this trial tested nothing in {dtype}; its near ties were never at risk"
        )

    failed = []
    if trial["nonfinite_cases"]:
        failed.append(FAILED_NONFINITE)
    if trial["out_of_tolerance_cases"] > criteria.max_out_of_tolerance_cases:
        failed.append(FAILED_TOLERANCE)
    if trial["decision_changes"] > criteria.max_decision_changes:
        failed.append(FAILED_DECISIONS)
    if spec.quality is not None:
        try:
            trial["quality"] = _quality(spec, outputs, prepared)
        except _NotAFiniteNumber as bad:
            trial["quality_error"] = str(bad)
        except Exception as exc:  # noqa: BLE001 - user code or torch internals may raise anything
            trial["quality_error"] = describe_exception(exc)
        if trial["quality"] is None or (criteria.min_quality is not None and trial["quality"] < criteria.min_quality):
            failed.append(FAILED_QUALITY)
    trial["failed_criteria"] = failed
    trial["passed"] = not failed
    return trial


def _decision_units(spec: Spec, decision: Any, base_output: Any) -> list:
    """Both sides are split by the baseline's batch, so a trial cannot change what a unit is."""
    return out.decision_units(decision, rows=out.batch_rows(base_output), default=spec.decide is None)


def compare_outputs(base: Any, trial: Any, criteria: Criteria) -> dict:
    """Finiteness, the largest |trial - baseline| and |trial - base| <= atol + rtol*|base| per element.

    An element where the baseline itself is ±inf (a masked logit) counts as equal when the trial
    has the same infinity there, and stays out of the gaps; anywhere else a non-finite value on
    either side makes the case non-finite. A non-numeric leaf (a label) has no tolerance: any
    difference puts the case outside it, and `note` says what changed.

    `worst` is the element farthest outside (or nearest to) its own output's tolerance: with
    per-output tolerances, the largest absolute gap may be a large-scale output well within its
    own."""
    base_leaves = dict(out.all_leaves(base))
    trial_leaves = dict(out.all_leaves(trial))
    result = {"finite": out.is_finite(trial), "max_abs_diff": 0.0, "within_tolerance": True, "worst": None, "note": None}
    mismatch = _structure_difference(base_leaves, trial_leaves)
    if mismatch:
        result.update(max_abs_diff=math.nan, within_tolerance=False, note=mismatch)
        return result
    result["finite"] = True
    changed_labels = []
    worst_share = 0.0
    for name, base_leaf in base_leaves.items():
        trial_leaf = trial_leaves[name]
        if not out.is_numeric(base_leaf):
            if not out.same_value(base_leaf, trial_leaf):
                changed_labels.append(f"output {name!r}: {one_line(repr(base_leaf), 40)} → {one_line(repr(trial_leaf), 40)}")
            continue
        b = out.as_float64(base_leaf)
        t = out.as_float64(trial_leaf)
        if b.numel() == 0:
            continue
        # A class id, an index, a count or a mask has no tolerance: any change is a change.
        atol, rtol = criteria.tolerance_for(name) if not out.is_exact(base_leaf) else (0.0, 0.0)
        matched = ~torch.isfinite(b) & (b == t)  # the baseline's own ±inf, reproduced exactly
        if bool((~(torch.isfinite(b) & torch.isfinite(t)) & ~matched).any()):
            result["finite"] = False
        diff = (t - b).abs().masked_fill(matched, 0.0)
        allowed = atol + rtol * b.abs().masked_fill(matched, 0.0)
        # NaN compares false, so a NaN element is outside any tolerance, as it should be.
        if not bool((matched | (diff <= allowed)).all()):
            result["within_tolerance"] = False
        gaps = torch.nan_to_num(diff, nan=math.inf, posinf=math.inf).reshape(-1)
        result["max_abs_diff"] = max(result["max_abs_diff"], float(gaps.max()))
        allowed = allowed.reshape(-1).clamp_min(torch.finfo(torch.float64).tiny)
        share = torch.nan_to_num(gaps / allowed, nan=math.inf)  # of its tolerance used: above 1 is outside
        share = share.masked_fill(matched.reshape(-1), -1.0)  # a matched ±inf is never the worst element
        position = int(share.argmax())
        if float(share[position]) >= 0 and (result["worst"] is None or float(share[position]) > worst_share):
            worst_share = float(share[position])
            index = list(torch.unravel_index(torch.tensor(position), b.shape)) if b.dim() else []
            result["worst"] = {
                "output": name,
                "index": [int(i) for i in index],
                "baseline": _finite_or_text(b.reshape(-1)[position]),
                "trial": _finite_or_text(t.reshape(-1)[position]),
            }
    if changed_labels:
        result.update(within_tolerance=False, note="; ".join(changed_labels))
    return result


def _structure_difference(base_leaves: dict, trial_leaves: dict) -> str | None:
    """Why two outputs cannot be compared leaf by leaf, or None when they can."""
    if list(base_leaves) != list(trial_leaves) or any(
        out.is_numeric(leaf) != out.is_numeric(trial_leaves[name]) for name, leaf in base_leaves.items()
    ):
        return "the trial's outputs differ in structure from the baseline's"
    for name, base_leaf in base_leaves.items():
        if out.is_numeric(base_leaf):
            base_shape, trial_shape = _shape(base_leaf), _shape(trial_leaves[name])
            if base_shape != trial_shape:
                return f"output {name!r} has shape {trial_shape}, baseline {base_shape}"
    return None


def _shape(leaf: Any) -> tuple[int, ...]:
    """A numeric leaf's shape, without the float64 copy the comparison makes afterwards."""
    return tuple(leaf.shape) if isinstance(leaf, torch.Tensor) else ()


def _margin(spec: Spec, output: Any, spec_file: str, case_id: str) -> float | None:
    if spec.margin is None:
        # The top-two gap measures how close the default argmax is to flipping; a custom decide
        # (a threshold, a top-k, another output) has its own boundary, which that gap does not see.
        return out.default_margin(output) if spec.decide is None else None
    value = out.python_scalar(_call(lambda: spec.margin(output), spec_file, f"margin() on the baseline of case {case_id!r}"))
    if value is None:
        return None
    if not out.is_finite_number(value) or value < 0:
        raise CompareError(
            f"margin() must return a finite, non-negative distance to the decision boundary or None, "
            f"got {value!r} for case {case_id!r}"
        )
    return float(value)


def _quality(spec: Spec, outputs: list[Any], prepared: Prepared) -> float:
    """quality() of these outputs; raises what it raises, or _NotAFiniteNumber naming what it returned."""
    ids = [case_id for case_id, _ in prepared.cases]
    value = out.python_scalar(spec.quality(dict(zip(ids, outputs)), ids))
    if not out.is_finite_number(value):
        raise _NotAFiniteNumber(f"quality() returned {one_line(repr(value), 80)}")
    return float(value)


def _call(function, spec_file: str, where: str):
    try:
        return function()
    except Exception as exc:  # noqa: BLE001 - user code or torch internals may raise anything
        raise CompareError(spec_exception(exc, spec_file, where)) from None


def environment(device: torch.device) -> dict:
    gpu = None
    backend = "cpu"
    if device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
        backend = "rocm" if getattr(torch.version, "hip", None) else "cuda"
    return {"torch": str(torch.__version__), "python": platform.python_version(), "backend": backend, "gpu": gpu}


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _finite_or_text(value: torch.Tensor) -> float | str:
    number = complex(value) if value.is_complex() else float(value)
    if isinstance(number, complex):
        return str(number)
    return number if math.isfinite(number) else str(number)  # "inf", "-inf", "nan": JSON has none


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _fmt(value: float | str | None) -> str:
    """A number as the report shows it; a value already in words ("inf", "nan") as it is."""
    return "n/a" if value is None else value if isinstance(value, str) else f"{value:.6g}"
