"""Property-based tests: check never crashes; fix output always re-parses and is a fixed point.

Two sources of programs: hypothesmith (any valid Python, which rarely mentions AMP), and AMP
programs assembled from deprecated-API, scaler, clip and autocast snippets in random order,
aliases, argument lists, nesting, line endings and a BOM, so that fixes really fire.
"""

from __future__ import annotations

import ast

import hypothesmith
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from amplint.config import Settings
from amplint.model import Finding
from amplint.static.analyse import parse
from amplint.static.api import lint_source
from amplint.static.fixes import fix_source
from amplint.static.runner import all_codes, check_stdin
from amplint.static.source import SourceError

BOUNDED = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])

IMPORTS = [
    "import torch",
    "import torch.cuda.amp",
    "from torch.cuda.amp import autocast, GradScaler",
    "from torch.cuda.amp import autocast as ac, GradScaler as GS",
    "import torch.cuda.amp as amp",
    "from torch.cuda import amp",
    "from torch.cpu.amp import autocast as cpu_autocast",
    "from torch.cuda.amp import custom_fwd, custom_bwd",
    "from torch.amp import GradScaler as NewScaler",
]
ARGS = ["", "True", "False", "enabled=False", "dtype=torch.float16", "True, torch.bfloat16", "True, torch.float16, False",
        "enabled=True, dtype=torch.bfloat16, cache_enabled=False", "*args", "**kwargs", "True,", "# c\n    True"]
CALLEES = ["torch.cuda.amp.autocast", "torch.cpu.amp.autocast", "autocast", "ac", "amp.autocast", "cpu_autocast", "torch.autocast"]
SCALERS = ["torch.cuda.amp.GradScaler", "GradScaler", "GS", "amp.GradScaler", "torch.cpu.amp.GradScaler", "NewScaler"]
BODIES = [
    "y = model(x)",
    "loss = model(x).sum()\nloss.backward()",
    "scaler.scale(loss).backward()",
    "x = x.half()",
    "pass",
]
DECORATED = [
    "@torch.cuda.amp.custom_fwd\ndef fwd(ctx, x):\n    return x",
    "@torch.cuda.amp.custom_fwd(cast_inputs=torch.float32)\ndef fwd2(ctx, x):\n    return x",
    "@custom_bwd\ndef bwd(ctx, g):\n    return g",
    "class Sub(torch.cuda.amp.GradScaler):\n    pass",
]
TRAINING = (
    "for batch in data:\n"
    "    optimizer.zero_grad()\n"
    "    with {callee}({args}):\n"
    "        loss = model(batch).sum()\n"
    "    scaler.scale(loss).backward()\n"
    "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
    "    scaler.step(optimizer)\n"
    "    scaler.update()"
)


def _indent(text: str, level: int) -> str:
    return "\n".join(("    " * level + line) if line else line for line in text.splitlines())


@st.composite
def amp_programs(draw) -> bytes:
    lines = draw(st.lists(st.sampled_from(IMPORTS), min_size=1, max_size=4))
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["with", "scaler", "decorated", "training", "state", "noqa"]))
        if kind == "with":
            body = _indent(draw(st.sampled_from(BODIES)), 1)
            snippet = f"with {draw(st.sampled_from(CALLEES))}({draw(st.sampled_from(ARGS))}):\n{body}"
        elif kind == "scaler":
            snippet = f"scaler = {draw(st.sampled_from(SCALERS))}({draw(st.sampled_from(['', 'init_scale=2.0**16', 'enabled=use_amp']))})"
        elif kind == "decorated":
            snippet = draw(st.sampled_from(DECORATED))
        elif kind == "training":
            snippet = TRAINING.format(callee=draw(st.sampled_from(CALLEES)), args=draw(st.sampled_from(ARGS)))
        elif kind == "state":
            snippet = f"d = torch.{draw(st.sampled_from(['get_autocast_gpu_dtype', 'is_autocast_cpu_enabled', 'set_autocast_gpu_dtype']))}({draw(st.sampled_from(['', 'torch.float16']))})"
        else:
            snippet = f"s2 = torch.cuda.amp.GradScaler()  # noqa{draw(st.sampled_from(['', ': AMP001', ': AMP003']))}"
        if draw(st.booleans()):
            snippet = f"def step_{len(lines)}(model, x, data, optimizer, scaler, loss, args, kwargs, use_amp):\n{_indent(snippet, 1)}"
        lines.append(snippet)
    text = "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n\n# trailing comment\n"]))
    if draw(st.booleans()):
        text = text.replace("\n", "\r\n")
    data = text.encode("utf-8")
    return (b"\xef\xbb\xbf" + data) if draw(st.booleans()) else data


def _parses(source: bytes) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return True


def _libcst_parses(source: bytes) -> bool:
    try:
        parse(source.decode("utf-8-sig"))
    except (SourceError, UnicodeDecodeError):
        return False
    return True


