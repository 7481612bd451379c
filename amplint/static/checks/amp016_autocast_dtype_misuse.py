"""AMP016 autocast-dtype-misuse: an autocast dtype autocast ignores, bf16 on CUDA unchecked, or BCE under autocast."""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from amplint.model import Severity
from amplint.static.checks import Hit
from amplint.static.checks import _regions as rg
from amplint.static.semantics import (
    AmpFacts,
    Autocast,
    CallSite,
    Scope,
    constructor_of,
    dotted_name,
    is_true,
    string_literal,
)
from amplint.static.source import code_only

CODE = "AMP016"

_BCE_FUNCTIONS = {"torch.nn.functional.binary_cross_entropy", "torch.binary_cross_entropy"}
_BCE_MODULES = {"torch.nn.BCELoss", "torch.nn.modules.loss.BCELoss"}
# FP8 training libraries: their kernels need an Ada or Hopper GPU (Transformer Engine and MS-AMP
# at least an Ampere one), all of which have bfloat16, so a module built on them never runs on a
# V100 or T4. Not `torch.float8_*` dtypes alone: any GPU stores float8 weights and upcasts them.
_NEEDS_BF16_HARDWARE = ("transformer_engine", "msamp", "torchao.float8")
# Attention implementations (transformers' `attn_implementation=`) with no kernels before Ampere.
_AMPERE_ATTENTION = {"flash_attention_2", "flash_attention_3"}
# A model built with FlashAttention switched on by a literal `True` (OLMo's `flash_attention=True`).
_FLASH_ATTENTION_SWITCHES = {"flash_attention", "use_flash_attn", "use_flash_attention", "flash_attn"}
# Settings that name the attention kernels (transformers' `attn_implementation`, MPT's `attn_impl`).
_ATTENTION_IMPLEMENTATIONS = {"attn_implementation", "attn_impl"}
_AMPERE_ATTENTION_NAMES = _AMPERE_ATTENTION | {"flash"}
# A setting that asks for bfloat16 by name (`use_bfloat16`, `args.bf16`, `precision == "bf16"`).
_NAMES_BFLOAT16 = re.compile(r"bf16|bfloat16", re.IGNORECASE)


def check(facts: AmpFacts) -> Iterator[Hit]:
    if not facts.has_autocast:
        return
    yield from _dtypes(facts)
    yield from _bce(facts)


def _dtypes(facts: AmpFacts) -> Iterator[Hit]:
    guarded = None
    for call, region in rg.autocasts(facts):
        if not rg.enabled(region):
            continue
        dtype = rg.literal_dtype(facts, region, call)
        if dtype is None:
            continue
        device = region.device
        # CUDA autocast takes any dtype (float32 forces full precision inside an outer bf16
        # region); an unknown device may be CUDA, so only a known other one is reported.
        others = sorted(rg.possible_devices(facts, region, call) - {"cuda"})
        if dtype not in rg.LOW and others:
            where = " or ".join(d.upper() for d in others)
            if device is None:  # `"mps" if mps else "cuda" if cuda else "cpu"`
                where = f"On {where} (where the device expression chooses it), autocast"
            else:
                where = f"{where} autocast"
            yield Hit(
                call.node,
                f"{where} supports only float16 and bfloat16: with `{dtype}` the constructor "
                f"warns and disables autocast, so this region runs in the inputs' dtype; pass `enabled=False` "
                f"if that is the intent, else use torch.bfloat16 or torch.float16",
                call.where.statement,
            )
        elif (
            dtype in rg.BFLOAT16
            and device == "cuda"
            and not _opted_into_bfloat16(facts, region, call)
            and not _chosen_by_a_bfloat16_setting(facts, call.node)
            # `autocast = get_autocast(args.precision)` ... `with autocast():` is built in the factory
            and not _chosen_by_a_bfloat16_setting(facts, region.node)
            and not _named_for_bfloat16(call)
            and not rg.dtype_is_a_parameter_default(facts, region, call)
        ):
            if guarded is None:
                guarded = bool(rg.BF16_SUPPORT_CHECK.search(code_only(facts.text))) or _needs_bf16_hardware(facts)
            if not guarded:
                # A GradScaler matters only where float16 gradients are computed.
                fallback = "float16 with a GradScaler" if rg.trains(facts) and not rg.inference_only(facts, call) else "float16"
                yield Hit(
                    call.node,
                    "bfloat16 autocast on CUDA without a `torch.cuda.is_bf16_supported()` check in this "
                    "module: GPUs before Ampere (V100, T4, RTX 20xx) fail or emulate it slowly; check "
                    f"support and fall back to {fallback}",
                    call.where.statement,
                    severity=Severity.INFO,  # right on Ampere and newer: a hint, as research §5 says
                )


