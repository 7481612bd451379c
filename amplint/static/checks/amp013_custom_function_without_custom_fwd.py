"""AMP013 custom-function-without-custom_fwd: a custom autograd.Function that autocast does not handle."""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from amplint.model import Applicability
from amplint.static.checks import FixPlan, Hit, Replacement
from amplint.static.checks import _training_step as ts
from amplint.static.semantics import AmpFacts, Scope, argument, dotted_name

CODE = "AMP013"

_FUNCTION_BASES = {"torch.autograd.Function", "torch.autograd.function.Function"}
_CUSTOM_FWD = re.compile(r"(^|\.)custom_fwd$")
_CUSTOM_BWD = re.compile(r"(^|\.)custom_bwd$")
# Ops autocast would cast (matmuls, convolutions) and calls into compiled extensions.
_AUTOCAST_OPS = re.compile(
    r"\b(matmul|mm|bmm|addmm|baddbmm|addbmm|einsum|linear|conv\w*|F\.linear|F\.conv\w*|_C\.\w+|cuda_\w+|\w+_cuda|\w+_ext\.\w+|ext\.\w+|kernel\w*|triton)\s*\(|@"
)


def _is_function_class(facts: AmpFacts, scope: Scope, bases) -> bool:
    parent = scope.parent or facts.module_scope
    for base in bases:
        if base is None:
            continue
        qualified = parent.resolve(base)
        if qualified in _FUNCTION_BASES:
            return True
    return False


def _decorator_name(facts: AmpFacts, decorator: cst.Decorator, scope: Scope) -> str:
    expr = decorator.decorator.func if isinstance(decorator.decorator, cst.Call) else decorator.decorator
    return facts.qualname(expr, scope) or dotted_name(expr) or ""


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
        if pattern.search(_decorator_name(facts, decorator, scope)):
            return decorator
    return None


def _amp_aware(facts: AmpFacts) -> bool:
    if facts.has_autocast or facts.has_scaler:
        return True
    return any(_CUSTOM_FWD.search(r.qualname) or _CUSTOM_BWD.search(r.qualname) for r in facts.imports) or any(
        c.qualname and (_CUSTOM_FWD.search(c.qualname) or _CUSTOM_BWD.search(c.qualname)) for c in facts.calls
    )


def check(facts: AmpFacts) -> Iterator[Hit]:
    if not facts.classes or not _amp_aware(facts):
        return
    for scope, bases in facts.classes:
        if not _is_function_class(facts, scope, bases):
            continue
        forward = _method(scope, "forward")
        backward = _method(scope, "backward")
        if forward is None:
            continue
        fwd = _find(facts, forward, _CUSTOM_FWD, scope)
        bwd = _find(facts, backward, _CUSTOM_BWD, scope)
        if fwd is None:
            if bwd is None and _does_precision_sensitive_work(facts, forward):
                yield Hit(
                    scope.node.name,
                    f"`{scope.name}` is a custom autograd.Function without `@torch.amp.custom_fwd`: under "
                    f"autocast its forward receives a mix of float16 and float32 tensors (and its backward "
                    f"runs with autocast in an unknown state); decorate `forward` with "
                    f"`@torch.amp.custom_fwd(device_type=..., cast_inputs=...)` and `backward` with "
                    f"`@torch.amp.custom_bwd(device_type=...)`",
                    scope.node,
                )
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
        if backward is not None and bwd is None:
            yield Hit(
                backward.name,
                f"`{scope.name}.forward` has `custom_fwd` but `backward` has no `custom_bwd`, so backward "
                f"does not run with the autocast state forward ran with; add "
                f"`@{_bwd_spelling(facts, fwd, scope) or 'torch.amp.custom_bwd(device_type=...)'}`",
                backward,
                _fix(facts, fwd, backward, scope),
            )


def _does_precision_sensitive_work(facts: AmpFacts, forward: cst.FunctionDef) -> bool:
    params = [p for p in forward.params.params if p.name.value not in ("ctx", "self", "cls")]
    # An argument with a default, or annotated as anything but a tensor (`alpha: float`), is a setting.
    tensors = [p for p in params if p.default is None and _may_be_a_tensor(facts, p)]
    if len(tensors) >= 2:
        return True
    return bool(_AUTOCAST_OPS.search(facts.module.code_for_node(forward.body)))


def _may_be_a_tensor(facts: AmpFacts, param: cst.Param) -> bool:
    return param.annotation is None or "Tensor" in facts.module.code_for_node(param.annotation.annotation)


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
    if "." in dotted:
        spelling = dotted.rsplit(".", 1)[0] + ".custom_bwd"
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


def _fix(facts: AmpFacts, fwd: cst.Decorator, backward: cst.FunctionDef, scope: Scope) -> FixPlan | None:
    spelling = _bwd_spelling(facts, fwd, scope)
    if spelling is None or not backward.decorators:
        return None
    last = backward.decorators[-1]
    indent = ts.indentation(facts, backward)
    text = f"@{facts.module.code_for_node(last.decorator)}\n{indent}@{spelling}"
    return FixPlan(Applicability.SAFE, (Replacement(last, text),))
