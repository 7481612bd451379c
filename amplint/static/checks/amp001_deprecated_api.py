"""AMP001 deprecated-amp-api: the device-specific `torch.cuda.amp` / `torch.cpu.amp` API."""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from amplint.static import autofix, names
from amplint.static.checks import Hit
from amplint.static.semantics import AmpFacts, CallSite, Scope, dotted_name, ends_with, identifiers, string_literal

CODE = "AMP001"

# How the torch.amp replacement is called, and what to know when only its name is used
# (an import, `isinstance(s, GradScaler)`, `autocast = torch.cuda.amp.autocast`).
_REPLACEMENT = {
    "autocast": ('`torch.amp.autocast("{device}", ...)` with keyword arguments', "its first argument is the device type"),
    "GradScaler": ('`torch.amp.GradScaler("{device}", ...)`', "its first argument is the device type"),
    "custom_fwd": ('`torch.amp.custom_fwd(device_type="{device}", ...)`', 'it needs `device_type="{device}"`'),
    "custom_bwd": ('`torch.amp.custom_bwd(device_type="{device}")`', 'it needs `device_type="{device}"`'),
}


def message_for(qualname: str, called: bool = True) -> str:
    """The deprecation message; `called` for a call, which gets the replacement call spelled out."""
    if qualname in names.DEPRECATED_AUTOCAST_STATE:
        return f"`{qualname}()` is deprecated since torch 2.4; use `{names.DEPRECATED_AUTOCAST_STATE[qualname]}`"
    device, kind = names.DEPRECATED_AMP[qualname]
    call, note = _REPLACEMENT[kind]
    replacement = call.format(device=device) if called else f"`torch.amp.{kind}` ({note.format(device=device)})"
    return f"`torch.{device}.amp.{kind}` is deprecated since torch 2.4; use {replacement}"


def _device_as_init_scale(call: CallSite) -> str:
    """`torch.cuda.amp.GradScaler("cuda")`, the new signature written on the old class: the old
    one's first parameter is `init_scale` (pangaea-bench)."""
    if names.DEPRECATED_AMP.get(call.qualname, (None, None))[1] != "GradScaler":
        return ""
    first = call.arg(0, "init_scale")
    device = string_literal(first) if first is not None else None
    if device is None:
        return ""
    return f"; here `\"{device}\"` lands in its first parameter, `init_scale`, and the first `scaler.scale()` raises TypeError"


def _is_deprecated(qualname: str | None) -> bool:
    return qualname in names.DEPRECATED_AMP or qualname in names.DEPRECATED_AUTOCAST_STATE


def _is_replacement(qualname: str | None) -> bool:
    return qualname is not None and (
        qualname.startswith("torch.amp.") or qualname in _TOP_LEVEL_AMP or qualname in _STATE_REPLACEMENTS
    )


# `torch.autocast is torch.amp.autocast`, and from torch 2.3 `torch.GradScaler is torch.amp.GradScaler`.
_TOP_LEVEL_AMP = frozenset({"torch.autocast", "torch.GradScaler"})
_STATE_REPLACEMENTS = frozenset(text.partition("(")[0] for text in names.DEPRECATED_AUTOCAST_STATE.values())


# What a test of the torch version or of a feature reads like (`is_torch_version(">=", "2.4")`,
# `_TORCH_GREATER_EQUAL_2_4`, `TORCH_2_4`, `torch_ge_24`, `hasattr(torch, "get_autocast_dtype")`,
# `hasattr(torch.amp, "custom_fwd")`); a test of the device (`if x.device.type == "cpu"`), of a
# backend (`hasattr(torch.xpu, "amp")`, which IPEX provides) or of a setting (`getattr(args,
# "bf16")`) chooses between APIs, not between torch releases.
_VERSION_TEST = re.compile(
    r"(?i)version|\b(?:has|get)attr\(\s*torch(?:\s*\.\s*(?:cuda\s*\.\s*|cpu\s*\.\s*)?amp)?\s*,"
    r"|\btorch_?\d|_(?:ge|gt|lt|le)_?\d|greater|older|newer|legacy"
)


