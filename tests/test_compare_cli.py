"""`amplint compare` end to end: the real CLI, its exit codes, stderr, the JSON contract and the text."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from amplint.cli import main

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "compare"

# A spec written for these tests only: one near tie, one float16 overflow, one visible difference.
ACCEPTANCE_SPEC = """
import torch
CRITERIA = {"atol": 0.01, "rtol": 0.01, "max_decision_changes": 0, "near_tie_margin": 1e-3}
TRIALS = ["bfloat16", "float16"]
DEVICE = "cpu"
def model():
    scores = torch.nn.Linear(3, 3)
    with torch.no_grad():
        scores.weight.copy_(torch.eye(3))
        scores.bias.zero_()
    return scores
def cases():
    yield "ordinary", torch.tensor([0.5, 2.0, 0.25])
    yield "near-tie", torch.tensor([1.0, 1.0003, 0.0])      # both formats round 1.0003 to 1.0
    yield "overflow", torch.tensor([70000.0, 1.0, 2.0])     # > 65504: inf in float16, 70144 in bfloat16
    yield "visible", torch.tensor([300.7, 10.0, 0.0])       # 300 in bfloat16: visible, far from any tie
"""


def amplint(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "amplint", "compare", *args], check=False, capture_output=True, text=True, cwd=cwd, timeout=300
    )


def write(tmp_path: pathlib.Path, body: str, name: str = "spec.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def assert_one_error_line(result, expected_start: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(expected_start), lines[0]
    assert "Traceback" not in result.stderr


def by_id(trial: dict, key: str, value=True) -> list[str]:
    return [case["id"] for case in trial["cases"] if case[key] == value]


@pytest.fixture(scope="module")
def acceptance(tmp_path_factory):
    folder = tmp_path_factory.mktemp("acceptance")
    spec = write(folder, ACCEPTANCE_SPEC)
    result = amplint(spec, "--json", str(folder / "report.json"), "--warmup", "0", "--repeats", "1")
    return result, json.loads((folder / "report.json").read_text())


def test_acceptance_names_every_changed_nonfinite_and_out_of_tolerance_case(acceptance):
    _, report = acceptance
    bf16, fp16 = report["trials"]
    assert (bf16["dtype"], fp16["dtype"]) == ("bfloat16", "float16")
    assert by_id(bf16, "decision_changed") == ["near-tie"]
    # inf * 0 inside the float16 matmul makes every score NaN: no decision is left, so it changed too.
    assert by_id(fp16, "decision_changed") == ["near-tie", "overflow"]
    assert next(case for case in fp16["cases"] if case["id"] == "overflow")["decision"] is None
    assert by_id(bf16, "finite", False) == [] and by_id(fp16, "finite", False) == ["overflow"]
    assert by_id(bf16, "within_tolerance", False) == [] and by_id(fp16, "within_tolerance", False) == ["overflow"]
    assert by_id(bf16, "near_tie") == ["near-tie"]
    visible = next(case for case in bf16["cases"] if case["id"] == "visible")
    assert visible["max_abs_diff"] == pytest.approx(0.7, abs=1e-3) and not visible["decision_changed"]


def test_acceptance_fails_the_trials_that_must_fail_and_times_neither(acceptance):
    result, report = acceptance
    bf16, fp16 = report["trials"]
    assert result.returncode == 1, result.stderr
    assert bf16["failed_criteria"] == ["decision_changes"]
    assert fp16["failed_criteria"] == ["nonfinite_cases", "out_of_tolerance_cases", "decision_changes"]
    assert not bf16["passed"] and not fp16["passed"]
    assert all(t["timing"] is None and t["memory"] is None for t in report["trials"])
    assert "Gains" not in result.stdout and result.stderr == ""


def test_the_text_report_lists_problem_cases_first_with_their_effect(acceptance):
    result, _ = acceptance
    out = result.stdout
    assert "criterion" in out and "reference (float32)" in out and "AMP trial (float16)" in out and "decision" in out
    fp16_section = out[out.index("\nfloat16 autocast trial"):]
    case_lines = [line for line in fp16_section.splitlines() if line.split("│")[0].strip() in ("near-tie", "overflow", "visible", "ordinary")]
    assert [line.split("│")[0].strip() for line in case_lines] == ["near-tie", "overflow"]
    assert "CHANGED" in case_lines[0] and "near tie" in case_lines[0]
    assert "NO" in case_lines[1] and "OUTSIDE" in case_lines[1] and "CHANGED" in case_lines[1]
    assert "2 other case(s)" in fp16_section


def test_criteria_are_printed_before_any_trial_runs(acceptance):
    result, report = acceptance
    lines = result.stdout.splitlines()
    criteria_line = next(i for i, line in enumerate(lines) if line.startswith("Criteria fixed before any trial"))
    first_trial = next(i for i, line in enumerate(lines) if line.startswith("Trial "))
    assert criteria_line < first_trial
    assert "atol=0.01, rtol=0.01" in lines[criteria_line]
    assert report["criteria"] == {
        "atol": 0.01, "rtol": 0.01, "max_decision_changes": 0, "near_tie_margin": 0.001,
        "min_quality": None, "max_out_of_tolerance_cases": 0,
    }


def test_json_report_follows_the_contract(acceptance):
    _, report = acceptance
    assert {"spec", "device", "criteria", "baseline", "trials"} <= set(report)
    assert report["device"] == "cpu" and report["spec"].endswith("spec.py")
    assert {"dtype", "finite", "quality", "cases"} <= set(report["baseline"])
    assert {"id", "finite", "decision", "margin"} <= set(report["baseline"]["cases"][0])
    for trial in report["trials"]:
        assert {"dtype", "passed", "failed_criteria", "decision_changes", "nonfinite_cases",
                "out_of_tolerance_cases", "quality", "cases", "timing", "memory"} <= set(trial)
        for case in trial["cases"]:
            assert {"id", "finite", "max_abs_diff", "within_tolerance", "decision", "decision_changed", "near_tie"} <= set(case)


def test_a_passing_spec_exits_0_with_timing_and_memory(tmp_path):
    result = amplint(str(FIXTURES / "visible_difference.py"), "--json", str(tmp_path / "r.json"), "--warmup", "1", "--repeats", "3")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    for trial in report["trials"]:
        assert trial["passed"] and trial["timing"]["baseline_ms"] > 0 and trial["timing"]["trial_ms"] > 0
        assert trial["memory"]["baseline_bytes"] > 0 and trial["memory"]["trial_bytes"] > 0
    assert "All 2 trial(s) passed" in result.stdout and result.stderr == ""


def test_a_bad_spec_is_one_line_on_stderr_and_exit_2(tmp_path):
    spec = write(tmp_path, "import torch\nCRITERIA = {'atol': -0.1}\ndef model():\n    return torch.nn.Identity()\ndef cases():\n    return []\n")
    result = amplint(spec, "--json", str(tmp_path / "r.json"))
    assert_one_error_line(result, f"amplint compare: error: {spec}: CRITERIA['atol'] must be >= 0, got -0.1")
    assert not (tmp_path / "r.json").exists()


def test_a_spec_that_raises_is_reported_with_its_line_not_a_traceback(tmp_path):
    spec = write(tmp_path, "import torch\n\ndef model():\n    return torch.load('missing-weights.pt')\n\ndef cases():\n    return [('a', torch.ones(1))]\n")
    result = amplint(spec)
    assert_one_error_line(result, f"amplint compare: error: {spec}: model(), line 4: FileNotFoundError:")


def test_a_non_finite_baseline_exits_2_and_still_writes_the_baseline_report(tmp_path):
    spec = write(tmp_path, """
        import torch
        def model():
            return torch.nn.Linear(2, 2)
        def cases():
            return [("fine", torch.ones(2)), ("nan-input", torch.tensor([float("nan"), 0.0]))]
    """)
    result = amplint(spec, "--json", str(tmp_path / "r.json"))
    assert_one_error_line(result, f"amplint compare: error: {spec}: the FP32 baseline holds NaN on 1 case(s) ('nan-input')")
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["baseline"]["finite"] is False and report["trials"] == []
    assert "Criteria fixed before any trial" in result.stdout


def test_save_baseline_then_compare_against_it(tmp_path):
    spec = write(tmp_path, (FIXTURES / "overflow_fp16.py").read_text())
    saved = amplint(spec, "--save-baseline", str(tmp_path / "base.pt"), "--no-gains", "--trials", "bfloat16")
    assert saved.returncode == 0, saved.stderr
    later = amplint(spec, "--baseline", str(tmp_path / "base.pt"), "--no-gains", "--json", str(tmp_path / "r.json"))
    report = json.loads((tmp_path / "r.json").read_text())
    assert later.returncode == 1  # float16 still overflows against the stored reference
    assert report["baseline"]["source"] == str(tmp_path / "base.pt")
    assert by_id(report["trials"][1], "finite", False) == ["loud-0", "loud-1"]


def test_a_stored_baseline_for_other_weights_is_refused(tmp_path):
    spec = write(tmp_path, (FIXTURES / "overflow_fp16.py").read_text())
    runner = CliRunner()
    saved = runner.invoke(main, ["compare", spec, "--save-baseline", str(tmp_path / "base.pt"), "--no-gains", "--trials", "bfloat16"])
    assert saved.exit_code == 0, saved.output
    changed = write(tmp_path, (FIXTURES / "overflow_fp16.py").read_text().replace("manual_seed(7)", "manual_seed(8)"), "changed.py")
    result = runner.invoke(main, ["compare", changed, "--baseline", str(tmp_path / "base.pt")])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith(f"amplint compare: error: {changed}: baseline file")
    assert "saved for other model weights" in result.stderr


def test_json_to_stdout_holds_only_the_json(tmp_path):
    result = CliRunner().invoke(main, ["compare", str(FIXTURES / "regressor_extremes.py"), "--json", "-", "--no-gains"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert [t["passed"] for t in report["trials"]] == [False, True]


SPEC_THAT_EXITS_UNDER_AUTOCAST = """
import sys
import torch
TRIALS = ["bfloat16"]
DEVICE = "cpu"
class Net(torch.nn.Module):
    def forward(self, x):
        if torch.is_autocast_enabled("cpu"):
            sys.exit(0)
        return x * 2
