"""Screens: the module-wide conditions rules start from, decided on CPython's tree of the whole
file before libcst is asked for anything.

Most rules begin by asking the facts a question about the whole module and stop when the answer
rules them out: AMP003 and AMP014-AMP017 need an autocast region (`facts.has_autocast`), AMP004,
AMP010 and AMP012 a GradScaler construction (`facts.has_scaler`), AMP009 a backward call in a
module that mentions no scaler at all, AMP014 a region switched off by a literal `False`, AMP001
a name of the deprecated API used in code. On a
large tree most files that pass the byte gates fail these questions (a dispatch table that lists
`torch.autocast` opens no region), and libcst's parse and facts pass cost ~20x CPython's parse.
Each screen over-approximates the facts' answer where the rule needs it true and
under-approximates it where the rule needs it false, so a rule is set aside only when its
analysis of the whole file could not report anything. Tests check, on every fixture and rule
example, that screened analysis equals the full analysis; bench/check_stages.py does it on a tree.

Names are followed the way the facts follow them, but without scopes: a name may denote
`autocast` if its last part is `autocast`, or if anything in the file binds it (an import alias,
an assignment, a `functools.partial` of it) to something that may.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property

from amplint.static import names
from amplint.static.source import python_tree


def _last_parts(qualified: set[str]) -> frozenset[str]:
    return frozenset(name.rsplit(".", 1)[-1] for name in qualified)


_AUTOCAST = _last_parts(names.AUTOCAST)
_GRAD_SCALER = _last_parts(names.GRAD_SCALER)
_ACCELERATOR = _last_parts(names.ACCELERATORS)
_AUTOCAST_STATE_GETTERS = _last_parts(names.AUTOCAST_STATE_GETTERS)
_AUTOGRAD_FUNCTION = frozenset({"Function"})
_BACKWARD = _last_parts(names.AUTOGRAD_BACKWARD)
_COMPILE = frozenset({"compile", "optimize"})  # torch.compile, model.compile(), torch._dynamo.optimize


def _used_words(qualified: Iterable[str]) -> re.Pattern[bytes]:
    """The last parts of these names, used in code rather than defined: every import or
    attribute chain that reaches one spells it out. Each word's boundary is checked after its
    literal, not before it, so that `re` skips ahead at C speed."""
    words = sorted({re.escape(name.rsplit(".", 1)[-1]).encode() for name in qualified})
    return re.compile(b"|".join(rb"%s(?<!\w%s)(?<!def %s)(?<!class %s)\b" % (w, w, w, w) for w in words))


_DEPRECATED_STATE = _used_words(names.DEPRECATED_AUTOCAST_STATE)
_DEVICE_AMP_NAMES = _used_words(names.DEPRECATED_AMP)
# A way to reach `torch.cuda.amp` / `torch.cpu.amp`: an `amp` attribute of anything but `torch`
# itself (`torch.cuda.amp`, `tc.amp`; `torch.amp` is the replacement), an import from
# `torch.cuda` / `torch.cpu` (`from torch.cuda import amp`, or `*`), or `torch` rebound.
_DEVICE_AMP_PATH = re.compile(rb"(?<!\btorch)\.\s*amp\b|\bfrom\s+torch\s*\.\s*(?:cuda|cpu)\s+import\b|\bas\s+torch\b|\btorch\s*=[^=]")
_SCALER_CALL = re.compile(r"(?i:scaler)[^.]*\.(?:step|update|scale)$")  # the receiver's last part names a scaler


def dotted(node: ast.expr | None) -> str | None:
    """`a.b.c` for a chain of names, as the facts' `dotted_name` spells it."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


# Fields that only ever hold operator and load/store singletons: a quarter of a tree's nodes.
_SKIPPED_FIELDS = frozenset({"ctx", "op", "ops"})
_FIELDS: dict[type, tuple[str, ...]] = {}


def nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node under `tree` but operators and contexts, in no particular order: ast.walk's
    work at a third of its cost."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        kind = node.__class__
        fields = _FIELDS.get(kind)
        if fields is None:
            fields = _FIELDS[kind] = tuple(f for f in kind._fields if f not in _SKIPPED_FIELDS)
        for name in fields:
            value = getattr(node, name, None)
            if value.__class__ is list:
                stack.extend(item for item in value if isinstance(item, ast.AST))
            elif isinstance(value, ast.AST):
                stack.append(value)


