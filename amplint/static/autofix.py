"""Fix builders for AMP001 (deprecated API) and AMP005 (missing `unscale_`).

Each builder returns a `FixPlan` or None. A plan must be correct on its own, whatever other
fixes apply in the same round: rewriting `from torch.cuda.amp import autocast` therefore carries
the rewrite of every use of that name, because `autocast("cuda")` under the old import would
pass "cuda" as `enabled` (research/amp-rules.md §0.2).
"""

from __future__ import annotations

import libcst as cst

from amplint.model import Applicability
from amplint.static import names
from amplint.static.checks import FixPlan, Insertion, Replacement
from amplint.static.checks._training_step import code_in_place
from amplint.static.semantics import AmpFacts, CallSite, ImportRef, Reference, Scope, argument, dotted_name, has_star_args, is_false

# The first torch release that has each replacement (research/amp-rules.md §1).
_REPLACEMENT_SINCE = {"autocast": (1, 10), "GradScaler": (2, 3), "custom_fwd": (2, 4), "custom_bwd": (2, 4)}
_STATE_SINCE = (2, 4)
_NO_SPACE = cst.SimpleWhitespace("")
_ONE_SPACE = cst.SimpleWhitespace(" ")


def replacement_available(kind: str, facts: AmpFacts) -> bool:
    """Whether the oldest torch the project runs on has the replacement of a deprecated `kind`."""
    return facts.min_torch is None or facts.min_torch >= _REPLACEMENT_SINCE[kind]


def _string(value: str) -> cst.SimpleString:
    return cst.SimpleString(f'"{value}"')


def _keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(value, keyword=cst.Name(name), equal=cst.AssignEqual(_NO_SPACE, _NO_SPACE))


def _with_commas(args: list[cst.Arg]) -> list[cst.Arg]:
    """Every argument but the last needs a comma; keep the commas (and comments) already there."""
    fixed = []
    for index, arg in enumerate(args):
        last = index == len(args) - 1
        if not last and isinstance(arg.comma, cst.MaybeSentinel):
            arg = arg.with_changes(comma=cst.Comma(whitespace_after=_ONE_SPACE))
        fixed.append(arg)
    return fixed


def _in_front(call: cst.Call, leading: list[cst.Arg]) -> list[cst.Arg]:
    """Arguments put in front of the call's own; each on a line of its own when the arguments are one per line."""
    opening = call.whitespace_before_args
    if call.args and isinstance(opening, cst.ParenthesizedWhitespace):
        # The same line break and indentation as before the first argument, without its comment.
        after = opening.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=[])
        return [arg.with_changes(comma=cst.Comma(whitespace_after=after)) for arg in leading]
    return leading


# The dtype each deprecated autocast computes in when given none. `torch.amp.autocast(device)`
# without a dtype takes the one currently set (`torch.get_autocast_dtype`), which inside an
# enclosing region, maybe opened in another file (a trainer's bfloat16 autocast around a model
# whose code says `autocast(enabled=True)`), is that region's: the fix writes the old default out.
_DEPRECATED_AUTOCAST_DTYPE = {"cuda": "float16", "cpu": "bfloat16"}


def _takes_default_dtype(call: cst.Call) -> bool:
    """A deprecated autocast call that computes in its class's default dtype: it passes none, and
    is not turned off outright (`enabled=False` computes in no dtype at all)."""
    positions = names.AUTOCAST_POSITIONAL["deprecated"]
    enabled = argument(call, positions.index("enabled"), "enabled")
    turned_off = is_false(enabled)
    return argument(call, positions.index("dtype"), "dtype") is None and not turned_off


def _torch_module_name(scope: Scope) -> str | None:
    """A name an import binds to the torch module and that `scope` sees (`torch`, `th`), or None
    (a file with only `from torch.cuda.amp import autocast`)."""
    current: Scope | None = scope
    while current is not None:
        for name, module in current.imports.items():
            if module == "torch" and scope.resolve_head(name) == "torch":
                return name
        current = current.parent
    return None


def _autocast_fix_safety(call: cst.Call, torch_name: str | None) -> Applicability:
    """Exact only if the old default dtype can be written out, which needs a name for torch."""
    return Applicability.UNSAFE if torch_name is None and _takes_default_dtype(call) else Applicability.SAFE