def _alternatives(facts: AmpFacts, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """For each version or feature check around `node` (either side of an `if` or conditional
    expression, the `except` of a `try`), the other side of it."""
    child = node
    for parent in facts.ancestors(node):
        if isinstance(parent, (cst.If, cst.IfExp)) and _version_test(facts, parent):
            if child is parent.body:
                yield parent.orelse
                if isinstance(parent, cst.If) and parent.orelse is None and _exits(parent.body):
                    # `if not NEW_TORCH: return old` and then `return new`: what follows is the else.
                    block = facts.parent_of.get(id(parent))
                    statements = list(getattr(block, "body", ()))
                    if parent in statements:
                        yield from statements[statements.index(parent) + 1 :]
            elif child is parent.orelse:
                yield parent.body
        elif isinstance(parent, cst.Try) and child in parent.handlers:
            yield parent.body  # the old API in the `except` of a `try` of the new one
        elif isinstance(parent, (cst.IndentedBlock, cst.Module)) and child in parent.body:
            # `if TORCH_2_4: return new` and then `return old`: the rest of the block is the else.
            for earlier in parent.body[: parent.body.index(child)]:
                if isinstance(earlier, cst.If) and earlier.orelse is None and _exits(earlier.body) and _version_test(facts, earlier):
                    yield earlier.body
        child = parent


def _version_test(facts: AmpFacts, node: cst.If | cst.IfExp) -> bool:
    if _VERSION_TEST.search(facts.module.code_for_node(node.test)):
        return True
    # A flag computed once: `NEW_TORCH = Version(torch.__version__) >= Version("2.4")`, then
    # `if NEW_TORCH:` (or `HAS_TORCH_AMP = hasattr(torch.amp, "GradScaler")`).
    for name in identifiers(node.test).split():
        values = [a.value for a in facts.assignments if a.key == name]
        if values and all(_VERSION_TEST.search(facts.module.code_for_node(value)) for value in values):
            return True
    return False


def _exits(block: cst.BaseSuite) -> bool:
    """A block whose last statement returns or raises: what follows runs only when it did not."""
    return ends_with(block, (cst.Return, cst.Raise))


def _replacements(facts: AmpFacts) -> list[cst.CSTNode]:
    return [
        *(c.node for c in facts.calls if _is_replacement(c.qualname)),
        *(r.node for r in facts.references if _is_replacement(r.where.scope.resolve(r.dotted))),
        *(i.node for i in facts.imports if _is_replacement(i.qualname)),
    ]


def _fallback_for_older_torch(facts: AmpFacts, node: cst.CSTNode, replacements: list[cst.CSTNode]) -> bool:
    """A deprecated name on one side of a version or feature check whose other side uses the
    `torch.amp` replacement (`torch.amp.GradScaler("cuda") if TORCH_2_4 else
    torch.cuda.amp.GradScaler()`, `except ImportError: from torch.cuda.amp import autocast`):
    code that already moved and keeps the old API for older torch. Also one that runs only where
    the replacement is missing (`if not hasattr(torch.amp, "custom_fwd"): torch.amp.custom_fwd =
    torch.cuda.amp.custom_fwd`, sd-scripts): the old API is not deprecated in those releases."""
    if _only_without_the_replacement(facts, node):
        return True
    if not replacements:
        return False
    others = {id(side) for side in _alternatives(facts, node) if side is not None}
    return any(id(ancestor) in others for r in replacements for ancestor in (r, *facts.ancestors(r)))


def _only_without_the_replacement(facts: AmpFacts, node: cst.CSTNode) -> bool:
    """In the body of `if not hasattr(torch.amp, "custom_fwd"):`, or past the `else:` of `if
    hasattr(torch, "autocast"):`: a test that the replacement exists, failed."""
    child = node
    for parent in facts.ancestors(node):
        if isinstance(parent, (cst.If, cst.IfExp)):
            test, negated = parent.test, False
            if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
                test, negated = test.expression, True
            failed = (child is parent.body) if negated else (child is parent.orelse)
            if failed and _has_the_replacement(test):
                return True
        child = parent
    return False


def _has_the_replacement(test: cst.BaseExpression) -> bool:
    """`hasattr(torch.amp, "custom_fwd")`, `hasattr(torch, "autocast")`: whether this torch has a
    name of the `torch.amp` API."""
    if not (isinstance(test, cst.Call) and dotted_name(test.func) == "hasattr" and len(test.args) == 2):
        return False
    owner, attribute = dotted_name(test.args[0].value), test.args[1].value
    if owner not in ("torch", "torch.amp") or not isinstance(attribute, cst.SimpleString):
        return False
    return isinstance(attribute.evaluated_value, str) and _is_replacement(f"{owner}.{attribute.evaluated_value}")


def _assigned(facts: AmpFacts, node: cst.CSTNode) -> bool:
    """An assignment target, alone or unpacked (`torch.get_autocast_gpu_dtype = shim` defines the
    old name for legacy callers): a store, not a use. The facts record attribute chains whatever
    their position; names bound by an assignment they already leave out."""
    child = node
    for parent in facts.ancestors(node):
        if isinstance(parent, cst.AssignTarget) or (isinstance(parent, cst.AnnAssign) and child is parent.target):
            return True
        if not isinstance(parent, (cst.Element, cst.StarredElement, cst.Tuple, cst.List)):
            return False
        child = parent
    return False


def _in_an_annotation(facts: AmpFacts, node: cst.CSTNode) -> bool:
    for parent in facts.ancestors(node):
        if isinstance(parent, cst.Annotation):
            return True
        if isinstance(parent, cst.BaseStatement):
            return False
    return False


def _bound_name(alias: cst.ImportAlias) -> str | None:
    """The name an import binds, when it is the imported object itself (not `torch` of `import torch.cuda.amp`)."""
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    return alias.name.value if isinstance(alias.name, cst.Name) else None


def check(facts: AmpFacts) -> Iterator[Hit]:
    replacements = _replacements(facts)
    # Names imported from the deprecated modules only as a fallback also name the replacement,
    # in the scope that imports them.
    fallbacks: set[tuple[int, str | None]] = set()
    flagged_imports: set[tuple[int, str | None]] = set()
    for ref in facts.imports:
        if not _is_deprecated(ref.qualname):
            continue
        if _fallback_for_older_torch(facts, ref.node, replacements):
            fallbacks.add((id(ref.scope), _bound_name(ref.node)))
        else:
            flagged_imports.add((id(ref.scope), _bound_name(ref.node)))
            yield Hit(ref.node, message_for(ref.qualname, called=False), ref.statement, autofix.deprecated_import(ref, facts))

    def annotation_through_a_flagged_import(node: cst.CSTNode, dotted: str, scope: Scope) -> bool:
        """`scaler: GradScaler` after `from torch.cuda.amp import GradScaler`: an annotation runs
        nothing deprecated, and the import's finding (and fix) covers it (icefall has 173)."""
        head = dotted.split(".")[0]
        return (id(scope.binding_scope(head)), head) in flagged_imports and _in_an_annotation(facts, node)

    def through_a_fallback(dotted: str, scope: Scope) -> bool:
        head = dotted.split(".")[0]
        if (id(scope.binding_scope(head)), head) in fallbacks:
            return True
        # `auto_cast = partial(torch.amp.autocast, ...)` if TORCH_2_4 else `torch.cuda.amp.autocast`,
        # then `with auto_cast(...)`: the old API is bound only on the older-torch side.
        return any(
            _is_deprecated(facts.qualname(value, bound_in)) and _fallback_for_older_torch(facts, value, replacements)
            for value, bound_in in facts.bindings(head, scope)
        )

    for call in facts.calls:
        if (
            _is_deprecated(call.qualname)
            and facts.qualname(call.node.func, call.scope) == call.qualname
            and not through_a_fallback(call.callee, call.scope)
            and not _fallback_for_older_torch(facts, call.node, replacements)
        ):
            yield Hit(call.node.func, message_for(call.qualname) + _device_as_init_scale(call), call.where.statement, autofix.deprecated_call(call, facts))
    for ref in facts.references:
        qualname = ref.where.scope.resolve(ref.dotted)
        if (
            _is_deprecated(qualname)
            and not _assigned(facts, ref.node)
            and not through_a_fallback(ref.dotted, ref.where.scope)
            and not annotation_through_a_flagged_import(ref.node, ref.dotted, ref.where.scope)
            and not _fallback_for_older_torch(facts, ref.node, replacements)
        ):
            yield Hit(ref.node, message_for(qualname, called=False), ref.where.statement, autofix.deprecated_reference(ref, qualname, facts))
