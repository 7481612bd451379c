"""Preparation before libcst: gates on code only, screens, and relevance slicing of large files.

libcst costs ~0.4 s per 100 KB to parse and walk; a 400 KB test module that mentions
`autocast` in two methods would otherwise cost seconds. The slicer uses CPython's parser (a C
pass, ~13x cheaper than libcst) to find statement ranges, keeps

- every statement that is not a function definition (imports, assignments, module-level loops,
  class attributes) and every class header, so names, aliases and classes resolve as before;
- for each rule, every function or method whose text holds one of its trigger words, then, as
  many levels as the rules follow calls: functions called from kept ones, functions that call
  kept ones, and functions that mention a name bound to an AMP object in kept code
  (`self.amp_ctx`, `scaler`); the slice is the union over the rules;
- what the facts read across functions: the functions that assign the `self` attributes kept
  code uses, those that build optimizers and schedulers, and for AMP012 `torch.load` and the
  helpers a saved checkpoint is built by; for AMP002, what its exemptions read outside a cast's
  function: the helpers on the way to a wrapper, to AMP code or (from a test) to training, the
  functions that use the cast's function (called, named, or held in a module-level table) and
  theirs, and the callers of a function whose autocast is switched by a parameter;

and blanks every other line. Line numbers and columns are unchanged, so findings on the slice
are findings on the file. Before slicing, rules that report a call inside an autocast region
(AMP003, AMP015, AMP017) are set aside when what autocast reaches makes no such call, and
AMP002 and AMP009 keep a single backward call as their witness rather than every function that has one.
A slice that does not parse falls back to the whole file, and so does a rule without triggers
here. Tests check slice == whole file on every fixture; bench/check_stages.py on a tree.
"""

from __future__ import annotations

import ast
import re
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property

from amplint.static import names
from amplint.static.gate import possible_rules
from amplint.static.screen import Screen, dotted, nodes
from amplint.static.source import (
    TOO_DEEP_FOR_PYTHON,
    SourceError,
    lines_with_endings,
    nesting_error,
    physical_lines,
)

_SCALER = r"\.scale\s*\(|unscale_|get_scale|GradScaler|caler|CALER"  # `scaler` as names.SCALER_WORD finds it
# Where optimizers and schedulers are built (the constructors semantics._kind_of_constructor
# knows, and the module-level names bound to them). The facts know a receiver is one from any
# assignment in the module (`solver = torch.optim.SGD(...)` in a setup function, `self.decay =
# StepLR(...)` in `__init__`): the rules that tell an optimizer's step from a scheduler's keep
# those functions, without following their calls. Not `optimizer`: that word is in every
# function that steps one.
_BUILDS_OPTIMIZERS = r"optim(?<!\woptim)(?:izers)?\b|AdamW|Adafactor|get_\w*schedule"
_OPTIMIZER_RULES = frozenset({"AMP003", "AMP006", "AMP007", "AMP008", "AMP011", "AMP012"})
_SAVES = r"save(?<!\wsave)\s*\(|Checkpoint\s*\("
# AMP012's save helpers named for writing what a checkpoint holds (`write_checkpoint`, `dump_state`,
# `ckpt_model`), in either order of their words.
_VERBS = "|".join(sorted(names.CHECKPOINT_WRITE_VERBS))
_CONTENTS = "|".join(sorted(names.CHECKPOINT_CONTENTS))
_CHECKPOINT_WRITER = rf"(?i:checkpoint|ckpt|(?:{_VERBS})\w*(?:{_CONTENTS})|(?:{_CONTENTS})\w*(?:{_VERBS}))"
# AMP002's casts, and the AMP code a function holding one may reach through its helpers. A cast
# to a dtype held by a name (`.to(dtype=target_dtype)`, `.to(self.weight_dtype)`) is judged by
# what the name is bound to elsewhere (a caller's argument, an attribute's assignments).
_AMP002_CASTS = r"\.(?:half|bfloat16)\(|float16|half(?<!\whalf)\b|HalfTensor|torch_dtype|\.(?:to|type)\((?:[^()]|\([^()]*\))*?dtype"
_AMP002_AMP = r"autocast|training_step|" + _SCALER  # a scaler used by name counts (semantics.is_scaler)
# The calls AMP002 judges (low_precision_target): a unit holding none has no cast to exempt.
_AMP002_CAST_CALL = re.compile(r"\.\s*(?:half|bfloat16|to|type|from_pretrained)\s*\(")
# What AMP002 follows a model into (_wraps): torch's wrappers, a framework's `prepare` / `setup`.
_AMP002_WRAPPERS = "|".join(
    sorted({wrapper.rsplit(".", 1)[-1] for wrapper in names.MODULE_WRAPPERS} | names.FRAMEWORK_WRAPPING_METHODS)
)
# What a test must reach to train (_training_anchors): a backward, a GradScaler, an optimizer step.
_AMP002_TRAINS = r"backward|GradScaler|\.\s*step\s*\("
_DEFINED = re.compile(r"def(?<!\wdef)\s+(\w+)")  # the functions a unit defines: itself and those nested in it
# Words whose presence makes a function relevant to a rule. Rules not listed disable slicing.
# Each alternative starts with its literal, and a whole word is checked after it (`amp(?<!\wamp)`
# rather than `\bamp`): a leading `\b` or class makes `re` try every position, 5-10x slower.
TRIGGERS: dict[str, str] = {
    "AMP001": r"amp(?<!\wamp)(?<!torch\.amp)\b|_autocast_|is_autocast_",
    # A backward anywhere (_backward_witness) or a `training_step` says the module trains.
    "AMP002": _AMP002_CASTS + "|" + _AMP002_AMP,
    "AMP003": r"autocast",
    "AMP004": r"GradScaler",
    # `.grad` reads are reached through the helpers a kept function calls.
    "AMP005": r"\.scale\(|unscale_|clip_grad|GradScaler|accelerator\s*\.\s*(?:backward|unscale_gradients)\b"
    r"|fabric\s*\.\s*(?:backward|clip_gradients)\b|manual_backward|clip_gradients|Trainer",
    # The training-step rules: scaler events, followed through in-file calls like AMP005's.
    "AMP006": _SCALER,
    "AMP007": _SCALER,
    "AMP008": _SCALER,
    "AMP011": _SCALER,
    # Module-wide facts: a scaler anywhere, a framework's backward (the screen sets AMP009 aside
    # where a framework is imported), a wrapper's `optimizer.backward(loss)`. A backward anywhere
    # needs one witness (_backward_witness).
    "AMP009": r"autocast|" + _SCALER + r"|manual_backward|backward_step|backward\((?!\s*\))|"
    + "|".join(rf"{owner}\s*\.\s*backward\b" for owner in names.FRAMEWORK_OWNERS),
    "AMP010": r"autocast|bfloat16|" + _SCALER,
    # A checkpoint saved or restored, and anywhere `torch.load` is called (the module-wide
    # question its restore check starts from); the regions, whose dtype its message reads.
    "AMP012": r"save|state_dict|load(?<!\wload)\b|Checkpoint|Accelerator|autocast|" + _CHECKPOINT_WRITER + "|" + _SCALER,
    # What makes the module AMP-aware; a Function's own methods are kept by _FUNCTION_CLASS_RULES.
    # Every `.apply` of a Function: its exemption needs all of them in autocast-disabled regions.
    # A Triton kernel that converts its loads, which a forward may launch (_launches_a_converting_kernel).
    "AMP013": r"custom_fwd|custom_bwd|autocast|\.apply(?!\w)|" + names.CONVERTING_KERNEL + "|" + _SCALER,
    "AMP014": r"autocast",
    "AMP015": r"autocast|Thread|submit|Executor|Pool|\.map\(|apply_async|imap|starmap",
    # What says the module trains (its bfloat16 hint then mentions a GradScaler), as AMP002's,
    # and what says the GPU has bfloat16 wherever a function holds it: an FP8 library imported
    # (`torchao.float8` through `float\d+`), FlashAttention asked for (by a keyword: the slicer
    # reads code with its strings blanked; `flash_attention=True`).
    "AMP016": r"autocast|bf16_supported|capability|get_device_properties|is_ampere|sm_?8\d|binary_cross_entropy|BCELoss|float\d+|half|GradScaler|training_step|transformer_engine|msamp|attn_implementation|flash_att",
    "AMP017": r"autocast|compile|backward",
}

