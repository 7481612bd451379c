"""In-process unit tests of the tracer's parts: the join of static findings with runtime facts
(independent of the static checker: findings are built by hand), the policy table, deferred
device values, the merge of rank reports, the launcher's traceback trimming."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

torch = pytest.importorskip("torch")

from amplint.model import Finding, Severity  # noqa: E402
from amplint.trace import policy  # noqa: E402
from amplint.trace.confirm import Facts, confirm_findings  # noqa: E402
from amplint.trace.report import merge_reports, nonfinite_section, rank_path  # noqa: E402
from amplint.trace.state import ClipEvent, DeferredValues, NonFinite, ScalerInfo, ScalerStep, SchedulerStep, TraceState  # noqa: E402

FILE = os.path.abspath("train.py")


def finding(code: str, line: int, end_line: int | None = None) -> Finding:
    return Finding(code, "name", Severity.ERROR, "train.py", line, 1, end_line or line, 10, "static message")


def facts_for(state: TraceState, values=None) -> Facts:
    return Facts(state=state, values=values or [], display=lambda f: os.path.relpath(f))


def statuses(findings, state, values=None, applied=None):
    facts = facts_for(state, values)
    facts.applied.update(applied or {})
    results, _ = confirm_findings(findings, {"train.py": FILE}, facts)
    return [(r["code"], r["line"], r["source"], r["status"], r["count"]) for r in results]


def test_backward_in_autocast_statuses() -> None:
    state = TraceState()
    state.autocast_entries[(FILE, 15)] = 4
    state.backward_calls[(FILE, 17)] = [4, 0]
    state.backward_autocast[(FILE, 17)] = {"device": "cpu", "dtype": "bfloat16", "entered_at": (FILE, 15), "step": 0}
    state.backward_calls[(FILE, 30)] = [0, 2]  # ran, never under autocast
    out = statuses([finding("AMP003", 17), finding("AMP003", 30), finding("AMP003", 40)], state)
    assert out == [
        ("AMP003", 17, "static", "confirmed", 4),
        ("AMP003", 30, "static", "refuted", 0),
        ("AMP003", 40, "static", "not-reached", 0),
    ]


def test_backward_outside_autocast_is_not_reached_when_autocast_was_off_all_run() -> None:
    """Every region was entered disabled: the backward outside autocast proves nothing about
    the finding, which is about a run with autocast on."""
    state = TraceState()
    state.autocast_off_entries[(FILE, 15)] = 2
    state.backward_calls[(FILE, 17)] = [0, 2]
    facts = facts_for(state)
    [result], _ = confirm_findings([finding("AMP003", 17)], {"train.py": FILE}, facts)
    assert result["status"] == "not-reached"
    assert result["evidence"]["note"].startswith("autocast was off in this run: the region entered at train.py:15 was disabled")


def test_multi_line_statement_matches_its_range() -> None:
    state = TraceState()
    state.backward_calls[(FILE, 18)] = [1, 0]
    assert statuses([finding("AMP003", 17, end_line=19)], state)[0][3:] == ("confirmed", 1)


def test_runtime_only_backward_in_autocast_from_another_module() -> None:
    state = TraceState()
    state.backward_calls[(FILE, 22)] = [3, 0]
    state.backward_autocast[(FILE, 22)] = {"device": "cpu", "dtype": "bfloat16", "entered_at": (FILE, 20), "created_at": ("/x/helpers.py", 5), "step": 1}
    results, _ = confirm_findings([], {"train.py": FILE}, facts_for(state))
    assert [(r["code"], r["line"], r["source"], r["status"], r["count"]) for r in results] == [("AMP003", 22, "runtime", "confirmed", 3)]
    assert results[0]["evidence"]["autocast_created_at"].endswith("helpers.py:5")


def _scaler(state: TraceState, line: int, steps: int) -> None:
    info = ScalerInfo(len(state.scalers), (FILE, line), None, True, "cpu", 65536.0, steps=steps)
    state.scalers.append(info)


def test_a_flagged_scaler_line_is_confirmed_when_the_run_rebuilds_it() -> None:
    """The static finding says the loop is per batch or per epoch; the run confirms any rebuild.
    One construction refutes nothing: a one-epoch run never came round to rebuild a per-epoch one."""
    per_batch, per_epoch, once = TraceState(), TraceState(), TraceState()
    for _ in range(5):
        _scaler(per_batch, 12, steps=1)
    for _ in range(3):
        _scaler(per_epoch, 12, steps=4)
    _scaler(once, 12, steps=50)
    once.lines_seen.add((FILE, 12))
    assert statuses([finding("AMP004", 12)], per_batch)[0][3:] == ("confirmed", 5)
    assert statuses([finding("AMP004", 12)], per_epoch)[0][3:] == ("confirmed", 3)
    [result], _ = confirm_findings([finding("AMP004", 12)], {"train.py": FILE}, facts_for(once))
    assert result["status"] == "not-reached" and "took 50 step(s)" in result["evidence"]["note"]


def test_a_runtime_only_scaler_finding_needs_one_scaler_per_step() -> None:
    """Without a static finding the loop is unknown: a scaler per fold steps many times and is right."""
    per_batch, per_fold = TraceState(), TraceState()
    for _ in range(5):
        _scaler(per_batch, 12, steps=1)
    for _ in range(2):
        _scaler(per_fold, 12, steps=50)
    assert [r[:2] for r in statuses([], per_batch) if r[0] == "AMP004"] == [("AMP004", 12)]
    assert [r for r in statuses([], per_fold) if r[0] == "AMP004"] == []


def test_scheduler_after_skip_counts_only_skipped_steps() -> None:
    from amplint.trace.state import SchedulerStep

    state = TraceState()
    skipped = ScalerStep(0, 1, 2, (FILE, 20), applied=False)
    applied = ScalerStep(0, 1, 3, (FILE, 20), applied=True)
    state.scheduler_steps = [SchedulerStep((FILE, 22), 1, 3, skipped), SchedulerStep((FILE, 22), 1, 4, applied)]
    out = statuses([finding("AMP011", 22)], state, applied={id(skipped): False, id(applied): True})
    assert out == [("AMP011", 22, "static", "confirmed", 1)]


def test_unknown_rules_are_listed_unchecked_not_given_a_status() -> None:
    results, unchecked = confirm_findings([finding("AMP018", 5)], {"train.py": FILE}, facts_for(TraceState()))
    assert results == [] and [u["code"] for u in unchecked] == ["AMP018"]


@pytest.mark.parametrize(
    ("op", "device", "inputs", "outputs", "expected", "matches"),
    [
        ("aten::addmm", "cpu", ["bfloat16"] * 3, ["bfloat16"], "bfloat16", True),
        # the out= variant has no autocast kernel: autocast lets it run in float32
        ("aten::mm.out", "cpu", ["float32", "float32"], ["float32"], "bfloat16", False),
        ("aten::_softmax", "cuda", ["bfloat16"], ["float32"], "float32", True),
        # F.cross_entropy passes log_softmax its input's dtype, which CUDA autocast honours
        ("aten::_log_softmax", "cuda", ["float16"], ["float16"], "float32", True),
        ("aten::sum", "cuda", ["float16"], ["float16"], "float32", True),
        ("aten::native_group_norm", "cuda", ["bfloat16"], ["bfloat16", "float32", "float32"], "float32", False),
        ("aten::mse_loss", "cpu", ["float32", "float32"], ["float32"], "float32", True),
    ],
)
def test_policy_check(op, device, inputs, outputs, expected, matches) -> None:
    verdict = policy.check(op, {"device": device, "dtype": "bfloat16"}, inputs, outputs)
    assert verdict["expected"] == expected and verdict["matches"] is matches


def test_policy_ignores_an_op_autocast_would_have_cast_that_kept_other_inputs() -> None:
    """A listed op with an autocast kernel that got float32 inputs under bfloat16 autocast ran
    inside another op (the math kernel of scaled_dot_product_attention), where autocast is off."""
    assert policy.check("aten::bmm", {"device": "cpu", "dtype": "bfloat16"}, ["float32"] * 2, ["float32"]) is None


def test_policy_ignores_unlisted_float64_and_no_autocast() -> None:
    assert policy.check("aten::relu", {"device": "cpu", "dtype": "bfloat16"}, ["bfloat16"], ["bfloat16"]) is None
    assert policy.check("aten::mm", {"device": "cpu", "dtype": "bfloat16"}, ["float64"] * 2, ["float64"]) is None
    assert policy.check("aten::mm", None, ["float32"] * 2, ["float32"]) is None
    # softmax is not on a CPU list: CPU keeps it in bf16, which is not a departure
    assert policy.category("aten::_softmax", "cpu") is None
    assert policy.category("aten::_softmax", "cuda") == "float32"


@pytest.mark.parametrize(("rerun_from_step", "hint"), [(3, "rerun with `--nan op --nan-from-step 3`"), (None, None)])
def test_a_cheap_find_suggests_a_rerun_only_where_one_would_search_further(rerun_from_step, hint) -> None:
    """None: this run's op check already searched from that step, so the hint would repeat it."""
    found = NonFinite("gradients", ("t.py", 9), "backward", 3, "float16", None, "cheap", detail="why", rerun_from_step=rerun_from_step)
    section = nonfinite_section(found, str, TraceState())
    assert (section.get("hint") or "").startswith(hint or "") and (hint is not None) == ("hint" in section)


