"""AMP017 compile-backward-autocast-mismatch: a compiled model under autocast, backward outside it."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from amplint.static.checks import Hit
from amplint.static.checks import _regions as rg
from amplint.static.checks import _training_step as ts
from amplint.static import names
from amplint.static.semantics import AmpFacts, CallSite, argument, constructor_of, dotted_name, is_true, mutually_exclusive

CODE = "AMP017"

_COMPILE = {"torch.compile", "torch._dynamo.optimize"}
_SETTING = "backward_pass_autocast"


def _compiled(facts: AmpFacts) -> list[tuple[CallSite, str | None, object]]:
    """torch.compile calls (and decorators, `model.compile()`), with the name the compiled object has."""
    found = []
    for call in facts.calls:
        if call.qualname in _COMPILE and _builds_a_backward_graph(call.node):
            parent = ts.parents(facts).get(id(call.node))
            if isinstance(parent, cst.Decorator):
                function = ts.parents(facts).get(id(parent))
                name = function.name.value if isinstance(function, cst.FunctionDef) else None
                found.append((call, name, function))
                continue
            target = _assigned_to(facts, call)
            compiled = call.arg(0, "model")
            # `torch.compile(train_step)` of a function of this file is `@torch.compile` on it.
            function = _function_compiled(facts, compiled, call.scope)
            found.append((call, target or dotted_name(compiled), function.node if function is not None else None))
        elif call.method == "compile" and call.receiver_key and _compiles_a_module(facts, call):
            found.append((call, call.receiver_key, None))
    for function in facts.functions:
        for decorator in function.decorators:
            called = isinstance(decorator.decorator, cst.Call)  # `@torch.compile(dynamic=False)`: a call, found above
            expr = decorator.decorator.func if called else decorator.decorator
            if facts.qualname(expr, function.parent or function) not in _COMPILE:
                continue
            if called and not _builds_a_backward_graph(decorator.decorator):
                continue
            if not called:
                found.append((decorator, function.name, function.node))
            # `@torch.compile` on a module's `forward`: its instances are the compiled models.
            if function.class_name is not None and function.name in ("forward", "__call__"):
                found.extend((decorator, key, None) for key in _instances_of(facts, function.class_name))
    return found


def _function_compiled(facts: AmpFacts, compiled: cst.BaseExpression | None, scope, depth: int = 0):
    """The function of this file a `torch.compile` argument runs: named, through
    `functools.partial(f, model)`, a lambda that calls it, a method of a local instance
    (`torch.compile(computer.forward_loss)`), or what a factory of the file returns
    (`torch.compile(make_train_step(model, opt))`, also through a name bound to its result)."""
    if compiled is None or depth > names.CALL_DEPTH:
        return None
    if isinstance(compiled, cst.Call):
        if facts.qualname(compiled.func, scope) == "functools.partial":
            return _function_compiled(facts, argument(compiled, 0, "func"), scope, depth + 1)
        factory = facts._function_named(compiled.func, scope)
        returned = factory.returns if factory is not None else ()
        return next(filter(None, (_function_compiled(facts, r, factory, depth + 1) for r in returned)), None)
    if isinstance(compiled, cst.Lambda) and isinstance(compiled.body, cst.Call):
        return _function_compiled(facts, compiled.body.func, scope, depth + 1)
    if isinstance(compiled, cst.Attribute) and isinstance(compiled.value, cst.Name):
        owner = facts._local_instance_class(compiled.value.value, scope)
        if owner is not None:
            return facts._method_of(owner, compiled.attr.value)
    named = facts._function_named(compiled, scope)
    if named is None and isinstance(compiled, cst.Name):  # `step = make_train_step(...)`, then `torch.compile(step)`
        bound = facts.bindings(compiled.value, scope)
        if len(bound) == 1:
            return _function_compiled(facts, *bound[0], depth + 1)
    return named


def _compiles_a_module(facts: AmpFacts, call: CallSite) -> bool:
    """`model.compile()` (nn.Module.compile): a module built here, or any object (a parameter, a
    model built in another file) compiled without a positional argument; `re.compile(pattern)`
    and other imported modules' `compile` are not. Only one later called under autocast counts."""
    if facts.value_kind(call.receiver, call.scope) == "model":
        return True
    positional = [arg for arg in call.node.args if arg.keyword is None and not arg.star]
    return not positional and facts.qualname(call.receiver, call.scope) is None


