"""AMP006-AMP017: one behaviour per test, the false-positive traps of research §5, and every fix."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from amplint.static.analyse import parse
from amplint.static.api import lint_source
from amplint.static.fixes import fix_source

STATIC_FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "static"


def lines(source: str, code: str) -> list[int]:
    return sorted(f.line for f in lint_source(textwrap.dedent(source), "t.py") if f.code == code)


def fixed(source: str, code: str, unsafe: bool = False) -> str:
    result = fix_source(textwrap.dedent(source).encode(), "t.py", {code}, unsafe)
    return result.source.decode()


def fixture_findings(name: str, code: str) -> list:
    path = STATIC_FIXTURES / name
    return [f for f in lint_source(path.read_text(encoding="utf-8"), str(path)) if f.code == code]


def fixture_with(name: str, old: str, new: str) -> str:
    """A fixture's source with one passage changed: the variant a test is about."""
    source = (STATIC_FIXTURES / name).read_text(encoding="utf-8")
    assert old in source, f"{name} has no {old!r}"
    return source.replace(old, new)


def assert_fix(source: str, code: str, expected: str, unsafe: bool = False) -> None:
    """The fix re-parses, equals the expected text, removes the finding and is idempotent."""
    out = fixed(source, code, unsafe)
    parse(out)
    assert out == textwrap.dedent(expected)
    assert lines(out, code) == []
    assert fixed(out, code, unsafe) == out


# --------------------------------------------------------------------------------- AMP006
LOOP_DIRECT_STEP = """\
import torch
scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x, y)
    scaler.scale(loss).backward()
    optimizer.step()
"""


def test_amp006_direct_step_after_scaled_backward() -> None:
    assert lines(LOOP_DIRECT_STEP, "AMP006") == [7]


def test_amp006_step_through_scaler_in_other_branch_is_clean() -> None:
    src = """\
    import torch
    def step(model, x, optimizer, scaler):
        loss = model(x)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
    """
    assert lines(src, "AMP006") == []


def test_amp006_second_loop_with_its_own_scaled_backward_still_bypasses() -> None:
    """A later loop's plain backward does not excuse a step that its own scaled backward feeds."""
    src = LOOP_DIRECT_STEP.replace("    optimizer.step()", "    scaler.step(optimizer)\n    scaler.update()") + """\
finetune_optimizer = torch.optim.SGD(model.parameters(), lr=1e-5)
for x, y in loader:
    model(x, y).backward()
    with torch.autocast("cuda", dtype=torch.float16):
        aux = model(x, y)
    scaler.scale(aux).backward()
    finetune_optimizer.step()
"""
    assert lines(src, "AMP006") == [15]


def test_amp006_disabled_scaler_is_clean() -> None:
    src = LOOP_DIRECT_STEP.replace('GradScaler("cuda")', 'GradScaler("cuda", enabled=False)')
    assert lines(src, "AMP006") == []


def test_amp006_one_of_two_optimizers_bypasses() -> None:
    src = """\
    import torch
    def gan(scaler, opt_d, opt_g, ld, lg):
        scaler.scale(ld).backward()
        scaler.step(opt_d)
        scaler.scale(lg).backward()
        opt_g.step()
        scaler.update()
    """
    assert lines(src, "AMP006") == [6]


def test_amp006_unsafe_fix_steps_through_scaler_and_adds_update() -> None:
    assert fixed(LOOP_DIRECT_STEP, "AMP006") == LOOP_DIRECT_STEP  # not a safe fix
    assert_fix(
        LOOP_DIRECT_STEP,
        "AMP006",
        LOOP_DIRECT_STEP.replace("    optimizer.step()\n", "    scaler.step(optimizer)\n    scaler.update()\n"),
        unsafe=True,
    )


def test_amp006_a_step_after_unscale_is_told_it_skips_no_inf_and_steps_through_the_scaler() -> None:
    [finding] = fixture_findings("AMP006/bad_plain_step_after_unscale.py", "AMP006")
    assert "after `scaler.unscale_(optimizer)` (line 11): the gradients are unscaled, but a step whose gradients hold inf/NaN is applied" in finding.message
    source = (STATIC_FIXTURES / "AMP006/bad_plain_step_after_unscale.py").read_text(encoding="utf-8")
    assert_fix(source, "AMP006", source.replace("    optimizer.step()\n", "    scaler.step(optimizer)\n"), unsafe=True)


def test_amp006_fix_in_a_branch_the_scalers_update_misses_adds_one() -> None:
    source = (STATIC_FIXTURES / "AMP006/bad_plain_step_on_odd_batches.py").read_text(encoding="utf-8")
    fixed_source = fix_source(source.encode(), "t.py", {"AMP006"}, True).source.decode()
    assert fixed_source.endswith(
        "        else:\n            scaler.step(optimizer)\n            scaler.update()\n"
    )


def test_amp006_no_fix_when_scaler_is_conditional() -> None:
    src = """\
    import torch
    scaler = torch.amp.GradScaler("cuda") if amp else None
    for x in loader:
        loss = model(x)
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        optimizer.step()
    """
    findings = [f for f in lint_source(textwrap.dedent(src), "t.py") if f.code == "AMP006"]
    assert [f.line for f in findings] == [9] and findings[0].fix is None


# --------------------------------------------------------------------------------- AMP007
MISSING_UPDATE = """\
import torch
scaler = torch.amp.GradScaler("cuda")
for x in loader:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x)
    scaler.scale(loss).backward()
    scaler.step(optimizer)  # step
    optimizer.zero_grad()
"""


def test_amp007_step_without_update() -> None:
    assert lines(MISSING_UPDATE, "AMP007") == [7]


def test_amp007_safe_fix_inserts_update_after_step_keeping_comment() -> None:
    assert_fix(
        MISSING_UPDATE,
        "AMP007",
        MISSING_UPDATE.replace("    scaler.step(optimizer)  # step\n", "    scaler.step(optimizer)  # step\n    scaler.update()\n"),
    )


def test_amp007_fix_changes_nothing_else() -> None:
    out = fixed(MISSING_UPDATE, "AMP007")
    assert out.splitlines()[:7] == MISSING_UPDATE.splitlines()[:7]
    assert out.splitlines()[8:] == MISSING_UPDATE.splitlines()[7:]


def test_amp007_one_update_after_several_optimizers_is_clean() -> None:
    src = """\
    def train(loader, scaler, opt_a, opt_b):
        for x in loader:
            scaler.scale(x).backward()
            scaler.step(opt_a)
            scaler.step(opt_b)
            scaler.update()
    """
    assert lines(src, "AMP007") == []


def test_amp007_loop_over_optimizers_then_update_is_clean() -> None:
    src = """\
    def train(loader, scaler, optimizers):
        for x in loader:
            scaler.scale(x).backward()
            for opt in optimizers:
                scaler.step(opt)
            scaler.update()
    """
    assert lines(src, "AMP007") == []


def test_amp007_update_between_optimizer_steps_of_gradients_scaled_together() -> None:
    src = """\
    def train(loader, scaler, opt_d, opt_g):
        for x, y in loader:
            scaler.scale(x).backward()
            scaler.scale(y).backward()
            scaler.step(opt_d)
            scaler.update()
            scaler.step(opt_g)
            scaler.update()
    """
    assert lines(src, "AMP007") == [6]


def test_amp007_update_after_each_round_scaled_on_its_own_is_not_between_two_steps() -> None:
    src = """\
    def train(loader, scaler, opt_d, opt_g):
        for x in loader:
            scaler.scale(x).backward()
            scaler.step(opt_d)
            scaler.update()
            scaler.scale(x).backward()
            scaler.step(opt_g)
            scaler.update()
    """
    assert lines(src, "AMP007") == []