def migrated_arguments(call: cst.Call, kind: str, device: str, torch_name: str | None) -> list[cst.Arg] | None:
    """The argument list of the torch.amp call that replaces a deprecated one, or None if unsafe.
    `torch_name`, the name the torch module has there, spells out an autocast's default dtype."""
    if has_star_args(call):
        return None  # positions behind *args / **kwargs are unknown
    args = list(call.args)
    if any(a.keyword is None and isinstance(a.value, (cst.SimpleString, cst.ConcatenatedString)) for a in args):
        return None  # a device string where the old API takes `enabled` or `init_scale`: already the new call's
    if kind == "autocast":
        positional_names = names.AUTOCAST_POSITIONAL["deprecated"]
        converted = []
        position = 0
        for arg in args:
            if arg.keyword is None:
                if position >= len(positional_names):
                    return None
                arg = arg.with_changes(keyword=cst.Name(positional_names[position]), equal=cst.AssignEqual(_NO_SPACE, _NO_SPACE))
                position += 1
            converted.append(arg)
        leading = [cst.Arg(_string(device))]
        if torch_name is not None and _takes_default_dtype(call):
            dtype = cst.parse_expression(f"{torch_name}.{_DEPRECATED_AUTOCAST_DTYPE[device]}")
            leading.append(_keyword("dtype", dtype))
        return _with_commas([*_in_front(call, leading), *converted])
    if kind == "GradScaler":
        if any(a.keyword is not None and a.keyword.value == "device" for a in args):
            return None
        return _with_commas([*_in_front(call, [cst.Arg(_string(device))]), *args])
    # custom_fwd / custom_bwd: device_type is keyword-only and required.
    if any(a.keyword is not None and a.keyword.value == "device_type" for a in args):
        return None
    return _with_commas([*args, _keyword("device_type", _string(device))])


def _rooted_at_torch(expr: cst.BaseExpression, scope: Scope) -> str | None:
    """For `torch.cuda.amp.X` spelled through the torch module itself, the torch alias used."""
    dotted = dotted_name(expr)
    if dotted is None or "." not in dotted:
        return None
    head = dotted.split(".")[0]
    return head if scope.resolve_head(head) == "torch" else None


def _new_callee(head: str, kind: str, facts: AmpFacts) -> str:
    if kind == "autocast" and facts.min_torch is not None and facts.min_torch < (2, 1):
        return f"{head}.autocast"  # the spelling that works furthest back
    return f"{head}.amp.{kind}"


def deprecated_call(call: CallSite, facts: AmpFacts) -> FixPlan | None:
    """`torch.cuda.amp.autocast(True)` -> `torch.amp.autocast("cuda", dtype=torch.float16, enabled=True)`."""
    qualname = call.qualname
    if qualname in names.DEPRECATED_AUTOCAST_STATE:
        return _state_function_fix(call, facts)
    head = _rooted_at_torch(call.node.func, call.scope)
    if head is None:
        return _alias_fix(call.node.func, call.scope, facts)
    device, kind = names.DEPRECATED_AMP[qualname]
    if not replacement_available(kind, facts):
        return None
    args = migrated_arguments(call.node, kind, device, head)
    if args is None:
        return None
    new = call.node.with_changes(func=cst.parse_expression(_new_callee(head, kind, facts)), args=args)
    return FixPlan(Applicability.SAFE, (Replacement(call.node, code_in_place(facts, call.node, new)),))


def _state_function_fix(call: CallSite, facts: AmpFacts) -> FixPlan | None:
    """`torch.get_autocast_gpu_dtype()` -> `torch.get_autocast_dtype("cuda")` (torch 2.4)."""
    head = _rooted_at_torch(call.node.func, call.scope)
    if head is None or has_star_args(call.node) or (facts.min_torch is not None and facts.min_torch < _STATE_SINCE):
        return None
    old = call.qualname.rsplit(".", 1)[-1]
    device = "cuda" if "_gpu_" in old else "cpu"
    new_name = old.replace("_gpu", "").replace("_cpu", "")
    args = _with_commas([cst.Arg(_string(device)), *call.node.args])
    new = call.node.with_changes(func=cst.parse_expression(f"{head}.{new_name}"), args=args)
    return FixPlan(Applicability.SAFE, (Replacement(call.node, code_in_place(facts, call.node, new)),))