# A FlashAttention switch AMP016 reads (its _FLASH_ATTENTION_SWITCHES), set in a helper from a parameter.
_FLASH_SWITCH = r"flash_att"

# Rules whose gate reads string contents (a device literal such as "cpu"): re-gated on code only
# for the word their subject must be named by.
STRING_SENSITIVE = {"AMP010": b"GradScaler"}
# Files smaller than this are analysed whole: slicing would save less than it costs.
SLICE_MIN_CHARS = 40_000
# libcst's parse of `x1 + x2 + ...` takes 0.1 s at 1,000 operators, 0.7 s at 2,000, 4.7 s at
# 4,000, and overflows the C stack (a crash) at 8,000: longer chains are reported, not parsed.
LONGEST_CHAIN = 2_000
# Rules whose facts cross function boundaries: through calls, or through names bound elsewhere.
_FOLLOW_CALLS = frozenset({"AMP003", "AMP004", "AMP005", "AMP006", "AMP007", "AMP008", "AMP009", "AMP011", "AMP015", "AMP017"})
# Rules that report a call made inside an autocast region, and the names of what they report;
# AMP017 reports calls of the compiled models the screen finds.
_CALLED_IN_REGIONS: dict[str, frozenset[str]] = {
    "AMP003": frozenset({"backward", "step"}),
    "AMP015": frozenset({"Thread", "Timer", "submit", "map", "apply_async", "map_async", "imap", "starmap"}),
}
_REGION_RULES = frozenset({*_CALLED_IN_REGIONS, "AMP017"})
# Rules that ask whether the module calls backward anywhere (AMP002, AMP016: does it train at all).
_ASK_FOR_A_BACKWARD = frozenset({"AMP002", "AMP009", "AMP016"})
# A unit that calls backward and multiplies (`(loss * scale).backward()`, `scaled = loss.mul(s)`):
# where AMP009 reads a loss scaled by hand. Both lookaheads run once, from the unit's start.
_BACKWARD_OF_A_PRODUCT = r"\A(?=[\s\S]*backward)(?=[\s\S]*(?:(?<!\*)\*(?![*=])|\.mul_?\())"
# Rules that read every method of a class that may subclass autograd.Function.
_FUNCTION_CLASS_RULES = frozenset({"AMP013"})
# A class statement nested in a function, and its bases.
_CLASS_HEADER = re.compile(r"^[ \t]*class\s+\w+\s*\(([^)]*)\)", re.MULTILINE)
# Functions and methods a unit uses: called, or passed on (`Thread(target=worker)`). A name, or
# an attribute with its dot (`.name`), which _plain_names() drops: a lookbehind for the dot
# instead would make `re` try every position. Whole words are checked after the literal (`self`
# then `(?<!\wself)`) for the same reason.
_NAME_OR_ATTRIBUTE = re.compile(r"\.?[A-Za-z_]\w*")
_SELF_ATTRIBUTE = re.compile(r"(?:self(?<!\wself)|cls(?<!\wcls))\.([A-Za-z_]\w*)")
_WORD = re.compile(r"[A-Za-z_]\w*")
# Calls a unit makes, for calls_method_of: `name(`, `receiver.name(`, `variable = callee(`.
_CALLED_NAME = re.compile(r"\b(\w+)\s*\(")
_ATTRIBUTE_CALL = re.compile(r"\b(\w+)\s*\.\s*(\w+)\s*\(")
_BINDS_A_CALL = re.compile(r"\b(\w+)\s*=\s*(\w+)\s*\(")