def model():
    return Net()
def cases():
    return [("a", torch.ones(2))]
"""


def test_a_spec_that_calls_sys_exit_is_an_error_not_a_pass(tmp_path):
    spec = write(tmp_path, SPEC_THAT_EXITS_UNDER_AUTOCAST)
    result = amplint(spec, "--no-gains", "--json", str(tmp_path / "r.json"))
    assert_one_error_line(result, f"amplint compare: error: {spec}: the spec's code called sys.exit(0)")


def test_json_to_stdout_stays_json_when_the_spec_prints(tmp_path):
    spec = write(tmp_path, """
        import torch
        print("loading spec...")
        DEVICE = "cpu"
        TRIALS = ["bfloat16"]
        def model():
            print("building model")
            return torch.nn.Identity()
        def cases():
            return [("a", torch.ones(2))]
        """)
    result = amplint(spec, "--no-gains", "--json", "-")
    assert result.returncode == 0, result.stderr
    assert [t["passed"] for t in json.loads(result.stdout)["trials"]] == [True]
    assert "building model" in result.stderr


def test_usage_errors_are_one_line_and_exit_2():
    result = CliRunner().invoke(main, ["compare", "spec.py", "--repeats", "0"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("amplint compare: error: Invalid value for '--repeats'")


def test_unknown_trial_on_the_command_line_is_a_spec_error():
    result = CliRunner().invoke(main, ["compare", str(FIXTURES / "visible_difference.py"), "--trials", "float8"])
    assert result.exit_code == 2
    assert "TRIALS: unknown dtype 'float8'" in result.stderr


def test_all_cases_lists_unremarkable_cases_too():
    runner = CliRunner()
    args = ["compare", str(FIXTURES / "classifier_near_tie.py"), "--no-gains", "--trials", "float16"]
    assert "clear-0" not in runner.invoke(main, args).stdout
    assert "clear-0" in runner.invoke(main, [*args, "--all-cases"]).stdout


def test_threads_option_sets_and_records_the_cpu_thread_count(tmp_path):
    import torch

    before = torch.get_num_threads()
    try:
        result = CliRunner().invoke(
            main,
            ["compare", str(FIXTURES / "visible_difference.py"), "--threads", "1", "--trials", "float16",
             "--warmup", "0", "--repeats", "1", "--json", str(tmp_path / "r.json")],
        )
    finally:
        torch.set_num_threads(before)
    assert result.exit_code == 0, result.stderr
    assert json.loads((tmp_path / "r.json").read_text())["trials"][0]["timing"]["cpu_threads"] == 1
    assert "1 CPU thread)" in result.stdout


def test_case_ids_are_printed_verbatim_not_as_markup(tmp_path):
    spec = write(tmp_path, """
        import torch
        TRIALS = ["bfloat16"]
        def model():
            layer = torch.nn.Linear(2, 2, bias=False)
            with torch.no_grad():
                layer.weight.copy_(torch.eye(2))
            return layer
        def cases():
            return [("img[3] [bold]", torch.tensor([1.0, 1.0003]))]
    """)
    result = CliRunner().invoke(main, ["compare", spec, "--no-gains"])
    assert result.exit_code == 1
    assert "img[3] [bold]" in result.stdout


def test_a_spec_without_any_decision_says_decisions_were_not_compared(tmp_path):
    spec = write(tmp_path, """
        import torch
        def model():
            return torch.nn.Linear(3, 1)
        def cases():
            return [("a", torch.ones(1, 3))]
    """)
    result = amplint(spec, "--no-gains", "--trials", "bf16")
    assert result.returncode == 0
    assert "no case has a decision" in result.stdout and "define decide(output)" in result.stdout
    assert "1 other case(s): finite, within tolerance\n" in result.stdout  # nothing said of decisions


def test_save_baseline_cannot_rewrite_the_baseline_being_compared_against(tmp_path):
    spec = write(tmp_path, ACCEPTANCE_SPEC)
    stored = str(tmp_path / "base.pt")
    assert_one_error_line(amplint(spec, "--baseline", stored, "--save-baseline", stored), "amplint compare: error: --save-baseline and --baseline")
    assert_one_error_line(amplint(spec, "--save-baseline", stored, "--json", stored), "amplint compare: error: --save-baseline and --json")


# Scores with an identity layer: what goes in comes out, rounded by autocast.
IDENTITY_SCORES = """
    import torch
    def model():
        identity = torch.nn.Linear(4, 4)
        with torch.no_grad():
            identity.weight.copy_(torch.eye(4))
            identity.bias.zero_()
        return identity