def _needs_bf16_hardware(facts: AmpFacts) -> bool:
    """The module imports a library that runs only on GPUs with bfloat16 (see _NEEDS_BF16_HARDWARE),
    and not as an option (`try: import transformer_engine` / `except ImportError:`), which says
    nothing of the GPU the rest of the module runs on; or it switches FlashAttention on, whose
    kernels need an Ampere GPU or newer: by name (`attn_implementation="flash_attention_2"`,
    `{"attn_impl": "flash"}`) or by a literal `True` in a keyword, an attribute or a dict entry."""
    if any(
        (ref.qualname == library or ref.qualname.startswith(library + ".")) and not _optional(facts, ref.statement)
        for ref in facts.imports
        for library in _NEEDS_BF16_HARDWARE
    ):
        return True
    return "flash" in facts.text and any(_asks_for_flash_attention(facts, *setting) for setting in _settings(facts))


def _asks_for_flash_attention(facts: AmpFacts, name: str, value: cst.BaseExpression, scope: Scope | None) -> bool:
    if name in _ATTENTION_IMPLEMENTATIONS:
        return string_literal(value) in _AMPERE_ATTENTION_NAMES
    if name not in _FLASH_ATTENTION_SWITCHES:
        return False
    if is_true(value):
        return True
    # OLMo's test: `def make_model(flash_attn): cfg.flash_attention = flash_attn`, then `make_model(True)`.
    function = scope.function_scope if scope is not None else None
    return (
        isinstance(value, cst.Name) and function is not None and value.value in function.params
        and any(is_true(passed) for _, passed in facts.passed_for(function, value.value) if passed is not None)
    )


def _settings(facts: AmpFacts) -> Iterator[tuple[str, cst.BaseExpression, Scope | None]]:
    """Each named value the module sets, with the scope it is set in: keyword arguments
    (`Model(flash_attention=True)`), attributes and names (`cfg.flash_attention = True`) and dict
    entries (`{"attn_impl": "flash"}`)."""
    for call in facts.calls:
        for arg in call.node.args:
            if arg.keyword is not None:
                yield arg.keyword.value, arg.value, call.scope
    for assignment in facts.assignments:
        yield assignment.key.rsplit(".", 1)[-1], assignment.value, assignment.where.scope
    entries = _DictEntries()
    facts.module.visit(entries)  # a pass over the tree, only for a module that mentions flash
    yield from ((key, value, None) for key, value in entries.found)


class _DictEntries(cst.CSTVisitor):
    """Dict entries under a string key (not libcst.matchers, whose import alone takes 0.4 s)."""

    def __init__(self) -> None:
        self.found: list[tuple[str, cst.BaseExpression]] = []

    def visit_DictElement(self, node: cst.DictElement) -> None:
        key = string_literal(node.key)
        if key is not None:
            self.found.append((key, node.value))


def _optional(facts: AmpFacts, statement: cst.CSTNode) -> bool:
    """The statement is in the body of a `try` with a handler (an import that may fail)."""
    return any(isinstance(node, cst.Try) and node.handlers for node in facts.ancestors(statement))


def _opted_into_bfloat16(facts: AmpFacts, region: Autocast, call: CallSite) -> bool:
    """`enabled=use_bfloat16`: the region runs only when a setting asks for bfloat16, so the user
    chose it for their GPU, and turning the setting off is the fallback; also through a name bound
    to such a test (`autocast_enabled = self.bf16_mixed and x.is_cuda`)."""
    switch = region.enabled_when
    if switch is None:
        return False
    written = [switch]
    if isinstance(switch, cst.Name):
        written += [value for value, _ in facts.bindings(switch.value, call.scope)]
    return any(_NAMES_BFLOAT16.search(facts.module.code_for_node(expr)) for expr in written)