def test_amp007_update_outside_the_step_loop() -> None:
    src = """\
    def train(loader, scaler, opt, epochs):
        for _ in range(epochs):
            for x in loader:
                scaler.scale(x).backward()
                scaler.step(opt)
            scaler.update()
    """
    assert lines(src, "AMP007") == [5]


def test_amp007_update_on_microbatches_without_step() -> None:
    src = """\
    def train(loader, scaler, opt):
        for i, x in enumerate(loader):
            scaler.scale(x).backward()
            if (i + 1) % 4 == 0:
                scaler.step(opt)
            scaler.update()
    """
    assert lines(src, "AMP007") == [6]


def test_amp007_second_update_of_a_value_no_if_orders_is_reported() -> None:
    # Only an ordering comparison (`floor > scale`) proves the value is a number; a flag may
    # pass None, and `update(None)` is the iteration's update again.
    src = """\
    import torch
    scaler = torch.amp.GradScaler("cuda")
    def optimizer_step(optimizer, floor, reset):
        scaler.step(optimizer)
        scaler.update()
        if reset:
            scaler.update(floor)
    """
    assert lines(src, "AMP007") == [7]


def test_amp007_update_in_caller_of_step_helper_is_clean() -> None:
    src = """\
    import torch
    class E:
        def __init__(self):
            self.scaler = torch.amp.GradScaler("cuda")
        def _step(self):
            self.scaler.step(self.opt)
        def train_step(self, loss):
            self.scaler.scale(loss).backward()
            self._step()
            self.scaler.update()
    """
    assert lines(src, "AMP007") == []


# --------------------------------------------------------------------------------- AMP008
def test_amp008_unscale_outside_accumulation_guard() -> None:
    src = """\
    def train(loader, scaler, opt, model):
        for i, x in enumerate(loader):
            scaler.scale(model(x)).backward()
            scaler.unscale_(opt)
            if (i + 1) % 8 == 0:
                scaler.step(opt)
                scaler.update()
    """
    assert lines(src, "AMP008") == [4]


def test_amp008_unscale_inside_accumulation_guard_is_clean() -> None:
    src = """\
    def train(loader, scaler, opt, model):
        for i, x in enumerate(loader):
            scaler.scale(model(x)).backward()
            if (i + 1) % 8 == 0:
                scaler.unscale_(opt)
                scaler.step(opt)
                scaler.update()
    """
    assert lines(src, "AMP008") == []


def test_amp008_second_unscale_before_update() -> None:
    src = """\
    def train(loader, scaler, opt, model):
        for x in loader:
            scaler.scale(model(x)).backward()
            scaler.unscale_(opt)
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
    """
    assert lines(src, "AMP008") == [5]


def test_amp008_unscale_in_micro_batch_loop() -> None:
    src = """\
    def step(batch, scaler, opt, model):
        for chunk in batch.chunk(4):
            scaler.scale(model(chunk)).backward()
            scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
    """
    assert lines(src, "AMP008") == [4]


def test_amp008_amp_switch_guards_are_not_accumulation() -> None:
    src = """\
    def train(loader, scaler, opt, model, use_amp):
        for x in loader:
            scaler.scale(model(x)).backward()
            if use_amp:
                scaler.unscale_(opt)
            if use_amp:
                scaler.step(opt)
                scaler.update()
    """
    assert lines(src, "AMP008") == []


def test_amp008_backend_switch_stepping_in_each_branch_is_clean() -> None:
    """transformers' Trainer: `if on_xla:` and its `elif` both step the scaler, so unscale_ before
    the switch is always followed by a step."""
    src = """\
    def train(loader, scaler, opt, model, on_xla):
        for x in loader:
            scaler.scale(model(x)).backward()
            scaler.unscale_(opt)
            if on_xla:
                scaler.step(opt)
                scaler.update()
            else:
                scaler.step(opt)
                scaler.update()
    """
    assert lines(src, "AMP008") == []


def test_amp008_backend_switch_whose_else_steps_conditionally() -> None:
    src = """\
    def train(loader, scaler, opt, model, on_xla):
        for x in loader:
            scaler.scale(model(x)).backward()
            scaler.unscale_(opt)
            if on_xla:
                scaler.step(opt)
                scaler.update()
            elif x.finite:
                scaler.step(opt)
                scaler.update()
    """
    assert lines(src, "AMP008") == [4]


def test_amp008_backend_switch_whose_else_steps_another_optimizer() -> None:
    src = """\
    def train(loader, scaler, opt, other, model, on_xla):
        for x in loader:
            scaler.scale(model(x)).backward()
            scaler.unscale_(opt)
            if on_xla:
                scaler.step(opt)
                scaler.update()
            else:
                scaler.step(other)
    """
    assert lines(src, "AMP008") == [4]


def test_amp008_names_the_step_of_its_own_branch() -> None:
    """Swin-Transformer's SimMIM loop: an accumulation branch and a plain branch, each with its
    own step; the finding points at the step that the unscale_ waits for."""
    src = """\
    def train(loader, scaler, optimizer, model, accumulation_steps, clip):
        for idx, x in enumerate(loader):
            if accumulation_steps > 1:
                scaler.scale(model(x) / accumulation_steps).backward()
                if clip:
                    scaler.unscale_(optimizer)
                if (idx + 1) % accumulation_steps == 0:
                    scaler.step(optimizer)
                    scaler.update()
            else:
                scaler.scale(model(x)).backward()
                scaler.step(optimizer)
                scaler.update()
    """
    found = [f for f in lint_source(textwrap.dedent(src), "t.py") if f.code == "AMP008"]
    assert [f.line for f in found] == [6]
    assert "`scaler.step()` (line 8)" in found[0].message


def test_amp008_a_step_skipped_on_what_the_gradients_show_is_told_to_update_before_skipping() -> None:
    (finding,) = fixture_findings("AMP008/bad_step_skipped_on_a_non_finite_clip_norm.py", "AMP008")
    assert "call `scaler.update()` before skipping the step" in finding.message
    assert "move `unscale_`" not in finding.message


# --------------------------------------------------------------------------------- AMP009
def test_amp009_default_cuda_dtype_without_scaler() -> None:
    src = """\
    import torch
    for x in loader:
        with torch.autocast("cuda"):
            loss = model(x)
        loss.backward()
    """
    assert lines(src, "AMP009") == [3]


def test_amp009_bf16_is_clean() -> None:
    src = """\
    import torch
    for x in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x)
        loss.backward()
    """
    assert lines(src, "AMP009") == []


@pytest.mark.parametrize(
    "owner",
    ["from accelerate import Accelerator\n", "import lightning as L\n", "import deepspeed\n"],
)
def test_amp009_framework_import_owns_the_scaler(owner: str) -> None:
    src = owner + "import torch\nfor x in loader:\n    with torch.autocast('cuda'):\n        loss = model(x)\n    loss.backward()\n"
    assert lines(src, "AMP009") == []


@pytest.mark.parametrize("backward", ["accelerator.backward(loss)", "self.manual_backward(loss)"])
def test_amp009_framework_backward_owns_the_scaler(backward: str) -> None:
    src = f"""\
    import torch
    def training_step(self, x):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = self.net(x)
        {backward}
        loss.detach().backward()
    """
    assert lines(src, "AMP009") == []


def test_amp009_inference_region_is_clean() -> None:
    src = """\
    import torch
    def train(x):
        model(x).sum().backward()
    @torch.no_grad()
    def predict(x):
        with torch.autocast("cuda", dtype=torch.float16):
            return model(x)
    """
    assert lines(src, "AMP009") == []


