"""Stored baselines: saved once, compared later, refused when they no longer match the spec."""

from __future__ import annotations

import textwrap

import pytest
import torch

from amplint.compare import run, store
from amplint.compare.errors import CompareError
from amplint.compare.spec import load_spec

SPEC = """
import torch
CRITERIA = {"atol": ATOL}
TRIALS = ["bfloat16"]
def model():
    torch.manual_seed(SEED)
    return torch.nn.Linear(4, 3)
def cases():
    return [(case_id, torch.full((4,), value)) for case_id, value in CASES]
"""
CASES = [("a", 1.0), ("b", -2.0), ("c", 0.5)]


def prepared_for(tmp_path, seed=0, cases=CASES, atol=0.01, device=None, name="spec.py"):
    body = SPEC.replace("SEED", str(seed)).replace("CASES", repr(cases)).replace("ATOL", repr(atol))
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return run.prepare(load_spec(str(path), device=device))


@pytest.fixture
def saved(tmp_path):
    prepared = prepared_for(tmp_path)
    file = tmp_path / "baseline.pt"
    store.save_baseline(str(file), prepared, run.compute_baseline(prepared))
    return prepared, str(file)


def test_a_stored_baseline_gives_the_same_report_as_a_fresh_one(saved):
    prepared, file = saved
    fresh = run.run_compare(prepared, run.compute_baseline(prepared), measure_gains=False)
    stored = run.run_compare(prepared, store.load_baseline(file, prepared), measure_gains=False)
    assert stored["baseline"]["source"] == file
    stored["baseline"]["source"] = "computed"
    assert stored == fresh


def test_stored_outputs_are_the_fp32_outputs(saved):
    prepared, file = saved
    loaded = store.load_baseline(file, prepared)
    for (case_id, case_input), output in zip(prepared.cases, loaded.outputs):
        assert output.dtype == torch.float32
        assert torch.equal(output, prepared.model(case_input).detach())


def test_other_weights_are_refused(tmp_path, saved):
    _, file = saved
    with pytest.raises(CompareError, match="saved for other model weights"):
        store.load_baseline(file, prepared_for(tmp_path, seed=1, name="other.py"))


def test_other_case_ids_are_refused_and_named(tmp_path, saved):
    _, file = saved
    with pytest.raises(CompareError, match=r"missing from the spec: 'c'; new in the spec: 'd'"):
        store.load_baseline(file, prepared_for(tmp_path, cases=[("a", 1.0), ("b", -2.0), ("d", 0.5)], name="other.py"))


def test_other_inputs_under_the_same_ids_are_refused(tmp_path, saved):
    _, file = saved
    with pytest.raises(CompareError, match="other case inputs with the same ids"):
        store.load_baseline(file, prepared_for(tmp_path, cases=[("a", 1.0), ("b", -2.0), ("c", 0.25)], name="other.py"))


def test_another_device_is_refused(saved):
    prepared, file = saved
    payload = torch.load(file, weights_only=True)
    payload["device"] = "cuda"
    torch.save(payload, file)
    with pytest.raises(CompareError, match="recorded on 'cuda', the spec runs on 'cpu'"):
        store.load_baseline(file, prepared)


def test_a_file_that_is_not_a_baseline_is_refused(tmp_path, saved):
    prepared, _ = saved
    junk = tmp_path / "junk.pt"
    junk.write_text('{"spec": "spec.py", "trials": []}')  # a JSON report passed by mistake
    with pytest.raises(CompareError, match="is not an amplint compare baseline") as refused:
        store.load_baseline(str(junk), prepared)
    assert "weights_only" not in str(refused.value)
    text = tmp_path / "notes.pt"
    text.write_text("hi\n")  # torch.load fails on it with a bare "KeyError: 105"
    with pytest.raises(CompareError, match="is not an amplint compare baseline"):
        store.load_baseline(str(text), prepared)
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.ones(1)}, other)
    with pytest.raises(CompareError, match="is not an amplint compare baseline"):
        store.load_baseline(str(other), prepared)
    with pytest.raises(CompareError, match="no such file"):
        store.load_baseline(str(tmp_path / "absent.pt"), prepared)


def test_criteria_changed_since_saving_are_recorded(tmp_path, saved):
    _, file = saved
    widened = prepared_for(tmp_path, atol=0.5, name="widened.py")
    report = run.run_compare(widened, store.load_baseline(file, widened), measure_gains=False)
    assert report["baseline"]["criteria_at_save"]["atol"] == 0.01
    assert report["baseline"]["criteria_changes"] == ["atol 0.01 -> 0.5"]
    assert report["criteria"]["atol"] == 0.5