def test_deferred_values_read_after_the_fact() -> None:
    values = DeferredValues()
    scale = torch.tensor(1024.0)
    slot = values.add(scale)
    scale.mul_(0.5)  # a CPU value is read when stored, like a device copy taken at that moment
    assert values.add(None) == 1 and values.add(3) == 2
    assert values.resolve() == [1024.0, None, 3.0]
    assert slot == 0


def _rank_report(rank, count, step, nonfinite=None):
    return {
        "rank": rank,
        "exit": {"status": "ok", "code": 0, "exception": None},
        "findings": [{"code": "AMP003", "path": "t.py", "line": 3, "source": "static", "status": "confirmed", "count": count, "evidence": {}}],
        "ops": [{"op": "aten::mm", "path": "t.py", "line": 2, "count": 10, "phase": "forward"}],
        "scaler": {"steps_attempted": 5, "steps_applied": 4, "steps_skipped": 1, "scheduler_steps_after_skip": 1, "scale_history": [2.0]},
        "nonfinite": nonfinite or {"op": "aten::mul", "step": step, "handled_by_scaler": False},
        "kernels": [],
    }


def test_merged_nonfinite_of_one_step_is_the_forward_value_that_began_it_not_the_reduced_gradients() -> None:
    gradients = {"op": "gradients", "phase": "backward", "step": 1, "handled_by_scaler": False}
    loss = {"op": "loss", "phase": "forward", "step": 1, "handled_by_scaler": False}
    merged = merge_reports([_rank_report(0, 1, 1, gradients), _rank_report(1, 1, 1, loss)], 2)
    assert (merged["nonfinite"]["op"], merged["nonfinite"]["rank"]) == ("loss", 1)