@dataclass
class _Walk:
    """What one walk of CPython's tree says about a module: who is called, what is bound to what."""

    callees: set[str] = field(default_factory=set)  # dotted names called
    methods: set[str] = field(default_factory=set)  # attributes called, whatever their receiver
    decorators: set[str] = field(default_factory=set)  # dotted names used as decorators, uncalled
    returned: set[str] = field(default_factory=set)  # dotted names a `return` may give (`return torch.autocast`)
    assigned: set[str] = field(default_factory=set)  # dotted names assigned to
    bindings: list[tuple[str, str]] = field(default_factory=list)  # (bound name, dotted value)
    bases: set[str] = field(default_factory=set)  # dotted class bases
    imported_names: list[str] = field(default_factory=list)  # `accelerate.Accelerator`, `deepspeed`
    params: set[str] = field(default_factory=set)
    calls: list[ast.Call] = field(default_factory=list, repr=False)
    call_targets: dict[int, str] = field(default_factory=dict, repr=False)  # id(call) -> name it is assigned to
    decorator_calls: list[ast.Call] = field(default_factory=list, repr=False)  # `@torch.compile(...)` on a def

    # What the slicer reads from the same walk: large displays (tables) and every function.
    tables: list[ast.expr] = field(default_factory=list, repr=False)
    functions: list[ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=list, repr=False)
    # The most operators chained in one expression (`x1 + x2 + ...`, `a or b or ...`): libcst
    # nests one node per operator, and its parse grows with the cube of the chain.
    longest_chain: int = 0
    _chained: set[int] = field(default_factory=set, repr=False)  # inner links already counted

    @classmethod
    def of(cls, tree: ast.Module) -> _Walk:
        walk = cls()
        handlers = _HANDLERS
        for node in nodes(tree):
            handler = handlers.get(node.__class__)
            if handler is not None:
                handler(walk, node)
        return walk

    def _call(self, node: ast.Call) -> None:
        self.calls.append(node)
        callee = dotted(node.func)
        if callee is not None:
            self.callees.add(callee)
        if type(node.func) is ast.Attribute:  # `scaler.scale(loss).backward()` has no dotted name
            self.methods.add(node.func.attr)

    def _assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._bind(target, node.value)
        self._name_call(node.targets[0], node.value)

    def _annotated_or_named(self, node: ast.AnnAssign | ast.NamedExpr) -> None:
        if node.value is not None:
            self._bind(node.target, node.value)
            self._name_call(node.target, node.value)  # `net: nn.Module = torch.compile(m)`, `(net := torch.compile(m))`

    def _name_call(self, target: ast.expr, value: ast.expr) -> None:
        name = dotted(target)
        if type(value) is ast.Call and name is not None:
            self.call_targets[id(value)] = name

    def _return(self, node: ast.Return) -> None:
        if node.value is not None:
            self.returned.update(_named_by(node.value))

    def _class(self, node: ast.ClassDef) -> None:
        self.bases.update(filter(None, map(dotted, node.bases)))
        self.decorators.update(filter(None, map(dotted, node.decorator_list)))

    def _display(self, node: ast.Dict | ast.List | ast.Set | ast.Tuple) -> None:
        if len(node.values if type(node) is ast.Dict else node.elts) >= TABLE_ENTRIES:
            self.tables.append(node)

    def _bind(self, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)):
            for inner_target, inner_value in zip(target.elts, value.elts):
                self._bind(inner_target, inner_value)
            return
        key = dotted(target)
        if key is None:
            return
        # `ac = torch.autocast`, `ac = functools.partial(torch.autocast, "cuda")`, and
        # `ac = torch.cuda.amp.autocast if amp else suppress`.
        self.bindings.extend((key, bound) for bound in _named_by(value))
        self.assigned.add(key)

    def _definition(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.functions.append(node)
        self.decorators.update(filter(None, map(dotted, node.decorator_list)))
        self.decorator_calls.extend(d for d in node.decorator_list if type(d) is ast.Call)
        arguments = node.args
        self.params.update(a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs))

    def _binary(self, node: ast.BinOp) -> None:
        if id(node) in self._chained:
            return  # counted from the chain's outermost operator, which the walk meets first
        length, left = 1, node.left
        while type(left) is ast.BinOp:
            self._chained.add(id(left))
            length, left = length + 1, left.left
        self.longest_chain = max(self.longest_chain, length)

    def _boolean(self, node: ast.BoolOp) -> None:
        self.longest_chain = max(self.longest_chain, len(node.values) - 1)

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.ImportFrom):
            if node.level or node.module is None or node.names[0].name == "*":
                return  # the facts record neither relative nor star imports
            for alias in node.names:
                self.imported_names.append(f"{node.module}.{alias.name}")
                if alias.asname is not None:
                    self.bindings.append((alias.asname, f"{node.module}.{alias.name}"))
            return
        for alias in node.names:
            self.imported_names.append(alias.name)
            if alias.asname is not None:
                self.bindings.append((alias.asname, alias.name))