@dataclass(eq=False)
class _Unit:
    """A function or method: its lines and text, and the class it belongs to (None at module level)."""

    name: str
    owner: str | None
    first: int  # 1-based, decorators included
    last: int
    text: str
    node: ast.AST
    in_function_class: bool = False  # a method of a class that may subclass autograd.Function

    @cached_property
    def plain_calls(self) -> set[str]:
        """Plain names it uses (`f(...)`, `target=f`), as the rules' call graph follows them."""
        return _plain_names(self.text)

    @cached_property
    def method_calls(self) -> set[str]:
        """`self.m` / `cls.m` it uses."""
        return set(_SELF_ATTRIBUTE.findall(self.text))

    @cached_property
    def words(self) -> set[str]:
        return set(_WORD.findall(self.text))

    @cached_property
    def _calls(self) -> tuple[set[str], set[tuple[str, str]], dict[str, set[str]]]:
        """The names it calls (`f(`), the attribute calls (`receiver.m(`), and the local names
        bound to a call of each callee (`stepper = Owner(` binds `stepper` under `Owner`)."""
        bound: dict[str, set[str]] = {}
        for variable, callee in _BINDS_A_CALL.findall(self.text):
            bound.setdefault(callee, set()).add(variable)
        return set(_CALLED_NAME.findall(self.text)), set(_ATTRIBUTE_CALL.findall(self.text)), bound

    def calls_method_of(self, owner: str, name: str) -> bool:
        """Whether it may call method `name` of class `owner` as semantics' `called_function`
        resolves it: `Owner.name(...)`, or on a local instance (`stepper = Owner(...)`, then
        `stepper.name(...)`, or `stepper(...)` for `__call__` and an nn.Module's `forward`)."""
        if owner not in self.plain_calls:
            return False
        called_names, attribute_calls, bound = self._calls
        instances = bound.get(owner, set())
        if any((receiver, name) in attribute_calls for receiver in (owner, *instances)):
            return True
        return name in ("__call__", "forward") and not instances.isdisjoint(called_names)

    @cached_property
    def _self_scopes(self) -> tuple[dict[int, str | None], set[tuple[str | None, str]]]:
        """The class each nested line's `self` belongs to, as the facts say (semantics'
        `Scope.class_name`: a nested class's in that class's methods, none in a nested
        function), and the `self.x` / `cls.x` it assigns (`self.x.y = v` assigns under `x`)
        with that class. Only statements are walked."""
        owner_of_line: dict[int, str | None] = {}
        assigns: set[tuple[str | None, str]] = set()

        def visit(statements: list[ast.stmt], owner: str | None, in_class_body: bool) -> None:
            for node in statements:
                if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    inner = node.name if isinstance(node, ast.ClassDef) else owner if in_class_body else None
                    owner_of_line.update(dict.fromkeys(range(node.lineno, (node.end_lineno or node.lineno) + 1), inner))
                    visit(node.body, inner, isinstance(node, ast.ClassDef))
                    continue
                if isinstance(node, (ast.Assign, ast.AnnAssign)):
                    assigns.update((owner, name) for name in _assigned_self_attributes(node))
                for block in _blocks(node):  # an `if` in a class body is still the class's
                    visit(block, owner, in_class_body)

        visit(self.node.body, self.owner, False)
        return owner_of_line, assigns

    @property
    def assigned_self_attributes(self) -> set[tuple[str | None, str]]:
        """(class, x) of every `self.x` / `cls.x` it assigns."""
        return self._self_scopes[1]

    @cached_property
    def used_self_attributes(self) -> set[tuple[str | None, str]]:
        """(class, x) of every `self.x` / `cls.x` it uses, read from the lines, each in the
        innermost scope that holds it."""
        owner_of_line = self._self_scopes[0]
        uses: set[tuple[str | None, str]] = set()
        for number, line in enumerate(physical_lines(self.text), start=self.first):
            if "self." in line or "cls." in line:
                owners = {owner_of_line.get(number, self.owner)}
                if "lambda" in line:
                    owners.add(None)  # a lambda's own scope belongs to no class
                uses.update((owner, name) for owner in owners for name in _SELF_ATTRIBUTE.findall(line))
        return uses


def _plain_names(code: str) -> set[str]:
    """The names in code that are not attributes (`f` in `f(x)` and `target=f`, not `m.f`)."""
    return {name for name in _NAME_OR_ATTRIBUTE.findall(code) if name[0] != "."}


def _assigned_self_attributes(node: ast.Assign | ast.AnnAssign) -> Iterator[str]:
    """The `x` of every `self.x...` / `cls.x...` an assignment binds, unpacked targets included."""
    targets = list(node.targets) if isinstance(node, ast.Assign) else [node.target]
    while targets:
        target = targets.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            targets.extend(target.elts)
        elif isinstance(target, ast.Starred):
            targets.append(target.value)
        elif isinstance(target, ast.Attribute):
            while isinstance(target.value, ast.Attribute):
                target = target.value
            if isinstance(target.value, ast.Name) and target.value.id in ("self", "cls"):
                yield target.attr


def _assigns_self(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether a function, or anything nested in it, assigns a `self.x` or `cls.x`."""
    stack: list[ast.stmt] = list(function.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and next(_assigned_self_attributes(node), None):
            return True
        for block in _blocks(node):
            stack.extend(block)
    return False


def _blocks(node: ast.stmt) -> Iterator[list[ast.stmt]]:
    """The statement lists a compound statement holds."""
    for name in ("body", "orelse", "finalbody"):
        block = getattr(node, name, None)
        if block and isinstance(block, list):
            yield block
    for handler in getattr(node, "handlers", ()):
        yield handler.body
    for case in getattr(node, "cases", ()):
        yield case.body


@dataclass
class _Skeleton:
    units: list[_Unit] = field(default_factory=list)
    kept_lines: set[int] = field(default_factory=set)  # lines outside every unit
    # Names bound outside every unit (imports, assignments), with the text that binds them.
    bindings: list[tuple[set[str], str]] = field(default_factory=list)
    # Class bodies whose methods may all be blanked: (first body line, its indent, members).
    class_bodies: list[tuple[int, int, list[_Unit]]] = field(default_factory=list)
    bases: dict[str, list[str]] = field(default_factory=dict)  # class -> its bases as written


def first_line(node: ast.stmt) -> int:
    """A statement's first line, its decorators included (CPython puts `lineno` at `def`)."""
    return min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])