def test_merge_reports_sums_counts_and_keeps_earliest_nonfinite() -> None:
    merged = merge_reports([_rank_report(0, 3, 7), _rank_report(1, 2, 4)], 2)
    assert merged["findings"][0]["count"] == 5 and merged["findings"][0]["ranks"] == [0, 1]
    assert merged["ops"][0]["count"] == 20
    assert merged["scaler"]["steps_skipped"] == 2
    assert merged["nonfinite"]["step"] == 4 and merged["nonfinite"]["rank"] == 1
    assert rank_path("out/r.json", 3) == "out/r.rank3.json"


def test_launcher_drops_its_own_frames_from_the_traceback(tmp_path) -> None:
    from amplint.trace.launcher import _user_traceback, run_target

    script = tmp_path / "s.py"
    script.write_text("def f():\n    raise KeyError('k')\nf()\n")
    argv = sys.argv[:]
    outcome = run_target(str(script), None, ["--x"])
    assert sys.argv == argv  # restored
    assert outcome.status == "exception" and outcome.code == 1 and outcome.message == "KeyError: 'k'"
    tb = _user_traceback(outcome.exception.__traceback__)
    assert tb.tb_frame.f_code.co_filename == str(script)


# -- AMP007-AMP017 -----------------------------------------------------------------------------------
def _scaler_with_windows(windows, rescaled: bool = False) -> TraceState:
    """Each update line with the optimizers stepped before it; `rescaled`: a scale() came before
    each window's first step (every phase scales its own loss after the previous update)."""
    state = TraceState()
    info = ScalerInfo(0, (FILE, 9), None, True, "cpu", 256.0)
    info.windows = [((FILE, line), tuple(opts), rescaled) for line, opts in windows]
    state.scalers = [info]
    state.lines_seen = {(FILE, line) for line, _opts in windows}  # the update lines ran
    return state


def test_update_between_optimizers_alternating_is_confirmed_at_the_inner_update() -> None:
    # GAN: step(d); update (line 19); step(g); update (line 25), three iterations
    state = _scaler_with_windows([(19, [1]), (25, [2])] * 3)
    out = statuses([finding("AMP007", 19)], state)
    assert out == [("AMP007", 19, "static", "confirmed", 3)]


def test_update_between_optimizers_not_for_sequential_training_or_one_update_per_iteration() -> None:
    sequential = _scaler_with_windows([(30, [1])] * 4 + [(40, [2])] * 4)  # model A, then model B
    assert statuses([finding("AMP007", 30)], sequential) == [("AMP007", 30, "static", "refuted", 0)]
    together = _scaler_with_windows([(25, [1, 2])] * 4)
    assert statuses([finding("AMP007", 25)], together) == [("AMP007", 25, "static", "refuted", 0)]


def test_update_between_optimizers_not_when_each_phase_scales_its_own_loss_after_the_update() -> None:
    state = _scaler_with_windows([(19, [1]), (25, [2])] * 3, rescaled=True)
    assert statuses([finding("AMP007", 19)], state) == [("AMP007", 19, "static", "refuted", 0)]


def test_update_between_optimizers_critic_loop() -> None:
    # WGAN: two critic steps with an update each, then a generator step and update
    state = _scaler_with_windows([(19, [1]), (19, [1]), (25, [2])] * 3)
    assert statuses([finding("AMP007", 19)], state) == [("AMP007", 19, "static", "confirmed", 3)]


def test_missing_update_joins_every_pending_step_line() -> None:
    state = TraceState()
    state.scalers = [ScalerInfo(0, (FILE, 9), None, True, "cpu", 256.0)]
    state.pairing = [{"kind": "missing-update", "sites": [(FILE, 16), (FILE, 22)], "site": (FILE, 22), "again_at": (FILE, 16), "scaler": 0, "step": 2, "enabled": True}]
    assert statuses([finding("AMP007", 22)], state) == [("AMP007", 22, "static", "confirmed", 1)]
    assert statuses([finding("AMP007", 16)], state) == [("AMP007", 16, "static", "confirmed", 1)]
    # no static finding: a runtime-only one at the last step before the missing update
    assert statuses([], state) == [("AMP007", 22, "runtime", "confirmed", 1)]


def test_checkpoint_contents() -> None:
    from amplint.trace.amp_probes import checkpoint_contents

    optimizer_state = {"state": {}, "param_groups": [{"lr": 0.1}]}
    scaler_state = {"scale": 256.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000, "_growth_tracker": 0}
    assert checkpoint_contents({"model": {}, "optimizer": optimizer_state}) == (True, False)
    assert checkpoint_contents({"optimizer": optimizer_state, "amp": scaler_state}) == (True, True)
    assert checkpoint_contents([{"opts": [optimizer_state]}, scaler_state]) == (True, True)
    assert checkpoint_contents({"model": {"weight": 1}}) == (False, False)
    assert checkpoint_contents("not a mapping") == (False, False)


def test_scheduler_after_skip_upgrades_amp011_severity() -> None:
    state = TraceState()
    skipped = ScalerStep(0, 1, 2, (FILE, 20), applied=False)
    state.scheduler_steps = [SchedulerStep((FILE, 22), 1, 3, skipped)]
    facts = facts_for(state)
    facts.applied[id(skipped)] = False
    info = Finding("AMP011", "scheduler-on-skipped-step", Severity.INFO, "train.py", 22, 1, 22, 10, "static message")
    results, _ = confirm_findings([info], {"train.py": FILE}, facts)
    assert results[0]["severity"] == "warning" and results[0]["evidence"]["severity_upgraded"] is True
    # A guarded scheduler: the scaler skipped step 2, and the scheduler stepped only after step 3.
    applied = ScalerStep(0, 1, 3, (FILE, 20), applied=True)
    state.scalers = [ScalerInfo(0, (FILE, 9), None, True, "cpu", 256.0, scale_calls=4)]
    state.scaler_steps = [skipped, applied]
    state.scheduler_steps = [SchedulerStep((FILE, 22), 1, 4, applied)]
    facts.applied[id(applied)] = True
    results, _ = confirm_findings([info], {"train.py": FILE}, facts)
    assert results[0]["severity"] == "info" and results[0]["status"] == "refuted"


