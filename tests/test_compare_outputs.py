"""Outputs: named leaves, the default decision and margin, comparison of one case, hashing."""

from __future__ import annotations

import collections
import math

import pytest
import torch

from amplint.compare import outputs as out
from amplint.compare.criteria import parse_criteria
from amplint.compare.errors import CompareError
from amplint.compare.run import compare_outputs


def test_leaves_name_every_numeric_leaf_of_nested_outputs():
    Pair = collections.namedtuple("Pair", "mean var")
    output = {"logits": torch.zeros(2), "aux": (torch.ones(1), Pair(torch.ones(1), 2.0)), "label": "cat", "mask": None}
    assert [name for name, _ in out.leaves(output)] == ["logits", "aux.0", "aux.1.mean", "aux.1.var"]


def test_a_lone_tensor_is_called_output():
    assert [name for name, _ in out.leaves(torch.zeros(3))] == ["output"]


def test_default_decision_is_argmax_of_the_last_dimension():
    assert out.default_decide(torch.tensor([0.1, 0.7, 0.2])) == 1
    assert out.default_decide(torch.tensor([[0.1, 0.7, 0.2]])) == 1  # a batch of one decides like a row
    assert out.default_decide(torch.tensor([[0.1, 0.7], [0.9, 0.2]])) == [1, 0]


def test_default_decision_breaks_ties_towards_the_lowest_index():
    assert out.default_decide(torch.tensor([0.5, 1.0, 1.0, 1.0])) == 1
    assert out.default_decide(torch.tensor([1.0, 1.0], dtype=torch.bfloat16)) == 0


def test_default_decision_of_a_nan_row_is_none():
    assert out.default_decide(torch.tensor([[float("nan"), 1.0], [0.0, 1.0]])) == [None, 1]


def test_a_one_element_output_has_no_default_decision():
    assert out.default_decide(torch.tensor([3.5])) is None
    assert out.default_decide(torch.tensor(3.5)) is None
    assert out.default_margin(torch.tensor([3.5])) is None


def test_a_batch_of_one_element_rows_has_no_default_decision():
    single_logits = torch.tensor([[0.3], [2.0], [-1.0], [0.0]])  # a batch regressor, or binary logits
    assert out.default_decide(single_logits) is None
    assert out.default_margin(single_logits) is None


def test_default_decision_uses_the_first_floating_leaf_of_a_nested_output():
    output = {"ids": torch.tensor([4, 9]), "scores": torch.tensor([0.2, 0.3, 0.1]), "other": torch.tensor([9.0, 0.0])}
    assert out.default_decide(output) == 1


def test_margin_is_the_smallest_top_two_gap_over_rows():
    scores = torch.tensor([[1.0, 1.0003, 0.0], [5.0, 1.0, 0.0]])
    assert out.default_margin(scores) == pytest.approx(3e-4, rel=1e-3)


def test_decisions_become_json_values():
    assert out.jsonable(torch.tensor(2)) == 2
    assert out.jsonable((torch.tensor([1, 2]), "reject")) == [[1, 2], "reject"]
    assert out.jsonable(float("inf")) is None


def test_weights_hash_changes_with_any_weight():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    before = out.weights_hash(model)
    assert out.weights_hash(model) == before
    with torch.no_grad():
        model.weight[0, 0] += 1e-7
    assert out.weights_hash(model) != before


def test_inputs_hash_depends_on_ids_and_values():
    cases = [("a", torch.ones(2)), ("b", {"x": torch.zeros(2)})]
    assert out.inputs_hash(cases) == out.inputs_hash([("a", torch.ones(2)), ("b", {"x": torch.zeros(2)})])
    assert out.inputs_hash(cases) != out.inputs_hash([("a", torch.ones(2)), ("c", {"x": torch.zeros(2)})])
    assert out.inputs_hash(cases) != out.inputs_hash([("a", torch.ones(2)), ("b", {"x": torch.full((2,), 1e-9)})])


