"""AMP012 checkpoint-without-scaler-state: a checkpoint saves or restores the optimizer but not the scaler."""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterator

import libcst as cst

from amplint.model import Applicability
from amplint.static.checks import FixPlan, Hit, Replacement
from amplint.static.checks import _training_step as ts
from amplint.static.semantics import AmpFacts, CallSite, Context, Scope, argument, dotted_name

CODE = "AMP012"

_SAVE = {"torch.save"}
# ignite's checkpoint handler: it saves the objects of its `to_save` dict, calling their
# `state_dict()` itself, so the scaler goes in as the object (`"scaler": scaler`).
_SAVES_OBJECTS = {"ignite.handlers.Checkpoint", "ignite.handlers.checkpoint.Checkpoint"}
_SCALER = re.compile(r"scaler|grad_scale|loss_scale|\bamp\b|\"amp\"|'amp'", re.IGNORECASE)
# An optimizer entry (not `"optimizer": None`, yolov5's classifier saves none) or an optimizer's state.
_OPTIMIZER_STATE = re.compile(
    r"optim\w*\"?'?\s*:(?!\s*None\b)|optim\w*\s*=(?!\s*None\b)|optim\w*\.state_dict\(|\bopt\w*\.state_dict\(", re.IGNORECASE
)


def _literally_disabled(call: CallSite) -> bool:
    enabled = argument(call.node, None, "enabled")
    return isinstance(enabled, cst.Name) and enabled.value == "False"


def _handed_to_the_caller(facts: AmpFacts, call: CallSite) -> bool:
    """`return GradScaler(...)` in a factory no code of this file calls: the caller, elsewhere,
    holds the scaler and checkpoints it."""
    factory = call.scope.function_scope
    return isinstance(facts.parent_of.get(id(call.node)), cst.Return) and not facts.callers(factory)


def _enabled_scaler_keys(facts: AmpFacts) -> list[str]:
    keys = []
    for assignment in facts.assignments:
        if facts.value_kind(assignment.value, assignment.where.scope) != "scaler":
            continue
        if facts.scaler_disabled(assignment.key, assignment.where.scope):
            continue
        keys.append(assignment.key)
    return keys


def check(facts: AmpFacts) -> Iterator[Hit]:
    if not facts.has_scaler:
        return
    scalers = _enabled_scaler_keys(facts)
    if all(_literally_disabled(c) or _handed_to_the_caller(facts, c) for c in facts.scalers_in()):
        return
    reported: set[int] = set()  # dicts: one finding per checkpoint, not per `torch.save` of it
    for call in facts.calls:
        if _saves(facts, call) and not _away_from_every_scaler(facts, call):
            for site, obj in _saved_objects(facts, call):
                hit = _save_without_scaler(facts, site, obj, scalers, reported)
                if hit is not None:
                    yield hit
    yield from _load_without_scaler(facts)


# Helpers from elsewhere that save their first argument: torchvision's, DETR's, DeiT's, MAE's and
# DINO's `utils.save_on_master(checkpoint, path)`, `save_checkpoint(state, ...)`.
_SAVE_HELPER = re.compile(r"^save(?:_on_master|_checkpoint)?$")


def _saves(facts: AmpFacts, call: CallSite) -> bool:
    """`torch.save`, or a save helper this file does not define (its own are followed to their
    torch.save)."""
    if call.qualname in _SAVE or call.qualname in _SAVES_OBJECTS:
        return True
    return bool(_SAVE_HELPER.match(call.name)) and facts.called_function(call) is None


def _saved_objects(facts: AmpFacts, save: CallSite) -> Iterator[tuple[CallSite, cst.BaseExpression | None]]:
    """What `torch.save` writes, and the call that decides it: the save itself, or, when it saves
    a parameter of a same-file helper (`def save_checkpoint(state, ...): torch.save(state, ...)`),
    each call of the helper with the object it passes."""
    if save.qualname not in _SAVE and save.qualname not in _SAVES_OBJECTS and _passes_a_state_dict(save):
        # `save_checkpoint(dir, step, model.state_dict(), optimizer.state_dict(), meta)` (nanochat):
        # the helper's arguments are the checkpoint.
        yield save, save.node
        return
    obj = argument(save.node, 0, "to_save" if save.qualname in _SAVES_OBJECTS else "obj")
    function = save.scope.function_scope
    name = obj.value if isinstance(obj, cst.Name) else None
    if name is None or name not in function.params or facts.bindings(name, save.scope):
        yield save, obj
        return
    position = function.params.index(name) - (1 if function.class_name is not None else 0)
    for caller in facts.callers(function):
        yield caller, caller.arg(position, name)


def _passes_a_state_dict(call: CallSite) -> bool:
    return any(
        isinstance(arg.value, cst.Call) and isinstance(arg.value.func, cst.Attribute) and arg.value.func.attr.value == "state_dict"
        for arg in call.node.args
    )