def test_custom_function_joins_any_line_of_its_class() -> None:
    state = TraceState()
    state.custom_functions = {
        object: {
            "class": "Fn", "kind": "fwd-without-bwd", "defined_at": (FILE, 7), "span": (FILE, 7, 16),
            "forward_at": (FILE, 8), "calls_under_autocast": 2, "mixed_calls": 0, "sites": {(FILE, 30): 2},
        }
    }
    state.backward_calls[(FILE, 32)] = [0, 2]  # backward ran outside autocast
    assert statuses([finding("AMP013", 14)], state) == [("AMP013", 14, "static", "confirmed", 2)]
    assert statuses([finding("AMP013", 20)], state) == [("AMP013", 7, "runtime", "confirmed", 2), ("AMP013", 20, "static", "not-reached", 0)]


def test_the_json_report_writes_non_finite_numbers_as_strings(tmp_path):
    """`"total_norm_seen": Infinity` is not JSON; strict parsers refuse the whole file."""
    from amplint.trace.report import write_json

    path = tmp_path / "trace.json"
    write_json({"findings": [{"evidence": {"total_norm_seen": float("inf"), "low": float("-inf"), "loss": float("nan")}}]}, str(path))

    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    report = json.loads(path.read_text(), parse_constant=refuse)
    assert report["findings"][0]["evidence"] == {"total_norm_seen": "inf", "low": "-inf", "loss": "nan"}


def test_the_tracer_pausing_for_its_own_work_pauses_only_its_own_thread() -> None:
    import threading

    state = TraceState()
    seen_by_other_thread = []
    with state.pause():
        worker = threading.Thread(target=lambda: seen_by_other_thread.append(state.paused))
        worker.start()
        worker.join()
        assert state.paused == 1
    assert seen_by_other_thread == [0] and state.paused == 0
    state.stop_in_forked_child()
    assert state.paused and not state.active


def test_a_tensor_without_storage_of_its_own_is_never_taken_for_a_gradient() -> None:
    import torch

    from amplint.trace.nonfinite import storage_of

    assert storage_of(torch.ones(3)) is not None
    assert storage_of(torch.empty(0)) is None  # every empty tensor has data pointer 0
    assert storage_of(torch.ones(2, 2).to_sparse()) is None


def op_checked(monitor, op, *args, phase: str = "backward", line: int = 10):
    """Run an aten op and hand it to the op check, as the dispatch recorder does."""
    from amplint.trace.recorder import OpInfo

    out = op(*args)
    monitor.check_op(OpInfo(op), args, {}, out, (FILE, line), phase, None)
    return out


def scaled_run(mode: str = "op", from_step: int = 0):
    """A state with an enabled GradScaler whose scaled loss is in flight, and its monitor."""
    from amplint.trace.nonfinite import NonFiniteMonitor

    state = TraceState()
    state.scalers.append(ScalerInfo(0, (FILE, 5), None, True, "cpu", 65536.0, scaled=True))
    return state, NonFiniteMonitor(state, mode, from_step)


def overflow(monitor, line: int = 10):
    """A float16 backward op overflowing from finite inputs."""
    big = torch.full((4,), 60000.0, dtype=torch.float16)
    return op_checked(monitor, torch.ops.aten.add.Tensor, big, big, line=line)


def test_an_overflow_is_handled_only_when_a_scaler_step_found_it_and_skipped() -> None:
    from amplint.trace.state import Update

    state, monitor = scaled_run()
    overflow(monitor)  # step 0: the scaler has not stepped yet, so the search goes on
    assert monitor.searching and state.nonfinite_candidates == []
    state.scaler_steps.append(ScalerStep(0, 1, 0, (FILE, 20), applied=False))
    state.step = 1
    assert monitor.searching and state.handled_overflow_steps == {0}
    overflow(monitor, line=11)  # step 1: the scaler steps and applies it
    state.scaler_steps.append(ScalerStep(0, 1, 1, (FILE, 20), applied=True))
    state.step = 2
    assert monitor.searching  # another optimizer's scaler step may still skip, until the update
    state.updates.append(Update(0, 2, 0))
    assert not monitor.searching
    found = monitor.resolve([])
    assert (found.callsite, found.step, found.handled_by_scaler) == ((FILE, 11), 1, False)
    assert state.handled_overflow_steps == {0}


def test_an_overflow_no_scaler_step_saw_is_not_handled() -> None:
    """AMP006: `optimizer.step()` outside the scaler took the gradients; nothing skipped."""
    state, monitor = scaled_run()
    overflow(monitor)
    state.step = 1  # an optimizer.step() with the scaled loss still in flight
    assert not monitor.searching
    found = monitor.resolve([])
    assert (found.step, found.handled_by_scaler) == (0, False) and state.handled_overflow_steps == set()


def test_a_fused_optimizers_skip_read_after_the_run_decides_whether_it_was_handled() -> None:
    for found_inf, handled in ((1.0, True), (0.0, False)):
        state, monitor = scaled_run()
        overflow(monitor)
        state.scaler_steps.append(ScalerStep(0, 1, 0, (FILE, 20), applied=None, found_inf_slot=0))
        state.step = 1
        assert monitor.searching  # unknown until the deferred found_inf is read
        assert monitor.resolve([found_inf]).handled_by_scaler is handled