def _compiles_a_function(facts: AmpFacts, node, function) -> bool:
    """`@torch.compile` on a function (not a module's forward), or `torch.compile(fn)` of a
    function defined in this file."""
    if isinstance(function, cst.FunctionDef):
        return function.name.value not in ("forward", "__call__")
    if isinstance(node, CallSite) and node.qualname in _COMPILE:
        return dotted_name(node.arg(0, "model")) in facts.functions_by_name
    return False


def _builds_a_backward_graph(call: cst.Call) -> bool:
    """Not `torch.compile(..., backend="eager")`, which runs backward as eager mode does, nor
    `disable=True`, which compiles nothing."""
    backend = argument(call, None, "backend")
    disable = argument(call, None, "disable")
    eager = isinstance(backend, cst.SimpleString) and backend.evaluated_value == "eager"
    return not eager and not is_true(disable)


def _instances_of(facts: AmpFacts, class_name: str) -> set[str]:
    """The names bound to `ClassName(...)` (also `ClassName().cuda()`) in this file."""
    return {
        a.key for a in facts.assignments
        if (built := constructor_of(a.value)) is not None and isinstance(built.func, cst.Name) and built.func.value == class_name
    }


def _assigned_to(facts: AmpFacts, call: CallSite) -> str | None:
    """The name the compiled model is bound to, however it is bound: `net = torch.compile(m)`,
    `net: nn.Module = torch.compile(m)`, or `(net := torch.compile(m))` inside a test."""
    binding = facts.parent_of.get(id(call.node))
    if isinstance(binding, cst.Assign):
        return dotted_name(binding.targets[0].target)
    if isinstance(binding, (cst.AnnAssign, cst.NamedExpr)):
        return dotted_name(binding.target)
    return None


def _opens_autocast_inside(facts: AmpFacts, function_node) -> bool:
    """A compiled function (decorated, or given to `torch.compile`) that opens an enabled
    training autocast region itself."""
    return function_node is not None and any(
        rg.enabled(region) and ts.within(facts, call.node, function_node) and not rg.inference_only(facts, call)
        for call, region in rg.autocasts(facts)
    )


def _calls_under_autocast(facts: AmpFacts, name: str | None) -> list[CallSite]:
    """The training calls of the compiled object (`model(x)`, `model.forward(x)`) made in an
    autocast region: not under no_grad, in a region that is not an evaluation's. The name of a
    helper the region reaches the call through (`_step_predictor`) says what it calls, not that
    it evaluates, so only the region's function is read for that."""
    if name is None:
        return []
    last = name.split(".")[-1]
    found = []
    for call in facts.calls:
        if call.callee is None:
            continue
        parts = call.callee.split(".")
        if parts[-1] == last or (len(parts) >= 2 and parts[-2] == last and parts[-1] in ("forward", "__call__")):
            region = facts.region_of(call.where)
            if region is not None and not rg.in_no_grad(facts, call) and not _region_inference_only(facts, region):
                found.append(call)
    return found


def _region_inference_only(facts: AmpFacts, region) -> bool:
    autocast, _via = region
    for call, _ in rg.autocasts(facts):
        if call.node is autocast.node:
            return rg.inference_only(facts, call)
    return False


def _sets_backward_autocast(facts: AmpFacts) -> bool:
    """The config is set in code (an assignment, `config.patch(backward_pass_autocast=...)` or a
    string key), not merely mentioned in a comment or a docstring."""
    if any(a.key.endswith(_SETTING) for a in facts.assignments):
        return True
    for call in facts.calls:
        for arg in call.node.args:
            if arg.keyword is not None and arg.keyword.value == _SETTING:
                return True
            if isinstance(arg.value, cst.SimpleString) and arg.value.evaluated_value == _SETTING:
                return True
            if isinstance(arg.value, cst.Dict) and any(
                isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString) and e.key.evaluated_value == _SETTING
                for e in arg.value.elements
            ):
                return True
    return False