def _chosen_by_a_bfloat16_setting(facts: AmpFacts, construction: cst.CSTNode) -> bool:
    """The region is built where a setting that asks for bfloat16 by name chose it: the branch of
    an `if`, a conditional expression or a `match` case on it (open_clip's `elif precision == "amp_bf16": return
    lambda: autocast(dtype=torch.bfloat16)`), or the entry of a table keyed by it (`{"bf16":
    autocast(dtype=torch.bfloat16), "fp16": ...}[args.precision]`). The user chose it for their
    GPU, like `enabled=args.bf16`."""
    inner = construction
    for node in facts.ancestors(construction):  # through a lambda or a nested def too
        if isinstance(node, (cst.If, cst.IfExp)) and inner is node.body:
            condition = facts.module.code_for_node(node.test)
            if _NAMES_BFLOAT16.search(condition) and not _NEGATED.search(condition):
                return True
        if isinstance(node, cst.MatchCase) and inner is node.body:  # `case "amp_bf16":` of `match precision:`
            if _NAMES_BFLOAT16.search(facts.module.code_for_node(node.pattern)):
                return True
        if isinstance(node, cst.DictElement) and inner is node.value:
            return bool(_NAMES_BFLOAT16.search(string_literal(node.key) or ""))
        inner = node
    return False


# `not args.bf16`, `precision != "bf16"`: the branch runs when bfloat16 was not asked for.
_NEGATED = re.compile(r"\bnot\b|!=")


def _named_for_bfloat16(call: CallSite) -> bool:
    """The region is in a function or class named for bfloat16 (`test_backward_under_bf16_autocast`,
    `class TestBF16Training`): it exists to exercise bfloat16, so float16 is no fallback for it."""
    scope = call.scope
    while scope is not None and scope.kind != "module":
        if _NAMES_BFLOAT16.search(scope.name):
            return True
        scope = scope.parent
    return False


def _cuda_region(facts: AmpFacts, call: CallSite):
    region = facts.region_of(call.where)
    if region is None or region[0].device == "cpu":
        return None
    return region


def _names_a_bce_module(facts: AmpFacts, call: CallSite, criteria: set[str]) -> bool:
    """`loss_fn(...)` where `loss_fn` holds a BCELoss: the binding its scope sees (another
    function's `loss_fn` may be a BCEWithLogitsLoss), else, for a criterion handed in as an
    argument, any of the file's BCELoss names."""
    if call.callee.split(".")[-1] not in criteria:
        return False  # every BCELoss binding's name is among them
    bound = facts.constructed(call.callee, call.scope)
    if facts.bindings(call.callee, call.scope):
        return any(built in _BCE_MODULES for _, built in bound)
    return True


def _bce(facts: AmpFacts) -> Iterator[Hit]:
    criteria: set[str] = set()
    for assignment in facts.assignments:
        built = constructor_of(assignment.value)
        if built is not None and facts.qualname(built.func, assignment.where.scope) in _BCE_MODULES:
            criteria.add(assignment.key.split(".")[-1])
    for call in facts.calls:
        direct = call.qualname in _BCE_FUNCTIONS
        called_module = call.callee is not None and _names_a_bce_module(facts, call, criteria)
        inline = isinstance(call.node.func, cst.Call) and facts.qualname(call.node.func.func, call.scope) in _BCE_MODULES
        if not (direct or called_module or inline):
            continue
        region = _cuda_region(facts, call)
        if region is None:
            continue
        yield Hit(
            call.node,
            f"binary cross-entropy (`{dotted_name(call.node.func) or 'BCELoss'}`) inside the autocast region on "
            f"line {{0}}: CUDA autocast refuses it (\"unsafe to autocast\") because float16 probabilities "
            f"lose precision near 0 and 1; use `binary_cross_entropy_with_logits` / `BCEWithLogitsLoss` on "
            f"the logits",
            call.where.statement,
            related=(region[0].node,),
        )
