"""AMP014 disabled-region-uncast-inputs: an `autocast(enabled=False)` block uses tensors made under autocast."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst

from amplint.static.checks import Hit
from amplint.static.checks import _training_step as ts
from amplint.static.semantics import AmpFacts, Assignment, Context, dotted_name

CODE = "AMP014"

_CASTS = {"float", "double", "to", "type", "cpu"}
# Reading these feeds no op a low-precision input: metadata, a Python number, or the start of a
# backward pass (`inner_loss.backward()` computes nothing in the disabled region's dtype).
_NOT_AN_INPUT = {"shape", "dtype", "device", "ndim", "size", "dim", "numel", "item", "backward"}
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
        outer = facts.innermost_autocast(where)
        produced = {}
        if outer is not None and outer.enabled != "no":
            produced = dict.fromkeys(_produced_in(facts, function, outer, block), outer)
        # RT-DETR: `with autocast(): outputs = model(x)`, then `with autocast(enabled=False):
        # loss = criterion(outputs, y)`: the outputs keep their float16 in the second block (or
        # in a block nested in a later region, as VITS computes its mel loss).
        for name, source in _produced_before(facts, function, where, block).items():
            produced.setdefault(name, source)
        used = _uncast_reads(facts, function, block, set(produced)) if produced else []
        if used:
            listed = ", ".join(f"`{name}`" for name in used)
            source = produced[used[0]]
            said = "the enclosing autocast region" if outer is not None and source.node is outer.node else "the autocast region"
            yield Hit(
                block.node,
                f"autocast is disabled here but {listed}, computed in {said} (line "
                f"{{0}}), may be float16/bfloat16; ops in this block then run in low precision (or fail on "
                f"mixed dtypes); cast them with `.float()` first",
                where.statement,
                related=(source.node,),
            )


def _low_precision_value(facts: AmpFacts, assignment: Assignment) -> bool:
    return "." not in assignment.key and not _NOT_A_TENSOR.search(facts.module.code_for_node(assignment.value))


def _produced_in(facts: AmpFacts, function, outer, block: _Block) -> set[str]:
    names = set()
    for assignment in (*facts.assignments, *facts.unpackings):
        where = assignment.where
        if where.scope.function_scope is not function or block.holds(where):
            continue
        region = facts.innermost_autocast(where)
        if region is not None and region.node is outer.node and _low_precision_value(facts, assignment):
            names.add(assignment.key)
    return names


def _produced_before(facts: AmpFacts, function, where: Context, block: _Block) -> dict:
    """Names whose value on entering the disabled block was computed in an earlier autocast
    region of the same function (and not rebound since), with that region."""
    produced = {}
    for key in {a.key for a in (*facts.assignments, *facts.unpackings) if a.where.scope.function_scope is function}:
        assignment = facts.reaching_assignment(key, where, unpacked=True)
        if assignment is None or block.holds(assignment.where):
            continue
        region = facts.innermost_autocast(assignment.where)
        if region is not None and region.enabled != "no" and _low_precision_value(facts, assignment):
            produced[key] = region
    return produced


def _starts_a_scaled_backward(parents: dict, node: cst.CSTNode) -> bool:
    """`scaler.scale(loss).backward()`: like `loss.backward()`, it computes nothing in the
    block's dtype."""
    arg = parents.get(id(node))
    scale = parents.get(id(arg)) if isinstance(arg, cst.Arg) else None
    if not (isinstance(scale, cst.Call) and isinstance(scale.func, cst.Attribute) and scale.func.attr.value == "scale"):
        return False
    after = parents.get(id(scale))
    return isinstance(after, cst.Attribute) and after.attr.value == "backward"


def _casts_itself(assignment: Assignment) -> bool:
    value = assignment.value
    return (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in _CASTS
        and (dotted_name(value.func.value) or "").split(".")[0] == assignment.key
    )


def _uncast_reads(facts: AmpFacts, function, block: _Block, produced: set[str]) -> list[str]:
    parents = ts.parents(facts)
    found: list[str] = []
    cast_inside = set()
    for assignment in facts.assignments:
        if block.holds(assignment.where) and assignment.key in produced and _casts_itself(assignment):
            cast_inside.add(assignment.key)  # `x = x.float()`; `x = F.normalize(x)` still reads it uncast
    for ref in facts.references:
        where = ref.where
        if where.scope.function_scope is not function or not block.holds(where):
            continue
        head = ref.dotted.split(".")[0]
        if head not in produced or head in cast_inside or head in found:
            continue
        if isinstance(parents.get(id(ref.node)), (cst.AssignTarget,)) or _starts_a_scaled_backward(parents, ref.node):
            continue
        if "." in ref.dotted and ref.dotted.split(".")[1] in _NOT_AN_INPUT:
            continue
        found.append(head)
    for call in facts.calls:
        if call.scope.function_scope is not function or not block.holds(call.where):
            continue
        head = (call.receiver_key or "").split(".")[0]
        if head in produced and head not in cast_inside and head not in found and call.method not in _CASTS | _NOT_AN_INPUT:
            found.append(head)
    return sorted(found)
