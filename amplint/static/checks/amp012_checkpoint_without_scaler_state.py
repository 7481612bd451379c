"""AMP012 checkpoint-without-scaler-state: a checkpoint saves or restores the optimizer but not the scaler."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator

import libcst as cst

from amplint.model import Applicability
from amplint.static import names
from amplint.static.source import code_only
from amplint.static.checks import FixPlan, Hit, Replacement
from amplint.static.checks import _regions as rg
from amplint.static.checks import _training_step as ts
from amplint.static.semantics import (
    AmpFacts,
    Assignment,
    CallSite,
    Context,
    Scope,
    and_operands,
    argument,
    arms_of,
    dotted_name,
    is_false,
    is_none,
    is_true,
    string_literal,
)

CODE = "AMP012"
# What every finding about restoring a checkpoint says (the tracer follows saves, not restores).
NEVER_RESTORES = "never restores the GradScaler"

_SAVE = {"torch.save"}
# ignite's checkpoint handler: it saves the objects of its `to_save` dict, calling their
# `state_dict()` itself, so the scaler goes in as the object (`"scaler": scaler`). ignite's
# helpers that take a `to_save=` dict (`common.setup_common_training_handlers`) build one.
_SAVES_OBJECTS = {"ignite.handlers.Checkpoint", "ignite.handlers.checkpoint.Checkpoint"}
_SCALER = re.compile(r"scaler|grad_scale|loss_scale|\bamp\b|\"amp\"|'amp'", re.IGNORECASE)
# An optimizer entry (not `"optimizer": None`, yolov5's classifier saves none) or an optimizer's state.
_OPTIMIZER_STATE = re.compile(
    r"optim\w*\"?'?\s*:(?!\s*None\b)|optim\w*\s*=(?!\s*None\b)|optim\w*\.state_dict\(|\bopt\w*\.state_dict\(", re.IGNORECASE
)


def _saves_objects(call: CallSite) -> bool:
    return call.qualname in _SAVES_OBJECTS or (
        (call.qualname or "").startswith("ignite.") and argument(call.node, None, "to_save") is not None
    )


def _literally_disabled(call: CallSite) -> bool:
    enabled = argument(call.node, None, "enabled")
    return is_false(enabled)


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
        yield from _accelerate_checkpoints(facts)
        return
    scalers = _enabled_scaler_keys(facts)
    if all(_literally_disabled(c) or facts.returned_to_another_module(c) for c in facts.scalers_in()):
        return
    scaler_state_saved = _saves_a_scaler_state(facts)
    optimizers = _stepped_or_built_optimizers(facts)
    reported: set[int] = set()  # dicts: one finding per checkpoint, not per `torch.save` of it
    # Helpers given an optimizer: one finding each, however many optimizers and calls (VITS saves
    # its generator's and its discriminator's): passing the scaler to one call fixes them all.
    handed: set[str] = set()
    for call in facts.calls:
        saves = _saves(facts, call)
        run = _call_it_runs(facts, call)
        hands_over = not scaler_state_saved and run.name not in handed and _given_an_optimizer(facts, run, optimizers)
        if not (saves or hands_over) or _away_from_every_scaler(facts, call.scope) or _in_an_if_false_body(facts, call.where):
            continue
        hits = list(_saves_without_scaler(facts, call, scalers, scaler_state_saved, reported)) if saves else []
        if not hits and hands_over:  # `saver.save_checkpoint(model, optimizer, epoch)` saves no dict of ours
            handed.add(run.name)
            hits.append(_optimizer_handed_to_a_helper(facts, call, run.name))
        yield from hits
    yield from _load_without_scaler(facts)


def _accelerate_checkpoints(facts: AmpFacts) -> Iterator[Hit]:
    """accelerate in fp16 mixed precision keeps its GradScaler as `accelerator.scaler`, which
    `accelerator.save_state()` saves: a checkpoint written by hand (`torch.save`,
    `accelerator.save`) with the optimizer state and not that scaler's loses the scale. Only
    where an Accelerator built with `mixed_precision="fp16"` or a precision not written as a
    literal is in reach (left out, the launch configuration decides)."""
    built = [
        a for a in facts.assignments
        if isinstance(a.value, cst.Call) and facts.qualname(a.value.func, a.where.scope) in names.ACCELERATORS
    ]
    if not any(ts.may_scale_in_fp16(a.value, "mixed_precision", when_left_out=False) for a in built):
        return
    reported: set[int] = set()
    for call in facts.calls:
        if not _saves(facts, call) or _in_an_if_false_body(facts, call.where):
            continue
        for site, obj in _saved_objects(facts, call):
            accelerator = _accelerator_in_reach(built, site.scope.function_scope)
            if accelerator is None or not ts.may_scale_in_fp16(accelerator.value, "mixed_precision", when_left_out=False):
                continue
            if _optimizer_state(facts, obj, site.scope) or _checkpoint_without_scaler(facts, site, obj, reported) is None:
                continue
            scaler = f"{accelerator.key}.scaler"
            yield Hit(
                site.node,
                f"this checkpoint saves the optimizer state but not the GradScaler accelerate keeps in fp16 mixed "
                f"precision (`{scaler}`); {_resumed_run(facts)}; add `\"scaler\": {scaler}.state_dict()` (restored "
                f"with `load_state_dict`), or save and restore everything with `{accelerator.key}.save_state()` / `load_state()`",
                site.where.statement,
            )


def _accelerator_in_reach(built: list[Assignment], function: Scope) -> Assignment | None:
    """The Accelerator the function works with: its own, its class's (`self.accelerator`), the module's."""
    for assignment in reversed(built):
        owner = assignment.where.scope.function_scope
        same_class = assignment.key.startswith("self.") and owner.class_name is not None and owner.class_name == function.class_name
        if owner is function or owner.kind == "module" or same_class:
            return assignment
    return None


def _in_an_if_false_body(facts: AmpFacts, where: Context) -> bool:
    """Code in the body of `if False and ...:`, which never runs (OpenPCDet's save helper switches
    off writing the optimizer to a file of its own that way)."""
    return any(
        label == "body" and node_id in facts.if_tests and "False" in facts.conjuncts(facts.if_tests[node_id])
        for node_id, label in where.branches
    )


def _saves_without_scaler(
    facts: AmpFacts, save: CallSite, scalers: list[str], scaler_state_saved: bool, reported: set[int]
) -> Iterator[Hit]:
    for site, obj in _saved_objects(facts, save):
        if _optimizer_state(facts, obj, site.scope):
            hit = None if scaler_state_saved else _optimizer_state_alone(facts, site, obj, scalers)
        else:
            hit = _save_without_scaler(facts, site, obj, scalers, reported)
        if hit is not None:
            yield hit


# Helpers from elsewhere that save their first argument: torchvision's, DETR's, DeiT's, MAE's and
# DINO's `utils.save_on_master(checkpoint, path)`, `save_checkpoint(state, ...)`.
_SAVE_HELPER = re.compile(r"^save(?:_on_master|_checkpoint)?$")
# torch_xla's `xm.save` runs on TPUs, where the torch GradScalers this rule knows do not step
# (transformers' Trainer saves the optimizer with it in its TPU branch, with torch.save elsewhere).
_XLA = "torch_xla."


def _on_the_tpu_branch(facts: AmpFacts, call: CallSite) -> bool:
    """The innermost branch holding `call` also calls torch_xla (LoRA's vendored Trainer restores
    the optimizer, then `xm.send_cpu_data_to_device(...)`, under `if is_torch_tpu_available():`):
    a TPU run, where the torch GradScalers this rule knows do not step."""
    if not call.where.branches:
        return False
    branch = call.where.branches[-1]
    return any((c.qualname or "").startswith(_XLA) and branch in c.where.branches for c in facts.calls)


def _saves(facts: AmpFacts, call: CallSite) -> bool:
    """`torch.save`, or a save helper this file does not define (its own are followed to their
    torch.save)."""
    if call.qualname in _SAVE or _saves_objects(call):
        return True
    if (call.qualname or "").startswith(_XLA):
        return False
    return bool(_SAVE_HELPER.match(call.name)) and facts.called_function(call) is None


def _saved_objects(facts: AmpFacts, save: CallSite) -> Iterator[tuple[CallSite, cst.BaseExpression | None]]:
    """What `torch.save` writes, and the call that decides it: the save itself, or, when it saves
    a parameter of a same-file helper (`def save_checkpoint(state, ...): torch.save(state, ...)`),
    each call of the helper with the object it passes."""
    if _saves_objects(save):  # `Checkpoint(to_save, ...)`, or a helper's `to_save=` keyword
        obj = argument(save.node, 0 if save.qualname in _SAVES_OBJECTS else None, "to_save")
    else:
        obj = argument(save.node, 0, "obj")
    if isinstance(obj, cst.NamedExpr):  # `torch.save(state := {...}, path)` saves the value
        obj = obj.value
    helper = save.qualname not in _SAVE and not _saves_objects(save)
    if helper and _passes_a_state_dict(save) and not _optimizer_state(facts, obj, save.scope):
        # `save_checkpoint(dir, step, model.state_dict(), optimizer.state_dict(), meta)` (nanochat):
        # the helper's arguments are the checkpoint.
        yield save, save.node
        return
    function = save.scope.function_scope
    name = obj.value if isinstance(obj, cst.Name) else None
    if name is not None and _gathers_keywords(function, name) and not facts.bindings(name, save.scope):
        # `def save_checkpoint(path, **state): torch.save(state, path)`: each call's keywords are
        # the checkpoint.
        for caller in facts.callers(function):
            yield caller, caller.node
        return
    if name is None or name not in function.params or facts.bindings(name, save.scope):
        yield save, obj
        return
    yield from facts.passed_for(function, name)


def _gathers_keywords(function: Scope, name: str) -> bool:
    star = function.node.params.star_kwarg if isinstance(function.node, cst.FunctionDef) else None
    return isinstance(star, cst.Param) and star.name.value == name


def _optimizer_state(facts: AmpFacts, obj: cst.BaseExpression | None, scope: Scope) -> bool:
    """`optimizer.state_dict()` saved on its own, to a file of its own (transformers' Trainer
    writes "optimizer.pt", then "scheduler.pt")."""
    return (
        isinstance(obj, cst.Call)
        and isinstance(obj.func, cst.Attribute)
        and obj.func.attr.value == "state_dict"
        and facts.is_optimizer(dotted_name(obj.func.value), scope)
    )


def _names_a_scaler(facts: AmpFacts, code: str | None, scope: Scope) -> bool:
    """`scaler`, `self.scaler`, apex's `amp`, `scaler if cfg.TRAIN.MIXED_PRECISION else None` (SlowFast)."""
    return code is not None and (
        facts.is_scaler(code, scope) or bool(_SCALER.search(_without_feature_scalers(facts, code)))
    )


