"""The baseline and the trials, through the library on the fixtures and on small inline specs."""

from __future__ import annotations

import pathlib
import textwrap

import pytest
import torch

from amplint.compare import run
from amplint.compare.errors import CompareError
from amplint.compare.spec import load_spec

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "compare"


def compare(path, gains=False, **overrides) -> dict:
    spec = load_spec(str(path), **overrides)
    prepared = run.prepare(spec)
    return run.run_compare(prepared, run.compute_baseline(prepared), measure_gains=gains, warmup=1, repeats=2)


def write_spec(tmp_path, body: str) -> pathlib.Path:
    path = tmp_path / "spec.py"
    path.write_text(textwrap.dedent(body))
    return path


def trial(report: dict, dtype: str) -> dict:
    return next(t for t in report["trials"] if t["dtype"] == dtype)


def ids_where(trial_report: dict, key: str, value=True) -> list[str]:
    return [case["id"] for case in trial_report["cases"] if case[key] == value]


@pytest.fixture(scope="module")
def near_tie_report():
    return compare(FIXTURES / "classifier_near_tie.py")


def test_baseline_records_decisions_and_margins(near_tie_report):
    baseline = near_tie_report["baseline"]
    assert baseline["dtype"] == "float32" and baseline["finite"] and baseline["quality"] == 1.0
    by_id = {case["id"]: case for case in baseline["cases"]}
    assert by_id["near-tie-3e-4"]["decision"] == 1
    assert by_id["near-tie-3e-4"]["margin"] == pytest.approx(3e-4, rel=1e-3)
    assert by_id["exact-tie"] == {"id": "exact-tie", "finite": True, "decision": 0, "margin": 0.0, "decision_count": 1}


def test_near_ties_are_marked_from_the_baseline_margin(near_tie_report):
    for dtype in ("bfloat16", "float16"):
        assert ids_where(trial(near_tie_report, dtype), "near_tie") == ["exact-tie", "near-tie-3e-4", "near-tie-8e-4"]


def test_a_near_tie_that_rounds_to_a_tie_changes_the_decision(near_tie_report):
    bf16, fp16 = trial(near_tie_report, "bfloat16"), trial(near_tie_report, "float16")
    assert ids_where(bf16, "decision_changed") == ["near-tie-3e-4", "near-tie-8e-4"]
    assert ids_where(fp16, "decision_changed") == ["near-tie-3e-4"]  # float16 still separates 1.0008
    assert (bf16["decision_changes"], fp16["decision_changes"]) == (2, 1)


def test_changed_decisions_fail_a_trial_even_within_tolerance(near_tie_report):
    for dtype in ("bfloat16", "float16"):
        result = trial(near_tie_report, dtype)
        assert result["out_of_tolerance_cases"] == 0 and result["nonfinite_cases"] == 0
        assert result["failed_criteria"] == ["decision_changes"] and result["passed"] is False
        assert result["timing"] is None and result["memory"] is None


def test_trial_quality_is_computed_on_trial_outputs(near_tie_report):
    assert trial(near_tie_report, "bfloat16")["quality"] == pytest.approx(4 / 6)
    assert trial(near_tie_report, "float16")["quality"] == pytest.approx(5 / 6)


def test_float16_overflow_is_non_finite_only_for_the_loud_cases():
    report = compare(FIXTURES / "overflow_fp16.py")
    fp16, bf16 = trial(report, "float16"), trial(report, "bfloat16")
    assert ids_where(fp16, "finite", False) == ["loud-0", "loud-1"]
    assert ids_where(fp16, "within_tolerance", False) == ["loud-0", "loud-1"]
    assert fp16["failed_criteria"] == ["nonfinite_cases", "out_of_tolerance_cases", "decision_changes"]
    assert all(case["max_abs_diff"] is None for case in fp16["cases"] if not case["finite"])
    assert bf16["passed"] and bf16["nonfinite_cases"] == 0


def test_regressor_threshold_decision_changes_only_in_bfloat16():
    report = compare(FIXTURES / "regressor_extremes.py")
    bf16, fp16 = trial(report, "bfloat16"), trial(report, "float16")
    assert ids_where(bf16, "decision_changed") == ["just-above-threshold"]
    assert bf16["failed_criteria"] == ["decision_changes"]
    assert fp16["passed"]
    huge = next(case for case in fp16["cases"] if case["id"] == "extreme-huge")
    assert huge["max_abs_diff"] > 1.0 and huge["within_tolerance"]  # rtol scales with the extreme


