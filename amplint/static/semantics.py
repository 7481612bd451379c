"""One libcst pass per file that records the AMP facts every rule queries.

The pass records structure only (scopes, imports, calls in program order with their enclosing
loops, `with` items and `if`s, assignments, returns, `.grad` reads). Names are resolved after the
walk, when every import of the file is known, so a function may use a name imported further down.

Why not libcst's QualifiedNameProvider: its scope analysis is 64% of analysis time on AMP-heavy
files (research/anchors-linters.md); AMP rules only need import aliases, which one pass over the
import statements gives for a fraction of that.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property

import libcst as cst

from amplint.static import names

# ---------------------------------------------------------------------------------------------
# Recorded structure


@dataclass(eq=False)
class Scope:
    """A module, function, lambda or class body: where imports and assignments live."""

    kind: str  # "module" | "function" | "class" | "lambda"
    name: str
    node: cst.CSTNode
    parent: Scope | None
    class_name: str | None = None  # the class a method belongs to
    decorators: tuple[cst.Decorator, ...] = ()
    imports: dict[str, str] = field(default_factory=dict)
    star_imports: list[str] = field(default_factory=list)
    calls: list[CallSite] = field(default_factory=list)
    returns: list[cst.BaseExpression] = field(default_factory=list)
    params: tuple[str, ...] = ()

    def resolve_head(self, head: str) -> str | None:
        scope: Scope | None = self
        while scope is not None:
            if head in scope.imports:
                return scope.imports[head]
            for module in scope.star_imports:
                if head in names.STAR_EXPORTS.get(module, ()):
                    return f"{module}.{head}"
            scope = scope.parent
        # `torch` used without an import (a snippet, or a star import from a project module)
        # can only mean the torch package.
        return "torch" if head == "torch" else None

    def binding_scope(self, head: str) -> Scope | None:
        """The scope whose import a name resolves through, as `resolve_head` finds it."""
        scope: Scope | None = self
        while scope is not None and head not in scope.imports:
            scope = scope.parent
        return scope

    def resolve(self, dotted: str | None) -> str | None:
        if not dotted:
            return None
        head, _, rest = dotted.partition(".")
        base = self.resolve_head(head)
        if base is None:
            return None
        return f"{base}.{rest}" if rest else base

    @property
    def function_scope(self) -> Scope:
        """The nearest enclosing function or module (class bodies and lambdas are skipped)."""
        scope = self
        while scope.kind in ("class", "lambda") and scope.parent is not None:
            scope = scope.parent
        return scope

    @property
    def qualified(self) -> str:
        return f"{self.class_name}.{self.name}" if self.class_name else self.name


@dataclass(eq=False, frozen=True)
class Loop:
    node: cst.CSTNode
    kind: str  # "for" | "while" | "comprehension"
    target: str  # the loop variable(s), as source text
    iterable: str  # what it iterates over (or the while condition), as source text
    words: str = ""  # identifiers of target and iterable, without string literals or comments

    @property
    def text(self) -> str:
        """What the loop is over, for name heuristics: `tqdm(loader, desc="fold")` says nothing of folds."""
        return (self.words or f"{self.target} {self.iterable}").lower()

    def binds(self, name: str | None) -> bool:
        """Whether `name` is one of the loop variables (`opt` in `for name, opt in ...`)."""
        return name is not None and name in re.findall(r"\w+", self.target)


@dataclass(eq=False, frozen=True)
class Context:
    """The position of a recorded node inside its function: enclosing loops, withs and ifs."""

    scope: Scope
    loops: tuple[Loop, ...]
    withs: tuple[cst.WithItem, ...]
    ifs: tuple[cst.If, ...]
    statement: cst.CSTNode
    order: int
    # (id of an `if`, "body" | "else") for each enclosing branch, outermost first.
    branches: tuple[tuple[int, str], ...] = ()

    @property
    def statement_loops(self) -> list[Loop]:
        """The `for` and `while` statements around the node, outermost first: a comprehension is
        an expression, not a repeated step."""
        return [loop for loop in self.loops if loop.kind != "comprehension"]


def ends_with(block: cst.BaseSuite, kinds: tuple[type, ...]) -> bool:
    """Whether the block's last statement is one of `kinds` (`cst.Return`, `cst.Break`...)."""
    last = block.body[-1] if isinstance(block, cst.IndentedBlock) and block.body else block
    small = getattr(last, "body", None)
    return isinstance(last, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) and bool(small) and isinstance(small[-1], kinds)


def _always_leaves(block: cst.BaseSuite) -> bool:
    """The block ends in `return`, `raise`, `continue` or `break`: whatever follows it in the
    enclosing block runs only when the block did not."""
    return ends_with(block, (cst.Return, cst.Raise, cst.Continue, cst.Break))


def mutually_exclusive(a: Context, b: Context) -> bool:
    """Whether two nodes sit in different branches of the same `if` (or cases of one `match`), so
    one run never sees both."""
    labels = dict(a.branches)
    return any(labels.get(node, label) != label for node, label in b.branches)


@dataclass(eq=False)
class CallSite:
    node: cst.Call
    callee: str | None  # dotted source text of the called expression, if it is a name chain
    method: str | None  # attribute name for `x.m(...)`
    receiver: cst.BaseExpression | None
    receiver_key: str | None  # dotted text of the receiver: "scaler", "self.scaler"
    where: Context
    qualname: str | None = None  # resolved after the walk

    @property
    def scope(self) -> Scope:
        return self.where.scope

    @property
    def name(self) -> str:
        """The name called: `m` of `x.m(...)`, `f` of `f(...)`; "" for anything else."""
        return self.method or self.callee or ""

    def arg(self, position: int | None, keyword: str | None) -> cst.BaseExpression | None:
        return argument(self.node, position, keyword)


@dataclass(eq=False)
class Assignment:
    key: str
    value: cst.BaseExpression
    where: Context


def _by_key(assignments: list[Assignment]) -> dict[str, list[Assignment]]:
    table: dict[str, list[Assignment]] = {}
    for assignment in assignments:
        table.setdefault(assignment.key, []).append(assignment)
    return table


@dataclass(eq=False)
class GradRead:
    node: cst.Attribute
    where: Context


@dataclass(eq=False)
class ImportRef:
    node: cst.CSTNode  # the ImportAlias
    qualname: str
    statement: cst.CSTNode
    scope: Scope | None = None  # where the name is bound


@dataclass(eq=False)
class Reference:
    """A name or attribute chain in load position that is not the callee of a call."""

    node: cst.BaseExpression
    dotted: str
    where: Context


def dotted_name(node: cst.CSTNode | None) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted_name(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def argument(call: cst.Call, position: int | None, keyword: str | None) -> cst.BaseExpression | None:
    """The expression passed for a parameter, by keyword or by position (before any `*args`)."""
    positional = 0
    for arg in call.args:
        if arg.keyword is not None:
            if keyword is not None and arg.keyword.value == keyword:
                return arg.value
        elif arg.star:
            positional = -(10**9)  # positions after *args are unknown
        else:
            if position is not None and positional == position:
                return arg.value
            positional += 1
    return None


def identifiers(node: cst.CSTNode) -> str:
    """The names in an expression, space-separated; string literals and comments are left out."""
    found: list[str] = []
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Name):
            found.append(current.value)
        stack.extend(reversed(list(children(current))))
    return " ".join(found)


def statement_code(statement: cst.CSTNode) -> str:
    """A simple statement's own code: no comment lines above it and no trailing comment."""
    if isinstance(statement, cst.SimpleStatementLine):
        return "; ".join(_module_for_code.code_for_node(small) for small in statement.body)
    return _module_for_code.code_for_node(statement)


def has_star_args(call: cst.Call) -> bool:
    return any(arg.star for arg in call.args)


_module_for_code = cst.Module(body=[])


def source_text(node: cst.CSTNode) -> str:
    return _module_for_code.code_for_node(node)


# ---------------------------------------------------------------------------------------------
# The walk

# Fields that only ever hold whitespace, comments, brackets and punctuation (and `whitespace_*`
# ones). No fact comes from them: leaving them out, and not rebuilding every node as libcst's
# visit() does, makes the walk ~10x cheaper than a libcst visitor.
_LAYOUT_FIELDS = frozenset(
    {
        "asynchronous", "colon", "comma", "dot", "equal", "first_colon", "footer", "header", "lbrace",
        "lbracket", "leading_lines", "leading_whitespace", "lines_after_decorators", "lpar", "operator",
        "rbrace", "rbracket", "relative", "rpar", "second_colon", "semicolon", "separator", "trailing_comma",
        "trailing_whitespace",
    }
)
# Node types whose dataclass fields are not in source order: the order libcst's own visit() uses.
# tests/test_semantics.py checks the walk against libcst's visitor on every construct.
_SOURCE_ORDER: dict[type, tuple[str, ...]] = {
    cst.Arg: ("keyword", "value"),
    cst.ClassDef: ("decorators", "name", "type_parameters", "bases", "keywords", "body"),
    cst.ExceptHandler: ("type", "name", "body"),
    cst.ExceptStarHandler: ("type", "name", "body"),
    cst.FunctionDef: ("decorators", "name", "type_parameters", "params", "returns", "body"),
    cst.IfExp: ("body", "test", "orelse"),
    cst.MatchCase: ("pattern", "guard", "body"),
    cst.Parameters: ("posonly_params", "posonly_ind", "params", "star_arg", "kwonly_params", "star_kwarg"),
    cst.TypeAlias: ("name", "type_parameters", "value"),
}
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}


