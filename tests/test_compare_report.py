"""The terminal report, rendered from a real comparison into a string."""

from __future__ import annotations

import io
import pathlib

import pytest

from amplint.compare import report as reporting
from amplint.compare import run
from amplint.compare.spec import load_spec

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "compare"


@pytest.fixture(scope="module")
def regressor_report():
    prepared = run.prepare(load_spec(str(FIXTURES / "identity_regressor.py")))
    return run.run_compare(prepared, run.compute_baseline(prepared), measure_gains=False)


def rendered(report: dict, all_cases: bool = False) -> str:
    stream = io.StringIO()
    reporting.render(report, reporting.make_console(stream), all_cases=all_cases)
    return stream.getvalue()


def test_cases_without_a_decision_are_not_said_to_keep_it(regressor_report):
    text = rendered(regressor_report)
    assert "no case has a decision" in text
    assert "5 other case(s): finite, within tolerance\n" in text


def test_a_changed_entry_of_a_long_decision_list_is_named():
    """40 decisions per case are cut short in the table: the changed row is named beside them."""
    prepared = run.prepare(load_spec(str(FIXTURES / "long_batch_near_tie.py")))
    report = run.run_compare(prepared, run.compute_baseline(prepared), measure_gains=False)
    (row,) = [line for line in rendered(report).splitlines() if "[39]" in line]
    assert "[39] 2 → 1" in row