def test_an_in_place_op_counts_what_it_overwrote_among_its_inputs() -> None:
    """`clip_grad_norm_` multiplies infinite gradients by a zero coefficient: the NaN starts
    there, from inputs that were not finite; an in-place op overflowing finite values it
    overwrote (after `zero_` cleared an earlier inf) starts from finite inputs."""
    from amplint.trace.nonfinite import NonFiniteMonitor

    aten = torch.ops.aten
    state = TraceState()
    monitor = NonFiniteMonitor(state, "op", 0)
    grad = op_checked(monitor, aten.mul.Tensor, torch.full((3,), 1e30), torch.full((3,), 1e30))
    op_checked(monitor, aten._foreach_mul_.Tensor, [grad], torch.zeros(()), phase="other", line=21)
    op_checked(monitor, aten.zero_.default, grad, phase="other", line=22)
    op_checked(monitor, aten.add_.Tensor, grad, torch.full((3,), 3e38), phase="other", line=23)
    op_checked(monitor, aten.mul_.Tensor, grad, torch.full((), 2.0), phase="other", line=24)
    found = [(c.callsite[1], c.op, c.inputs_finite) for c in state.nonfinite_candidates]
    assert found == [(10, "aten::mul.Tensor", True), (21, "aten::_foreach_mul_.Tensor", False), (24, "aten::mul_.Tensor", True)]


def test_a_cheap_find_the_op_check_already_searched_for_says_why_instead_of_a_rerun() -> None:
    from amplint.trace.nonfinite import NonFiniteMonitor

    nan_loss = torch.tensor(float("nan"))
    for mode, from_step, rerun in (("cheap", 0, 2), ("op", 3, 2), ("op", 2, None), ("op", 0, None)):
        state = TraceState()
        state.step = 3
        monitor = NonFiniteMonitor(state, mode, from_step)
        monitor.check_loss(nan_loss, (FILE, 30))
        found = monitor.resolve([])
        assert found.rerun_from_step == rerun, (mode, from_step)
        assert ("the op check ran from step" in found.detail) is (rerun is None)


# -- sparse gradients, several scalers, several float16 regions ------------------------------------
def test_a_sparse_tensors_stored_values_are_checked_as_its_consumers_coalesce_them() -> None:
    """float16 values at one index overflow once summed (GradScaler coalesces float16 sparse
    gradients before its inf check); dense kernels such as isfinite take no sparse layout."""
    from amplint.trace.nonfinite import all_finite_now, floating_tensors

    repeated = torch.sparse_coo_tensor(torch.tensor([[0, 0, 2]]), torch.tensor([60000.0, 60000.0, 1.0]).half(), (4,))
    assert not repeated.is_coalesced()
    assert not all_finite_now(floating_tensors(repeated))
    assert all_finite_now(floating_tensors(torch.eye(3).to_sparse()))
    assert all_finite_now(floating_tensors(torch.eye(3).to_sparse_csr()))
    assert floating_tensors(torch.zeros(5).to_sparse()) == []  # nothing stored: nothing to check


def test_a_sparse_gradient_overflow_the_scaler_skipped_is_handled() -> None:
    state, monitor = scaled_run("cheap")
    weight = torch.nn.Parameter(torch.zeros(4, 2))
    weight.grad = torch.sparse_coo_tensor(torch.tensor([[1]]), torch.full((1, 2), float("inf")), (4, 2))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    monitor.check_gradients(optimizer, (FILE, 20), handled=True)
    state.scaler_steps.append(ScalerStep(0, id(optimizer), 0, (FILE, 20), applied=False))
    state.step = 1
    found = monitor.resolve([])
    assert (found.op, found.step, found.handled_by_scaler) == ("gradients", 0, True)


def test_each_scaler_keeps_its_own_history_and_step_counts() -> None:
    """A GAN's two scalers: the discriminator's skips and backs off, the generator's does not;
    the contract's scale_history keeps every update in call order."""
    from amplint.trace.report import scaler_section
    from amplint.trace.state import Update

    state = TraceState()
    state.scalers += [ScalerInfo(0, (FILE, 10), None, True, "cpu", 1024.0), ScalerInfo(1, (FILE, 11), None, True, "cpu", 1024.0)]
    scales = [1024.0, 1024.0, 512.0, 1024.0]
    facts = facts_for(state, scales)
    for step, (scaler, applied) in enumerate(((0, True), (1, True), (0, False), (1, True))):
        record = ScalerStep(scaler, scaler, step, (FILE, 20 + scaler), applied=applied)
        state.scaler_steps.append(record)
        facts.applied[id(record)] = applied
        state.updates.append(Update(scaler, step + 1, step))
    section = scaler_section(state, facts, os.path.relpath)
    per_scaler = [(c["line"], c["steps_attempted"], c["steps_skipped"], c["scale_history"]) for c in section["constructions"]]
    assert per_scaler == [(10, 2, 1, [1024.0, 512.0]), (11, 2, 0, [1024.0, 1024.0])]
    assert section["scale_history"] == scales and section["steps_skipped"] == 1
    assert [(t["scaler"], t["scale"]) for t in section["timeline"]] == [
        ("train.py:10", 1024.0), ("train.py:11", 1024.0), ("train.py:10", 512.0), ("train.py:11", 1024.0)
    ]


