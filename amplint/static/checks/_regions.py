"""Shared queries about autocast constructions and casts for AMP002, AMP009, AMP010, AMP014-AMP017."""

from __future__ import annotations

import re

import libcst as cst

from amplint.static import names
from amplint.static.checks import _training_step as ts
from amplint.static.semantics import AmpFacts, Autocast, CallSite, Context, Scope, argument, arms_of, dotted_name, string_literal

FLOAT16 = {"torch.float16", "torch.half"}
BFLOAT16 = {"torch.bfloat16"}
LOW = FLOAT16 | BFLOAT16
# A call that asks for the GPU's bfloat16 support (AMP009: a float16 fallback chosen by one), and
# anything in a file that reads like such a check (AMP016).
# `get_device_properties(0).major >= 8` is `get_device_capability()[0] >= 8` (sam2 spells it so).
BF16_SUPPORT_CALL = re.compile(
    r"is_bf16_supported|bf16_supported|get_device_capability|compute_capability|get_device_properties\([^()]*\)\s*\.\s*major"
)
BF16_SUPPORT_CHECK = re.compile(BF16_SUPPORT_CALL.pattern + r"|is_ampere|sm_?8\d|\bcapability\b")
_EVAL_FUNCTION = re.compile(r"eval|valid|test|infer|predict(?!or)|generat|sampl|inference|benchmark|export|trace|profil|serve|serving")
_NO_GRAD = {"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad", "torch.autograd.grad_mode.no_grad"}


# Methods that return the module or tensor they are called on, moved, cast or switched.
SAME_OBJECT = frozenset({"to", "cuda", "cpu", "half", "float", "bfloat16", "eval", "train", "requires_grad_", "type"})


def chain_below(call: CallSite) -> tuple[list[cst.Call], cst.BaseExpression | None]:
    """The same-object calls a cast is made on, innermost first, and what they start from:
    `model.cuda()` and `model` for `model.cuda().bfloat16()`, `Net()` for `Net().cuda().half()`."""
    calls: list[cst.Call] = []
    node = call.receiver
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in SAME_OBJECT:
        calls.insert(0, node)
        node = node.func.value
    return calls, node


def autocasts(facts: AmpFacts) -> list[tuple[CallSite, Autocast]]:
    """Every autocast construction in the file with what it says (device, dtype, enabled)."""

    def build():
        found = []
        for call in facts.calls:
            if call.qualname in names.AUTOCAST:
                region = facts.autocast_of(call.node, call.scope)
                if region is not None:
                    found.append((call, region))
        return found

    return ts.cached(facts, "autocasts", build)


def literal_dtype(facts: AmpFacts, region: Autocast, call: CallSite) -> str | None:
    """The qualified dtype of an autocast region, following a name bound once to a literal."""
    if region.dtype is not None:
        return _canonical(region.dtype)
    key = dotted_name(_dtype_argument(region, call))
    if key is None:
        return None
    values = {facts.qualname(v, s) for v, s in facts.bindings(key, call.scope)}
    if len(values) == 1:
        (value,) = values
        if value is not None and value.startswith("torch."):
            return _canonical(value)
    return None


def dtype_is_a_parameter_default(facts: AmpFacts, region: Autocast, call: CallSite) -> bool:
    """The region's dtype is bound from a parameter that no call in this file passes
    (`def __init__(self, amp_dtype=torch.bfloat16)`, later `autocast(dtype=self.amp_dtype)`): its
    default is only what callers elsewhere get when they choose nothing."""
    if region.dtype is not None:
        return False
    key = dotted_name(_dtype_argument(region, call))
    for value, scope in facts.bindings(key, call.scope):
        function = scope.function_scope
        name = value.value if isinstance(value, cst.Name) else None
        if name in function.params and not facts.bindings(name, scope):
            return all(passed is None for _, passed in facts.passed_for(function, name))
    return False