def criteria(**values):
    return parse_criteria(values)


def test_tolerance_is_atol_plus_rtol_times_the_baseline():
    base = torch.tensor([100.0, 1.0])
    inside = compare_outputs(base, torch.tensor([100.5, 1.0]), criteria(atol=0.01, rtol=0.005))
    outside = compare_outputs(base, torch.tensor([100.0, 1.02]), criteria(atol=0.01, rtol=0.005))
    assert inside["within_tolerance"] and inside["max_abs_diff"] == pytest.approx(0.5)
    assert not outside["within_tolerance"] and outside["max_abs_diff"] == pytest.approx(0.02, rel=1e-5)


def test_the_largest_gap_is_located_with_both_values():
    result = compare_outputs(torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0, 2.5]]), criteria())
    assert result["worst"] == {"output": "output", "index": [0, 1], "baseline": 2.0, "trial": 2.5}


def test_a_nan_or_inf_trial_is_non_finite_and_outside_any_tolerance():
    for bad in (float("nan"), float("inf")):
        result = compare_outputs(torch.tensor([1.0, 2.0]), torch.tensor([1.0, bad]), criteria(atol=1e9))
        assert not result["finite"] and not result["within_tolerance"]
        assert math.isinf(result["max_abs_diff"])
        assert result["worst"]["index"] == [1] and result["worst"]["trial"] in ("nan", "inf")


def test_every_floating_leaf_of_a_nested_output_is_compared():
    base = {"scores": torch.tensor([1.0, 2.0]), "aux": (torch.tensor([10.0]),)}
    trial = {"scores": torch.tensor([1.0, 2.0]), "aux": (torch.tensor([10.5]),)}
    result = compare_outputs(base, trial, criteria(atol=0.1))
    assert not result["within_tolerance"] and result["worst"]["output"] == "aux.0"


def test_per_output_tolerance_applies_to_each_named_output():
    base = {"scores": torch.tensor([1.0]), "box": torch.tensor([200.0])}
    trial = {"scores": torch.tensor([1.001]), "box": torch.tensor([200.4])}
    assert compare_outputs(base, trial, criteria(atol={"scores": 0.01, "box": 0.5}))["within_tolerance"]
    assert not compare_outputs(base, trial, criteria(atol={"scores": 0.01, "*": 0.1}))["within_tolerance"]


def test_per_output_tolerance_must_name_real_outputs_and_cover_all():
    with pytest.raises(CompareError, match="names output 'boxes'"):
        criteria(atol={"boxes": 0.1}).check_output_names(["box", "scores"])
    with pytest.raises(CompareError, match="gives no tolerance for output 'scores'"):
        criteria(atol={"box": 0.1}).check_output_names(["box", "scores"])


def test_a_change_of_output_structure_or_shape_is_outside_tolerance():
    assert not compare_outputs({"a": torch.ones(1)}, {"b": torch.ones(1)}, criteria())["within_tolerance"]
    result = compare_outputs(torch.ones(2), torch.ones(3), criteria())
    assert not result["within_tolerance"] and "shape" in result["note"]


def test_a_custom_decision_is_one_per_batch_row_however_long_each_row_is():
    """A top-3 ranking per query: one swapped pair in one of two rows is one changed decision."""
    base = out.decision_units([[0, 2, 1], [0, 1, 2]], rows=2, default=False)
    trial = out.decision_units([[0, 1, 2], [0, 1, 2]], rows=2, default=False)
    assert out.count_decided(base) == 2 and out.count_changed(base, trial) == 1
    # Unbatched, or a list that is not one entry per row: the whole case is one decision.
    assert out.decision_units([0, 2, 1], rows=1, default=False) == [[0, 2, 1]]
    assert out.decision_units([0, 2, 1], rows=None, default=False) == [[0, 2, 1]]


