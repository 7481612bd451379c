"""AMP010 scaler-with-bf16: an enabled GradScaler in code that autocasts (or casts the model) to bfloat16."""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from amplint.static import names
from amplint.static.checks import Hit
from amplint.static.checks import _regions as rg
from amplint.static.semantics import AmpFacts, CallSite, argument, built_disabled, dotted_name, is_false, is_true

CODE = "AMP010"

_FP16_CONDITION = re.compile(r"16|half|fp16|float16|dtype|precision")
_MODEL_NAME = re.compile(r"model|net|module|encoder|decoder|backbone|transformer|policy")


def _enabled_expression(call: CallSite) -> cst.BaseExpression | None:
    return argument(call.node, None, "enabled")


def _scaler_on_fp16_path(facts: AmpFacts, call: CallSite) -> bool:
    enabled = _enabled_expression(call)
    if is_false(enabled):
        return True
    if enabled is not None and not is_true(enabled):
        if _FP16_CONDITION.search(facts.module.code_for_node(enabled)):
            return True  # nanoGPT: GradScaler(enabled=(dtype == torch.float16))
        # `need_scaling = amp_dtype == torch.float16`, then `enabled=need_scaling`
        values = facts.bindings(dotted_name(enabled), call.scope)
        if values and all(_FP16_CONDITION.search(facts.module.code_for_node(value)) for value, _scope in values):
            return True
    return any(_FP16_CONDITION.search(facts.module.code_for_node(g.test)) for g in call.where.ifs)


def _bf16_model(facts: AmpFacts) -> CallSite | None:
    for call in facts.calls:
        bf16 = call.method == "bfloat16" and not call.node.args
        if call.method == "to":
            bf16 = any(
                facts.qualname(a.value, call.scope) in rg.BFLOAT16 for a in call.node.args
            )
        if not bf16:
            continue
        # What the cast converts: the start of the calls that return their module before it
        # (`model.cuda().bfloat16()`, `Net().to(device).bfloat16()`), a model by kind or name.
        converted = rg.chain_below(call)[1]
        if facts.value_kind(converted, call.scope) == "model" or _MODEL_NAME.search(_name_of(converted).lower()):
            return call
    return None


def _name_of(converted: cst.BaseExpression | None) -> str:
    """The last name of a variable or attribute, or of the class a constructor call builds."""
    named = converted.func if isinstance(converted, cst.Call) else converted
    return (dotted_name(named) or "").split(".")[-1]


def _built_only_for_bf16(facts: AmpFacts, call: CallSite) -> tuple[cst.BaseExpression, str] | None:
    """The bfloat16 flag a scaler is built (or enabled) under, when it is on only then, and the
    condition in words: `GradScaler() if use_bfloat16 else None` (I-JEPA's factory), `if
    args.bf16: scaler = GradScaler()`, `GradScaler(enabled=hps.train.bf16_run)` (Bert-VITS2), a
    `case "bf16":` of a `match` on the precision."""
    if built_disabled(call.node):
        return None  # built off: the bfloat16 arm of a precision switch that needs no scaler
    enabled = _enabled_expression(call)
    if enabled is not None and _names_bf16(facts, enabled):
        return enabled, f"`{facts.module.code_for_node(enabled)}` is true"
    child: cst.CSTNode = call.node
    for parent in facts.ancestors(call.node):
        if isinstance(parent, (cst.IfExp, cst.If)) and _BF16_SUPPORT_OR_FP16.search(facts.module.code_for_node(parent.test)):
            return None  # a float16 fallback inside a bfloat16 branch (the GPU lacks it): it needs the scaler
        if isinstance(parent, (cst.IfExp, cst.If)) and child is parent.body and _names_bf16(facts, parent.test):
            return parent.test, f"`{facts.module.code_for_node(parent.test)}` is true"
        if isinstance(parent, cst.MatchCase) and child is parent.body:
            subject = facts.parent_of[id(parent)].subject
            if _case_selects_bf16(facts, subject, parent.pattern):
                code = facts.module.code_for_node
                return subject, f"`{code(subject)}` matches `{code(parent.pattern)}`"
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef)):
            return None
        child = parent
    return None


def _names_bf16(facts: AmpFacts, test: cst.BaseExpression) -> bool:
    """A flag that says bfloat16 (`use_bfloat16`, `args.bf16`), also bound in a walrus, or a test
    of the precision against bfloat16 alone (`args.precision == "bf16"`, `dtype in ("bf16",
    "bfloat16")`); not a negation, nor a flag that names float16 too (`fp16_not_bf16`, VAR's
    `using_fp16_rather_bf16`)."""
    if isinstance(test, cst.NamedExpr):
        return _names_bf16(facts, test.target) or _names_bf16(facts, test.value)
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        operator, right = test.comparisons[0].operator, test.comparisons[0].comparator
        if isinstance(operator, cst.Equal):
            return _is_bf16_value(facts, test.left) or _is_bf16_value(facts, right)
        if isinstance(operator, cst.In) and isinstance(right, (cst.Tuple, cst.List, cst.Set)):
            return bool(right.elements) and all(_is_bf16_value(facts, element.value) for element in right.elements)
        return False
    if not isinstance(test, (cst.Name, cst.Attribute)):
        return False
    return _says_bf16_only(facts.module.code_for_node(test))


def _case_selects_bf16(facts: AmpFacts, subject: cst.BaseExpression, pattern: cst.MatchPattern) -> bool:
    """`case "bf16":` / `case torch.bfloat16:` (or an `|` of such), or `case True:` on a bfloat16 flag."""
    if isinstance(pattern, cst.MatchValue):
        return _is_bf16_value(facts, pattern.value)
    if isinstance(pattern, cst.MatchOr):
        return all(_case_selects_bf16(facts, subject, element.pattern) for element in pattern.patterns)
    if isinstance(pattern, cst.MatchSingleton):
        return is_true(pattern.value) and _names_bf16(facts, subject)
    return False


