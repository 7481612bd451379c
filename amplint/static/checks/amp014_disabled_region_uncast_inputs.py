"""AMP014 disabled-region-uncast-inputs: an `autocast(enabled=False)` block uses tensors made under autocast."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst

from amplint.static import names
from amplint.static.checks import Hit
from amplint.static.checks import _training_step as ts
from amplint.static.semantics import AmpFacts, Assignment, Autocast, Context, dotted_name, identifiers, mutually_exclusive

CODE = "AMP014"

_CASTS = {"float", "double", "to", "type", "cpu"}
# Reading these feeds no op a low-precision input: metadata, a Python number, or the start of a
# backward pass (`inner_loss.backward()` computes nothing in the disabled region's dtype).
_NOT_AN_INPUT = {"shape", "dtype", "device", "ndim", "size", "dim", "numel", "item", "backward", *names.VALUE_INSPECTIONS}
# Calls that look at what they are given without computing with it: `torch.equal(out, ref)`,
# `torch.isfinite(h)`, `type(out)`.
_LOOKS_AT = names.VALUE_INSPECTIONS | {"type", "isinstance", "id", "len"}
# Values that are not low-precision tensors: sizes, Python numbers, casts to float32, metadata.
_NOT_A_TENSOR = re.compile(
    r"\.(shape|dtype|device|ndim|size\(|item\(|float\(\)|double\(\)|numel\(|dim\(|tolist\()|\.to\([^)]*float(32|64)?\b|"
    r"^\s*(len|int|float|bool|str|range|tuple|list|dict)\(|^\s*[\d.\"']|^\s*(True|False|None)\b"
)


@dataclass(frozen=True)
class _Block:
    """Where autocast is off: a `with` item's body, or what follows `stack.enter_context(...)`
    in the body of `with ExitStack() as stack:`."""

    node: cst.CSTNode  # what opens it, where the finding points
    where: Context  # where it is opened
    item: cst.WithItem  # the `with` item whose body holds it
    after: int = -1  # for an ExitStack: the order of the enter_context call

    def holds(self, context: Context) -> bool:
        return any(w is self.item for w in context.withs) and context.order > self.after


def _disabled_blocks(facts: AmpFacts) -> Iterator[_Block]:
    for item, where in facts.with_items:
        # `with torch.autocast(..., enabled=False):`, or a disabled region kept in a variable
        # (`fp32 = torch.autocast("cuda", enabled=False)`, then `with fp32:`).
        region = facts.autocast_of(item.item, where.scope)
        if region is not None and region.enabled == "no":
            yield _Block(item.item, where, item)
    for stack, call, region in facts.stack_entries:
        if region.enabled == "no":
            yield _Block(call.node, call.where, stack, call.where.order)


def check(facts: AmpFacts) -> Iterator[Hit]:
    if not facts.has_autocast:
        return
    for block in _disabled_blocks(facts):
        where = block.where
        function = where.scope.function_scope
        # RT-DETR: `with autocast(): outputs = model(x)`, then `with autocast(enabled=False):
        # loss = criterion(outputs, y)`: the outputs keep their float16 in the second block (or
        # in a block nested in a later region, as VITS computes its mel loss).
        produced = _produced_before(facts, function, where)
        used = _uncast_reads(facts, function, block, set(produced)) if produced else []
        if used:
            sources = _by_region(used, produced)
            outer = facts.innermost_autocast(where)
            yield Hit(
                block.node,
                f"autocast is disabled here but {_listed(sources, outer)} may be float16/bfloat16; ops in this "
                f"block then run in low precision (or fail on mixed dtypes); cast them with `.float()` first",
                where.statement,
                related=tuple(region.node for region in sources),
            )


def _by_region(used: list[str], produced: dict[str, Autocast]) -> dict[Autocast, list[str]]:
    """The names read, grouped by the region that computed each (VITS reads the generator's
    outputs from one region and the discriminator's from the enclosing one)."""
    sources: dict[Autocast, list[str]] = {}
    for name in used:
        sources.setdefault(produced[name], []).append(name)
    return sources


def _listed(sources: dict[Autocast, list[str]], outer: Autocast | None) -> str:
    """`a`, `b`, computed in the enclosing autocast region (line {0}), and `c`, computed in the
    autocast region (line {1}),"""
    parts = []
    for index, (region, made) in enumerate(sources.items()):
        said = "the enclosing autocast region" if outer is not None and region.node is outer.node else "the autocast region"
        parts.append(f"{', '.join(f'`{name}`' for name in made)}, computed in {said} (line {{{index}}}),")
    return " and ".join(parts)


def _low_precision_value(facts: AmpFacts, assignment: Assignment) -> bool:
    value = assignment.value
    return "." not in assignment.key and not _constants(value) and not _NOT_A_TENSOR.search(facts.module.code_for_node(value))


def _constants(value: cst.BaseExpression) -> bool:
    """`[0.5, 1.0, 2.0]`, `(-1, 1)`, `["mel", "kl"]`: loss weights and names, no tensor (an empty
    list may still be filled with tensors)."""
    if isinstance(value, (cst.List, cst.Tuple, cst.Set)):
        return bool(value.elements) and all(_constants(element.value) for element in value.elements)
    if isinstance(value, cst.UnaryOperation):
        return _constants(value.expression)
    return isinstance(value, (cst.Integer, cst.Float, cst.SimpleString))


def _produced_before(facts: AmpFacts, function, where: Context) -> dict[str, Autocast]:
    """Names whose value on entering the disabled block was computed in an enabled autocast
    region of the same function (the enclosing one or an earlier one) on every path there, each
    with the region of its latest such value."""
    bindings: dict[str, list[Assignment]] = {}
    for assignment in (*facts.assignments, *facts.unpackings):
        if assignment.where.scope.function_scope is function:
            bindings.setdefault(assignment.key, []).append(assignment)
    produced = {}
    for key, assignments in bindings.items():
        regions = [_low_precision_region(facts, assignment) for assignment in _reaching(assignments, where)]
        if regions and all(regions):
            produced[key] = regions[-1]
    return produced


def _low_precision_region(facts: AmpFacts, assignment: Assignment) -> Autocast | None:
    """The enabled autocast region the assignment computes a low-precision tensor in, if any."""
    region = facts.innermost_autocast(assignment.where)
    if region is not None and region.enabled != "no" and _low_precision_value(facts, assignment):
        return region
    return None


def _reaching(assignments: list[Assignment], where: Context) -> list[Assignment]:
    """The assignments to one name whose value `where` may see: the last one every path to it
    passes, and those after it in `if` branches `where` is not in (GPT-SoVITS: `if v2Pro:
    y_hat, ... = net_g(..., sv_emb)` `else: y_hat, ... = net_g(...)`)."""
    before = sorted(
        (a for a in assignments if a.where.order < where.order and not mutually_exclusive(a.where, where)),
        key=lambda a: a.where.order,
    )
    on_every_path = [a.where.order for a in before if set(a.where.branches) <= set(where.branches)]
    since = max(on_every_path, default=0)
    return [a for a in before if a.where.order >= since]


def _starts_a_scaled_backward(parents: dict, node: cst.CSTNode) -> bool:
    """`scaler.scale(loss).backward()`: like `loss.backward()`, it computes nothing in the
    block's dtype."""
    arg = parents.get(id(node))
    scale = parents.get(id(arg)) if isinstance(arg, cst.Arg) else None
    if not (isinstance(scale, cst.Call) and isinstance(scale.func, cst.Attribute) and scale.func.attr.value == "scale"):
        return False
    after = parents.get(id(scale))
    return isinstance(after, cst.Attribute) and after.attr.value == "backward"


def _rebound_before(rebound: list[Assignment], name: str, read: Context) -> bool:
    """Whether the block binds `name` anew (`out = out.float()`, `out = head(x)`) in an earlier
    statement on every path to the read, which then sees the block's own value (`img =
    F.normalize(img)` still reads the outer one)."""
    return any(
        a.key == name
        and a.where.order < read.order
        and a.where.statement is not read.statement
        and set(a.where.branches) <= set(read.branches)
        for a in rebound
    )


# Calls that hand a loop the elements of what they are given.
_ITERATION_WRAPPERS = {"zip", "enumerate", "reversed"}


def _loop_target_over(parents: dict, node: cst.CSTNode) -> cst.BaseExpression | None:
    """The target of a loop or comprehension that iterates over `node` (`for r, f in zip(real,
    fake)`): the names its elements get, `r` for `real` where the target unpacks them."""
    wrappers: list[tuple[cst.Call, cst.Arg]] = []  # innermost first
    parent = parents.get(id(node))
    while isinstance(parent, cst.Arg):
        call = parents.get(id(parent))
        if not (isinstance(call, cst.Call) and dotted_name(call.func) in _ITERATION_WRAPPERS):
            return None
        wrappers.append((call, parent))
        node, parent = call, parents.get(id(call))
    if not (isinstance(parent, (cst.CompFor, cst.For)) and parent.iter is node):
        return None
    target = parent.target
    for call, argument in reversed(wrappers):
        target = _element_for(target, call, argument)
    return target


def _element_for(target: cst.BaseExpression, call: cst.Call, argument: cst.Arg) -> cst.BaseExpression:
    """The part of a loop target that `argument` of `call` feeds: the second name for
    `enumerate`, the name at the argument's position for `zip`; all of it where the target does
    not unpack that far (`for pair in zip(a, b)`, `zip(*outputs)`)."""
    elements = target.elements if isinstance(target, (cst.Tuple, cst.List)) else ()
    if any(isinstance(element, cst.StarredElement) for element in elements):
        return target
    wrapper = dotted_name(call.func)
    if wrapper == "enumerate" and len(elements) == 2:
        return elements[1].value
    arguments = call.args
    if wrapper == "zip" and len(elements) == len(arguments) and not any(a.star for a in arguments):
        return elements[next(i for i, a in enumerate(arguments) if a is argument)].value
    return target


def _only_cast(facts: AmpFacts, function, block: _Block | _WholeFunction, target: cst.BaseExpression, depth: int = 0) -> bool:
    """Every use of the loop's element names in the block casts them first (a discriminator's
    per-scale outputs: `sum(torch.mean((1 - r.float()) ** 2) for r in real)`), or iterates over
    them casting theirs (feature maps per scale: `[[f.float() for f in fr] for fr in fmap_r]`)."""
    elements = set(identifiers(target).split())
    rebound = [a for a in (*facts.assignments, *facts.unpackings) if a.key in elements and block.holds(a.where)]
    uses = [
        c for c in facts.calls
        if c.scope.function_scope is function and block.holds(c.where) and (c.receiver_key or "").split(".")[0] in elements
    ]
    reads = [
        r for r in facts.references
        if r.dotted.split(".")[0] in elements and r.where.scope.function_scope is function and block.holds(r.where)
    ]
    parents = ts.parents(facts)

    def iterated_cast(read) -> bool:
        inner = _loop_target_over(parents, read.node) if depth < 3 else None
        return inner is not None and _only_cast(facts, function, block, inner, depth + 1)

    # `for r in real: r = r.float()`, then `r` is the block's own value.
    return bool(uses or reads) and all(
        c.method in _CASTS or _rebound_before(rebound, c.receiver_key.split(".")[0], c.where) for c in uses
    ) and all(_rebound_before(rebound, r.dotted.split(".")[0], r.where) or iterated_cast(r) for r in reads)


class _WholeFunction:
    """The block `_only_cast` looks in, for a helper: all of its body."""

    @staticmethod
    def holds(context: Context) -> bool:
        return True


def _call_taking(parents: dict, node: cst.CSTNode) -> cst.Call | None:
    """The call `node` is passed to as an argument, if it is one."""
    argument = parents.get(id(node))
    call = parents.get(id(argument))
    if isinstance(argument, cst.Arg) and argument.value is node and isinstance(call, cst.Call):
        return call
    return None


def _handed_to_a_helper_that_casts_it(facts: AmpFacts, parents: dict, node: cst.CSTNode) -> bool:
    """An argument of a call of a function of this file whose parameter is only ever used cast
    (VITS' `discriminator_loss(real, fake)`, which takes `dr = dr.float()` of each output)."""
    call = _call_taking(parents, node)
    site = facts.call_site(call) if call is not None else None
    helper = facts.called_function(site) if site is not None else None
    if helper is None or not isinstance(helper.node, cst.FunctionDef):
        return False
    params = helper.node.params
    param = next(
        (
            p for p in (*params.posonly_params, *params.params, *params.kwonly_params)
            if any(caller is site and passed is node for caller, passed in facts.passed_for(helper, p.name.value))
        ),
        None,
    )
    return param is not None and _only_cast(facts, helper, _WholeFunction(), param.name)


def _looked_at(parents: dict, node: cst.CSTNode) -> bool:
    """An argument of a call that reads values without computing with them (`torch.equal(out,
    ref)`, `torch.isfinite(h)`, `type(out)`)."""
    call = _call_taking(parents, node)
    if call is None:
        return False
    called = dotted_name(call.func) or ""
    return called.rsplit(".", 1)[-1] in _LOOKS_AT


def _element_cast(parents: dict, node: cst.CSTNode) -> bool:
    """`outputs[l].float()`, `outputs[1:].to(torch.float32)`: an element or slice cast as it is
    read (yolov4's per-level predictions)."""
    parent = parents.get(id(node))
    if not (isinstance(parent, cst.Subscript) and parent.value is node):
        return False
    while isinstance(parents.get(id(parent)), cst.Subscript) and parents[id(parent)].value is parent:
        parent = parents[id(parent)]  # `outputs[i][j]`
    method = parents.get(id(parent))
    return isinstance(method, cst.Attribute) and method.value is parent and method.attr.value in _CASTS and isinstance(
        parents.get(id(method)), cst.Call
    )


def _uncast_reads(facts: AmpFacts, function, block: _Block, produced: set[str]) -> list[str]:
    parents = ts.parents(facts)
    found: list[str] = []
    rebound = [a for a in (*facts.assignments, *facts.unpackings) if a.key in produced and block.holds(a.where)]
    for ref in facts.references:
        where = ref.where
        if where.scope.function_scope is not function or not block.holds(where):
            continue
        head = ref.dotted.split(".")[0]
        if head not in produced or head in found or _rebound_before(rebound, head, where):
            continue
        if isinstance(parents.get(id(ref.node)), (cst.AssignTarget,)) or _starts_a_scaled_backward(parents, ref.node):
            continue
        if "." in ref.dotted and ref.dotted.split(".")[1] in _NOT_AN_INPUT:
            continue
        if _element_cast(parents, ref.node):
            continue
        target = _loop_target_over(parents, ref.node)
        if target is not None and _only_cast(facts, function, block, target):
            continue
        if _handed_to_a_helper_that_casts_it(facts, parents, ref.node) or _looked_at(parents, ref.node):
            continue
        found.append(head)
    for call in facts.calls:
        if call.scope.function_scope is not function or not block.holds(call.where):
            continue
        head = (call.receiver_key or "").split(".")[0]
        if head in produced and head not in found and call.method not in _CASTS | _NOT_AN_INPUT:
            if not _rebound_before(rebound, head, call.where):
                found.append(head)
    return sorted(found)