# --------------------------------------------------------------------------------- AMP010
def test_amp010_enabled_scaler_with_bf16_autocast() -> None:
    src = """\
    import torch
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x)
    scaler.scale(loss).backward()
    """
    assert lines(src, "AMP010") == [2]


def test_amp010_nanogpt_enabled_expression_is_clean() -> None:
    src = """\
    import torch
    dtype = torch.bfloat16
    scaler = torch.amp.GradScaler("cuda", enabled=(dtype == torch.float16))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x)
    scaler.scale(loss).backward()
    """
    assert lines(src, "AMP010") == []


def test_amp010_runtime_dtype_is_clean() -> None:
    src = """\
    import torch
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16 if bf16 else torch.float16):
        loss = model(x)
    """
    assert lines(src, "AMP010") == []


def test_amp010_model_cast_to_bf16() -> None:
    src = """\
    import torch
    model = torch.nn.Linear(4, 4).bfloat16()
    scaler = torch.amp.GradScaler("cuda")
    """
    assert lines(src, "AMP010") == [3]


# --------------------------------------------------------------------------------- AMP011
SCHED = """\
import torch
for x in loader:
    scaler.scale(model(x)).backward()
    scaler.step(optimizer)
    scaler.update()
    scheduler.step()
"""


def test_amp011_scheduler_after_scaler_step() -> None:
    assert lines(SCHED, "AMP011") == [6]


def test_amp011_severity_is_info() -> None:
    (finding,) = [f for f in lint_source(SCHED, "t.py") if f.code == "AMP011"]
    assert finding.severity.value == "info"


def test_amp011_gated_on_scale_comparison_is_clean() -> None:
    src = """\
    for x in loader:
        scaler.scale(model(x)).backward()
        scale_before = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        if scaler.get_scale() >= scale_before:
            scheduler.step()
    """
    assert lines(src, "AMP011") == []


def test_amp011_gated_on_skip_flag_is_clean() -> None:
    src = """\
    for x in loader:
        scaler.scale(model(x)).backward()
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        skip_lr_sched = scale > scaler.get_scale()
        if not skip_lr_sched:
            scheduler.step()
    """
    assert lines(src, "AMP011") == []


def test_amp011_epoch_scheduler_is_clean() -> None:
    src = """\
    for epoch in range(3):
        for x in loader:
            scaler.scale(model(x)).backward()
            scaler.step(optimizer)
            scaler.update()
        scheduler.step()
    """
    assert lines(src, "AMP011") == []


def test_amp011_scheduler_picked_from_a_dict_of_schedulers() -> None:
    src = """\
    for name, x in loader:
        scaler.scale(models[name](x)).backward()
        scaler.step(optimizers[name])
        scaler.update()
        lr_schedulers[name].step()
    """
    assert lines(src, "AMP011") == [5]


def test_amp011_element_of_a_collection_not_named_for_schedulers_is_not_a_scheduler() -> None:
    src = """\
    for name, x in loader:
        scaler.scale(models[name](x)).backward()
        scaler.step(optimizers[name])
        scaler.update()
        samplers[name].step()
    """
    assert lines(src, "AMP011") == []


# --------------------------------------------------------------------------------- AMP012
SAVE = """\
import torch
scaler = torch.amp.GradScaler("cuda")
def save(model, optimizer):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "c.pt")
"""


def test_amp012_save_without_scaler_state() -> None:
    assert lines(SAVE, "AMP012") == [4]


def test_amp012_scaler_in_helper_dict_is_clean() -> None:
    src = """\
    import torch
    scaler = torch.amp.GradScaler("cuda")
    def save(model, optimizer):
        ckpt = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        ckpt["scaler"] = scaler.state_dict()
        torch.save(ckpt, "c.pt")
    """
    assert lines(src, "AMP012") == []


def test_amp012_splatted_extra_dict_is_clean() -> None:
    src = SAVE.replace('optimizer.state_dict()}', 'optimizer.state_dict(), **extra}')
    assert lines(src, "AMP012") == []


def test_amp012_load_without_scaler() -> None:
    src = """\
    import torch
    scaler = torch.amp.GradScaler("cuda")
    ckpt = torch.load("c.pt")
    optimizer.load_state_dict(ckpt["optimizer"])
    """
    assert lines(src, "AMP012") == [4]


def test_amp012_unsafe_fix_adds_scaler_entry() -> None:
    assert fixed(SAVE, "AMP012") == SAVE
    assert_fix(
        SAVE,
        "AMP012",
        SAVE.replace('optimizer.state_dict()}', 'optimizer.state_dict(), "scaler": scaler.state_dict()}'),
        unsafe=True,
    )


def test_amp012_fix_keeps_multiline_layout() -> None:
    src = """\
    import torch
    scaler = torch.amp.GradScaler("cuda")
    def save(model, optimizer):
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
        }
        torch.save(state, "c.pt")
    """
    expected = src.replace(
        '            "optimizer": optimizer.state_dict(),\n',
        '            "optimizer": optimizer.state_dict(),\n            "scaler": scaler.state_dict(),\n',
    )
    assert_fix(src, "AMP012", expected, unsafe=True)


def test_amp012_no_fix_when_scaler_not_in_scope() -> None:
    src = """\
    import torch
    def save(model, optimizer):
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "c.pt")
    def train():
        scaler = torch.amp.GradScaler("cuda")
    """
    (finding,) = [f for f in lint_source(textwrap.dedent(src), "t.py") if f.code == "AMP012"]
    assert finding.fix is None


# --------------------------------------------------------------------------------- AMP013
FWD_ONLY = """\
import torch


class F(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, a, b):
        return a @ b

    @staticmethod
    def backward(ctx, g):
        return g, g
"""


def test_amp013_custom_fwd_without_custom_bwd() -> None:
    assert lines(FWD_ONLY, "AMP013") == [11]


def test_amp013_safe_fix_adds_matching_custom_bwd() -> None:
    assert_fix(
        FWD_ONLY,
        "AMP013",
        FWD_ONLY.replace(
            "    @staticmethod\n    def backward",
            '    @staticmethod\n    @torch.amp.custom_bwd(device_type="cuda")\n    def backward',
        ),
    )


def test_amp013_undecorated_function_in_amp_module() -> None:
    src = """\
    import torch
    class Mul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            return a * b
        @staticmethod
        def backward(ctx, g):
            return g, g
    with torch.autocast("cuda"):
        y = Mul.apply(x, w)
    """
    assert lines(src, "AMP013") == [2]


def test_amp013_module_without_amp_is_clean() -> None:
    src = """\
    import torch
    class Mul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            return a * b
    """
    assert lines(src, "AMP013") == []


def test_amp013_custom_fwd_with_setup_context() -> None:
    src = """\
    import torch
    class Mul(torch.autograd.Function):
        @staticmethod
        @torch.amp.custom_fwd(device_type="cuda")
        def forward(a, b):
            return a * b
        @staticmethod
        def setup_context(ctx, inputs, output):
            pass
    """
    assert lines(src, "AMP013") == [4]


def test_amp013_one_tensor_input_is_not_said_to_receive_mixed_tensors() -> None:
    """A Function of one tensor still runs its matmuls in float16 under autocast; the message
    says that, not that forward receives a mix of dtypes."""
    src = """\
    import torch
    class MatrixSqrt(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            vals, vecs = torch.linalg.eigh(a)
            ctx.save_for_backward(vals, vecs)
            return vecs @ vals.sqrt().diag_embed() @ vecs.mT
        @staticmethod
        def backward(ctx, grad):
            vals, vecs = ctx.saved_tensors
            return vecs @ (vecs.mT @ grad @ vecs / (vals.sqrt()[..., None] + vals.sqrt())) @ vecs.mT
    with torch.autocast("cuda"):
        y = MatrixSqrt.apply(x)
    """
    [finding] = [f for f in lint_source(textwrap.dedent(src), "t.py") if f.code == "AMP013"]
    assert "matmuls, convolutions or extension calls in its forward run in float16" in finding.message
    assert "receives a mix" not in finding.message