def _named_by(value: ast.expr) -> Iterator[str]:
    """The dotted names a value may stand for: `torch.autocast`, `functools.partial(torch.autocast,
    "cuda")` (its first argument), `torch.cuda.amp.autocast if amp else suppress` (both arms)."""
    for source in [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]:
        source = source.args[0] if isinstance(source, ast.Call) and source.args else source
        bound = dotted(source)
        if bound is not None:
            yield bound


# A display this long is a table (torch's lists of overridable functions run to thousands of
# entries): the slicer looks at its entries one by one.
TABLE_ENTRIES = 16
_HANDLERS = {
    ast.Call: _Walk._call,
    ast.Assign: _Walk._assign,
    ast.AnnAssign: _Walk._annotated_or_named,
    ast.NamedExpr: _Walk._annotated_or_named,
    ast.FunctionDef: _Walk._definition,
    ast.AsyncFunctionDef: _Walk._definition,
    ast.ClassDef: _Walk._class,
    ast.Return: _Walk._return,
    ast.Import: _Walk._import,
    ast.ImportFrom: _Walk._import,
    ast.Dict: _Walk._display,
    ast.List: _Walk._display,
    ast.Set: _Walk._display,
    ast.Tuple: _Walk._display,
    ast.BinOp: _Walk._binary,
    ast.BoolOp: _Walk._boolean,
}