"""


def test_a_top_k_ranking_counts_once_per_row_from_the_command_line(tmp_path):
    spec = write(tmp_path, IDENTITY_SCORES + """
    CRITERIA = {"max_decision_changes": 1}
    TRIALS = ["bfloat16"]
    def cases():
        yield "one-query", torch.tensor([[3.0, 1.0, 1.0003, 0.0]])  # top-3 [0, 2, 1] becomes [0, 1, 2]
        yield "batch-2", torch.tensor([[3.0, 1.0, 1.0003, 0.0], [3.0, 2.0, 1.0, 0.0]])
    def decide(output):
        return output.topk(3, dim=-1).indices.tolist()
    """)
    result = amplint(spec, "--no-gains")
    assert result.returncode == 1, result.stderr  # two rankings changed, one allowed
    assert "3 decision(s) in 2 case(s)" in result.stdout and "2 changed (allowed 1)" in result.stdout
    assert "CHANGED (1 of 2 decisions)" in result.stdout


def test_token_decisions_are_counted_in_tokens_on_both_sides(tmp_path):
    spec = write(tmp_path, IDENTITY_SCORES + """
    TRIALS = ["bfloat16"]
    def cases():
        # [B=2, T=2, C=4]: the first token of each sentence changes (1.0003 rounds to 1.0), the second does not
        yield "tagged", torch.tensor([[[1.0, 1.0003, 0.0, 0.0], [3.0, 1.0, 0.0, 0.0]]] * 2)
    """)
    result = amplint(spec, "--no-gains", "--json", str(tmp_path / "r.json"))
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["baseline"]["cases"][0]["decision_count"] == 4 and report["trials"][0]["decision_changes"] == 2
    assert "4 decision(s)" in result.stdout and "2 changed in 1 case(s)" in result.stdout


def test_a_changed_label_output_fails_the_trial(tmp_path):
    spec = write(tmp_path, """
        import torch
        LABELS = ["cat", "dog", "bird"]
        TRIALS = ["bfloat16"]
        class Labeler(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.scores = torch.nn.Linear(3, 3)
                with torch.no_grad():
                    self.scores.weight.copy_(torch.eye(3))
                    self.scores.bias.zero_()
            def forward(self, x):
                scores = self.scores(x)
                return {"label": LABELS[int(scores.argmax())], "confidence": scores.max().reshape(1)}
        def model():
            return Labeler()
        def cases():
            yield "near", torch.tensor([[1.0, 1.0003, 0.0]])  # dog in float32, cat once 1.0003 rounds to 1.0
    """)
    result = amplint(spec, "--no-gains", "--json", str(tmp_path / "r.json"))
    [trial] = json.loads((tmp_path / "r.json").read_text())["trials"]
    assert result.returncode == 1 and trial["failed_criteria"] == ["out_of_tolerance_cases"]
    assert trial["cases"][0]["note"] == "output 'label': 'dog' → 'cat'"
    assert "'dog' → 'cat'" in result.stdout


def test_criteria_widened_since_the_baseline_was_saved_are_named_in_the_verdict(tmp_path):
    body = """
        import torch
        CRITERIA = {"atol": ATOL}
        TRIALS = ["bfloat16"]
        def model():
            torch.manual_seed(0)
            return torch.nn.Linear(8, 4)
        def cases():
            generator = torch.Generator().manual_seed(1)
            return [(f"c{i}", torch.randn(1, 8, generator=generator)) for i in range(4)]
    """
    strict = write(tmp_path, body.replace("ATOL", "1e-3"), "strict.py")
    assert amplint(strict, "--no-gains", "--save-baseline", str(tmp_path / "base.pt")).returncode == 1
    widened = write(tmp_path, body.replace("ATOL", "0.1"), "widened.py")
    result = amplint(widened, "--no-gains", "--baseline", str(tmp_path / "base.pt"))
    assert result.returncode == 0, result.stderr
    assert "warning: criteria changed: atol 0.001 -> 0.1 since the baseline was saved" in result.stdout
    verdict = result.stdout.strip().splitlines()[-1]
    assert verdict == "All 1 trial(s) passed, but under criteria changed since the baseline was saved: atol 0.001 -> 0.1."


def test_masked_minus_inf_logits_reproduced_by_the_trials_pass(tmp_path):
    spec = write(tmp_path, """
        import torch
        class Masked(torch.nn.Module):
            def __init__(self):
                super().__init__()
                torch.manual_seed(0)
                self.scores = torch.nn.Linear(4, 5)
            def forward(self, x, invalid):
                return self.scores(x).masked_fill(invalid, float("-inf"))
        def model():
            return Masked()
        def cases():
            generator = torch.Generator().manual_seed(1)
            invalid = torch.tensor([[False, False, True, False, True]])
            return [(f"c{i}", (torch.randn(1, 4, generator=generator), invalid)) for i in range(4)]
    """)
    result = amplint(spec, "--no-gains", "--json", str(tmp_path / "r.json"))
    report = json.loads((tmp_path / "r.json").read_text())
    assert result.returncode == 0, result.stderr
    assert report["baseline"]["finite"] is False  # it holds -inf, and says so
    assert all(case["finite"] for trial in report["trials"] for case in trial["cases"])
    assert "±inf in 4 case(s), which every trial must reproduce exactly" in result.stdout


def test_a_margin_returning_nan_is_refused(tmp_path):
    spec = write(tmp_path, IDENTITY_SCORES + """
    def cases():
        return [("a", torch.tensor([[1.0, 1.0003, 0.0, 0.0]]))]
    def margin(output):
        return float("nan")
    """)
    assert_one_error_line(amplint(spec, "--no-gains"), f"amplint compare: error: {spec}: margin() must return a finite, non-negative")


def test_a_text_file_given_as_baseline_is_refused_as_not_a_baseline(tmp_path):
    spec = write(tmp_path, IDENTITY_SCORES + """
    def cases():
        return [("a", torch.ones(1, 4))]
    """)
    (tmp_path / "notes.pt").write_text("hi\n")
    result = amplint(spec, "--baseline", str(tmp_path / "notes.pt"))
    assert_one_error_line(result, f"amplint compare: error: {spec}: baseline file {tmp_path / 'notes.pt'} is not an amplint compare baseline")


def test_a_truncated_baseline_is_said_to_be_damaged_not_foreign(tmp_path):
    spec = write(tmp_path, IDENTITY_SCORES + """
    def cases():
        return [("a", torch.ones(1, 4))]
    """)
    stored = tmp_path / "base.pt"
    assert amplint(spec, "--save-baseline", str(stored), "--no-gains").returncode == 0
    stored.write_bytes(stored.read_bytes()[: stored.stat().st_size // 2])
    result = amplint(spec, "--baseline", str(stored))
    assert_one_error_line(result, f"amplint compare: error: {spec}: baseline file {stored} cannot be read (truncated or damaged)")


def test_a_quality_of_minus_inf_is_shown_as_returned(tmp_path):
    spec = write(tmp_path, IDENTITY_SCORES + """
    TRIALS = ["bfloat16"]
    def cases():
        return [("a", torch.ones(1, 4))]
    def quality(outputs, ids):
        return 1.0 if outputs["a"].dtype == torch.float32 else float("-inf")
    """)
    result = amplint(spec, "--no-gains", "--json", str(tmp_path / "r.json"))
    [trial] = json.loads((tmp_path / "r.json").read_text())["trials"]
    assert result.returncode == 1 and trial["quality_error"] == "quality() returned -inf"
    assert "quality() returned -inf" in result.stdout and "not computable" not in result.stdout
    assert "not a finite number" in result.stdout and "threshold" not in result.stdout  # no min_quality set


def test_a_helper_beside_the_spec_named_like_a_module_amplint_imports_later_does_not_replace_it(tmp_path):
    """The spec's folder goes first on sys.path (its helpers import): a user's `statistics.py`
    there must not take the place of the module the gains pass reads its medians from."""
    (tmp_path / "statistics.py").write_text('"""The project\'s own script for dataset statistics."""\nMEAN = 0.0\n')
    spec = write(tmp_path, IDENTITY_SCORES + """
    TRIALS = ["bfloat16"]
    def cases():
        return [("a", torch.ones(1, 4))]
    """)
    result = amplint(spec, "--warmup", "1", "--repeats", "2", "--json", str(tmp_path / "r.json"))
    assert result.returncode == 0, result.stderr
    [trial] = json.loads((tmp_path / "r.json").read_text())["trials"]
    assert trial["passed"] and trial["timing"]["trial_ms"] > 0