def test_amp013_a_forward_only_function_of_an_index_tensor_and_a_count_is_not_flagged() -> None:
    (finding,) = fixture_findings("AMP013/bad_forward_only_function_mixing_float_inputs.py", "AMP013")
    assert "backward" not in finding.message  # it has none
    assert fixture_findings("AMP013/good_forward_only_function_of_an_index_and_a_count.py", "AMP013") == []


def test_amp013_inputs_cast_to_the_autocast_dtype_by_every_caller_are_not_said_to_mix() -> None:
    """A wrapper that casts every input to the autocast dtype leaves forward one dtype: the message
    says only that backward runs without forward's autocast state; one that casts part keeps the mix."""
    cast, partly_cast = fixture_findings("AMP013/bad_inputs_cast_to_the_autocast_dtype_by_the_caller.py", "AMP013")
    assert "receives a mix" not in cast.message
    assert "cast_inputs" not in cast.message
    assert "backward runs with autocast in an unknown state" in cast.message
    assert "receives a mix of float16/bfloat16 and float32" in partly_cast.message  # no region says which


def test_amp013_names_the_precision_of_the_files_autocast_regions():
    (finding,) = fixture_findings("AMP013/bad_function_under_bfloat16_autocast.py", "AMP013")
    assert "receives a mix of bfloat16 and float32" in finding.message


# --------------------------------------------------------------------------------- AMP003
def test_amp003_names_the_with_that_enters_a_region_built_elsewhere() -> None:
    src = """\
    from functools import partial
    import torch
    autocast_cuda = partial(torch.autocast, "cuda")
    def train(model, x, scaler):
        with autocast_cuda(dtype=torch.float16):
            loss = model(x)
            scaler.scale(loss).backward()
    """
    (finding,) = [f for f in lint_source(textwrap.dedent(src), "t.py") if f.code == "AMP003"]
    assert "the autocast region opened on line 5" in finding.message


# --------------------------------------------------------------------------------- AMP014
def test_amp014_uncast_outer_tensor_in_disabled_block() -> None:
    src = """\
    import torch
    with torch.autocast("cuda"):
        h = model(x)
        with torch.autocast("cuda", enabled=False):
            y = torch.softmax(h, -1)
    """
    assert lines(src, "AMP014") == [4]


def test_amp014_cast_input_is_clean() -> None:
    src = """\
    import torch
    with torch.autocast("cuda"):
        h = model(x)
        with torch.autocast("cuda", enabled=False):
            y = torch.softmax(h.float(), -1)
    """
    assert lines(src, "AMP014") == []


def test_amp014_severity_is_info() -> None:
    src = 'import torch\nwith torch.autocast("cuda"):\n    h = m(x)\n    with torch.autocast("cuda", enabled=False):\n        y = f(h)\n'
    (finding,) = [f for f in lint_source(src, "t.py") if f.code == "AMP014"]
    assert finding.severity.value == "info"


def test_amp014_names_only_the_input_a_helper_leaves_uncast() -> None:
    (finding,) = fixture_findings("AMP014/bad_loss_helper_of_the_file_uses_one_input_uncast.py", "AMP014")
    assert "`y_d_hat_g`" in finding.message and "`y_d_hat_r`" not in finding.message


def test_amp014_pairs_zip_arguments_with_the_loop_names_they_feed() -> None:
    src = """\
    import torch
    def feature_loss(fmap_r, fmap_g):
        loss = 0
        for i, (dr, dg) in enumerate(zip(fmap_r, fmap_g)):
            loss += torch.mean(torch.abs(dr.float() - dg))
        return loss
    with torch.autocast("cuda"):
        fmap_r, fmap_g = net_d(y, y_hat)
        with torch.autocast("cuda", enabled=False):
            loss_fm = feature_loss(fmap_r, fmap_g)
    """
    (finding,) = [f for f in lint_source(textwrap.dedent(src), "t.py") if f.code == "AMP014"]
    assert "`fmap_g`" in finding.message and "`fmap_r`" not in finding.message



# --------------------------------------------------------------------------------- AMP015
def test_amp015_thread_started_in_region() -> None:
    src = """\
    import threading
    import torch
    with torch.autocast("cuda"):
        t = threading.Thread(target=lambda: model(x))
    """
    assert lines(src, "AMP015") == [4]


def test_amp015_executor_submit_in_region() -> None:
    src = """\
    from concurrent.futures import ThreadPoolExecutor
    import torch
    pool = ThreadPoolExecutor(2)
    with torch.autocast("cuda"):
        fut = pool.submit(model, x)
    """
    assert lines(src, "AMP015") == [5]


def test_amp015_builtin_map_is_clean() -> None:
    src = 'import torch\nwith torch.autocast("cuda"):\n    ys = list(map(model, xs))\n'
    assert lines(src, "AMP015") == []


# --------------------------------------------------------------------------------- AMP016
def test_amp016_unsupported_dtype() -> None:
    src = 'import torch\nwith torch.autocast("cpu", dtype=torch.float32):\n    y = model(x)\n'
    assert lines(src, "AMP016") == [2]


def test_amp016_bf16_cuda_without_guard() -> None:
    src = 'import torch\nwith torch.autocast("cuda", dtype=torch.bfloat16):\n    y = model(x)\n'
    assert lines(src, "AMP016") == [2]


def test_amp016_bf16_cuda_with_guard_is_clean() -> None:
    src = 'import torch\nassert torch.cuda.is_bf16_supported()\nwith torch.autocast("cuda", dtype=torch.bfloat16):\n    y = model(x)\n'
    assert lines(src, "AMP016") == []


def test_amp016_bce_in_region_through_helper() -> None:
    src = """\
    import torch
    import torch.nn.functional as F
    def loss_fn(p, y):
        return F.binary_cross_entropy(p, y)
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x).sigmoid(), y)
    """
    assert lines(src, "AMP016") == [4]


def test_amp016_bce_with_logits_is_clean() -> None:
    src = """\
    import torch
    with torch.autocast("cuda", dtype=torch.float16):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
    """
    assert lines(src, "AMP016") == []


# --------------------------------------------------------------------------------- AMP017
COMPILED = """\
import torch
model = torch.compile(model)
for x in loader:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x)
    loss.backward()
"""


def test_amp017_compiled_model_under_autocast() -> None:
    assert lines(COMPILED, "AMP017") == [2]


def test_amp017_config_set_is_clean() -> None:
    src = 'import torch\ntorch._functorch.config.backward_pass_autocast = "off"\n' + COMPILED.split("\n", 1)[1]
    assert lines(src, "AMP017") == []


def test_amp017_advice_runs_as_written_on_the_installed_torch() -> None:
    """The statements the message asks for, run after a bare `import torch`: the setting's module is
    not loaded by `import torch` alone, so the advice must import it."""
    pytest.importorskip("torch")
    import re

    message = next(f.message for f in lint_source(COMPILED.encode(), "train.py") if f.code == "AMP017")
    statements = [code for code in re.findall(r"`([^`]+)`", message) if code.startswith(("import ", "torch._functorch."))]
    program = "import torch\n" + "\n".join(sorted(statements, key=lambda code: not code.startswith("import "))) + "\n"
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