def test_a_step_of_a_scaler_updated_after_another_scalers_step_gets_its_own_scale() -> None:
    """step(opt_d), step(opt_g), then both updates: each step's scale is its own scaler's."""
    from amplint.trace.report import scaler_section
    from amplint.trace.state import Update

    state = TraceState()
    state.scalers += [ScalerInfo(0, (FILE, 10), None, True, "cpu", 8.0), ScalerInfo(1, (FILE, 11), None, True, "cpu", 4.0)]
    state.scaler_steps += [ScalerStep(0, 0, 0, None, applied=True), ScalerStep(1, 1, 1, None, applied=True)]
    state.updates += [Update(0, 2, 0), Update(1, 2, 1)]
    section = scaler_section(state, facts_for(state, [8.0, 4.0]), os.path.relpath)
    assert [t["scale"] for t in section["timeline"]] == [8.0, 4.0]


def test_a_loss_comes_from_the_regions_whose_autograd_nodes_its_graph_holds() -> None:
    """An encoder's and a decoder's region both feed the loss; an evaluation under no_grad in a
    float16 region does not, though autocast's weight cache may build nodes there."""
    from amplint.trace.probes import Probes
    from amplint.trace.state import Float16Region

    layer = torch.nn.Linear(4, 4)

    def in_region(line: int, work):
        region = Float16Region("cpu", (FILE, line), (FILE, line))
        first = torch.autograd._get_sequence_nr()
        with torch.autocast("cpu", dtype=torch.float16):
            out = work()
        region.node_ranges.append((first, torch.autograd._get_sequence_nr()))
        return region, out

    def evaluate():
        with torch.no_grad():
            return layer(torch.randn(2, 4))

    encoder, hidden = in_region(1, lambda: layer(torch.randn(2, 4)))
    evaluation, _ = in_region(2, evaluate)
    hidden = hidden.float().relu()
    decoder, out = in_region(3, lambda: layer(hidden))
    loss = out.float().sum()
    now = torch.autograd._get_sequence_nr()
    ranges = [region.ranges_so_far(now) for region in (encoder, evaluation, decoder)]
    assert Probes._regions_in_graph(loss, ranges) == (0, 2)
    assert Probes._regions_in_graph((loss,), ranges[1:2]) == ()


def test_an_open_region_is_a_source_of_a_loss_only_through_the_nodes_it_has_built() -> None:
    """A loop body inside one region builds the loss there; a block that holds only the
    backward call builds none of it."""
    from amplint.trace.probes import Probes
    from amplint.trace.state import Float16Region

    layer = torch.nn.Linear(4, 4)
    around_the_forward = Float16Region("cpu", (FILE, 1), (FILE, 1), open_since=[torch.autograd._get_sequence_nr()])
    loss = layer(torch.randn(2, 4)).sum()
    around_the_backward = Float16Region("cpu", (FILE, 2), (FILE, 2), open_since=[torch.autograd._get_sequence_nr()])
    now = torch.autograd._get_sequence_nr()
    ranges = [region.ranges_so_far(now) for region in (around_the_forward, around_the_backward)]
    assert Probes._regions_in_graph(loss, ranges) == (0,)


# -- a finding is refuted only where the run did what the rule judges -------------------------------
def _judged(code: str, state: TraceState, line: int = 20, applied=None) -> tuple[str, dict]:
    facts = facts_for(state)
    facts.applied.update(applied or {})
    results, _ = confirm_findings([finding(code, line)], {"train.py": FILE}, facts)
    [result] = [r for r in results if r["source"] == "static"]
    return result["status"], result["evidence"]


@pytest.mark.parametrize(
    ("code", "note"),
    [
        ("AMP003", "no backward() or optimizer step was called there"),
        ("AMP005", "clipped or changed no gradient"),
        ("AMP006", "no optimizer.step() was called there"),
        ("AMP011", "no scheduler step was called there"),
        ("AMP012", "torch.save() was not called there"),
    ],
)
def test_a_line_that_ran_without_the_call_the_rule_judges_is_not_reached(code, note) -> None:
    """The line ran ops (it computed the loss, say) and the run crashed before its call."""
    state = TraceState()
    state.scalers = [ScalerInfo(0, (FILE, 9), None, True, "cpu", 256.0, scale_calls=3)]
    state.lines_seen = {(FILE, 20)}
    status, evidence = _judged(code, state)
    assert status == "not-reached" and note in evidence["note"]


def test_scaler_pairing_is_judged_only_once_a_scaler_went_round() -> None:
    """AMP007's missing update shows at the next step(): a run that stepped once never got there."""
    state = TraceState()
    state.scalers = [ScalerInfo(0, (FILE, 9), None, True, "cpu", 256.0, steps=1, scale_calls=1)]
    state.lines_seen = {(FILE, 20)}
    status, evidence = _judged("AMP007", state)
    assert status == "not-reached" and "more than once" in evidence["note"]
    state.scalers[0].steps = 3
    assert _judged("AMP007", state)[0] == "refuted"


def test_unscale_per_microbatch_is_judged_only_once_an_unscale_reached_an_update() -> None:
    state = TraceState()
    info = ScalerInfo(0, (FILE, 9), None, True, "cpu", 256.0, steps=1, scale_calls=2)
    info.last_unscale = {1: ((FILE, 20), 2)}
    state.scalers = [info]
    state.lines_seen = {(FILE, 20)}
    assert _judged("AMP008", state)[0] == "not-reached"  # the run ended before update()
    info.windows = [((FILE, 24), (1,), True)]
    assert _judged("AMP008", state)[0] == "refuted"


def test_a_save_is_judged_only_when_it_held_an_optimizer_state_and_a_scaler_was_alive() -> None:
    state = TraceState()
    state.scalers = [ScalerInfo(0, (FILE, 9), None, True, "cpu", 256.0, scale_calls=3)]
    record = {"site": (FILE, 20), "saves": 2, "with_optimizer_state": 0, "with_scaler_state": 0, "missing_scaler_state": 0}
    state.saves = {(FILE, 20): record}
    status, evidence = _judged("AMP012", state)
    assert status == "not-reached" and "never with an optimizer state" in evidence["note"]
    record.update(with_optimizer_state=2)  # saved while no enabled scaler was alive
    assert _judged("AMP012", state)[0] == "not-reached"
    record.update(with_scaler_state=2)
    assert _judged("AMP012", state)[0] == "refuted"