def _skeleton(tree: ast.Module, lines: list[str], is_function_base: Callable[[str], bool]) -> _Skeleton:
    skeleton = _Skeleton()

    def visit_body(body: list[ast.stmt], owner: ast.ClassDef | None) -> list[_Unit]:
        units = []
        in_function_class = owner is not None and any(is_function_base(base) for base in _bases(owner))
        for node in body:
            first, last = first_line(node), node.end_lineno or node.lineno
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                text = "".join(lines[first - 1 : last])
                unit = _Unit(node.name, owner.name if owner else None, first, last, text, node, in_function_class)
                skeleton.units.append(unit)
                units.append(unit)
            elif isinstance(node, ast.ClassDef):
                skeleton.bases[node.name] = _bases(node)
                body_first = first_line(node.body[0])
                skeleton.kept_lines.update(range(first, body_first))
                members = visit_body(node.body, owner=node)
                skeleton.class_bodies.append((body_first, node.body[0].col_offset, members))
            else:
                skeleton.kept_lines.update(range(first, last + 1))
                skeleton.bindings.extend(_bindings(node, lines))
        return units

    visit_body(tree.body, owner=None)
    return skeleton


def _bindings(statement: ast.stmt, lines: list[str]) -> Iterator[tuple[set[str], str]]:
    """Names an import or an assignment binds (`from torch.cuda.amp import autocast as ac`,
    `ctx = torch.autocast(...)`), with its text: a function that uses `ac` uses autocast."""
    for node in nodes(statement):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            # `import a.b` is used as `a.b...`, which spells its words out.
            bound = {alias.asname or alias.name for alias in node.names if alias.asname or isinstance(node, ast.ImportFrom)}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound = {name.id for target in targets for name in nodes(target) if isinstance(name, ast.Name)}
        else:
            continue
        if bound:
            yield bound, "".join(lines[node.lineno - 1 : node.end_lineno or node.lineno])


def _subclasses(bases: dict[str, list[str]]) -> defaultdict[str | None, set[str]]:
    """Each class of the file with the classes that subclass it, directly or through others."""
    below: defaultdict[str | None, set[str]] = defaultdict(set)
    for name in bases:
        seen, pending = set(), list(bases[name])
        while pending:
            base = pending.pop()
            if base in seen:
                continue
            seen.add(base)
            below[base].add(name)
            pending.extend(bases.get(base, ()))
    return below


def _bases(node: ast.ClassDef) -> list[str]:
    return [name for name in map(dotted, node.bases) if name]


def _bound_attributes(code: str, trigger: re.Pattern[str]) -> set[str]:
    """`self.` attributes bound to something that mentions a trigger word."""
    attributes: set[str] = set()
    for line in code.splitlines():
        target, equals, value = line.partition("=")
        if not equals or value.startswith("=") or not trigger.search(value):
            continue
        target = target.strip()
        if target.startswith(("self.", "cls.")):
            attributes.add(target.split(".", 1)[1].split(".")[0])
    return attributes


def prepare(text: str, codes: frozenset[str], check_syntax: bool = True) -> tuple[frozenset[str], str | None]:
    """The rules still possible once CPython has read the file, and for a large file the slice.

    The byte gate saw docstrings, comments and messages too ("call backward() outside
    autocast"); the gates run again on the code alone, which often leaves no rule at all for a
    module that only talks about AMP (then, unless `check_syntax`, the file is not even parsed).
    The screens then ask CPython's tree the module-wide questions the rules start from (is
    autocast ever entered, a GradScaler ever built). A file CPython cannot parse keeps every
    rule: libcst, the parser of record, reports it or reads it.
    """
    string_blind = codes - STRING_SENSITIVE.keys() - {"AMP000"}
    view = _code_view(text)
    named_in_code = {code for code in codes & STRING_SENSITIVE.keys() if STRING_SENSITIVE[code] in view}
    kept = possible_rules(view, string_blind) | named_in_code
    screen = Screen(text, view)
    try:
        kept = screen.possible(kept)
        if not kept and not check_syntax:
            return codes & {"AMP000"}, None
        tree = screen.tree
    except (RecursionError, MemoryError):
        raise SourceError(TOO_DEEP_FOR_PYTHON) from None
    except (SyntaxError, ValueError) as error:
        too_deep = nesting_error(error)
        if too_deep is not None:
            raise too_deep from None
        return codes, None  # libcst, the parser of record, reports it or reads newer syntax
    kept |= codes & {"AMP000"}
    if kept - {"AMP000"} and screen.walk.longest_chain > LONGEST_CHAIN:
        raise SourceError(
            f"cannot analyse: an expression chains {screen.walk.longest_chain} operators, more than "
            f"the {LONGEST_CHAIN} libcst parses in reasonable time"
        )
    if len(text) < SLICE_MIN_CHARS or not kept - {"AMP000"}:
        return kept, None  # slicing a small file would save less than it costs
    return _slice(text, tree, kept, view.decode("utf-8"), screen)


# Comments and string literals, scanned left to right: outside them a `#` or a quote can only
# start one, so one pass of this pattern (at C speed) finds them all in code that parses. A
# string's prefix letters are looked at separately. Python 3.12 lets an f-string reuse its own
# quote inside a replacement field; such a field is cut short here, which at worst blanks a
# little more of the line that holds it. Each body is written as a run of ordinary characters
# between escapes and lone quotes (the "unrolled loop"): twice as fast as one alternation a character.
_LEXEMES = re.compile(
    rb"#[^\r\n]*"
    rb"|'''[^'\\]*(?:(?:\\[\s\S]|'(?!''))[^'\\]*)*'''"
    rb'|"""[^"\\]*(?:(?:\\[\s\S]|"(?!""))[^"\\]*)*"""'
    rb"|'[^'\\\r\n]*(?:\\[\s\S][^'\\\r\n]*)*'"
    rb'|"[^"\\\r\n]*(?:\\[\s\S][^"\\\r\n]*)*"'
)
_PREFIX_LETTERS = frozenset(b"rRbBuUfF")
# Every byte a space, but line breaks, which stay put.
_BLANKED = bytes(byte if byte in b"\r\n" else ord(" ") for byte in range(256))