def children(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """`node`'s children in source order, without whitespace, comments and punctuation."""
    kind = node.__class__
    fields = _CHILD_FIELDS.get(kind)
    if fields is None:
        fields = _CHILD_FIELDS[kind] = _SOURCE_ORDER.get(kind) or tuple(
            f.name for f in dataclasses.fields(kind) if f.name not in _LAYOUT_FIELDS and not f.name.startswith("whitespace")
        )
    for name in fields:
        value = getattr(node, name)
        if value.__class__ is tuple or value.__class__ is list:
            yield from value
        elif isinstance(value, cst.CSTNode):
            yield value


def descendants(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """`node` and every node under it (not in source order), as `children` sees them."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(children(current))


# The recorder's `visit_<Type>` / `leave_<Type>` hooks, looked up once per node type.
_VISITS: dict[type, Callable | None] = {}
_LEAVES: dict[type, Callable | None] = {}


def _hook(table: dict[type, Callable | None], prefix: str, kind: type) -> Callable | None:
    try:
        return table[kind]
    except KeyError:
        hook = table[kind] = getattr(_Recorder, prefix + kind.__name__, None)
        return hook


class _Recorder:
    def __init__(self, facts: AmpFacts) -> None:
        self.facts = facts
        self.scope = facts.module_scope
        self.loops: list[Loop] = []
        self.withs: list[cst.WithItem] = []
        self.ifs: list[cst.If] = []
        self.branches: list[tuple[int, str]] = []
        # Per block: how many of `branches` are the implicit `else` of an `if` that always exits.
        self._exits_per_block: list[int] = [0]
        self.statements: list[cst.CSTNode] = []
        # Per function: the stacks above, saved while a nested function is walked.
        self._saved: list[tuple] = []
        self._order = 0
        self._callee_nodes: set[int] = set()
        self._not_references: set[int] = set()  # names that are labels, not loads
        self._top_level_ids = {id(statement) for statement in facts.module.body}
        self._unit: cst.CSTNode | None = None
        self._path: list[cst.CSTNode] = []  # the nodes from the module down to the one visited

    def walk(self, node: cst.CSTNode) -> None:
        """`node` and, unless its hook returns False, everything under it, in source order."""
        if self.on_visit(node):
            for child in children(node):
                self.walk(child)
        self.on_leave(node)

    def on_visit(self, node: cst.CSTNode) -> bool:
        # The innermost definition (or else the top-level statement) holding each node: positions
        # are then computed for the few units that hold a finding, not for the file (analyse.py).
        if id(node) in self._top_level_ids:
            self._unit = node
        self.facts.unit_of[id(node)] = self._unit
        if self._path:
            self.facts.parent_of[id(node)] = self._path[-1]
        self._path.append(node)  # before the hook: a hook that visits parts itself is their parent
        visit = _hook(_VISITS, "visit_", type(node))
        return visit is None or visit(self, node) is not False

    def on_leave(self, original_node: cst.CSTNode) -> None:
        leave = _hook(_LEAVES, "leave_", type(original_node))
        if leave is not None:
            leave(self, original_node)
        self._path.pop()

    def _claim_import(self, node: cst.Import | cst.ImportFrom) -> None:
        """Imports are read without visiting their parts; a fix still needs their positions."""
        stack = [(node, part) for part in children(node)]
        while stack:
            parent, part = stack.pop()
            self.facts.unit_of[id(part)] = self._unit
            self.facts.parent_of[id(part)] = parent
            stack.extend((part, child) for child in children(part))

    def _enter_definition(self, node: cst.FunctionDef | cst.ClassDef) -> cst.CSTNode | None:
        self.facts.definitions.append(node)
        outer, self._unit = self._unit, node
        return outer

    # -- helpers ------------------------------------------------------------------------------
    def _context(self) -> Context:
        self._order += 1
        return Context(
            scope=self.scope,
            loops=tuple(self.loops),
            withs=tuple(self.withs),
            ifs=tuple(self.ifs),
            statement=self.statements[-1] if self.statements else self.facts.module,
            order=self._order,
            branches=tuple(self.branches),
        )

    def _enter_scope(self, scope: Scope) -> None:
        self._saved.append((self.scope, self.loops, self.withs, self.ifs, self.branches))
        self.facts.scopes.append(scope)
        self.scope = scope
        self.loops, self.withs, self.ifs, self.branches = [], [], [], []

    def _leave_scope(self) -> None:
        self.scope, self.loops, self.withs, self.ifs, self.branches = self._saved.pop()

    # -- statements ---------------------------------------------------------------------------
    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self.statements.append(node)

    def leave_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self.statements.pop()

    def visit_Import(self, node: cst.Import) -> None:
        self._claim_import(node)
        for alias in node.names:
            full = dotted_name(alias.name)
            if full is None:
                continue
            if alias.asname is not None:
                bound = dotted_name(alias.asname.name)
                if bound:
                    self.scope.imports[bound] = full
            else:
                head = full.split(".")[0]
                self.scope.imports.setdefault(head, head)
            self.facts.imports.append(ImportRef(alias, full, self._statement(), self.scope))
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self._claim_import(node)
        if node.relative:  # relative imports name the user's own package, never torch
            return False
        module = dotted_name(node.module)
        if module is None:
            return False
        if isinstance(node.names, cst.ImportStar):
            self.scope.star_imports.append(module)
            return False
        for alias in node.names:
            name = dotted_name(alias.name)
            if name is None:
                continue
            bound = dotted_name(alias.asname.name) if alias.asname is not None else name
            if bound:
                self.scope.imports[bound] = f"{module}.{name}"
            self.facts.imports.append(ImportRef(alias, f"{module}.{name}", self._statement(), self.scope))
        return False

    def _statement(self) -> cst.CSTNode:
        return self.statements[-1] if self.statements else self.facts.module

    # -- scopes -------------------------------------------------------------------------------
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.statements.append(node)
        outer_unit = self._enter_definition(node)
        enclosing_class = self.scope.name if self.scope.kind == "class" else None
        params = tuple(
            p.name.value
            for p in (*node.params.posonly_params, *node.params.params, *node.params.kwonly_params)
        )
        scope = Scope(
            "function",
            node.name.value,
            node,
            self.scope,
            class_name=enclosing_class,
            decorators=tuple(node.decorators),
            params=params,
        )
        self.facts.functions.append(scope)
        # Decorators, defaults and annotations are evaluated in the enclosing scope.
        for decorator in node.decorators:
            self.walk(decorator)
        self.walk(node.params)
        if node.returns is not None:
            self.walk(node.returns)
        self._enter_scope(scope)
        self.walk(node.body)
        self._leave_scope()
        self.statements.pop()
        self._unit = outer_unit
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.statements.append(node)
        outer_unit = self._enter_definition(node)
        bases = tuple(dotted_name(arg.value) for arg in node.bases if arg.keyword is None)
        scope = Scope("class", node.name.value, node, self.scope)
        self.facts.classes.append((scope, bases))
        for decorator in node.decorators:
            self.walk(decorator)
        for arg in node.bases:
            self.walk(arg)
        self._saved.append((self.scope, self.loops, self.withs, self.ifs, self.branches))
        self.facts.scopes.append(scope)
        self.scope = scope
        self.walk(node.body)
        self._leave_scope()
        self.statements.pop()
        self._unit = outer_unit
        return False

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self._enter_scope(Scope("lambda", "<lambda>", node, self.scope))

    def leave_Lambda(self, node: cst.Lambda) -> None:
        self._leave_scope()

    def visit_Return(self, node: cst.Return) -> None:
        if node.value is not None:
            self.scope.function_scope.returns.append(node.value)

    # -- loops, withs, ifs ----------------------------------------------------------------------
    def visit_For(self, node: cst.For) -> None:
        self.statements.append(node)
        self.walk(node.iter)
        self._stored(node.target)
        self.walk(node.target)
        words = f"{identifiers(node.target)} {identifiers(node.iter)}"
        self.loops.append(Loop(node, "for", source_text(node.target), source_text(node.iter), words))
        self.facts.loop_targets.append((node.target, self._context()))
        self.walk(node.body)
        self.loops.pop()
        if node.orelse is not None:
            self.walk(node.orelse)
        self.statements.pop()
        return False

    def visit_While(self, node: cst.While) -> None:
        self.statements.append(node)
        self.loops.append(Loop(node, "while", "", source_text(node.test), identifiers(node.test)))
        self.walk(node.test)
        self.walk(node.body)
        self.loops.pop()
        if node.orelse is not None:
            self.walk(node.orelse)
        self.statements.pop()
        return False

    def _comprehension(self, node: cst.CSTNode, for_in: cst.CompFor) -> None:
        words = f"{identifiers(for_in.target)} {identifiers(for_in.iter)}"
        self.loops.append(Loop(node, "comprehension", source_text(for_in.target), source_text(for_in.iter), words))

    def _visit_comprehension(self, node: cst.ListComp | cst.SetComp | cst.DictComp | cst.GeneratorExp) -> None:
        self._comprehension(node, node.for_in)

    def _leave_comprehension(self, node: cst.CSTNode) -> None:
        self.loops.pop()

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _visit_comprehension
    leave_ListComp = leave_SetComp = leave_DictComp = leave_GeneratorExp = _leave_comprehension

    def visit_With(self, node: cst.With) -> None:
        self.statements.append(node)
        for item in node.items:
            self.walk(item)
        where = self._context()  # the `with` statement, inside the withs around it
        self.withs.extend(node.items)
        self.facts.with_items.extend((item, where) for item in node.items)
        self.walk(node.body)
        del self.withs[len(self.withs) - len(node.items) :]
        self.statements.pop()
        return False

    def visit_If(self, node: cst.If) -> None:
        self.statements.append(node)
        self.facts.if_tests[id(node)] = node.test
        self.walk(node.test)
        self.ifs.append(node)
        self.branches.append((id(node), "body"))
        self.walk(node.body)
        self.branches.pop()
        self.ifs.pop()
        if node.orelse is not None:
            self.branches.append((id(node), "else"))
            self.walk(node.orelse)
            self.branches.pop()
        elif _always_leaves(node.body):
            # `if fast: ...; return` -- what follows in the block is the `if`'s `else`.
            self.branches.append((id(node), "else"))
            self._exits_per_block[-1] += 1
        self.statements.pop()
        return False

    def visit_Match(self, node: cst.Match) -> None:
        self.statements.append(node)
        self.walk(node.subject)
        for index, case in enumerate(node.cases):  # one run takes one case, as one branch of an `if`
            self.branches.append((id(node), f"case {index}"))
            self.walk(case)
            self.branches.pop()
        self.statements.pop()
        return False

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._exits_per_block.append(0)

    def leave_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        implicit = self._exits_per_block.pop()
        if implicit:
            del self.branches[len(self.branches) - implicit :]

    def visit_Try(self, node: cst.Try) -> None:
        self.statements.append(node)

    def leave_Try(self, node: cst.Try) -> None:
        self.statements.pop()

    # -- expressions --------------------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        self._callee_nodes.add(id(node.func))

    def leave_Call(self, node: cst.Call) -> None:
        # Recorded on leave, so arguments and receivers come first: program (evaluation) order.
        func = node.func
        method = receiver = receiver_key = None
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            receiver = func.value
            receiver_key = dotted_name(receiver)
        call = CallSite(node, dotted_name(func), method, receiver, receiver_key, self._context())
        self.scope.function_scope.calls.append(call)
        self.facts.calls.append(call)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._stored(target.target)
            self._bind(target.target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._stored(node.target)
        if node.value is not None:
            self._bind(node.target, node.value)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._stored(node.target)
        self._bind(node.target, node.value)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._stored(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        self._stored(node.name)  # `with ... as x`, `except E as e`

    def _stored(self, target: cst.BaseExpression) -> None:
        """Names a statement binds are not references to what they named before
        (`GradScaler = None` after a failed import uses nothing)."""
        if isinstance(target, cst.Name):
            self._not_references.add(id(target))
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._stored(element.value)
        elif isinstance(target, cst.StarredElement):
            self._stored(target.value)

    def _bind(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        key = dotted_name(target)
        if key is not None:
            self.facts.assignments.append(Assignment(key, value, self._context()))
        elif isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)):
            for t, v in zip(target.elements, value.elements):
                self._bind(t.value, v.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                name = dotted_name(element.value)
                if name is not None:
                    self.facts.unpackings.append(Assignment(name, value, self._context()))
                elif isinstance(element.value, (cst.Tuple, cst.List)):
                    self._bind(element.value, value)  # `(y_hat, (z, z_p)) = net_g(x)`: nested names too

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if node.attr.value == "grad":
            self.facts.grad_reads.append(GradRead(node, self._context()))
        dotted = dotted_name(node)
        if dotted is None:
            self._not_references.add(id(node.attr))
            return True
        if id(node) not in self._callee_nodes:
            self.facts.references.append(Reference(node, dotted, self._context()))
        # `.grad` inside a chain (`p.grad.data`) is still a read.
        # Its parts are not visited, but are placed like visited nodes.
        outer, inner = node, node.value
        self.facts.unit_of[id(node.attr)], self.facts.parent_of[id(node.attr)] = self._unit, node
        while isinstance(inner, cst.Attribute):
            if inner.attr.value == "grad":
                self.facts.grad_reads.append(GradRead(inner, self._context()))
            self.facts.unit_of[id(inner)] = self.facts.unit_of[id(inner.attr)] = self._unit
            self.facts.parent_of[id(inner)], self.facts.parent_of[id(inner.attr)] = outer, inner
            outer, inner = inner, inner.value
        self.facts.unit_of[id(inner)], self.facts.parent_of[id(inner)] = self._unit, outer
        return False  # a name chain is recorded whole

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) not in self._callee_nodes and id(node) not in self._not_references:
            self.facts.references.append(Reference(node, node.value, self._context()))

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self._not_references.add(id(node.keyword))

    def visit_Param(self, node: cst.Param) -> None:
        self._not_references.add(id(node.name))


# ---------------------------------------------------------------------------------------------
# The facts and the queries rules share


@dataclass(frozen=True)
class Autocast:
    """What an expression that opens an autocast region says about it."""

    node: cst.CSTNode
    enabled: str  # "yes" | "no" | "maybe"
    device: str | None
    dtype: str | None  # qualified dtype name when literal, e.g. "torch.bfloat16"
    deprecated: bool
    enabled_when: cst.BaseExpression | None = None  # the `enabled=` expression when not a literal


_NON_MODULE_NN = {"Parameter", "ParameterList", "ParameterDict", "Buffer"}
# Per-step or per-epoch functions; the plural (`train_epochs`) is a whole run.
_STEP_FUNCTION = re.compile(
    r"(train(ing)?_?(step|one_epoch|epoch|batch|iter(ation)?)|(fit|run)_(batch|step|epoch)|step_fn)(?!s)"
)


class AmpFacts:
    """Everything one walk recorded about a module, with the shared queries over it."""

    def __init__(self, module: cst.Module, min_torch: tuple[int, ...] | None = None, text: str | None = None) -> None:
        self.module = module
        self._text = text  # the source that was parsed, when the caller has it
        self.min_torch = min_torch  # the oldest torch the code must keep running on (fixes honour it)
        # id(node) -> the innermost def/class holding it, else its top-level statement.
        self.unit_of: dict[int, cst.CSTNode | None] = {}
        self.parent_of: dict[int, cst.CSTNode] = {}  # id(node) -> the node holding it
        self.definitions: list[cst.FunctionDef | cst.ClassDef] = []  # in document order
        self.module_scope = Scope("module", "<module>", module, None)
        self.scopes: list[Scope] = [self.module_scope]
        self.functions: list[Scope] = []
        self.classes: list[tuple[Scope, tuple[str | None, ...]]] = []
        self.calls: list[CallSite] = []
        self.assignments: list[Assignment] = []
        # `logits, feats = net_d(x)`: each name with the whole value it is unpacked from. Kept
        # apart: what a name is (an optimizer, a scaler) cannot be read from such a value.
        self.unpackings: list[Assignment] = []
        self.imports: list[ImportRef] = []
        self.references: list[Reference] = []
        self.grad_reads: list[GradRead] = []
        self.with_items: list[tuple[cst.WithItem, Context]] = []  # each item, where its `with` is
        self.loop_targets: list[tuple[cst.BaseExpression, Context]] = []
        self.if_tests: dict[int, cst.BaseExpression] = {}  # id(if) -> its test
        self._outcomes: dict[tuple[tuple[int, str], ...], tuple[frozenset[str], frozenset[str]]] = {}
        self._conjuncts: dict[int, frozenset[str]] = {}  # id(test) -> its conditions as written
        _Recorder(self).walk(module)
        for call in self.calls:
            call.qualname = self.callee_qualname(call)

    @cached_property
    def text(self) -> str:
        """The module's source; regenerating it with `module.code` costs a pass over the tree."""
        return self._text if self._text is not None else self.module.code

    # -- names --------------------------------------------------------------------------------
    def qualname(self, expr: cst.BaseExpression | None, scope: Scope, depth: int = 0) -> str | None:
        """The qualified name an expression refers to, through imports and simple aliases."""
        dotted = dotted_name(expr)
        if dotted is None:
            return None
        resolved = scope.resolve(dotted)
        if resolved is not None or depth > 2:
            return resolved
        # `ac = torch.autocast` and later `ac(...)`.
        for value, value_scope in self.bindings(dotted, scope):
            if isinstance(value, (cst.Name, cst.Attribute)):
                aliased = self.qualname(value, value_scope, depth + 1)
                if aliased:
                    return aliased
        # A parameter names what this file passes for it (and its default) when they all agree
        # (`build(torch.float16)` from every caller), or autocast when one of them is it (the
        # region questions then find the no-op context on the other paths). Decorators handed to
        # one wrapper (`wrap(custom_fwd)`, `wrap(custom_bwd)`) leave it unknown. Any other name
        # has no other values to try: most unresolved callees (`model(x)`) stop here.
        if not _a_parameter_in_reach(dotted, scope):
            return None
        passed = {
            self.qualname(value, value_scope, depth + 1)
            for value, value_scope in self.bindings(dotted, scope, through_parameters=True)
            if isinstance(value, (cst.Name, cst.Attribute))
        }
        autocast = passed & names.AUTOCAST
        if autocast:
            return min(autocast)
        return passed.pop() if len(passed) == 1 else None

    def callee_qualname(self, call: CallSite) -> str | None:
        qualified = self.qualname(call.node.func, call.scope)
        if qualified is not None and qualified not in names.NO_OP_CONTEXTS:
            return qualified
        bound = self.held_values(call.callee, call.scope)
        # `amp_ctx = functools.partial(torch.autocast, "cuda")` and later `amp_ctx()`.
        for value, value_scope in bound:
            target = self._partial_target(value, value_scope)
            if target is not None:
                return self.qualname(target, value_scope)
        # `ctx = suppress` on one path and `ctx = torch.autocast` on another: the autocast.
        return self._conditional_autocast(bound) or self._bound_among(bound, names.AUTOCAST) or self._made_by_a_factory(bound) or qualified

    def _made_by_a_factory(self, bound: list[tuple[cst.BaseExpression, Scope]]) -> str | None:
        """`autocast = get_autocast(precision)`: the autocast a same-file factory returns (itself,
        a `partial` of it, or a lambda that builds one), which calling the name then builds."""
        for factory in self._factories(bound):
            for returned in factory.returns:
                if isinstance(returned, cst.Lambda) and isinstance(returned.body, cst.Call):
                    returned = returned.body.func
                returned = self._partial_target(returned, factory) or returned
                if (qualified := self.qualname(returned, factory)) in names.AUTOCAST:
                    return qualified
        return None

    def conditional_autocast(self, key: str | None, scope: Scope) -> str | None:
        """`autocast = torch.cuda.amp.autocast if amp else suppress`, later `with autocast():`:
        the autocast that one arm names, when the other is a no-op context (or None)."""
        return self._conditional_autocast(self.held_values(key, scope))

    def _conditional_autocast(self, bound: list[tuple[cst.BaseExpression, Scope]]) -> str | None:
        for value, value_scope in bound:
            if not isinstance(value, cst.IfExp):
                continue
            arms = [self.qualname(arm, value_scope) for arm in (value.body, value.orelse)]
            opened = [arm for arm in arms if arm in names.AUTOCAST]
            others = [arm for arm, expr in zip(arms, (value.body, value.orelse)) if arm not in names.AUTOCAST and not is_none(expr)]
            if len(opened) == 1 and all(other in names.NO_OP_CONTEXTS for other in others):
                return opened[0]
        return None

    def bindings(self, key: str | None, scope: Scope, through_parameters: bool = False) -> list[tuple[cst.BaseExpression, Scope]]:
        """Values assigned to a name or `self.attr`, nearest scope first. `through_parameters`:
        a parameter its function does not reassign is bound to its default and to what this
        file's calls pass for it (timm's `train_one_epoch(..., amp_autocast=amp_autocast)`)."""
        if key is None:
            return []
        matches = [a for a in self._assignments_by_key.get(key, ())]
        if not matches and key.count(".") == 1:
            holder, attribute = key.split(".")
            if holder in ("self", "cls"):
                return self._class_attribute(scope.function_scope.class_name, attribute, with_methods=False)
            # `amp = AmpConfig()` in the same function, then `with amp.ctx:`: what the class binds.
            owner = self._local_instance_class(holder, scope)
            if owner is not None:
                return self._class_attribute(owner, attribute, with_methods=True)
        if not matches and not through_parameters:
            return []
        if key.startswith("self.") or key.startswith("cls."):
            owner = scope.function_scope.class_name
            same_class = [a for a in matches if a.where.scope.function_scope.class_name == owner]
            chosen = same_class or matches
        else:
            chain = []
            current: Scope | None = scope.function_scope
            while current is not None:
                chain.append(current)
                current = current.parent
            chosen = []
            for candidate in chain:
                chosen = [a for a in matches if a.where.scope.function_scope is candidate]
                if chosen:
                    break
                if through_parameters and key in candidate.params:
                    return self.parameter_values(candidate, key)
        return [(a.value, a.where.scope) for a in chosen]

    def _class_attribute(self, owner: str | None, attribute: str, with_methods: bool) -> list[tuple[cst.BaseExpression, Scope]]:
        """What a class of this file binds to an attribute: in its body (`amp_ctx =
        torch.autocast(...)`, a dataclass field's default, `field(default_factory=lambda: ...)`),
        and with `with_methods`, to `self.attribute` in its methods."""
        found = [
            (_field_default(a.value), a.where.scope) for a in self._assignments_by_key.get(attribute, ())
            if a.where.scope.kind == "class" and a.where.scope.name == owner
        ]
        if with_methods:
            found += [
                (a.value, a.where.scope) for a in self._assignments_by_key.get(f"self.{attribute}", ())
                if a.where.scope.function_scope.class_name == owner
            ]
        return found

    def held_values(self, key: str | None, scope: Scope, depth: int = 0) -> list[tuple[cst.BaseExpression, Scope]]:
        """What a name may hold, following names bound or passed to other names: `ctx` bound to
        a parameter that a caller passes `amp_autocast` for, itself a `partial` of autocast."""
        values = []
        for value, value_scope in self.bindings(key, scope, through_parameters=True):
            values.append((value, value_scope))
            inner = dotted_name(value) if isinstance(value, (cst.Name, cst.Attribute)) else None
            same = inner == key and value_scope.function_scope is scope.function_scope  # `x = x`, or a loop
            if inner is not None and not same and depth < 3 and value_scope.resolve(inner) is None:
                values.extend(self.held_values(inner, value_scope, depth + 1))
        return values

    def parameter_values(self, function: Scope, param: str) -> list[tuple[cst.BaseExpression, Scope]]:
        """A parameter's default, then what each call of the function in this file passes for it."""
        values = []
        declared = _param_named(function.node, param)
        if declared is not None and declared.default is not None and function.parent is not None:
            values.append((declared.default, function.parent))  # defaults are evaluated where the def is
        values.extend((passed, caller.scope) for caller, passed in self.passed_for(function, param) if passed is not None)
        return values

    def passed_for(self, function: Scope, param: str) -> Iterator[tuple[CallSite, cst.BaseExpression | None]]:
        """Each call of a same-file function, with what it passes for one of its parameters."""
        node = function.node
        if not isinstance(node, cst.FunctionDef):
            return
        positional = [p.name.value for p in (*node.params.posonly_params, *node.params.params)]
        position = positional.index(param) if param in positional else None
        if position is not None and function.class_name is not None and not _is_static(function):
            position -= 1  # `self` (or `cls`) is the receiver, not an argument
        keyword = param if all(p.name.value != param for p in node.params.posonly_params) else None
        for caller in (*self.callers(function), *self._constructions(function)):
            yield caller, caller.arg(position if position is None or position >= 0 else None, keyword)

    def _constructions(self, function: Scope) -> list[CallSite]:
        """`Trainer(model, amp_dtype=...)` in this file, for `Trainer.__init__`: what it passes."""
        if function.name != "__init__" or function.class_name is None:
            return []
        return self._calls_of_classes.get(function.class_name, [])

    @cached_property
    def _calls_of_classes(self) -> dict[str, list[CallSite]]:
        """The calls of each class of the file by its bare name (its constructions)."""
        table: dict[str, list[CallSite]] = {}
        for call in self.calls:
            if call.method is None and call.callee in self._class_names and call.scope.resolve_head(call.callee) is None:
                table.setdefault(call.callee, []).append(call)
        return table

    def reaching_assignment(self, key: str, where: Context, unpacked: bool = False) -> Assignment | None:
        """The assignment to a name that every path to `where` in its function passes last
        (`checkpoint = torch.load(...)` on resume, then `checkpoint = {...}` just before it is
        saved); None when the last one before it sits in an `if` that `where` is not in (each
        branch may bind its own value). With `unpacked`, tuple unpackings count too."""
        function = where.scope.function_scope
        candidates = [*self._assignments_by_key.get(key, ()), *(self._unpackings_by_key.get(key, ()) if unpacked else ())]
        before = [
            a for a in candidates
            if a.where.scope.function_scope is function and a.where.order < where.order and not mutually_exclusive(a.where, where)
        ]
        last = max(before, key=lambda a: a.where.order, default=None)
        return last if last is not None and set(last.where.branches) <= set(where.branches) else None

    @cached_property
    def _assignments_by_key(self) -> dict[str, list[Assignment]]:
        return _by_key(self.assignments)

    @cached_property
    def _unpackings_by_key(self) -> dict[str, list[Assignment]]:
        return _by_key(self.unpackings)

    @cached_property
    def functions_by_name(self) -> dict[str, list[Scope]]:
        table: dict[str, list[Scope]] = {}
        for function in self.functions:
            table.setdefault(function.name, []).append(function)
        return table

    def call_site(self, node: cst.CSTNode) -> CallSite | None:
        """The recorded call whose node this is (`model = FSDP(model)`: the value's CallSite)."""
        return self._calls_by_node.get(id(node))

    @cached_property
    def _calls_by_node(self) -> dict[int, CallSite]:
        return {id(call.node): call for call in self.calls}

    def called_function(self, call: CallSite) -> Scope | None:
        """The in-file function or method a call runs: `f()`, `self.f()`, `cls.f()`."""
        if call.callee is None:
            return None
        if call.method is None:
            if call.scope.resolve_head(call.callee) is not None:
                return None  # an imported name shadows nothing here
            candidates = [f for f in self.functions_by_name.get(call.callee, ()) if f.class_name is None]
            return candidates[0] if candidates else self._instance_call(call)
        if call.receiver_key in ("self", "cls", "super()"):
            owner = call.scope.function_scope.class_name
            candidates = self.functions_by_name.get(call.method, ())
            same_class = [f for f in candidates if f.class_name == owner]
            if same_class and call.receiver_key != "super()" and _is_a_placeholder(same_class[0].node):
                return self._only_override(owner, call.method) or same_class[0]
            return same_class[0] if same_class else None
        if call.receiver_key in self._class_names:  # `Stepper.backward_and_step(loss, opt)`
            return self._method_of(call.receiver_key, call.method)
        owner = self._local_instance_class(call.receiver_key, call.scope)
        return self._method_of(owner, call.method) if owner else None

    def _only_override(self, owner: str | None, name: str) -> Scope | None:
        """The one override of a method in the file's subclasses of `owner` (ResShift's
        `TrainerBase.train` calls `self.training_step`, a `pass` its subclass fills in); None
        when there are several (which runs depends on the instance)."""
        below = self.subclasses(lambda base, _resolved: base == owner)
        overrides = [f for f in self.functions_by_name.get(name, ()) if f.class_name in below]
        return overrides[0] if len(overrides) == 1 else None

    @cached_property
    def _class_names(self) -> set[str]:
        return {scope.name for scope, _bases in self.classes}

    def _method_of(self, owner: str, name: str) -> Scope | None:
        return next((f for f in self.functions_by_name.get(name, ()) if f.class_name == owner), None)

    def _local_instance_class(self, key: str | None, scope: Scope) -> str | None:
        """The class this file defines that a local name holds an instance of (`stepper =
        Stepper(opt)`, `criterion = DiceBCELoss()` in the same function), if every binding says so.
        Only local names: the slicer keeps a class's methods where its name is used."""
        if key is None or "." in key:
            return None
        function = scope.function_scope
        built = [constructor_of(a.value) for a in self._assignments_by_key.get(key, ()) if a.where.scope.function_scope is function]
        owners = {call.func.value if call is not None and isinstance(call.func, cst.Name) else None for call in built}
        if len(owners) != 1 or None in owners:  # no binding, or one that is not `Class(...)`
            return None
        (owner,) = owners
        return owner if owner in self._class_names else None

    def _instance_call(self, call: CallSite) -> Scope | None:
        """`criterion(probs, targets)` on a local instance: the class's `__call__`, or the `forward`
        an nn.Module's call runs."""
        owner = self._local_instance_class(call.callee, call.scope)
        if owner is None:
            return None
        return self._method_of(owner, "__call__") or self._method_of(owner, "forward")

    @cached_property
    def _method_on_result(self) -> dict[int, str]:
        return {id(c.receiver): c.method for c in self.calls if c.method and isinstance(c.receiver, cst.Call)}

    def method_on_result(self, call: CallSite) -> str | None:
        """The method called directly on a call's result: "cpu" for `x.half().cpu()`."""
        return self._method_on_result.get(id(call.node))

    def called_functions(self, call: CallSite) -> list[Scope]:
        """The in-file functions a call may run: `called_function`'s, else those a local name is
        bound to (`train = train_hetero if hetero else train_homo`, then `train(...)`)."""
        target = self.called_function(call)
        if target is not None:
            return [target]
        if call.method is not None or call.callee is None or "." in call.callee:
            return []
        targets = []
        for value, value_scope in self.bindings(call.callee, call.scope):
            for arm in arms_of(value):
                if isinstance(arm, cst.Name) and value_scope.resolve_head(arm.value) is None:
                    targets.extend(f for f in self.functions_by_name.get(arm.value, ()) if f.class_name is None)
        return targets

    @cached_property
    def call_sites_of(self) -> dict[int, list[CallSite]]:
        """In-file call sites, keyed by the id of the function they call."""
        table: dict[int, list[CallSite]] = {}
        for call in self.calls:
            for target in self.called_functions(call):
                table.setdefault(id(target), []).append(call)
        return table

    def callers(self, function: Scope) -> list[CallSite]:
        return self.call_sites_of.get(id(function), [])

    def named_as_a_value(self, function: Scope) -> bool:
        """Whether the function is used other than by a call (`ctx = amp_ctx if amp else ...`,
        `Thread(target=worker)`): it may then be called where this file cannot see."""
        return any(r.dotted.rsplit(".", 1)[-1] == function.name for r in self.references)

    def returned_to_another_module(self, call: CallSite) -> bool:
        """`return <call>` in a function this file never calls nor names as a value (a factory of
        scalers or autocast regions): the modules that call it hold what it makes."""
        function = call.scope.function_scope
        if not isinstance(self.parent_of.get(id(call.node)), cst.Return) or function.kind != "function":
            return False
        return not self.callers(function) and not self.named_as_a_value(function)

    # -- conditions ---------------------------------------------------------------------------
    def conjuncts(self, test: cst.BaseExpression) -> frozenset[str]:
        """The conditions an `if` test requires, as written: the operands of a top-level `and`,
        else the test. Two `if`s whose conditions are the same text hold on the same runs."""
        if id(test) not in self._conjuncts:
            if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
                self._conjuncts[id(test)] = self.conjuncts(test.left) | self.conjuncts(test.right)
            else:
                self._conjuncts[id(test)] = frozenset({self.module.code_for_node(_bare(test))})
        return self._conjuncts[id(test)]

    def contradictory(self, a: Iterable[Context], b: Iterable[Context]) -> bool:
        """Whether code at the places `a` and code at the places `b` (a helper's call site and the
        place inside it) hang on opposite outcomes of one condition, as written: the body of `if
        args.fp16:` and the `else` of another `if args.fp16:`, or the body of `if scaler is None:`
        and that of `if scaler is not None:`. The condition is taken not to change in between."""
        held_a, failed_a = self.outcomes_at(a)
        held_b, failed_b = self.outcomes_at(b)
        return (
            bool(held_a & failed_b or failed_a & held_b)
            or self._one_fails(a, held_b, failed_b)
            or self._one_fails(b, held_a, failed_a)
        )

    def _one_fails(self, places: Iterable[Context], held: frozenset[str], failed: frozenset[str]) -> bool:
        """Whether code at `places` is where one of `a and b` fails (the `else` of `if a and b:`, the
        body of `if not (a and b):`) while every one of them holds elsewhere (Transformer-XL: the
        scaled backward under `if args.fp16:` then `if args.amp == "pytorch":`, the plain step in
        the `else` of `if args.fp16 and args.amp == "pytorch":`)."""
        for where in places:
            for node_id, label in where.branches:
                test = self.if_tests.get(node_id)
                if test is None:
                    continue
                test = _bare(test)
                if label == "body" and isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
                    test = test.expression
                elif label != "else":
                    continue
                parts = and_operands(test)
                if len(parts) > 1 and all(t in (held if p else failed) for t, p in map(self.condition, parts)):
                    return True
        return False

    def failed_conditions(self, where: Context) -> frozenset[str]:
        """The conditions, as written without their negation, that fail wherever code at `where`
        runs: `x` in the body of `if not x:` and in the `else` of `if x:`."""
        return self.outcomes_at((where,))[1]

    def outcomes_at(self, places: Iterable[Context]) -> tuple[frozenset[str], frozenset[str]]:
        """The conditions that hold, and those that fail, at every one of `places`."""
        held: set[str] = set()
        failed: set[str] = set()
        for where in places:
            if where.branches not in self._outcomes:
                self._outcomes[where.branches] = self.outcomes_of(where.branches)
            place_held, place_failed = self._outcomes[where.branches]
            held |= place_held
            failed |= place_failed
        return frozenset(held), frozenset(failed)

    def outcomes_of(self, branches: tuple[tuple[int, str], ...]) -> tuple[frozenset[str], frozenset[str]]:
        """The conditions that hold, and those that fail, inside the given branches."""
        held: set[str] = set()
        failed: set[str] = set()
        for node_id, label in branches:
            test = self.if_tests.get(node_id)
            if test is None:
                continue  # a `match` case
            test = _bare(test)
            if label == "body" and isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
                parts = [test.left, test.right]  # all of them hold
            elif label == "else" and isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or):
                parts = [test.left, test.right]  # all of them fail
            elif isinstance(test, cst.BooleanOperation):
                continue  # one of them held, or failed: which is not known
            else:
                parts = [test]
            for part in parts:
                text, positive = self.condition(part)
                (held if positive == (label == "body") else failed).add(text)
        opposite = self._complementary_flags
        if opposite:
            held, failed = held | {opposite[f] for f in failed if f in opposite}, failed | {opposite[h] for h in held if h in opposite}
        return frozenset(held), frozenset(failed)

    @cached_property
    def _complementary_flags(self) -> dict[str, str]:
        """Flags that always hold opposite values: every place that sets one sets the other to the
        other boolean literal (a GAN's `step_gen, step_dis = True, False` in one branch, `False,
        True` in the other), and nothing else binds them; `if step_gen:` then runs exactly where
        `if step_dis:` does not."""
        literal_values: dict[str, dict[tuple, bool]] = {}
        excluded = set(self._unpackings_by_key)
        excluded |= {dotted_name(target) for target, _ in self.loop_targets}
        excluded |= {param for function in self.functions for param in function.params}
        for assignment in self.assignments:
            value = assignment.value
            place = (id(assignment.where.scope.function_scope), assignment.where.branches)
            values = literal_values.setdefault(assignment.key, {})
            if not (isinstance(value, cst.Name) and value.value in ("True", "False")) or place in values:
                excluded.add(assignment.key)  # another value, or set twice in one block
            else:
                values[place] = value.value == "True"
        flags = {key: values for key, values in literal_values.items() if key not in excluded}
        by_places: dict[frozenset, list[str]] = {}
        for key, values in flags.items():
            by_places.setdefault(frozenset(values), []).append(key)
        opposite = {}
        for keys in by_places.values():
            for a in keys:
                partners = [b for b in keys if all(flags[a][place] != flags[b][place] for place in flags[a])]
                if len(partners) == 1:
                    opposite[a] = partners[0]
        return opposite

    def condition(self, test: cst.BaseExpression) -> tuple[str, bool]:
        """A condition as written, without its negation, and whether it was negated: `not x` is
        (x, False), `a is not None` is (`a is None`, False), `a != b` is (`a == b`, False)."""
        test = _bare(test)
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            text, positive = self.condition(test.expression)
            return text, not positive
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
            (target,) = test.comparisons
            positive_form = _POSITIVE_COMPARISONS.get(type(target.operator))
            if positive_form is not None:
                code = self.module.code_for_node
                return f"{code(_bare(test.left))} {positive_form} {code(_bare(target.comparator))}", False
        return self.module.code_for_node(test), True

    # -- value kinds --------------------------------------------------------------------------
    def autocast_of(self, expr: cst.BaseExpression | None, scope: Scope, depth: int = 0) -> Autocast | None:
        """The autocast region an expression opens when used in `with` or as a decorator."""
        if expr is None or depth > 3:
            return None
        if isinstance(expr, cst.Call):
            qualified = self.qualname(expr.func, scope)
            if qualified in names.NO_OP_CONTEXTS:
                # `self.amp_ctx = partial(torch.autocast, ...)` if a precision is set, else
                # `suppress` (timm's benchmark): a region that is on where that path ran.
                region = self._autocast_on_another_path(expr, scope)
                return _on_one_path(region) if region else None
            conditional = self.conditional_autocast(dotted_name(expr.func), scope) if qualified is None else None
            if conditional is not None:  # opened on one arm of the alias only
                return _on_one_path(_autocast_from_call(expr, conditional, scope))
            if qualified in names.AUTOCAST:
                region = _autocast_from_call(expr, qualified, scope)
                if region.enabled == "maybe" and self._never_switched_on(region.enabled_when, scope):
                    region = replace(region, enabled="no", enabled_when=None)
                bound = self.held_values(dotted_name(expr.func), scope)
                if self._bound_among(bound, names.NO_OP_CONTEXTS):  # `ctx = torch.autocast` if amp else `suppress`
                    return _on_one_path(region)
                return region
            if self.opens_framework_autocast(expr, scope):
                # Enabled, on its device and dtype, as the framework's precision setting says.
                return Autocast(expr, "maybe", None, None, deprecated=False)
            partial = self._partial_autocast(expr.func, scope)
            if partial is not None:
                return partial
            # A factory in this file: `def amp_ctx(): return torch.autocast(...)`.
            function = self._function_named(expr.func, scope)
            if function is not None:
                for value in function.returns:
                    found = self.autocast_of(value, function, depth + 1)
                    if found:
                        return found
            return self._returned_by_a_factory(expr, scope, depth)
        if isinstance(expr, cst.Lambda):  # `lambda: torch.autocast("cuda", dtype=torch.bfloat16)`, called
            return self.autocast_of(expr.body, scope, depth + 1)
        if isinstance(expr, cst.IfExp):
            body = self.autocast_of(expr.body, scope, depth + 1)
            orelse = self.autocast_of(expr.orelse, scope, depth + 1)
            found = body or orelse
            if found is None:
                return None
            if body and orelse and body.enabled == orelse.enabled:
                return found
            # `autocast(...) if use_amp else nullcontext()` (or a disabled autocast): on only where
            # the test holds, and the arm's own `enabled=` too.
            on_body = body is not None and body.enabled != "no"
            on_else = orelse is not None and orelse.enabled != "no"
            if not (on_body or on_else):  # `autocast(enabled=False) if debug else nullcontext()`
                return replace(found, node=expr, enabled="no")
            on = body if on_body else orelse
            when = None
            if on_body != on_else:
                when = all_of([expr.test if on_body else cst.UnaryOperation(cst.Not(), expr.test), on.enabled_when])
            return Autocast(expr, "maybe", on.device, on.dtype, on.deprecated, when)
        if isinstance(expr, (cst.Name, cst.Attribute)):
            key = dotted_name(expr)
            bound = self.bindings(key, scope, through_parameters=True)
            for value, value_scope in bound:
                found = self.autocast_of(value, value_scope, depth + 1)
                if found:
                    return self._on_where_bound(found, key, value) if len(bound) > 1 else found
        return None

    def _on_where_bound(self, region: Autocast, key: str | None, value: cst.BaseExpression) -> Autocast:
        """A name bound to autocast under an `if` and to something else besides (DSVT's `amp_ctx =
        nullcontext()`, then `if fp16: amp_ctx = torch.autocast(...)`): entered as `with amp_ctx:`,
        the region is on only where the `if` held, as `autocast(...) if fp16 else nullcontext()`."""
        if region.enabled == "no":
            return region
        assignment = next((a for a in self._assignments_by_key.get(key, ()) if a.value is value), None)
        tests = list(self.branch_tests(assignment.where)) if assignment is not None else []
        if not tests:
            return region
        return replace(region, enabled="maybe", enabled_when=all_of([*tests, region.enabled_when]))

    def branch_tests(self, where: Context) -> Iterator[cst.BaseExpression]:
        """What must hold for code at `where` to run: the test of each enclosing `if` whose body
        holds it, and `not` the test of each whose `else` does."""
        for node_id, label in where.branches:
            test = self.if_tests.get(node_id)
            if test is not None:
                yield test if label == "body" else cst.UnaryOperation(cst.Not(), test)

    def _factories(self, bound: list[tuple[cst.BaseExpression, Scope]]) -> Iterator[Scope]:
        """The same-file functions whose call results a name is bound to."""
        for value, value_scope in bound:
            factory = self._function_named(value.func, value_scope) if isinstance(value, cst.Call) else None
            if factory is not None:
                yield factory

    def _never_switched_on(self, enabled: cst.BaseExpression | None, scope: Scope) -> bool:
        """`enabled=enable_autocast`, a parameter whose default is `False` that no call passes, in a
        function all of whose calls this file holds (private, nested, or in a test module; not one
        passed around as a value): ColossalAI's `run_fwd_bwd(..., enable_autocast=False)`. Also a
        test parameter that `@pytest.mark.parametrize` only ever gives `False` (xformers:
        `@pytest.mark.parametrize("amp", [False])`)."""
        function = scope.function_scope
        if not isinstance(enabled, cst.Name) or not isinstance(function.node, cst.FunctionDef):
            return False
        name = enabled.value
        params = function.node.params
        positional = [*params.posonly_params, *params.params]
        param = next((p for p in (*positional, *params.kwonly_params) if p.name.value == name), None)
        if param is None or any(a.key == name and a.where.scope.function_scope is function for a in self.assignments):
            return False  # not a parameter, or rebound in the body
        if _parametrized_only_false(function.node, name):
            return True
        if not (isinstance(param.default, cst.Name) and param.default.value == "False"):
            return False
        nested = function.parent is not None and function.parent.kind == "function"
        in_tests = any(names.names_a_test(f.name) for f in self.functions)
        if not (function.name.startswith("_") or nested or in_tests):
            return False
        if self.named_as_a_value(function):
            return False
        passed = list(self.passed_for(function, name))
        # `*args` or `**kwargs` may pass it, where `passed_for` cannot say what they hold.
        return bool(passed) and not any(value is not None or has_star_args(call.node) for call, value in passed)

    def _returned_by_a_factory(self, call: cst.Call, scope: Scope, depth: int) -> Autocast | None:
        """`autocast = get_autocast(args.precision)`, then `with autocast():` (open_clip): the
        region of what a same-file factory returns, called here: autocast itself, a `partial` of
        it, or a lambda that builds one. A no-op context returned on another path (`suppress`)
        makes it a region that may be on."""
        for factory in self._factories(self.held_values(dotted_name(call.func), scope)):
            found, no_op = None, False
            for returned in factory.returns:
                qualified = self.qualname(returned, factory) if isinstance(returned, (cst.Name, cst.Attribute)) else None
                if qualified in names.NO_OP_CONTEXTS:
                    no_op = True
                elif found is None and qualified in names.AUTOCAST:
                    found = _autocast_from_call(call, qualified, scope)
                elif found is None and isinstance(returned, cst.Lambda):
                    found = self.autocast_of(returned.body, factory, depth + 1)
                elif found is None:
                    found = self._autocast_of_partial(returned, factory)
            if found is not None:
                return _on_one_path(found) if no_op else found
        return None

    def constructed(self, key: str | None, scope: Scope) -> list[tuple[cst.Call, str | None]]:
        """The calls a name or `self.attr` is bound to, each with the qualified name it calls
        (`accelerator = Accelerator(...)`, `sched = ReduceLROnPlateau(...)`)."""
        return [
            (call, self.qualname(call.func, value_scope))
            for value, value_scope in self.bindings(key, scope)
            if (call := constructor_of(value)) is not None
        ]

    def opens_framework_autocast(self, call: cst.Call, scope: Scope) -> bool:
        """`accelerator.autocast()`, `fabric.autocast()`: a framework object entering torch's
        autocast for the precision it was configured with."""
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "autocast"):
            return False
        return self.is_framework_object(dotted_name(func.value), scope)

    def is_framework_object(self, key: str | None, scope: Scope) -> bool:
        """`accelerator`, `fabric`, or a name bound to an Accelerator or a Fabric."""
        if key is None:
            return False
        if key.rsplit(".", 1)[-1] in names.FRAMEWORK_AUTOCAST_OWNERS:
            return True
        return any(built in names.FRAMEWORK_AUTOCAST_CLASSES for _, built in self.constructed(key, scope))

    def _bound_among(self, bound: list[tuple[cst.BaseExpression, Scope]], qualnames: Container[str]) -> str | None:
        """The first of `qualnames` that one of the values a name is bound to names (`ctx = suppress`)."""
        for value, value_scope in bound:
            if isinstance(value, (cst.Name, cst.Attribute)) and (named := self.qualname(value, value_scope)) in qualnames:
                return named
        return None

    def _autocast_on_another_path(self, call: cst.Call, scope: Scope) -> Autocast | None:
        """The region a call opens through another binding of its name than the no-op context
        `qualname` found: a `partial` of autocast, or autocast itself under another name."""
        aliased = self._bound_among(self.held_values(dotted_name(call.func), scope), names.AUTOCAST)
        if aliased is not None:
            return _autocast_from_call(call, aliased, scope)
        return self._partial_autocast(call.func, scope)

    def _partial_autocast(self, func: cst.BaseExpression, scope: Scope) -> Autocast | None:
        for value, value_scope in self.held_values(dotted_name(func), scope):
            region = self._autocast_of_partial(value, value_scope)
            if region is not None:
                return region
        return None

    def _partial_target(self, value: cst.BaseExpression, scope: Scope) -> cst.BaseExpression | None:
        """What `functools.partial(f, ...)` fixes arguments of: `f`."""
        if isinstance(value, cst.Call) and value.args and self.qualname(value.func, scope) in names.FUNCTOOLS_PARTIAL:
            return value.args[0].value
        return None

    def _autocast_of_partial(self, value: cst.BaseExpression, scope: Scope) -> Autocast | None:
        """The region `functools.partial(torch.autocast, "cuda", ...)` opens when called."""
        target = self.qualname(self._partial_target(value, scope), scope)
        if target not in names.AUTOCAST:
            return None
        shifted = value.with_changes(args=value.args[1:])
        # Report the partial() call itself: the shifted copy is not in the tree.
        return replace(_autocast_from_call(shifted, target, scope), node=value)

    def _function_named(self, func: cst.BaseExpression, scope: Scope) -> Scope | None:
        dotted = dotted_name(func)
        if dotted is None:
            return None
        if isinstance(func, cst.Name):
            candidates = [f for f in self.functions_by_name.get(dotted, ()) if f.class_name is None]
            return candidates[0] if candidates else None
        if isinstance(func, cst.Attribute) and dotted_name(func.value) in ("self", "cls"):
            owner = scope.function_scope.class_name
            candidates = [f for f in self.functions_by_name.get(func.attr.value, ()) if f.class_name == owner]
            return candidates[0] if candidates else None
        return None

    def value_kind(self, expr: cst.BaseExpression | None, scope: Scope, depth: int = 0) -> str | None:
        """"scaler", "optimizer", "scheduler", "model" or "autocast" for what an expression holds."""
        if expr is None or depth > 3:
            return None
        if isinstance(expr, cst.IfExp):  # `GradScaler() if args.amp else None` holds a scaler when it is on
            return next(filter(None, (self.value_kind(arm, scope, depth + 1) for arm in arms_of(expr))), None)
        if isinstance(expr, cst.Call):
            qualified = self.qualname(expr.func, scope)
            if qualified in names.GRAD_SCALER:
                return "scaler"
            if qualified in names.AUTOCAST:
                return "autocast"
            if qualified is not None:
                kind = _kind_of_constructor(qualified)
                if kind:
                    return kind
            if isinstance(expr.func, cst.Attribute):
                method = expr.func.attr.value
                if method in _RETURNS_ITS_MODULE:
                    return self.value_kind(expr.func.value, scope, depth + 1)
                if method == "from_pretrained" or method == "from_config":
                    return "model"
                if method in ("prepare",) and expr.args:  # accelerator.prepare(model)
                    return None
            if isinstance(expr.func, cst.Name) and self.is_module_class(expr.func.value):
                return "model"
            return None
        if isinstance(expr, (cst.Name, cst.Attribute)):
            for value, value_scope in self.bindings(dotted_name(expr), scope):
                kind = self.value_kind(value, value_scope, depth + 1)
                if kind:
                    return kind
        return None

    def scope_of_function(self, function: cst.CSTNode | None) -> Scope | None:
        """The scope of one of the file's `def`s."""
        return self._function_scopes.get(id(function))

    @cached_property
    def _function_scopes(self) -> dict[int, Scope]:
        return {id(scope.node): scope for scope in self.functions}

    def function_holding(self, node: cst.CSTNode) -> Scope:
        """The innermost function (or the module) whose code holds `node`."""
        for parent in self.ancestors(node):
            if isinstance(parent, cst.FunctionDef):
                return self.scope_of_function(parent) or self.module_scope
        return self.module_scope

    def subclasses(self, is_root: Callable[[str, str | None], bool]) -> set[str]:
        """The classes of the file that subclass, directly or through one another, a base for
        which `is_root(base as written, base resolved through imports)` holds."""
        found: set[str] = set()
        changed = True
        while changed:
            changed = False
            for scope, bases in self.classes:
                if scope.name in found:
                    continue
                if any(
                    base is not None and (base in found or is_root(base, scope.parent.resolve(base) if scope.parent else None))
                    for base in bases
                ):
                    found.add(scope.name)
                    changed = True
        return found

    @cached_property
    def _module_classes(self) -> set[str]:
        return self.subclasses(_a_module_base)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """The nodes holding `node`, innermost first, as the facts pass recorded them."""
        current = self.parent_of.get(id(node))
        while current is not None:
            yield current
            current = self.parent_of.get(id(current))

    def is_module_class(self, name: str) -> bool:
        return name in self._module_classes

    def is_autograd_function(self, scope: Scope, bases: tuple[str | None, ...]) -> bool:
        """Whether a class of this file (its scope and bases, as in `classes`) subclasses
        torch.autograd.Function, however the base is imported."""
        parent = scope.parent or self.module_scope
        return any(base is not None and parent.resolve(base) in names.AUTOGRAD_FUNCTION for base in bases)

    def scalers_in(self) -> list[CallSite]:
        return [c for c in self.calls if c.qualname in names.GRAD_SCALER]

    def is_scaler(self, key: str | None, scope: Scope) -> bool:
        """Whether a receiver is a GradScaler: constructed as one, or used the way only one is."""
        return key is not None and key in self._scaler_keys

    @cached_property
    def _scaler_keys(self) -> set[str]:
        keys: set[str] = set()
        for assignment in self.assignments:
            if self.value_kind(assignment.value, assignment.where.scope) == "scaler":
                keys.add(assignment.key)
        for call in self.calls:
            if call.receiver_key is None:
                continue
            if call.method in ("unscale_", "get_scale") or (
                call.method == "scale" and id(call.node) in self.backward_of_scale
            ):
                keys.add(call.receiver_key)
            elif (
                call.method in ("step", "update", "scale")
                and "scaler" in call.receiver_key.split(".")[-1].lower()
                and not self._own_non_scaler_instance(call.receiver_key, call.scope)
            ):
                keys.add(call.receiver_key)
        return keys

    def _own_non_scaler_instance(self, key: str, scope: Scope) -> bool:
        """Bound only to instances of classes that are not a GradScaler: a project's own "scaler"
        (fairscale's LayerwiseGradientScaler, which has no `update()`). A class is told from a
        factory function by its capitalised name; one this file defines counts as a GradScaler when
        it subclasses one, an imported one when its name says so (`ShardedGradScaler`)."""
        values = self.bindings(key, scope)
        return bool(values) and all(
            isinstance(value, cst.Call) and self._constructs_another_class(value, value_scope) for value, value_scope in values
        )

    def _constructs_another_class(self, call: cst.Call, scope: Scope) -> bool:
        dotted = dotted_name(call.func)
        if dotted is None or not dotted.split(".")[-1][:1].isupper():
            return False
        if dotted in self._classes_not_grad_scalers:
            return True
        if dotted in self._class_names:
            return False  # this file's GradScaler subclass
        qualified = self.qualname(call.func, scope) or dotted
        return qualified not in names.GRAD_SCALER and not qualified.endswith("GradScaler")

    @cached_property
    def _classes_not_grad_scalers(self) -> set[str]:
        return {
            scope.name
            for scope, bases in self.classes
            if not any(base and (scope.parent.resolve(base) in names.GRAD_SCALER or base.endswith("GradScaler")) for base in bases)
        }

    def scaler_disabled(self, key: str | None, scope: Scope) -> bool:
        """True only when every construction bound to this name passes a literal `enabled=False`."""
        values = [v for v, s in self.bindings(key, scope) if self.value_kind(v, s) == "scaler"]
        if not values:
            return False
        return all(built_disabled(constructor_of(value)) for value in values)

    def is_optimizer(self, key: str | None, scope: Scope) -> bool:
        if key is None:
            return False
        if key in self._optimizer_keys:
            return True
        last = key.split(".")[-1].lower()
        if "sched" in last or "scaler" in last:
            return False
        return bool(re.search(r"optim|^opt(_|\d|$)|_opt$|^opt[a-z]$", last)) and key not in self._option_namespaces

    @cached_property
    def _option_namespaces(self) -> set[str]:
        """Names read for attributes no optimizer has and never stepped: `opt = parser.parse_args()`
        then `range(opt.niter)`, the command-line options of the DCGAN / CycleGAN / YOLOv5 lineage.
        An optimizer wrapper with attributes of its own (OpenNMT's `self.optim.amp`) still steps."""
        namespaces: set[str] = set()
        for reference in self.references:
            owner, _, attribute = reference.dotted.rpartition(".")
            if owner and attribute not in names.OPTIMIZER_ATTRIBUTES:
                namespaces.add(owner)
        stepped = {c.receiver_key for c in self.calls if c.method in ("step", "zero_grad", "backward")}
        return namespaces - stepped

    @cached_property
    def _optimizer_keys(self) -> set[str]:
        keys: set[str] = set()
        for assignment in self.assignments:
            if self.value_kind(assignment.value, assignment.where.scope) == "optimizer":
                keys.add(assignment.key)
        for call in self.calls:
            if call.method in ("step", "unscale_") and self.is_scaler(call.receiver_key, call.scope):
                passed = dotted_name(call.arg(0, "optimizer"))
                if passed:
                    keys.add(passed)
        return keys

    # -- regions ------------------------------------------------------------------------------
    def innermost_autocast(self, where: Context) -> Autocast | None:
        """The autocast region a recorded node sits in, lexically, within its own function."""
        for item in reversed(where.withs):
            found = self._with_item_autocast(item, where.scope) or self._entered_on_a_stack(item, where)
            if found is not None:
                return found
        if self._entered_by_hand:
            entered = self.entered_by_hand(where)
            if entered is not None:
                return entered[1]
        scope: Scope | None = where.scope
        while scope is not None and scope.kind in ("function", "lambda", "class"):
            if scope.kind == "function":
                for decorator in scope.decorators:
                    found = self.decorator_autocast(decorator, scope.parent or scope)
                    if found is not None:
                        return found
                return self._wrapped_in_autocast.get(id(scope))
            scope = scope.parent
        return None

    @cached_property
    def _wrapped_in_autocast(self) -> dict[int, Autocast]:
        """Functions rebound to themselves wrapped in a region: `step = torch.autocast(...)(step)`
        is `@torch.autocast(...)` applied by hand."""
        table: dict[int, Autocast] = {}
        for assignment in self.assignments:
            value = assignment.value
            if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Call) and len(value.args) == 1):
                continue
            wrapped = value.args[0].value
            if not (isinstance(wrapped, cst.Name) and wrapped.value == assignment.key):
                continue
            region = self.autocast_of(value.func, assignment.where.scope)
            if region is None:
                continue
            for function in self.functions_by_name.get(assignment.key, ()):
                if function.parent is assignment.where.scope:
                    table[id(function)] = region
        return table

    def _entered_on_a_stack(self, item: cst.WithItem, where: Context) -> Autocast | None:
        """`with contextlib.ExitStack() as stack:` then `stack.enter_context(torch.autocast(...))`:
        the region runs from that call to the end of the block."""
        entered = self._stack_regions.get(id(item))
        if not entered:
            return None
        return next((region for order, region in reversed(entered) if order < where.order), None)

    @cached_property
    def _entered_by_hand(self) -> dict[int, list[tuple[CallSite, Autocast, list[int]]]]:
        """id(function) -> each autocast it enters by calling `__enter__()` itself (`ctx =
        torch.autocast(...)`, `ctx.__enter__()`, ..., `ctx.__exit__(None, None, None)`), with the
        order of every `__exit__()` the function calls on the same name."""
        table: dict[int, list[tuple[CallSite, Autocast, list[int]]]] = {}
        for call in self.calls:
            if call.method == "__enter__" and call.receiver is not None:
                region = self.autocast_of(call.receiver, call.scope)
                if region is not None:
                    function = call.scope.function_scope
                    exits = [
                        c.where.order for c in self.calls
                        if c.method == "__exit__" and call.receiver_key is not None and c.receiver_key == call.receiver_key
                        and c.scope.function_scope is function
                    ]
                    table.setdefault(id(function), []).append((call, region, exits))
        return table

    def entered_by_hand(self, where: Context) -> tuple[CallSite, Autocast] | None:
        """The `__enter__()` call and region of the last autocast entered by hand before `where` in
        its function and not exited by `__exit__()` on the same name in between: the region runs
        from one call to the other."""
        for enter, region, exits in reversed(self._entered_by_hand.get(id(where.scope.function_scope), ())):
            if enter.where.order >= where.order:
                continue
            exited = any(enter.where.order < order < where.order for order in exits)
            return None if exited else (enter, region)
        return None

    @cached_property
    def stack_entries(self) -> list[tuple[cst.WithItem, CallSite, Autocast]]:
        """Each autocast entered on an ExitStack (`stack.enter_context(torch.autocast(...))` in
        `with ExitStack() as stack:`): the stack's with item, the call, and the region."""
        entries = []
        for call in self.calls:
            if call.method != "enter_context" or not call.node.args or call.receiver_key is None:
                continue
            for item in call.where.withs:
                stack = item.asname.name if item.asname is not None else None
                if not (isinstance(stack, cst.Name) and stack.value == call.receiver_key and isinstance(item.item, cst.Call)):
                    continue
                if self.qualname(item.item.func, call.scope) not in names.EXIT_STACKS:
                    continue
                region = self.autocast_of(call.node.args[0].value, call.scope)
                if region is not None:
                    entries.append((item, call, region))
        return entries

    @cached_property
    def _stack_regions(self) -> dict[int, list[tuple[int, Autocast]]]:
        """id(with item of an ExitStack) -> (order, region) of each autocast entered on it."""
        table: dict[int, list[tuple[int, Autocast]]] = {}
        for item, call, region in self.stack_entries:
            table.setdefault(id(item), []).append((call.where.order, region))
        return table

    def _with_item_autocast(self, item: cst.WithItem, scope: Scope) -> Autocast | None:
        key = id(item)
        if key not in self._with_cache:
            self._with_cache[key] = self.autocast_of(item.item, scope)
        return self._with_cache[key]

    @cached_property
    def _with_cache(self) -> dict[int, Autocast | None]:
        return {}

    def decorator_autocast(self, decorator: cst.Decorator, scope: Scope) -> Autocast | None:
        expr = decorator.decorator
        if isinstance(expr, cst.Call):
            return self.autocast_of(expr, scope)
        qualified = self.qualname(expr, scope)
        if qualified in names.AUTOCAST:
            return Autocast(expr, "yes", None, None, qualified in names.DEPRECATED_AMP)
        # `fp16 = torch.autocast("cuda", dtype=torch.float16)`, then `@fp16`.
        return self.autocast_of(expr, scope) if isinstance(expr, (cst.Name, cst.Attribute)) else None

    def region_of(
        self, where: Context, depth: int = 0, through: Callable[[CallSite], bool] | None = None
    ) -> tuple[Autocast, CallSite | None] | None:
        """The enabled (or possibly enabled) region a node runs in, lexically or via in-file calls
        (only the calls `through` accepts, when given).

        Returns the region and, when it is reached through a call, the call site inside it.
        """
        lexical = self.innermost_autocast(where)
        if lexical is not None:
            return (lexical, None) if lexical.enabled != "no" and not self._switched_off(lexical, where) else None
        if depth >= names.CALL_DEPTH:
            return None
        function = where.scope.function_scope
        if function.kind != "function":
            return None
        for site in self.callers(function):
            if through is not None and not through(site):
                continue
            outer = self.region_of(site.where, depth + 1, through)
            if outer is not None:
                return outer[0], outer[1] or site
        return None

    def _switched_off(self, region: Autocast, where: Context) -> bool:
        """Whether the condition that enables a region fails where the code runs: the `else` of
        `if args.amp:` inside `autocast(enabled=args.amp)` (MONAI's tutorials keep a plain backward
        there) runs with autocast off. Only for a region written in this function (`_written_here`),
        so that the condition's names are this function's (a factory's `enabled=use_amp` is not the
        caller's `use_amp`); the condition is taken not to change in between."""
        if region.enabled_when is None or not self._written_here(region, where):
            return False
        held, failed = self.outcomes_at((where,))
        return self.fails(region.enabled_when, held, failed)

    def _written_here(self, region: Autocast, where: Context) -> bool:
        """The region is opened in a `with` around `where`, or bound to a name in the same function
        (`amp_region = torch.autocast(..., enabled=use_amp)`, then `with amp_region:`)."""
        if any(region.node is expr for item in where.withs for expr in _with_expressions(item)):
            return True
        function = where.scope.function_scope
        if not any(a.value is region.node and a.where.scope.function_scope is function for a in self.assignments):
            return False
        # Built once, entered later: a flag assigned again in between (`use_amp = epoch < warm`)
        # no longer says what the region was built with.
        flags = set(identifiers(region.enabled_when).split()) if region.enabled_when is not None else set()
        return not any(a.key in flags and a.where.scope.function_scope is function for a in self.assignments)

    def fails(self, condition: cst.BaseExpression, held: frozenset[str], failed: frozenset[str]) -> bool:
        """Whether `condition` is false given the conditions known to hold and to fail."""
        condition = _bare(condition)
        if isinstance(condition, cst.BooleanOperation):
            parts = (condition.left, condition.right)
            if isinstance(condition.operator, cst.And):
                return any(self.fails(part, held, failed) for part in parts)
            return all(self.fails(part, held, failed) for part in parts)
        text, positive = self.condition(condition)
        return text in (failed if positive else held)

    @cached_property
    def backward_of_scale(self) -> dict[int, CallSite]:
        """`s.scale(loss)` calls whose result is back-propagated, keyed by the id of the scale call."""
        table: dict[int, CallSite] = {}
        for call in self.calls:
            if call.method == "backward" and isinstance(call.receiver, cst.Call):
                table[id(call.receiver)] = call
            elif call.qualname in names.AUTOGRAD_BACKWARD:
                first = call.arg(0, "tensors")
                if isinstance(first, cst.Call):
                    table[id(first)] = call
        return table

    @cached_property
    def has_autocast(self) -> bool:
        return next(self.openings(), False) is not False

    @cached_property
    def has_enabled_autocast(self) -> bool:
        """Whether the file opens a region that is or may be enabled. Regions that are only ever
        `autocast(enabled=False)` step out of a caller's region (vall-e's scaling.py computes its
        kernels in float32 that way) and open none of their own."""
        return any(region is None or region.enabled != "no" for region in self.openings())

    def openings(self) -> Iterator[Autocast | None]:
        """What each autocast the file opens says about itself: a torch autocast call's region, a
        decorator's, or None where it is not read (a framework's own `accelerator.autocast()`)."""
        return (region for region, _ in self.opening_places())

    def opening_places(self) -> Iterator[tuple[Autocast | None, Context | None]]:
        """Each of `openings`, with where its autocast call is written (None for a decorator)."""
        for call in self.calls:
            if self._left_of_an_and(call.node):
                continue  # `with autocast() and no_grad():` enters only `no_grad()`: the autocast object is true
            if call.qualname in names.AUTOCAST:
                yield self.autocast_of(call.node, call.scope), call.where
            elif self.opens_framework_autocast(call.node, call.scope):
                yield None, call.where
        for function in self.functions:
            for decorator in function.decorators:
                region = self.decorator_autocast(decorator, function.parent or function)
                if region is not None:
                    yield region, None

    def _left_of_an_and(self, node: cst.CSTNode) -> bool:
        parent = self.parent_of.get(id(node))
        return isinstance(parent, cst.BooleanOperation) and isinstance(parent.operator, cst.And) and parent.left is node

    @cached_property
    def has_scaler(self) -> bool:
        return any(c.qualname in names.GRAD_SCALER for c in self.calls)

    # -- loops --------------------------------------------------------------------------------
    def enclosing_loops(self, where: Context, depth: int = 0) -> list[tuple[Loop, CallSite | None]]:
        """Loops around a node, innermost first: its own, then those around its first in-file
        caller that runs in a loop."""
        return next(self.loops_per_caller(where, depth), [])

    def loops_per_caller(self, where: Context, depth: int = 0) -> Iterator[list[tuple[Loop, CallSite | None]]]:
        """The loops around a node, innermost first: its own if it has any; else, for each in-file
        caller that runs in a loop, the loops around that call (a factory called per seed in one
        function and per epoch in another is two answers)."""
        own = [(loop, None) for loop in reversed(where.statement_loops)]
        function = where.scope.function_scope
        if own or depth >= names.CALL_DEPTH or function.kind != "function":
            if own:
                yield own
            return
        for site in self.callers(function):
            # A comprehension that calls a step function per batch is a loop as well.
            around_site = [(loop, site) for loop in reversed(site.where.loops) if loop.kind == "comprehension"]
            outer = around_site + [(loop, via or site) for loop, via in self.enclosing_loops(site.where, depth + 1)]
            if outer:
                yield outer

    def loop_chain(self, where: Context, depth: int = 0) -> list[Loop]:
        """Every loop a node runs in, outermost first: those around its first looping in-file
        caller, then its own."""
        own = where.statement_loops
        function = where.scope.function_scope
        if depth >= 3 or function.kind != "function":
            return own
        for site in self.callers(function):
            outer = self.loop_chain(site.where, depth + 1)
            if outer:
                return outer + own
        return own


