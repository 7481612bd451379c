"""Shared queries for the training-step rules (AMP006-AMP017).

AmpFacts records calls with their loops, `with` items and `if`s; these rules also need the order of
scaler/optimizer/scheduler events inside one iteration (with one level of same-file helpers spliced
in at their call site), which `if` branch a call sits in, and the parent map (recorded by the
facts pass) for fixes that insert a statement. Everything here is computed lazily, once per
AmpFacts.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst

from amplint.static import names
from amplint.static.checks import Replacement
from amplint.static.semantics import (
    AmpFacts,
    Assignment,
    CallSite,
    Context,
    Loop,
    Scope,
    argument,
    dotted_name,
    ends_with,
    mutually_exclusive,
)

_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def cached(facts: AmpFacts, key: str, build):
    table = _CACHE.setdefault(facts, {})
    if key not in table:
        table[key] = build()
    return table[key]


# ---------------------------------------------------------------------------------------------
# Tree structure: parents, indentation, statement insertion


def parents(facts: AmpFacts) -> dict[int, cst.CSTNode]:
    """id(node) -> its parent, as the facts pass recorded it (no second walk of the tree)."""
    return facts.parent_of


def indentation(facts: AmpFacts, statement: cst.CSTNode) -> str:
    """The indentation of a statement: the indents of every block around it."""
    parts = []
    for node in facts.ancestors(statement):
        if isinstance(node, cst.IndentedBlock):
            parts.append(node.indent if node.indent is not None else facts.module.default_indent)
    return "".join(reversed(parts))


def code_in_place(facts: AmpFacts, original: cst.CSTNode, new: cst.CSTNode | None = None) -> str:
    """The source of `new` (by default `original` itself) to stand where `original` stands.

    `Module.code_for_node` writes a node as if at module level, so the lines libcst indents with
    the enclosing blocks (a call's arguments one per line, its closing bracket) would lose their
    indentation; here they keep the blocks' indentation around `original`."""
    # libcst has no public way to generate code at a given indentation.
    from libcst._nodes.internal import CodegenState

    module = facts.module
    state = CodegenState(default_indent=module.default_indent, default_newline=module.default_newline)
    state.increase_indent(indentation(facts, original))
    node = original if new is None else new
    if getattr(node, "lpar", None):
        node = node.with_changes(lpar=[], rpar=[])  # a node's position leaves out its own parentheses
    node._codegen(state)
    return "".join(state.tokens)


def insert_after(facts: AmpFacts, statement: cst.CSTNode, text: str) -> Replacement | None:
    """A replacement that adds `text` as a new statement on the line after the simple statement
    `statement` (after its trailing comment, which stays on its line); None after a compound one."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return None
    indent = indentation(facts, statement)
    # The last small statement or the comment: the statement line itself would carry the blank
    # lines and comments above it into the replacement.
    anchor = statement.trailing_whitespace.comment or statement.body[-1]
    return Replacement(anchor, f"{code_in_place(facts, anchor).rstrip()}\n{indent}{text}")


# ---------------------------------------------------------------------------------------------
# Kinds of receivers


_SCHEDULER_NAME = re.compile(r"sched|lr_policy|warmup")


def is_scheduler(facts: AmpFacts, key: str | None, scope: Scope, where: Context | None = None) -> bool:
    if key is None:
        return False
    if "scaler" in key.split(".")[-1].lower():
        return False
    if where is not None and any(_walks_schedulers(loop, key) for loop in where.loops):
        return True  # `for s in self.schedulers: s.step()`
    for value, value_scope in facts.bindings(key, scope):
        if facts.value_kind(value, value_scope) == "scheduler":
            return True
    return _named_as_a_scheduler(key)


def _named_as_a_scheduler(key: str) -> bool:
    last = key.split(".")[-1].lower()
    return "scaler" not in last and bool(_SCHEDULER_NAME.search(last))


def _one_of_the_schedulers(call: CallSite) -> bool:
    """`self.lr_schedulers[name].step()`: an element of a collection named for schedulers (X-Decoder
    keeps one per model in a dict)."""
    receiver = call.receiver
    collection = dotted_name(receiver.value) if isinstance(receiver, cst.Subscript) else None
    if collection is None:
        return False
    last = collection.split(".")[-1].lower()
    return "scaler" not in last and bool(_SCHEDULER_NAME.search(last))


def _calls_a_schedule_function(facts: AmpFacts, call: CallSite) -> bool:
    """`scheduler(step)`: a value named for a scheduler, handed in or built by a factory, called
    with the position it sets the learning rate for (open_clip's `cosine_lr` returns such an
    adjuster). Not a function of this file or an import (`build_scheduler(optimizer, args)`)."""
    name = call.callee
    if call.method is not None or name is None or "." in name or not call.node.args or not _named_as_a_scheduler(name):
        return False
    if facts.called_function(call) is not None or facts.qualname(call.node.func, call.scope) is not None:
        return False
    scope: Scope | None = call.scope.function_scope
    while scope is not None:
        if name in scope.params:
            return True
        scope = scope.parent
    return any(isinstance(value, (cst.Call, cst.Lambda)) for value, _ in facts.bindings(name, call.scope))


def _walks_schedulers(loop: Loop, key: str) -> bool:
    """`key` is each element of a collection of schedulers: `for s in schedulers`, `for i, s in
    enumerate(schedulers)`, `for name, s in schedulers.items()`; not one name of a `zip(...)`."""
    targets = re.findall(r"\w+", loop.target)
    iterable = loop.iterable.strip()
    one_each = targets == [key] or (
        len(targets) == 2 and targets[1] == key and (iterable.startswith("enumerate(") or iterable.endswith(".items()"))
    )
    return one_each and bool(_SCHEDULER_NAME.search(iterable.lower()))


def same_object(a: str | None, b: str | None) -> bool:
    """`opt` and `self.opt` (or `optimizer` passed to a helper) name the same object."""
    if a is None or b is None:
        return False
    return a == b or a.split(".")[-1] == b.split(".")[-1]


_FRAMEWORK_BACKWARD = {"manual_backward", "backward_step"}


def framework_owned(facts: AmpFacts) -> bool:
    """A framework (Lightning, accelerate, DeepSpeed, apex) scales the loss for this module's code."""

    def build():
        if any(names.imports_a_framework(ref.qualname) for ref in facts.imports):
            return True
        for call in facts.calls:
            if call.method in _FRAMEWORK_BACKWARD:
                return True
            if call.method == "backward" and call.receiver_key and call.receiver_key.split(".")[-1] in names.FRAMEWORK_OWNERS:
                return True
            if call.method == "backward" and call.arg(0, None) is not None and facts.is_optimizer(call.receiver_key, call.scope):
                return True  # fairseq's `optimizer.backward(loss)`: its AMPOptimizer scales the loss
        return False

    return cached(facts, "framework", build)


def mentions_a_scaler(facts: AmpFacts) -> bool:
    """Any GradScaler-like object in the module: constructed, passed in, or used (also timm's NativeScaler)."""

    def build():
        if facts.has_scaler:
            return True
        not_loss_scalers = feature_scalers(facts)
        for call in facts.calls:
            if (call.qualname and call.qualname.endswith("GradScaler")) or (
                names.SCALER_WORD.search(call.callee or "") and call.receiver_key not in not_loss_scalers
            ):
                return True
        for assignment in facts.assignments:
            if names.SCALER_WORD.search(assignment.key) and assignment.key not in not_loss_scalers:
                return True
        for function in facts.functions:
            if any(names.SCALER_WORD.search(p) for p in function.params):
                return True
        # `gs.scale(loss).backward()`: a loss scaled for its backward, whatever the scaler is called
        # (unless that name only ever holds something else: `scaler = None`).
        return any(
            call.method == "scale" and id(call.node) in facts.backward_of_scale and call.receiver_key not in not_loss_scalers
            for call in facts.calls
        )

    return cached(facts, "mentions_scaler", build)


def feature_scalers(facts: AmpFacts) -> set[str]:
    """Names every binding of which is something other than a loss scaler, whatever they are called."""

    def build():
        kinds: dict[str, set[bool]] = {}
        for assignment in facts.assignments:
            kinds.setdefault(assignment.key, set()).add(_feature_scaler(facts, assignment))
        return {key for key, feature in kinds.items() if feature == {True}}

    return cached(facts, "feature_scalers", build)


# Where a fitted feature scaler comes from when it is not built here: a GradScaler is never unpickled.
_UNPICKLES = {"joblib.load", "pickle.load", "pickle.loads", "dill.load", "cloudpickle.load"}


def _feature_scaler(facts: AmpFacts, assignment: Assignment) -> bool:
    """`scaler = StandardScaler().fit(X)`, `scaler = joblib.load("scaler.pkl")`: tabular code's
    feature scaling, not a loss scaler; nor is a plain value (`scaler = 1.0`, `scaler = None`)."""
    value = assignment.value
    if isinstance(value, (cst.Integer, cst.Float, cst.SimpleString)) or (isinstance(value, cst.Name) and value.value in ("None", "True", "False")):
        return True
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and isinstance(value.func.value, cst.Call):
        value = value.func.value  # `StandardScaler().fit(X)`: the constructor at the chain's start
    if not isinstance(value, cst.Call):
        return False
    callee = dotted_name(value.func) or ""
    qualified = facts.qualname(value.func, assignment.where.scope) or ""
    return bool(names.FEATURE_SCALER.search(callee) or names.FEATURE_SCALER.search(qualified)) or qualified in _UNPICKLES


def enabled_scaler_use(facts: AmpFacts, call: CallSite) -> bool:
    return (
        facts.is_scaler(call.receiver_key, call.scope)
        and not facts.scaler_disabled(call.receiver_key, call.scope)
        and not _element_of_another_collection(facts, call)
    )


def _comprehensions_around(facts: AmpFacts, call: CallSite) -> Iterator[cst.BaseComp]:
    """The comprehensions of its statement the call sits in, innermost first."""
    for node in facts.ancestors(call.node):
        if isinstance(node, cst.BaseStatement):
            return
        if isinstance(node, cst.BaseComp):
            yield node


def _element_of_another_collection(facts: AmpFacts, call: CallSite) -> bool:
    """`[s.step() for s in lr_schedulers]`: a comprehension's element is what its collection holds,
    whatever another comprehension of the function calls its own `s` (vjepa2 names the elements of
    both its scheduler list and its scaler list `s`)."""
    head = call.receiver_key
    if head is None or "." in head:
        return False
    for comprehension in _comprehensions_around(facts, call):
        source = _collection_of(comprehension.for_in, head)
        if source is not None:
            return not (facts.is_scaler(source, call.scope) or names.SCALER_WORD.search(source))
    return False


def in_a_comprehension(facts: AmpFacts, call: CallSite) -> bool:
    """The call sits in a comprehension of its statement, which runs it once per element, and
    whose names end with it."""
    return next(_comprehensions_around(facts, call), None) is not None


def _collection_of(loop: cst.CompFor, name: str) -> str | None:
    """The collection whose elements `for name in ...` (or `for name, o in zip(a, b)`) binds."""
    target, source = loop.target, loop.iter
    if isinstance(target, cst.Name):
        return dotted_name(source) if target.value == name else None
    if isinstance(target, cst.Tuple) and isinstance(source, cst.Call) and dotted_name(source.func) == "zip":
        for element, arg in zip(target.elements, source.args):
            if isinstance(element.value, cst.Name) and element.value.value == name:
                return dotted_name(arg.value)
    return None


# ---------------------------------------------------------------------------------------------
# Events of a training step, in program order


@dataclass(frozen=True)
class Event:
    kind: str  # "scale_backward" | "unscale" | "step" | "update" | "opt_step" | "sched_step" | "backward"
    call: CallSite
    scaler: str | None  # receiver key of the scaler
    target: str | None  # the optimizer (unscale/step/opt_step) or scheduler
    anchor: Context  # where the event happens in the analysed function (a helper's call site)

    @property
    def order(self) -> tuple[int, int]:
        return (self.anchor.order, self.call.where.order)


# Conditions that switch AMP on or off (`if args.amp:`, `if scaler is not None:`), not accumulation
# guards or skip checks.
AMP_SWITCH = re.compile(r"scaler|amp|fp16|half|mixed|precision|enabled|use_|is not None|is None|\bdevice\b|cuda")


def exclusive(facts: AmpFacts, a: Event, b: Event, *, by_condition: bool = True) -> bool:
    """Whether two events never run in one call of the analysed function: they sit in different
    branches of one `if` there or, both coming from a helper, in the helper. Two calls of a
    helper from the two branches of an `if` are one call per run; two calls of one helper that
    branches on AMP (`run_epoch(train)` then `run_epoch(val)`, each `if use_amp: scaler.step(opt)
    else: opt.step()`) take the same branch, or are an AMP run and a float32 one. Two `if`s on
    one condition exclude each other too (`if args.fp16: scaler.scale(loss).backward()` in a
    helper, `else: optimizer.step()` after it), unless `by_condition` is off."""
    same_function = a.anchor is b.anchor or a.call.where.scope.function_scope is b.call.where.scope.function_scope
    if same_function and mutually_exclusive(a.call.where, b.call.where):
        return True
    if a.anchor is not b.anchor and mutually_exclusive(a.anchor, b.anchor):
        return True
    return by_condition and facts.contradictory((a.anchor, a.call.where), (b.anchor, b.call.where))


def cut_off_after(facts: AmpFacts, event: Event, later: Event) -> bool:
    """Whether `later` never runs after `event` in one pass: `event` sits in a block that returns,
    raises, continues or breaks, and `later` comes after that block (ml-4m's skipped step:
    `if norm >= skip_grad: scaler.update(); return norm`, then `scaler.step(optimizer)`)."""
    if event.call.where is not event.anchor:
        return False  # a helper returning ends the helper, not the caller's pass
    return leaves_before(facts, event.anchor, later.anchor)


def leaves_before(facts: AmpFacts, where: Context, later: Context) -> bool:
    """Whether the block holding `where` returns, raises, continues or breaks before `later`, a
    place after that block (DLRM's `elif mode == "inference_benchmark": ...; return` before the
    training loop)."""
    if later.order <= where.order:
        return False
    leaving: tuple[type, ...] = (cst.Return, cst.Raise, cst.Continue, cst.Break)
    for node in facts.ancestors(where.statement):
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            return False
        if isinstance(node, (cst.For, cst.While)):
            leaving = (cst.Return, cst.Raise)  # a `continue` out there belongs to another loop
        elif isinstance(node, cst.IndentedBlock) and ends_with(node, leaving):
            return not within(facts, later.statement, node)
    return False


def _steps_through_a_scaler(facts: AmpFacts, call: CallSite) -> bool:
    """`opt.step()` on an instance of a class of the file whose `step` goes through a GradScaler
    (fairseq's AMPOptimizer): the method's own events, spliced in at the call, say what it does."""
    method = facts.called_function(call)
    return method is not None and any(c.method == "step" and enabled_scaler_use(facts, c) for c in method.calls)


def _own_events(function: Scope, facts: AmpFacts) -> list[Event]:
    events: list[Event] = []
    for call in function.calls:
        key = call.receiver_key
        if call.method == "update" and _sets_a_new_scale(call):
            continue  # `scaler.update(scale * 2.0)` sets the scale (icefall doubles it by hand): no inf checks to consume
        if call.method in ("unscale_", "step", "update") and enabled_scaler_use(facts, call):
            kind = {"unscale_": "unscale", "step": "step", "update": "update"}[call.method]
            target = dotted_name(call.arg(0, "optimizer")) if kind != "update" else None
            events.append(Event(kind, call, key, target, call.where))
        elif call.method == "scale" and enabled_scaler_use(facts, call):
            events.append(Event("scale_backward", call, key, None, call.where))
        elif call.method == "step" and facts.is_optimizer(key, call.scope) and not facts.is_scaler(key, call.scope):
            if not _steps_through_a_scaler(facts, call):
                events.append(Event("opt_step", call, None, key, call.where))
        elif call.method in ("step", "step_update") and is_scheduler(facts, key, call.scope, call.where):  # timm: step_update
            events.append(Event("sched_step", call, None, key, call.where))
        elif call.method == "step" and _one_of_the_schedulers(call):
            events.append(Event("sched_step", call, None, facts.module.code_for_node(call.receiver), call.where))
        elif _calls_a_schedule_function(facts, call):
            events.append(Event("sched_step", call, None, call.callee, call.where))
        elif (call.method == "backward" and not isinstance(call.receiver, cst.Call)) or call.qualname in names.AUTOGRAD_BACKWARD:
            events.append(Event("backward", call, None, None, call.where))
    return events


def _sets_a_new_scale(call: CallSite) -> bool:
    """`scaler.update(2.0 ** 16)`, `scaler.update(cur_scale * 2.0)`: a number computed here, or a
    name an enclosing `if` orders against a number (fairseq2: `if self._min_scale > new_scale:
    scaler.update(self._min_scale)`), which None cannot be. A name passed through (mmengine's
    `update(self._scale_update_param)`, often None) may be none."""
    new_scale = call.arg(0, "new_scale")
    if isinstance(new_scale, (cst.Integer, cst.Float, cst.BinaryOperation)):
        return True
    if isinstance(new_scale, cst.Call) and dotted_name(new_scale.func) in ("max", "min"):
        return True  # `update(max(scaler.get_scale(), min_scale))`: a floor, without an `if`
    name = dotted_name(new_scale)
    return name is not None and any(name in _ordered_operands(branch.test) for branch in call.where.ifs)


_ORDERING = (cst.LessThan, cst.LessThanEqual, cst.GreaterThan, cst.GreaterThanEqual)


def _ordered_operands(test: cst.BaseExpression) -> set[str]:
    """The dotted names a test compares with `<`, `<=`, `>` or `>=` (`a < b and c > d`: all four)."""
    if isinstance(test, cst.BooleanOperation):
        return _ordered_operands(test.left) | _ordered_operands(test.right)
    if isinstance(test, cst.UnaryOperation):
        return _ordered_operands(test.expression)
    if not isinstance(test, cst.Comparison):
        return set()
    found: set[str] = set()
    left = test.left
    for target in test.comparisons:
        if isinstance(target.operator, _ORDERING):
            found |= {n for n in (dotted_name(left), dotted_name(target.comparator)) if n}
        left = target.comparator
    return found


def own_events(facts: AmpFacts) -> dict[int, list[Event]]:
    def build():
        return {id(f): _own_events(f, facts) for f in (facts.module_scope, *facts.functions)}

    return cached(facts, "own_events", build)


def events_of(facts: AmpFacts, function: Scope) -> list[Event]:
    """A function's events in program order, with same-file helpers' events spliced in at the call."""

    def build():
        own = own_events(facts)
        merged = list(own.get(id(function), ()))
        for call in function.calls:
            helper = facts.called_function(call)
            if helper is None or helper is function:
                continue
            merged.extend(
                Event(e.kind, e.call, e.scaler, e.target, call.where) for e in own.get(id(helper), ())
            )
        merged.sort(key=lambda e: e.order)
        return merged

    return cached(facts, f"events:{id(function)}", build)


def iteration_events(facts: AmpFacts, function: Scope) -> list[Event]:
    """`events_of` without the events of helpers that loop on their own: a helper with its own
    training loop is a whole run, analysed by itself, and calling it twice is not two steps."""
    return [e for e in events_of(facts, function) if e.anchor is e.call.where or innermost_loop(e.call.where) is None]


def functions_with_events(facts: AmpFacts) -> list[Scope]:
    own = own_events(facts)
    return [f for f in (facts.module_scope, *facts.functions) if own.get(id(f)) or any(
        facts.called_function(c) is not None and own.get(id(facts.called_function(c))) for c in f.calls
    )]


def innermost_loop(where: Context) -> Loop | None:
    loops = where.statement_loops
    return loops[-1] if loops else None


_COUNTS = re.compile(r"\brange\s*\(")
_OPTIMIZER_LOOP = re.compile(r"optim|\bopts?\b|\bopt_|_opts?\b|\bparam_groups?\b")  # nerfstudio: one optimizer per param group
# `opt.niter`: an attribute no optimizer has, read from parsed options named `opt`.
_OPTION_READ = re.compile(r"\b(?:opts?|optim|opt_\w+|\w+_opts?)\s*\.\s*(\w+)")


def over_optimizers(loop: Loop) -> bool:
    """A loop over optimizers (`for opt in optimizers`, `zip(scalers, opts)`, `range(len(optimizers))`),
    not one whose header reads options (`for it in range(opt.niter)`) nor one that counts steps
    (`for optim_step in range(total_optim_steps)`: torchrl's dreamer)."""
    if _COUNTS.search(loop.iterable) and "len(" not in loop.iterable:
        return False
    options = {m.group(0).split(".")[0].strip().lower() for m in _OPTION_READ.finditer(loop.iterable) if m.group(1) not in names.OPTIMIZER_ATTRIBUTES}
    return any(_OPTIMIZER_LOOP.search(word) for word in loop.text.split() if word not in options)


def iteration_loop(event: Event) -> Loop | None:
    """The loop whose iterations are training steps: not a loop over the optimizers or the
    schedulers of one step (`for opt in optimizers: scaler.step(opt)`, `for s in schedulers:
    s.step()`), nor one that repeats a scheduler's step within it, nor a retry loop."""
    loops = event.anchor.statement_loops
    while loops:
        loop = loops[-1]
        if (
            over_optimizers(loop)
            or (event.target is not None and loop.binds(event.target.split(".")[0]))
            or repeats_the_schedule(loop, event)
            # `while True: ...; return` (Composer's out-of-memory retry): a pass that gets to
            # the end leaves, only a retry runs the body again.
            or ends_with(loop.node.body, (cst.Return, cst.Break))
        ):
            loops.pop()
            continue
        return loop
    return None


def repeats_the_schedule(loop: Loop, event: Event) -> bool:
    """A loop around a scheduler's step that does nothing but call schedulers (icefall's
    `for k in range(accumulate_grad_steps): scheduler.step()` after the optimizer step, its
    `if`/`else` choosing the scheduler's method included): it advances the schedule several times
    in one training step; no backward, forward or optimizer step runs in it to make it a loop of
    its own steps. Not a loop over the schedulers (`for s in schedulers: s.step()`), which steps
    each once."""
    return (
        event.kind == "sched_step"
        and event.anchor is event.call.where  # the loop holds the scheduler call, not a helper's call
        and not loop.binds(event.target.split(".")[0])
        and _only_calls_schedulers(loop.node.body, event.target)
    )


def _only_calls_schedulers(suite: cst.BaseSuite, stepped: str | None) -> bool:
    """Every statement of the block, through `if`s, calls a method of `stepped` or of another
    object named as a scheduler (`sched_g.step(); sched_d.step()`)."""
    def is_scheduler_call(small: cst.BaseSmallStatement) -> bool:
        call = small.value if isinstance(small, cst.Expr) else None
        if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Attribute):
            return False
        receiver = dotted_name(call.func.value)
        return receiver is not None and (receiver == stepped or _named_as_a_scheduler(receiver))

    def calls_only(statement: cst.CSTNode) -> bool:
        if isinstance(statement, cst.SimpleStatementLine):
            return all(is_scheduler_call(small) for small in statement.body)
        if isinstance(statement, cst.If):
            return _only_calls_schedulers(statement.body, stepped) and (statement.orelse is None or calls_only(statement.orelse))
        if isinstance(statement, cst.Else):
            return _only_calls_schedulers(statement.body, stepped)
        return False

    if isinstance(suite, cst.SimpleStatementSuite):  # `for _ in range(n): scheduler.step()` on one line
        return all(is_scheduler_call(small) for small in suite.body)
    return all(calls_only(statement) for statement in suite.body)