def possible_dtypes(facts: AmpFacts, region: Autocast, call: CallSite) -> set[str] | None:
    """The dtypes a region may compute in: its literal one, or each arm of a conditional it is
    given, written there or bound once to a name (`torch.bfloat16 if args.bf16 else torch.float32`);
    None when they are not known."""
    literal = literal_dtype(facts, region, call)
    if literal is not None:
        return {literal}
    choice = conditional_choice(facts, _dtype_argument(region, call), call.scope)
    if choice is None:
        return None
    arms, scope = choice
    qualified = {facts.qualname(arm, scope) for arm in arms}
    if not all(arm and arm.startswith("torch.") for arm in qualified):
        return None
    return {_canonical(arm) for arm in qualified}


def possible_devices(facts: AmpFacts, region: Autocast, call: CallSite) -> set[str]:
    """The devices a region may run on, when they are written as literals: its one device, or
    every arm of a conditional expression that picks it (`"mps" if mps else "cuda" if cuda else
    "cpu"`), written in the construction or bound once to a name; empty when any is unknown."""
    if region.device is not None:
        return {region.device}
    if region.deprecated or region.node is not call.node:  # a factory's construction answers for its own
        return set()
    choice = conditional_choice(facts, argument(call.node, 0, "device_type"), call.scope)
    if choice is None:
        return set()
    devices = {string_literal(arm) for arm in choice[0]}
    return set() if None in devices else devices


def conditional_choice(
    facts: AmpFacts, expr: cst.BaseExpression | None, scope: Scope
) -> tuple[list[cst.BaseExpression], Scope] | None:
    """The arms of the conditional expression an argument is, written in place or bound once to a
    name (`dtype = torch.bfloat16 if args.bf16 else torch.float16`), through nested conditionals,
    with the scope they are read in; None when the argument is not one."""
    if isinstance(expr, (cst.Name, cst.Attribute)):
        bound = facts.bindings(dotted_name(expr), scope)
        if len(bound) != 1:
            return None
        expr, scope = bound[0]
    if not isinstance(expr, cst.IfExp):
        return None
    return list(arms_of(expr)), scope


def has_dtype_argument(region: Autocast, call: CallSite) -> bool:
    return _dtype_argument(region, call) is not None


def dtype_setting(facts: AmpFacts) -> str | None:
    """The name every enabled region of the file takes its dtype from (`dtype=amp_dtype`,
    `dtype=self.cfg.dtype`), when they all name the same one; None for literals or several."""
    arguments = [_dtype_argument(region, call) for call, region in autocasts(facts) if enabled(region)]
    written = {dotted_name(arg) if isinstance(arg, (cst.Name, cst.Attribute)) else None for arg in arguments}
    if len(written) != 1:
        return None
    (name,) = written
    return None if name is None or name.startswith("torch.") else name


def _dtype_argument(region: Autocast, call: CallSite) -> cst.BaseExpression | None:
    positions = names.AUTOCAST_POSITIONAL["deprecated" if region.deprecated else "new"]
    return argument(call.node, positions.index("dtype"), "dtype")


def _canonical(dtype: str) -> str:
    return "torch.float16" if dtype == "torch.half" else dtype


def in_no_grad(facts: AmpFacts, call: CallSite) -> bool:
    return in_no_grad_at(facts, call.node, call.where)


def in_no_grad_at(facts: AmpFacts, node: cst.CSTNode, where: Context) -> bool:
    """Whether `node` runs under no_grad or inference_mode: a `with` around it (or beside its
    autocast in the same `with`), or a decorator of its function."""
    items = list(where.withs)
    parent = ts.parents(facts).get(id(node))
    if isinstance(parent, cst.WithItem):  # `with torch.no_grad(), torch.autocast(...):`
        statement = ts.parents(facts).get(id(parent))
        if isinstance(statement, cst.With):
            items.extend(statement.items)
    for item in items:
        if isinstance(item.item, cst.Call) and facts.qualname(item.item.func, where.scope) in _NO_GRAD:
            return True
    function = where.scope.function_scope
    if function.kind == "function":
        for decorator in function.decorators:
            expr = decorator.decorator.func if isinstance(decorator.decorator, cst.Call) else decorator.decorator
            if facts.qualname(expr, function.parent or function) in _NO_GRAD:
                return True
    return False