def test_a_folder_given_as_baseline_is_said_to_be_one(tmp_path):
    result = amplint(str(FIXTURES / "visible_difference.py"), "--baseline", str(tmp_path))
    assert_one_error_line(result, "amplint compare: error: ")
    assert result.stderr.strip().endswith(f"baseline file {tmp_path} is a directory"), result.stderr


def test_a_trial_raising_in_the_specs_forward_shows_the_spec_line(tmp_path):
    spec = write(tmp_path, """
        import torch
        class Float32Only(torch.nn.Module):
            def forward(self, x):
                if torch.is_autocast_enabled("cpu"):
                    raise RuntimeError("custom kernel only supports float32")
                return x
        def model():
            return Float32Only()
        def cases():
            return [("a", torch.ones(2))]
    """)
    result = amplint(spec, "--no-gains", "--trials", "bf16", "--json", str(tmp_path / "r.json"))
    [trial] = json.loads((tmp_path / "r.json").read_text())["trials"]
    assert result.returncode == 1
    assert trial["error"] == "case 'a', line 6 in forward(): RuntimeError: custom kernel only supports float32"
    assert "line 6 in forward()" in result.stdout


def test_the_max_diff_column_keeps_one_notation():
    result = amplint(str(FIXTURES / "identity_regressor.py"), "--no-gains", "--all-cases")
    rows = {line.split("│")[0].strip(): line.split("│")[2].strip() for line in result.stdout.splitlines() if "│" in line}
    assert [rows[f"v{i}"] for i in range(5)] == ["7.00e-01", "1.44e+02", "3.20e+02", "5.76e+02", "1.35e+04"]