def check(facts: AmpFacts) -> Iterator[Hit]:
    if not facts.has_autocast or _sets_backward_autocast(facts):
        return
    outside = [b for b in rg.backwards(facts) if facts.region_of(b.where) is None]
    if not outside:
        return
    for node, name, function in _compiled(facts):
        call_node = node.node if isinstance(node, CallSite) else node
        statement = node.where.statement if isinstance(node, CallSite) else None
        forwards = _calls_under_autocast(facts, name)
        if not (forwards or _opens_autocast_inside(facts, function)):
            continue
        compiled = "function" if _compiles_a_function(facts, node, function) else "model"
        yield Hit(
            call_node,
            f"this compiled {compiled} runs under autocast while backward runs outside it (line {{0}}); with "
            "torch.compile's default `backward_pass_autocast=\"same_as_forward\"` the compiled backward "
            f"re-enters autocast, which differs from eager and can overflow (pytorch/pytorch#153044); {_advice(facts, compiled)}",
            statement or call_node,
            related=(_cited_backward(facts, _nearest(outside, node, _named_exactly(forwards, name) or forwards)).node,),
        )


# The torch that first has `torch._functorch.config.backward_pass_autocast` (pytorch/pytorch#156356).
_SETTING_SINCE = (2, 8)


def _advice(facts: AmpFacts, compiled: str) -> str:
    if facts.min_torch is None or facts.min_torch >= _SETTING_SINCE:
        return (
            "set `torch._functorch.config.backward_pass_autocast = \"off\"` (after `import torch._functorch.config`) "
            "to match eager"
        )
    oldest = ".".join(map(str, facts.min_torch))
    inside = "the compiled function" if compiled == "function" else "the model's `forward`"
    # Older than torch.compile itself: the compiled path runs only on the newer torch the code checks for.
    predates = "`torch.compile` (2.0) and " if facts.min_torch < (2, 0) else ""
    return (
        f"the project's oldest torch, {oldest}, predates {predates}the `backward_pass_autocast` setting of torch 2.8: "
        f"open autocast inside {inside} instead, so that no autocast surrounds the compiled call for backward to inherit"
    )


def _cited_backward(facts: AmpFacts, backward: CallSite) -> CallSite:
    """timm's `if loss_scaler is not None: loss_scaler(loss, optimizer) else: loss.backward()`:
    the plain backward is the fallback for a run without AMP, and the scaler's call runs the AMP
    run's backward (outside the region too), so that call is the one to cite."""
    for call in facts.calls:
        if (
            call.method is None
            and call.node.args
            and names.SCALER_WORD.search(call.callee or "")
            and call.scope.function_scope is backward.scope.function_scope
            and mutually_exclusive(call.where, backward.where)
            and facts.region_of(call.where) is None
        ):
            return call
    return backward


def _named_exactly(forwards: list[CallSite], name: str | None) -> list[CallSite]:
    """The forwards called by the compiled object's full name (`self.net(x)` for `self.net`): a
    plain `net(x)` elsewhere matched only its last part and may be another model."""
    return [f for f in forwards if f.callee in (name, f"{name}.forward", f"{name}.__call__")]


def _nearest(backwards: list[CallSite], compiled, forwards: list[CallSite]) -> CallSite:
    """The backward to cite: the first after a forward of the model under autocast in the same
    function (llm.c's training loop, not its float32 debug pass before it), else one in the
    function that compiles the model, else the first."""
    after_a_forward = [
        b for b in backwards
        if any(f.scope.function_scope is b.scope.function_scope and f.where.order < b.where.order for f in forwards)
    ]
    backwards = after_a_forward or backwards
    if isinstance(compiled, CallSite):
        same = [b for b in backwards if b.scope.function_scope is compiled.scope.function_scope]
        if same:
            return same[0]
    return backwards[0]