def _code_view(text: str) -> bytes:
    """The source as bytes with every comment and every plain string literal (docstrings
    included, prefixes too) blanked; f-strings stay, since their fields are code. Line breaks
    stay put."""
    data = text.encode("utf-8")
    pieces = []
    last = 0
    for match in _LEXEMES.finditer(data):
        start, end = match.span()
        if data[start] != ord("#"):
            start = _prefix_start(data, start)
            if b"f" in data[start : match.start()].lower():
                continue
        pieces.append(data[last:start])
        pieces.append(data[start:end].translate(_BLANKED))
        last = end
    pieces.append(data[last:])
    return b"".join(pieces)


def _prefix_start(data: bytes, quote: int) -> int:
    """Where the string whose quote is at `quote` starts: before its prefix (`rb"`, `f'`), unless
    those letters end a keyword or a name (`if"x"` is `if` and a string)."""
    start = quote
    while start > 0 and quote - start < 2 and data[start - 1] in _PREFIX_LETTERS:
        start -= 1
    before = data[start - 1 : start]
    return quote if before and (before.isalnum() or before == b"_" or before[0] >= 0x80) else start


def _slice(text: str, tree: ast.Module, codes: frozenset[str], code_view: str, screen: Screen) -> tuple[frozenset[str], str | None]:
    """The rules still possible, and the text with irrelevant functions blanked (None: analyse
    the whole file). Trigger words and calls are looked for in the code view: a docstring that
    says "autocast" keeps nothing."""
    if any(code not in TRIGGERS for code in codes if code != "AMP000"):
        return codes, None
    lines = lines_with_endings(text)
    code_lines = lines_with_endings(code_view)
    if len(code_lines) != len(lines):
        return codes, None
    is_function_base = screen.may_be_function if not codes.isdisjoint(_FUNCTION_CLASS_RULES) else _never
    skeleton = _skeleton(tree, code_lines, is_function_base)
    if not skeleton.units:
        return codes, None
    # Module-level code is always kept: its plain calls and its AMP bindings count.
    module_level = "".join(code_lines[i - 1] for i in sorted(skeleton.kept_lines) if i <= len(lines))
    graph = _CallGraph(skeleton, module_level, is_function_base)
    codes -= {code for code in codes & _REGION_RULES if not _called_in_regions(graph, screen, code)}
    if not codes - {"AMP000"}:
        return codes, None  # what autocast reaches makes none of the calls those rules report
    # Each rule keeps what its own trigger words reach; the slice is the union, so one rule's
    # broad words (AMP017's `backward`) do not drag in another's call graph.
    kept: set[_Unit] = set()
    for code in sorted(codes - {"AMP000"}):
        kept |= graph.reach(TRIGGERS[code], follow_calls=code in _FOLLOW_CALLS, function_classes=code in _FUNCTION_CLASS_RULES)
    if "AMP002" in codes:
        kept |= _amp002_reads(graph)
    if "AMP013" in codes and graph.reach(names.CONVERTING_KERNEL, follow_calls=False, function_classes=False):
        # the helpers a Function's forward hands its tensors to, on the way to a kernel that converts them
        kept |= graph.callees(frozenset(u for u in graph.units if _defines_function_class(u, graph.is_function_base)))
    if "AMP016" in codes:  # what the callers of a helper that switches FlashAttention on pass it
        kept |= graph.callers(graph.reach(_FLASH_SWITCH, follow_calls=False, function_classes=False))
    reads_clocks = not codes.isdisjoint(_ASK_FOR_A_BACKWARD) and _reads_a_clock(screen)
    if not codes.isdisjoint(_ASK_FOR_A_BACKWARD):
        kept |= _backward_witness(graph, kept, screen)
    if reads_clocks:
        kept |= _what_times_a_backward_reads(graph, screen)
    if "AMP009" in codes:  # any backward of a loss scaled by hand exempts the module: keep every one on a product
        kept |= graph.reach(_BACKWARD_OF_A_PRODUCT, follow_calls=False, function_classes=False)
    triggers = [TRIGGERS[code] for code in sorted(codes - {"AMP000"})]
    if reads_clocks:  # a nested function of a witness that reads the clock or steps is not inert
        triggers.append(_CLOCK_OR_STEP)
    if not codes.isdisjoint(_OPTIMIZER_RULES):
        triggers.append(_BUILDS_OPTIMIZERS)
        kept |= graph.reach(_BUILDS_OPTIMIZERS, follow_calls=False, function_classes=False)
    if "AMP012" in codes:  # what a saved checkpoint is built from: the helpers that return it
        kept |= graph.callees(graph.reach(_SAVES, follow_calls=False, function_classes=False))
    if "AMP014" in codes:  # the helpers a disabled block hands its values to, which may cast them
        kept |= graph.callees(graph.reach(TRIGGERS["AMP014"], follow_calls=False, function_classes=False))
    kept = graph.with_binders(kept)
    keep = set(skeleton.kept_lines)
    for unit in kept:
        keep.update(range(unit.first, unit.last + 1))
    words = re.compile("|".join(triggers) or "(?!)")
    bound_names = graph.global_names(words)
    keep -= _inert_elements(screen.walk.tables, code_lines, keep, words, bound_names)
    # A nested function that calls none of the kept functions is as inert as a blanked one.
    bound_names |= {unit.name for unit in kept}
    units = {id(unit.node) for unit in skeleton.units}
    placeholders = _inert_definitions(screen.walk.functions, code_lines, keep, words, bound_names, units)
    for first, last, _indent in placeholders:
        keep.difference_update(range(first, last + 1))
    out = [line if number in keep else _ending(line) for number, line in enumerate(lines, start=1)]
    # Where a statement may start on a blanked line, and at which indentation.
    statement_starts = {u.first: _indentation(lines[u.first - 1]) for u in skeleton.units if u not in kept}
    for first, _last, indent in placeholders:  # the body that held it must not end up empty
        out[first - 1] = indent + "pass" + _ending(lines[first - 1])
        statement_starts[first + 1] = indent
    for body_first, indent, members in skeleton.class_bodies:
        if body_first not in keep and members and not any(u in kept for u in members):
            out[body_first - 1] = " " * indent + "pass" + _ending(lines[body_first - 1])
            statement_starts[body_first + 1] = " " * indent
    _fold_blank_runs(out, statement_starts)
    return codes, "".join(out)