def test_decide_reads_a_model_output_by_attribute_on_a_computed_and_a_stored_baseline(tmp_path):
    spec = str(FIXTURES / "model_output_container.py")
    stored = str(tmp_path / "base.pt")
    computed = amplint(spec, "--no-gains", "--save-baseline", stored, "--json", str(tmp_path / "computed.json"))
    assert computed.returncode == 0, computed.stderr
    later = amplint(spec, "--no-gains", "--baseline", stored, "--json", str(tmp_path / "stored.json"))
    assert later.returncode == 0, later.stderr
    for name in ("computed.json", "stored.json"):
        baseline = json.loads((tmp_path / name).read_text())["baseline"]
        assert [case["decision_count"] for case in baseline["cases"]] == [2, 2, 2, 2]


def test_a_stored_baseline_finds_the_specs_classes_after_the_spec_moves(tmp_path):
    """A baseline saved in one checkout and compared in another (CI, a colleague's machine)."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    shutil.copy(FIXTURES / "model_output_container.py", first / "spec.py")
    stored = str(tmp_path / "base.pt")
    saved = amplint(str(first / "spec.py"), "--no-gains", "--save-baseline", stored)
    assert saved.returncode == 0, saved.stderr
    shutil.copytree(first, second)
    shutil.rmtree(first)
    later = amplint(str(second / "spec.py"), "--no-gains", "--baseline", stored)
    assert later.returncode == 0, later.stderr


def test_a_dataset_class_of_the_spec_reaches_dataloader_workers_started_by_spawn(tmp_path):
    result = amplint(str(FIXTURES / "dataloader_spawn_workers.py"), "--no-gains", "--json", str(tmp_path / "r.json"))
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert [case["id"] for case in report["baseline"]["cases"]] == [f"review-{index}" for index in range(8)]


@pytest.mark.parametrize(
    "container",
    [
        "Scores = collections.namedtuple('Scores', 'logits embedding')",
        "@dataclasses.dataclass\nclass Scores:\n    logits: torch.Tensor\n    embedding: torch.Tensor",
    ],
    ids=["namedtuple", "dataclass"],
)
def test_the_fields_of_a_namedtuple_or_dataclass_output_are_compared_within_tolerance(tmp_path, container):
    spec = write(tmp_path, f"""