def _away_from_every_scaler(facts: AmpFacts, call: CallSite) -> bool:
    """The save or load is in a test function and every GradScaler is a local of other functions:
    tests run on their own, so apex's scaler test and its fp32 checkpoint test share nothing.
    (Library functions apart from the scaler's, `train` and `resume`, are run together elsewhere.)"""
    function = call.scope.function_scope
    if not function.name.startswith("test") or any("scaler" in p.lower() for p in function.params):
        return False
    for assignment in facts.assignments:
        if facts.value_kind(assignment.value, assignment.where.scope) != "scaler":
            continue
        owner = assignment.where.scope.function_scope
        if "." in assignment.key or owner.kind != "function" or owner is function:
            return False  # an attribute, a module-level scaler, or this test's own
    return True


def _save_without_scaler(facts: AmpFacts, call: CallSite, obj, scalers: list[str], reported: set[int]) -> Hit | None:
    built = (obj, [facts.module.code_for_node(obj)]) if obj is call.node else _dict_construction(facts, obj, call.scope, call.where)
    if built is None or id(built[0]) in reported:
        return None
    dict_node, texts = built
    text = _without_comments("\n".join(texts))  # `# "scaler": scaler.state_dict(),  # TODO` saves nothing
    if _SCALER.search(_without_feature_scalers(facts, text)) or not _OPTIMIZER_STATE.search(text):
        return None
    if isinstance(dict_node, cst.Dict) and any(isinstance(e, cst.StarredDictElement) for e in dict_node.elements):
        return None  # `**extra`: the scaler may be in there
    reported.add(id(dict_node))
    fix = None
    scaler = _scaler_for(facts, call, scalers)
    saved = f"{scaler or 'scaler'}" if call.qualname in _SAVES_OBJECTS else f"{scaler or 'scaler'}.state_dict()"
    if isinstance(dict_node, cst.Dict) and dict_node.elements and scaler is not None:
        statement = _statement_of(facts, dict_node)
        replacements = _with_scaler_entry(facts, dict_node, saved, statement) if statement is not None else None
        fix = FixPlan(Applicability.UNSAFE, replacements) if replacements else None
    restore = "restore it with `load_state_dict`" if call.qualname not in _SAVES_OBJECTS else "`Checkpoint.load_objects` then restores it"
    return Hit(
        call.node,
        "this checkpoint saves the optimizer state but not the GradScaler's; a resumed run restarts "
        f"at the initial scale (65536) and skips steps while it re-calibrates; add `\"scaler\": {saved}` "
        f"and {restore}",
        call.where.statement,
        fix,
    )


def _statement_of(facts: AmpFacts, node: cst.CSTNode) -> cst.CSTNode | None:
    for parent in facts.ancestors(node):
        if isinstance(parent, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            return parent
    return None


def _without_feature_scalers(facts: AmpFacts, text: str) -> str:
    """The text without the names of scalers that are not loss scalers (`"feature_scaler":
    feature_scaler` where `feature_scaler = StandardScaler().fit(X)`)."""
    for name in ts.feature_scalers(facts):
        if "." not in name:
            text = re.sub(rf"\b{re.escape(name)}\b", " ", text)
    return text


def _without_comments(text: str) -> str:
    """`"optimizer": None,  # optimizer.state_dict(),` saves no optimizer state."""
    if "#" not in text:
        return text
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type != tokenize.COMMENT]
        return tokenize.untokenize(tokens)
    except (tokenize.TokenError, SyntaxError):
        return text


_AS_DICT = {"dataclasses.asdict"}


def _constructs_a_class_of_this_file(facts: AmpFacts, call: cst.Call) -> bool:
    return isinstance(call.func, cst.Name) and any(
        isinstance(d, cst.ClassDef) and d.name.value == call.func.value for d in facts.definitions
    )


def _dict_construction(facts: AmpFacts, obj, scope: Scope, where: Context | None = None, depth: int = 0):
    """The dict a saved object is built from, and all source text that fills it. A name bound
    several times is read from its assignment that reaches `where`, the save."""
    if obj is None or depth > 4:
        return None
    if isinstance(obj, cst.Dict):
        return obj, [facts.module.code_for_node(obj)]
    if isinstance(obj, cst.Call):
        if dotted_name(obj.func) == "dict" or _constructs_a_class_of_this_file(facts, obj):
            return obj, [facts.module.code_for_node(obj)]  # `Snapshot(optimizer_state=...)`: a dataclass of its fields
        if facts.qualname(obj.func, scope) in _AS_DICT or dotted_name(obj.func) == "vars":
            return _dict_construction(facts, argument(obj, 0, "obj"), scope, where, depth + 1)
        function = facts._function_named(obj.func, scope)
        if function is not None:
            for value in function.returns:
                found = _dict_construction(facts, value, function, depth=depth + 1)
                if found is not None:
                    return found
        return None
    key = dotted_name(obj)
    if key is None:
        return None
    bindings = facts.bindings(key, scope)
    reaching = facts.reaching_assignment(key, where) if len(bindings) > 1 and where is not None else None
    if reaching is not None:
        bindings = [(reaching.value, reaching.where.scope)]
    if len(bindings) != 1:
        return None
    value, value_scope = bindings[0]
    # From the reaching assignment on, so that `snapshot = asdict(snapshot)` reads the `snapshot` before it.
    found = _dict_construction(facts, value, value_scope, reaching.where if reaching is not None else None, depth + 1)
    if found is None:
        return None
    node, texts = found
    texts = [*texts, *_later_fills(facts, key, value_scope, reaching.where.order if reaching is not None else -1)]
    return node, texts


