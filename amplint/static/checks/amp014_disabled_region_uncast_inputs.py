"""AMP014 disabled-region-uncast-inputs: an `autocast(enabled=False)` block uses tensors made under autocast."""

from __future__ import annotations

import re
from collections.abc import Iterator

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


def check(facts: AmpFacts) -> Iterator[Hit]:
    if not facts.has_autocast:
        return
    for item, where in facts.with_items:
        # `with torch.autocast(..., enabled=False):`, or a disabled region kept in a variable
        # (`fp32 = torch.autocast("cuda", enabled=False)`, then `with fp32:`).
        region = facts.autocast_of(item.item, where.scope)
        if region is None or region.enabled != "no":
            continue
        function = where.scope.function_scope
        outer = facts.innermost_autocast(where)
        produced = {}
        if outer is not None and outer.enabled != "no":
            produced = dict.fromkeys(_produced_in(facts, function, outer, item), outer)
        # RT-DETR: `with autocast(): outputs = model(x)`, then `with autocast(enabled=False):
        # loss = criterion(outputs, y)`: the outputs keep their float16 in the second block (or
        # in a block nested in a later region, as VITS computes its mel loss).
        for name, source in _produced_before(facts, function, where, item).items():
            produced.setdefault(name, source)
        used = _uncast_reads(facts, function, item, set(produced)) if produced else []
        if used:
            listed = ", ".join(f"`{name}`" for name in used)
            source = produced[used[0]]
            said = "the enclosing autocast region" if outer is not None and source.node is outer.node else "the autocast region"
            yield Hit(
                item.item,
                f"autocast is disabled here but {listed}, computed in {said} (line "
                f"{{0}}), may be float16/bfloat16; ops in this block then run in low precision (or fail on "
                f"mixed dtypes); cast them with `.float()` first",
                where.statement,
                related=(source.node,),
            )


def _low_precision_value(facts: AmpFacts, assignment: Assignment) -> bool:
    return "." not in assignment.key and not _NOT_A_TENSOR.search(facts.module.code_for_node(assignment.value))


def _produced_in(facts: AmpFacts, function, outer, inner: cst.WithItem) -> set[str]:
    names = set()
    for assignment in (*facts.assignments, *facts.unpackings):
        where = assignment.where
        if where.scope.function_scope is not function or any(w is inner for w in where.withs):
            continue
        region = facts.innermost_autocast(where)
        if region is not None and region.node is outer.node and _low_precision_value(facts, assignment):
            names.add(assignment.key)
    return names


def _produced_before(facts: AmpFacts, function, where: Context, inner: cst.WithItem) -> dict:
    """Names whose value on entering the disabled block was computed in an earlier autocast
    region of the same function (and not rebound since), with that region."""
    produced = {}
    for key in {a.key for a in (*facts.assignments, *facts.unpackings) if a.where.scope.function_scope is function}:
        assignment = facts.reaching_assignment(key, where, unpacked=True)
        if assignment is None or any(w is inner for w in assignment.where.withs):
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


def _uncast_reads(facts: AmpFacts, function, inner: cst.WithItem, produced: set[str]) -> list[str]:
    parents = ts.parents(facts)
    found: list[str] = []
    cast_inside = set()
    for assignment in facts.assignments:
        if any(w is inner for w in assignment.where.withs) and assignment.key in produced and _casts_itself(assignment):
            cast_inside.add(assignment.key)  # `x = x.float()`; `x = F.normalize(x)` still reads it uncast
    for ref in facts.references:
        where = ref.where
        if where.scope.function_scope is not function or not any(w is inner for w in where.withs):
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
        if call.scope.function_scope is not function or not any(w is inner for w in call.where.withs):
            continue
        head = (call.receiver_key or "").split(".")[0]
        if head in produced and head not in cast_inside and head not in found and call.method not in _CASTS | _NOT_AN_INPUT:
            found.append(head)
    return sorted(found)