def is_per_step_function(scope: Scope) -> bool:
    return bool(_STEP_FUNCTION.search(scope.name.lower()))


# Methods that return the module they are called on, moved or switched: `nn.BCELoss().cuda()` and
# `Net().to(device).train()` are still what the constructor built.
_RETURNS_ITS_MODULE = frozenset({"to", "cuda", "cpu", "train", "eval", "half", "float", "bfloat16", "double", "requires_grad_"})


def _field_default(value: cst.BaseExpression) -> cst.BaseExpression:
    """A dataclass field's default as written: `X` of `field(default=X)` or of
    `field(default_factory=lambda: X)`; the value itself when it is no `field(...)`."""
    if isinstance(value, cst.Call) and (dotted_name(value.func) or "").split(".")[-1] == "field":
        default = argument(value, None, "default")
        if default is not None:
            return default
        factory = argument(value, None, "default_factory")
        if isinstance(factory, cst.Lambda):
            return factory.body
    return value


def constructor_of(value: cst.BaseExpression) -> cst.Call | None:
    """The constructor call a bound value comes from, past `.cuda()`, `.to(device)` and the like."""
    while isinstance(value, cst.Call):
        if isinstance(value.func, cst.Attribute) and value.func.attr.value in _RETURNS_ITS_MODULE:
            value = value.func.value
            continue
        return value
    return None