def test_the_default_decision_counts_every_argmax_row_token_by_token():
    tokens = out.decision_units([[1, 2, 0], [4, 4, 3]], rows=2, default=True)
    assert out.count_decided(tokens) == 6
    assert out.count_changed(tokens, out.decision_units([[1, 2, 0], [4, None, 3]], rows=2, default=True)) == 1
    assert out.count_decided(out.decision_units(None, rows=None, default=True)) == 0


def test_a_changed_non_numeric_leaf_puts_the_case_outside_tolerance_and_says_what_changed():
    base = {"label": "dog", "confidence": torch.tensor([1.0003])}
    trial = {"label": "cat", "confidence": torch.tensor([1.0])}
    result = compare_outputs(base, trial, criteria(atol=0.01))
    assert not result["within_tolerance"] and result["note"] == "output 'label': 'dog' → 'cat'"
    assert result["max_abs_diff"] == pytest.approx(3e-4, rel=1e-2)  # the numeric leaf is still compared
    assert compare_outputs(base, {**base}, criteria())["within_tolerance"]


def test_the_baselines_own_inf_reproduced_exactly_is_equal_and_out_of_the_gaps():
    masked = torch.tensor([0.5, float("-inf"), 2.0])
    result = compare_outputs(masked, torch.tensor([0.504, float("-inf"), 2.0]), criteria())
    assert result["finite"] and result["within_tolerance"]
    assert result["max_abs_diff"] == pytest.approx(0.004, rel=1e-3) and result["worst"]["index"] == [0]


@pytest.mark.parametrize(
    "trial_values",
    [
        [float("-inf"), float("-inf"), 2.0],  # a finite baseline value turned -inf
        [0.5, -3.0e38, 2.0],  # the baseline's -inf turned finite
        [0.5, float("inf"), 2.0],  # the other infinity
        [0.5, float("nan"), 2.0],
    ],
)
def test_any_other_non_finite_difference_is_non_finite_and_outside(trial_values):
    result = compare_outputs(torch.tensor([0.5, float("-inf"), 2.0]), torch.tensor(trial_values), criteria(atol=1e9))
    assert not result["finite"] and not result["within_tolerance"]


def test_the_default_margin_of_masked_scores_is_none_when_not_finite():
    assert out.default_margin(torch.tensor([[1.0, float("-inf"), float("-inf")]])) is None
    assert out.default_margin(torch.tensor([[1.0, 0.25, float("-inf")]])) == 0.75


def test_a_fully_masked_row_does_not_hide_a_near_tie_in_another_row():
    inf = float("inf")
    scores = torch.tensor([[1.0, 0.5, -inf], [-inf, -inf, -inf], [2.0, 1.9995, 0.0]], dtype=torch.float64)
    assert out.default_margin(scores) == pytest.approx(0.0005)


class _Handle:
    """An object compared by identity, like Hugging Face's DynamicCache."""


def test_an_object_compared_by_identity_only_needs_the_same_type():
    assert out.same_value(_Handle(), _Handle())
    assert not out.same_value(_Handle(), "cache")


def test_a_label_must_be_equal():
    assert not out.same_value("dog", "cat")


def test_an_integer_leaf_is_compared_exactly_whatever_its_tolerance():
    """A detector's class ids: a change from 1 to 0 is no difference of 1 within `"*": 2.0`."""
    criteria = parse_criteria({"atol": {"scores": 5e-3, "*": 2.0}, "rtol": 0.0})
    base = {"scores": torch.tensor([0.9, 0.1]), "labels": torch.tensor([1]), "boxes": torch.tensor([10.0, 20.0])}
    trial = {"scores": torch.tensor([0.9, 0.1]), "labels": torch.tensor([0]), "boxes": torch.tensor([11.0, 20.0])}
    result = compare_outputs(base, trial, criteria)
    assert not result["within_tolerance"]
    assert result["worst"]["output"] == "labels"
    assert compare_outputs(base, {**trial, "labels": torch.tensor([1])}, criteria)["within_tolerance"]  # boxes: 1.0 within 2.0