def _assert_fix_properties(source: bytes) -> None:
    codes = all_codes()
    first = fix_source(source, "prop.py", codes, True)
    assert isinstance(first.source, bytes)
    if _parses(source):
        assert _parses(first.source), first.source.decode("utf-8", "replace")
    if _libcst_parses(source):  # CPython and libcst disagree on a few inputs (`A\n\\\r\n`)
        parse(first.source.decode("utf-8-sig"))
    if first.applied:
        assert first.source.startswith(b"\xef\xbb\xbf") == source.startswith(b"\xef\xbb\xbf")
        assert (b"\r\n" in first.source) == (b"\r\n" in source)
    second = fix_source(first.source, "prop.py", codes, True)
    assert second.source == first.source, "a second fix changed the output"
    assert second.applied == 0
    assert [f for f in second.remaining if f.fix is not None] == [], "a fixable finding survived the fix"


@BOUNDED
@given(hypothesmith.from_grammar())
def test_check_never_crashes_on_any_python(source: str) -> None:
    findings = lint_source(source, "any.py")
    assert all(isinstance(f, Finding) for f in findings)
    gated = check_stdin(source.encode("utf-8"), "any.py", Settings()).findings
    assert all(f.line >= 1 and f.column >= 1 for f in gated)


@BOUNDED
@given(hypothesmith.from_grammar())
@example("A\n\\\r\n")  # CPython reads it, libcst does not: found by this test
def test_fix_properties_on_any_python(source: str) -> None:
    _assert_fix_properties(source.encode("utf-8"))


@BOUNDED
@given(amp_programs())
def test_check_never_crashes_on_amp_programs(source: bytes) -> None:
    findings = lint_source(source, "amp.py")
    assert _parses(source) is not any(f.code == "AMP000" for f in findings)
    for finding in findings:
        assert 1 <= finding.line <= finding.end_line
        if finding.fix is not None:
            assert finding.fix.edits


@BOUNDED
@given(amp_programs())
def test_fix_properties_on_amp_programs(source: bytes) -> None:
    _assert_fix_properties(source)


@settings(max_examples=60, deadline=None)
@given(amp_programs())
def test_safe_fixing_leaves_no_safe_fix_and_untouched_files_without_fixes(source: bytes) -> None:
    before = lint_source(source, "amp.py")
    fixed = fix_source(source, "amp.py", all_codes(), False)
    remaining = lint_source(fixed.source, "amp.py")
    assert not [f for f in remaining if f.fix is not None and f.fix.applicability.value == "safe"]
    if not any(f.fix is not None for f in before):
        assert fixed.source == source


# --- the code view used by the large-file gate ------------------------------------------------------

def test_a_lone_carriage_return_ends_a_comment_in_the_code_view_as_in_cpython() -> None:
    """CPython's parser reads `#\r0` as a comment, then the code `0` (tokenize does not)."""
    from amplint.static.slicing import _code_view

    source = "\n#\r0\n#"
    assert isinstance(ast.parse(source).body[0], ast.Expr)
    assert _code_view(source) == b"\n \r0\n "


@BOUNDED
@given(hypothesmith.from_grammar())
def test_code_view_blanks_exactly_the_comments_and_plain_strings(source: str) -> None:
    """Whatever the program: lines and lengths stay, code tokens are untouched, every comment and
    every non-f string literal is blank."""
    import io
    import tokenize

    from amplint.static.slicing import _code_view

    try:
        ast.parse(source)
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (SyntaxError, ValueError, tokenize.TokenError, IndentationError):
        return
    data = source.encode("utf-8")
    view = _code_view(source)
    assert len(view) == len(data)
    assert [i for i, b in enumerate(view) if b in b"\r\n"] == [i for i, b in enumerate(data) if b in b"\r\n"]
    lines = source.splitlines(keepends=True) if "\x0c" not in source and "\x0b" not in source else None
    if lines is None or any(ch in source for ch in "\x1c\x1d\x1e\x85\u2028\u2029"):
        return  # token positions are per physical line; other separators would shift them
    if "\r" in source.replace("\r\n", ""):
        # A lone CR: tokenize keeps `#\r0` as one comment, CPython's parser (and the view, as
        # libcst) ends the line there and reads `0` as code. The oracle would be wrong.
        return
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line.encode("utf-8")))

    def span(token) -> bytes:
        (row, col), (end_row, end_col) = token.start, token.end
        start = offsets[row - 1] + len(lines[row - 1][:col].encode("utf-8"))
        end = offsets[end_row - 1] + len(lines[end_row - 1][:end_col].encode("utf-8"))
        return view[start:end]

    for token in tokens:
        if token.type not in (tokenize.COMMENT, tokenize.STRING, tokenize.NAME, tokenize.NUMBER, tokenize.OP):
            continue
        text = span(token)
        if token.type == tokenize.COMMENT:
            assert text.strip() == b"", token
        elif token.type == tokenize.STRING:
            prefix = token.string[: len(token.string) - len(token.string.lstrip("rRbBuUfF"))]
            if "f" in prefix.lower():
                assert text == token.string.encode("utf-8"), token
            else:
                assert text.strip() == b"", token
        elif token.type in (tokenize.NAME, tokenize.NUMBER, tokenize.OP):
            assert text == token.string.encode("utf-8"), token
