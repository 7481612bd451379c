"""AMP009 fp16-autocast-without-scaler: training under float16 autocast with no GradScaler."""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from amplint.static.checks import Hit
from amplint.static.checks import _regions as rg
from amplint.static.checks import _training_step as ts
from amplint.static import names
from amplint.static.semantics import AmpFacts, CallSite, Scope, argument, built_disabled, constructor_of, dotted_name

CODE = "AMP009"


def check(facts: AmpFacts) -> Iterator[Hit]:
    if not facts.has_autocast or not rg.has_backward(facts):
        return
    if ts.framework_owned(facts):
        return
    disabled = _every_scaler_disabled(facts)
    if (ts.mentions_a_scaler(facts) and not disabled) or _scales_a_loss_by_hand(facts):
        return
    for call, region in rg.autocasts(facts):
        if not rg.enabled(region) or rg.inference_only(facts, call) or facts.returned_to_another_module(call):
            continue
        dtype = rg.literal_dtype(facts, region, call)
        if dtype in rg.FLOAT16:
            why = "float16"
        elif dtype is None and not rg.has_dtype_argument(region, call) and region.device == "cuda":
            why = "float16 (the CUDA default)"
        elif dtype is None and not rg.has_dtype_argument(region, call) and "cuda" in rg.possible_devices(facts, region, call):
            why = "float16 on CUDA (the CUDA default, where the device expression chooses it)"
        elif _falls_back_to_float16(facts, call):
            why = "float16 on GPUs without bfloat16 support (T4, V100)"
        else:
            continue
        yield Hit(
            call.node,
            f"this autocast region computes in {why} and the module trains (calls backward) without "
            f"{'an enabled GradScaler (every one it builds passes `enabled=False`)' if disabled else 'a GradScaler'}: "
            f"small float16 gradients underflow to zero; scale the loss with "
            f"`torch.amp.GradScaler(\"{_scaler_device(region.device)}\")` or use `dtype=torch.bfloat16` where supported",
            call.where.statement,
        )


# A constant a loss is multiplied by before backward that scales it (static loss scales run from 8
# to 2^16; a loss weight of 2 or 5 lifts no gradient out of float16's underflow), as the tracer reads it.
_SMALLEST_LOSS_SCALE = 8
_LOSS_SCALE_NAME = re.compile(r"loss_?scal", re.IGNORECASE)


def _scales_a_loss_by_hand(facts: AmpFacts) -> bool:
    """A backward takes a loss scaled by hand, without a GradScaler: multiplied by a constant loss
    scale (`(loss * 1024).backward()`, `scaled = loss * self.loss_scale` then `scaled.backward()`,
    improved-diffusion's `2 ** self.lg_loss_scale`) or seeded with one (`loss.backward(scale)`)."""
    return any(_scaled_by_hand(facts, call) for call in rg.backwards(facts))


def _scaled_by_hand(facts: AmpFacts, call: CallSite) -> bool:
    if call.method == "backward":
        loss, seed = call.receiver, call.arg(0, "gradient")
    else:
        loss, seed = call.arg(0, "tensors"), call.arg(1, "grad_tensors")
    if seed is not None and _is_a_loss_scale(facts, seed, call.scope):
        return True
    key = dotted_name(loss)
    values = [loss] if key is None else [a.value for a in _bound_nearby(facts, key, call.scope)]
    return any(_times_a_loss_scale(facts, value, call.scope) for value in values)


def _bound_nearby(facts: AmpFacts, key: str, scope: Scope) -> list:
    """The assignments to `key` in the function `scope` is in, at module level, or to a `self`
    attribute anywhere in the file: what the facts can read of a loss or a scale there."""
    function = scope.function_scope
    return [
        a for a in facts.assignments
        if a.key == key and (key.startswith("self.") or a.where.scope.function_scope in (function, facts.module_scope))
    ]


def _times_a_loss_scale(facts: AmpFacts, value: cst.BaseExpression, scope: Scope) -> bool:
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Multiply):
        return _is_a_loss_scale(facts, value.left, scope) or _is_a_loss_scale(facts, value.right, scope)
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in ("mul", "mul_"):
        return _is_a_loss_scale(facts, argument(value, 0, "other"), scope)
    return False


def _is_a_loss_scale(facts: AmpFacts, expr: cst.BaseExpression | None, scope: Scope, depth: int = 0) -> bool:
    """A constant of at least 8, a power of two (`2 ** k`), or a name so bound or, bound nowhere in
    reach (a parameter, `args.loss_scale`), named for a loss scale."""
    if expr is None or depth > 3:
        return False
    if isinstance(expr, (cst.Integer, cst.Float)):
        return expr.evaluated_value >= _SMALLEST_LOSS_SCALE
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Power):
        return isinstance(expr.left, (cst.Integer, cst.Float)) and expr.left.evaluated_value == 2
    if isinstance(expr, cst.Call) and (dotted_name(expr.func) in ("float", "int") or facts.qualname(expr.func, scope) == "torch.tensor"):
        return _is_a_loss_scale(facts, argument(expr, 0, None), scope, depth + 1)
    key = dotted_name(expr)
    if key is None:
        return False
    bound = _bound_nearby(facts, key, scope)
    if bound:
        return all(_is_a_loss_scale(facts, a.value, a.where.scope, depth + 1) for a in bound)
    return bool(_LOSS_SCALE_NAME.search(key.rsplit(".", 1)[-1]))