def test_a_visible_difference_that_changes_no_decision_passes():
    report = compare(FIXTURES / "visible_difference.py")
    bf16 = trial(report, "bfloat16")
    assert bf16["max_abs_diff"] > 0.05  # visible in the printed scores
    assert bf16["passed"] and bf16["decision_changes"] == 0 and bf16["out_of_tolerance_cases"] == 0


def test_out_of_tolerance_cases_fail_unless_the_criteria_allow_them(tmp_path):
    body = """
        import torch
        CRITERIA = {"atol": 1e-4, "max_out_of_tolerance_cases": ALLOWED}
        TRIALS = ["bfloat16"]
        def model():
            torch.manual_seed(0)
            return torch.nn.Linear(8, 3)
        def cases():
            return [(f"c{i}", torch.full((8,), 10.0 + i / 3)) for i in range(3)]
    """
    strict = compare(write_spec(tmp_path, body.replace("ALLOWED", "0")))["trials"][0]
    assert strict["out_of_tolerance_cases"] > 0 and "out_of_tolerance_cases" in strict["failed_criteria"]
    lenient = compare(write_spec(tmp_path, body.replace("ALLOWED", "3")))["trials"][0]
    assert lenient["out_of_tolerance_cases"] == strict["out_of_tolerance_cases"] and lenient["passed"]


def test_a_baseline_holding_nan_is_an_error_with_a_partial_report(tmp_path):
    path = write_spec(tmp_path, """
        import torch
        def model():
            return torch.nn.Linear(2, 2)
        def cases():
            return [("ok", torch.ones(2)), ("bad", torch.tensor([float("nan"), 1.0]))]
    """)
    with pytest.raises(CompareError) as caught:
        compare(path)
    assert "holds NaN on 1 case(s) ('bad'); NaN equals nothing" in str(caught.value)
    assert caught.value.report["baseline"]["finite"] is False
    assert [c["finite"] for c in caught.value.report["baseline"]["cases"]] == [True, False]
    assert caught.value.report["trials"] == []


def test_every_run_starts_from_the_same_weights_and_inputs(tmp_path):
    # The model mutates a buffer and its input in place; each run must still see pristine copies.
    path = write_spec(tmp_path, """
        import torch
        TRIALS = ["bfloat16", "float16"]
        class Drifting(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("shift", torch.zeros(2))
            def forward(self, x):
                self.shift += 100.0
                out = x + self.shift
                x.mul_(3.0)
                return out
        def model():
            return Drifting()
        def cases():
            return [("a", torch.tensor([1.0, 2.0])), ("b", torch.tensor([3.0, 4.0]))]
    """)
    report = compare(path)
    assert [t["max_abs_diff"] for t in report["trials"]] == [0.0, 0.0]


def test_randomness_inside_forward_is_seeded_identically(tmp_path):
    path = write_spec(tmp_path, """
        import torch
        class Noisy(torch.nn.Module):
            def forward(self, x):
                return x + torch.randn(x.shape)
        def model():
            return Noisy()
        def cases():
            return [("a", torch.zeros(4)), ("b", torch.ones(4))]
    """)
    assert all(t["max_abs_diff"] == 0.0 for t in compare(path)["trials"])


def test_the_baseline_runs_in_eval_mode(tmp_path):
    path = write_spec(tmp_path, """
        import torch
        TRIALS = ["bfloat16"]
        def model():
            return torch.nn.Sequential(torch.nn.Dropout(0.9))
        def cases():
            return [("a", torch.ones(100))]
    """)
    report = compare(path)
    assert report["trials"][0]["max_abs_diff"] == 0.0


def test_a_half_precision_model_is_rejected_as_a_baseline(tmp_path):
    path = write_spec(tmp_path, """
        import torch
        def model():
            return torch.nn.Linear(2, 2).half()
        def cases():
            return [("a", torch.ones(2))]
    """)
    with pytest.raises(CompareError, match=r"'weight' in float16; the baseline must be FP32: do not call \.half\(\)"):
        compare(path)