import collections
import dataclasses
import torch
{container}
class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(8, 16)
        self.head = torch.nn.Linear(16, 3)
    def forward(self, x):
        embedding = torch.tanh(self.body(x))
        return Scores(self.head(embedding), embedding)
def model():
    torch.manual_seed(0)
    return Encoder()
def cases():
    generator = torch.Generator().manual_seed(2)
    return [(f"s{{i}}", torch.randn(1, 8, generator=generator)) for i in range(4)]
def decide(out):
    return int(out.logits.argmax())
TRIALS = ["bfloat16"]
""")
    result = amplint(spec, "--no-gains", "--json", str(tmp_path / "r.json"))
    assert result.returncode == 0, result.stdout + result.stderr
    [trial] = json.loads((tmp_path / "r.json").read_text())["trials"]
    assert {case["worst"]["output"] for case in trial["cases"]} <= {"logits", "embedding"}


def test_a_decision_that_is_a_bare_object_is_refused_not_counted_as_changed(tmp_path):
    spec = write(tmp_path, """
        import torch
        def model():
            return torch.nn.Linear(2, 2)
        def cases():
            return [("a", torch.ones(1, 2))]
        def decide(output):
            return object()
    """)
    result = amplint(spec, "--no-gains")
    assert_one_error_line(result, f"amplint compare: error: {spec}: decide() on the baseline of case 'a': TypeError: a 'object' instance has no value to compare")


@pytest.mark.parametrize(
    "model, cases, message",
    [
        ("torch.nn.Linear(2, 2, device='meta')", "torch.ones(1, 2)", "model() returned 'weight' on the meta device"),
        ("torch.nn.Linear(2, 2)", "torch.ones(1, 2, device='meta')", "case 'a': its input is on the meta device"),
    ],
    ids=["model", "input"],
)
def test_a_meta_tensor_without_values_is_named_not_an_internal_error(tmp_path, model, cases, message):
    spec = write(tmp_path, f"import torch\ndef model():\n    return {model}\ndef cases():\n    return [('a', {cases})]\n")
    assert_one_error_line(amplint(spec, "--no-gains"), f"amplint compare: error: {spec}: {message}")


@pytest.mark.parametrize(
    "option, target, message",
    [
        ("--json", "spec.py", "--json: {target} is Python source"),
        ("--save-baseline", "spec.py", "--save-baseline: {target} is Python source"),
        ("--json", "helpers.py", "--json: {target} is Python source"),
        ("--json", "missing/r.json", "--json: folder does not exist: {folder}"),
        ("--save-baseline", "missing/base.pt", "--save-baseline: folder does not exist: {folder}"),
    ],
)
def test_an_output_file_that_would_overwrite_source_or_has_no_folder_is_refused_before_the_run(tmp_path, option, target, message):
    spec = write(tmp_path, ACCEPTANCE_SPEC)
    (tmp_path / "helpers.py").write_text("SCALE = 2\n")
    sources = {path: path.read_text() for path in tmp_path.glob("*.py")}
    target_path = str(tmp_path / target)
    result = amplint(spec, option, target_path)
    assert_one_error_line(result, "amplint compare: error: " + message.format(target=target_path, folder=str(tmp_path / "missing")))
    assert "Criteria fixed" not in result.stdout  # refused before anything ran
    assert {path: path.read_text() for path in tmp_path.glob("*.py")} == sources


def test_json_onto_the_baseline_being_compared_against_is_refused(tmp_path):
    spec = write(tmp_path, ACCEPTANCE_SPEC)
    stored = str(tmp_path / "base.pt")
    assert amplint(spec, "--no-gains", "--trials", "bf16", "--save-baseline", stored).returncode == 1
    assert_one_error_line(amplint(spec, "--baseline", stored, "--json", stored), "amplint compare: error: --baseline and --json name the same file")


@pytest.mark.parametrize(
    "model, case_input, message",
    [
        ("Served()", "torch.ones(1, 2)", "the model cannot be copied (TypeError: cannot pickle '_thread.lock' object)"),
        ("torch.nn.Linear(2, 2)", "(x for x in [torch.ones(1, 2)])", "case 'a': its input cannot be copied (TypeError: cannot pickle 'generator' object)"),
    ],
    ids=["model-with-a-lock", "generator-input"],
)
def test_what_cannot_be_deep_copied_is_named_before_any_run(tmp_path, model, case_input, message):
    spec = write(tmp_path, f"""