class Screen:
    """A module's answers to the rules' first questions. CPython parses the text only when a
    question needs more than the code's words, and the tree is walked once."""

    def __init__(self, text: str, code: bytes) -> None:
        self.text = text
        self.code = code  # the code view: comments and plain strings blanked
        self._aliases: dict[frozenset[str], set[str]] = {}

    @cached_property
    def tree(self) -> ast.Module:
        """CPython's tree; raises SyntaxError (and ValueError, RecursionError) as ast.parse does."""
        return python_tree(self.text)

    @cached_property
    def walk(self) -> _Walk:
        return _Walk.of(self.tree)

    def names_for(self, last_parts: frozenset[str]) -> set[str]:
        """Dotted names that may denote an object whose own name is one of `last_parts`."""
        if last_parts not in self._aliases:
            found: set[str] = set()
            changed = True
            while changed:
                changed = False
                for key, value in self._bindings:
                    if key not in found and (value.rsplit(".", 1)[-1] in last_parts or value in found):
                        found.add(key)
                        changed = True
            self._aliases[last_parts] = found
        return self._aliases[last_parts]

    @cached_property
    def _bindings(self) -> list[tuple[str, str]]:
        """The walk's bindings, and each parameter of a function this file defines bound to its
        default and to what the file's calls of that name pass for it (the facts follow
        `train(..., amp_autocast=amp_autocast)` into `train`). By name only: a positional
        argument binds the parameter at its place and the one after it (a method's `self`)."""
        bindings = list(self.walk.bindings)
        params_of: dict[str, list[ast.arguments]] = {}
        for function in self.walk.functions:
            params_of.setdefault(function.name, []).append(function.args)
            arguments = function.args
            positional = [*arguments.posonlyargs, *arguments.args]
            declared = [*zip(positional[len(positional) - len(arguments.defaults):], arguments.defaults), *zip(arguments.kwonlyargs, arguments.kw_defaults)]
            bindings.extend((param.arg, bound) for param, default in declared if default is not None for bound in _named_by(default))
        for call in self.walk.calls:
            func = call.func
            called = func.id if type(func) is ast.Name else func.attr if type(func) is ast.Attribute else None
            for arguments in params_of.get(called, ()):
                positional = [a.arg for a in (*arguments.posonlyargs, *arguments.args)]
                for index, passed in enumerate(call.args):
                    if type(passed) is ast.Starred:
                        break
                    bindings.extend((param, bound) for param in positional[index : index + 2] for bound in _named_by(passed))
                bindings.extend((keyword.arg, bound) for keyword in call.keywords if keyword.arg for bound in _named_by(keyword.value))
        return bindings

    def _may_name(self, candidates: set[str], last_parts: frozenset[str]) -> bool:
        aliases = self.names_for(last_parts)
        return any(name.rsplit(".", 1)[-1] in last_parts or name in aliases for name in candidates)

    def possible(self, codes: frozenset[str]) -> frozenset[str]:
        """The rules in `codes` whose module-wide precondition the file may meet."""
        return frozenset(c for c in codes if c not in PRECONDITIONS or PRECONDITIONS[c](self))

    def may_be_function(self, base: str) -> bool:
        """Whether a class base may be autograd.Function (AMP013's subject)."""
        return self._may_name({base}, _AUTOGRAD_FUNCTION)

    @cached_property
    def uses_deprecated_names(self) -> bool:
        """Necessary for AMP001: a deprecated state function used, or a name of the device `amp`
        modules used where a way to reach them is spelt out (not `from torch import amp`)."""
        if _DEPRECATED_STATE.search(self.code):
            return True
        return _DEVICE_AMP_NAMES.search(self.code) is not None and _DEVICE_AMP_PATH.search(self.code) is not None

    @cached_property
    def opens_autocast(self) -> bool:
        """Necessary for `facts.has_autocast`: autocast (or a name for it) is called or decorates,
        or a factory returns it for its caller to call (open_clip's `get_autocast`)."""
        return self._may_name(self.walk.callees | self.walk.decorators | self.walk.returned, _AUTOCAST)

    @property
    def autocast_names(self) -> set[str]:
        """Names bound to autocast itself (`ac = torch.autocast`), which may open regions unnamed."""
        return self.names_for(_AUTOCAST)

    @cached_property
    def disables_autocast(self) -> bool:
        """Necessary for a region switched off (AMP014): autocast, or a `partial` of it, called
        with a literal `False`."""
        def is_autocast(node: ast.expr | None) -> bool:
            name = dotted(node)
            return name is not None and self._may_name({name}, _AUTOCAST)

        for call in self.walk.calls:
            if is_autocast(call.func) or (call.args and is_autocast(call.args[0])):
                values = [*call.args, *(keyword.value for keyword in call.keywords)]
                if any(type(v) is ast.Constant and v.value is False for v in values):
                    return True
        return False

    @cached_property
    def calls_backward(self) -> bool:
        """Necessary for `has_backward` (AMP009) and for backward calls (AMP003, AMP017)."""
        return "backward" in self.walk.methods or self._may_name(self.walk.callees, _BACKWARD)

    @cached_property
    def calls_step(self) -> bool:
        """Necessary for an optimizer or scaler step (AMP003)."""
        return "step" in self.walk.methods

    @cached_property
    def uses_a_scaler(self) -> bool:
        """Necessary for any scaler event (`facts.is_scaler`): a GradScaler built, `unscale_` or
        `get_scale` called, a scaled loss back-propagated, or a `*scaler*.step/update/scale()`."""
        methods = self.walk.methods
        return (
            self.constructs_scaler
            or not methods.isdisjoint({"unscale_", "get_scale"})
            or ("scale" in methods and self.calls_backward)
            or any(_SCALER_CALL.search(callee) for callee in self.walk.callees)
        )

    @cached_property
    def constructs_scaler(self) -> bool:
        """Necessary for `facts.has_scaler`: a GradScaler (or a name for it) is called."""
        return self._may_name(self.walk.callees, _GRAD_SCALER)

    @cached_property
    def constructs_accelerator(self) -> bool:
        """Necessary for accelerate's own GradScaler (AMP012): an Accelerator (or a name for it) is called."""
        return self._may_name(self.walk.callees, _ACCELERATOR)

    @cached_property
    def reads_autocast_state(self) -> bool:
        """Necessary for a call of `torch.is_autocast_enabled()` and the other state getters (AMP013)."""
        return self._may_name(self.walk.callees, _AUTOCAST_STATE_GETTERS)

    @cached_property
    def casts_for_autocast(self) -> bool:
        """Sufficient for a call of autocast's own `_cast` (AMP013 then reads no state reader as
        proof): the module imports it and calls it by that name."""
        cast = names.AUTOCAST_CAST
        names_for_cast = {cast} | {key for key, value in self.walk.bindings if value == cast}
        if cast in self.walk.imported_names:
            names_for_cast.add(cast.rsplit(".", 1)[-1])
        return not names_for_cast.isdisjoint(self.walk.callees)

    @cached_property
    def subclasses_function(self) -> bool:
        """Necessary for a custom autograd.Function class (AMP013)."""
        return self._may_name(self.walk.bases, _AUTOGRAD_FUNCTION)

    @cached_property
    def compiled_names(self) -> set[str] | None:
        """Last parts of the names compiled objects are called by (AMP017's subjects): the name a
        `torch.compile(...)` result is assigned to, the model it compiles, the receiver of
        `.compile()`. None when a compiled function is decorated: any name may then be one."""
        compiles = self.names_for(_COMPILE)
        if any(d.rsplit(".", 1)[-1] in _COMPILE or d in compiles for d in self.walk.decorators):
            return None
        if any(self._compiles(call, compiles) for call in self.walk.decorator_calls):
            return None
        found: set[str] = set()
        for call in self.walk.calls:
            if not self._compiles(call, compiles):
                continue
            if isinstance(call.func, ast.Attribute):  # `model.compile()`
                found.add((dotted(call.func.value) or "").rsplit(".", 1)[-1])
            if id(call) in self.walk.call_targets:  # `fast = torch.compile(model)` is called as `fast`
                found.add(self.walk.call_targets[id(call)].rsplit(".", 1)[-1])
                continue
            model = [a.value for a in call.keywords if a.arg == "model"]
            for argument in [*call.args[:1], *model]:
                found.add((dotted(argument) or "").rsplit(".", 1)[-1])
        found.discard("")
        return found

    @staticmethod
    def _compiles(call: ast.Call, compiles: set[str]) -> bool:
        callee = dotted(call.func)
        return callee is not None and (callee.rsplit(".", 1)[-1] in _COMPILE or callee in compiles)

    @cached_property
    def surely_mentions_scaler(self) -> bool:
        """Sufficient for `mentions_a_scaler`: a called name or a parameter names a scaler. Not a
        receiver or an assigned name: `scaler = StandardScaler()` then `scaler.fit(x)` is
        scikit-learn's feature scaling, which the facts tell apart."""
        return any(names.SCALER_WORD.search(name.rpartition(".")[2]) for name in self.walk.callees) or any(
            names.SCALER_WORD.search(name) for name in self.walk.params
        )

    @cached_property
    def may_disable_every_scaler(self) -> bool:
        """Necessary for AMP009's scalers that are all built with a literal `enabled=False`."""
        return _ENABLED_FALSE.search(self.code) is not None

    @cached_property
    def surely_framework_owned(self) -> bool:
        """Sufficient for `framework_owned`: a training framework is imported."""
        return any(names.imports_a_framework(name) for name in self.walk.imported_names)

    @cached_property
    def names_custom_fwd(self) -> bool:
        return b"custom_fwd" in self.code or b"custom_bwd" in self.code