def test_a_double_precision_model_is_rejected_with_advice_that_fits_it(tmp_path):
    path = write_spec(tmp_path, """
        import torch
        def model():
            return torch.nn.Linear(2, 2).double()
        def cases():
            return [("a", torch.ones(2))]
    """)
    with pytest.raises(CompareError, match="'weight' in float64; the baseline must be FP32: build it in float32"):
        compare(path)


def test_half_precision_inputs_are_rejected(tmp_path):
    path = write_spec(tmp_path, """
        import torch
        def model():
            return torch.nn.Linear(2, 2)
        def cases():
            return [("a", torch.ones(2, dtype=torch.bfloat16))]
    """)
    with pytest.raises(CompareError, match="case 'a': its input is bfloat16"):
        compare(path)


def test_a_half_precision_part_of_an_input_is_named(tmp_path):
    path = write_spec(tmp_path, """
        import torch
        class Pair(torch.nn.Module):
            def forward(self, batch):
                return batch["image"] + batch["mask"]
        def model():
            return Pair()
        def cases():
            return [("a", {"image": torch.ones(2), "mask": torch.ones(2, dtype=torch.float64)})]
    """)
    with pytest.raises(CompareError, match="case 'a': input 'mask' is float64"):
        compare(path)


@pytest.mark.parametrize(
    "cases_body, expected",
    [
        ("return []", "returned no cases"),
        ("return [('a', torch.ones(2)), ('a', torch.ones(2))]", "duplicate case id 'a'"),
        ("return [torch.ones(2)]", "item 0 is not an (id, input) pair"),
        ("return [(1.5, torch.ones(2))]", "the case id must be a string, got float"),
        ("return 3", "`cases` must give an iterable of (id, input) pairs, got int"),
    ],
)
def test_bad_cases_are_errors(tmp_path, cases_body, expected):
    path = write_spec(tmp_path, f"""
        import torch
        def model():
            return torch.nn.Linear(2, 2)
        def cases():
            {cases_body}
    """)
    with pytest.raises(CompareError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        compare(path)


def test_model_that_is_not_a_module_is_an_error(tmp_path):
    path = write_spec(tmp_path, "def model():\n    return 3\ndef cases():\n    return [('a', 1.0)]\n")
    with pytest.raises(CompareError, match="must return a torch.nn.Module, got int"):
        compare(path)


def test_a_baseline_forward_error_names_the_case_and_the_line(tmp_path):
    path = write_spec(tmp_path, """
        import torch
        class Picky(torch.nn.Module):
            def forward(self, x):
                if x.sum() > 5:
                    raise ValueError("too large")
                return x
        def model():
            return Picky()
        def cases():
            return [("small", torch.ones(2)), ("large", torch.full((2,), 9.0))]
    """)
    with pytest.raises(CompareError) as caught:
        compare(path)
    assert str(caught.value) == "the FP32 baseline failed on case 'large', line 6 in forward(): ValueError: too large"


def test_a_trial_that_raises_fails_with_its_error_and_the_others_still_run(tmp_path):
    path = write_spec(tmp_path, """
        import torch
        class NoHalf(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(2, 2)
            def forward(self, x):
                y = self.linear(x)
                if y.dtype == torch.float16:
                    raise RuntimeError("custom_op not implemented for 'Half'")
                return y.float()
        def model():
            return NoHalf()
        def cases():
            return [("a", torch.ones(2))]
    """)
    report = compare(path)
    fp16, bf16 = trial(report, "float16"), trial(report, "bfloat16")
    assert fp16["failed_criteria"] == ["error"] and "not implemented for 'Half'" in fp16["error"]
    assert bf16["error"] is None and bf16["cases"]


def test_inputs_are_passed_as_positional_or_keyword_arguments(tmp_path):
    path = write_spec(tmp_path, """
        import torch
        TRIALS = ["bfloat16"]
        class TwoInputs(torch.nn.Module):
            def forward(self, x, scale=1.0):
                return x * scale
        def model():
            return TwoInputs()
        def cases():
            return [("tuple", (torch.ones(2), 2.0)), ("dict", {"x": torch.ones(2), "scale": 3.0})]
    """)
    report = compare(path)
    assert report["trials"][0]["passed"]


def test_custom_decide_and_margin_judge_both_sides(tmp_path):
    path = write_spec(tmp_path, """
        import torch
        TRIALS = ["bfloat16"]
        CRITERIA = {"atol": 1.0, "near_tie_margin": 0.1}
        def model():
            return torch.nn.Identity()
        def cases():
            return [("far", torch.tensor([0.2])), ("close", torch.tensor([0.5019]))]
        def decide(output):
            return "alarm" if output.item() > 0.5 else "ok"
        def margin(output):
            return abs(output.item() - 0.5)
    """)
    # Identity under autocast keeps float32, so nothing changes; the margins still mark the near tie.
    result = compare(path)["trials"][0]
    assert [case["decision"] for case in result["cases"]] == ["ok", "alarm"]
    assert ids_where(result, "near_tie") == ["close"]


def test_decide_raising_on_finite_trial_outputs_is_a_trial_error_not_a_changed_decision(tmp_path):
    path = write_spec(tmp_path, """
        import torch
        TRIALS = ["float16"]
        def model():
            return torch.nn.Linear(2, 2)
        def cases():
            return [("x", torch.ones(1, 2))]
        def decide(output):
            assert output.dtype == torch.float32, f"decide got {output.dtype}"
            return int(output.argmax())
    """)
    result = trial(compare(path), "float16")
    assert result["failed_criteria"] == ["error"] and result["decision_changes"] == 0
    assert result["error"] == "case 'x': decide() on the trial's outputs, line 9: AssertionError: decide got torch.float16"


def test_nested_outputs_use_the_first_floating_leaf_for_the_default_decision(tmp_path):
    path = write_spec(tmp_path, """
        import torch
        TRIALS = ["float16"]
        CRITERIA = {"atol": {"scores": 0.01, "energy": 1.0}}
        class TwoHeads(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.scores = torch.nn.Linear(4, 3)
                self.energy = torch.nn.Linear(4, 1)
                with torch.no_grad():
                    self.energy.weight.fill_(30000.0)
            def forward(self, x):
                return {"scores": self.scores(x), "energy": self.energy(x)}
        def model():
            torch.manual_seed(0)
            return TwoHeads()
        def cases():
            return [("calm", torch.full((4,), 0.1)), ("hot", torch.full((4,), 1.0))]
    """)
    fp16 = compare(path)["trials"][0]
    hot = next(case for case in fp16["cases"] if case["id"] == "hot")
    # 4 * 30000 overflows float16 in the "energy" head only: the decision (from "scores") holds.
    assert not hot["finite"] and hot["worst"]["output"] == "energy" and not hot["decision_changed"]
    assert ids_where(fp16, "finite", False) == ["hot"]


def test_baseline_below_min_quality_is_an_error(tmp_path):
    path = write_spec(tmp_path, """
        import torch
        CRITERIA = {"min_quality": 0.9}
        def model():
            return torch.nn.Identity()
        def cases():
            return [("a", torch.ones(2))]
        def quality(outputs, ids):
            return 0.5
    """)
    with pytest.raises(CompareError, match="baseline's quality 0.5 is below min_quality 0.9"):
        compare(path)


def test_quality_failing_on_trial_outputs_fails_the_trial(tmp_path):
    path = write_spec(tmp_path, """
        import torch
        TRIALS = ["bfloat16"]
        CRITERIA = {"atol": 1.0}
        def model():
            return torch.nn.Linear(1, 1)
        def cases():
            return [("a", torch.ones(1))]
        def quality(outputs, ids):
            if outputs["a"].dtype != torch.float32:
                raise TypeError("expected float32 scores")
            return 1.0
    """)
    result = compare(path)["trials"][0]
    assert result["failed_criteria"] == ["quality"] and "expected float32" in result["quality_error"]


def test_trial_quality_in_trial_dtype_below_the_minimum_fails(tmp_path):
    path = write_spec(tmp_path, """
        import torch
        TRIALS = ["bfloat16"]
        CRITERIA = {"atol": 1.0, "max_decision_changes": 1, "min_quality": 1.0}
        def model():
            lin = torch.nn.Linear(2, 2, bias=False)
            with torch.no_grad():
                lin.weight.copy_(torch.eye(2))
            return lin
        def cases():
            return [("a", torch.tensor([1.0, 1.0003]))]
        def quality(outputs, ids):
            return float(outputs["a"][1] > outputs["a"][0])
    """)
    result = compare(path)["trials"][0]
    assert result["quality"] == 0.0 and "quality" in result["failed_criteria"]


def test_cuda_device_without_cuda_is_an_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    path = write_spec(tmp_path, "import torch\ndef model():\n    return torch.nn.Identity()\ndef cases():\n    return [('a', torch.ones(1))]\n")
    with pytest.raises(CompareError, match="CUDA is not available"):
        compare(path, device="cuda")


def test_an_error_inside_a_cases_generator_names_its_line(tmp_path):
    path = write_spec(tmp_path, """
        import torch
        def model():
            return torch.nn.Identity()
        def cases():
            yield "a", torch.ones(1)
            raise KeyError("labels.csv")
    """)
    with pytest.raises(CompareError) as caught:
        compare(path)
    assert str(caught.value) == "cases(), line 7: KeyError: 'labels.csv'"


def _spec(tmp_path, body: str):
    path = tmp_path / "spec.py"
    path.write_text(textwrap.dedent(body))
    return path


IDENTITY = """
import torch
def model():
    m = torch.nn.Linear(3, 3)
    with torch.no_grad():
        m.weight.copy_(torch.eye(3))
        m.bias.zero_()
    return m
"""


def test_every_changed_row_of_a_batched_case_counts_as_a_changed_decision(tmp_path):
    """Three near-tie rows in a batch of eight change in bfloat16: three decisions, not one case."""
    body = IDENTITY + """
def cases():
    return [("batch-of-8", torch.tensor([[1.0, 1.0003, 0.0]] * 3 + [[2.0, 0.0, 0.0]] * 5))]
CRITERIA = {"max_decision_changes": 2}
"""
    [trial] = compare(_spec(tmp_path, body), trials=("bfloat16",))["trials"]
    assert trial["decision_changes"] == 3 and trial["cases"][0]["decisions_changed"] == 3
    assert "decision_changes" in trial["failed_criteria"]


def test_per_pixel_scores_have_no_default_decision(tmp_path):
    """`[B, C, H, W]`: the last dimension is the width, not the classes; decide() must say."""
    body = """
import torch
def model():
    m = torch.nn.Conv2d(2, 2, 1)
    with torch.no_grad():
        m.weight.copy_(torch.eye(2).view(2, 2, 1, 1))
        m.bias.zero_()
    return m
def cases():
    return [("tile", torch.tensor([[[[1.0, 5.0, 5.0]], [[1.0003, 0.0, 0.0]]]]))]
"""
    report = compare(_spec(tmp_path, body), trials=("bfloat16",))
    assert report["baseline"]["cases"][0]["decision"] is None
    assert report["baseline"]["cases"][0]["margin"] is None


def test_a_custom_decide_without_margin_has_no_margin(tmp_path):
    """Scores two apart by 1e-4 are no near tie for a decide() that thresholds another entry."""
    body = """
import torch
def model():
    return torch.nn.Identity()
def cases():
    return [("close scores", torch.tensor([[0.5, 0.5001, -3.0]]))]
def decide(output):
    return bool(output[0, 2] > 0)
"""
    report = compare(_spec(tmp_path, body), trials=("bfloat16",))
    assert report["baseline"]["cases"][0]["margin"] is None
    assert report["trials"][0]["cases"][0]["near_tie"] is False


def test_the_worst_element_is_the_one_farthest_outside_its_own_output_tolerance(tmp_path):
    body = """
import torch
class TwoScales(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(2, 2)
        with torch.no_grad():
            self.l.weight.copy_(torch.eye(2))
            self.l.bias.zero_()
    def forward(self, x):
        h = self.l(x)
        return {"logits": h, "boxes": h * 300 + 400}
def model():
    return TwoScales()
def cases():
    return [("c0", torch.tensor([[0.1234567, 1.3]]))]
CRITERIA = {"atol": {"logits": 1e-4, "boxes": 2.0}}
"""
    [trial] = compare(_spec(tmp_path, body), trials=("bfloat16",))["trials"]
    case = trial["cases"][0]
    assert not case["within_tolerance"] and case["worst"]["output"] == "logits"
    assert case["max_abs_diff"] > 1.0  # the absolute gap of the boxes, within their own tolerance


def test_a_negative_margin_is_an_error(tmp_path):
    body = IDENTITY + """
def cases():
    return [("a", torch.tensor([[1.0, 0.0, 0.0]]))]
def decide(output):
    return bool(output[0, 0] > 50.0)
def margin(output):
    return float(output[0, 0] - 50.0)
"""
    with pytest.raises(CompareError, match="non-negative"):
        compare(_spec(tmp_path, body), trials=("bfloat16",))


TOP3 = """
def decide(output):
    return output.topk(3, dim=-1).indices.tolist()
def margin(output):
    top = output.topk(4, dim=-1).values
    return float((top[..., :-1] - top[..., 1:]).min())
"""


def test_a_ranking_that_changes_in_one_row_of_a_batch_is_one_changed_decision(tmp_path):
    """Row 0's top-3 swaps two entries (1.0003 rounds to 1.0); row 1 keeps its ranking."""
    body = IDENTITY.replace("Linear(3, 3)", "Linear(4, 4)").replace("eye(3)", "eye(4)") + TOP3 + """
def cases():
    return [("batch-2", torch.tensor([[3.0, 1.0, 1.0003, 0.0], [3.0, 2.0, 1.0, 0.0]]))]
"""
    report = compare(_spec(tmp_path, body), trials=("bfloat16",))
    [case] = report["trials"][0]["cases"]
    assert report["baseline"]["cases"][0]["decision_count"] == 2
    assert case["decisions_changed"] == 1 and report["trials"][0]["decision_changes"] == 1


def test_the_default_decision_of_token_scores_counts_tokens_on_both_sides(tmp_path):
    body = IDENTITY + """
def cases():
    return [("sentences", torch.tensor([[[1.0, 1.0003, 0.0]] * 4] * 2))]  # [B=2, T=4, C=3]
"""
    report = compare(_spec(tmp_path, body), trials=("bfloat16",))
    assert report["baseline"]["cases"][0]["decision_count"] == 8
    assert report["trials"][0]["decision_changes"] == 8


@pytest.mark.parametrize("bad", ["float('nan')", "float('inf')", "torch.tensor(float('nan'))"])
def test_a_margin_that_is_not_a_finite_number_is_an_error(tmp_path, bad):
    body = IDENTITY + f"""
def cases():
    return [("a", torch.tensor([[1.0, 0.0, 0.0]]))]
def margin(output):
    return {bad}
"""
    with pytest.raises(CompareError, match="margin\\(\\) must return a finite, non-negative distance .* got (nan|inf)"):
        compare(_spec(tmp_path, body), trials=("bfloat16",))


def test_a_quality_that_is_not_a_finite_number_is_named_for_the_trial_and_refused_for_the_baseline(tmp_path):
    body = IDENTITY + """
def cases():
    return [("a", torch.tensor([[1.0, 0.0, 0.0]]))]
def quality(outputs, ids):
    return 1.0 if outputs["a"].dtype == torch.float32 else float("-inf")
"""
    result = compare(_spec(tmp_path, body), trials=("bfloat16",))["trials"][0]
    assert result["quality"] is None and result["quality_error"] == "quality() returned -inf"
    assert result["failed_criteria"] == ["quality"]
    with pytest.raises(CompareError, match=r"^quality\(\) returned nan on the baseline outputs; it must return a finite number$"):
        compare(_spec(tmp_path, body.replace("1.0 if", "float('nan') if")), trials=("bfloat16",))


def test_a_trial_raising_inside_the_specs_forward_names_the_spec_line(tmp_path):
    body = """
import torch
class Float32Only(torch.nn.Module):
    def forward(self, x):
        if torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu"):
            raise RuntimeError("custom kernel only supports float32")
        return x
def model():
    return Float32Only()
def cases():
    return [("a", torch.ones(2))]
"""
    result = compare(_spec(tmp_path, body), trials=("bfloat16",))["trials"][0]
    assert result["error"] == "case 'a', line 6 in forward(): RuntimeError: custom kernel only supports float32"