import threading
import torch
class Served(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 2)
        self.lock = threading.Lock()
    def forward(self, x):
        with self.lock:
            return self.layer(x)
def model():
    return {model}
def cases():
    return [("a", {case_input})]
""")
    assert_one_error_line(amplint(spec, "--no-gains"), f"amplint compare: error: {spec}: {message}")


def test_an_enum_decision_is_a_value_not_an_identity(tmp_path):
    spec = write(tmp_path, """
        import enum
        import torch
        class Action(enum.Enum):
            PASS = 0
            ALARM = 1
        def model():
            torch.manual_seed(0)
            return torch.nn.Linear(2, 1)
        def cases():
            return [("a", torch.ones(1, 2)), ("b", torch.zeros(1, 2))]
        def decide(output):
            return Action.ALARM if output.item() > 0.3 else Action.PASS
        TRIALS = ["bfloat16"]
    """)
    result = amplint(spec, "--no-gains", "--json", str(tmp_path / "r.json"))
    assert result.returncode == 0, result.stdout + result.stderr
    [trial] = json.loads((tmp_path / "r.json").read_text())["trials"]
    assert [case["decision"] for case in trial["cases"]] == ["<Action.PASS: 0>", "<Action.PASS: 0>"]


def test_a_reader_that_closes_the_pipe_ends_the_run_quietly(tmp_path: pathlib.Path) -> None:
    """`amplint compare spec.py | head -1`: no error blaming the spec for a sys.exit it never
    made; the run ends as a process stopped by SIGPIPE does."""
    spec = tmp_path / "spec.py"
    spec.write_text(ACCEPTANCE_SPEC)
    proc = subprocess.Popen(
        [sys.executable, "-m", "amplint", "compare", str(spec), "--no-gains"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert proc.stdout.readline().startswith(b"amplint compare")
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert "error" not in stderr


NOISY_SPEC = """
import random
import torch
CRITERIA = {"atol": 1e-3}
TRIALS = ["bfloat16"]
_noise = random.Random()  # a private generator: the seeds amplint resets leave it alone
class Noisy(torch.nn.Module):
    def forward(self, x):
        return x + _noise.gauss(0.0, 0.1)
def model():
    return Noisy()
def cases():
    yield "c0", torch.ones(3)
"""


def test_a_model_that_is_not_repeatable_in_fp32_is_an_error_not_a_precision_loss(tmp_path: pathlib.Path) -> None:
    (tmp_path / "spec.py").write_text(NOISY_SPEC)
    proc = amplint("spec.py", "--no-gains", cwd=tmp_path)
    assert proc.returncode == 2
    assert "the FP32 model is not repeatable: two FP32 runs of case 'c0' differ" in proc.stderr


SCALED_SPEC = """
import torch
CRITERIA = {"atol": 0.05}
TRIALS = ["bfloat16"]
TEMPERATURE = 1.0  # a setting, not a weight: the baseline's hashes do not see it
class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)
    def forward(self, x):
        return self.linear(x) / TEMPERATURE
def model():
    torch.manual_seed(0)
    return Scaled()
def cases():
    yield "c0", torch.ones(3)