# libcst makes several nodes of every empty line: they were nearly half of its parse of a slice.
_FOLD_MIN_LINES = 3


def _fold_blank_runs(out: list[str], statement_starts: dict[int, str]) -> None:
    """Each run of blank lines that starts where a statement may becomes one string statement
    spanning the same lines, so no line moves. Such a run holds no code: the line after it
    starts a statement, a dedent or a comment."""
    folded_until = 0
    for start, indent in sorted(statement_starts.items()):
        if start <= folded_until or start > len(out) or out[start - 1].strip():
            continue
        end = start
        while end < len(out) and not out[end].strip():
            end += 1
        if end - start + 1 >= _FOLD_MIN_LINES:
            out[start - 1] = indent + '"""' + _ending(out[start - 1])
            out[end - 1] = '"""' + _ending(out[end - 1])
            folded_until = end


def _indentation(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _never(name: str) -> bool:
    return False


def _inert_definitions(
    functions: list[ast.FunctionDef | ast.AsyncFunctionDef], code_lines: list[str], keep: set[int], words: re.Pattern[str], names: set[str], units: set[int]
) -> list[tuple[int, int, str]]:
    """Functions nested in kept code (handlers registered in a 90 KB method) with no rule's word,
    no name bound to one, no call of a kept function, no `self.x` assigned (the facts read what a
    receiver is from those), and whose own name is used nowhere else (a thread's target, a
    helper called by name: rules look into those): (first line, last line, indentation) of each
    outermost one, to be replaced by `pass`."""
    found: list[tuple[int, int, str]] = []
    uses: Counter[str] | None = None
    for node in functions:
        if id(node) in units:
            continue
        first, last = first_line(node), node.end_lineno or node.lineno
        if first not in keep:
            continue
        text = "".join(code_lines[first - 1 : last])
        indent = code_lines[first - 1][: node.col_offset]
        if indent.strip() or words.search(text) or not names.isdisjoint(_WORD.findall(text)) or _assigns_self(node):
            continue
        if uses is None:
            uses = Counter(_WORD.findall("".join(code_lines)))
        if uses[node.name] > 1:
            continue
        found.append((first, last, indent))
    found.sort(key=lambda span: (span[0], -span[1]))
    outermost: list[tuple[int, int, str]] = []
    for span in found:
        if not outermost or span[0] > outermost[-1][1]:
            outermost.append(span)
    return outermost


_ENTRY_END = re.compile(rb"\s*,\s*$")


def _inert_elements(tables: list[ast.expr], code_lines: list[str], keep: set[int], words: re.Pattern[str], names: set[str]) -> set[int]:
    """Lines of the entries of large list, set, tuple and dict displays that no rule can look at:
    no trigger word, no name bound to one, no call and no assignment. Only an entry alone on its
    lines, followed by its comma, is blanked, so what is left still parses."""
    inert: set[int] = set()
    for node in tables:
        if node.lineno not in keep:
            continue
        if isinstance(node, ast.Dict):
            entries = [(key, value) for key, value in zip(node.keys, node.values) if key is not None]
        else:
            entries = [(element, element) for element in node.elts]
        for first, last in entries:
            start, end = first.lineno, last.end_lineno or last.lineno
            head = code_lines[start - 1].encode("utf-8")[: first.col_offset]
            tail = code_lines[end - 1].encode("utf-8")[last.end_col_offset :]
            if head.strip() or not _ENTRY_END.match(tail):
                continue
            text = "".join(code_lines[start - 1 : end])
            if "(" in text or ":=" in text or words.search(text) or not names.isdisjoint(_WORD.findall(text)):
                continue
            inert.update(range(start, end + 1))
    return inert


def _amp002_reads(graph: _CallGraph) -> set[_Unit]:
    """What AMP002's exemptions read beyond the function of a cast (the rule's helpers named)."""
    # The units, and module-level code (a script's), that may hold a cast the rule judges.
    may_cast = graph.matching([*graph.units, graph.module_caller], re.compile(_AMP002_CASTS))
    casts = frozenset(u for u in may_cast if _AMP002_CAST_CALL.search(u.text))
    if not casts:
        return set()
    helpers = graph.callees(casts)
    # _wraps: the helpers a model is handed to, down to the wrapper they return it in;
    # _only_inspects: a builtin the file defines is called, not looked up.
    kept = graph.toward(helpers, _AMP002_WRAPPERS)
    kept |= {u for u in helpers if u.name in names.INSPECTION_BUILTINS}
    # region_of, _called_on_an_amp_path, _only_in_tests_without_amp, _used_only_by_optimizers: the
    # functions that use a cast's function, and theirs, with the AMP each of them reaches (_amp_anchors).
    users = graph.users(casts)
    kept |= users | graph.toward(graph.callees(casts | users), _AMP002_AMP)
    # _test_that_does_not_train: what a test holding a cast, or module-level code, reaches of training.
    tests = frozenset(u for u in casts if any(names.names_a_test(name) for name in _DEFINED.findall(u.text)))
    if tests:
        kept |= graph.toward(graph.callees(tests | {graph.module_caller}), _AMP002_TRAINS)
    # _pinned_value: what the callers of a function whose autocast or GradScaler is switched by
    # `enabled=` pass for the parameters the switch reads.
    switched = graph.matching([u for u in graph.units if "enabled" in u.text], re.compile(_AMP002_AMP))
    kept |= graph.callers(frozenset(switched))
    # _attribute_run_only_without_gradients: the methods of a cast's class that use an attribute a
    # cast's line names (`self.encoder = self.encoder.to(torch.bfloat16)`).
    converted = {
        (u.owner, name)
        for u in casts if u.owner
        for line in u.text.splitlines() if "self." in line and _AMP002_CAST_CALL.search(line)
        for name in _SELF_ATTRIBUTE.findall(line)
    }
    kept |= {u for u in graph.units if not converted.isdisjoint(u.used_self_attributes)}
    return kept


def _called_in_regions(graph: _CallGraph, screen: Screen, code: str) -> bool:
    """Whether what autocast's own reach holds (the functions that open a region, and those they
    call) may call what `code` reports inside a region. AMP003's steps, AMP015's threads and
    AMP017's compiled models are common words in a large module; most of their calls are far
    from any region."""
    if code == "AMP017":
        called, suffix = screen.compiled_names, r"(?:\s*\.\s*(?:forward|__call__))?"
        if called is None:  # a compiled function is decorated: any call may be one
            return True
    else:
        called, suffix = _CALLED_IN_REGIONS[code] | screen.names_for(_CALLED_IN_REGIONS[code]), ""
    if not called:
        return False
    openers = "".join(rf"|\b{re.escape(name)}\b" for name in sorted(screen.autocast_names))
    region = graph.reach(r"autocast" + openers, follow_calls=True, function_classes=False)
    alternatives = "|".join(map(re.escape, sorted(called)))
    call = re.compile(rf"\b(?:{alternatives}){suffix}\s*\(")
    return call.search(graph.module_level) is not None or any(call.search(unit.text) for unit in region)


def _backward_witness(graph: _CallGraph, kept: set[_Unit], screen: Screen) -> frozenset[_Unit]:
    """AMP002 and AMP009 ask only whether the module calls `.backward()` somewhere: one function that
    does answers it (the screen's walk has every call). Without one, every function that
    mentions backward is kept."""
    lines = sorted(c.lineno for c in screen.walk.calls if isinstance(c.func, ast.Attribute) and c.func.attr == "backward")
    # Not a method named `backward` (an autograd.Function's recompute): rg.has_backward skips those.
    witnesses = [u for u in graph.units if not (u.name == "backward" and u.owner is not None)]
    for unit in sorted(witnesses, key=lambda u: u not in kept):
        index = bisect_left(lines, unit.first)
        if index < len(lines) and lines[index] <= unit.last:
            return frozenset({unit})
    return graph.reach(r"backward", follow_calls=True, function_classes=False)


# The clocks rg.times_a_backward reads, by their last names, and CUDA events' `elapsed_time`.
_CLOCK_CALLS = frozenset({clock.rsplit(".", 1)[-1] for clock in names.CLOCKS} | {"elapsed_time"})


def _reads_a_clock(screen: Screen) -> bool:
    return any(_measures(_called_name(c.func)) for c in screen.walk.calls)


def _measures(name: str | None) -> bool:
    """rg._measures by the last part of the name called: a clock, a timer or a profiler."""
    return name is not None and (name in _CLOCK_CALLS or names.TIMING_NAME.search(name) is not None)


def _what_times_a_backward_reads(graph: _CallGraph, screen: Screen) -> frozenset[_Unit]:
    """rg.times_a_backward asks whether a module that reads a clock ever steps, zeroes gradients
    or builds an optimizer: one function that reads a clock and one that steps or zeroes answer
    the first two (code outside every function is kept anyway), and the functions that build
    optimizers the last."""
    kept = {*_holding(graph, _measures, screen), *_holding(graph, lambda name: name in ("step", "zero_grad"), screen)}
    return frozenset(kept) | graph.reach(_BUILDS_OPTIMIZERS, follow_calls=False, function_classes=False)


_CLOCK_OR_STEP = r"|".join(rf"{name}\s*\(" for name in sorted(_CLOCK_CALLS | {"step", "zero_grad"})) + f"|(?i:{names.TIMING_NAME.pattern})"


def _called_name(func: ast.expr) -> str | None:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _holding(graph: _CallGraph, called: Callable[[str | None], bool], screen: Screen) -> list[_Unit]:
    """A function that makes a call whose name is `called`, unless module-level code does (it is kept)."""
    lines = sorted(c.lineno for c in screen.walk.calls if called(_called_name(c.func)))
    holders = [next((u for u in graph.units if u.first <= line <= u.last), None) for line in lines]
    return [] if not holders or None in holders else [holders[0]]


class _CallGraph:
    """Which units a rule can see: those holding its trigger words, then, as many levels as the
    rules follow in-file calls (semantics.region_of, enclosing_loops), the functions they call,
    the functions that call them, and those that use a name bound to an AMP object in kept code
    (`self.amp_ctx`, `scaler`)."""

    def __init__(self, skeleton: _Skeleton, module_level: str, is_function_base: Callable[[str], bool]) -> None:
        self.units, self.bindings, self.is_function_base = skeleton.units, skeleton.bindings, is_function_base
        self.module_level = module_level
        self.functions = {u.name for u in self.units if u.owner is None}  # module-level ones
        self.module_calls = _plain_names(module_level) & self.functions
        # A `self.m()` in a class may run a subclass's `m` (semantics follows the one override of a
        # placeholder): the file's classes below each class.
        self.below = _subclasses(skeleton.bases)
        # Module-level code as a caller: `model = Net()` then `model(x)` runs `Net.forward`.
        self.module_caller = _Unit("<module>", None, 0, 0, module_level, None)
        self._reached: dict[tuple[str, bool, bool], frozenset[_Unit]] = {}

    def runs_methods_of(self, owner: str | None) -> tuple[str | None, ...]:
        """The classes whose methods a `self.m()` in a method of `owner` may run: its own, and its
        subclasses' in the file."""
        return (owner, *self.below.get(owner, ()))

    def global_names(self, trigger: re.Pattern[str]) -> set[str]:
        """Names bound outside every unit to something with a trigger word: they stand for it."""
        return set().union(*(names for names, text in self.bindings if trigger.search(text)))

    def reach(self, pattern: str, follow_calls: bool, function_classes: bool) -> frozenset[_Unit]:
        key = (pattern, follow_calls, function_classes)
        if key not in self._reached:  # rules that share their words share the answer
            self._reached[key] = self._reach(re.compile(pattern), follow_calls, function_classes)
        return self._reached[key]

    def _called_by(self, callers: set[_Unit] | frozenset[_Unit]) -> set[_Unit]:
        """The module-level functions and same-class methods `callers` call, and the methods of
        classes they call through the class or a local instance."""
        called = set().union(*(u.plain_calls for u in callers)) & self.functions
        methods = {(owner, m) for u in callers if u.owner for m in u.method_calls for owner in self.runs_methods_of(u.owner)}
        return {
            u for u in self.units
            if (u.name in called if u.owner is None else (u.owner, u.name) in methods)
            or (u.owner is not None and any(c.calls_method_of(u.owner, u.name) for c in callers))
        }

    def _calls_any(self, unit: _Unit, callees: set[_Unit] | frozenset[_Unit]) -> bool:
        """Whether `unit` calls one of `callees`, as `_called_by` follows calls."""
        return any(
            (c.name in unit.plain_calls) if c.owner is None
            else (c.owner in self.runs_methods_of(unit.owner) and c.name in unit.method_calls)
            or unit.calls_method_of(c.owner, c.name)
            for c in callees
        )

    def callees(self, callers: frozenset[_Unit]) -> frozenset[_Unit]:
        """The functions and same-class methods `callers` call, and those they call, as deep as
        the rules follow a value through helpers that return it."""
        found: set[_Unit] = set()
        current: set[_Unit] = set(callers)
        for _ in range(names.CALL_DEPTH):
            current = self._called_by(current) - found
            if not current:
                break
            found |= current
        return frozenset(found)

    def callers(self, callees: frozenset[_Unit]) -> frozenset[_Unit]:
        """The functions and methods that call `callees`, directly or through others, as deep as
        `callees` looks."""
        found: set[_Unit] = set()
        current: set[_Unit] = set(callees)
        for _ in range(names.CALL_DEPTH):
            current = {u for u in self.units if self._calls_any(u, current)} - found
            if not current:
                break
            found |= current
        return frozenset(found)

    def matching(self, units: Iterable[_Unit], trigger: re.Pattern[str]) -> set[_Unit]:
        """Those of `units` that hold a trigger word or a name bound to one."""
        global_names = self.global_names(trigger)
        return {u for u in units if trigger.search(u.text) or not global_names.isdisjoint(u.words)}

    def toward(self, units: frozenset[_Unit], trigger: str) -> set[_Unit]:
        """Those of `units` (what `callees` found) that hold a trigger word or call one that
        does through others of them, as deep as the rules follow calls: the helpers on the way."""
        reaching = self.matching(units, re.compile(trigger))
        for _ in range(names.CALL_DEPTH):
            added = {u for u in units - reaching if self._calls_any(u, reaching)}
            if not added:
                break
            reaching |= added
        return reaching

    def users(self, units: frozenset[_Unit]) -> frozenset[_Unit]:
        """The units that use a function `units` define, and those that use those, as deep as the
        rules follow callers: a call as `callers` follows it, or any mention of the name
        (`Thread(target=obj.f)`); at the first level also a mention of a module-level name bound to
        something that mentions it (`BACKENDS = dict(ns=ns_step)`), as deep as the rules follow those."""
        found, current = set(units), set(units)
        for level in range(names.CALL_DEPTH):
            used = {name for unit in current for name in _DEFINED.findall(unit.text)}
            for _ in range(names.CALL_DEPTH if level == 0 else 0):
                holders = set().union(*(bound for bound, text in self.bindings if not used.isdisjoint(_plain_names(text)))) - used
                if not holders:
                    break
                used |= holders
            current = {u for u in self.units if not used.isdisjoint(u.words) or self._calls_any(u, current)} - found
            if not current:
                break
            found |= current
        return frozenset(found - units)

    def with_binders(self, kept: set[_Unit]) -> set[_Unit]:
        """`kept` and the functions that assign the attributes kept ones use (`self.tower =
        resnet50()` in `__init__`): the facts read what a receiver is (a model, an optimizer, a
        scheduler) from its assignments, those made in the methods of its class if any, else
        all of them (semantics' `AmpFacts.bindings`)."""
        in_class: dict[tuple[str | None, str], set[_Unit]] = {}  # (class, attribute) -> units assigning it there
        anywhere: dict[str, set[_Unit]] = {}  # attribute -> units assigning it in any class
        for unit in self.units:
            for owner, name in unit.assigned_self_attributes:
                in_class.setdefault((owner, name), set()).add(unit)
                anywhere.setdefault(name, set()).add(unit)
        kept = set(kept)
        for _ in range(names.CALL_DEPTH):
            added: set[_Unit] = set()
            for owner, name in {used for u in kept for used in u.used_self_attributes}:
                added |= in_class.get((owner, name)) or anywhere.get(name, set())
            added -= kept
            if not added:
                break
            kept |= added
        return kept

    def _reach(self, trigger: re.Pattern[str], follow_calls: bool, function_classes: bool) -> frozenset[_Unit]:
        kept = self.matching(self.units, trigger)
        if function_classes:
            kept |= {u for u in self.units if _defines_function_class(u, self.is_function_base)}
        if not follow_calls:
            return frozenset(kept)
        bound_attributes: dict[_Unit, set[str]] = {}
        for _ in range(names.CALL_DEPTH):
            kept_functions = {u.name for u in kept if u.owner is None}
            kept_methods = {(u.owner, u.name) for u in kept if u.owner}
            for unit in kept:
                if unit.owner and unit not in bound_attributes:
                    bound_attributes[unit] = _bound_attributes(unit.text, trigger)
            attributes = {(u.owner, a) for u in kept if u.owner for a in bound_attributes[u]}
            added = self._called_by(kept) | {  # the callees, and:
                unit
                for unit in self.units
                if (unit.owner is None and unit.name in self.module_calls)  # called at module level
                or (unit.owner is not None and self.module_caller.calls_method_of(unit.owner, unit.name))
                or not kept_functions.isdisjoint(unit.plain_calls)  # a caller
                or any((owner, name) in kept_methods for name in unit.method_calls for owner in self.runs_methods_of(unit.owner))
                or any(unit.calls_method_of(owner, name) for owner, name in kept_methods)  # through an instance
                or any(owner == unit.owner and f".{name}" in unit.text for owner, name in attributes)
            }
            added -= kept
            if not added:
                break
            kept |= added
        return frozenset(kept)


def _defines_function_class(unit: _Unit, is_function_base: Callable[[str], bool]) -> bool:
    """A method of a class that may subclass autograd.Function, or a function defining one."""
    if unit.in_function_class:
        return True
    for bases in _CLASS_HEADER.findall(unit.text):
        if any(is_function_base(base.strip()) for base in bases.split(",")):
            return True
    return False


def _ending(line: str) -> str:
    return line[len(line.rstrip("\r\n")) :]


