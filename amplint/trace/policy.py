"""The documented autocast op policy (data/autocast_ops.json, copied from the docs' "Autocast Op
Reference") and the check of an observed op against it.

The recorder sees aten ops after decomposition (`linear` -> `t` + `addmm`, `softmax` ->
`_softmax`), so aten names are mapped back to the names the docs use. An op is compared only when
it ran under an enabled autocast on the same device and had an eligible input (floating, not
float64); unlisted ops are never compared ("run in their input dtype" holds by construction).
Nor are ops that ran inside another op's kernel or decomposition, where autocast is off (the
float32 `bmm` of `scaled_dot_product_attention`'s math kernel): the policy is about the ops
autocast dispatches, and a plain run computes those nested ops the same way.
"""

from __future__ import annotations

import functools
import json
import os

_DATA = os.path.join(os.path.dirname(__file__), "data", "autocast_ops.json")

# aten name (after decomposition) -> the name in the docs' lists
_ALIASES = {
    "convolution": "conv2d",
    "_convolution": "conv2d",
    "mkldnn_convolution": "conv2d",
    "convolution_overrideable": "conv2d",
    "_softmax": "softmax",
    "_log_softmax": "log_softmax",
    "native_layer_norm": "layer_norm",
    "native_group_norm": "group_norm",
    "nll_loss_forward": "nll_loss",
    "nll_loss2d_forward": "nll_loss2d",
    "cross_entropy_loss": "cross_entropy",
    "_addmm_activation": "addmm",
}
_CATEGORIES = ("lower_precision", "float32", "promote")
# Float32-list ops that take a `dtype=` argument: autocast widens them only when the call passes
# none, and honours an explicit one (F.cross_entropy calls log_softmax with the input's own dtype,
# so on CUDA it runs in float16). After decomposition the argument is gone, so a result in the
# input's dtype is the explicit-dtype case, not a departure.
_EXPLICIT_DTYPE_HONOURED = {"softmax", "log_softmax", "sum", "prod", "cumsum", "cumprod",
                            "linalg_vector_norm", "linalg_matrix_norm"}
_FLOATS = {"float16", "bfloat16", "float32"}


@functools.lru_cache(maxsize=1)
def _tables() -> dict[str, dict[str, str]]:
    with open(_DATA, encoding="utf-8") as handle:
        data = json.load(handle)
    tables: dict[str, dict[str, str]] = {}
    for device in ("cuda", "cpu", "xpu"):
        table: dict[str, str] = {}
        section = data.get(device, {})
        for category in _CATEGORIES:
            for name in section.get(category, []):
                table.setdefault(name, category)
        extras = section.get("runtime_extras_torch_2_13", {})
        for key, names in extras.items():
            category = next((c for c in _CATEGORIES if key.startswith(c)), None)
            if category and isinstance(names, list):
                for name in names:
                    table.setdefault(name.split(".")[0], category)
        if device == "cpu":  # cross_entropy_loss is the CPU doc spelling
            table.setdefault("cross_entropy", table.get("cross_entropy_loss", "float32"))
        tables[device] = table
    return tables


def doc_name(op: str) -> str:
    """`aten::addmm.default` -> `addmm`, `aten::_softmax` -> `softmax`."""
    base = op.split("::")[-1].split(".")[0]
    return _ALIASES.get(base, base)


def category(op: str, device: str) -> str | None:
    return _tables().get(device, {}).get(doc_name(op))


def expected_dtype(op: str, device: str, autocast_dtype: str, input_dtypes: list[str]) -> tuple[str | None, str | None]:
    """(category, expected floating output dtype) or (None, None) when the docs say nothing."""
    cat = category(op, device)
    eligible = [d for d in input_dtypes if d in _FLOATS]
    if cat is None or not eligible:
        return cat, None
    if cat == "lower_precision":
        return cat, autocast_dtype
    if cat == "float32":
        return cat, "float32"
    widest = "float32" if "float32" in eligible else ("float16" if "float16" in eligible else eligible[0])
    return cat, widest


@functools.lru_cache(maxsize=None)
def _has_autocast_kernel(op: str, device: str) -> bool:
    import torch

    key = getattr(torch._C.DispatchKey, f"Autocast{device.upper()}", None)
    try:
        return key is not None and torch._C._dispatch_has_kernel_for_dispatch_key(op, key)
    except (RuntimeError, AttributeError):  # not a dispatcher operator, or a torch without the hook
        return False


def bypassed_autocast(op: str, device: str, expected: str, input_dtypes: list[str]) -> bool:
    """The op has an autocast kernel on this device, which casts every eligible input to the
    expected dtype, yet an input arrived in another: autocast never saw this call, it ran nested
    inside another op (autocast is off in there). An op called with an explicit `dtype=` keeps
    its inputs through its kernel, so its inputs tell nothing."""
    return (
        doc_name(op) not in _EXPLICIT_DTYPE_HONOURED
        and any(d != expected for d in input_dtypes if d in _FLOATS)
        and _has_autocast_kernel(op, device)
    )


def check(op: str, autocast: dict | None, input_dtypes: list[str], output_dtypes: list[str]) -> dict | None:
    """The policy verdict for one op record, or None when it is not comparable."""
    if not autocast or "float64" in input_dtypes:
        return None
    cat, expected = expected_dtype(op, autocast["device"], autocast["dtype"], input_dtypes)
    floating_out = [d for d in output_dtypes if d in _FLOATS]
    if cat is None or expected is None or not floating_out or bypassed_autocast(op, autocast["device"], expected, input_dtypes):
        return None
    verdict = {
        "device": autocast["device"],
        "category": cat,
        "expected": expected,
        "matches": floating_out[0] == expected,
    }
    if not verdict["matches"] and doc_name(op) in _EXPLICIT_DTYPE_HONOURED and floating_out[0] in input_dtypes:
        verdict.update(matches=True, note="called with an explicit dtype, which autocast honours")
    return verdict


def cuda_category(op: str) -> str | None:
    return category(op, "cuda")
