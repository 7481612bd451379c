"""Spec loading: what a spec may define, and one clear error for everything it gets wrong."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from amplint.compare.criteria import DEFAULT_CRITERIA, changes_since, parse_criteria
from amplint.compare.errors import CompareError
from amplint.compare.spec import load_spec, parse_device, parse_trials

MINIMAL = """
import torch
def model():
    return torch.nn.Linear(2, 2)
def cases():
    return [("a", torch.ones(2))]
"""


def write_spec(tmp_path, body: str, name: str = "spec.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def load_error(tmp_path, body: str) -> str:
    with pytest.raises(CompareError) as caught:
        load_spec(write_spec(tmp_path, body))
    return str(caught.value)


def test_minimal_spec_gets_the_contract_defaults(tmp_path):
    spec = load_spec(write_spec(tmp_path, MINIMAL))
    assert spec.criteria.to_json() == DEFAULT_CRITERIA
    assert spec.trials == ("bfloat16", "float16")
    assert spec.device == "cpu"
    assert spec.decide is None and spec.quality is None and spec.margin is None


def test_missing_model_is_an_error(tmp_path):
    message = load_error(tmp_path, "import torch\ndef cases():\n    return []\n")
    assert message == "the spec defines no `model`"


def test_missing_cases_names_the_close_misspelling(tmp_path):
    message = load_error(tmp_path, MINIMAL.replace("def cases", "def case"))
    assert "defines no `cases`" in message and "`case`" in message


def test_misspelt_uppercase_setting_is_not_silently_ignored(tmp_path):
    message = load_error(tmp_path, MINIMAL + "TRIAL = ['float16']\n")
    assert message.startswith("the spec defines `TRIAL`; did you mean `TRIALS`?")


@pytest.mark.parametrize(
    ("definition", "meant"),
    [
        ("criteria = {'atol': 1e-6}\n", "CRITERIA"),
        ("device = 'cpu'\n", "DEVICE"),
        ("def decied(output):\n    return output.argmax(-1)\n", "decide"),
        ("def decision(output):\n    return output.argmax(-1)\n", "decide"),
        ("def margins(output):\n    return 1.0\n", "margin"),
    ],
)
def test_a_name_in_another_case_or_misspelt_is_an_error_not_a_silent_default(tmp_path, definition, meant):
    message = load_error(tmp_path, MINIMAL + definition)
    assert f"did you mean `{meant}`?" in message and "_" in message.split("(")[-1]


def test_private_and_imported_names_are_not_taken_for_misspellings(tmp_path):
    (tmp_path / "helpers.py").write_text("def decision(output):\n    return output.argmax(-1)\n")
    body = MINIMAL + "from helpers import decision\n_device = 'cpu'\nimport math as margins\n"
    assert load_spec(write_spec(tmp_path, body)).decide is None


def test_model_can_import_a_helper_beside_the_spec_when_it_runs(tmp_path):
    (tmp_path / "net_helper.py").write_text("import torch\ndef build():\n    return torch.nn.Linear(3, 3)\n")
    body = MINIMAL.replace("def model():", "def model():\n    from net_helper import build\n    return build()\ndef _unused():")
    spec = load_spec(write_spec(tmp_path, body))
    assert spec.model().in_features == 3


def test_unrelated_uppercase_constants_are_allowed(tmp_path):
    spec = load_spec(write_spec(tmp_path, MINIMAL + "THRESHOLD = 0.5\nLABELS = {}\n"))
    assert spec.trials == ("bfloat16", "float16")


@pytest.mark.parametrize(
    "criteria, expected",
    [
        ({"atoll": 0.1}, "CRITERIA: unknown key 'atoll'; did you mean 'atol'?"),
        ({"atol": "0.1"}, "CRITERIA['atol'] must be a number, got str '0.1'"),
        ({"rtol": -1e-3}, "CRITERIA['rtol'] must be >= 0, got -0.001"),
        ({"near_tie_margin": float("nan")}, "CRITERIA['near_tie_margin'] must be finite, got nan"),
        ({"max_decision_changes": 1.5}, "CRITERIA['max_decision_changes'] must be a whole number, got float 1.5"),
        ({"max_decision_changes": True}, "CRITERIA['max_decision_changes'] must be a whole number, got bool True"),
        ({"max_decision_changes": -1}, "CRITERIA['max_decision_changes'] must be >= 0, got -1"),
        ({"min_quality": "high"}, "CRITERIA['min_quality'] must be a number, got str 'high'"),
        ({"atol": {}}, "CRITERIA['atol'] is an empty dict; give a number or one per output"),
        ({"atol": {"logits": -2}}, "CRITERIA['atol']['logits'] must be >= 0, got -2"),
    ],
)
def test_bad_criteria_are_rejected_with_the_offending_key(criteria, expected):
    with pytest.raises(CompareError) as caught:
        parse_criteria(criteria)
    assert str(caught.value) == expected


def test_criteria_must_be_a_dict(tmp_path):
    assert load_error(tmp_path, MINIMAL + "CRITERIA = [0.1]\n") == "CRITERIA must be a dict, got list"


def test_given_criteria_keep_their_values_and_the_rest_default():
    criteria = parse_criteria({"atol": 0, "min_quality": 0.9})
    assert criteria.to_json() == {**DEFAULT_CRITERIA, "atol": 0.0, "min_quality": 0.9}


def test_min_quality_without_a_quality_function_is_an_error(tmp_path):
    message = load_error(tmp_path, MINIMAL + "CRITERIA = {'min_quality': 0.9}\n")
    assert "min_quality" in message and "quality(outputs, ids)" in message


@pytest.mark.parametrize("dtype", ["float8", "float32", "int8"])
def test_unknown_trial_dtype_is_an_error(dtype):
    with pytest.raises(CompareError, match=f"TRIALS: unknown dtype '{dtype}'"):
        parse_trials([dtype])


def test_trial_dtypes_accept_torch_dtypes_and_short_names():
    import torch

    assert parse_trials([torch.float16, "bf16"]) == ("float16", "bfloat16")


@pytest.mark.parametrize("trials, expected", [([], "TRIALS is empty"), (["fp16", "float16"], "TRIALS lists 'float16' twice"), ("float16", "TRIALS must be a list")])
def test_bad_trial_lists_are_errors(trials, expected):
    with pytest.raises(CompareError, match=expected):
        parse_trials(trials)


@pytest.mark.parametrize("device", ["gpu", "cpu:0", "cuda:x", 3])
def test_bad_device_is_an_error(device):
    with pytest.raises(CompareError, match="DEVICE must be"):
        parse_device(device)


def test_cuda_device_with_index_is_accepted():
    assert parse_device("cuda:1") == "cuda:1"


def test_command_line_overrides_trials_and_device(tmp_path):
    spec = load_spec(write_spec(tmp_path, MINIMAL + "TRIALS = ['bfloat16']\n"), device="cuda", trials=("float16",))
    assert spec.trials == ("float16",) and spec.device == "cuda" and spec.device_type == "cuda"


def test_a_spec_that_raises_on_import_reports_its_line(tmp_path):
    message = load_error(tmp_path, "import torch\n\nraise ValueError('no weights file')\n")
    assert message == "line 3: ValueError: no weights file"


def test_a_spec_with_a_syntax_error_reports_its_line(tmp_path):
    assert load_error(tmp_path, "def model(:\n").startswith("line 1: SyntaxError")


def test_decide_must_be_callable(tmp_path):
    assert load_error(tmp_path, MINIMAL + "decide = 3\n") == "`decide` must be a function, got int"


def test_missing_file_and_directory_are_errors(tmp_path):
    with pytest.raises(CompareError, match="no such file"):
        load_spec(str(tmp_path / "absent.py"))
    with pytest.raises(CompareError, match="is a directory"):
        load_spec(str(tmp_path))


def test_a_spec_can_import_a_helper_beside_it(tmp_path):
    (tmp_path / "helpers_for_spec.py").write_text("SIZE = 3\n")
    spec = load_spec(write_spec(tmp_path, "from helpers_for_spec import SIZE\n" + MINIMAL))
    assert spec.model().in_features == 2


def test_a_spec_may_use_dataclasses(tmp_path):
    spec = load_spec(write_spec(tmp_path, "import dataclasses\n@dataclasses.dataclass\nclass Config:\n    width: int = 2\n" + MINIMAL))
    assert spec.model().out_features == 2


def test_specs_named_like_a_module_or_like_each_other_stay_apart_and_import_again_in_a_new_process(tmp_path):
    """A spawned DataLoader worker unpickles the spec's classes by module name: a fresh process
    must find each spec's own file, and `json.py` must not take the place of the real `json`."""
    markers = []
    for folder in ("first", "second"):
        (tmp_path / folder).mkdir()
        body = f"class Marker:\n    WHERE = {folder!r}\ndef model():\n    pass\ndef cases():\n    return []\n"
        spec = load_spec(write_spec(tmp_path / folder, body, name="json.py"))
        markers.append(vars(sys.modules[spec.model.__module__])["Marker"]())
    assert sys.modules["json"].__file__ != str(tmp_path / "second" / "json.py")
    fresh = subprocess.run(
        [sys.executable, "-c", "import pickle, sys; print(*(m.WHERE for m in pickle.load(sys.stdin.buffer)))"],
        input=pickle.dumps(markers), capture_output=True, check=False, cwd=Path(__file__).resolve().parent.parent,
    )
    assert fresh.stdout.decode().split() == ["first", "second"], fresh.stderr.decode()


def test_criteria_changed_since_a_baseline_are_named_one_by_one():
    saved = parse_criteria({"atol": 1e-3}).to_json()
    assert changes_since(saved, parse_criteria({"atol": 0.1}).to_json()) == ["atol 0.001 -> 0.1"]
    assert changes_since(saved, parse_criteria({"atol": 1e-3}).to_json()) == []
    assert changes_since(saved, parse_criteria({"atol": {"*": 0.1}, "min_quality": 0.5}).to_json()) == [
        "atol 0.001 -> {*: 0.1}", "min_quality None -> 0.5",
    ]
