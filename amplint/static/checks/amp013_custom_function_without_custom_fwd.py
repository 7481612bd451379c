"""AMP013 custom-function-without-custom_fwd: a custom autograd.Function that autocast does not handle."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import libcst as cst

from amplint.model import Applicability
from amplint.static import names
from amplint.static.autofix import replacement_available
from amplint.static.checks import FixPlan, Hit, Replacement
from amplint.static.checks import _regions as rg
from amplint.static.checks import _training_step as ts
from amplint.static.semantics import (
    AmpFacts,
    CallSite,
    Scope,
    argument,
    children,
    descendants,
    dotted_name,
    identifiers,
    is_none,
    mutually_exclusive,
)
from amplint.static.source import code_only

CODE = "AMP013"

_CUSTOM_FWD = re.compile(r"(^|\.)custom_fwd$")
_CUSTOM_BWD = re.compile(r"(^|\.)custom_bwd$")
# As decorators, also a project's alias imported from a utils module (flash-linear-attention, copied
# into LLaMA-Factory: `autocast_custom_fwd = functools.partial(torch.amp.custom_fwd, device_type=device)`).
# Importing one does not by itself say that this module runs under autocast.
_FWD_DECORATOR = re.compile(r"(^|[._])custom_fwd$")
_BWD_DECORATOR = re.compile(r"(^|[._])custom_bwd$")
# Ops autocast would cast (matmuls, convolutions) and calls into compiled extensions.
_AUTOCAST_OPS = re.compile(
    r"\b(matmul|mm|bmm|addmm|baddbmm|addbmm|einsum|linear|conv\w*|F\.linear|F\.conv\w*|_C\.\w+|cuda_\w+|\w+_cuda(\.\w+)?|\w+_ext\.\w+|ext\.\w+|kernel\w*|triton)\s*\(|@"
)
# Arguments whose names say they are not tensors: dimensions and sizes, distributed settings,
# numeric constants, dtypes and devices, flags, callables, and objects that describe the call.
_SETTING_NAME = re.compile(
    r"(^|_)(dims?|keepdims?|axis|axes|sizes?|shapes?|lens?|lengths?|strides?|padding|dilation|ranks?|groups?|pg|modes?|"
    r"eps|epsilon|momentum|dtype|device|training|inplace|fn|func|function|config|spec|name|handle|stream)$"
    r"|^(num|n|is|use|enable)_|^[mn]$"  # `forward(ctx, rays, M)`: a count
)
# Arguments whose names say they hold integers: class labels, indices, ids (not masks, which are
# often additive float biases).
_INTEGER_DATA = re.compile(r"(^|_)(labels?|index|indices|idx|idxs|ids?)$")
# What ctx offers itself; any other `ctx.f(...)` in backward calls a function forward kept.
_CTX_METHODS = {
    "save_for_backward", "save_for_forward", "mark_dirty", "mark_non_differentiable", "set_materialize_grads",
}
# Reading the autocast state: torch's getters and helpers named like them (`_get_autocast_kwargs`).
_AUTOCAST_STATE = re.compile(r"^_?(is|get)_autocast\w*$")
_AUTOCAST_NAME = re.compile(r"(^|_)autocast$")
_CAST_METHODS = {"float", "half", "bfloat16", "double", "to", "type"}
_DTYPE_NAMES = {"float16", "half", "bfloat16", "float32", "float", "float64", "double"}
# An argument named for where a tensor goes: `x.to(device)` moves, it does not cast.
_DEVICE = re.compile(r"device|(^|_)(dev|gpu|cuda|cpu|rank)($|_)")
# `_cast_if_autocast_enabled`, `torch.amp.autocast_mode._cast`, `cast_inputs`; not `autocast`, `broadcast`.
_CAST_HELPER = re.compile(r"(^|_)cast")


def _decorator_name(facts: AmpFacts, decorator: cst.Decorator, scope: Scope) -> str:
    expr = decorator.decorator.func if isinstance(decorator.decorator, cst.Call) else decorator.decorator
    return _partial_target(facts, expr, scope) or facts.qualname(expr, scope) or dotted_name(expr) or ""


def _partial_target(facts: AmpFacts, expr: cst.BaseExpression, scope: Scope) -> str | None:
    """The function a `functools.partial` alias fixes arguments of (`amp_fwd =
    functools.partial(torch.amp.custom_fwd, device_type="cuda")`, then `@amp_fwd`)."""
    for value, value_scope in facts.bindings(dotted_name(expr), scope):
        if isinstance(value, cst.Call) and facts.qualname(value.func, value_scope) in names.FUNCTOOLS_PARTIAL and value.args:
            return facts.qualname(value.args[0].value, value_scope) or dotted_name(value.args[0].value)
    return None


def _method(class_scope: Scope, name: str) -> cst.FunctionDef | None:
    body = class_scope.node.body.body if isinstance(class_scope.node, cst.ClassDef) else ()
    for statement in body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
            return statement
    return None


def _find(facts: AmpFacts, function: cst.FunctionDef | None, pattern: re.Pattern, scope: Scope) -> cst.Decorator | None:
    if function is None:
        return None
    for decorator in function.decorators:
        if pattern.search(_decorator_name(facts, decorator, scope)) and not _defined_here(facts, decorator):
            return decorator
    return None


def _defined_here(facts: AmpFacts, decorator: cst.Decorator) -> bool:
    """A decorator that is a function of this file: a stand-in for old torch (`def
    compat_custom_fwd(fn): return fn`) casts nothing, whatever its name says."""
    expr = decorator.decorator.func if isinstance(decorator.decorator, cst.Call) else decorator.decorator
    return isinstance(expr, cst.Name) and any(f.name == expr.value for f in facts.functions)


def _amp_aware(facts: AmpFacts) -> bool:
    """The module opens autocast, builds a GradScaler, reads the autocast state (a kernel choosing
    its dtype by `torch.is_autocast_enabled()`) or names custom_fwd/custom_bwd: its Functions are
    meant to run under autocast. Not one that reads the state to cast for autocast itself, with
    autocast's own `_cast` (torch's higher-order ops register such a shim in front of their
    Function): their inputs arrive cast."""
    if facts.has_autocast or facts.has_scaler:
        return True
    qualnames = {call.qualname for call in facts.calls}
    if not qualnames.isdisjoint(names.AUTOCAST_STATE_GETTERS) and names.AUTOCAST_CAST not in qualnames:
        return True
    named = [r.qualname for r in facts.imports] + [c.qualname for c in facts.calls if c.qualname]
    named += [r.dotted for r in facts.references]  # `functools.partial(torch.amp.custom_fwd, ...)`
    return any(_CUSTOM_FWD.search(name) or _CUSTOM_BWD.search(name) for name in named) or _decorates_with_an_alias(facts)


def _decorates_with_an_alias(facts: AmpFacts) -> bool:
    """A function of the file decorated with a project's alias (`@autocast_custom_fwd` from
    `fla.utils`): the Functions beside it are written to run under autocast too."""
    return any(
        (_FWD_DECORATOR.search(name) or _BWD_DECORATOR.search(name)) and not _defined_here(facts, decorator)
        for function in facts.functions
        for decorator in function.decorators
        for name in [_decorator_name(facts, decorator, function.parent or function)]
    )


def check(facts: AmpFacts) -> Iterator[Hit]:
    if not facts.classes or not _amp_aware(facts):
        return
    for scope, bases in facts.classes:
        if not facts.is_autograd_function(scope, bases):
            continue
        forward = _method(scope, "forward")
        backward = _method(scope, "backward")
        if forward is None:
            continue
        fwd = _find(facts, forward, _FWD_DECORATOR, scope)
        bwd = _find(facts, backward, _BWD_DECORATOR, scope)
        if fwd is None:
            if bwd is None:
                yield from _undecorated(facts, scope, forward, backward)
            continue
        if _method(scope, "setup_context") is not None:
            yield Hit(
                fwd,
                f"`custom_fwd` on `{scope.name}.forward` with a separate `setup_context` fails at "
                f"apply time (AttributeError `_fwd_used_autocast`, pytorch/pytorch#132388); use the "
                f"`forward(ctx, ...)` form with `custom_fwd`",
                fwd,
            )
            continue
        misplaced = _find(facts, backward, _FWD_DECORATOR, scope) if bwd is None else None
        if misplaced is not None:
            # No fix: custom_bwd does not cast the incoming gradients as `cast_inputs` did.
            yield Hit(
                misplaced,
                f"`{scope.name}.backward` is decorated with `custom_fwd`, forward's decorator: backward "
                f"then does not run with the autocast state forward ran with (`custom_bwd` restores it), "
                f"and as autocast is off while backward runs (after the autocast block), `cast_inputs` "
                f"casts none of the incoming gradients; replace it with `@{_advised_bwd(facts, fwd, scope)}` "
                f"and cast the gradients by hand where backward needs a dtype",
                misplaced,
            )
        elif backward is not None and bwd is None:
            yield Hit(
                backward.name,
                f"`{scope.name}.forward` has `custom_fwd` but `backward` has no `custom_bwd`, so backward "
                f"does not run with the autocast state forward ran with; add "
                f"`@{_bwd_spelling(facts, fwd, scope) or 'torch.amp.custom_bwd(device_type=...)'}`",
                backward,
                _fix(facts, fwd, backward, scope),
            )


def _undecorated(
    facts: AmpFacts, scope: Scope, forward: cst.FunctionDef, backward: cst.FunctionDef | None
) -> Iterator[Hit]:
    # `cast_inputs` casts every floating input: wrong for a kernel that keeps some in float32 (Mamba's A).
    decorate = (
        "decorate `forward` with `@torch.amp.custom_fwd(device_type=...)`, adding "
        "`cast_inputs=torch.float32` only if every floating input may take that dtype"
        + (", and `backward` with `@torch.amp.custom_bwd(device_type=...)`" if backward is not None else "")
    )
    mixes_inputs = (
        _takes_tensors(facts, forward) >= 2
        and not _casts_an_input(facts, forward)
        and not _passes_an_input_through(facts, forward)
        and not _launches_a_converting_kernel(facts, forward)
    )
    # Callers that cast every input to the autocast dtype leave forward no mix; its backward still
    # runs outside the autocast state forward ran with.
    callers_cast = mixes_inputs and _applied_only_on_autocast_dtype(facts, scope)
    low = rg.low_precision_words(facts)
    if mixes_inputs and not callers_cast:
        message = (
            f"`{scope.name}` is a custom autograd.Function without `@torch.amp.custom_fwd`: under "
            f"autocast its forward receives a mix of {low} and float32 tensors"
            + (" (and its backward runs with autocast in an unknown state)" if backward is not None else "")
            + f"; {decorate}"
        )
    elif backward is None:
        return  # forward-only: its ops are autocast's as anywhere else, and no backward to mismatch
    elif _AUTOCAST_OPS.search(code_only(facts.module.code_for_node(forward.body))):
        message = (
            f"`{scope.name}` is a custom autograd.Function without `@torch.amp.custom_fwd`: under "
            f"autocast the matmuls, convolutions or extension calls in its forward run in {low} "
            f"while its backward runs with autocast in an unknown state, so the gradients mix "
            f"{low} and float32; {decorate}"
        )
    elif _recomputes_in_backward(facts, backward):
        message = (
            f"`{scope.name}` recomputes forward in `backward` without the autocast state forward ran "
            f"with: backward runs outside autocast, so the recomputed activations are float32 where "
            f"forward's were {low}; record `torch.is_autocast_enabled()` and "
            f"`torch.get_autocast_dtype(...)` on ctx in forward and re-enter `torch.autocast(...)` with "
            f"them around the recomputation, or decorate `forward` with "
            f"`@torch.amp.custom_fwd(device_type=...)` and `backward` with `@torch.amp.custom_bwd(device_type=...)`"
        )
    elif callers_cast:
        message = (
            f"`{scope.name}` is a custom autograd.Function without `@torch.amp.custom_fwd`: its callers "
            f"cast every input to the autocast dtype, so forward receives one dtype, but under autocast its "
            f"backward runs with autocast in an unknown state, not the one forward ran with; decorate "
            f"`forward` with `@torch.amp.custom_fwd(device_type=...)` and `backward` with "
            f"`@torch.amp.custom_bwd(device_type=...)`"
        )
    else:
        return
    if _handles_autocast_by_hand(facts, scope, forward, backward) or _applied_only_with_autocast_off(facts, scope):
        return
    yield Hit(scope.node.name, message, scope.node)


def _takes_tensors(facts: AmpFacts, forward: cst.FunctionDef) -> int:
    kept = _kept_on_ctx(facts, forward)
    return sum(1 for p in _arguments(forward) if p.name.value not in kept and _may_be_a_tensor(facts, p))


def _kept_on_ctx(facts: AmpFacts, forward: cst.FunctionDef) -> set[str]:
    """Arguments forward stores as attributes of ctx (`ctx.temperature = temperature`, or several
    in one: dgl's `ctx.backward_cache = gidxA, gidxB`) and never hands to `save_for_backward`:
    settings for backward, since tensors go through save_for_backward."""
    function = facts.scope_of_function(forward)
    if function is None:
        return set()
    ctx = _first_argument(forward)
    kept = {
        name.value for a in facts.assignments
        if a.where.scope is function and a.key.startswith(f"{ctx}.")
        for name in _kept_names(a.value)
    }
    saved = {
        name for c in function.calls if c.receiver_key == ctx and c.method == "save_for_backward"
        for arg in c.node.args for name in identifiers(arg.value).split()
    }
    return kept - saved - _operands(forward)


def _kept_names(value: cst.BaseExpression) -> list[cst.Name]:
    elements = [e.value for e in value.elements] if isinstance(value, (cst.Tuple, cst.List)) else [value]
    return [e for e in elements if isinstance(e, cst.Name)]


def _operands(function: cst.FunctionDef) -> set[str]:
    """Names used as operands of arithmetic (`x * weight`, `x += bias`): tensors, whatever ctx
    keeps of them."""
    found: set[str] = set()
    for node in descendants(function.body):
        if isinstance(node, cst.BinaryOperation):
            found |= {side.value for side in (node.left, node.right) if isinstance(side, cst.Name)}
        elif isinstance(node, cst.AugAssign):
            found |= {side.value for side in (node.target, node.value) if isinstance(side, cst.Name)}
    return found


def _passes_an_input_through(facts: AmpFacts, forward: cst.FunctionDef) -> bool:
    """Forward returns one of its arguments as it came and does no arithmetic on any (icefall's
    activation balancers and `WithLoss`, which only shape the gradient in backward): no op of
    forward combines the inputs, so their mix of dtypes meets no kernel."""
    function = facts.scope_of_function(forward)
    params = {p.name.value for p in _arguments(forward)}
    tensors = {p.name.value for p in _arguments(forward) if _may_be_a_tensor(facts, p)}
    if function is None or not function.returns or _operands(forward) & tensors or _combines(function, tensors, _first_argument(forward)):
        return False
    rebound = {a.key for a in facts.assignments if a.where.scope is function}
    # `x.add_(bias)` changes the argument in place: what forward returns is no longer what came in.
    rebound |= {c.receiver_key for c in function.calls if (c.method or "").endswith("_") and not c.method.startswith("_")}
    return all(isinstance(value, cst.Name) and value.value in params - rebound for value in function.returns)


def _combines(function: Scope, tensors: set[str], ctx: str) -> bool:
    """A call, other than on ctx, that takes two of the tensor arguments themselves (`x.mul(proj)`,
    `torch.mul(x, w, out=x)`): an op that meets their dtypes. Not their shapes or dtypes passed to a
    log or an assert (`x.shape[0] == penalty.shape[0]`)."""
    for call in function.calls:
        if call.receiver_key == ctx:
            continue
        used = {call.receiver_key} | {arg.value.value for arg in call.node.args if isinstance(arg.value, cst.Name)}
        if len(used & tensors) >= 2:
            return True
    return False


def _casts_an_input(facts: AmpFacts, forward: cst.FunctionDef) -> bool:
    """Forward rebinds an argument to a cast of it (Transformer Engine's fused RoPE: `if freqs.dtype
    != torch.float32: freqs = freqs.float()`, next to activations of any dtype): it chooses the
    dtypes of its inputs by hand, and a mix is what its kernel expects."""
    function = facts.scope_of_function(forward)
    if function is None:
        return False
    params = {p.name.value for p in _arguments(forward)}
    return any(
        a.where.scope is function
        and a.key in params
        and isinstance(a.value, cst.Call)
        and isinstance(a.value.func, cst.Attribute)
        and dotted_name(a.value.func.value) == a.key
        and _to_a_dtype(facts, a.value, function)
        and all(f"{a.key}.dtype" in facts.module.code_for_node(guard.test) for guard in a.where.ifs)
        for a in facts.assignments
    )


_CONVERTS_LOADS = re.compile(names.CONVERTING_KERNEL)


def _launches_a_converting_kernel(facts: AmpFacts, forward: cst.FunctionDef) -> bool:
    """Forward hands its tensors, itself or through helpers of the file (flash-attention's
    `_layer_norm_fwd`), to a Triton kernel of the file (`_ln_fwd_kernel[grid](x, weight, ...)`)
    that converts each load to float32 itself (flash-attention's `LayerNormFn`: float16
    activations beside float32 weights, by design): the kernel picks its dtypes, as a forward that
    casts its inputs does."""
    reached = {facts.scope_of_function(forward)}  # forward, and the helpers of the file it calls
    for _ in range(names.CALL_DEPTH):
        reached |= {facts.called_function(call) for call in facts.calls if call.scope.function_scope in reached} - {None}
    launched = {
        _kernel_launched(call.node.func.value)
        for call in facts.calls
        if call.scope.function_scope in reached and isinstance(call.node.func, cst.Subscript)
    }
    return any(
        kernel.name in launched
        and kernel.parent is facts.module_scope
        and any((dotted_name(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator) or "").endswith("jit") for d in kernel.decorators)
        and _CONVERTS_LOADS.search(facts.module.code_for_node(kernel.node.body)) is not None
        for kernel in facts.functions
    )


def _kernel_launched(launcher: cst.BaseExpression) -> str | None:
    """`kernel` of `kernel[grid](...)` or of `torch.library.wrap_triton(kernel)[grid](...)`."""
    if isinstance(launcher, cst.Call) and (dotted_name(launcher.func) or "").endswith("wrap_triton") and launcher.args:
        launcher = launcher.args[0].value
    return launcher.value if isinstance(launcher, cst.Name) else None


def _to_a_dtype(facts: AmpFacts, cast: cst.Call, scope: Scope) -> bool:
    """`.float()`, `.half()`, `.to(torch.float32)`, `.to(dtype=...)`, `.type(x.dtype)`: a change of
    dtype, not a move (`.to(weight.device)`)."""
    method = cast.func.attr.value
    if method not in ("to", "type"):
        return method in _CAST_METHODS
    if argument(cast, None, "dtype") is not None:
        return True
    params = {p for p in scope.params if not _DEVICE.search(p)}
    for arg in cast.args:
        target = facts.qualname(arg.value, scope) or dotted_name(arg.value) or ""
        # `.to(torch.float32)`, `.to(device, torch.float32)`, `.to(x.dtype)`, or `.to(other)`: another input's dtype.
        if target.startswith("torch.") and target.split(".")[-1] in _DTYPE_NAMES or target.endswith(".dtype") or target in params:
            return True
    return False


def _arguments(function: cst.FunctionDef) -> list[cst.Param]:
    return [p for p in function.params.params if p.name.value not in ("ctx", "self", "cls")]


def _may_be_a_tensor(facts: AmpFacts, param: cst.Param) -> bool:
    """A floating tensor, as far as the signature says: labels and indices are integer tensors,
    which autocast leaves alone (insightface's `DistCrossEntropyFunc(logits, label)`)."""
    if _INTEGER_DATA.search(param.name.value.lower()):
        return False
    if param.annotation is not None:
        return "Tensor" in facts.module.code_for_node(param.annotation.annotation)
    # `bias=None` is an optional tensor; any other default (`eps=1e-5`, `dim=-1`) is a setting.
    if param.default is not None and not (isinstance(param.default, cst.Name) and param.default.value == "None"):
        return False
    return not _SETTING_NAME.search(param.name.value.lower())


def _recomputes_in_backward(facts: AmpFacts, backward: cst.FunctionDef | None) -> bool:
    """Backward calls a function kept on ctx (`ctx.run_function(*inputs)`): activation checkpointing."""
    function = facts.scope_of_function(backward)
    if function is None:
        return False
    ctx = _first_argument(backward)
    return any(c.receiver_key == ctx and c.method not in _CTX_METHODS for c in function.calls)


def _handles_autocast_by_hand(
    facts: AmpFacts, scope: Scope, forward: cst.FunctionDef, backward: cst.FunctionDef | None
) -> bool:
    """Forward (or setup_context) reads the autocast state and backward gets it back from ctx:
    - backward re-enters autocast with it: custom_fwd/custom_bwd written out (the LDM/SGM
      CheckpointFunction);
    - or forward casts its inputs by it and backward casts or branches on it (a linear that casts
      x, weight and bias to the autocast dtype, keeps the dtype on ctx and casts its gradients to
      it): its inputs arrive in one dtype and backward's is known, which is all custom_fwd and
      custom_bwd would give it."""
    recorders = [
        function for function in (facts.scope_of_function(forward), facts.scope_of_function(_method(scope, "setup_context")))
        if function is not None
    ]
    readers = set().union(*(_state_readers(facts, function) for function in recorders))
    function = facts.scope_of_function(backward)
    if not readers or function is None:
        return False
    ctx = _first_argument(backward)
    if _reenters_autocast(function, ctx):
        return True
    forward_scope = facts.scope_of_function(forward)
    if forward_scope is None or not _casts_an_input_by(facts, forward, forward_scope, readers):
        return False
    kept = {
        f"{ctx}.{key.split('.', 1)[1]}"
        for recorder in recorders
        for key in _bound_to_state(facts, recorder, readers)
        if key.startswith(f"{_first_argument(recorder.node)}.")
    }
    return bool(kept) and _uses_state(backward.body, kept)


def _reenters_autocast(backward: Scope, ctx: str) -> bool:
    """`torch.autocast("cuda", **ctx.autocast_kwargs)`, or one opened under `if ctx.had_autocast_in_fwd:`."""
    for call in backward.calls:
        if not _AUTOCAST_NAME.search(call.name):
            continue
        read = [*(arg.value for arg in call.node.args), *(branch.test for branch in call.where.ifs)]
        if any(ctx in identifiers(node).split() for node in read):
            return True
    return False


def _bound_to_state(facts: AmpFacts, function: Scope, readers: set[int]) -> set[str]:
    """Names and ctx attributes the function binds to the autocast state: to a reading call
    (`enabled = torch.is_autocast_enabled()`, `dtype = torch.get_autocast_dtype("cuda") if enabled
    else None`) or to names so bound, without a call (`ctx.autocast_dtype = dtype`); not a tensor
    cast by it (`x = x.to(dtype)`)."""
    bound: set[str] = set()
    for assignment in sorted(
        (a for a in (*facts.assignments, *facts.unpackings) if a.where.scope is function), key=lambda a: a.where.order
    ):
        if _mentions(assignment.value, set(), readers) or (
            _mentions(assignment.value, bound, set()) and not _holds_a_call(assignment.value)
        ):
            bound.add(assignment.key)
    return bound


def _casts_an_input_by(facts: AmpFacts, forward: cst.FunctionDef, function: Scope, readers: set[int]) -> bool:
    """Forward casts one of its arguments to the dtype the state gives (`x.to(dtype)`), or casts it
    under a test of the state (`if enabled: x = x.half()`)."""
    state = _bound_to_state(facts, function, readers)
    params = {p.name.value for p in _arguments(forward)}
    return any(
        call.receiver_key in params
        and (
            _casts_by(call.node, state, readers)
            or (call.method in _CAST_METHODS and _to_a_dtype(facts, call.node, function)
                and any(_mentions(branch.test, state, readers) for branch in call.where.ifs))
        )
        for call in function.calls
    )


def _uses_state(body: cst.CSTNode, state: set[str]) -> bool:
    """A cast to a dtype taken from the state (`grad.to(ctx.autocast_dtype)`), or an `if` on it
    (`if ctx.autocast_enabled:`), anywhere in the code."""
    return any(
        (isinstance(node, (cst.If, cst.IfExp, cst.While)) and _mentions(node.test, state, set()))
        or (isinstance(node, cst.Call) and _casts_by(node, state, set()))
        for node in descendants(body)
    )


def _casts_by(call: cst.Call, state: set[str], readers: set[int]) -> bool:
    """`x.to(dtype)`, `x.type(ctx.autocast_dtype)`, `dense_weight(w, dtype=dtype)`: a cast to a dtype the state gives."""
    if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("to", "type"):
        targets = [arg.value for arg in call.args]
    else:
        targets = [arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == "dtype"]
    return any(_mentions(target, state, readers) for target in targets)


def _mentions(expr: cst.CSTNode, keys: set[str], calls: set[int]) -> bool:
    """The expression uses one of `keys` (a name, `ctx.autocast_dtype`) or holds one of `calls`."""
    stack: list[cst.CSTNode] = [expr]
    while stack:
        node = stack.pop()
        if id(node) in calls or dotted_name(node) in keys:
            return True
        # Not the `dtype` of `x.dtype` or of `dtype=...`: an attribute's or a keyword's name is no use of a local.
        stack.extend([node.value] if isinstance(node, (cst.Attribute, cst.Arg)) else children(node))
    return False


def _holds_a_call(expr: cst.CSTNode) -> bool:
    return any(isinstance(node, cst.Call) for node in descendants(expr))


def _reads_autocast_state(facts: AmpFacts, call: CallSite) -> bool:
    """`torch.is_autocast_enabled()`, `torch.get_autocast_dtype(...)`, or an in-file helper that calls them."""
    if _AUTOCAST_STATE.search(call.name):
        return True
    helper = facts.called_function(call)
    return helper is not None and any(_AUTOCAST_STATE.search(inner.name) for inner in helper.calls)


def _state_readers(facts: AmpFacts, function: Scope) -> set[int]:
    """The ids of the calls in `function` that read the autocast state."""
    return {id(call.node) for call in function.calls if _reads_autocast_state(facts, call)}


def _applied_only_with_autocast_off(facts: AmpFacts, scope: Scope) -> bool:
    """Every use of the Function in the file is `.apply` in an autocast-disabled region on inputs
    cast by hand (apex: `args = _cast_if_autocast_enabled(x, w)` then `with autocast(enabled=False):
    Fn.apply(*args)`), or in a module method decorated with `custom_fwd(cast_inputs=...)`, which
    does just that (GLIP's `deform_conv = DeformConvFunction.apply`, called from such a `forward`)."""
    applies = _only_applies(facts, scope)
    return bool(applies) and all(
        _under_custom_fwd_cast(facts, call) or (_autocast_off(facts, call) and _inputs_cast(facts, call)) for call in applies
    )


def _applied_only_on_autocast_dtype(facts: AmpFacts, scope: Scope) -> bool:
    """Every use of the Function in the file is `.apply` on inputs cast to the dtype the autocast
    state gives (`if torch.is_autocast_enabled(): args = tuple(x.to(torch.get_autocast_dtype("cuda"))
    for x in args)`): forward receives one dtype, not a mix."""
    applies = _only_applies(facts, scope)
    return bool(applies) and all(_inputs_cast_to_autocast_dtype(facts, call) for call in applies)


def _only_applies(facts: AmpFacts, scope: Scope) -> list[CallSite]:
    """The `.apply` calls of the Function (or of a subclass, or through a module-level alias of its
    `apply`) when they are its only uses in the file; none when it is handed on."""
    names = _with_subclasses(facts, scope.name)
    aliases = {
        a.key: a.value for a in facts.assignments
        if a.where.scope is facts.module_scope and dotted_name(a.value) in {f"{n}.apply" for n in names}
    }
    applies = [
        c for c in facts.calls
        if (c.method == "apply" and c.receiver_key in names) or (c.callee in aliases and not c.receiver_key)
    ]
    bases = {id(arg.value) for cls, _ in facts.classes for arg in cls.node.bases}
    bound = {id(value) for value in aliases.values()}
    # The class passed on, or its `.apply` kept somewhere other than a module-level alias: it may run anywhere.
    if any(
        r.dotted.split(".")[0] in names and id(r.node) not in bases and id(r.node) not in bound for r in facts.references
    ):
        return []
    if any(r.dotted in aliases for r in facts.references):
        return []  # the alias itself handed on
    return applies


def _casts(cast_inputs: cst.BaseExpression | None) -> bool:
    """A `cast_inputs=` that casts: not left out, not its default None."""
    return cast_inputs is not None and not is_none(cast_inputs)


def _under_custom_fwd_cast(facts: AmpFacts, call: CallSite) -> bool:
    """Called in a function decorated with `custom_fwd(cast_inputs=...)`: autocast is off there and
    every floating-point argument arrives in the one dtype."""
    function = call.scope.function_scope
    return function.kind == "function" and any(
        isinstance(d.decorator, cst.Call)
        and _FWD_DECORATOR.search(_decorator_name(facts, d, function.parent or function))
        and _casts(argument(d.decorator, None, "cast_inputs"))
        for d in function.decorators
    )


def _with_subclasses(facts: AmpFacts, name: str) -> set[str]:
    """The class and the classes in the file derived from it, whose `.apply` may run its methods."""
    names = {name}
    grown = True
    while grown:
        derived = {cls.name for cls, bases in facts.classes if names.intersection(filter(None, bases))}
        grown = not derived <= names
        names |= derived
    return names


def _autocast_off(facts: AmpFacts, call: CallSite) -> bool:
    region = facts.innermost_autocast(call.where)
    return region is not None and region.enabled == "no"


def _inputs_cast(facts: AmpFacts, call: CallSite) -> bool:
    """Each argument is a cast by hand or a setting, or a name bound to one or to a sequence of them."""
    return all(_each_is(value, lambda expr: _is_cast(expr) or _is_setting(expr)) for value in _argument_values(facts, call))


def _inputs_cast_to_autocast_dtype(facts: AmpFacts, call: CallSite) -> bool:
    """Each argument is cast to a dtype the autocast state gives (`x.to(dtype)` after `dtype =
    torch.get_autocast_dtype("cuda")`) or is a setting, or a name bound to one or to a sequence of
    them. A `**kwargs` handed on holds what the wrapper's caller passed by keyword, which the file
    does not show: it is no evidence of a mix."""
    function = call.scope.function_scope
    readers = _state_readers(facts, function)
    state = _bound_to_state(facts, function, readers)

    def cast_by_state(expr: cst.BaseExpression) -> bool:
        return (isinstance(expr, cst.Call) and _casts_by(expr, state, readers)) or _is_setting(expr)

    values = list(_argument_values(facts, call, keyword_spreads=False))
    if all(_each_is(value, cast_by_state) for value in values):
        return True
    # q, k and v from the linear layers of the caller's module (`self.to_q(x)`): autocast computes
    # each in one dtype, its own where a region is on, float32 where none is.
    return any(_module_output(facts, value, call.scope) for value in values) and all(
        _each_is(value, lambda expr: _module_output(facts, expr, call.scope) or _is_setting(expr)) for value in values
    )


# Layers whose output autocast computes in its own dtype (they run a matmul or a convolution).
_AUTOCAST_DTYPE_LAYERS = frozenset(f"torch.nn.{name}" for name in ("Linear", "Conv1d", "Conv2d", "Conv3d", "Bilinear"))


def _module_output(facts: AmpFacts, expr: cst.BaseExpression, scope: Scope) -> bool:
    """`self.to_q(x)`, where the class binds `self.to_q` to an `nn.Linear` (or a convolution)."""
    if not (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)):
        return False
    bound = facts.bindings(dotted_name(expr.func), scope)
    return bool(bound) and all(
        isinstance(value, cst.Call) and facts.qualname(value.func, value_scope) in _AUTOCAST_DTYPE_LAYERS for value, value_scope in bound
    )


def _argument_values(facts: AmpFacts, call: CallSite, keyword_spreads: bool = True) -> Iterator[cst.BaseExpression]:
    """The call's arguments, a name replaced by what it holds there (`args` of `.apply(*args)`)."""
    for arg in call.node.args:
        if arg.star == "**" and not keyword_spreads:
            continue
        value = arg.value
        if isinstance(value, cst.Name) and value.value not in ("True", "False", "None"):
            value = _value_at(facts, value.value, call) or value
        yield value


def _value_at(facts: AmpFacts, name: str, call: CallSite) -> cst.BaseExpression | None:
    """What the name is bound to at the call: the binding every path passes last, or one made
    whenever autocast is on (`if torch.is_autocast_enabled(): args = tuple(...)`, the cast apex's
    `_cast_if_autocast_enabled` writes out): with autocast off there is nothing to cast for."""
    function = call.scope.function_scope
    before = [
        a for a in facts.assignments
        if a.key == name and a.where.scope.function_scope is function and a.where.order < call.where.order
        and not mutually_exclusive(a.where, call.where)
    ]
    last = max(before, key=lambda a: a.where.order, default=None)
    if last is None:
        return None
    ifs = {id(node): node for node in last.where.ifs}
    for node, label in set(last.where.branches) - set(call.where.branches):
        guard = ifs.get(node)  # None for a `match` case
        if label != "body" or guard is None or not _tests_autocast_on(facts, guard.test, function):
            return None
    return last.value


def _tests_autocast_on(facts: AmpFacts, test: cst.BaseExpression, function: Scope) -> bool:
    """`torch.is_autocast_enabled()`, or a name bound to such a reading (`enabled = ...; if enabled:`)."""
    readers = _state_readers(facts, function)
    return id(test) in readers or dotted_name(test) in _bound_to_state(facts, function, readers)


def _each_is(value: cst.BaseExpression, counts: Callable[[cst.BaseExpression], bool]) -> bool:
    """The value counts; or it is a tuple, a list, `tuple(...)`/`list(...)` of one, a generator or a
    comprehension whose every element does (`args = tuple(x.float() for x in args)`, then
    `.apply(*args)`); or a conditional whose branches each do or hold the name its test finds None
    (`x.to(dtype) if x is not None else x`: an absent bias passes as it is)."""
    if isinstance(value, cst.Call) and dotted_name(value.func) in ("tuple", "list") and len(value.args) == 1:
        return _each_is(value.args[0].value, counts)
    if isinstance(value, (cst.Tuple, cst.List)):
        return all(_each_is(element.value, counts) for element in value.elements)
    if isinstance(value, (cst.GeneratorExp, cst.ListComp)):
        return _each_is(value.elt, counts)
    if isinstance(value, cst.IfExp):
        return all(
            _each_is(branch, counts) or _found_none(value.test, branch, is_body)
            for branch, is_body in ((value.body, True), (value.orelse, False))
        )
    return counts(value)


def _found_none(test: cst.BaseExpression, branch: cst.BaseExpression, is_body: bool) -> bool:
    """The branch is the name its test finds None: `x` in the body of `x is None`, or in the else of `x is not None`."""
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and is_none(test.comparisons[0].comparator)):
        return False
    operator = test.comparisons[0].operator
    if not isinstance(operator, (cst.Is, cst.IsNot)) or isinstance(operator, cst.Is) != is_body:
        return False
    name = dotted_name(test.left)
    return name is not None and dotted_name(branch) == name


def _is_cast(expr: cst.BaseExpression) -> bool:
    """`x.float()`, `x.to(dtype)`, or a cast helper: `_cast_if_autocast_enabled(x, w)`, autocast's `_cast`."""
    if not isinstance(expr, cst.Call):
        return False
    if isinstance(expr.func, cst.Attribute):
        return expr.func.attr.value in _CAST_METHODS or bool(_CAST_HELPER.search(expr.func.attr.value))
    return isinstance(expr.func, cst.Name) and bool(_CAST_HELPER.search(expr.func.value))


def _is_setting(expr: cst.BaseExpression) -> bool:
    """A literal, or a name for a setting (`eps`, `self.normalized_shape`)."""
    if isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString, cst.ConcatenatedString)):
        return True
    if isinstance(expr, cst.UnaryOperation):
        return _is_setting(expr.expression)
    name = dotted_name(expr)
    if name is None:
        return False
    last = name.rsplit(".", 1)[-1]
    return last in ("True", "False", "None") or bool(_SETTING_NAME.search(last.lower()))


def _first_argument(function: cst.FunctionDef) -> str:
    params = function.params.params
    return params[0].name.value if params else "ctx"


def _bwd_spelling(facts: AmpFacts, fwd: cst.Decorator, scope: Scope) -> str | None:
    """`custom_bwd` spelled like the existing `custom_fwd`, with its device_type."""
    expr = fwd.decorator.func if isinstance(fwd.decorator, cst.Call) else fwd.decorator
    dotted = dotted_name(expr)
    if dotted is None:
        return None
    qualified = _decorator_name(facts, fwd, scope)
    device = None
    if isinstance(fwd.decorator, cst.Call):
        device = argument(fwd.decorator, None, "device_type")
    deprecated = qualified.startswith("torch.cuda.amp")
    alias = _imported_as(facts, qualified.rsplit(".", 1)[0] + ".custom_bwd")
    if "." in dotted:
        spelling = dotted.rsplit(".", 1)[0] + ".custom_bwd"
    elif alias is not None:
        spelling = alias  # `from torch.amp import custom_bwd as cbwd`: `@cbwd(...)`
    elif (scope.parent or facts.module_scope).resolve("custom_bwd") is not None:
        spelling = "custom_bwd"
    elif facts.module_scope.resolve("torch") == "torch":
        spelling = "torch.cuda.amp.custom_bwd" if deprecated else "torch.amp.custom_bwd"
    else:
        return None
    if deprecated:
        return spelling
    if device is None:
        return None
    return f"{spelling}(device_type={facts.module.code_for_node(device)})"


def _advised_bwd(facts: AmpFacts, fwd: cst.Decorator, scope: Scope) -> str:
    """The `custom_bwd` a message advises: spelled like the file's `custom_fwd`, but not through
    the deprecated `torch.cuda.amp` (AMP001 would flag the advice) where the oldest torch the
    project runs on has `torch.amp.custom_bwd`."""
    spelling = _bwd_spelling(facts, fwd, scope)
    modern = 'torch.amp.custom_bwd(device_type="cuda")'
    if spelling is None:
        return "torch.amp.custom_bwd(device_type=...)"
    if _decorator_name(facts, fwd, scope).startswith("torch.cuda.amp") and replacement_available("custom_bwd", facts):
        return modern
    return spelling


def _imported_as(facts: AmpFacts, qualified: str) -> str | None:
    """The module-level name an import binds to `qualified`, if any."""
    return next((name for name, target in facts.module_scope.imports.items() if target == qualified), None)


def _fix(facts: AmpFacts, fwd: cst.Decorator, backward: cst.FunctionDef, scope: Scope) -> FixPlan | None:
    spelling = _bwd_spelling(facts, fwd, scope)
    if spelling is None or not backward.decorators:
        return None
    last = backward.decorators[-1]
    indent = ts.indentation(facts, backward)
    text = f"@{facts.module.code_for_node(last.decorator)}\n{indent}@{spelling}"
    return FixPlan(Applicability.SAFE, (Replacement(last, text),))