"""


def test_a_stored_baseline_the_model_moved_away_from_is_refused(tmp_path: pathlib.Path) -> None:
    """The rollback workflow: a baseline saved, then a setting of the model changed. The gap is
    the change's, not precision's."""
    (tmp_path / "spec.py").write_text(SCALED_SPEC)
    assert amplint("spec.py", "--no-gains", "--save-baseline", "base.pt", cwd=tmp_path).returncode == 0
    (tmp_path / "spec.py").write_text(SCALED_SPEC.replace("TEMPERATURE = 1.0", "TEMPERATURE = 0.25"))
    proc = amplint("spec.py", "--no-gains", "--baseline", "base.pt", cwd=tmp_path)
    assert proc.returncode == 2
    assert "base.pt no longer matches the spec's FP32 outputs: case 'c0' differs beyond the tolerance" in proc.stderr


def test_a_report_is_never_written_over_a_saved_baseline(tmp_path: pathlib.Path) -> None:
    """`--json keep.pt` where `--baseline keep.pt` was meant: the FP32 reference stays."""
    (tmp_path / "spec.py").write_text(SCALED_SPEC)
    amplint("spec.py", "--no-gains", "--save-baseline", "keep.pt", cwd=tmp_path)
    kept = (tmp_path / "keep.pt").read_bytes()
    proc = amplint("spec.py", "--no-gains", "--json", "keep.pt", cwd=tmp_path)
    assert proc.returncode == 2
    assert "--json: keep.pt holds a baseline saved by --save-baseline" in proc.stderr
    assert (tmp_path / "keep.pt").read_bytes() == kept


def test_criteria_the_spec_never_set_are_called_amplints_defaults(tmp_path: pathlib.Path) -> None:
    (tmp_path / "spec.py").write_text(NOISY_SPEC.replace('CRITERIA = {"atol": 1e-3}\n', "").replace("_noise.gauss(0.0, 0.1)", "0.0"))
    proc = amplint("spec.py", "--no-gains", cwd=tmp_path)
    assert "(amplint's defaults: the spec sets no CRITERIA" in " ".join(proc.stdout.split())


def test_a_run_whose_every_output_is_empty_compares_nothing_and_is_refused(tmp_path: pathlib.Path) -> None:
    (tmp_path / "spec.py").write_text(
        "import torch\nCRITERIA = {'atol': 1e-2}\ndef model():\n    return torch.nn.Linear(4, 3)\n"
        "def cases():\n    return [('a', torch.ones(0, 4))]\n"
    )
    proc = amplint("spec.py", "--no-gains", cwd=tmp_path)
    assert proc.returncode == 2
    assert "every case's FP32 output is empty" in proc.stderr


def test_a_trial_identical_to_fp32_bit_for_bit_is_said_to_have_tested_nothing(tmp_path: pathlib.Path) -> None:
    """CPU autocast keeps softmax in float32: a model of softmax alone never computes in bfloat16."""
    (tmp_path / "spec.py").write_text(
        "import torch\nTRIALS = ['bfloat16']\nclass Soft(torch.nn.Module):\n    def forward(self, x):\n"
        "        return x.softmax(-1)\ndef model():\n    return Soft()\ndef cases():\n    yield 'c0', torch.tensor([1.0, 1.0001, 0.5])\n"
    )
    proc = amplint("spec.py", "--no-gains", "--json", "r.json", cwd=tmp_path)
    assert "this trial tested nothing in bfloat16" in (trial := json.loads((tmp_path / "r.json").read_text())["trials"][0])["note"]
    assert trial["passed"] and "tested nothing" in " ".join(proc.stdout.split())


INTERRUPTED_SPEC = """
import os
import signal
import torch
TRIALS = ["bfloat16"]
CRITERIA = {"atol": 0.1}
calls = 0
class Doubler(torch.nn.Module):
    def forward(self, x):
        global calls
        calls += 1
        if calls == 6:  # the baseline, its repeat and the trial took three: this is the gains pass
            os.kill(os.getpid(), signal.SIGINT)
        return x * 2
def model():
    return Doubler()
def cases():
    yield "c0", torch.ones(3)
"""


def test_ctrl_c_while_measuring_the_gains_keeps_the_trials_verdicts_in_the_json(tmp_path: pathlib.Path) -> None:
    (tmp_path / "spec.py").write_text(INTERRUPTED_SPEC)
    proc = amplint("spec.py", "--json", "r.json", "--warmup", "1", "--repeats", "3", cwd=tmp_path)
    assert proc.returncode == 130
    assert "interrupted while measuring the gains" in proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["interrupted"] == "gains"
    assert report["trials"][0]["passed"] and report["trials"][0]["timing"] is None


def test_a_custom_decide_without_margin_says_near_ties_are_not_judged(tmp_path):
    """The top-two gap measures the default argmax, not a threshold the spec's decide() applies."""
    spec = write(tmp_path, """
        import torch
        TRIALS = ["bfloat16"]
        CRITERIA = {"atol": 0.1}
        def model():
            return torch.nn.Linear(3, 3)
        def cases():
            return [("close scores", torch.tensor([[0.5, 0.5001, -3.0]]))]
        def decide(output):
            return bool(output[0, 2] > 100)
    """)
    result = amplint(spec, "--no-gains")
    assert result.returncode == 0, result.stderr
    assert "1 decision(s); near ties not judged: no margin" in result.stdout
