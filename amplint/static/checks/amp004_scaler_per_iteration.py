"""AMP004 scaler-per-iteration: a GradScaler built per batch or per epoch instead of once per run."""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from amplint.static import names
from amplint.static.checks import Hit
from amplint.static.checks import _training_step as ts
from amplint.static.semantics import AmpFacts, CallSite, Loop, argument, built_disabled, dotted_name, is_per_step_function

CODE = "AMP004"

# A loop over folds, trials, seeds or configurations starts a new training run each iteration.
_RUN = re.compile(r"fold|trial|seed|run|split|config|experiment|repeat|sweep|task|cfg|hparam|model|lrs?\b")
_SCALER_USE = {"step", "update", "scale", "unscale_"}


def _assigned_key(call: CallSite) -> str | None:
    statement = call.where.statement
    if isinstance(statement, cst.SimpleStatementLine):
        for small in statement.body:
            if isinstance(small, (cst.Assign, cst.AnnAssign)) and _built_by(small.value, call):
                target = small.targets[0].target if isinstance(small, cst.Assign) else small.target
                return dotted_name(target)
    return None


def _built_by(value: cst.BaseExpression | None, call: CallSite) -> bool:
    """The assigned value is the constructor, one arm of a conditional around it
    (`scaler = GradScaler() if args.amp else None`), or the fallback of an `or`
    (`scaler = scaler or GradScaler()`)."""
    if isinstance(value, cst.IfExp):
        return call.node in (value.body, value.orelse)
    if isinstance(value, cst.BooleanOperation) and isinstance(value.operator, cst.Or):
        return value.right is call.node
    return value is call.node


def _built_once(call: CallSite, facts: AmpFacts) -> bool:
    """Built on one iteration only: when the scaler is still unset (`if scaler is None:`,
    `scaler = scaler or GradScaler()`, `GradScaler() if scaler is None else scaler`) or on the
    loop's first step (`if step == 0:`, `if not step:`). The guard is read as an expression, not
    as text, so its spelling (`0 == step`, `step == 0 and args.amp`) does not matter."""
    value = facts.parent_of.get(id(call.node))
    if isinstance(value, cst.BooleanOperation) and isinstance(value.operator, cst.Or) and value.right is call.node:
        return _unset(value.left, call)
    if isinstance(value, cst.IfExp) and value.body is call.node and _first_time(value.test, call, facts):
        return True
    return any(_first_time(guard.test, call, facts, guard) for guard in call.where.ifs)