def _later_fills(facts: AmpFacts, key: str, scope: Scope, after: int = -1) -> list[str]:
    """Simple statements of the function, after order `after`, that mention the dict again:
    `ckpt["scaler"] = ...`, `ckpt.update(...)`. Not a compound statement's whole text: a loop
    that trains and then fills the dict would bring its `scaler` with it."""
    function = scope.function_scope
    pattern = re.compile(rf"\b{re.escape(key)}\s*(\[|\.update\(|\.setdefault\(|\|=)")
    places = [c.where for c in function.calls]
    places += [a.where for a in facts.assignments if a.where.scope.function_scope is function]
    texts = []
    for where in places:
        if where.order <= after or not isinstance(where.statement, cst.SimpleStatementLine):
            continue
        text = facts.module.code_for_node(where.statement)
        if pattern.search(text):
            texts.append(text)
    return texts


def _scaler_for(facts: AmpFacts, call: CallSite, scalers: list[str]) -> str | None:
    """The one scaler name that is bound where the checkpoint is saved."""
    function = call.scope.function_scope
    visible = {
        key for key in scalers
        if facts.bindings(key, call.scope) and (key.startswith("self.") == (function.class_name is not None))
    }
    visible |= {p for p in function.params if "scaler" in p.lower()}
    return visible.pop() if len(visible) == 1 else None


def _with_scaler_entry(facts: AmpFacts, node: cst.Dict, saved: str, statement: cst.CSTNode) -> tuple[Replacement, ...] | None:
    """Append `"scaler": <saved>` after the dict's last entry, in the dict's own layout."""
    elements = list(node.elements)
    last = elements[-1]
    if not isinstance(last, cst.DictElement):
        return None
    value_text = facts.module.code_for_node(last.value)
    if "\n" in value_text:
        return None
    quote = '"'
    if isinstance(last.key, cst.SimpleString) and last.key.value[0] in "\"'":
        quote = last.key.value[0]
    whitespace = elements[-2].comma.whitespace_after if len(elements) >= 2 and isinstance(elements[-2].comma, cst.Comma) else node.lbrace.whitespace_after
    if isinstance(whitespace, cst.ParenthesizedWhitespace):
        indent = ts.indentation(facts, statement) if whitespace.indent else ""
        separator = f",\n{indent}{whitespace.last_line.value}"
    else:
        separator = ", "
    entry = f"{quote}scaler{quote}: {saved}"
    comment = _comment_after(last, node)
    if comment is None:
        return (Replacement(last.value, f"{value_text}{separator}{entry}"),)
    # `"date": now(),  # why`: the comment stays on its entry's line.
    if isinstance(last.comma, cst.Comma):
        return (Replacement(comment, f"{comment.value}{separator[1:]}{entry},"),)
    return (Replacement(last.value, f"{value_text},"), Replacement(comment, f"{comment.value}{separator[1:]}{entry}"))


def _comment_after(last: cst.DictElement, node: cst.Dict) -> cst.Comment | None:
    """The comment ending the last entry's line: libcst keeps it after the comma when the entry
    is followed by a newline there, else before the closing brace."""
    for whitespace in (getattr(last.comma, "whitespace_after", None), node.rbrace.whitespace_before):
        if isinstance(whitespace, cst.ParenthesizedWhitespace):
            return whitespace.first_line.comment
    return None


def _load_without_scaler(facts: AmpFacts) -> Iterator[Hit]:
    loads = [c for c in facts.calls if c.method == "load_state_dict"]
    if any(_SCALER.search(c.receiver_key or "") or facts.is_scaler(c.receiver_key, c.scope) for c in loads):
        return
    if not any(c.qualname == "torch.load" for c in facts.calls):
        return
    for call in loads:
        if facts.is_optimizer(call.receiver_key, call.scope) and not _away_from_every_scaler(facts, call):
            yield Hit(
                call.node,
                f"the checkpoint restores `{call.receiver_key}` but this file never restores the "
                f"GradScaler (`scaler.load_state_dict(...)`); a resumed run restarts at the initial "
                f"scale and skips steps while it re-calibrates",
                call.where.statement,
            )