def in_eval_function(call: CallSite, facts: AmpFacts) -> bool:
    """Code in a function named for evaluation, unless that function steps an optimizer itself
    (CLIP_benchmark's linear-probe `evaluate` trains a classifier before it scores it) and is
    not a test, which checks a behaviour rather than trains a model."""
    scope: Scope | None = call.scope
    while scope is not None:
        if scope.kind == "function" and _EVAL_FUNCTION.search(scope.name.lower()):
            steps = any(e.kind in ("opt_step", "step") for e in ts.own_events(facts).get(id(scope), ()))
            return not steps or names.names_a_test(scope.name)
        scope = scope.parent
    return False


def has_backward(facts: AmpFacts) -> bool:
    """The module back-propagates as a training step does: not only inside a method named
    `backward` (an autograd.Function recomputing a checkpointed forward calls backward there),
    nor only to time it (see `times_a_backward`)."""

    def build() -> bool:
        found = any(
            e.kind in ("backward", "scale_backward") and not _in_a_backward_method(e.call)
            for events in ts.own_events(facts).values()
            for e in events
        ) or any(c.method == "backward" and not _in_a_backward_method(c) for c in facts.calls)
        return found and not times_a_backward(facts)

    return ts.cached(facts, "has_backward", build)



def times_a_backward(facts: AmpFacts) -> bool:
    """A module that reads a clock, or calls a timer or a profiler, and has no optimizer and no
    scaler anywhere (torch-ngp's `test_ffmlp.py` times a fused MLP's backward with CUDA events;
    torchsparse's kernel tuner with `time.time()`; vissl's FSDP benchmark with its own
    `with_timing(...)`): its gradients are measured, never applied, so nothing trains."""
    if facts.has_scaler or not any(_measures(c) for c in facts.calls):
        return False
    # Any `.step()` (an optimizer's or a scaler's), `zero_grad()` or optimizer built trains.
    return not any(c.method in ("zero_grad", "step") or facts.value_kind(c.node, c.scope) == "optimizer" for c in facts.calls)


def _measures(call: CallSite) -> bool:
    if call.qualname in names.CLOCKS or call.method == "elapsed_time":
        return True
    name = call.method or (call.callee or "").rsplit(".", 1)[-1]
    return bool(names.TIMING_NAME.search(name))


def _in_a_backward_method(call: CallSite) -> bool:
    function = call.scope.function_scope
    return function.name == "backward" and function.class_name is not None


def trains(facts: AmpFacts) -> bool:
    """Whether the module trains: a GradScaler, a backward, a Lightning `training_step`. An
    inference module keeps float16 weights by design (diffusers' pipelines upcast the VAE for
    decoding and cast it back), and has no use for a GradScaler."""
    return facts.has_scaler or has_backward(facts) or any(f.name == "training_step" for f in facts.functions)


def backwards(facts: AmpFacts) -> list[CallSite]:
    return [
        c for c in facts.calls
        if (c.method == "backward" and c.receiver is not None) or c.qualname in names.AUTOGRAD_BACKWARD
    ]


def enabled(region: Autocast) -> bool:
    return region.enabled != "no"


def low_precision_words(facts: AmpFacts) -> str:
    """The low precision the file's enabled autocast regions compute in, as a message says it:
    "float16", "bfloat16", or "float16/bfloat16" when they differ or are not known."""
    found: set[str | None] = set()
    for call, region in autocasts(facts):
        if not enabled(region):
            continue
        if not has_dtype_argument(region, call) and region.device in ("cuda", "cpu"):
            found.add("torch.float16" if region.device == "cuda" else "torch.bfloat16")  # the device's default
            continue
        dtypes = possible_dtypes(facts, region, call)
        found |= {None} if dtypes is None else dtypes & LOW
    if len(found) == 1 and None not in found:
        return next(iter(found)).removeprefix("torch.")
    return "float16/bfloat16"


def inference_only(facts: AmpFacts, call: CallSite) -> bool:
    """Code under no_grad/inference_mode or in an evaluation function never back-propagates."""
    return in_no_grad(facts, call) or in_eval_function(call, facts)