def _is_bf16_value(facts: AmpFacts, value: cst.BaseExpression) -> bool:
    """A precision literal for bfloat16 alone: `"bf16"`, `"bf16-mixed"`, `torch.bfloat16`."""
    if isinstance(value, cst.SimpleString):
        return _says_bf16_only(value.evaluated_value if isinstance(value.evaluated_value, str) else "")
    return isinstance(value, (cst.Name, cst.Attribute)) and facts.module.code_for_node(value).split(".")[-1] == "bfloat16"


def _says_bf16_only(text: str) -> bool:
    """Names bfloat16, not float16 too, and not its absence (`no_bf16`, `bf16_unsupported`)."""
    return bool(_BF16_FLAG.search(text)) and not _FP16_FLAG.search(text) and not _NEGATED.search(text)


_BF16_FLAG = re.compile(r"bf16|bfloat16", re.IGNORECASE)
_NEGATED = re.compile(r"(?:^|[._])(?:no|not|non|without|disable[ds]?)_|unsupported|not_supported", re.IGNORECASE)
_BF16_SUPPORT_OR_FP16 = re.compile(rg.BF16_SUPPORT_CALL.pattern + r"|fp16|(?<!b)float16|half", re.IGNORECASE)
_FP16_FLAG = re.compile(r"fp16|(?<!b)float16|half", re.IGNORECASE)


def _flag_enables_float16(facts: AmpFacts, flag: cst.BaseExpression) -> bool:
    """The flag turns on a float16 region (`autocast(dtype=torch.float16, enabled=use_bfloat16)`,
    V-JEPA's evaluation): whatever its name says, it means AMP in float16, which the scaler serves."""
    text = facts.module.code_for_node(flag)
    for call, region in rg.autocasts(facts):
        enabled = _enabled_expression(call)
        if enabled is not None and facts.module.code_for_node(enabled) == text and rg.literal_dtype(facts, region, call) in rg.FLOAT16:
            return True
    return False


def check(facts: AmpFacts) -> Iterator[Hit]:
    scalers = [c for c in facts.scalers_in() if c.qualname in names.GRAD_SCALER]
    if not scalers:
        return
    dtypes = _region_dtypes(facts)
    flags = [(call, _built_only_for_bf16(facts, call)) for call in scalers]
    for call, found in flags:
        if found is not None and not _flag_enables_float16(facts, found[0]):
            flag, condition = found
            built = "enabled" if flag is _enabled_expression(call) else "built"
            yield Hit(
                call.node,
                f"this GradScaler is {built} only when {condition}, "
                f"{_bf16_flag_verdict(facts, dtypes, _says_bf16_only(facts.module.code_for_node(flag)))}",
                call.where.statement,
            )
    scalers = [call for call, flag in flags if flag is None]
    bf16_model = _bf16_model(facts)
    if dtypes == {"torch.bfloat16"}:
        reason = "every autocast region in this file uses bfloat16"
    elif bf16_model is not None and not (dtypes & (rg.FLOAT16 | {"unknown"})):
        reason = "the model is converted to bfloat16"
    else:
        return
    setting = rg.dtype_setting(facts)
    # Only a setting the regions read can switch the scaler with them; a literal bfloat16 cannot.
    advice = f"build it with `enabled=({setting} == torch.float16)`" if setting else "drop it (or build it with `enabled=False`)"
    for call in scalers:
        if _scaler_on_fp16_path(facts, call):
            continue
        yield Hit(
            call.node,
            f"this GradScaler is enabled but {reason}: bfloat16 has float32's exponent range and needs "
            f"no loss scaling, so the scaler only adds a sync per step (and fails on bfloat16 "
            f"gradients); {advice}",
            call.where.statement,
        )


def _bf16_flag_verdict(facts: AmpFacts, dtypes: set[str], named: bool) -> str:
    """What a scaler built for a bfloat16 flag (`named`: its name is the evidence) costs. A file
    with no autocast of its own (I-JEPA's optimizer factory, given the flag by its training
    script) has only the condition to go on, and the message says so: a flag named for bfloat16
    has been seen to turn on float16 autocast."""
    if not facts.has_autocast:
        evidence, amend = ("its name says", "rename the flag") if named else ("it says", "correct the condition")
        return (
            f"which {evidence} is for bfloat16 (this file opens no autocast to confirm it); "
            f"bfloat16 needs no loss scaling, so the scaler only adds a sync per step: drop it, or "
            f"{amend} if it turns on float16 autocast"
        )
    if dtypes & (rg.FLOAT16 | {"unknown"}):
        setting = rg.dtype_setting(facts)
        enable = f"`enabled=({setting} == torch.float16)`" if setting else "`enabled=` the condition that selects float16"
        return (
            "that is for bfloat16, which needs no loss scaling; float16 runs, which do, get no scaler; "
            f"build it for float16 ({enable})"
        )
    # Where no region computes in float16, a bfloat16-only scaler is dead weight, not a gap.
    return "that is for bfloat16, which needs no loss scaling; it only adds a sync per step; drop it"


def _region_dtypes(facts: AmpFacts) -> set[str]:
    """The dtypes of the file's enabled autocast regions; "unknown" for one chosen at run time
    or CUDA's default float16."""
    dtypes = set()
    for call, region in rg.autocasts(facts):
        if not rg.enabled(region):
            continue
        possible = rg.possible_dtypes(facts, region, call)
        if possible is None:
            dtypes.add("unknown" if rg.has_dtype_argument(region, call) or region.device != "cpu" else "torch.bfloat16")
        else:
            dtypes |= possible
    return dtypes
