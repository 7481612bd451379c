"""AMP002 half-with-autocast: a model or its inputs converted to fp16/bf16 by hand in AMP code."""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from amplint.static import names
from amplint.static.checks import Hit
from amplint.static.checks import _regions as rg
from amplint.static.semantics import AmpFacts, CallSite, Scope, argument, dotted_name, statement_code

CODE = "AMP002"

# Casting weights for export or storage is not running the model in low precision.
_EXPORT_FUNCTION = re.compile(r"export|save|onnx|convert|quantiz|checkpoint|serializ|dump|to_fp16|publish")
# Results moved off the graph for storage or logging (`emb.detach().half().cpu()`) are neither
# the model nor its inputs.
_OFF_GRAPH = {"cpu", "numpy", "tolist", "item", "detach"}
_OFF_GRAPH_RECEIVER = re.compile(r"\.(detach|cpu|numpy|item)\(\)")
# `model.half().float()` rounds the weights through fp16 and leaves the model in float32.
_ROUND_TRIP = {"float"}
# A converted deep copy (`deepcopy(ema.ema).half()` in a checkpoint dict) is never the model
# being trained.
_COPY = {"copy.deepcopy", "copy.copy"}
# A call whose name says it evaluates (`val.run`, `evaluate`, `test_model`).
_EVALUATION = re.compile(r"^val$|eval|valid|test|infer|predict|benchmark")


def low_precision_target(call: CallSite, facts: AmpFacts) -> str | None:
    """The dtype a conversion call casts to, when it is a literal fp16/bf16 one."""
    if call.method in ("half", "bfloat16") and not call.node.args:
        return "float16" if call.method == "half" else "bfloat16"
    if call.method == "to":
        for candidate in (argument(call.node, None, "dtype"), argument(call.node, 0, None), argument(call.node, 1, None)):
            qualified = facts.qualname(candidate, call.scope)
            if qualified in names.LOW_PRECISION_DTYPES:
                return qualified.split(".")[-1].replace("half", "float16")
    if call.method == "type":
        qualified = facts.qualname(argument(call.node, 0, "dtype"), call.scope)
        if qualified in names.LOW_PRECISION_DTYPES or qualified in names.LOW_PRECISION_TENSOR_TYPES:
            return "bfloat16" if "BFloat16" in qualified or "bfloat16" in qualified else "float16"
    return None


def _is_export(call: CallSite, facts: AmpFacts) -> bool:
    receiver = call.receiver
    text = facts.module.code_for_node(receiver) if receiver is not None else ""
    if "state_dict" in text:
        return True
    function = call.scope.function_scope
    if function.kind == "function" and _EXPORT_FUNCTION.search(function.name.lower()):
        return True
    statement = call.where.statement
    return isinstance(statement, cst.SimpleStatementLine) and "torch.save" in statement_code(statement)


def _off_graph(call: CallSite, facts: AmpFacts) -> bool:
    if facts.method_on_result(call) in _OFF_GRAPH | _ROUND_TRIP:
        return True
    if isinstance(call.receiver, cst.Call) and facts.qualname(call.receiver.func, call.scope) in _COPY:
        return True
    return call.receiver is not None and bool(_OFF_GRAPH_RECEIVER.search(facts.module.code_for_node(call.receiver)))


def _fresh_model_for_evaluation(call: CallSite, facts: AmpFacts) -> bool:
    """A model loaded and converted on the spot, and handed straight to an evaluation
    (`val.run(model=attempt_load(best).half())` after training): an fp16 copy for inference, not
    the model being trained. `val.run(model=model.half())` converts the trained model in place
    and stays reported."""
    if not isinstance(call.receiver, cst.Call):
        return False
    argument_node = facts.parent_of.get(id(call.node))
    outer = facts.parent_of.get(id(argument_node)) if isinstance(argument_node, cst.Arg) else None
    if not isinstance(outer, cst.Call):
        return False
    callee = dotted_name(outer.func) or ""
    return any(_EVALUATION.search(part) for part in callee.lower().split("."))


def _kernel_cast_in_model(call: CallSite, facts: AmpFacts) -> bool:
    """A model casting tensors for its own kernels (fp16 q/k/v for flash attention) is the model's
    business; a model converting itself or a submodule (`self.encoder.half()` in `setup`) is not."""
    function = call.scope.function_scope
    if function.class_name is None or not facts.is_module_class(function.class_name):
        return False
    converts_itself = call.receiver_key == "self" or (
        (call.receiver_key or "").startswith("self.") and function.name != "forward"
    )
    return not converts_itself


def _test_function(scope: Scope) -> Scope | None:
    """The test (`def test_...`, a function or a method) a scope belongs to, if any."""
    while scope is not None:
        if scope.kind == "function" and (scope.name == "test" or scope.name.startswith("test_")):
            return scope
        scope = scope.parent
    return None