def _kind_of_constructor(qualified: str) -> str | None:
    last = qualified.rsplit(".", 1)[-1]
    if qualified.startswith(names.SCHEDULER_PREFIXES) or "get_" in last and "schedule" in last:
        return "scheduler"
    if qualified.startswith("torch.optim.swa_utils."):  # lives under torch.optim, optimizes nothing
        return {"AveragedModel": "model", "SWALR": "scheduler"}.get(last)
    if qualified.startswith(names.TORCH_OPTIMIZER_PREFIXES) and last[:1].isupper():
        return "optimizer"
    if qualified in names.THIRD_PARTY_OPTIMIZERS:
        return "optimizer"
    if qualified.startswith("torch.nn.") and last[:1].isupper() and last not in _NON_MODULE_NN:
        return "model"
    if qualified in names.MODEL_FACTORIES or qualified.startswith(names.MODEL_PREFIXES):
        return "model"
    return None


def _parametrized_only_false(function: cst.FunctionDef, name: str) -> bool:
    """Whether a `parametrize` decorator gives parameter `name` values, all of them a literal
    `False`: `@pytest.mark.parametrize("amp", [False])`, `("amp,dtype", [(False, torch.half)])`."""
    for decorator in function.decorators:
        call = decorator.decorator
        if not (isinstance(call, cst.Call) and (dotted_name(call.func) or "").endswith("parametrize") and len(call.args) >= 2):
            continue
        argnames = _parametrized_names(call.args[0].value)
        if name not in argnames:
            continue
        rows = call.args[1].value
        if not isinstance(rows, (cst.List, cst.Tuple)) or not rows.elements:
            return False
        index = argnames.index(name)
        for element in rows.elements:
            values = _parametrized_row(element.value, len(argnames))
            if values is None or not is_false(values[index]):
                return False
        return True
    return False


