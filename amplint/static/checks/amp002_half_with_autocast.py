"""AMP002 half-with-autocast: a model or its inputs converted to fp16/bf16 by hand in AMP code."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import libcst as cst

from amplint.static import names
from amplint.static.checks import Hit
from amplint.static.checks import _regions as rg
from amplint.static.checks._training_step import cached, leaves_before
from amplint.static.semantics import (
    AmpFacts,
    CallSite,
    Context,
    Reference,
    Scope,
    all_of,
    and_operands,
    argument,
    dotted_name,
    is_false,
    is_true,
    mutually_exclusive,
    statement_code,
    string_literal,
)

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
    """The dtype a conversion call casts to when it is fp16/bf16: "float16", "bfloat16", or, for a
    conditional holding both, "float16 or bfloat16 (chosen at run time)"."""
    if call.method in ("half", "bfloat16") and not call.node.args:
        return "float16" if call.method == "half" else "bfloat16"
    if call.method == "to":
        for candidate in (argument(call.node, None, "dtype"), argument(call.node, 0, None), argument(call.node, 1, None)):
            dtype = _low_precision_dtype(_possible_names(candidate, call.scope, facts))
            if dtype is not None:
                return dtype
    if call.method == "type":
        possible = _possible_names(argument(call.node, 0, "dtype"), call.scope, facts)
        qualified = next((q for q in possible if q in names.LOW_PRECISION_DTYPES or q in names.LOW_PRECISION_TENSOR_TYPES), None)
        if qualified is not None:
            return "bfloat16" if "BFloat16" in qualified or "bfloat16" in qualified else "float16"
    if call.method == "from_pretrained" and not _adapts_a_frozen_base(facts) and not _for_inference(call):
        # `AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.float16)`: built in float16.
        for keyword in ("torch_dtype", "dtype"):
            dtype = _low_precision_dtype(_possible_names(argument(call.node, None, keyword), call.scope, facts))
            if dtype is not None:
                return dtype
    return None


def _low_precision_dtype(qualified_names: list[str]) -> str | None:
    low = {q.split(".")[-1].replace("half", "float16") for q in qualified_names if q in names.LOW_PRECISION_DTYPES}
    if len(low) > 1:
        return "float16 or bfloat16 (chosen at run time)"  # `torch.bfloat16 if cfg.bf16 else torch.float16`
    return next(iter(low), None)


def _for_inference(call: CallSite) -> bool:
    """A diffusers pipeline (an inference object), or a load in an evaluation function
    (`log_validation`): a low-precision copy for sampling, not the model being trained."""
    loaded = (dotted_name(call.receiver) or "").rsplit(".", 1)[-1]
    return loaded.endswith("Pipeline") or bool(_EVALUATION.search(call.scope.function_scope.name.lower()))


def _adapts_a_frozen_base(facts: AmpFacts) -> bool:
    """LoRA and other adapters (peft) train small float32 weights on a frozen base model loaded in
    float16 on purpose."""
    return any(_is_peft(ref.qualname) for ref in facts.imports)


def _possible_names(expr: cst.BaseExpression | None, scope: Scope, facts: AmpFacts) -> list[str]:
    """The qualified names an argument may give a dtype or tensor type: its own, or, for a
    conditional or a name bound to one (`self.data_type = torch.float16 if args.fp16 else
    torch.float32` in YOLOX's trainer), each of its arms: the cast is fp16 whenever that arm is
    taken. A name bound by statements is its first value (diffusers' `weight_dtype = torch.float32`,
    lowered for the frozen models under mixed precision), unless every value is a low precision
    (`cast_dtype = torch.bfloat16`, `else: cast_dtype = torch.float16`)."""
    qualified = facts.qualname(expr, scope)
    if qualified is not None:
        values = [facts.qualname(value, value_scope) for value, value_scope in facts.bindings(dotted_name(expr), scope)]
        if len(values) > 1 and all(value in names.LOW_PRECISION_DTYPES for value in values):
            return values
        return [qualified]
    # The conditional itself (`torch_dtype=torch.float16 if use_fp16 else None`), or one a name is bound to.
    possible = []
    for value, value_scope in [(expr, scope), *facts.bindings(dotted_name(expr), scope)]:
        if isinstance(value, cst.IfExp):
            possible.extend(q for q in (facts.qualname(arm, value_scope) for arm in _arms(value)) if q is not None)
    return possible


def _arms(value: cst.BaseExpression) -> Iterator[cst.BaseExpression]:
    """The values a conditional expression may take in a run that may train, through nested
    conditionals: an arm selected only when no training runs (verl's `torch.float32 if not
    config.forward_only else torch.bfloat16`, float32 to train and bfloat16 for a reference model)
    converts a model nobody trains, like a cast under `if config.forward_only:`."""
    if isinstance(value, cst.IfExp):
        for arm, test_holds in ((value.body, True), (value.orelse, False)):
            if not _only_without_training(value.test, test_holds):
                yield from _arms(arm)
    else:
        yield value


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
    if call.method == "to" and _names_cpu(argument(call.node, 0, "device"), call.scope, facts):
        return True  # `f.to("cpu", torch.bfloat16)` is `f.cpu().bfloat16()` in one call
    if isinstance(call.receiver, cst.Call) and facts.qualname(call.receiver.func, call.scope) in _COPY:
        return True
    return call.receiver is not None and bool(_OFF_GRAPH_RECEIVER.search(facts.module.code_for_node(call.receiver)))


# Calls that read a checkpoint's tensors from a file or a URL.
_CHECKPOINT_READS = {"torch.load", "torch.hub.load_state_dict_from_url", "safetensors.torch.load_file"}


def _checkpoint_surgery(call: CallSite, facts: AmpFacts) -> bool:
    """A tensor indexed or computed by a function and cast in a function that reads a checkpoint
    and reaches no AMP (a position embedding interpolated in float32 and cast back with `.half()`
    before `load_state_dict`): the load copies it into the parameters in their own dtype, so
    neither the model nor its inputs change precision. A module cast there (`model.half()`,
    `Net().half()`) stays reported, and so does a batch in a training loop that resumes from one."""
    function = call.scope.function_scope
    if _amp_anchors(facts)[id(function)] or not any(c.qualname in _CHECKPOINT_READS for c in function.calls):
        return False
    computed = rg.chain_below(call)[1]
    if isinstance(computed, cst.Subscript):  # `checkpoint["pos_embed"].half()`
        return True
    function_name = (dotted_name(computed.func) or "").rsplit(".", 1)[-1] if isinstance(computed, cst.Call) else ""
    return function_name[:1].islower() and facts.value_kind(computed, call.scope) != "model"


# Tests comparing results: a reference cast to the dtype of the output it is checked against.
_COMPARISONS = {"allclose", "isclose", "assert_close", "assert_allclose", "assertEqual", "assertAlmostEqual", "assert_equal"}


def _compared(call: CallSite, facts: AmpFacts) -> bool:
    """`torch.allclose(out, ref.half())`: the cast is an argument of a comparison, or, under
    no_grad, an operand of a difference (`(p - master_p.half()).abs().mean()`, a float16 weight
    measured against its float32 master copy)."""
    for ancestor in facts.ancestors(call.node):
        if ancestor is call.where.statement:
            return False
        if isinstance(ancestor, cst.Call) and (dotted_name(ancestor.func) or "").split(".")[-1] in _COMPARISONS:
            return True
        if isinstance(ancestor, cst.BinaryOperation) and isinstance(ancestor.operator, cst.Subtract):
            # A batch normalised on the GPU (`(images.half() - mean) / std`) is an input all the same.
            return rg.in_no_grad(facts, call) and not _is_data(call, facts)
    return False


def _names_cpu(expr: cst.BaseExpression | None, scope: Scope, facts: AmpFacts) -> bool:
    """`"cpu"` or `torch.device("cpu")`."""
    if isinstance(expr, cst.Call) and facts.qualname(expr.func, scope) == "torch.device":
        expr = argument(expr, 0, "type")
    return isinstance(expr, cst.SimpleString) and expr.evaluated_value == "cpu"


# Where a backward takes the gradient of its outputs, besides `tensor.backward(gradient)`.
_GRADIENT_PARAMETER = {"torch.autograd.backward": (1, "grad_tensors"), "torch.autograd.grad": (2, "grad_outputs")}


def _upstream_gradient(call: CallSite, facts: AmpFacts) -> bool:
    """A cast whose value is only ever the gradient a backward starts from (`grad_out =
    grad_out.half().clone(); out.backward(grad_out)` in apex's kernel tests): it seeds the
    backward pass of a float16 output, and is neither the model nor its inputs."""
    value = _outermost_method_call(call.node, facts)
    if _gradient_argument(value, call.scope, facts):
        return True
    function = call.scope.function_scope
    if not any(c.method == "backward" or c.qualname in _GRADIENT_PARAMETER for c in function.calls):
        return False  # spares the walk over the function's names below
    keys = _names_bound_to(value, facts)
    if len(keys) != 1:
        return False
    (key,) = keys
    later = [
        use for use in (*facts.references, *facts.calls)
        if use.where.scope.function_scope is function and use.where.order > call.where.order
    ]
    uses = [use for use in later if _uses_name(use, key)]
    return bool(uses) and all(
        isinstance(use, Reference) and use.dotted == key and _gradient_argument(use.node, use.where.scope, facts)
        for use in uses
    )


def _stored_in_a_buffer(call: CallSite, facts: AmpFacts) -> bool:
    """`feats[i:j] = x.to(cache_device, torch.bfloat16)`: written into a slice of a preallocated
    buffer (open_clip's feature cache), which is storage whatever device the buffer is on."""
    value = _outermost_method_call(call.node, facts)
    statement = facts.parent_of.get(id(value))
    return isinstance(statement, cst.Assign) and statement.value is value and all(
        isinstance(target.target, cst.Subscript) and any(isinstance(e.slice, cst.Slice) for e in target.target.slice)
        for target in statement.targets
    )  # a slice: `batch["image"] = batch["image"].half()` replaces a model input


def _methods_called_on(node: cst.Call, facts: AmpFacts, methods: frozenset[str] | None = None) -> Iterator[cst.Call]:
    """The calls chained on a call's result, innermost first (`.clone()`, then `.detach()` after
    `g.half()`), while each is one of `methods` (any method when None)."""
    while True:
        attribute = facts.parent_of.get(id(node))
        outer = facts.parent_of.get(id(attribute))
        if not (isinstance(attribute, cst.Attribute) and isinstance(outer, cst.Call) and outer.func is attribute):
            return
        if methods is not None and attribute.attr.value not in methods:
            return
        yield outer
        node = outer


def _outermost_method_call(node: cst.Call, facts: AmpFacts) -> cst.Call:
    """The last call of the method chain a call starts: `g.half().clone().detach()` for `.half()`."""
    return [node, *_methods_called_on(node, facts)][-1]


def _uses_name(use: Reference | CallSite, key: str) -> bool:
    """Whether a reference or a call reads `key` (`g`, `g.shape`, `g.mul_(2)`, `g(...)`)."""
    return _names_or_a_part_of(use.dotted if isinstance(use, Reference) else use.callee, key)


def _names_or_a_part_of(dotted: str | None, key: str) -> bool:
    """`key` itself or one of its attributes (`g`, `g.shape`; `ref`, `ref.encoder`)."""
    return dotted is not None and (dotted == key or dotted.startswith(f"{key}."))


def _gradient_argument(node: cst.BaseExpression, scope: Scope, facts: AmpFacts) -> bool:
    """Whether an expression is passed as the gradient of a backward, alone or in a list of them."""
    parent = facts.parent_of.get(id(node))
    if isinstance(parent, cst.Element):  # `grad_outputs=[g_out, g_aux]`
        node = facts.parent_of.get(id(parent))
        parent = facts.parent_of.get(id(node))
    backward = facts.parent_of.get(id(parent))
    if not (isinstance(parent, cst.Arg) and isinstance(backward, cst.Call)):
        return False
    position, keyword = _GRADIENT_PARAMETER.get(facts.qualname(backward.func, scope) or "", (None, None))
    if keyword is None and isinstance(backward.func, cst.Attribute) and backward.func.attr.value == "backward":
        position, keyword = 0, "gradient"
    return keyword is not None and argument(backward, position, keyword) is node


def _fresh_model_for_evaluation(call: CallSite, facts: AmpFacts) -> bool:
    """A model loaded and converted on the spot, and handed straight to an evaluation
    (`val.run(model=attempt_load(best).half())` after training): an fp16 copy for inference, not
    the model being trained. `val.run(model=model.half())` converts the trained model in place
    and stays reported."""
    if not isinstance(call.receiver, cst.Call):
        return False
    outer = _handed_to(call.node, facts)
    if outer is None:
        return False
    callee = dotted_name(outer.func) or ""
    return any(_EVALUATION.search(part) for part in callee.lower().split("."))


# Flags that say whether the process trains at all: HF Trainer's `self.is_in_train` (set for the
# duration of `train()`), `args.do_train`, `is_training`; not a module's `training` mode, off in
# every evaluation of a training run.
_TRAINING_RUN_FLAG = re.compile(r"(?:\w+\.)*(?:is_in_train|do_train|is_training)")
# Flags that say it does not train: an engine that only runs forward (verl's reference and reward
# models), an evaluation-only or inference run.
_NO_TRAINING_FLAG = re.compile(r"(?:\w+\.)*(?:forward_only|eval_only|inference(?:_only)?)")


def _only_without_training(test: cst.BaseExpression, test_holds: bool) -> bool:
    """Whether code that runs when `test` holds (or, with `test_holds` False, fails) runs only when
    no training runs: a training flag fails there or a no-training flag holds. Every operand of an
    `and` that holds holds, and every operand of an `or` that fails fails; of `not (a and
    args.do_train)`, which operand failed is not known."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _only_without_training(test.expression, not test_holds)
    if isinstance(test, cst.BooleanOperation):
        every_operand_decides = isinstance(test.operator, cst.And) == test_holds
        return every_operand_decides and any(_only_without_training(part, test_holds) for part in (test.left, test.right))
    flag = dotted_name(test) or ""
    return bool((_NO_TRAINING_FLAG if test_holds else _TRAINING_RUN_FLAG).fullmatch(flag))


def _outside_training(call: CallSite, facts: AmpFacts) -> bool:
    """A conversion only when no training runs (the HF Trainer's full-fp16 evaluation: `if not
    self.is_in_train: model = model.to(dtype=torch.float16)`; `if self.forward_only:`): a model
    evaluated on its own."""
    tests = facts.if_tests  # a `match` case has none
    return any(
        node_id in tests and _only_without_training(tests[node_id], label == "body")
        for node_id, label in call.where.branches
    )


# A LightningModule's step hooks (and helpers only they call) are the training loop, whatever the
# class derives from: their casts are the batch's, not the model's kernels.
_LOOP_HOOKS = frozenset({"training_step", "validation_step", "test_step", "predict_step"})


def _part_of_the_loop(function: Scope, facts: AmpFacts) -> bool:
    """A step hook, or a helper only step hooks call (`_shared_step(batch)`)."""
    if function.name in _LOOP_HOOKS:
        return True
    callers = facts.callers(function)
    return bool(callers) and all(site.scope.function_scope.name in _LOOP_HOOKS for site in callers)


def _kernel_cast_in_model(call: CallSite, facts: AmpFacts) -> bool:
    """A model casting tensors for its own kernels (fp16 q/k/v for flash attention) is the model's
    business; a model converting itself or a submodule (`self.encoder.half()` in `setup`) is not."""
    function = call.scope.function_scope
    if function.class_name is None or not facts.is_module_class(function.class_name) or _part_of_the_loop(function, facts):
        return False
    converts_itself = call.receiver_key == "self" or (
        (call.receiver_key or "").startswith("self.") and function.name != "forward"
    )
    return not converts_itself


def _input_for_a_frozen_model(call: CallSite, facts: AmpFacts) -> bool:
    """A tensor cast under no_grad/inference_mode outside any autocast region: no gradient to
    unscale, no autocast to bypass; the cast is what the frozen model needs. Handed to a call
    (distillation's `teacher(x.half())` for a float16 teacher, a sampler's `vae.decode(z.half() /
    scale)`), or a batch cast anywhere in a
    function that reaches no AMP (DLRM's float16 inference benchmark)."""
    if facts.value_kind(call.receiver, call.scope) == "model" or not rg.in_no_grad(facts, call):
        return False
    if facts.region_of(call.where) is not None:
        return False
    function = call.scope.function_scope
    return _handed_to_a_call(call.node, facts) or (
        _is_data(call, facts) and not _amp_anchors(facts)[id(function)] and not _called_on_an_amp_path(facts, function)
    )


def _handed_to_a_call(node: cst.CSTNode, facts: AmpFacts) -> bool:
    """The value is an argument of a call, as it is or through arithmetic (`vae.decode(z.half() / s)`)."""
    parent = facts.parent_of.get(id(node))
    while isinstance(parent, (cst.BinaryOperation, cst.UnaryOperation)):
        parent = facts.parent_of.get(id(parent))
    return isinstance(parent, cst.Arg)


def _called_on_an_amp_path(facts: AmpFacts, function: Scope, depth: int = 0) -> bool:
    """Whether a function of the file calls this one on a path that reaches AMP (a
    `prepare(batch)` helper whose caller feeds the batch into autocast; not DLRM's inference
    benchmark, called in a branch that returns before the training loop)."""
    if function.kind != "function" or depth >= names.CALL_DEPTH:
        return False
    return any(
        _meets_amp(facts, site.where) or _called_on_an_amp_path(facts, site.scope.function_scope, depth + 1)
        for site in facts.callers(function)
    )


def _cast_back_on_return(call: CallSite, facts: AmpFacts) -> bool:
    """A function computing on one of its arguments in low precision and handing the result back
    in that argument's dtype (Muon's Newton-Schulz step: `x = update.bfloat16() / update.norm()`,
    then `return x.to(update.dtype)`): kernel arithmetic whose caller gets its own dtype back."""
    function = call.scope.function_scope
    converted = _converted(call)
    if function.kind != "function" or converted not in function.params or not function.returns:
        return False
    # The copy must go to a name of its own: `x = x.half()` leaves nothing to cast back to, and
    # `model.half()` converts the caller's module in place, whatever the function returns.
    if not _bound_to_another_name(call, converted) or any(
        a.key == converted and a.where.scope is function for a in facts.assignments
    ):
        return False
    return all(_cast_to_the_dtype_of(value, converted) for value in function.returns)


def _bound_to_another_name(call: CallSite, name: str) -> bool:
    """The statement holding the conversion assigns its result to names other than `name`."""
    statement = call.where.statement
    if not isinstance(statement, cst.SimpleStatementLine) or not isinstance(statement.body[0], cst.Assign):
        return False
    targets = [dotted_name(t.target) for t in statement.body[0].targets]
    return all(target is not None and target != name for target in targets)


def _cast_to_the_dtype_of(value: cst.BaseExpression, name: str) -> bool:
    """`x.to(name.dtype)`, `x.type(name.dtype)` or `x.type_as(name)`."""
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)):
        return False
    method = value.func.attr.value
    if method == "type_as":
        return dotted_name(argument(value, 0, "other")) == name
    return method in ("to", "type") and dotted_name(argument(value, 0, "dtype")) == f"{name}.dtype"


# Factories that make a tensor from nothing but a shape or literal values: `torch.randn(...).half()`
# is `torch.randn(..., dtype=torch.half)`, a constant or random tensor created in low precision.
_TENSOR_FACTORIES = {
    f"torch.{name}" for name in (
        "randn", "rand", "randint", "zeros", "ones", "empty", "full", "arange", "linspace", "eye",
        "randn_like", "rand_like", "randint_like", "zeros_like", "ones_like", "empty_like", "full_like",
    )
}


def _created_in_low_precision(call: CallSite, facts: AmpFacts) -> bool:
    """A tensor made on the spot and converted (`torch.randn(1, c, 1, 1).half().cuda()`, a frozen
    scale in apex's kernel tests; `torch.tensor([2.0]).cuda().half()`): creation with a dtype, which
    the rule leaves alone when it is written `dtype=torch.float16`, not a conversion of the model
    or of its data. `torch.tensor(batch).half()` converts data and stays reported."""
    created = rg.chain_below(call)[1]
    if not isinstance(created, cst.Call):
        return False
    factory = facts.qualname(created.func, call.scope)
    if factory == "torch.tensor":
        return _literal(argument(created, 0, "data"))
    return factory in _TENSOR_FACTORIES


def _only_to_a_dtype_already_held(call: CallSite, facts: AmpFacts, dtype: str) -> bool:
    """A tensor cast only to the dtype of the tensor it is written into, tested right there:
    `p.data = avg.half() if p.dtype == torch.float16 else avg` (averaged weights swapped into a
    float16 model, OpenNMT's), `if p.dtype == torch.float16: p.data.copy_(avg.half())`. It keeps a
    precision chosen elsewhere and converts nothing. A test of anything else (a config's dtype,
    the batch's) or a cast of a model is no such thing."""
    if facts.value_kind(call.receiver, call.scope) == "model":
        return False
    written = _written_into(call, facts)
    if not written:
        return False
    branches = dict(call.where.branches)
    tests = [g.test for g in call.where.ifs if branches.get(id(g)) == "body"]
    child: cst.CSTNode = call.node
    for parent in facts.ancestors(call.node):
        if parent is call.where.statement:
            break
        if isinstance(parent, cst.IfExp) and child is parent.body:
            tests.append(parent.test)
        child = parent
    return any(_tests_dtype_is(test, dtype, written, call, facts) for test in tests)


def _written_into(call: CallSite, facts: AmpFacts) -> set[str]:
    """The tensors the cast's result is written into: the targets of its assignment, without
    `.data` (`p` of `p.data = ...`), or what it is copied into, there or later through the name it
    is assigned to (`p` of `p.data.copy_(x.half())`, of `value = value.half()` then
    `p.data.copy_(value)`)."""
    written = set()
    for holder in facts.ancestors(call.node):
        if isinstance(holder, cst.Call) and isinstance(holder.func, cst.Attribute) and holder.func.attr.value == "copy_":
            written.add(dotted_name(holder.func.value))
        if holder is call.where.statement:
            break
    statement = call.where.statement
    if isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[0], cst.Assign):
        targets = {dotted_name(target.target) for target in statement.body[0].targets}
        written |= targets
        # `value = value.bfloat16()`, then `p.data.copy_(value)` in the same function
        written |= {
            dotted_name(c.receiver) for c in call.scope.function_scope.calls
            if c.method == "copy_" and dotted_name(c.arg(0, None)) in targets and call.where.order < c.where.order
        }
    return {name.removesuffix(".data") for name in written if name}


def _tests_dtype_is(test: cst.BaseExpression, dtype: str, written: set[str], call: CallSite, facts: AmpFacts) -> bool:
    """`p.dtype == torch.float16` (either side) for a `p` written into, or one condition of an `and` that is."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return any(_tests_dtype_is(side, dtype, written, call, facts) for side in (test.left, test.right))
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and isinstance(test.comparisons[0].operator, cst.Equal)):
        return False
    sides = (test.left, test.comparisons[0].comparator)
    return any(
        isinstance(side, cst.Attribute) and side.attr.value == "dtype"
        and (dotted_name(side.value) or "").removesuffix(".data") in written
        and _low_precision_dtype(_possible_names(other, call.scope, facts)) == dtype
        for side, other in (sides, sides[::-1])
    )


def _literal(node: cst.BaseExpression | None) -> bool:
    """A number, or a list or tuple of literals (`[2.0]`, `[[1, 0], [0, 1]]`)."""
    if isinstance(node, cst.UnaryOperation):
        node = node.expression
    if isinstance(node, (cst.Integer, cst.Float)):
        return True
    return isinstance(node, (cst.List, cst.Tuple)) and all(_literal(element.value) for element in node.elements)


def _optimizer_arithmetic(call: CallSite, facts: AmpFacts) -> bool:
    """A cast in the methods of a torch.optim.Optimizer subclass, or in a function only they use
    (Muon's Newton-Schulz iteration, which `step()` reaches through a module-level table of
    backends): arithmetic on gradients and updates, written into the float32 parameters by the
    step. Neither the model nor its inputs change precision."""
    function = call.scope.function_scope
    if function.class_name is not None:
        return function.class_name in _optimizer_classes(facts)
    return function.kind == "function" and _used_only_by_optimizers(function.name, facts)


def _used_only_by_optimizers(name: str, facts: AmpFacts, depth: int = 0) -> bool:
    """Whether every in-file use of a name (a call, or a reference to it as a value) is in an
    Optimizer subclass, or in a module-level binding that holds it (`backends = dict(ns=ns_step)`)
    and is itself used only there."""
    uses = [r.where for r in facts.references if r.dotted == name] + [c.where for c in facts.calls if c.callee == name]
    if not uses:
        return False
    for where in uses:
        if where.scope.function_scope.class_name in _optimizer_classes(facts):
            continue
        holder = _module_level_binding(where, facts)
        if holder is None or depth >= names.CALL_DEPTH or not _used_only_by_optimizers(holder, facts, depth + 1):
            return False
    return True


def _module_level_binding(where: Context, facts: AmpFacts) -> str | None:
    """The one name a module-level statement binds (`BACKENDS` for `BACKENDS = dict(...)`)."""
    if where.scope is not facts.module_scope:
        return None
    bound = [a.key for a in facts.assignments if a.where.statement is where.statement and a.where.scope is facts.module_scope]
    return bound[0] if len(bound) == 1 else None


def _optimizer_classes(facts: AmpFacts) -> set[str]:
    """The classes of the file that subclass an optimizer class, directly or through one another."""
    return cached(facts, "AMP002 optimizer classes", lambda: facts.subclasses(lambda _base, qualified: _an_optimizer_class(qualified)))


def _an_optimizer_class(qualified: str | None) -> bool:
    """torch's, apex's, timm's or bitsandbytes' optimizer classes; not their schedulers."""
    return qualified is not None and qualified.startswith(names.TORCH_OPTIMIZER_PREFIXES) and "lr_scheduler" not in qualified


# apex's distributed optimizers, which keep float32 master shards of float16 parameters.
_MASTER_WEIGHT_OPTIMIZERS = ("apex.contrib.optimizers.distributed_fused_",)
# Mixed-precision LAMB optimizers, whatever module they come from: float32 master weights of float16
# parameters, and `_step_supports_amp_scaling`, so a GradScaler hands them its scale (NVIDIA's BERT
# `FusedLAMBAMP`, apex's `FusedMixedPrecisionLamb`).
_MASTER_WEIGHT_OPTIMIZER_NAMES = frozenset({"FusedLAMBAMP", "FusedMixedPrecisionLamb"})


def _master_weights_in_the_optimizer(call: CallSite, facts: AmpFacts) -> bool:
    """A cast in a function that builds an optimizer keeping float32 master weights
    (`FusedAdam(params, master_weights=True)`, apex's `DistributedFusedLAMB`, `FusedLAMBAMP`): pure float16
    training by design, where the optimizer, not autocast, keeps the precision of the updates and
    takes the loss scale itself."""
    return any(
        (c.qualname or "").startswith(_MASTER_WEIGHT_OPTIMIZERS)
        or (c.callee or "").rsplit(".", 1)[-1] in _MASTER_WEIGHT_OPTIMIZER_NAMES
        or (facts.value_kind(c.node, c.scope) == "optimizer" and _keeps_master_weights(c.arg(None, "master_weights"), c, facts))
        for c in call.scope.function_scope.calls
    )


_COPIES = (cst.List, cst.ListComp, cst.Tuple, cst.GeneratorExp)


def _keeps_master_weights(value: cst.BaseExpression | None, optimizer: CallSite, facts: AmpFacts) -> bool:
    """`master_weights=True`, or the float32 copies themselves, written there or bound to a name
    (`master_weights=masters`, Transformer Engine's FusedAdam); not a flag that may be False
    (`master_weights=args.master_weights`)."""
    if is_true(value) or isinstance(value, _COPIES):
        return True
    bound = facts.bindings(dotted_name(value), optimizer.scope) if isinstance(value, cst.Name) else []
    return bool(bound) and all(isinstance(held, _COPIES) for held, _scope in bound)


def _in_an_autograd_function(call: CallSite, facts: AmpFacts) -> bool:
    """A custom autograd.Function casting its own output (icefall's SwooshL, its softmax): kernel
    code, like a model's own casts."""
    owner = call.scope.function_scope.class_name
    return owner is not None and any(scope.name == owner and facts.is_autograd_function(scope, bases) for scope, bases in facts.classes)


def _opens_amp(call: CallSite) -> bool:
    return call.qualname in names.AUTOCAST or call.qualname in names.GRAD_SCALER


def _uses_amp(call: CallSite, facts: AmpFacts) -> bool:
    """A call that opens autocast or builds a GradScaler, runs in an autocast region, or uses a scaler."""
    return _opens_amp(call) or facts.innermost_autocast(call.where) is not None or facts.is_scaler(call.receiver_key, call.scope)


def _amp_anchors(facts: AmpFacts) -> dict[int, list[CallSite]]:
    """For the module and each function (by id), where it reaches AMP: its calls that use AMP
    and its calls of in-file functions that reach AMP, up to names.CALL_DEPTH calls deep, as the facts follow regions."""
    decorated = {id(f) for f in facts.functions if any(facts.decorator_autocast(d, f.parent or f) for d in f.decorators)}
    return _anchors(facts, "AMP002 amp anchors", lambda call: _uses_amp(call, facts), decorated)


def _training_anchors(facts: AmpFacts, backward_trains: bool) -> dict[int, list[CallSite]]:
    """The same for training: a GradScaler built, an optimizer stepped, and with `backward_trains`
    a backward (which gives float16 weights float16 gradients; for a float16 input it only computes
    the gradients a kernel test compares)."""
    backwards = {id(call) for call in rg.backwards(facts)} if backward_trains else set()

    def trains(call: CallSite) -> bool:
        return (
            id(call) in backwards
            or call.qualname in names.GRAD_SCALER
            or (call.method == "step" and facts.is_optimizer(call.receiver_key, call.scope))
        )

    return _anchors(facts, f"AMP002 training anchors {backward_trains}", trains, set())


def _anchors(facts: AmpFacts, key: str, direct_use, marked: set[int]) -> dict[int, list[CallSite]]:
    """For the module and each function, its calls that are a direct use (`direct_use`) and its
    calls of in-file functions that reach one (or that are `marked`), up to names.CALL_DEPTH deep."""

    def build():
        direct = {id(c) for c in facts.calls if direct_use(c)}
        helper = {id(c): id(f) for c in facts.calls if (f := facts.called_function(c)) is not None}
        reaching: set[int] = set()

        def reaches(call: CallSite) -> bool:
            return id(call) in direct or helper.get(id(call)) in reaching

        for _ in range(names.CALL_DEPTH):  # the functions with a direct use, then their callers, then theirs
            reaching |= {id(f) for f in facts.functions if id(f) in marked or any(reaches(c) for c in f.calls)}
        return {id(f): [c for c in f.calls if reaches(c)] for f in (facts.module_scope, *facts.functions)}

    return cached(facts, key, build)


def _test_that_does_not_train(call: CallSite, facts: AmpFacts) -> bool:
    """A cast in a test, or in a helper only tests call, that reaches no GradScaler and no
    optimizer step, nor a backward when a model is cast (a float16 or bfloat16 forward under
    autocast; apex's kernel tests running a reference model on a float16 input and comparing the
    gradients): a test runner runs each test by itself, so the module's other tests training does
    not make this one train."""
    anchors = _training_anchors(facts, backward_trains=not (_is_data(call, facts) or _handed_to_a_model(call, facts)))
    return not anchors[id(facts.module_scope)] and _only_in_tests_reaching_none(call.scope, anchors, facts)


def _handed_to_a_model(call: CallSite, facts: AmpFacts) -> bool:
    """A cast handed straight to a model's forward (`reference(ref_input.half())`): an input."""
    consumer = _handed_to(_outermost_method_call(call.node, facts), facts)
    return consumer is not None and facts.value_kind(consumer.func, call.scope) == "model"


def _test_reaches(test: Scope, anchors: dict[int, list[CallSite]], facts: AmpFacts) -> bool:
    """Whether the test, or a function defined in it, reaches one of `anchors`."""
    return any(anchors[id(f)] for f in facts.functions if _test_function(f) is test)


def _amp_only_in_other_branches(call: CallSite, facts: AmpFacts) -> bool:
    """A cast in one branch of an `if` whose function reaches AMP only in the other: BEiT's
    fine-tuning loop casts its inputs by hand for DeepSpeed's fp16 engine and opens autocast for
    native AMP, one or the other in a run (EVA tests `loss_scaler is None` once for the cast and
    again around the forward, and runs its frozen teacher under `no_grad` autocast in both). A
    GradScaler only built before the `if` meets no gradient there (DLRM builds it, then returns
    early from a float16 inference branch); its uses count. A cast before the `if` still runs into
    autocast."""
    return bool(_amp_uses(facts, call.scope.function_scope)) and not _meets_amp(facts, call.where)


def _amp_uses(facts: AmpFacts, function: Scope) -> list[CallSite]:
    """The function's AMP anchors that meet a cast on their path: not a GradScaler's construction,
    and not what runs under no_grad, unless that is all there is (a validation function under
    `@torch.no_grad()`)."""
    anchors = [a for a in _amp_anchors(facts)[id(function)] if a.qualname not in names.GRAD_SCALER]
    return [a for a in anchors if not rg.in_no_grad(facts, a)] or anchors


def _meets_amp(facts: AmpFacts, where: Context) -> bool:
    """Whether code at `where` runs on a path of its function that reaches AMP: not only in
    branches apart from every AMP use of it."""
    return any(
        not (mutually_exclusive(where, a.where) or facts.contradictory((where,), (a.where,)) or leaves_before(facts, where, a.where))
        for a in _amp_uses(facts, where.scope.function_scope)
    )


def _amp_off_whenever_the_cast_runs(call: CallSite, facts: AmpFacts) -> bool:
    """One run takes one path, across the module: a cast that runs only under a condition
    (`if args.full_bf16: model.bfloat16()`) when every autocast region and GradScaler of the module
    is enabled by a condition that fails there, so that no run both converts by hand and uses AMP:
    `enabled=not args.full_bf16`, or a test on a setting that an `assert` under the same condition
    pins (`if args.full_bf16: assert args.amp == "none"` against `autocast(...,
    enabled=args.amp != "none")` and `GradScaler(enabled=args.amp == "fp16")` in torchao's
    optimizer benchmark). Conditions are taken as written and not to change in between."""
    held, failed = facts.outcomes_at((call.where,))
    switches = _amp_switches(facts)
    if not (held or failed) or None in switches:
        return False  # the cast runs whatever the settings, or AMP may be on whatever they are
    held, failed, pinned = _with_asserted_settings(held, failed, call.scope.function_scope, facts)
    pinned = {**pinned, **_pinned_by_the_ifs_around(call, facts)}
    return all(
        is_false(enabled) or _setting_test_fails(enabled, scope, held, failed, pinned, facts) for enabled, scope in switches
    )


def _amp_switches(facts: AmpFacts) -> list[tuple[cst.BaseExpression, Scope] | None]:
    """When each autocast region the module opens and each GradScaler it builds is on: its
    `enabled=` and the tests of the `if`s (and conditional expression) it is written under, with
    the scope its names are read in; None for one that is on whenever its line runs, or whose
    switch is not read (a framework's `accelerator.autocast()`, `autocast(**kwargs)`)."""
    switches: list[tuple[cst.BaseExpression, Scope] | None] = []
    for region, where in facts.opening_places():
        if region is not None and region.enabled == "no":
            continue
        if region is None:
            switches.append(None)
            continue
        holder = facts.function_holding(region.node)
        # A decorator's arguments are evaluated where the decorated function is defined.
        decorates = isinstance(facts.parent_of.get(id(region.node)), cst.Decorator)
        when = all_of([*_guards(where, region.node, facts), region.enabled_when])
        switches.append(None if when is None else (when, (holder.parent or holder) if decorates else holder))
    for scaler in facts.calls:
        if scaler.qualname in names.GRAD_SCALER:
            when = all_of([*_guards(scaler.where, scaler.node, facts), scaler.arg(None, "enabled")])
            switches.append(None if when is None else (when, scaler.scope))
    return switches


def _guards(where: Context | None, node: cst.CSTNode, facts: AmpFacts) -> Iterator[cst.BaseExpression]:
    """What must hold for code at `where` to run: the test of each enclosing `if` whose body holds
    it, `not` the test of each whose `else` does (CoCoOp's `if prec == "amp": with autocast():`),
    and the test of a conditional expression with it in an arm (`GradScaler() if prec == "amp"
    else None`)."""
    if where is not None:
        yield from facts.branch_tests(where)
    parent = facts.parent_of.get(id(node))
    if isinstance(parent, cst.IfExp) and node is not parent.test:
        yield parent.test if node is parent.body else cst.UnaryOperation(cst.Not(), parent.test)


def _with_asserted_settings(
    held: frozenset[str], failed: frozenset[str], function: Scope, facts: AmpFacts
) -> tuple[frozenset[str], frozenset[str], dict[str, str]]:
    """The conditions known where code of `function` runs under `held`/`failed`, with what the
    asserts under a condition that holds there state (`if args.full_bf16: assert args.amp ==
    "none"`), and the settings those asserts pin to a string (`args.amp` to "none"): a run that
    gets past them has those settings. Only asserts of `function` and of module-level code (a
    script's `__main__` block) are read: the ones that always run before it or in it, and the ones
    the staged analysis keeps with it."""
    held, failed = set(held), set(failed)
    pinned: dict[str, str] = {}
    for where, branch_held, branch_failed, asserted in _asserts_by_branch(facts):
        if where not in (function, facts.module_scope) or not (branch_held <= held and branch_failed <= failed):
            continue  # not known to hold wherever the cast runs
        for operand in asserted:
            text, positive = facts.condition(operand)
            (held if positive else failed).add(text)
        pinned.update(_pinned_by(asserted, facts))
    return frozenset(held), frozenset(failed), pinned


def _pinned_by_the_ifs_around(call: CallSite, facts: AmpFacts) -> dict[str, str]:
    """The settings the `if`s whose body holds the cast compare equal to a string (CoCoOp's `if
    cfg.PREC == "fp16": model.half()`): there the setting has that value, so a switch testing it
    for another (`enabled=cfg.PREC == "amp"`) is off."""
    pinned = {}
    for guard in call.where.ifs:
        if (id(guard), "body") in call.where.branches:
            pinned.update(_pinned_by(and_operands(guard.test), facts))
    return pinned


def _pinned_by(operands: Iterable[cst.BaseExpression], facts: AmpFacts) -> dict[str, str]:
    """The settings these `and`ed operands compare equal to a string (`cfg.PREC == "fp16"`), by
    their code."""
    pinned = {}
    for operand in operands:
        comparison = _string_comparison(operand)
        if comparison is not None and comparison[2]:
            pinned[facts.module.code_for_node(comparison[0])] = comparison[1]
    return pinned


def _asserts_by_branch(facts: AmpFacts) -> list[tuple[Scope, frozenset[str], frozenset[str], list[cst.BaseExpression]]]:
    """For each branch of an `if` with `assert`s written directly in it: the function holding it,
    the conditions that hold and fail there, and the operands of the `and`s the asserts require."""

    def build():
        found = []
        for node_id, test in facts.if_tests.items():
            statement = facts.parent_of.get(id(test))
            if not isinstance(statement, cst.If):
                continue
            branches = [(statement.body, "body")]
            if isinstance(statement.orelse, cst.Else):
                branches.append((statement.orelse.body, "else"))
            for block, label in branches:
                asserted = list(_asserted_operands(block))
                branch_held, branch_failed = facts.outcomes_of(((node_id, label),))
                if asserted and (branch_held or branch_failed):
                    found.append((facts.function_holding(statement), branch_held, branch_failed, asserted))
        return found

    return cached(facts, "AMP002 asserts by branch", build)


def _asserted_operands(block: cst.BaseSuite) -> Iterator[cst.BaseExpression]:
    """The operands of the `and`s each `assert` written directly in a block requires."""
    lines = block.body if isinstance(block, cst.IndentedBlock) else [block]
    for line in lines:
        if isinstance(line, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            yield from (part for small in line.body if isinstance(small, cst.Assert) for part in and_operands(small.test))


def _string_comparison(expr: cst.BaseExpression) -> tuple[cst.BaseExpression, str, bool] | None:
    """`setting == "value"` or `setting != "value"`: the setting, the string, and whether it is `==`."""
    if not (isinstance(expr, cst.Comparison) and len(expr.comparisons) == 1):
        return None
    (target,) = expr.comparisons
    value = string_literal(target.comparator)
    if value is None or not isinstance(target.operator, (cst.Equal, cst.NotEqual)):
        return None
    return expr.left, value, isinstance(target.operator, cst.Equal)


def _setting_test_fails(
    enabled: cst.BaseExpression,
    scope: Scope,
    held: frozenset[str],
    failed: frozenset[str],
    pinned: dict[str, str],
    facts: AmpFacts,
) -> bool:
    """Whether an `enabled=` test is false where `held` hold and `failed` fail, its comparisons of a
    pinned setting with a string decided by the setting's value (`args.amp == "fp16"` fails where
    `args.amp` is "none")."""
    held, failed = set(held), set(failed)
    for operand in _comparisons_in(enabled):
        comparison = _string_comparison(operand)
        value = _pinned_value(comparison[0], scope, pinned, facts) if comparison is not None else None
        if value is not None:
            text, _ = facts.condition(operand)  # `a != b` is written as `a == b`, negated
            (held if value == comparison[1] else failed).add(text)
    return facts.fails(enabled, frozenset(held), frozenset(failed))


def _comparisons_in(expr: cst.BaseExpression) -> Iterator[cst.Comparison]:
    """The comparisons a test combines with `and`, `or` and `not`."""
    if isinstance(expr, cst.BooleanOperation):
        yield from _comparisons_in(expr.left)
        yield from _comparisons_in(expr.right)
    elif isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
        yield from _comparisons_in(expr.expression)
    elif isinstance(expr, cst.Comparison):
        yield expr


def _pinned_value(
    setting: cst.BaseExpression, scope: Scope, pinned: dict[str, str], facts: AmpFacts, depth: int = 0
) -> str | None:
    """The string a setting is pinned to: itself, or for a parameter of a factory that keeps it
    (`def get_amp_ctx(amp, device): return torch.autocast(device, enabled=amp != "none")`), what
    every call of it in the file passes, up to names.CALL_DEPTH calls away."""
    wanted = _setting_key(facts.module.code_for_node(setting))
    value = next((v for text, v in pinned.items() if _setting_key(text) == wanted), None)
    if value is not None or depth >= names.CALL_DEPTH:
        return value
    function = scope.function_scope
    if isinstance(setting, cst.Name) and setting.value not in function.params:
        # A local copy (`prec = self.cfg.PREC`, then `if prec == "amp":`): what it was set to, if set once.
        bound = facts.bindings(setting.value, scope)
        if len(bound) == 1 and bound[0][1].function_scope is function:
            return _pinned_value(bound[0][0], function, pinned, facts, depth + 1)
        return None
    if not isinstance(setting, cst.Name):
        return None
    if any(a.key == setting.value and a.where.scope.function_scope is function for a in facts.assignments):
        return None  # rebound (`amp = amp.lower()`): no longer what the callers pass
    values = {
        _pinned_value(passed, caller.scope, pinned, facts, depth + 1) if passed is not None else None
        for caller, passed in facts.passed_for(function, setting.value)
    }
    return values.pop() if len(values) == 1 else None


def _setting_key(text: str) -> str:
    """A setting as a constructor reads it and as its methods do: `cfg.PREC` is `self.cfg.PREC`."""
    return text.removeprefix("self.").removeprefix("cls.")


def _test_function(scope: Scope) -> Scope | None:
    """The test (`def test_...`, a function or a method) a scope belongs to, if any."""
    while scope is not None:
        if scope.kind == "function" and names.names_a_test(scope.name):
            return scope
        scope = scope.parent
    return None


# Functions that time or profile what they are given (ultralytics' `profile_ops`, a `benchmark`).
_MEASURES_SPEED = re.compile(r"profil|benchmark|timing|throughput")


def _speed_measurement(call: CallSite, facts: AmpFacts) -> bool:
    """A cast in a function that measures speed and reaches no autocast, no GradScaler and no
    optimizer step (ultralytics' `profile_ops` casts each op to the input's float16 and times its
    forward and backward): nothing there trains, whatever the module's training loop does."""
    function = call.scope.function_scope
    return (
        function.kind == "function"
        and bool(_MEASURES_SPEED.search(function.name.lower()))
        and not _amp_anchors(facts)[id(function)]
        and not _training_anchors(facts, backward_trains=False)[id(function)]
    )


def _test_without_amp(call: CallSite, facts: AmpFacts) -> bool:
    """A conversion in a test that reaches no autocast and no GradScaler, itself or through the
    functions it calls: a test runner runs each test by itself (timm's suite casts a module to
    float16 in one test and checks autocast in the next; peft's bfloat16 forward tests sit beside
    a `_test_model` helper that opens autocast for others). AMP at module level is every test's."""
    return not any(_opens_amp(c) for c in facts.module_scope.calls) and _only_in_tests_reaching_none(
        call.scope, _amp_anchors(facts), facts
    )


def _only_in_tests_reaching_none(scope: Scope, anchors: dict[int, list[CallSite]], facts: AmpFacts, depth: int = 0) -> bool:
    """Whether code in `scope` runs only in tests that reach none of `anchors`: it is in one, or in
    a function of the file that reaches none itself and that only such tests call, up to
    names.CALL_DEPTH calls away (xformers' `_get_model_blocks(..., dtype)`, building float16 blocks
    for two tests that never open autocast). A function also used as a value may run anywhere."""
    test = _test_function(scope)
    if test is not None:
        return not _test_reaches(test, anchors, facts)
    function = scope.function_scope
    if function.kind != "function" or depth >= names.CALL_DEPTH or anchors[id(function)]:
        return False
    callers = facts.callers(function)
    passed_as_a_value = facts.named_as_a_value(function)
    return bool(callers) and not passed_as_a_value and all(
        _only_in_tests_reaching_none(site.scope, anchors, facts, depth + 1) for site in callers
    )


def _frozen(call: CallSite, facts: AmpFacts) -> bool:
    """A module frozen in the same function before or after its cast (`vae.requires_grad_(False)`,
    `vae = AutoencoderKL.from_pretrained(...).requires_grad_(False).half()`, `p.requires_grad =
    False` for its parameters): no gradient, no optimizer state, nothing for a GradScaler to
    unscale. The module is named by the chain the cast is in, or by the name it is assigned to.
    A module frozen by a flag (`.requires_grad_(args.train_text_encoder)`) counts where the cast
    runs only when that flag fails (`if not args.train_text_encoder:`)."""
    chain = _same_object_chain(call, facts)
    if any(_freezes(node, call.where, facts) for node in chain):
        return True
    subjects = {_subject(call, facts)} | _names_bound_to(chain[-1], facts)
    subjects.discard(None)
    return _frozen_module(subjects, call.where, facts)


def _subject(call: CallSite, facts: AmpFacts) -> str | None:
    """What a conversion converts, as `_converted` names it or, for an entry of a container, as
    written: `x["model"]` of ultralytics' `strip_optimizer`, a checkpoint's model."""
    converted = rg.chain_below(call)[1]
    if isinstance(converted, cst.Subscript):
        return facts.module.code_for_node(converted)
    return _converted(call)


def _frozen_module(subjects: set[str], where: Context, facts: AmpFacts) -> bool:
    """Whether the function of `where` freezes a module known by one of `subjects`, for the runs
    that reach `where`."""
    function = where.scope.function_scope
    for other in function.calls:
        if not _freezes(other.node, where, facts):
            continue
        if _subject(other, facts) in subjects:  # `teacher.requires_grad_(False)`, `teacher.eval().requires_grad_(False)`
            return True
        if any(a.key in subjects and a.value is other.node for a in facts.assignments):
            return True
    return any(
        a.key.endswith(".requires_grad")
        and is_false(a.value)
        and a.where.scope.function_scope is function
        and any(re.search(rf"(?<![\w.]){re.escape(subject)}\.parameters\(\)", loop.iterable) for subject in subjects for loop in a.where.loops)
        for a in facts.assignments
    )


def _base_of_a_peft_model(call: CallSite, facts: AmpFacts) -> bool:
    """A module cast and handed to peft (`get_peft_model(base.to(torch.bfloat16), config)`, or by
    the name it is known by): peft freezes the base and trains float32 adapters, as for a base
    loaded in low precision (`_adapts_a_frozen_base`)."""
    outermost = _same_object_chain(call, facts)[-1]
    consumer = _handed_to(outermost, facts)
    if consumer is not None and _is_peft(facts.qualname(consumer.func, call.scope)):
        return True
    subjects = {_converted(call)} | _names_bound_to(outermost, facts)
    subjects.discard(None)
    return any(
        _is_peft(other.qualname) and any(dotted_name(a.value) in subjects for a in other.node.args)
        for other in call.scope.function_scope.calls
    )


def _is_peft(qualified: str | None) -> bool:
    return (qualified or "").split(".")[0] == "peft"


def _input_of_a_frozen_module(call: CallSite, facts: AmpFacts) -> bool:
    """A tensor cast and handed straight to a module frozen in the same function
    (`vae.encode(batch["pixel_values"].to(weight_dtype))`, diffusers' frozen VAE kept in the
    weight dtype): the cast matches the frozen module's weights, and no gradient flows into it."""
    consumer = _handed_to(_outermost_method_call(call.node, facts), facts)
    if consumer is None:
        return False
    # `vae.encode(x)` or `self.text_encoder(x)`: the module is the callee or what it is a method of.
    called = {dotted_name(consumer.func)}
    if isinstance(consumer.func, cst.Attribute):
        called.add(dotted_name(consumer.func.value))
    called.discard(None)
    return bool(called) and _frozen_module(called, call.where, facts)


def _input_of_a_model_in_its_dtype(call: CallSite, facts: AmpFacts, dtype: str) -> bool:
    """A tensor cast outside every autocast region and handed straight to a converted copy of a
    model, which is not flagged (see _off_graph), in that dtype (torchao's test: `model2 =
    copy.deepcopy(model1).bfloat16()`, then `model2(x.bfloat16())` beside the autocast run of
    `model1`): the input must match the weights of a twin that runs without autocast. An input of
    the trained model converted by hand is flagged with it: dropping one cast alone breaks the call."""
    if facts.region_of(call.where) is not None:
        return False
    consumer = _handed_to(_outermost_method_call(call.node, facts), facts)
    name = dotted_name(consumer.func) if consumer is not None else None
    if name is None:
        return False
    function = call.scope.function_scope
    converted_values = {id(a.value) for a in facts.assignments if a.key == name and a.where.scope.function_scope is function}
    return any(
        (id(other.node) in converted_values or _converted(other) == name)
        and low_precision_target(other, facts) == dtype
        and _off_graph(other, facts)
        for other in function.calls
        if other is not call
    )


def _handed_to(node: cst.CSTNode, facts: AmpFacts) -> cst.Call | None:
    """The call `node` is an argument of (`val.run(model=node)`), if any."""
    argument_node = facts.parent_of.get(id(node))
    consumer = facts.parent_of.get(id(argument_node)) if isinstance(argument_node, cst.Arg) else None
    return consumer if isinstance(consumer, cst.Call) else None


def _used_only_without_gradients(call: CallSite, facts: AmpFacts) -> bool:
    """A model bound here whose every use in the function that could run or train it is under
    `torch.no_grad()` or `inference_mode()` (a DPO reference model next to the policy it is compared
    with; a text encoder loaded in bfloat16, `.get_decoder()` taken, sharded by
    `text_encoder = FSDP(text_encoder)` and printed, that only encodes prompts): no gradient ever
    reaches its low-precision weights. The model is followed through the names that hold it, the
    calls that hand it on (`_hands_on`), and the module converted in place (`ref = policy.half()`
    converts `policy` too); `type(m)` or `print(m)` only look at it."""
    subjects = _names_bound_to(_model_after(call.node, facts), facts)
    if not subjects:
        return False
    if call.method != "from_pretrained":  # there the receiver is a class, not the model
        subjects.add(_converted(call))
    subjects.discard(None)
    function = call.scope.function_scope
    while True:  # names the model is handed on to hold it as well
        handed = [c for c in function.calls if _hands_on(c, subjects, facts)]
        held = set().union(*(_names_bound_to(_model_after(c.node, facts), facts) for c in handed))
        if held <= subjects:
            break
        subjects |= held
    # The conversion itself is a use when it converts a module known by name: in place, so code the
    # function does not show may train that module (`model = self.model`, then `model =
    # model.to(torch.float16)` in an evaluation that the training loop calls).
    runs = [
        c for c in function.calls
        if _reads_a_subject(c, subjects) and (c is call or not _hands_on(c, subjects, facts)) and not _only_inspects(c, facts)
    ]
    if runs and all(rg.in_no_grad(facts, c) for c in runs):
        return True
    return _attribute_run_only_without_gradients(call, subjects, function, facts)


def _attribute_run_only_without_gradients(call: CallSite, subjects: set[str], function: Scope, facts: AmpFacts) -> bool:
    """A model kept on `self` by the method that converts it, and run by the class's methods only
    under `torch.no_grad()` (Amphion's feature extractor: `self.encoder =
    self.encoder.to(torch.bfloat16)`, used in a `@torch.no_grad()` method): no gradient reaches its
    weights. Every use of the attribute in the class's methods counts, its parameters handed to an
    optimizer included; what the converting method does with it besides converting it too."""
    attributes = {s for s in subjects if s.startswith("self.")}
    if not attributes or function.class_name is None:
        return False
    uses = [
        c for c in facts.calls
        if c.scope.function_scope.class_name == function.class_name and _reads_a_subject(c, attributes) and not _only_inspects(c, facts)
        and not (c.scope.function_scope is function and (c is call or _hands_on(c, attributes, facts)))
    ]
    return bool(uses) and all(rg.in_no_grad(facts, c) for c in uses)


def _made_here_and_used_only_without_gradients(call: CallSite, facts: AmpFacts) -> bool:
    """A tensor the function made from a shape (`dummy = torch.zeros(1, 3, h, w)`), cast by hand,
    then only read under no_grad or inference_mode (ultralytics' compile warm-up): no gradient
    flows through it. A tensor cast in place of a batch that trains stays reported."""
    converted = rg.chain_below(call)[1]
    if not isinstance(converted, cst.Name):
        return False
    before = _value_before(call, converted.value, facts)
    made = _taken_from(before) if before is not None else None
    if not (isinstance(made, cst.Call) and facts.qualname(made.func, call.scope) in _TENSOR_FACTORIES):
        return False
    holders = _names_bound_to(_outermost_method_call(call.node, facts), facts)
    function = call.scope.function_scope
    reads = [
        r for r in facts.references
        if r.dotted.split(".")[0] in holders and r.where.scope.function_scope is function and r.where.order > call.where.order
    ]
    return bool(holders and reads) and all(rg.in_no_grad_at(facts, r.node, r.where) for r in reads)


def _reads_a_subject(call: CallSite, subjects: set[str]) -> bool:
    """A call of the model or a part of it (`ref(x)`, `ref.encoder(x)`, `ref.parameters()` for an
    optimizer), or a call it is passed to (`encode(ref, ids)`)."""
    keys = [call.callee, call.receiver_key, *(dotted_name(a.value) for a in call.node.args)]
    return any(_names_or_a_part_of(key, subject) for key in keys for subject in subjects)


# Methods that return a part of a module: of a model loaded and cut on the spot
# (`AutoModelForCausalLM.from_pretrained(...).get_decoder()`), the part is all that is kept.
_SUBMODULE_GETTERS = frozenset({"get_decoder", "get_encoder", "get_submodule", "get_input_embeddings", "get_output_embeddings"})


def _hands_on(call: CallSite, subjects: set[str], facts: AmpFacts) -> bool:
    """A call that gives the model back rather than running it: a method returning the module or a
    submodule (`ref.cuda()`, `ref.eval()`, `ref.get_encoder()`), or a wrapper of it
    (`ref = FSDP(ref)`, `ref = accelerator.prepare(ref)`), when what it gives back is bound to
    names that are followed in turn, or dropped. A model handed on anywhere else
    (`DDP(ref)(x)`, `ref, opt = accelerator.prepare(ref, opt)`) counts as run."""
    if call.method in rg.SAME_OBJECT | _SUBMODULE_GETTERS:
        handed = any(_names_or_a_part_of(call.receiver_key, subject) for subject in subjects)
    else:
        handed = bool(call.node.args) and dotted_name(call.node.args[0].value) in subjects and _wraps(call, facts)
    if not handed:
        return False
    given_back = _model_after(call.node, facts)
    return isinstance(facts.parent_of.get(id(given_back)), cst.Expr) or bool(_names_bound_to(given_back, facts))


def _model_after(node: cst.Call, facts: AmpFacts) -> cst.Call:
    """The outermost expression that still holds the module a call gives: past the methods chained
    on it that return it or a part of it (`.get_decoder().cuda()`) and the wrappers it is handed
    straight to (`DDP(Net().half().cuda())`)."""
    while True:
        node = [node, *_methods_called_on(node, facts, rg.SAME_OBJECT | _SUBMODULE_GETTERS)][-1]
        wrapper = _handed_to(node, facts)
        site = facts.call_site(wrapper)
        if site is None or wrapper.args[0].value is not node or not _wraps(site, facts):
            return node
        node = wrapper


def _wraps(call: CallSite, facts: AmpFacts, depth: int = 0) -> bool:
    """A wrapper of the module it is given first: torch's (`FSDP(m)`, `torch.compile(m)`), a
    training framework's (`accelerator.prepare(m)`), or a function of the file whose every return
    is one applied to one of its parameters (`def setup_fsdp(model): model = FSDP(model, ...);
    return model`), up to names.CALL_DEPTH calls deep."""
    if call.qualname in names.MODULE_WRAPPERS:
        return True
    if call.method in names.FRAMEWORK_WRAPPING_METHODS and facts.is_framework_object(call.receiver_key, call.scope):
        return True
    helper = facts.called_function(call)
    if helper is None or not helper.returns or depth >= names.CALL_DEPTH:
        return False
    returned = []
    for expr in helper.returns:  # `return FSDP(model)`, or `return model` after `model = FSDP(model)`
        returned.extend([value for value, _ in facts.bindings(dotted_name(expr), helper)] or [expr])
    sites = [facts.call_site(value) for value in returned]
    return all(
        site is not None and site.node.args and dotted_name(site.node.args[0].value) in helper.params and _wraps(site, facts, depth + 1)
        for site in sites
    )


def _only_inspects(call: CallSite, facts: AmpFacts) -> bool:
    """`type(m)`, `isinstance(m, FSDP)`, `print(m)`: nothing runs or trains the module."""
    return (
        call.callee in names.INSPECTION_BUILTINS
        and call.scope.resolve_head(call.callee) is None
        and facts.called_function(call) is None
    )


def _names_bound_to(node: cst.CSTNode, facts: AmpFacts) -> set[str]:
    """The names and attributes assigned the value of `node` (`teacher = Net().half()`)."""
    return {a.key for a in facts.assignments if a.value is node}


def _same_object_chain(call: CallSite, facts: AmpFacts) -> list[cst.Call]:
    """The calls of `x.to(device).half().eval()` around a cast, innermost first, outermost last."""
    return [*rg.chain_below(call)[0], call.node, *_methods_called_on(call.node, facts, rg.SAME_OBJECT)]


def _freezes(node: cst.Call, where: Context, facts: AmpFacts) -> bool:
    """`requires_grad_(False)`, or `requires_grad_(flag)` seen from code that runs only when `flag` fails."""
    if not (isinstance(node.func, cst.Attribute) and node.func.attr.value == "requires_grad_"):
        return False
    flag = argument(node, 0, "requires_grad")
    return is_false(flag) or dotted_name(flag) in facts.failed_conditions(where)


def _converted(call: CallSite) -> str | None:
    """The name of what a conversion converts: `teacher` in `teacher.to(device).half()`."""
    return dotted_name(rg.chain_below(call)[1])


def _may_scale(facts: AmpFacts) -> bool:
    """A GradScaler that can be on: one built with `enabled=False` scales nothing, and a file
    whose only one is off (a fairseq-style fp16 optimizer keeps float32 master weights) is not
    mixed-precision code."""
    return any(c.qualname in names.GRAD_SCALER and not is_false(c.arg(None, "enabled")) for c in facts.calls)


def check(facts: AmpFacts) -> Iterator[Hit]:
    opens_autocast = facts.has_enabled_autocast
    if not (opens_autocast or _may_scale(facts)) or not rg.trains(facts):
        return
    uses = "autocast" if opens_autocast else "a GradScaler"
    for call in facts.calls:
        dtype = low_precision_target(call, facts)
        if (
            dtype is None
            or _is_export(call, facts)
            or _off_graph(call, facts)
            or _checkpoint_surgery(call, facts)
            or _compared(call, facts)
            or _kernel_cast_in_model(call, facts)
            or _in_an_autograd_function(call, facts)
            or _optimizer_arithmetic(call, facts)
            or _master_weights_in_the_optimizer(call, facts)
            or _created_in_low_precision(call, facts)
            or _only_to_a_dtype_already_held(call, facts, dtype)
            or _cast_back_on_return(call, facts)
            or _input_for_a_frozen_model(call, facts)
            or _fresh_model_for_evaluation(call, facts)
            or _outside_training(call, facts)
            or _frozen(call, facts)
            or _base_of_a_peft_model(call, facts)
            or _input_of_a_frozen_module(call, facts)
            or _input_of_a_model_in_its_dtype(call, facts, dtype)
            or _used_only_without_gradients(call, facts)
            or _made_here_and_used_only_without_gradients(call, facts)
            or _upstream_gradient(call, facts)
            or _stored_in_a_buffer(call, facts)
            or _test_without_amp(call, facts)
            or _speed_measurement(call, facts)
            or _test_that_does_not_train(call, facts)
            or _amp_only_in_other_branches(call, facts)
            or _amp_off_whenever_the_cast_runs(call, facts)
        ):
            continue
        subject = _converted(call) or (facts.module.code_for_node(call.receiver) if call.receiver is not None else "value")
        if len(subject) > 40:
            subject = subject[:37] + "..."
        if call.method == "from_pretrained":
            what = f"`{subject}.from_pretrained(...)` loads the model in {dtype}"
        else:
            what = f"`{subject}` is converted to {dtype} by hand"
        yield Hit(call.node, f"{what} in code that uses {uses}; {_advice(call, facts)}", call.where.statement)


# Names of the tensors a step feeds the model (`inps`, `targets`, `batch["pixel_values"]`), as
# whole words of the converted expression; anything else converted is taken for the model.
_DATA_WORD = re.compile(
    r"^(?:inps?|inputs?|input_ids|images?|imgs?|targets?|labels?|batch|samples?|x|y|xb|yb|tokens?|masks?|"
    r"audio|wavs?|pixel_values|coords?|boxes|bboxe?s?|tensor|randn?|zeros|ones|empty|full|arange)$"
)


def _is_data(call: CallSite, facts: AmpFacts) -> bool:
    """What is converted is a batch, not a model: named like one (`inputs`, `x`, `labels`), or a
    name bound by iterating over data (`for numerical_features, click in data_loader:`)."""
    if call.method == "from_pretrained" or facts.value_kind(call.receiver, call.scope) == "model":
        return False
    if _converts_parameter_storage(call, facts):
        return False
    converted = rg.chain_below(call)[1]
    text = facts.module.code_for_node(converted) if converted is not None else ""
    if any(_DATA_WORD.match(word) for word in re.findall(r"[A-Za-z_]\w*", text.lower())):
        return True
    if isinstance(converted, cst.Name) and _checked_to_be_a_tensor(converted.value, call, facts):
        return True
    # `hint` of `hint = batch["hint"].cuda()`, also as what a module makes of it (`self.vae.encode(hint)`)
    return bool(set(re.findall(r"[A-Za-z_]\w*", text)) & _batch_names(facts, call.scope.function_scope))


# `p.data`, `layer.weight`, `layer.bias`: a parameter's tensor, whatever its owner is called.
_PARAMETER_STORAGE = re.compile(r"\.(?:data|weight|bias)\b")


def _converts_parameter_storage(call: CallSite, facts: AmpFacts) -> bool:
    """A cast of a parameter's tensor (`p.data.half()`, `layer.weight.half()`), of a name last
    bound to one (`tensor = param.data`), or written back into one (`param.data =
    tensor.to(torch.bfloat16)` in SimpleTuner's trainer): assigning to `.data` replaces a
    parameter's storage in place, converting the model's weights; inputs are rebound, never
    written through `.data`."""
    converted = rg.chain_below(call)[1]
    sources = [converted] if converted is not None else []
    bound = facts.reaching_assignment(dotted_name(converted), call.where) if isinstance(converted, cst.Name) else None
    if bound is not None:
        sources.append(bound.value)
    if any(_PARAMETER_STORAGE.search(facts.module.code_for_node(source)) for source in sources):
        return True
    statement = facts.parent_of.get(id(_outermost_method_call(call.node, facts)))
    return isinstance(statement, cst.Assign) and any(
        isinstance(target.target, cst.Attribute) and target.target.attr.value == "data" for target in statement.targets
    )


def _checked_to_be_a_tensor(name: str, call: CallSite, facts: AmpFacts) -> bool:
    """`t.half() if isinstance(t, torch.Tensor) else t`, or under `if isinstance(t, Tensor):`: a
    module is never a Tensor."""
    checked = re.compile(rf"isinstance\(\s*{re.escape(name)}\s*,\s*(?:torch\.)?Tensor\b")
    tests = [node.test for node in facts.ancestors(call.node) if isinstance(node, (cst.IfExp, cst.If))]
    return any(checked.search(facts.module.code_for_node(test)) for test in tests)


# What a loop over batches iterates: `loader`, `train_dataloader`, `enumerate(data)`, `batches`.
_DATA_SOURCE = re.compile(r"load|data|batch|prefetch")


def _batch_names(facts: AmpFacts, function: Scope) -> set[str]:
    """The names a function's loops over data bind, its `batch` parameter (a step hook's), and
    the names taken from them (`videos, masks = batch`, `images = batch["image"].cuda()`)."""

    def build():
        table: dict[int, set[str]] = {}
        for target, where in facts.loop_targets:
            if _DATA_SOURCE.search(where.loops[-1].iterable.lower()):
                bound = table.setdefault(id(where.scope.function_scope), set())
                bound.update(n.value for n in _names_in(target))
        for function in facts.functions:
            if isinstance(function.node, cst.FunctionDef) and any(param.name.value == "batch" for param in function.node.params.params):
                table.setdefault(id(function), set()).add("batch")
        for assignment in [*facts.unpackings, *facts.assignments]:
            bound = table.get(id(assignment.where.scope.function_scope))
            value = _taken_from(assignment.value)
            if bound and isinstance(value, cst.Name) and value.value in bound:
                bound.add(assignment.key)
        return table

    return cached(facts, "AMP002 batch names", build).get(id(function), set())


def _taken_from(value: cst.BaseExpression) -> cst.BaseExpression:
    """What a value is read out of, past moves and casts: `batch` for `batch["hint"].cuda()`."""
    while True:
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in rg.SAME_OBJECT:
            value = value.func.value
        elif isinstance(value, cst.Subscript):
            value = value.value
        else:
            return value


def _names_in(target: cst.BaseExpression) -> Iterator[cst.Name]:
    if isinstance(target, cst.Name):
        yield target
    elif isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            yield from _names_in(element.value)


def _computed_in_the_step(call: CallSite, facts: AmpFacts) -> bool:
    """What is converted is a value the step computed, not a model: a name last bound, in this
    function, to arithmetic, to what a torch function or a function named for a computation
    returns (RVC's `y_hat_mel = mel_spectrogram_torch(...)`, then `y_hat_mel = y_hat_mel.half()`
    to match its target) or to a model's outputs."""
    converted = rg.chain_below(call)[1]
    if not isinstance(converted, cst.Name):
        return False
    value = _value_before(call, converted.value, facts)
    value = _taken_from(value) if value is not None else None
    if isinstance(value, (cst.BinaryOperation, cst.UnaryOperation)):
        return True
    if not isinstance(value, cst.Call) or facts.value_kind(value, call.scope) is not None:
        return False
    if facts.value_kind(value.func, call.scope) == "model":
        return True  # a model's outputs
    qualified = facts.qualname(value.func, call.scope) or ""
    if qualified.startswith("torch."):
        return not qualified.startswith("torch.nn.") or qualified.startswith("torch.nn.functional.")
    # A function named for what it computes (`mel_spectrogram_torch(y_hat, ...)`), not a class nor
    # a builder or loader of modules (`build_model(cfg)`, `get_encoder()`).
    function = (dotted_name(value.func) or "").rsplit(".", 1)[-1]
    return function[:1].islower() and not _BUILDS_MODULES.search(function.lower())


_BUILDS_MODULES = re.compile(r"model|net|module|layer|block|encoder|decoder|build|create|make|load|init|setup|wrap|prepare|get_|from_")


def _value_before(call: CallSite, name: str, facts: AmpFacts) -> cst.BaseExpression | None:
    """The value `name` was last bound to, in the cast's function, before the cast's statement
    (`x = x.half()` converts the x bound before it)."""
    bound = facts.reaching_assignment(name, call.where)
    if bound is not None and bound.where.statement is call.where.statement:
        bound = facts.reaching_assignment(name, bound.where)
    return bound.value if bound is not None else None


_ROUNDED_FOR_THE_FLOAT32_OPS = (
    "the ops it keeps in float32 (losses, reductions, normalisation) would otherwise start from values already "
    "rounded (float16 keeps about 3 significant digits, bfloat16 about 2)"
)


def _advice(call: CallSite, facts: AmpFacts) -> str:
    """A model's float16 weights break the scaler; inputs and computed values cost precision in
    the ops autocast keeps in float32."""
    if _is_data(call, facts):
        return f"keep inputs and targets in float32 and let autocast cast per op: {_ROUNDED_FOR_THE_FLOAT32_OPS}"
    if _computed_in_the_step(call, facts):
        return f"leave computed values in the dtype autocast gives each op: {_ROUNDED_FOR_THE_FLOAT32_OPS}"
    return (
        "keep the model and inputs in float32 and let autocast choose per-op dtypes (a GradScaler "
        "cannot unscale float16 gradients, and low-precision weights lose small updates)"
    )
