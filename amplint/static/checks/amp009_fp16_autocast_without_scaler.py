"""AMP009 fp16-autocast-without-scaler: training under float16 autocast with no GradScaler."""

from __future__ import annotations

from collections.abc import Iterator

from amplint.static.checks import Hit
from amplint.static.checks import _regions as rg
from amplint.static.checks import _training_step as ts
from amplint.static.semantics import AmpFacts

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
        else:
            continue
        yield Hit(
            call.node,
            f"this autocast region computes in {why} and the module trains (calls backward) without a "
            f"GradScaler: small float16 gradients underflow to zero; scale the loss with "
            f"`torch.amp.GradScaler(\"{_scaler_device(region.device)}\")` or use `dtype=torch.bfloat16` where supported",
            call.where.statement,
        )


def _scaler_device(device: str | None) -> str:
    """The scaler for the region's device (a CPU float16 region needs `GradScaler("cpu")`)."""
    return device if device in ("cpu", "xpu", "mps", "hpu") else "cuda"