def test_a_compiled_forward_under_autocast_with_no_backward_after_it_is_not_reached() -> None:
    state = TraceState()
    state.compiled = [{"site": (FILE, 20), "backend": "inductor", "calls": 2, "calls_under_autocast": 2, "mismatched_backwards": 0, "backwards_with_setting": 0}]
    status, evidence = _judged("AMP017", state)
    assert status == "not-reached" and "no backward() ran" in evidence["note"]
    state.backward_calls[(FILE, 30)] = [2, 0]  # backward ran, inside autocast: no mismatch
    state.lines_seen = {(FILE, 20)}
    facts = facts_for(state)
    results, _ = confirm_findings([finding("AMP017", 20)], {"train.py": FILE}, facts)
    assert results[0]["status"] == "refuted"


def _custom_fwd_function(state: TraceState, dtype: str) -> None:
    state.custom_functions = {
        object: {
            "class": "Fn", "kind": "fwd-without-bwd", "defined_at": (FILE, 7), "span": (FILE, 7, 16),
            "forward_at": (FILE, 8), "calls_under_autocast": 2, "mixed_calls": 0, "sites": {(FILE, 30): 2},
            "autocast": ("cpu", dtype),
        }
    }


def test_custom_fwd_without_custom_bwd_names_the_dtype_forward_ran_in() -> None:
    state = TraceState()
    _custom_fwd_function(state, "bfloat16")
    status, evidence = _judged("AMP013", state, line=14)
    assert status == "not-reached" and "no backward() ran after Fn.forward" in evidence["note"]
    state.backward_calls[(FILE, 32)] = [0, 2]
    results, _ = confirm_findings([], {"train.py": FILE}, facts_for(state))
    assert results[0]["evidence"]["autocast"] == {"device": "cpu", "dtype": "bfloat16"}
    assert "autocast(cpu, bfloat16)" in results[0]["message"] and "float16" not in results[0]["message"].replace("bfloat16", "")


def test_a_disabled_region_finding_names_the_dtypes_its_ops_received() -> None:
    state = TraceState()
    state.disabled_region_ops[((FILE, 25), (FILE, 26), "aten::addmm", ("float32", "bfloat16", "float32"), "bfloat16", (FILE, 20), "cpu")] = 3
    [result] = confirm_findings([], {"train.py": FILE}, facts_for(state))[0]
    assert "received bfloat16 tensors" in result["message"] and "float16/" not in result["message"]


@pytest.mark.parametrize(
    ("construction", "arguments", "switch"),
    [
        ('GradScaler("cpu", enabled=args.amp)', '"--amp", action="store_true"', "(enabled=args.amp, set by the script option --amp)"),
        ("GradScaler(\n    enabled=not args.no_amp,\n)", '"--no_amp", action="store_true"', "(enabled=not args.no_amp, set by the script option --no_amp)"),
        ('GradScaler("cpu", enabled=(dtype == torch.float16))', '"-d", "--dtype", default="bfloat16"', "(enabled=(dtype == torch.float16), set by the script option --dtype)"),
        ('GradScaler("cpu", init_scale=2.0**8, enabled=use_amp)', '"--steps", type=int', "(enabled=use_amp)"),
    ],
)
def test_a_scaler_switched_off_leaves_scaled_gradient_findings_unreached_naming_its_switch(tmp_path, construction, arguments, switch) -> None:
    """However the scaler was switched off, it scaled nothing: the clip before unscale_ it would
    have made wrong did not happen in this run, which cannot refute the finding."""
    script = tmp_path / "train.py"
    script.write_text(f"import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument({arguments})\nscaler = torch.amp.{construction}\n")
    state = TraceState()
    state.scalers = [ScalerInfo(0, (str(script), 4), None, False, "cpu", None, disabled_on_request=True, steps=3)]
    state.clips = [ClipEvent((str(script), 20), "clip_grad_norm_", 0, False, None, None, None)]
    facts = facts_for(state)
    results, _ = confirm_findings([finding("AMP005", 20)], {"train.py": str(script)}, facts)
    assert results[0]["status"] == "not-reached"
    assert results[0]["evidence"]["note"] == f"the GradScaler built at {os.path.relpath(script)}:4 was off in this run {switch} and scaled nothing: the case the finding is about did not run"


def test_a_backward_inside_a_region_entered_disabled_is_not_reached_and_names_that_region() -> None:
    """Autocast was on elsewhere in the run (an evaluation), but off around this backward."""
    state = TraceState()
    state.autocast_entries[(FILE, 40)] = 1  # the evaluation's region
    state.autocast_off_entries[(FILE, 15)] = 2
    state.backward_calls[(FILE, 17)] = [0, 2]
    state.calls_in_off_region[(FILE, 17)] = 2
    state.off_region_of[(FILE, 17)] = (FILE, 15)
    [result], _ = confirm_findings([finding("AMP003", 17)], {"train.py": FILE}, facts_for(state))
    assert result["status"] == "not-reached"
    assert result["evidence"]["note"].startswith("autocast was off around it: the region entered at train.py:15 was disabled")