def _every_scaler_disabled(facts: AmpFacts) -> bool:
    """Every GradScaler the module builds passes a literal `enabled=False`, none comes in as a
    parameter, and every scaled backward goes through one of them: no loss is ever scaled."""
    built = facts.scalers_in()
    if not built or not all(built_disabled(c.node) for c in built):
        return False
    if any(names.SCALER_WORD.search(param) for function in facts.functions for param in function.params):
        return False
    scaled = [c for c in facts.calls if c.method == "scale" and id(c.node) in facts.backward_of_scale]
    return all(_bound_only_to_disabled_scalers(facts, c) for c in scaled)


def _bound_only_to_disabled_scalers(facts: AmpFacts, call: CallSite) -> bool:
    """Every binding of the receiver is a GradScaler built with `enabled=False`: not one handed
    in, returned by a factory of another module, or rebound to something else."""
    bound = facts.bindings(call.receiver_key, call.scope)
    built = [constructor_of(value) for value, _scope in bound]
    return bool(built) and all(
        c is not None and facts.qualname(c.func, call.scope) in names.GRAD_SCALER and built_disabled(c)
        for c in built
    )


def _falls_back_to_float16(facts: AmpFacts, call: CallSite) -> bool:
    """`dtype=torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16`, written there
    or bound to a name or attribute, also by an `if` on that check (a float16 default replaced
    when bfloat16 is supported, or one dtype in each branch): the code itself picks float16 on
    older GPUs (nanoVLM). A dtype picked by a setting (`if args.precision == "bf16"`) is the
    user's choice, and not reported."""
    expr = argument(call.node, None, "dtype")
    key = dotted_name(expr)
    if key is None:
        return _chooses_by_support(facts, expr, call.scope)
    bound = [value for value, _ in facts.bindings(key, call.scope)]
    chosen = [a for a in facts.assignments if a.key == key and any(a.value is value for value in bound)]
    if len(chosen) == 1:
        return _chooses_by_support(facts, chosen[0].value, chosen[0].where.scope)
    if len(chosen) != 2:
        return False
    dtypes = [facts.qualname(a.value, a.where.scope) for a in chosen]
    if not (set(dtypes) & rg.FLOAT16 and set(dtypes) & rg.BFLOAT16):
        return False
    bfloat16, float16 = chosen if dtypes[0] in rg.BFLOAT16 else reversed(chosen)
    if not bfloat16.where.branches or bfloat16.where.branches[-1][1] != "body":
        return False
    support_check = bfloat16.where.branches[-1][0]
    test = facts.if_tests.get(support_check)
    if test is None or not rg.BF16_SUPPORT_CALL.search(facts.module.code_for_node(test)):
        return False
    # float16 where that check fails: its `else`, or a default set before the `if`.
    return (support_check, "else") in float16.where.branches or (
        all(branch[0] != support_check for branch in float16.where.branches)
        and float16.where.scope.function_scope is bfloat16.where.scope.function_scope
        and float16.where.order < bfloat16.where.order
    )


def _chooses_by_support(facts: AmpFacts, choice: cst.BaseExpression | None, scope) -> bool:
    """`torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16`, or the same choice
    of a string looked up in a table (nanoGPT: `dtype = "bfloat16" if ... else "float16"`, then
    `{"bfloat16": torch.bfloat16, "float16": torch.float16, ...}[dtype]`)."""
    table: dict[str, str | None] | None = None
    if isinstance(choice, cst.Subscript) and isinstance(choice.value, cst.Dict) and len(choice.slice) == 1:
        table = {
            element.key.evaluated_value: facts.qualname(element.value, scope)
            for element in choice.value.elements
            if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString)
        }
        index = choice.slice[0].slice
        bound = facts.bindings(dotted_name(index.value), scope) if isinstance(index, cst.Index) else []
        if len(bound) != 1:
            return False
        choice, scope = bound[0]
    if not isinstance(choice, cst.IfExp):
        return False
    arms = (choice.body, choice.orelse)
    if table is None:
        branches = {facts.qualname(arm, scope) for arm in arms}
    else:
        branches = {table.get(arm.evaluated_value) if isinstance(arm, cst.SimpleString) else None for arm in arms}
    return bool(branches & rg.FLOAT16 and branches & rg.BFLOAT16) and bool(
        rg.BF16_SUPPORT_CALL.search(facts.module.code_for_node(choice.test))
    )


def _scaler_device(device: str | None) -> str:
    """The scaler for the region's device (a CPU float16 region needs `GradScaler("cpu")`)."""
    return device if device in ("cpu", "xpu", "mps", "hpu") else "cuda"