def _first_time(test: cst.BaseExpression, call: CallSite, facts: AmpFacts, guard: cst.If | None = None) -> bool:
    """A test true on one iteration: the scaler unset, or something the guarded block sets
    (physicsnemo's `if optimizer is None: optimizer = Adam(...); scaler = GradScaler(...)`), or a
    loop counter at its start value; anywhere in an `and` chain, since the other conditions only
    narrow it."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _first_time(test.left, call, facts, guard) or _first_time(test.right, call, facts, guard)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        operand = test.expression
        if isinstance(operand, cst.Call) and dotted_name(operand.func) == "hasattr":
            return True  # `if not hasattr(self, "scaler"):`
        # `not step` on a counter starting at 0 is the first step; on one starting later, never.
        return (
            _unset(operand, call) or _set_in(guard, operand, facts)
            or any(loop.binds(dotted_name(operand)) for loop in call.where.loops)
        )
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        operator, right = test.comparisons[0].operator, test.comparisons[0].comparator
        if isinstance(operator, cst.Is):
            return any(
                _unset(side, call) or _set_in(guard, side, facts)
                for side, other in ((test.left, right), (right, test.left)) if _is_none(other)
            )
        if isinstance(operator, cst.Equal):
            return any(_at_start(side, other, call, facts) for side, other in ((test.left, right), (right, test.left)))
    return False


def _unset(subject: cst.BaseExpression, call: CallSite) -> bool:
    """`subject` is the scaler being checked for None or falsiness: the name the construction is
    assigned to, or any name that says it holds a scaler (`self._scaler`, bound in a walrus)."""
    if isinstance(subject, cst.NamedExpr):
        return _unset(subject.target, call) or _unset(subject.value, call)
    name = dotted_name(subject)
    return name is not None and (name == _assigned_key(call) or bool(names.SCALER_WORD.search(name)))


def _set_in(guard: cst.If | None, subject: cst.BaseExpression, facts: AmpFacts) -> bool:
    """The `if` block assigns the name its test found unset: the block runs once."""
    name = dotted_name(subject)
    return guard is not None and name is not None and any(
        a.key == name and ts.within(facts, a.where.statement, guard.body) for a in facts.assignments
    )


def _is_none(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _at_start(counter: cst.BaseExpression, value: cst.BaseExpression, call: CallSite, facts: AmpFacts) -> bool:
    """`counter == value` where value is where the counter starts: the `start` of the enumerate
    or range loop binding it, else 0 (`global_step == 0` on a hand-kept counter)."""
    name = dotted_name(counter)
    if name is None:
        return False
    loop = next((loop for loop in reversed(call.where.loops) if loop.binds(name)), None)
    start = _start(loop) if loop is not None else None
    expected = facts.module.code_for_node(start).strip() if start is not None else "0"
    return facts.module.code_for_node(value).strip() == expected


def _start(loop: Loop) -> cst.BaseExpression | None:
    """The first value of a loop's counter when it is not 0: `enumerate(xs, start=1)`, `range(1, n)`."""
    iterable = getattr(loop.node, "iter", None)
    if not isinstance(iterable, cst.Call):
        return None
    function = dotted_name(iterable.func)
    if function == "enumerate":
        return argument(iterable, 1, "start")
    if function == "range" and argument(iterable, 1, None) is not None:
        return argument(iterable, 0, None)
    return None


def _loop_depth_of_uses(loop: Loop, key: str | None, facts: AmpFacts) -> list[int]:
    """For each use of the scaler inside `loop`, how many loops sit between it and `loop`.

    A use in a same-file helper called from the loop counts too, whatever the helper names its
    scaler parameter: the loops around the call and inside the helper are both counted.
    """
    depths = []
    for use in facts.calls:
        if use.method not in _SCALER_USE or use.receiver_key is None:
            continue
        if use.receiver_key != key and not facts.is_scaler(use.receiver_key, use.scope):
            continue
        chain = facts.loop_chain(use.where)  # outermost first
        if loop in chain:
            depths.append(len(chain) - 1 - chain.index(loop))
    return depths


def _passes_on_in_an_inner_epoch_loop(loop: Loop, key: str | None, facts: AmpFacts) -> bool:
    """The scaler is handed to a call (`train_one_epoch(..., scaler)`, defined in another file)
    inside an epoch loop nested in `loop`: each iteration of `loop` is a whole training run."""
    for call in facts.calls:
        passed = (dotted_name(arg.value) for arg in call.node.args)
        if not any(name is not None and (name == key or facts.is_scaler(name, call.scope)) for name in passed):
            continue
        chain = facts.loop_chain(call.where)  # outermost first
        if loop in chain and any(names.EPOCH.search(inner.text) for inner in chain[chain.index(loop) + 1:]):
            return True
    return False


def _starts_a_run(loop: Loop, facts: AmpFacts) -> bool:
    """The loop body builds a model or an optimizer next to the scaler: one scaler per run. Not
    `model.train()` or `model.to(device)` each epoch: the same model, switched or moved."""
    for call in facts.calls:
        if call.where.loops and call.where.loops[-1] is loop and call.method not in _SAME_MODEL:
            if facts.value_kind(call.node, call.scope) in ("optimizer", "model"):
                return True
    return False


_SAME_MODEL = {"train", "eval", "to", "cuda", "cpu", "half", "float", "bfloat16", "requires_grad_"}