def test_amp005_evidence_shows_the_first_finite_norm_of_a_clip_on_scaled_gradients() -> None:
    """An overflowed step's clip saw an inf norm, which says nothing of the scale: the evidence
    shows the first step whose norm was finite, and says which step that was."""
    state = TraceState()
    state.clips = [
        ClipEvent((FILE, 20), "clip_grad_norm_", 0, True, 0, 0, 1),
        ClipEvent((FILE, 20), "clip_grad_norm_", 1, True, 0, 2, 3),
    ]
    values = [65536.0, math.inf, 32768.0, 32768.0 * 2.5]
    facts = facts_for(state, values)
    results, _ = confirm_findings([finding("AMP005", 20)], {"train.py": FILE}, facts)
    evidence = results[0]["evidence"]
    assert evidence["first_step"] == 0 and evidence["norm_step"] == 1
    assert evidence["total_norm_unscaled"] == 2.5


def test_the_project_of_a_script_is_the_repository_around_it(tmp_path) -> None:
    from amplint.trace.callsite import project_roots

    (tmp_path / "repo" / "scripts").mkdir(parents=True)
    (tmp_path / "repo" / ".git").mkdir()
    script = tmp_path / "repo" / "scripts" / "train.py"
    roots = project_roots(str(script), cwd=str(tmp_path / "elsewhere"), as_module=False)
    assert str(tmp_path / "repo") in roots and str(tmp_path / "elsewhere") not in roots


def test_without_a_marker_the_folder_started_in_is_the_project_only_when_the_script_is_below_it(tmp_path) -> None:
    from amplint.trace.callsite import project_roots

    (tmp_path / "scripts").mkdir()
    script = str(tmp_path / "scripts" / "train.py")
    assert str(tmp_path) in project_roots(script, cwd=str(tmp_path), as_module=False)
    assert project_roots(script, cwd=str(tmp_path / "other"), as_module=False) == [str(tmp_path / "scripts")]


def test_the_home_folder_is_never_the_project(tmp_path, monkeypatch) -> None:
    from amplint.trace.callsite import project_roots

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".git").mkdir()  # a dotfiles repository
    (tmp_path / "work").mkdir()
    roots = project_roots(str(tmp_path / "work" / "train.py"), cwd=str(tmp_path), as_module=False)
    assert roots == [str(tmp_path / "work")]


def test_report_paths_climb_out_of_the_folder_started_in_only_within_the_project(tmp_path) -> None:
    from amplint.trace.callsite import display_path

    project, outside = tmp_path / "repo", tmp_path / "lib" / "x.py"
    cwd = str(project / "scripts")
    assert display_path(str(project / "src" / "m.py"), cwd, (str(project),)) == os.path.join("..", "src", "m.py")
    assert display_path(str(outside), cwd, (str(project),)) == str(outside)


def _loss() -> torch.Tensor:
    weight = torch.ones(3, requires_grad=True)
    return (weight * 2).sum()


@pytest.mark.parametrize(
    "scaled, expected",
    [
        (lambda loss: loss * 1024.0, 1024.0),  # a Python number, saved as the product's other operand
        (lambda loss: torch.mul(torch.tensor(512.0), loss), 512.0),  # a constant tensor as its first operand
        (lambda loss: loss * 0.25, None),  # gradient accumulation's fraction lifts nothing
        (lambda loss: loss * 4, None),  # a loss weight, not a loss scale
        (lambda loss: loss * _loss(), None),  # a product of two losses is no constant scale
        (lambda loss: loss / 1024.0, None),
    ],
)
def test_hand_loss_scale_reads_the_constant_a_loss_was_multiplied_by(scaled, expected) -> None:
    from amplint.trace.probes import hand_loss_scale

    assert hand_loss_scale(scaled(_loss()), None) == expected


def test_hand_loss_scale_reads_the_seed_gradient_of_backward() -> None:
    from amplint.trace.probes import hand_loss_scale

    assert hand_loss_scale(_loss(), torch.tensor(4096.0)) == 4096.0
    assert hand_loss_scale([_loss(), _loss()], None) is None  # several roots: no one loss to read


@pytest.mark.parametrize(
    ("args", "executable", "shell"),
    [
        ([sys.executable, "train.py"], None, False),
        (["python3.11", "-m", "trainer"], None, False),
        (["/usr/bin/python", "eval.py"], None, False),
        (["torchrun", "--nproc-per-node", "2", "train.py"], None, False),
        ("CUDA_VISIBLE_DEVICES=0 python train.py --lr 3e-4", None, True),
        ("env OMP_NUM_THREADS=1 accelerate launch train.py", None, True),
        (["train.py"], sys.executable, False),
        ([b"python", b"train.py"], None, False),
        (["env", "CUDA_VISIBLE_DEVICES=0", "python", "train.py"], None, False),
        (["bash", "-c", "cd runs && python train.py"], None, False),
        ("cd runs && python train.py --seed 1", None, True),
        ("nohup python train.py > train.log &", None, True),
        ("time python train.py", None, True),
        ("timeout 10m torchrun --nproc-per-node 2 train.py", None, True),
        ("nice -n 5 python3 train.py", None, True),
    ],
)
def test_a_command_that_starts_python_is_a_python_program(args, executable, shell) -> None:
    from amplint.trace.children import runs_python

    assert runs_python(args, executable, shell)


@pytest.mark.parametrize(
    ("args", "shell"),
    [
        (["nvidia-smi"], False), ("git rev-parse HEAD", True), (["ninja", "-v"], False), ("echo 'unclosed", True), ([], False), ("", True),
        ("mkdir -p runs && cp config.yaml runs/", True), (["bash", "-c", "nvidia-smi"], False), (["env", "FOO=1"], False),
    ],
)
def test_other_commands_are_not_python_programs(args, shell) -> None:
    from amplint.trace.children import runs_python

    assert not runs_python(args, None, shell)