def deprecated_reference(ref: Reference, qualname: str, facts: AmpFacts) -> FixPlan | None:
    """A bare `@torch.cuda.amp.custom_fwd` decorator -> `@torch.amp.custom_fwd(device_type="cuda")`."""
    if qualname not in names.DEPRECATED_AMP:
        return None
    head = _rooted_at_torch(ref.node, ref.where.scope)
    if head is None:
        return _alias_fix(ref.node, ref.where.scope, facts)
    device, kind = names.DEPRECATED_AMP[qualname]
    if not replacement_available(kind, facts):
        return None
    if kind in ("autocast", "GradScaler") and _in_a_type_test(ref.node, facts):
        return FixPlan(Applicability.SAFE, (Replacement(ref.node, f"{head}.amp.{kind}"),))
    if kind not in ("custom_fwd", "custom_bwd") or not _is_bare_decorator(ref.node, facts):
        return None  # a class used as another value (a base class, stored) has no safe rewrite
    return FixPlan(
        Applicability.SAFE, (Replacement(ref.node, f'{head}.amp.{kind}(device_type="{device}")'),)
    )


def _in_a_type_test(node: cst.CSTNode, facts: AmpFacts) -> bool:
    """The class tested in `isinstance(x, ...)` / `issubclass(...)`, or named in an annotation.
    The deprecated classes subclass the torch.amp ones, so the new name accepts every object the
    old one did, and the scalers the fixed constructors build."""
    child = node
    for parent in facts.ancestors(node):
        if isinstance(parent, cst.Annotation):
            return True
        if isinstance(parent, cst.Call):
            tested = parent.args[1] if len(parent.args) == 2 else None
            return dotted_name(parent.func) in ("isinstance", "issubclass") and child is tested
        if isinstance(parent, cst.BaseStatement):
            return False
        child = parent
    return False


def _is_bare_decorator(node: cst.CSTNode, facts: AmpFacts) -> bool:
    return any(d.decorator is node for f in facts.functions for d in f.decorators)


def deprecated_import(ref: ImportRef, facts: AmpFacts) -> FixPlan | None:
    """`from torch.cuda.amp import autocast` -> `from torch.amp import autocast`, with every use."""
    statement = ref.statement
    if not isinstance(statement, cst.SimpleStatementLine):
        return None
    node = next((s for s in statement.body if isinstance(s, cst.ImportFrom)), None)
    if node is None:
        return None
    return _from_import_fix(node, ref.scope, facts, ref.node)


def _alias_fix(expr: cst.BaseExpression, scope: Scope, facts: AmpFacts) -> FixPlan | None:
    """Uses through `from torch.cuda.amp import X` or `from torch.cuda import amp`: fix the import
    the use resolves through."""
    head = (dotted_name(expr) or "").split(".")[0]
    binding = scope.binding_scope(head)
    for ref in facts.imports:
        statement = ref.statement
        if ref.scope is not binding or not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            alias = next((a for a in _aliases(small) if _bound_name(a) == head), None) if isinstance(small, cst.ImportFrom) else None
            if alias is not None:
                return _from_import_fix(small, binding, facts, alias)
            if isinstance(small, cst.Import):
                alias = next((a for a in small.names if a.asname is not None and _bound_name(a) == head), None)
                if alias is not None:
                    return _module_import_fix(alias, binding, facts)
    return None


def _module_import_fix(alias: cst.ImportAlias, scope: Scope, facts: AmpFacts) -> FixPlan | None:
    """`import torch.cuda.amp as amp` -> `import torch.amp as amp`, with every `amp.X(...)`."""
    module = dotted_name(alias.name)
    if module not in ("torch.cuda.amp", "torch.cpu.amp"):
        return None
    uses = _module_alias_uses(_bound_name(alias), scope, facts)
    if uses is None or not all(replacement_available(kind, facts) for kind in ("autocast", "GradScaler")):
        return None
    return _together([*uses, _safe(Replacement(alias.name, "torch.amp"))])


def _aliases(node: cst.ImportFrom) -> list[cst.ImportAlias]:
    return [] if isinstance(node.names, cst.ImportStar) else list(node.names)


def _bound_name(alias: cst.ImportAlias) -> str | None:
    return dotted_name(alias.asname.name) if alias.asname is not None else dotted_name(alias.name)


# Where each deprecated module's names live now (`torch.amp.autocast_mode` and
# `torch.amp.grad_scaler` hold the classes `torch.amp` exports).
_NEW_MODULE = {
    "torch.cuda.amp": "torch.amp",
    "torch.cpu.amp": "torch.amp",
    "torch.cuda.amp.autocast_mode": "torch.amp.autocast_mode",
    "torch.cpu.amp.autocast_mode": "torch.amp.autocast_mode",
    "torch.cuda.amp.grad_scaler": "torch.amp.grad_scaler",
    "torch.cpu.amp.grad_scaler": "torch.amp.grad_scaler",
    "torch.cuda": "torch",
    "torch.cpu": "torch",
}