def _amp017_message_for_a_project_pinning(tmp_path, requirement: str) -> str:
    """AMP017's message on COMPILED, checked through the CLI in a project whose requirements pin torch."""
    (tmp_path / "requirements.txt").write_text(requirement + "\n")
    (tmp_path / "train.py").write_text(COMPILED)
    run = subprocess.run(
        [sys.executable, "-m", "amplint", "check", "--no-cache", "--output-format", "json", "--select", "AMP017", "."],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    [finding] = json.loads(run.stdout)
    return finding["message"]


def test_amp017_advice_on_a_torch_older_than_the_setting_moves_autocast_inside(tmp_path) -> None:
    """`backward_pass_autocast` arrived in torch 2.8: on an older pin, setting it raises."""
    message = _amp017_message_for_a_project_pinning(tmp_path, "torch==2.1.1")
    assert "the project's oldest torch, 2.1.1, predates the `backward_pass_autocast` setting of torch 2.8" in message
    assert "torch._functorch.config" not in message


def test_amp017_advice_on_a_torch_older_than_torch_compile_says_so(tmp_path) -> None:
    """efficientdet-pytorch pins torch 1.12.1, older than `torch.compile` itself."""
    message = _amp017_message_for_a_project_pinning(tmp_path, "torch==1.12.1")
    assert "the project's oldest torch, 1.12.1, predates `torch.compile` (2.0) and the `backward_pass_autocast` setting" in message


def test_amp012_message_beside_bfloat16_autocast_says_the_scaler_is_not_needed() -> None:
    [finding] = fixture_findings("AMP012/bad_bf16_trainer_saves_without_the_scaler.py", "AMP012")
    assert "not needed at all: see AMP010" in finding.message and "re-calibrates" not in finding.message


def test_amp017_backward_inside_autocast_is_not_a_mismatch() -> None:
    src = COMPILED.replace("    loss.backward()", "        loss.backward()")
    assert lines(src, "AMP017") == []


def test_amp017_cites_the_scalers_backward_not_the_fallback_for_a_run_without_amp() -> None:
    (finding,) = fixture_findings("AMP017/bad_compiled_model_with_timm_scaler_and_plain_fallback.py", "AMP017")
    assert "backward runs outside it (line 15)" in finding.message  # `loss_scaler(loss, optimizer, ...)`


def test_amp011_config_flag_named_skip_is_not_a_skip_check() -> None:
    src = SCHED.replace("    scheduler.step()\n", "    if not args.skip_lr:\n        scheduler.step()\n")
    assert lines(src, "AMP011") == [7]


def test_amp011_helper_given_the_scaler_is_a_skip_check() -> None:
    src = SCHED.replace("    scheduler.step()\n", "    if not step_was_skipped_by(scaler):\n        scheduler.step()\n")
    assert lines(src, "AMP011") == []


def test_amp011_flag_returned_by_a_step_helper_that_returns_the_loss_is_no_skip_check() -> None:
    path = STATIC_FIXTURES / "AMP011/good_step_helper_returns_whether_the_scale_held.py"
    src = path.read_text(encoding="utf-8").replace(
        "return scale_before <= self.grad_scaler.get_scale()", "return loss.detach()"
    )
    assert lines(src, "AMP011") == [27]


def test_amp007_helper_with_own_loop_called_twice_is_not_two_steps() -> None:
    src = """\
    def run(loader, scaler, opt):
        for x in loader:
            scaler.scale(x).backward()
            scaler.step(opt)
            scaler.update()
    def compare(loader, scaler, opt):
        run(loader, scaler, opt)
        run(loader, scaler, opt)
    """
    assert lines(src, "AMP007") == []


def test_amp017_cites_the_backward_of_the_function_that_compiles() -> None:
    src = """\
    import torch

    def first(model, x):
        model = torch.compile(model)
        with torch.autocast("cuda"):
            loss = model(x).sum()
        loss.backward()

    def second(model, x):
        model = torch.compile(model)
        with torch.autocast("cuda"):
            loss = model(x).sum()
        loss.backward()
    """
    found = sorted((f.line, f.message) for f in lint_source(textwrap.dedent(src), "t.py") if f.code == "AMP017")
    assert [(line, "(line 7)" in message, "(line 13)" in message) for line, message in found] == [(4, True, False), (10, False, True)]


def test_amp017_cites_the_backward_after_the_forward_under_autocast() -> None:
    src = """\
    import torch
    model = torch.compile(torch.nn.Linear(8, 8))
    ctx = torch.autocast("cuda", dtype=torch.bfloat16)
    if write_tensors:
        model(torch.randn(4, 8)).sum().backward()
    for step in range(10):
        with ctx:
            loss = model(torch.randn(4, 8)).sum()
        loss.backward()
    """
    [finding] = [f for f in lint_source(textwrap.dedent(src), "t.py") if f.code == "AMP017"]
    assert "(line 9)" in finding.message  # llm.c: not the float32 debug pass on line 5


def test_amp009_names_the_scaler_of_the_regions_device() -> None:
    src = """\
    import torch
    for x in data:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x).mean()
        loss.backward()
        optimizer.step()
    """
    [finding] = [f for f in lint_source(textwrap.dedent(src), "t.py") if f.code == "AMP009"]
    assert 'GradScaler("cpu")' in finding.message


def test_amp013_fix_spells_custom_bwd_with_the_files_alias() -> None:
    src = """\
    import torch
    from torch.amp import custom_bwd as cbwd, custom_fwd as cfwd
    class Gelu(torch.autograd.Function):
        @staticmethod
        @cfwd(device_type="cuda")
        def forward(ctx, x, bias):
            return x + bias
        @staticmethod
        def backward(ctx, grad):
            return grad, grad
    """
    expected = """\
    import torch
    from torch.amp import custom_bwd as cbwd, custom_fwd as cfwd
    class Gelu(torch.autograd.Function):
        @staticmethod
        @cfwd(device_type="cuda")
        def forward(ctx, x, bias):
            return x + bias
        @staticmethod
        @cbwd(device_type="cuda")
        def backward(ctx, grad):
            return grad, grad
    """
    assert_fix(src, "AMP013", expected)


def test_amp005_advice_names_the_scaler_and_the_optimizer_the_code_uses() -> None:
    (finding,) = fixture_findings("AMP005/bad_trainer_logs_the_grad_norm_of_self_scaler.py", "AMP005")
    assert "call `self.scaler.unscale_(self.optimizer)` before it" in finding.message
    assert "clip threshold" not in finding.message  # nothing is clipped: the norm is logged


def test_amp008_names_a_guard_that_is_no_accumulation_for_what_it_is() -> None:
    (finding,) = fixture_findings("AMP008/bad_unscale_before_a_step_skipped_by_another_condition.py", "AMP008")
    assert "does not run every time `unscale_()` does" in finding.message
    assert "micro-batch" not in finding.message


def test_amp002_inputs_cast_by_hand_are_told_their_cost_not_the_scalers() -> None:
    findings = fixture_findings("AMP002/bad_inputs_and_targets_cast_by_a_trainer.py", "AMP002")
    assert [f.line for f in findings] == [13, 14]
    assert all("keep inputs and targets in float32" in f.message and "cannot unscale" not in f.message for f in findings)


def test_amp002_batches_from_a_data_loader_are_told_the_inputs_cost_whatever_their_names() -> None:
    findings = fixture_findings("AMP002/bad_batch_parts_cast_by_hand.py", "AMP002")
    assert [f.line for f in findings] == [9, 19]
    assert all("keep inputs and targets in float32" in f.message for f in findings)


def test_amp002_a_value_the_step_computed_is_told_the_rounding_cost_not_the_scalers() -> None:
    (finding,) = fixture_findings("AMP002/bad_computed_value_cast_to_match_its_target.py", "AMP002")
    assert "leave computed values in the dtype autocast gives each op" in finding.message
    assert "cannot unscale" not in finding.message


def test_amp002_a_models_outputs_cast_by_hand_are_computed_values() -> None:
    src = """\
    import torch
    model = torch.nn.Linear(4, 4)
    scaler = torch.amp.GradScaler()
    for x in loader:
        with torch.autocast("cuda"):
            h = model(x)
            h = h.half()
        scaler.scale(h.mean()).backward()
    """
    (finding,) = [f for f in lint_source(textwrap.dedent(src), "t.py") if f.code == "AMP002"]
    assert "leave computed values" in finding.message


@pytest.mark.parametrize(
    ("binding", "advice"),
    [
        ("mel = mel_spectrogram(y_hat)", "leave computed values"),
        ("mel = build_model(cfg)", "keep the model and inputs in float32"),
    ],
)
def test_amp002_a_function_named_for_a_computation_returns_a_computed_value(binding: str, advice: str) -> None:
    src = f"""\
    import torch
    scaler = torch.amp.GradScaler()
    for x in loader:
        with torch.autocast("cuda"):
            y_hat = net(x)
            {binding}
            mel = mel.half()
        scaler.scale(loss(mel)).backward()
    """
    (finding,) = [f for f in lint_source(textwrap.dedent(src), "t.py") if f.code == "AMP002"]
    assert advice in finding.message


def test_amp002_a_dtype_bound_in_each_branch_of_an_if_is_named_as_chosen_at_run_time() -> None:
    (finding,) = fixture_findings("AMP002/bad_inputs_cast_to_a_dtype_chosen_by_if_statements.py", "AMP002")
    assert "`image` is converted to float16 or bfloat16 (chosen at run time) by hand" in finding.message


def test_amp002_parameters_and_networks_named_like_data_get_the_models_advice() -> None:
    findings = fixture_findings("AMP002/bad_parameters_and_networks_named_like_data.py", "AMP002")
    assert len(findings) == 3
    assert all("keep the model and inputs in float32" in f.message for f in findings)


def test_amp002_parameter_tensors_written_back_through_data_get_the_models_advice() -> None:
    findings = fixture_findings("AMP002/bad_parameter_tensors_written_back_through_data.py", "AMP002")
    assert len(findings) == 3
    assert all("keep the model and inputs in float32" in f.message for f in findings)


def test_amp002_a_dtype_chosen_at_run_time_is_named_as_chosen_at_run_time() -> None:
    (finding,) = fixture_findings("AMP002/bad_model_cast_to_a_dtype_chosen_at_run_time.py", "AMP002")
    assert "`model` is converted to float16 or bfloat16 (chosen at run time) by hand" in finding.message


def test_amp007_offers_no_update_inside_a_loop_over_optimizers() -> None:
    (finding,) = fixture_findings("AMP007/bad_update_missing_after_a_loop_over_optimizers.py", "AMP007")
    assert finding.fix is None  # one update per optimizer would be the next AMP007


def test_amp005_in_a_helper_names_the_call_that_reaches_it_with_scaled_gradients() -> None:
    (finding,) = fixture_findings("AMP005/bad_trainer_clip_helper.py", "AMP005")
    assert "before the call on line 21 that reaches it with them" in finding.message


def test_amp005_scaled_and_read_in_one_helper_is_advised_there_not_at_its_callers_call() -> None:
    (finding,) = fixture_findings("AMP005/bad_norm_logged_in_the_epoch_function_that_scales.py", "AMP005")
    assert finding.message.endswith("call `scaler.unscale_(optimizer)` before it")


def test_amp005_an_unscale_on_some_passes_only_is_named_and_not_doubled_by_a_fix() -> None:
    (finding,) = fixture_findings("AMP005/bad_unscale_only_when_logging_the_norm.py", "AMP005")
    assert "where `scaler.unscale_(optimizer)` (line 13) does not run" in finding.message
    assert finding.fix is None


def test_amp005_a_clip_in_the_micro_batch_loop_is_told_to_move_after_it_without_a_fix() -> None:
    micro, groups = fixture_findings("AMP005/bad_clip_in_every_micro_batch.py", "AMP005")
    assert "once the micro-batch loop has ended, and move this after it" in micro.message and micro.fix is None
    assert groups.message.endswith("call `scaler.unscale_(opt)` before it")  # a loop over groups is no micro-batch loop


def test_amp005_advises_unscaling_the_optimizer_whose_gradients_are_still_scaled() -> None:
    (finding,) = fixture_findings("AMP005/bad_second_model_clipped_after_the_first_optimizer_unscaled.py", "AMP005")
    assert "call `scaler.unscale_(opt_head)` before it" in finding.message  # opt_backbone is unscaled already


def test_amp017_calls_a_compiled_function_a_function() -> None:
    (finding,) = fixture_findings("AMP017/bad_compiled_step_function_called_under_autocast.py", "AMP017")
    assert finding.message.startswith("this compiled function runs under autocast")


def test_amp007_an_update_in_an_oom_except_is_said_to_have_no_step_before_it() -> None:
    (finding,) = fixture_findings("AMP007/bad_update_in_an_oom_except_without_a_step.py", "AMP007")
    assert "in this `except` runs when the `try` failed" in finding.message
    assert "second time" not in finding.message


def test_amp013_a_forward_casting_an_input_is_reported_for_its_matmuls_not_its_inputs() -> None:
    (finding,) = fixture_findings("AMP013/bad_casts_an_input_but_matmuls_under_autocast.py", "AMP013")
    assert "the matmuls, convolutions or extension calls in its forward" in finding.message


PASS_THROUGH = "AMP013/good_forward_passes_an_input_through.py"
RETURN_X = "        return x\n"


def test_amp013_a_forward_returning_an_argument_it_rebound_does_not_pass_it_through() -> None:
    src = fixture_with(PASS_THROUGH, RETURN_X, "        x = torch.addcmul(x, penalty, coef)\n        return x\n")
    assert lines(src, "AMP013") == [5]


def test_amp013_a_pass_through_forward_calling_an_extension_is_reported_for_the_call() -> None:
    src = fixture_with(PASS_THROUGH, RETURN_X, "        _C.record_stats(x)\n        return x\n")
    (finding,) = [f for f in lint_source(src, "t.py") if f.code == "AMP013"]
    assert "the matmuls, convolutions or extension calls in its forward" in finding.message


GAN_UNDER_OPPOSITE_FLAGS = "AMP008/good_gan_steps_generator_then_clips_discriminator_under_flags.py"


def test_amp007_update_before_a_step_under_the_opposite_condition_is_not_between_two_steps() -> None:
    assert fixture_findings(GAN_UNDER_OPPOSITE_FLAGS, "AMP007") == []


def test_amp007_update_before_a_step_under_an_unrelated_condition_is_between_two_steps() -> None:
    """Without a scaled backward of its own, the critic's step uses gradients scaled before the update."""
    src = fixture_with(GAN_UNDER_OPPOSITE_FLAGS, "        if not train_critic:\n", "        if it >= 0:\n")
    src = src.replace("            scaler.scale(critic_loss).backward()\n", "")
    src = src.replace("            scaler.scale(ae_loss).backward()\n", "            scaler.scale(ae_loss + critic(video)).backward()\n")
    assert lines(src, "AMP007") == [16]


def test_amp008_an_update_before_the_unscale_does_not_commit_it() -> None:
    src = fixture_with(GAN_UNDER_OPPOSITE_FLAGS, "        if not train_critic:\n", "        if it >= 0:\n")
    assert lines(src, "AMP008") == []


def test_amp013_a_forward_adding_into_the_argument_it_returns_does_not_pass_it_through() -> None:
    src = fixture_with(PASS_THROUGH, RETURN_X, "        x += penalty\n        return x\n")
    assert lines(src, "AMP013") == [5]


def test_amp013_a_forward_changing_the_argument_it_returns_in_place_does_not_pass_it_through() -> None:
    src = fixture_with(PASS_THROUGH, RETURN_X, "        x.mul_(coef)\n        return x\n")
    assert lines(src, "AMP013") == [5]


SCALER_ONLY_FOR_BF16 = """\
import torch


def main(model, loader, args):
    opt = torch.optim.AdamW(model.parameters())
    dtype = torch.bfloat16 if args.bf16 else OTHER
    scaler = torch.amp.GradScaler("cuda") if args.bf16 else None
    for x, y in loader:
        with torch.autocast("cuda", dtype=dtype, enabled=args.use_amp):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
"""


@pytest.mark.parametrize("other,advice", [("torch.float32", "drop it"), ("torch.float16", "build it for float16")])
def test_amp010_advice_for_a_bf16_only_scaler_follows_the_other_dtype_of_the_run(other: str, advice: str) -> None:
    (finding,) = [f for f in lint_source(SCALER_ONLY_FOR_BF16.replace("OTHER", other), "t.py") if f.code == "AMP010"]
    assert advice in finding.message


def test_amp011_advice_names_a_scaler_the_schedulers_code_can_reach() -> None:
    """The scaler steps inside a helper class's `__call__` (timm's NativeScaler, defined here): the
    scheduler's function has no `self._scaler` to test."""
    src = """\
import torch


class NativeScaler:
    def __init__(self):
        self._scaler = torch.amp.GradScaler("cuda")

    def __call__(self, loss, optimizer):
        self._scaler.scale(loss).backward()
        self._scaler.step(optimizer)
        self._scaler.update()


def main(model, loader, optimizer, lr_scheduler):
    loss_scaler = NativeScaler()
    for step, (x, y) in enumerate(loader):
        with torch.autocast("cuda"):
            loss = model(x, y)
        loss_scaler(loss, optimizer)
        lr_scheduler.step_update(step)
"""
    (finding,) = [f for f in lint_source(src, "t.py") if f.code == "AMP011"]
    assert "`applied += scaler.get_scale() >= scale_before`" in finding.message


# -- what the messages say (the .expected files pin lines, not words) ----------------------------


def test_amp001_message_says_a_device_string_lands_in_the_old_scalers_init_scale() -> None:
    [finding] = fixture_findings("AMP001/bad_device_string_passed_to_the_old_scaler.py", "AMP001")
    assert '`"cuda"` lands in its first parameter, `init_scale`' in finding.message


def test_amp001_message_on_a_plain_old_scaler_says_nothing_of_init_scale() -> None:
    findings = fixture_findings("AMP001/bad_cpu_amp.py", "AMP001")
    assert findings and not any("init_scale" in f.message for f in findings)


def test_amp013_message_on_a_function_fed_by_its_callers_projections_claims_no_mix() -> None:
    [finding] = fixture_findings("AMP013/bad_attention_function_fed_by_the_callers_projections.py", "AMP013")
    assert "receives a mix" not in finding.message and "backward runs with autocast in an unknown state" in finding.message


def test_amp004_per_epoch_message_says_the_scale_starts_over_each_epoch() -> None:
    [finding] = fixture_findings("AMP004/bad_scaler_per_epoch.py", "AMP004")
    assert "starts over every epoch" in finding.message and "never calibrates" not in finding.message


def test_amp004_per_batch_message_says_the_scale_never_calibrates() -> None:
    [finding] = fixture_findings("AMP004/bad_scaler_per_batch.py", "AMP004")
    assert "never calibrates" in finding.message and "build it once before the loop" in finding.message


def test_amp011_scheduler_before_the_scaler_step_is_told_to_step_after_the_update() -> None:
    [finding] = fixture_findings("AMP011/bad_scheduler_stepped_before_the_scaler_step.py", "AMP011")
    assert "in every iteration before" in finding.message and "after `" in finding.message


def test_amp011_scheduler_given_its_position_is_told_to_count_the_applied_steps_instead() -> None:
    [finding] = fixture_findings("AMP011/bad_scheduler_stepped_on_a_counter.py", "AMP011")
    assert "hand it a count of the steps the scaler applied in place of `" in finding.message
    assert "`applied += scaler.get_scale() >= scale_before`" in finding.message


def test_amp011_scheduler_given_its_position_and_the_epoch_keeps_the_epoch() -> None:
    """OneCycle-style `step(it, epoch)`: only the position becomes the count of applied steps."""
    src = """\
    import torch
    def train(model, optimizer, lr_scheduler, loader, criterion):
        scaler = torch.amp.GradScaler("cuda")
        it = 0
        for epoch in range(10):
            for x, y in loader:
                lr_scheduler.step(it, epoch)
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = criterion(model(x), y)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                it += 1
    """
    [finding] = [f for f in lint_source(textwrap.dedent(src), "t.py") if f.code == "AMP011"]
    assert "in place of `it` (after" in finding.message


def test_amp011_scheduler_given_the_epoch_and_the_batch_index_by_keyword_replaces_the_index() -> None:
    """LAVIS: `step(cur_epoch=inner_epoch, cur_step=i)`; the batch loop binds `i`, the position."""
    src = """\
    import torch
    def train_epoch(model, optimizer, lr_scheduler, loader, inner_epoch):
        scaler = torch.amp.GradScaler("cuda")
        for i, (x, y) in enumerate(loader):
            lr_scheduler.step(cur_epoch=inner_epoch, cur_step=i)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(x, y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    """
    [finding] = [f for f in lint_source(textwrap.dedent(src), "t.py") if f.code == "AMP011"]
    assert "in place of `cur_step=i` (after" in finding.message


def test_amp012_a_save_helper_whose_caller_holds_the_scaler_is_told_to_take_it_in() -> None:
    [finding] = fixture_findings("AMP012/bad_checkpoint_helper_called_by_the_function_holding_the_scaler.py", "AMP012")
    assert "`save_checkpoint()`, which builds the checkpoint, does not see the scaler: pass it in" in finding.message


def test_amp002_value_checked_to_be_a_tensor_gets_the_advice_for_inputs() -> None:
    [finding] = fixture_findings("AMP002/bad_tensor_arguments_cast_by_a_decorator.py", "AMP002")
    assert "keep inputs and targets in float32" in finding.message


def test_amp012_message_names_the_condition_the_scaler_is_on_under() -> None:
    [finding] = fixture_findings("AMP012/bad_checkpoint_name_reused_for_load_and_save.py", "AMP012")[:1]
    assert "which is on when `dtype == \"float16\"`" in finding.message


def test_amp012_optimizer_handed_to_a_helper_names_the_condition_the_scaler_is_on_under() -> None:
    [finding] = fixture_findings("AMP012/bad_optimizer_handed_to_a_save_helper.py", "AMP012")
    assert "is given the optimizer but not the GradScaler, which is on when `hps.train.fp16_run`" in finding.message


def test_amp012_condition_keeps_only_the_tests_every_value_of_the_scalers_attribute_shares() -> None:
    [shared] = fixture_findings("AMP012/bad_scaler_attribute_also_taken_from_a_wrapper.py", "AMP012")
    assert "which is on when `self._use_amp and grad_scaling`;" in shared.message
    [unknown] = fixture_findings("AMP012/bad_scaler_attribute_replaced_by_a_given_one.py", "AMP012")
    assert "which is on when" not in unknown.message


def test_amp012_message_quotes_the_files_own_init_scale() -> None:
    [finding] = fixture_findings("AMP012/bad_checkpoint_built_by_a_helper_that_does_not_see_the_scaler.py", "AMP012")
    assert "`cfg.loss_scale`" in finding.message and "65536" not in finding.message


def test_amp012_no_fix_where_the_dict_is_built_by_a_helper_that_cannot_see_the_scaler() -> None:
    [finding] = fixture_findings("AMP012/bad_checkpoint_built_by_a_helper_that_does_not_see_the_scaler.py", "AMP012")
    assert finding.fix is None and "does not see the scaler: pass it in" in finding.message


TWO_SCALERS = "AMP012/bad_two_scalers_each_stepping_its_own_optimizer.py"


def test_amp012_restore_names_the_scaler_that_steps_the_restored_optimizer() -> None:
    restore_gen, restore_disc, _ = fixture_findings(TWO_SCALERS, "AMP012")
    assert "(`scaler.load_state_dict(...)`)" in restore_gen.message
    assert "(`scaler_disc.load_state_dict(...)`)" in restore_disc.message


def test_amp012_save_of_two_optimizers_names_and_adds_the_scaler_of_each() -> None:
    *_, save = fixture_findings(TWO_SCALERS, "AMP012")
    assert 'add `"scaler": scaler.state_dict()` and `"scaler_disc": scaler_disc.state_dict()` and restore them' in save.message
    src = (STATIC_FIXTURES / TWO_SCALERS).read_text(encoding="utf-8")
    entries = '"steps": train_steps,\n'
    with_scalers = entries + '                "scaler": scaler.state_dict(),\n                "scaler_disc": scaler_disc.state_dict(),\n'
    out = fixed(src, "AMP012", unsafe=True)
    assert out == src.replace(entries, with_scalers)
    assert lines(out, "AMP012") == [14, 15]  # the restores are left to the reader


def test_amp012_save_of_one_optimizer_names_the_scaler_that_steps_it() -> None:
    src = fixture_with(TWO_SCALERS, '                "optimizer": optimizer.state_dict(),\n', "")
    *_, save = [f for f in lint_source(src, "t.py") if f.code == "AMP012"]
    assert 'add `"scaler": scaler_disc.state_dict()` and restore it' in save.message


def test_amp010_flag_named_for_bf16_in_a_file_without_autocast_says_the_name_is_the_only_evidence() -> None:
    findings = fixture_findings("AMP010/bad_scaler_built_only_for_bf16.py", "AMP010")
    assert findings and all("this file opens no autocast to confirm it" in f.message for f in findings)


def test_amp010_flag_confirmed_by_the_files_bf16_region_says_drop_the_scaler() -> None:
    [finding] = fixture_findings("AMP010/bad_scaler_enabled_by_a_bf16_flag.py", "AMP010")
    assert "that is for bfloat16" in finding.message and "drop it" in finding.message


def test_amp017_cites_the_backward_after_the_compiled_objects_own_forward():
    """`self.net(x)` in `fit`, not a plain `net(x)` in another function, says which backward to cite."""
    functional, method = fixture_findings("AMP017/bad_compiled_model_bound_by_annotation.py", "AMP017")
    assert "(line 12)" in functional.message
    assert "(line 28)" in method.message


def test_amp002_what_a_step_hook_makes_of_its_batch_is_told_the_inputs_cost() -> None:
    findings = fixture_findings("AMP002/bad_lightning_step_hook_casts_the_batch.py", "AMP002")
    assert [f.line for f in findings] == [10, 12]
    assert all("keep inputs and targets in float32" in f.message for f in findings)


def test_amp012_a_dataclass_snapshot_is_told_to_take_a_field_not_a_dict_key() -> None:
    (finding,) = fixture_findings("AMP012/bad_dataclass_snapshot_saved_through_asdict.py", "AMP012")
    assert "add a field to `Snapshot`, `scaler_state` filled with `" in finding.message
    assert '"scaler":' not in finding.message and finding.fix is None


BACKWARD_WITH_FORWARDS_DECORATOR = """
import torch


class Gather(torch.autograd.Function):
    @staticmethod
    @torch.cuda.amp.custom_fwd(cast_inputs=torch.float32)
    def forward(ctx, x):
        return x * 2

    @staticmethod
    @torch.cuda.amp.custom_fwd(cast_inputs=torch.float32)
    def backward(ctx, grad):
        return grad * 2
"""


@pytest.mark.parametrize(
    ("min_torch", "advised"),
    [(None, '@torch.amp.custom_bwd(device_type="cuda")'), ((2, 2), "@torch.cuda.amp.custom_bwd")],
)
def test_amp013_advises_custom_bwd_spelled_for_the_projects_oldest_torch(min_torch, advised) -> None:
    """Not the deprecated spelling AMP001 flags, unless the project's torch predates its replacement."""
    (finding,) = [f for f in lint_source(textwrap.dedent(BACKWARD_WITH_FORWARDS_DECORATOR), "t.py", min_torch=min_torch) if f.code == "AMP013"]
    assert f"replace it with `{advised}`" in finding.message
    assert "casts none of the incoming gradients" in finding.message


def test_amp005_advice_names_an_optimizer_stepped_directly_but_offers_no_fix() -> None:
    (finding,) = fixture_findings("AMP005/bad_clip_before_stepping_the_optimizer_directly.py", "AMP005")
    assert "call `self.scaler.unscale_(self.opt)` before it" in finding.message
    assert finding.fix is None  # unscale_ without scaler.step() and update() raises on the next iteration


def test_amp010_advice_names_the_dtype_setting_the_regions_read_or_drops_the_scaler() -> None:
    literal = """\
    import torch
    def train(model, loader, optimizer, settings):
        scaler = torch.amp.GradScaler("cuda")
        for x, y in loader:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x, y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    """
    [finding] = [f for f in lint_source(textwrap.dedent(literal), "t.py") if f.code == "AMP010"]
    assert finding.message.endswith("drop it (or build it with `enabled=False`)")
    named = literal.replace("    def train", "    amp_dtype = torch.bfloat16\n    def train").replace("dtype=torch.bfloat16)", "dtype=amp_dtype)")
    [finding] = [f for f in lint_source(textwrap.dedent(named), "t.py") if f.code == "AMP010"]
    assert finding.message.endswith("build it with `enabled=(amp_dtype == torch.float16)`")


@pytest.mark.parametrize("placeholder", ["        pass\n", "        ...\n", "        raise NotImplementedError\n"])
def test_amp011_a_base_class_loop_runs_the_override_of_each_kind_of_placeholder(placeholder: str) -> None:
    name = "AMP011/bad_base_class_loop_with_the_step_in_a_subclass.py"
    src = fixture_with(name, "    def training_step(self, data):\n        pass\n", "    def training_step(self, data):\n" + placeholder)
    assert lines(src, "AMP011") == [16]


def test_amp011_a_one_line_placeholder_is_one_too() -> None:
    name = "AMP011/bad_base_class_loop_with_the_step_in_a_subclass.py"
    src = fixture_with(name, "    def training_step(self, data):\n        pass\n", "    def training_step(self, data): pass\n")
    assert lines(src, "AMP011") == [15]  # one line shorter above the scheduler's step


def test_amp011_a_base_method_that_does_work_is_not_replaced_by_an_override() -> None:
    name = "AMP011/bad_base_class_loop_with_the_step_in_a_subclass.py"
    src = fixture_with(name, "    def training_step(self, data):\n        pass\n", "    def training_step(self, data):\n        self.log(data)\n")
    assert lines(src, "AMP011") == []