def _saves_a_scaler_state(facts: AmpFacts) -> bool:
    """Whether the file takes a scaler's state anywhere (`scaler.state_dict()`, apex's
    `amp.state_dict()`) or hands a scaler to a checkpoint helper (`save_checkpoint(...,
    scaler=scaler)`, `load_checkpoint(path, model, optimizer, scaler)`): an optimizer state saved
    on its own, or handed to a helper, then has its scaler's saved apart."""
    for call in facts.calls:
        if call.method == "state_dict" and _names_a_scaler(facts, call.receiver_key, call.scope):
            return True
        run = _call_it_runs(facts, call)  # `Thread(target=save_checkpoint, args=(..., scaler))` hands it too
        if _saves_or_restores_a_checkpoint(run.name) and any(
            _holds_a_scaler(facts, facts.module.code_for_node(arg.value), call.scope) for arg in run.node.args
        ):
            return True
    return False


# A name or attribute chain in code, then whether it is called: `self.scaler.state_dict(`.
_DOTTED = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\s*\.\s*[A-Za-z_]\w*)*)(\s*\()?")
_KEYWORD = re.compile(r"\s*=(?!=)")


def _holds_a_scaler(facts: AmpFacts, code: str, scope: Scope, state_variables: Collection[str] = ()) -> bool:
    """Whether code that fills a checkpoint or is handed to a save helper holds a GradScaler or its
    state: a scaler (`self.scaler`, `scaler if cfg.TRAIN.MIXED_PRECISION else None`), a name that
    says it is one (`scaler_state`, `loss_scaler`), a scaler's `state_dict()` (apex's
    `amp.state_dict()`) or a name bound to one (`state_variables`). A word in a string literal
    (`"precision": "amp"`, the key `"scaler"` itself), a flag (`"amp": args.amp`) and a keyword's
    name (`dict(scaler=None)`) hold nothing."""
    code = code_only(code)
    feature_scalers = ts.feature_scalers(facts)
    for match in _DOTTED.finditer(code):
        if _KEYWORD.match(code, match.end(1)):
            continue
        segments = [segment.strip() for segment in match.group(1).split(".")]
        prefixes = [".".join(segments[:length]) for length in range(1, len(segments) + 1)]
        if any(
            prefix in state_variables
            or facts.is_scaler(prefix, scope)
            or ("scaler" in prefix.split(".")[-1].lower() and prefix not in feature_scalers)
            for prefix in prefixes
        ):
            return True
        called_state_dict = match.group(2) and len(segments) > 1 and segments[-1] == "state_dict"
        if called_state_dict and _names_a_scaler(facts, prefixes[-2], scope):
            return True
    return False


def _optimizer_state_alone(facts: AmpFacts, save: CallSite, obj: cst.BaseExpression, scalers: list[str]) -> Hit:
    states = " and ".join(f"`{scaler}.state_dict()`" for scaler in _scalers_for(facts, save.scope, scalers, obj) or ["scaler"])
    return Hit(
        save.node,
        f"the optimizer state is saved on its own and this file never saves the GradScaler's"
        f"{_when_on(facts)}; {_resumed_run(facts)}; save {states} next to it and "
        f"restore it with `load_state_dict`",
        save.where.statement,
    )


def _resumed_run(facts: AmpFacts) -> str:
    if facts.has_autocast and rg.low_precision_words(facts) == "bfloat16":
        # bfloat16 gradients have float32's range: a scale that restarts high costs no skipped steps.
        return f"a resumed run restarts at {_initial_scale(facts)} (with bfloat16 autocast the scaler is not needed at all: see AMP010)"
    return f"a resumed run restarts at {_initial_scale(facts)} and skips steps while it re-calibrates"


def _initial_scale(facts: AmpFacts) -> str:
    """GradScaler's default initial scale, or the `init_scale=` the file passes (OpenPCDet reads
    it from its config, so 65536 would be a guess)."""
    given = {
        facts.module.code_for_node(value)
        for call in facts.scalers_in()
        if (value := argument(call.node, None, "init_scale")) is not None
    }
    if not given:
        return "the initial scale (65536)"
    return f"its initial scale (`{given.pop()}`)" if len(given) == 1 else "its initial scale"


def _when_on(facts: AmpFacts) -> str:
    """`, which is on when `dtype == 'float16'``: the one condition every scaler of the file is
    built or enabled under (nanoGPT's `enabled=(dtype == 'float16')`), so that the reader sees
    which runs lose the scale; nothing when a scaler is on unconditionally."""
    conditions = {_condition_of(facts, call) for call in facts.scalers_in() if not _literally_disabled(call)}
    if len(conditions) != 1 or None in conditions:
        return ""
    return f", which is on when `{conditions.pop()}`"


def _condition_of(facts: AmpFacts, call: CallSite) -> str | None:
    """The condition a scaler construction states, cut to the tests that also hold wherever its
    name is given another value that may be a scaler: allennlp's trainer builds `self._scaler =
    GradScaler()` under `if use_amp:` and `if wrapped_model is None:`, and in that `else` takes
    the same attribute from its wrapper's `init_grad_scaler()`, so the scaler is on whenever
    `use_amp`, not only without the wrapper. `None` given to it elsewhere (`self._scaler = None`
    first) is no scaler and cuts nothing."""
    operands = _stated_condition(facts, call)
    for others_hold in _tests_where_the_name_holds_another_scaler(facts, call):
        operands = [operand for operand in operands if facts.conjuncts(operand) <= others_hold]
    if not operands:
        return None
    return " and ".join(_condition_text(facts, operand, alone=len(operands) == 1) for operand in operands)


def _stated_condition(facts: AmpFacts, call: CallSite) -> list[cst.BaseExpression]:
    """The operands of the `and` a scaler construction is on under: its `enabled=` expression, or
    the test it is built under (`GradScaler() if args.amp else None`, `if self.config.use_amp:
    self.scaler = GradScaler()`, the tests of nested `if`s); none when it is on unconditionally."""
    enabled = argument(call.node, None, "enabled")
    parent = facts.parent_of.get(id(call.node))
    if enabled is not None:
        return [] if is_true(enabled) else and_operands(enabled)
    if isinstance(parent, cst.IfExp) and parent.body is call.node:
        return and_operands(parent.test)
    return [operand for guard in _guarding_ifs(call.where) for operand in and_operands(guard.test)]


def _condition_text(facts: AmpFacts, operand: cst.BaseExpression, alone: bool) -> str:
    """An operand as written, without its own parentheses unless joined to others by `and` needs
    them (`(b or c)`); `enabled=(dtype == 'float16')` reads `dtype == 'float16'`."""
    bare = operand.with_changes(lpar=[], rpar=[]) if getattr(operand, "lpar", None) else operand
    text = facts.module.code_for_node(bare)
    looser_than_and = isinstance(bare, (cst.BooleanOperation, cst.IfExp, cst.Lambda))
    return f"({text})" if isinstance(bare, cst.NamedExpr) or (looser_than_and and not alone) else text


def _tests_where_the_name_holds_another_scaler(facts: AmpFacts, call: CallSite) -> Iterator[frozenset[str]]:
    """For each other value the name or attribute a construction is stored in is given, unless it
    is None or provably no scaler (an optimizer, a model), the conditions that hold where it is."""
    stored = next((a for a in facts.assignments if any(arm is call.node for arm in arms_of(a.value))), None)
    if stored is None:
        return
    for other in (*facts.assignments, *facts.unpackings):  # `model, self.scaler = setup(...)` too
        if other is stored or other.key != stored.key or not _bind_the_same(stored, other):
            continue
        for arm in arms_of(other.value):
            if not _holds_no_scaler(facts, arm, other.where.scope):
                yield _tests_holding(facts, arm, other.where)


def _bind_the_same(a: Assignment, b: Assignment) -> bool:
    """Two assignments to one key bind one thing: `self.` attributes in methods of one class,
    names in one function."""
    if a.key.startswith(("self.", "cls.")):
        return a.where.scope.function_scope.class_name == b.where.scope.function_scope.class_name
    return a.where.scope.function_scope is b.where.scope.function_scope


def _holds_no_scaler(facts: AmpFacts, value: cst.BaseExpression, scope: Scope) -> bool:
    """None, a value of another kind (an optimizer, a model), or a scaler built `enabled=False`."""
    switched_off = any(c.node is value and _literally_disabled(c) for c in facts.scalers_in())
    return switched_off or is_none(value) or facts.value_kind(value, scope) not in (None, "scaler")


def _tests_holding(facts: AmpFacts, value: cst.BaseExpression, where: Context) -> frozenset[str]:
    """The conditions, as written, that hold where a value is bound: the tests of the `if`s whose
    body holds it (an `else` tells only that a test failed), of a conditional expression whose
    first arm it is, and a scaler construction's `enabled=`."""
    bodies = [node_id for node_id, label in where.branches if label == "body" and node_id in facts.if_tests]
    tests = frozenset().union(*(facts.conjuncts(facts.if_tests[node_id]) for node_id in bodies))
    parent = facts.parent_of.get(id(value))
    if isinstance(parent, cst.IfExp) and parent.body is value:
        tests |= facts.conjuncts(parent.test)
    enabled = argument(value, None, "enabled") if any(c.node is value for c in facts.scalers_in()) else None
    return tests | facts.conjuncts(enabled) if enabled is not None else tests


def _guarding_ifs(where: Context) -> tuple[cst.If, ...]:
    """The `if`s around the statement, outermost first, when the body of each (not an `else`)
    holds it: all their tests hold where it runs (`if cfg.use_amp:` then `if cfg.fp16:`)."""
    if any((id(guard), "body") not in where.branches for guard in where.ifs):
        return ()
    return where.ifs


# Calls that save or restore a checkpoint; a scaler handed to one is checkpointed there.
_CHECKPOINT_CALL = re.compile(r"save|checkpoint|ckpt", re.IGNORECASE)


def _saves_or_restores_a_checkpoint(name: str) -> bool:
    return bool(_CHECKPOINT_CALL.search(name)) or _names_a_save_helper(name)


# Save helpers from another file, by their name. One that starts with saving or checkpointing:
# EfficientDet's `saver.save_checkpoint(model, optimizer, epoch)`, MoFlow's `save_state(dir, model,
# optimizer, ...)`, VITS' `utils.save_checkpoint(net_g, optim_g, lr, epoch, path)` (not
# `create_checkpoint_engine`).
_STARTS_WITH_SAVING = re.compile(r"^_*(?:save|checkpoint|ckpt)", re.IGNORECASE)
# Or one whose words pair a verb that writes with what a checkpoint holds (names.CHECKPOINT_WRITE_VERBS:
# PhysicsNeMo's `write_checkpoint(model, optimizer, scheduler, epoch, ...)`). These verbs alone also
# name logging (`writer.write(...)`) and caching (`cache.store(...)`), so they need the object; the
# optimizer handed to the helper is still required.
# A helper named for reading restores the optimizer, it saves nothing (`load_checkpoint`,
# `checkpoint_restore`); `_load_without_scaler` covers restores.
_READ_VERBS = frozenset({"load", "reload", "restore", "read", "resume"})
# `write_checkpoint` -> write, checkpoint; `saveModelState` -> save, model, state.
_NAME_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")


def _names_a_save_helper(name: str) -> bool:
    words = {word.lower() for word in _NAME_WORD.findall(name)}
    if words & _READ_VERBS:
        return False
    return bool(_STARTS_WITH_SAVING.match(name)) or bool(words & names.CHECKPOINT_WRITE_VERBS and words & names.CHECKPOINT_CONTENTS)


# Threads and processes run `target` with `args` and `kwargs`: Thread(group, target, name, args, kwargs).
_STARTS_A_WORKER = frozenset({"threading.Thread", "multiprocessing.Process", "torch.multiprocessing.Process"})


def _call_it_runs(facts: AmpFacts, call: CallSite) -> CallSite:
    """The call that work started in the background makes, as if written where it is started (a
    node outside the tree: findings go to `call`): `threading.Thread(target=write_checkpoint,
    args=(model, optimizer, ...))`, so that training goes on while the checkpoint is written, or an
    executor's `submit(fn, *args, **kwargs)` (concurrent.futures' protocol, dask's too, whatever
    the receiver). Any other call runs itself."""
    if call.qualname in _STARTS_A_WORKER:
        function, args = call.arg(1, "target"), _worker_arguments(call.arg(3, "args"), call.arg(4, "kwargs"))
    elif call.method == "submit" and call.node.args and call.node.args[0].keyword is None and not call.node.args[0].star:
        function, args = call.node.args[0].value, list(call.node.args[1:])
    else:
        return call
    if function is None:
        return call
    method = function.attr.value if isinstance(function, cst.Attribute) else None
    receiver = function.value if isinstance(function, cst.Attribute) else None
    return CallSite(
        cst.Call(func=function, args=args), dotted_name(function), method, receiver, dotted_name(receiver),
        call.where, facts.qualname(function, call.scope),
    )


def _worker_arguments(args: cst.BaseExpression | None, kwargs: cst.BaseExpression | None) -> list[cst.Arg]:
    """`Thread(target=f, args=a, kwargs=k)` runs `f(*a, **k)`: the items of a tuple or list `a`
    are its positional arguments, the entries of a dict `k` (`{"epoch": epoch}`, `dict(epoch=epoch)`)
    its keywords; anything else is passed as `*a` or `**k`."""
    passed = []
    if isinstance(args, (cst.Tuple, cst.List)):
        passed += [cst.Arg(e.value, star="*" if isinstance(e, cst.StarredElement) else "") for e in args.elements]
    elif args is not None:
        passed.append(cst.Arg(args, star="*"))
    keywords = _keywords_of(kwargs)
    if keywords is not None:
        passed += keywords
    elif kwargs is not None:
        passed.append(cst.Arg(kwargs, star="**"))
    return passed


def _keywords_of(mapping: cst.BaseExpression | None) -> list[cst.Arg] | None:
    """A dict's entries as keyword arguments, when every key can be one."""
    if isinstance(mapping, cst.Call) and dotted_name(mapping.func) == "dict" and all(a.keyword or a.star == "**" for a in mapping.args):
        return list(mapping.args)
    if not isinstance(mapping, cst.Dict):
        return None
    keywords = []
    for element in mapping.elements:
        if isinstance(element, cst.StarredDictElement):
            keywords.append(cst.Arg(element.value, star="**"))
            continue
        key = string_literal(element.key)
        if key is None or not key.isidentifier():
            return None
        keywords.append(cst.Arg(element.value, keyword=cst.Name(key)))
    return keywords


def _stepped_or_built_optimizers(facts: AmpFacts) -> set[str]:
    """Names that hold an optimizer object, not its state (`optimizer_state`): built here, stepped,
    zeroed, restored (YOLOP builds it elsewhere, steps it in another file, and here only loads its
    state on resume and hands it to its save helper), or stepped by a scaler."""
    keys = {a.key for a in facts.assignments if facts.value_kind(a.value, a.where.scope) == "optimizer"}
    for call in facts.calls:
        if call.method in ("step", "zero_grad", "load_state_dict") and facts.is_optimizer(call.receiver_key, call.scope):
            keys.add(call.receiver_key)
        elif call.method in ("step", "unscale_") and facts.is_scaler(call.receiver_key, call.scope):
            keys.add(dotted_name(call.arg(0, "optimizer")) or "")
    return keys - {""}


def _given_an_optimizer(facts: AmpFacts, call: CallSite, optimizers: set[str]) -> bool:
    """A save helper of another file given an optimizer object (it saves its state itself); `call`
    may be the one a thread or an executor makes (`_call_it_runs`). Not torch's own functions:
    `torch.utils.checkpoint.checkpoint` recomputes activations."""
    if not _names_a_save_helper(call.name) or (call.qualname or "").startswith(("torch.", _XLA)):
        return False
    if facts.called_function(call) is not None:
        return False  # this file's own helpers are followed to their torch.save
    return any(_holds_an_optimizer(facts, arg.value, call.scope, optimizers) for arg in call.node.args)


def _holds_an_optimizer(
    facts: AmpFacts, value: cst.BaseExpression, scope: Scope, optimizers: set[str], depth: int = 0
) -> bool:
    """An optimizer object, or what may only be one or None: `optimizer if args.save_opt else None`,
    or a name bound to that or to a plain alias (DDSP-SVC's `optimizer_save = optimizer if
    args.train.save_opt else None`, then `saver.save_model(model, optimizer_save, ...)`): the helper
    saves the optimizer's state whenever it is given one."""
    arms = [arm for arm in arms_of(value) if not is_none(arm)]
    return bool(arms) and all(_an_optimizer_or_its_alias(facts, arm, scope, optimizers, depth) for arm in arms)


def _an_optimizer_or_its_alias(
    facts: AmpFacts, value: cst.BaseExpression, scope: Scope, optimizers: set[str], depth: int
) -> bool:
    key = dotted_name(value)
    if key is None:
        return False
    if key in optimizers:
        return True
    bound = facts.bindings(key, scope) if depth < 3 else []
    return bool(bound) and all(
        _holds_an_optimizer(facts, bound_value, bound_scope, optimizers, depth + 1) for bound_value, bound_scope in bound
    )


def _optimizer_handed_to_a_helper(facts: AmpFacts, call: CallSite, helper: str) -> Hit:
    return Hit(
        call.node,
        f"`{helper}(...)` is given the optimizer but not the GradScaler{_when_on(facts)}, and this "
        f"file never saves the scaler's state; {_resumed_run(facts)}; pass the scaler too, so that its `state_dict()` is saved "
        "and restored with the optimizer's",
        call.where.statement,
    )


def _passes_a_state_dict(call: CallSite) -> bool:
    return any(
        isinstance(arg.value, cst.Call) and isinstance(arg.value.func, cst.Attribute) and arg.value.func.attr.value == "state_dict"
        for arg in call.node.args
    )


def _away_from_every_scaler(facts: AmpFacts, scope: Scope) -> bool:
    """Every GradScaler is a local of other functions, none comes in as a parameter, and the
    save or load is in a test function (tests run on their own, so apex's scaler test and its
    fp32 checkpoint test share nothing) or in one that trains an optimizer of its own (an fp32
    linear probe beside the AMP fine-tuning of the same file): no scaler ever steps it. (Library
    functions handed an optimizer, `save(model, optimizer)`, may be run with a scaler elsewhere.)"""
    function = scope.function_scope
    if function.kind != "function" or any("scaler" in p.lower() for p in function.params):
        return False
    for assignment in facts.assignments:
        if facts.value_kind(assignment.value, assignment.where.scope) != "scaler":
            continue
        owner = assignment.where.scope.function_scope
        if "." in assignment.key or owner.kind != "function" or owner is function:
            return False  # an attribute, a module-level scaler, or this function's own
    if any(facts.is_scaler(c.receiver_key, c.scope) for c in function.calls if c.receiver_key):
        return False  # a scaler from a factory (`scaler = build_scaler(cfg)`) is this function's own
    return function.name.startswith("test") or _trains_its_own_optimizer(facts, function)


def _trains_its_own_optimizer(facts: AmpFacts, function: Scope) -> bool:
    """The function builds an optimizer (`torch.optim.SGD(...)`, `self._create_optimizer(...)`)
    into a local name and reaches no other: none handed in as a parameter or held by one
    (`trainer.optimizer`, `state.pop("optimizer")`), none an attribute of `self` that a scaler
    elsewhere may step."""
    own = {
        a.key for a in facts.assignments
        if a.where.scope.function_scope is function and "." not in a.key and facts.is_optimizer(a.key, a.where.scope)
        and _builds_an_optimizer(facts, a.value, a.where.scope)
    }
    outside = {"self", "cls", *function.params} - own
    return bool(own) and not any(
        key.split(".")[0] in outside and facts.is_optimizer(key, function)
        for key in [*function.params, *(c.receiver_key for c in function.calls if c.receiver_key)]
    )


def _builds_an_optimizer(facts: AmpFacts, value: cst.BaseExpression, scope: Scope) -> bool:
    if not isinstance(value, cst.Call):
        return False
    called = dotted_name(value.func) or ""
    return facts.value_kind(value, scope) == "optimizer" or bool(_OPTIMIZER_FACTORY.search(called.split(".")[-1]))


_OPTIMIZER_FACTORY = re.compile(r"optim", re.IGNORECASE)


def _checkpoint_without_scaler(facts: AmpFacts, call: CallSite, obj, reported: set[int]) -> tuple[cst.CSTNode, str] | None:
    """The checkpoint `call` saves (its dict, and the code that fills it), when it holds an
    optimizer state and no scaler; each dict once."""
    built = (obj, [facts.module.code_for_node(obj)]) if obj is call.node else _dict_construction(facts, obj, call.scope, call.where)
    if built is None or id(built[0]) in reported:
        return None
    dict_node, texts = built
    # `"optimizer": None,  # optimizer.state_dict(),` saves no optimizer state, nor a commented-out scaler.
    text = code_only("\n".join(texts), keep_strings=True)
    # Strings blanked fill by fill: one that does not tokenize leaves the others blanked.
    code = "\n".join(code_only(fill) for fill in texts)
    if not _OPTIMIZER_STATE.search(text) or _holds_a_scaler(facts, code, call.scope, _scaler_state_variables(facts, dict_node)):
        return None
    if isinstance(dict_node, cst.Dict) and any(isinstance(e, cst.StarredDictElement) for e in dict_node.elements):
        return None  # `**extra`: the scaler may be in there
    reported.add(id(dict_node))
    return dict_node, text


def _save_without_scaler(facts: AmpFacts, call: CallSite, obj, scalers: list[str], reported: set[int]) -> Hit | None:
    found = _checkpoint_without_scaler(facts, call, obj, reported)
    if found is None:
        return None
    dict_node, text = found
    fix = None
    # The entry goes where the dict is built: a helper that returns it (OpenPCDet's
    # `checkpoint_state(model, optimizer, ...)`) may not see the scaler of the function that saves.
    builder = facts.function_holding(dict_node)
    chosen = _scalers_for(facts, builder, scalers, text)
    # The scaler is where the save is called from, or where the function that saves is called
    # from (MONAI's `save_checkpoint(model, epoch, optimizer=optimizer)`), not where the dict is built.
    callers = [call.scope, *(caller.scope for caller in facts.callers(builder))]
    unseen = not chosen and any(
        scope.function_scope is not builder and _scalers_for(facts, scope, scalers, text) for scope in callers
    )
    # Several scalers (a GAN's generator and discriminator each have one) go in under their own names.
    entries = [
        (scaler.split(".")[-1] if len(chosen) > 1 else "scaler", _saved_state(facts, call, scaler, builder))
        for scaler in chosen
    ] or [("scaler", "scaler" if _saves_objects(call) else "scaler.state_dict()")]
    distinct_keys = len({key for key, _ in entries}) == len(entries)  # `gen.scaler` and `disc.scaler` would clash
    if isinstance(dict_node, cst.Dict) and dict_node.elements and chosen and distinct_keys:
        statement = _statement_of(facts, dict_node)
        replacements = _with_scaler_entries(facts, dict_node, entries, statement) if statement is not None else None
        fix = FixPlan(Applicability.UNSAFE, replacements) if replacements else None
    add = "add " + " and ".join(f"`\"{key}\": {saved}`" for key, saved in entries)
    if isinstance(dict_node, cst.Call) and _constructs_a_class_of_this_file(facts, dict_node):
        # `Snapshot(model_state=..., optimizer_state=...)`, saved through `asdict`: a field, not a key.
        fields = " and ".join(f"`{key}_state` filled with `{saved}`" for key, saved in entries)
        add = f"add a field to `{dotted_name(dict_node.func)}`, {fields},"
    if unseen:
        add = f"`{builder.name}()`, which builds the checkpoint, does not see the scaler: pass it in, {add}"
    them = "them" if len(entries) > 1 else "it"
    restore = f"restore {them} with `load_state_dict`" if not _saves_objects(call) else f"`Checkpoint.load_objects` then restores {them}"
    return Hit(
        call.node,
        f"this checkpoint saves the optimizer state but not the GradScaler's{_when_on(facts)}; "
        f"{_resumed_run(facts)}; {add} and {restore}",
        call.where.statement,
        fix,
    )


def _saved_state(facts: AmpFacts, call: CallSite, scaler: str, builder: Scope) -> str:
    """What the checkpoint entry holds: the scaler itself for ignite, which calls `state_dict()`;
    else its state, guarded where the scaler may be None or not exist."""
    if _saves_objects(call):
        return scaler
    built_under = _built_only_under(facts, scaler, builder)
    if built_under is not None:
        return f"{scaler}.state_dict() if {built_under} else None"
    holder, _, attribute = scaler.partition(".")
    if holder == "self" and "." not in attribute and _common_guards(_bindings_of(facts, scaler, builder)):
        # FourCastNet's `if params.enable_amp: self.gscaler = GradScaler()` in `__init__`: the flag
        # is a constructor argument the saving method cannot read, and without it the attribute
        # does not exist.
        return f'{scaler}.state_dict() if hasattr(self, "{attribute}") else None'
    if _may_be_none(facts, scaler, builder):
        return f"{scaler}.state_dict() if {scaler} is not None else None"
    return f"{scaler}.state_dict()"


def _built_only_under(facts: AmpFacts, scaler: str, scope: Scope) -> str | None:
    """The flag a scaler is built under when nothing else binds it (minGPT-ddp's `if
    self.config.use_amp: self.scaler = GradScaler(...)`): without the flag the name does not
    exist, so its state is saved as `scaler.state_dict() if <flag> else None`. Only a flag that
    can be read where the checkpoint is built (`self.` in the same class, or a name bound there)."""
    assignments = _bindings_of(facts, scaler, scope)
    guards = _common_guards(assignments)
    if guards is None:
        return None
    flags = [dotted_name(guard.test) for guard in guards]
    same_class = all(a.where.scope.function_scope.class_name == scope.function_scope.class_name for a in assignments)

    def readable(flag: str | None) -> bool:
        root = (flag or "").split(".")[0]
        if root == "self":
            return same_class
        return bool(root) and bool(facts.bindings(root, scope) or root in scope.function_scope.params)

    return " and ".join(flags) if all(readable(flag) for flag in flags) else None


def _bindings_of(facts: AmpFacts, scaler: str, scope: Scope) -> list:
    return [a for a in facts.assignments if a.key == scaler and any(value is a.value for value, _ in facts.bindings(scaler, scope))]


def _common_guards(assignments: list) -> tuple[cst.If, ...] | None:
    """The `if`s every one of the scaler's bindings is under, when all are under the same ones."""
    guards = {_guarding_ifs(a.where) for a in assignments}
    if len(guards) != 1 or () in guards:
        return None
    return guards.pop()


def _scaler_state_variables(facts: AmpFacts, node: cst.CSTNode) -> set[str]:
    """Names the function holding `node` (or the module) binds to a scaler's state: Transformer-XL's
    `amp_state = scaler.state_dict()` (`amp.state_dict()` under apex, None without AMP), saved as
    `{"amp_state": amp_state, ...}`."""
    holders = {id(holder) for holder in facts.ancestors(node)}
    statements = {
        id(call.where.statement) for call in facts.calls
        if call.method == "state_dict" and _names_a_scaler(facts, call.receiver_key, call.scope)
    }
    return {
        assignment.key for assignment in facts.assignments
        if id(assignment.where.statement) in statements and id(assignment.where.scope.function_scope.node) in holders
    }


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


def _scalers_for(facts: AmpFacts, scope: Scope, scalers: list[str], saved: str | cst.BaseExpression) -> list[str]:
    """The scalers, bound in `scope`, whose state goes with the optimizer states saved: those that
    step an optimizer the saved code names (LlamaGen's VQ trainer: `scaler` steps `optimizer`,
    `scaler_disc` steps `optimizer_disc`, and its checkpoint holds both), else the one scaler bound
    there; none when that is ambiguous."""
    function = scope.function_scope
    visible = {
        key for key in scalers
        if facts.bindings(key, scope) and (key.startswith("self.") == (function.class_name is not None))
    }
    visible |= {p for p in function.params if "scaler" in p.lower()}
    stepping = [scaler for scaler in _scalers_stepping(facts, saved) if scaler in visible]
    if stepping:
        return stepping
    return list(visible) if len(visible) == 1 else []


def _scalers_stepping(facts: AmpFacts, code: str | cst.BaseExpression) -> list[str]:
    """The scalers that step or unscale an optimizer named in `code` (`scaler_disc.step(optimizer_disc)`),
    in the order the file first does so."""
    text = code if isinstance(code, str) else facts.module.code_for_node(code)
    found: list[str] = []
    for call in facts.calls:
        optimizer = dotted_name(call.arg(0, "optimizer")) if call.method in ("step", "unscale_") else None
        if (
            optimizer is not None
            and call.receiver_key not in found
            and facts.is_scaler(call.receiver_key, call.scope)
            and _names(text, optimizer)
        ):
            found.append(call.receiver_key)
    return found


def _names(text: str, key: str) -> bool:
    """Whether code uses a name or attribute itself: not `self.optimizer` for `optimizer`, nor the
    string key `"optimizer"`, nor `optimizer_disc`."""
    return re.search(rf"(?<![\w.'\"]){re.escape(key)}(?![\w'\"])", text) is not None


def _may_be_none(facts: AmpFacts, scaler: str, scope: Scope, depth: int = 0) -> bool:
    """`scaler = GradScaler() if args.amp else None` (torchvision), `scaler = None` before an
    `if` builds one, or a parameter a caller of this file passes such a name for: saving
    `scaler.state_dict()` unguarded would crash the runs without AMP."""
    bindings = facts.bindings(scaler, scope)
    if any(_none_or_none_branch(value) for value, _ in bindings):
        return True
    function = scope.function_scope
    if bindings or scaler not in function.params or depth > 2:
        return False
    return any(
        passed is not None and _may_be_none(facts, passed, caller.scope, depth + 1)
        for caller, value in facts.passed_for(function, scaler)
        for passed in [dotted_name(value)]
    )


def _none_or_none_branch(value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.IfExp):
        return _none_or_none_branch(value.body) or _none_or_none_branch(value.orelse)
    return is_none(value)


def _with_scaler_entries(
    facts: AmpFacts, node: cst.Dict, entries: list[tuple[str, str]], statement: cst.CSTNode
) -> tuple[Replacement, ...] | None:
    """Append `"scaler": <saved>` (one entry per key) after the dict's last entry, in the dict's own layout."""
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
    entry = separator.join(f"{quote}{key}{quote}: {saved}" for key, saved in entries)
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
    entries_taken = list(_entries_taken_from_a_loaded_checkpoint(facts))
    if any(_SCALER.search(key) for key, _ in entries_taken):
        return  # `scaler_state = checkpoint["scaler"]`, handed to whatever restores it
    restores = [c for c in loads if facts.is_optimizer(c.receiver_key, c.scope) and not _on_the_tpu_branch(facts, c)]
    for call in restores:
        if not _away_from_every_scaler(facts, call.scope):
            # The scaler that steps this optimizer: a GAN's discriminator has its own.
            restoring = " and ".join(
                f"`{scaler}.load_state_dict(...)`" for scaler in _scalers_stepping(facts, call.receiver_key) or ["scaler"]
            )
            yield Hit(
                call.node,
                f"the checkpoint restores `{call.receiver_key}` but this file {NEVER_RESTORES} "
                f"({restoring}){_when_on(facts)}; {_resumed_run(facts)}",
                call.where.statement,
            )
    if restores:
        return  # the entry read here is the state the restore above loads: one finding
    # No optimizer is restored here, but its state is taken out of the checkpoint for code
    # elsewhere to restore (NVIDIA's ConvNets: `optimizer_state = checkpoint["optimizer"]`, then
    # `get_optimizer(..., state=optimizer_state)`): the optimizer resumes, the scaler does not.
    for key, assignment in entries_taken:
        if _OPTIMIZER_ENTRY.search(key) and not _away_from_every_scaler(facts, assignment.where.scope):
            yield Hit(
                assignment.value,
                f"the optimizer state is taken from the loaded checkpoint (`{key}`) but this file "
                f"{NEVER_RESTORES} (`scaler.load_state_dict(...)`){_when_on(facts)}; {_resumed_run(facts)}",
                assignment.where.statement,
            )


_OPTIMIZER_ENTRY = re.compile(r"^optim", re.IGNORECASE)


def _entries_taken_from_a_loaded_checkpoint(facts: AmpFacts) -> Iterator[tuple[str, Assignment]]:
    """`state = checkpoint["optimizer"]` where `checkpoint = torch.load(...)`: each key read into
    a name (the last of a nested read, `checkpoint["training"]["amp"]["scaler"]`), with its
    assignment."""
    for assignment in facts.assignments:
        value = assignment.value
        if not (isinstance(value, cst.Subscript) and len(value.slice) == 1):
            continue
        index = value.slice[0].slice
        key = string_literal(index.value) if isinstance(index, cst.Index) else None
        if key is None:
            continue
        container = value.value
        while isinstance(container, cst.Subscript):
            container = container.value
        checkpoint = dotted_name(container)
        if checkpoint is not None and any(
            isinstance(bound, cst.Call) and facts.qualname(bound.func, scope) == "torch.load"
            for bound, scope in facts.bindings(checkpoint, assignment.where.scope)
        ):
            yield key, assignment