def _from_import_fix(node: cst.ImportFrom, scope: Scope, facts: AmpFacts, concerning: cst.CSTNode) -> FixPlan | None:
    """The import rewritten with the uses of the names it binds in `scope` (where it is written),
    for a finding on the name `concerning` (its alias in the import) or a use of it. Names that
    cannot move (a GradScaler where `min-torch` predates `torch.amp.GradScaler`, one used as a
    base class) stay in the old import, and their findings get no fix; the others leave it, their
    uses spelled through torch (`torch.amp.autocast("cuda")`)."""
    module = dotted_name(node.module)
    if node.relative or module is None:
        return None
    new_module = _NEW_MODULE.get(module)
    if new_module is None:
        return None
    if module in ("torch.cuda", "torch.cpu"):
        if any(dotted_name(alias.name) != "amp" for alias in _aliases(node)):
            return None  # `from torch.cuda import amp, Stream`: leave mixed imports alone
        if not all(replacement_available(kind, facts) for kind in ("autocast", "GradScaler")):
            return None  # any use of the module may be either
        uses = [_module_alias_uses(_bound_name(alias), scope, facts) for alias in _aliases(node)]
        if any(u is None for u in uses):
            return None
        return _together([*(plan for u in uses for plan in u), _safe(Replacement(node.module, new_module))])
    kinds = {id(a): names.DEPRECATED_AMP.get(f"{module}.{dotted_name(a.name)}", (None, None))[1] for a in _aliases(node)}
    if None in kinds.values():
        return None
    moving = {id(a): _name_uses(_bound_name(a), kinds[id(a)], scope, facts) if replacement_available(kinds[id(a)], facts) else None for a in _aliases(node)}
    if all(uses is not None for uses in moving.values()):
        if set(kinds.values()) == {"autocast"} and _new_callee("torch", "autocast", facts) == "torch.autocast":
            new_module = "torch"  # `from torch import autocast`: torch.amp's is not known before 2.1
        return _together([*(plan for uses in moving.values() for plan in uses), _safe(Replacement(node.module, new_module))])
    movable = {key for key, uses in moving.items() if uses is not None}
    return _split_import_fix(node, kinds, movable, scope, facts) if id(concerning) in movable else None


def _split_import_fix(node: cst.ImportFrom, kinds: dict[int, str], movable: set[int], scope: Scope, facts: AmpFacts) -> FixPlan | None:
    """The movable names taken out of the import, each use spelled through the torch module."""
    plans: list[FixPlan] = []
    for alias in _aliases(node):
        if id(alias) not in movable:
            continue
        uses = _name_uses(_bound_name(alias), kinds[id(alias)], scope, facts, through_torch=True)
        if uses is None:
            return None
        plans.extend(uses)
    if not plans:
        return None
    kept = [a for a in _aliases(node) if id(a) not in movable]
    kept[-1] = kept[-1].with_changes(comma=_aliases(node)[-1].comma)  # a trailing comma, if any, stays last
    # An import's continuation lines keep their indentation in its own whitespace nodes.
    return _together([*plans, _safe(Replacement(node, facts.module.code_for_node(node.with_changes(names=kept))))])


def _name_uses(bound: str | None, kind: str, scope: Scope, facts: AmpFacts, through_torch: bool = False) -> list[FixPlan] | None:
    """Rewrites for every use of a name the import in `scope` binds, or None if one can't be. A use
    that resolves through another import of the name (in another function) is that import's.
    `through_torch`: each use also names the class through the torch module, as the import will
    no longer bind it."""
    plans = []
    for call in facts.calls:
        if call.callee == bound and call.method is None and call.scope.binding_scope(bound) is scope:
            plan = _use_call(call, kind, facts, through_torch)
            if plan is None:
                return None
            plans.append(plan)
    for ref in facts.references:
        if ref.dotted == bound and ref.where.scope.binding_scope(bound) is scope:
            spelled = _spelled_through_torch(kind, ref.where.scope, facts) if through_torch else bound
            if spelled is None:
                return None
            if kind in ("custom_fwd", "custom_bwd") and _is_bare_decorator(ref.node, facts):
                device = names.DEPRECATED_AMP[ref.where.scope.resolve(bound)][0]
                plans.append(_safe(Replacement(ref.node, f'{spelled}(device_type="{device}")')))
            elif kind in ("autocast", "GradScaler") and _in_a_type_test(ref.node, facts):
                # A type test keeps its name, which now means the wider torch.amp class.
                if through_torch:
                    plans.append(_safe(Replacement(ref.node, spelled)))
            else:
                return None  # used as another value: a base class, stored in a variable
    return plans