def _parametrized_row(row: cst.BaseExpression, width: int) -> list[cst.BaseExpression] | None:
    """The values one row of `parametrize` gives its `width` parameters, if written out:
    `False`, `(False, torch.half)`, `pytest.param(False, marks=...)`."""
    if isinstance(row, cst.Call) and (dotted_name(row.func) or "").endswith("param"):
        values = [a.value for a in row.args if a.keyword is None]
    elif width > 1 and isinstance(row, (cst.Tuple, cst.List)):
        values = [e.value for e in row.elements]
    else:
        values = [row]
    return values if len(values) == width else None


def _parametrized_names(value: cst.BaseExpression) -> list[str]:
    """The parameter names of `parametrize`'s first argument: `"a, b"` or `("a", "b")`."""
    if isinstance(value, cst.SimpleString):
        return [part.strip() for part in value.evaluated_value.split(",")] if isinstance(value.evaluated_value, str) else []
    if isinstance(value, (cst.List, cst.Tuple)):
        return [e.value.evaluated_value for e in value.elements if isinstance(e.value, cst.SimpleString) and isinstance(e.value.evaluated_value, str)]
    return []


def _autocast_from_call(call: cst.Call, qualified: str, scope: Scope) -> Autocast:
    deprecated = qualified in names.DEPRECATED_AMP
    if deprecated:
        device = names.DEPRECATED_AMP[qualified][0]
        positions = names.AUTOCAST_POSITIONAL["deprecated"]
    else:
        device = string_literal(argument(call, 0, "device_type"))
        positions = names.AUTOCAST_POSITIONAL["new"]
    enabled_expr = argument(call, positions.index("enabled"), "enabled")
    if enabled_expr is None:
        enabled = "maybe" if has_star_args(call) else "yes"
    elif isinstance(enabled_expr, cst.Name) and enabled_expr.value in ("True", "False"):
        enabled = "yes" if enabled_expr.value == "True" else "no"
    else:
        enabled = "maybe"
    dtype_expr = argument(call, positions.index("dtype"), "dtype")
    dtype = scope.resolve(dotted_name(dtype_expr))
    return Autocast(call, enabled, device, dtype, deprecated, enabled_expr if enabled == "maybe" else None)


