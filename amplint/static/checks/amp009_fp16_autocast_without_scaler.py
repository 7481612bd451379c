"""AMP009 fp16-autocast-without-scaler: training under float16 autocast with no GradScaler."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from amplint.static.checks import Hit
from amplint.static.checks import _regions as rg
from amplint.static.checks import _training_step as ts
from amplint.static.semantics import AmpFacts, CallSite, argument

CODE = "AMP009"


def check(facts: AmpFacts) -> Iterator[Hit]:
    if not facts.has_autocast or not rg.has_backward(facts):
        return
    if ts.mentions_a_scaler(facts) or ts.framework_owned(facts):
        return
    for call, region in rg.autocasts(facts):
        if not rg.enabled(region) or rg.inference_only(facts, call):
            continue
        dtype = rg.literal_dtype(facts, region, call)
        if dtype in rg.FLOAT16:
            why = "float16"
        elif dtype is None and not rg.has_dtype_argument(region, call) and region.device == "cuda":
            why = "float16 (the CUDA default)"
        elif _falls_back_to_float16(facts, call):
            why = "float16 on GPUs without bfloat16 support (T4, V100)"
        else:
            continue
        yield Hit(
            call.node,
            f"this autocast region computes in {why} and the module trains (calls backward) without a "
            f"GradScaler: small float16 gradients underflow to zero; scale the loss with "
            f"`torch.amp.GradScaler(\"{_scaler_device(region.device)}\")` or use `dtype=torch.bfloat16` where supported",
            call.where.statement,
        )


def _falls_back_to_float16(facts: AmpFacts, call: CallSite) -> bool:
    """`dtype=torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16`, written there
    or bound once to a name: the code itself picks float16 on older GPUs (nanoVLM). A dtype picked
    by a setting (`if args.precision == "bf16"`) is the user's choice, and not reported."""
    expr = argument(call.node, None, "dtype")
    values = facts.bindings(expr.value, call.scope) if isinstance(expr, cst.Name) else [(expr, call.scope)]
    if len(values) != 1 or not isinstance(values[0][0], cst.IfExp):
        return False
    choice, scope = values[0]
    branches = {facts.qualname(choice.body, scope), facts.qualname(choice.orelse, scope)}
    return bool(branches & rg.FLOAT16 and branches & rg.BFLOAT16) and bool(
        rg.BF16_SUPPORT_CALL.search(facts.module.code_for_node(choice.test))
    )


def _scaler_device(device: str | None) -> str:
    """The scaler for the region's device (a CPU float16 region needs `GradScaler("cpu")`)."""
    return device if device in ("cpu", "xpu", "mps", "hpu") else "cuda"