def _spelled_through_torch(kind: str, scope: Scope, facts: AmpFacts) -> str | None:
    torch_name = _torch_module_name(scope)
    return _new_callee(torch_name, kind, facts) if torch_name is not None else None


def _module_alias_uses(bound: str | None, scope: Scope, facts: AmpFacts) -> list[FixPlan] | None:
    """Rewrites for every `amp.X(...)` through the import in `scope` of `from torch.cuda import amp`."""
    plans = []
    for call in facts.calls:
        receiver = call.receiver_key or ""
        if receiver.split(".")[0] == bound and call.scope.binding_scope(bound) is scope:
            # `amp.common.amp_definitely_not_available()`: a submodule torch.amp does not have.
            kind = names.DEPRECATED_AMP.get(call.qualname or "", (None, None))[1] if receiver == bound else None
            if kind is None:
                return None
            plan = _use_call(call, kind, facts)
            if plan is None:
                return None
            plans.append(plan)
    for ref in facts.references:
        if ref.dotted.split(".")[0] == bound and ref.where.scope.binding_scope(bound) is scope:
            qualname = ref.where.scope.resolve(ref.dotted)
            kind = names.DEPRECATED_AMP.get(qualname or "", (None, None))[1]
            if kind in ("custom_fwd", "custom_bwd") and _is_bare_decorator(ref.node, facts):
                device = names.DEPRECATED_AMP[qualname][0]
                plans.append(_safe(Replacement(ref.node, f'{ref.dotted}(device_type="{device}")')))
            elif kind in ("autocast", "GradScaler") and _in_a_type_test(ref.node, facts):
                continue  # `isinstance(s, amp.GradScaler)` then names the torch.amp class, as it should
            else:
                return None
    return plans


def _use_call(call: CallSite, kind: str, facts: AmpFacts, through_torch: bool = False) -> FixPlan | None:
    device = names.DEPRECATED_AMP.get(call.qualname or "", ("cuda", kind))[0]
    torch_name = _torch_module_name(call.scope)
    args = migrated_arguments(call.node, kind, device, torch_name)
    if args is None:
        return None
    new = call.node.with_changes(args=args)
    if through_torch:
        if torch_name is None:
            return None
        new = new.with_changes(func=cst.parse_expression(_new_callee(torch_name, kind, facts)))
    replacement = Replacement(call.node, code_in_place(facts, call.node, new))
    if kind == "autocast":
        return FixPlan(_autocast_fix_safety(call.node, torch_name), (replacement,))
    return _safe(replacement)


def _safe(replacement: Replacement) -> FixPlan:
    return FixPlan(Applicability.SAFE, (replacement,))


def _together(plans: list[FixPlan]) -> FixPlan:
    """One plan making every edit of `plans`: unsafe if any of them is."""
    unsafe = any(plan.applicability is Applicability.UNSAFE for plan in plans)
    return FixPlan(
        Applicability.UNSAFE if unsafe else Applicability.SAFE, tuple(r for plan in plans for r in plan.replacements)
    )


def unscale_before(event, scaler: str | None, owner: str | None, events, facts: AmpFacts) -> FixPlan | None:
    """Insert `scaler.unscale_(optimizer)` before a clip that sits in the same block as the step.

    Safe only there: under gradient accumulation the clip and the step are guarded together, and
    an `unscale_` anywhere else could run twice before one update (a RuntimeError).
    """
    if event.kind != "clip" or scaler is None or owner is None:
        return None
    statement = event.where.statement
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    step = next((e for e in events if e.kind == "step" and e.optimizer == owner and e.where.order > event.where.order), None)
    function = event.where.scope.function_scope.node
    if step is None or _block_of(statement, function) is not _block_of(step.where.statement, function):
        return None
    if any(e.kind == "unscale" for e in events):
        return None  # an unscale_ elsewhere in this step: inserting another could double it
    return FixPlan(Applicability.SAFE, (Insertion(statement, f"{scaler}.unscale_({owner})"),))


class _BlockFinder(cst.CSTVisitor):
    def __init__(self, target: cst.CSTNode) -> None:
        self.target, self.block = target, None

    def _look(self, node) -> None:
        if any(child is self.target for child in node.body):
            self.block = node

    visit_Module = visit_IndentedBlock = _look


def _block_of(statement: cst.CSTNode, function: cst.CSTNode) -> cst.CSTNode | None:
    """The block whose statement list holds `statement`, searched within its function only."""
    finder = _BlockFinder(statement)
    function.visit(finder)
    return finder.block