def skip_between(facts: AmpFacts, loop: Loop, first: Event, second: Event) -> cst.If | None:
    """An `if` of the loop's body, between the statements holding two events, that `continue`s
    under a test that does not switch AMP (`if step % log_every: continue`): the second event is
    skipped on some of the iterations the first runs on."""
    body = getattr(loop.node.body, "body", ())

    def top(node: cst.CSTNode) -> cst.CSTNode | None:
        return next((c for c in (node, *facts.ancestors(node)) if any(c is statement for statement in body)), None)

    a, b = top(first.anchor.statement), top(second.anchor.statement)
    if a is None or b is None:
        return None
    index_a = next(i for i, s in enumerate(body) if s is a)
    index_b = next(i for i, s in enumerate(body) if s is b)
    for statement in body[index_a + 1 : index_b]:
        if isinstance(statement, cst.If) and _continues(statement) and not mentions(facts, statement.test, AMP_SWITCH):
            return statement
    return None


def _continues(guard: cst.If) -> bool:
    """Whether the body of `guard` holds a `continue` of the loop around it (not of a loop inside)."""
    found = []

    class _Find(cst.CSTVisitor):
        def visit_Continue(self, node: cst.Continue) -> None:
            found.append(node)

        def visit_For(self, node: cst.For) -> bool:
            return False

        def visit_While(self, node: cst.While) -> bool:
            return False

    guard.body.visit(_Find())
    return bool(found)