def _period(innermost: tuple[Loop, CallSite | None], key: str | None, facts: AmpFacts) -> tuple[Loop, CallSite | None, str] | None:
    """How often a scaler built in this loop is rebuilt ("epoch", "iteration"), or None when once
    per run is right."""
    loop, via = innermost
    depths = _loop_depth_of_uses(loop, key, facts)
    epoch_loop = bool(names.EPOCH.search(loop.text))
    if 0 in depths:
        return loop, via, "epoch" if epoch_loop else "iteration"
    run_loop = (
        _starts_a_run(loop, facts) or (bool(_RUN.search(loop.text)) and not epoch_loop)
        or _passes_on_in_an_inner_epoch_loop(loop, key, facts)
    )
    if run_loop or (depths and min(depths) > 1):
        # One scaler per fold, trial or run is right; so is one per iteration of a loop with
        # whole epoch and batch loops inside it, whatever that loop is called.
        return None
    return loop, via, "epoch" if epoch_loop or depths else "iteration"


def _runs_its_own_batch_loop(function, key: str | None) -> bool:
    """`def train_iter(...)`: a name like a step's, but the scaler steps in a loop inside it, so
    the function is a whole pass over the data, not a step. One named for an epoch
    (`train_one_epoch`) still rebuilds the scaler per epoch."""
    if "epoch" in function.name.lower():
        return False
    return any(
        call.receiver_key == key and call.method in ("scale", "step", "update")
        and bool(call.where.statement_loops)
        for call in function.calls
    )


def _remedy(facts: AmpFacts, call: CallSite, key: str | None, via: CallSite | None) -> str:
    """Where the one scaler goes. Reached through a call, the function the loop calls builds it:
    a factory (`return GradScaler()`) is called once before the loop; a step or epoch function
    gets the scaler from its caller; a method keeps it on `self`, built in `__init__`."""
    if via is None:
        return "build it once before the loop"
    if isinstance(facts.parent_of.get(id(call.node)), cst.Return):
        return f"call `{via.name}()` once before the loop"
    if key is not None and key.startswith("self."):
        return f"build `{key}` once, in `__init__`"
    return f"build it once before the loop and pass it to `{via.name}()`"


def check(facts: AmpFacts) -> Iterator[Hit]:
    for call in facts.scalers_in():
        # A scaler built with `enabled=False` has no scale to calibrate: rebuilding it loses nothing.
        if _built_once(call, facts) or built_disabled(call.node):
            continue
        key = _assigned_key(call)
        per_caller = list(facts.loops_per_caller(call.where))
        if not per_caller:
            function = call.scope.function_scope
            if (
                function.kind == "function" and is_per_step_function(function) and not facts.callers(function)
                and not _runs_its_own_batch_loop(function, key)
            ):
                yield Hit(
                    call.node,
                    f"a new GradScaler is built on every call of `{function.name}()`, which runs per "
                    f"step or per epoch; build it once before training and pass it in",
                    call.where.statement,
                )
            continue
        # A factory is judged at each of its callers: the first that rebuilds the scaler per epoch
        # or per step is reported.
        verdicts = (_period(loops[0], key, facts) for loops in per_caller)
        loop, via, period = next((verdict for verdict in verdicts if verdict is not None), (None, None, None))
        if period is None:
            continue
        reached = " (through the call on line {1})" if via is not None else ""
        # Rebuilt per epoch, the scale does calibrate, then starts over: the loss is the
        # re-calibration's skipped steps, once per epoch. Rebuilt per step, it never calibrates.
        cost = (
            "its loss scale starts over every epoch and the steps that overflow while it re-calibrates are skipped again each time"
            if period == "epoch"
            else "its loss scale never calibrates and overflowing steps are skipped again and again"
        )
        yield Hit(
            call.node,
            f"a new GradScaler is built every {period} of the loop on line {{0}}{reached}, so {cost}; "
            f"{_remedy(facts, call, key, via)}",
            call.where.statement,
            related=(loop.node, via.node) if via is not None else (loop.node,),
        )