_POSITIVE_COMPARISONS = {cst.IsNot: "is", cst.NotEqual: "==", cst.NotIn: "in"}


def _bare(expr: cst.BaseExpression) -> cst.BaseExpression:
    """The expression without its own parentheses: `(a)` and `a` are one condition, and so are
    `(last := (i + 1) % accum == 0)` and a later `last`."""
    if isinstance(expr, cst.NamedExpr):
        expr = expr.target
    return expr.with_changes(lpar=[], rpar=[]) if getattr(expr, "lpar", None) else expr


def and_operands(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """`a and (b and c)`: a, b and c, in their order; any other expression alone. The nodes as
    written, not copies (`condition` and `_bare` drop their parentheses), so that they can key
    the facts' caches (`conjuncts`) and be printed in place."""
    if isinstance(expr, cst.BooleanOperation) and isinstance(expr.operator, cst.And):
        return and_operands(expr.left) + and_operands(expr.right)
    return [expr]


def _with_expressions(item: cst.WithItem) -> tuple[cst.BaseExpression, ...]:
    """What a with-item may enter: `autocast(...)`, or either arm of `autocast(...) if amp else nullcontext()`."""
    if isinstance(item.item, cst.IfExp):
        return (item.item, item.item.body, item.item.orelse)
    return (item.item,)


def arms_of(value: cst.BaseExpression) -> Iterator[cst.BaseExpression]:
    """The values a conditional expression may take, through nested conditionals."""
    if isinstance(value, cst.IfExp):
        yield from arms_of(value.body)
        yield from arms_of(value.orelse)
    else:
        yield value


def all_of(tests: list[cst.BaseExpression | None]) -> cst.BaseExpression | None:
    """The tests given (None for none) joined by `and`, as a condition the facts can read."""
    present = [t for t in tests if t is not None]
    return functools.reduce(lambda a, b: cst.BooleanOperation(a, cst.And(), b), present) if present else None


def _is_a_placeholder(function: cst.CSTNode) -> bool:
    """A method whose body is only a docstring, `pass`, `...` or `raise NotImplementedError`:
    a hook its subclasses fill in."""
    if not isinstance(function, cst.FunctionDef):
        return False
    # `def step(self): pass` on one line is a suite of small statements, not a block of lines.
    body = function.body.body if isinstance(function.body, cst.IndentedBlock) else (function.body,)
    for statement in body:
        if not isinstance(statement, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            return False
        for small in statement.body:
            if isinstance(small, cst.Pass) or (isinstance(small, cst.Expr) and isinstance(small.value, (cst.Ellipsis, cst.SimpleString, cst.ConcatenatedString))):
                continue
            if isinstance(small, cst.Raise) and "NotImplementedError" in (dotted_name(small.exc.func if isinstance(small.exc, cst.Call) else small.exc) or ""):
                continue
            return False
    return bool(body)


def _a_parameter_in_reach(key: str, scope: Scope) -> bool:
    """Whether `key` is a parameter of the function `scope` is in or of one around it: the only
    names `bindings(..., through_parameters=True)` answers differently for."""
    current: Scope | None = scope.function_scope
    while current is not None:
        if key in current.params:
            return True
        current = current.parent
    return False


def _param_named(function: cst.CSTNode, name: str) -> cst.Param | None:
    if not isinstance(function, cst.FunctionDef):
        return None
    params = function.params
    return next((p for p in (*params.posonly_params, *params.params, *params.kwonly_params) if p.name.value == name), None)


def _is_static(function: Scope) -> bool:
    return any(dotted_name(d.decorator) == "staticmethod" for d in function.decorators)


def _on_one_path(region: Autocast) -> Autocast:
    """A region opened on one path of a choice only (the other a no-op context): maybe on,
    unless it is switched off anyway."""
    return replace(region, enabled="no" if region.enabled == "no" else "maybe")


def _a_module_base(base: str, qualified: str | None) -> bool:
    """torch.nn's, transformers' or Lightning's modules, or a base named like one of them."""
    return bool(qualified and qualified.startswith(("torch.nn.", "transformers.", "lightning", "pytorch_lightning"))) or (
        base.split(".")[-1] in ("Module", "LightningModule", "PreTrainedModel")
    )


def is_none(expr: cst.BaseExpression | None) -> bool:
    """The literal `None`."""
    return isinstance(expr, cst.Name) and expr.value == "None"


def built_disabled(construction: cst.Call | None) -> bool:
    """A construction passing a literal `enabled=False` (a GradScaler that scales nothing)."""
    return construction is not None and is_false(argument(construction, None, "enabled"))


def is_false(expr: cst.BaseExpression | None) -> bool:
    """The literal `False`."""
    return isinstance(expr, cst.Name) and expr.value == "False"


def is_true(expr: cst.BaseExpression | None) -> bool:
    """The literal `True`."""
    return isinstance(expr, cst.Name) and expr.value == "True"


def string_literal(expr: cst.BaseExpression | None) -> str | None:
    """The text of a plain string literal (not a bytes or f-string one)."""
    if isinstance(expr, cst.SimpleString):
        return expr.evaluated_value if isinstance(expr.evaluated_value, str) else None
    return None