def guards_inside(facts: AmpFacts, where: Context, loop: Loop | None) -> list[cst.If]:
    """The `if`s around a node that sit inside `loop` (all of them when there is no loop)."""
    if loop is None:
        return list(where.ifs)
    return [guard for guard in where.ifs if within(facts, guard, loop.node)]


def implied_by(facts: AmpFacts, guard: cst.If, guards: list[cst.If]) -> bool:
    """Whether `guard` holds whenever all of `guards` do: it is one of them, or its conditions are
    among theirs (`if scaler is not None: step` then `if scaler is not None: update`)."""
    return any(g is guard for g in guards) or facts.conjuncts(guard.test) <= {c for g in guards for c in facts.conjuncts(g.test)}


def within(facts: AmpFacts, node: cst.CSTNode, outer: cst.CSTNode) -> bool:
    return any(a is outer for a in facts.ancestors(node))


def mentions(facts: AmpFacts, node: cst.CSTNode, pattern: re.Pattern) -> bool:
    return bool(pattern.search(facts.module.code_for_node(node)))


def whole_statement_call(call: CallSite) -> bool:
    """`opt.step()` alone on its line: the call is the statement's only expression."""
    statement = call.where.statement
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and statement.body[0].value is call.node
    )


def add_statement_after_call(facts: AmpFacts, call: CallSite, new_call_text: str, text: str) -> tuple[Replacement, ...] | None:
    """Replace a statement-call with `new_call_text` and add `text` on the next line."""
    if not whole_statement_call(call):
        return None
    statement = call.where.statement
    indent = indentation(facts, statement)
    comment = statement.trailing_whitespace.comment
    if comment is not None:
        return (
            Replacement(call.node, new_call_text),
            Replacement(comment, f"{comment.value}\n{indent}{text}"),
        )
    return (Replacement(call.node, f"{new_call_text}\n{indent}{text}"),)


# The precisions under which a framework scales the loss with a GradScaler of its own:
# accelerate's `mixed_precision="fp16"`, Lightning's 16-bit mixed precision (not "16-true", a
# model in float16 with no scaler, nor "bf16-mixed").
FP16_PRECISIONS = frozenset({"fp16", "16", "16-mixed"})


def may_scale_in_fp16(construction: cst.Call, keyword: str, *, when_left_out: bool) -> bool:
    """An `Accelerator(...)` / `Fabric(...)` / `Trainer(...)` whose precision `keyword` is 16-bit
    mixed or not a literal (`args.mixed_precision`); `when_left_out` answers for none given."""
    precision = argument(construction, None, keyword)
    if precision is None:
        return when_left_out
    if isinstance(precision, cst.SimpleString):
        return precision.evaluated_value in FP16_PRECISIONS
    if isinstance(precision, cst.Integer):
        return precision.value in FP16_PRECISIONS
    return True