def _amp_tests(facts: AmpFacts) -> list[Scope | None]:
    """The test each autocast region, autocast decorator and GradScaler sits in (None: not in a test)."""
    sites = [c.scope for c in facts.calls if c.qualname in names.AUTOCAST or c.qualname in names.GRAD_SCALER]
    sites += [f for f in facts.functions if any(facts.decorator_autocast(d, f.parent or f) for d in f.decorators)]
    return [_test_function(scope) for scope in sites]


def _in_a_test_of_its_own(call: CallSite, facts: AmpFacts) -> bool:
    """A conversion in a test whose module uses autocast and GradScalers in other tests only: a
    test runner runs each test by itself (torch's and timm's suites cast a module to float16 in
    one test and check autocast in the next). A test that calls another test is not on its own."""
    test = _test_function(call.scope)
    if test is None or any(c.callee and c.callee.split(".")[-1].startswith("test_") for c in facts.calls if _test_function(c.scope) is test):
        return False
    return all(other is not None and other is not test for other in _amp_tests(facts))


def _trains(facts: AmpFacts) -> bool:
    """Whether the module trains: a GradScaler, a backward, a Lightning `training_step`. An
    inference module keeps float16 weights by design (diffusers' pipelines upcast the VAE for
    decoding and cast it back)."""
    return facts.has_scaler or rg.has_backward(facts) or any(f.name == "training_step" for f in facts.functions)


def _frozen(call: CallSite, facts: AmpFacts) -> bool:
    """A module frozen in the same function before or after its cast (`vae.requires_grad_(False)`,
    `vae = AutoencoderKL.from_pretrained(...).requires_grad_(False).half()`, `p.requires_grad =
    False` for its parameters): no gradient, no optimizer state, nothing for a GradScaler to
    unscale. The module is named by the chain the cast is in, or by the name it is assigned to."""
    chain = _same_object_chain(call, facts)
    if any(_freezes(node) for node in chain):
        return True
    subjects = {_converted(call)} | {a.key for a in facts.assignments if a.value is chain[-1]}
    subjects.discard(None)
    function = call.scope.function_scope
    for other in function.calls:
        if not _freezes(other.node):
            continue
        if other.receiver_key in subjects:
            return True
        if any(a.key in subjects and a.value is other.node for a in facts.assignments):
            return True
    return any(
        a.key.endswith(".requires_grad")
        and _is_false(a.value)
        and a.where.scope.function_scope is function
        and any(re.search(rf"(?<![\w.]){re.escape(subject)}\.parameters\(\)", loop.iterable) for subject in subjects for loop in a.where.loops)
        for a in facts.assignments
    )


def _same_object_chain(call: CallSite, facts: AmpFacts) -> list[cst.Call]:
    """The calls of `x.to(device).half().eval()` around a cast, innermost first, outermost last."""
    chain = [*_chain_below(call)[0], call.node]
    current = call.node
    while True:
        attribute = facts.parent_of.get(id(current))
        outer = facts.parent_of.get(id(attribute))
        if not (isinstance(attribute, cst.Attribute) and attribute.attr.value in _SAME_OBJECT and isinstance(outer, cst.Call)):
            return chain
        chain.append(outer)
        current = outer


def _freezes(node: cst.Call) -> bool:
    return (
        isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "requires_grad_"
        and _is_false(argument(node, 0, "requires_grad"))
    )


# Methods that return the module or tensor they are called on, moved, cast or switched.
_SAME_OBJECT = frozenset({"to", "cuda", "cpu", "half", "float", "bfloat16", "eval", "train", "requires_grad_", "type"})


def _chain_below(call: CallSite) -> tuple[list[cst.Call], cst.BaseExpression | None]:
    """The same-object calls a cast is made on, innermost first, and what they start from."""
    calls: list[cst.Call] = []
    node = call.receiver
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in _SAME_OBJECT:
        calls.insert(0, node)
        node = node.func.value
    return calls, node


def _converted(call: CallSite) -> str | None:
    """The name of what a conversion converts: `teacher` in `teacher.to(device).half()`."""
    return dotted_name(_chain_below(call)[1])


def _is_false(node: cst.BaseExpression | None) -> bool:
    return isinstance(node, cst.Name) and node.value == "False"


def check(facts: AmpFacts) -> Iterator[Hit]:
    if not (facts.has_autocast or facts.has_scaler) or not _trains(facts):
        return
    uses = "autocast" if facts.has_autocast else "a GradScaler"
    for call in facts.calls:
        dtype = low_precision_target(call, facts)
        if (
            dtype is None
            or _is_export(call, facts)
            or _off_graph(call, facts)
            or _kernel_cast_in_model(call, facts)
            or _fresh_model_for_evaluation(call, facts)
            or _in_a_test_of_its_own(call, facts)
            or _frozen(call, facts)
        ):
            continue
        subject = _converted(call) or (facts.module.code_for_node(call.receiver) if call.receiver is not None else "value")
        if len(subject) > 40:
            subject = subject[:37] + "..."
        yield Hit(
            call.node,
            f"`{subject}` is converted to {dtype} by hand in code that uses {uses}; keep the model "
            f"and inputs in float32 and let autocast choose per-op dtypes (a GradScaler cannot "
            f"unscale {dtype} gradients)",
            call.where.statement,
        )