_ENABLED_FALSE = re.compile(rb"enabled\s*=\s*False")


def _autocast(screen: Screen) -> bool:
    return screen.opens_autocast


def _scaler(screen: Screen) -> bool:
    return screen.constructs_scaler


# Each rule's own first question, as its check module asks it of the facts.
PRECONDITIONS: dict[str, Callable[[Screen], bool]] = {
    "AMP001": lambda s: s.uses_deprecated_names,
    "AMP002": lambda s: s.opens_autocast or s.constructs_scaler,
    "AMP003": lambda s: s.opens_autocast and (s.calls_backward or s.calls_step),
    "AMP004": _scaler,
    # The training-step rules need scaler events: a scaled backward, an unscale, a scaler step.
    "AMP006": lambda s: s.uses_a_scaler and "scale" in s.walk.methods and s.calls_step,
    "AMP007": lambda s: s.uses_a_scaler and s.calls_step,
    "AMP008": lambda s: s.uses_a_scaler and "unscale_" in s.walk.methods,
    "AMP009": lambda s: s.opens_autocast and s.calls_backward
    and not (s.surely_framework_owned or (s.surely_mentions_scaler and not s.may_disable_every_scaler)),
    "AMP010": _scaler,
    "AMP011": lambda s: s.uses_a_scaler and s.calls_step,
    "AMP012": lambda s: s.constructs_scaler or s.constructs_accelerator,
    "AMP013": lambda s: s.subclasses_function
    and (s.opens_autocast or s.constructs_scaler or s.names_custom_fwd or (s.reads_autocast_state and not s.casts_for_autocast)),
    "AMP014": lambda s: s.opens_autocast and s.disables_autocast,
    "AMP015": _autocast,
    "AMP016": _autocast,
    "AMP017": lambda s: s.opens_autocast and s.calls_backward,
}


