"""The facts one libcst pass records, one behaviour per test."""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from amplint.static.semantics import AmpFacts, children, dotted_name, mutually_exclusive, statement_code

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def facts_of(source: str) -> AmpFacts:
    return AmpFacts(cst.parse_module(textwrap.dedent(source)))


def call(facts: AmpFacts, text: str):
    matches = [c for c in facts.calls if facts.module.code_for_node(c.node).startswith(text)]
    assert matches, text
    return matches[0]


# -- names --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source,text",
    [
        ("import torch\ntorch.cuda.amp.autocast()", "torch.cuda.amp.autocast("),
        ("import torch.cuda.amp as amp\namp.autocast()", "amp.autocast("),
        ("from torch.cuda import amp\namp.autocast()", "amp.autocast("),
        ("from torch.cuda.amp import autocast\nautocast()", "autocast("),
        ("from torch.cuda.amp import autocast as ac\nac()", "ac("),
        ("import torch\ntorch.cuda.amp.autocast_mode.autocast()", "torch.cuda.amp.autocast_mode.autocast("),
        ("from torch.cuda.amp import *\nautocast()", "autocast("),
        ("import torch as T\nT.cuda.amp.autocast()", "T.cuda.amp.autocast("),
    ],
)
def test_deprecated_autocast_resolves_through_every_import_form(source: str, text: str) -> None:
    facts = facts_of(source)
    assert call(facts, text).qualname in {"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"}


def test_function_local_import_resolves_inside_the_function_only() -> None:
    facts = facts_of(
        """
        def f():
            from torch.cuda.amp import GradScaler
            return GradScaler()
        def g():
            return GradScaler()
        """
    )
    inside, outside = [c for c in facts.calls if c.callee == "GradScaler"]
    assert inside.qualname == "torch.cuda.amp.GradScaler"
    assert outside.qualname is None


def test_import_used_before_its_line_still_resolves() -> None:
    facts = facts_of("def f():\n    return torch.autocast('cuda')\nimport torch\n")
    assert call(facts, "torch.autocast").qualname == "torch.autocast"


def test_simple_alias_assignment_resolves() -> None:
    facts = facts_of("import torch\nac = torch.autocast\nac('cuda')\n")
    assert call(facts, "ac(").qualname == "torch.autocast"


def test_relative_import_never_resolves_to_torch() -> None:
    facts = facts_of("from .amp import GradScaler\nGradScaler()\n")
    assert call(facts, "GradScaler(").qualname is None


def test_imports_recorded_with_their_qualified_names() -> None:
    facts = facts_of("from torch.cuda.amp import autocast, GradScaler\nimport torch.cuda.amp as amp\n")
    assert [r.qualname for r in facts.imports] == [
        "torch.cuda.amp.autocast",
        "torch.cuda.amp.GradScaler",
        "torch.cuda.amp",
    ]


def test_strings_and_comments_are_not_references() -> None:
    facts = facts_of('import torch\n# torch.cuda.amp.autocast()\nx = "torch.cuda.amp.GradScaler"\n')
    assert not [r for r in facts.references if "amp" in r.dotted]
    assert not facts.calls


# -- autocast regions ------------------------------------------------------------------------------


def region_at(facts: AmpFacts, text: str):
    return facts.region_of(call(facts, text).where)


def test_with_autocast_is_a_region() -> None:
    facts = facts_of("import torch\nwith torch.autocast('cuda'):\n    loss.backward()\n")
    region, via = region_at(facts, "loss.backward")
    assert region.enabled == "yes" and region.device == "cuda" and via is None


def test_literal_enabled_false_is_not_a_region() -> None:
    facts = facts_of(
        "import torch\nwith torch.autocast('cuda'):\n    with torch.autocast('cuda', enabled=False):\n        loss.backward()\n"
    )
    assert region_at(facts, "loss.backward") is None


def test_autocast_left_of_an_and_opens_no_region() -> None:
    """stable-audio-tools' `with torch.cuda.amp.autocast() and torch.no_grad():` enters only
    `no_grad()` (an autocast object is true), so no rule may take it for a region."""
    facts = facts_of("import torch\nwith torch.autocast('cuda') and torch.no_grad():\n    loss.backward()\n")
    assert region_at(facts, "loss.backward") is None
    assert not facts.has_autocast


def test_autocast_right_of_an_and_or_left_of_an_or_is_entered() -> None:
    for item in ("torch.no_grad() and torch.autocast('cuda')", "torch.autocast('cuda') or nullcontext()"):
        assert facts_of(f"import torch\nwith {item}:\n    loss.backward()\n").has_autocast, item


def test_dynamic_enabled_flag_is_maybe() -> None:
    facts = facts_of("import torch\nwith torch.autocast('cuda', enabled=amp):\n    loss.backward()\n")
    assert region_at(facts, "loss.backward")[0].enabled == "maybe"


def test_deprecated_positional_enabled_false() -> None:
    facts = facts_of("import torch\nwith torch.cuda.amp.autocast(False):\n    loss.backward()\n")
    assert region_at(facts, "loss.backward") is None


def test_context_in_variable() -> None:
    facts = facts_of("import torch\nctx = torch.autocast('cuda')\nwith ctx:\n    loss.backward()\n")
    assert region_at(facts, "loss.backward") is not None


def test_conditional_context_is_maybe() -> None:
    facts = facts_of(
        "import torch, contextlib\nctx = contextlib.nullcontext() if cpu else torch.amp.autocast('cuda')\n"
        "with ctx:\n    loss.backward()\n"
    )
    assert region_at(facts, "loss.backward")[0].enabled == "maybe"


def test_context_in_self_attribute() -> None:
    facts = facts_of(
        """
        import torch
        class T:
            def __init__(self):
                self.amp_ctx = torch.autocast("cuda")
            def step(self):
                with self.amp_ctx:
                    loss.backward()
        """
    )
    assert region_at(facts, "loss.backward") is not None


def test_nullcontext_alone_is_no_region() -> None:
    facts = facts_of("import contextlib\nctx = contextlib.nullcontext()\nwith ctx:\n    loss.backward()\n")
    assert region_at(facts, "loss.backward") is None


def test_decorator_opens_a_region() -> None:
    facts = facts_of("import torch\n@torch.autocast('cuda')\ndef step():\n    loss.backward()\n")
    assert region_at(facts, "loss.backward") is not None


def test_partial_autocast_points_at_the_partial_call() -> None:
    facts = facts_of(
        "import functools, torch\nac = functools.partial(torch.autocast, 'cuda')\nwith ac():\n    loss.backward()\n"
    )
    region, _ = region_at(facts, "loss.backward")
    assert dotted_name(region.node.func) == "functools.partial"


def test_a_region_passed_to_a_parameter_opens_where_the_parameter_is_entered() -> None:
    facts = facts_of(
        """
        import functools, contextlib, torch
        def train(model, loader, amp_autocast=contextlib.suppress):
            with amp_autocast():
                loss.backward()
        def main(args):
            amp_autocast = contextlib.suppress
            if args.amp:
                amp_autocast = functools.partial(torch.autocast, "cuda")
            train(model, loader, amp_autocast=amp_autocast)
        """
    )
    region, via = region_at(facts, "loss.backward")
    assert region.enabled == "maybe" and region.device == "cuda" and via is None


def test_a_parameter_only_ever_given_a_no_op_context_opens_no_region() -> None:
    facts = facts_of(
        """
        import contextlib
        def train(model, amp_autocast=contextlib.suppress):
            with amp_autocast():
                loss.backward()
        train(model)
        train(model, contextlib.nullcontext)
        """
    )
    assert region_at(facts, "loss.backward") is None


@pytest.mark.parametrize(
    "definition,call,passed",
    [
        ("def f(a, ctx): pass", "f(1, region)", "region"),
        ("def f(a, ctx): pass", "f(1, ctx=region)", "region"),
        ("def f(a, *, ctx=None): pass", "f(1, ctx=region)", "region"),
        ("class C:\n    def f(self, ctx): pass\n    def g(self): self.f(region)", "self.f(region)", "region"),
        ("class C:\n    @staticmethod\n    def f(ctx): pass\n    def g(self): self.f(region)", "self.f(region)", "region"),
        ("def f(a, ctx): pass", "f(*args)", None),
    ],
)
def test_what_a_call_passes_for_a_parameter(definition: str, call: str, passed: str | None) -> None:
    facts = facts_of(f"{definition}\n{call}\n" if not call.startswith("self.") else f"{definition}\n")
    (function,) = [f for f in facts.functions if f.name == "f"]
    values = [facts.module.code_for_node(value) if value is not None else None for _, value in facts.passed_for(function, "ctx")]
    assert values == [passed]


def test_a_call_through_a_name_bound_to_either_of_two_functions_calls_both() -> None:
    facts = facts_of(
        """
        def train_a(loader):
            pass
        def train_b(loader):
            pass
        def run(flag, loader):
            train = train_a if flag else train_b
            train(loader)
        """
    )
    site = call(facts, "train(loader)")
    assert [f.name for f in facts.called_functions(site)] == ["train_a", "train_b"]
    assert all(facts.callers(f) == [site] for f in facts.functions if f.name.startswith("train_"))


def test_region_reaches_functions_called_inside_it() -> None:
    facts = facts_of(
        "import torch\ndef helper():\n    loss.backward()\nwith torch.autocast('cuda'):\n    helper()\n"
    )
    region, via = region_at(facts, "loss.backward")
    assert via is not None and via.callee == "helper"


def test_statement_after_the_block_is_outside() -> None:
    facts = facts_of("import torch\nwith torch.autocast('cuda'):\n    loss = f()\nloss.backward()\n")
    assert region_at(facts, "loss.backward") is None


def test_multi_item_with() -> None:
    facts = facts_of("import torch\nwith torch.no_grad(), torch.autocast('cuda'):\n    loss.backward()\n")
    assert region_at(facts, "loss.backward") is not None


# -- loops and the call graph ---------------------------------------------------------------------


def test_loop_chain_goes_through_callers() -> None:
    facts = facts_of(
        """
        def run_epoch(scaler):
            for batch in loader:
                scaler.step(opt)
        for epoch in range(3):
            run_epoch(s)
        """
    )
    chain = facts.loop_chain(call(facts, "scaler.step").where)
    assert [loop.target for loop in chain] == ["epoch", "batch"]


def test_enclosing_loops_innermost_first_with_the_call_site() -> None:
    facts = facts_of("def build():\n    return make()\nfor fold in folds:\n    for epoch in r:\n        build()\n")
    loops = facts.enclosing_loops(call(facts, "make(").where)
    assert [loop.target for loop, _ in loops] == ["epoch", "fold"]
    assert loops[0][1].callee == "build"


def test_comprehension_is_not_an_enclosing_loop() -> None:
    facts = facts_of("import torch\nscalers = [torch.amp.GradScaler() for _ in range(3)]\n")
    assert facts.enclosing_loops(call(facts, "torch.amp.GradScaler").where) == []


def test_loop_text_leaves_out_strings() -> None:
    facts = facts_of("for batch in tqdm(loader, desc='fold 1'):\n    f()\n")
    loop = call(facts, "f(").where.loops[0]
    assert "fold" not in loop.text and "loader" in loop.text


def test_method_calls_resolve_within_the_class() -> None:
    facts = facts_of(
        """
        class A:
            def step(self):
                self.helper()
            def helper(self):
                pass
        class B:
            def helper(self):
                pass
        """
    )
    target = facts.called_function(call(facts, "self.helper"))
    assert target is not None and target.class_name == "A"


def test_imported_name_is_not_an_in_file_call() -> None:
    facts = facts_of("from lib import helper\ndef helper():\n    pass\nhelper()\n")
    assert facts.called_function(call(facts, "helper(")) is None


def test_calls_recorded_in_evaluation_order() -> None:
    facts = facts_of("scaler.scale(loss).backward()\n")
    assert [c.method for c in facts.calls] == ["scale", "backward"]


# -- scalers, optimizers, branches, statements ------------------------------------------------------


def test_scaler_identified_by_construction_and_by_use() -> None:
    facts = facts_of(
        "import torch\ns = torch.amp.GradScaler()\nother.scale(loss).backward()\nother.unscale_(opt)\n"
    )
    scope = facts.module_scope
    assert facts.is_scaler("s", scope) and facts.is_scaler("other", scope)
    assert not facts.is_scaler("opt", scope)


def test_disabled_scaler_needs_a_literal_false() -> None:
    facts = facts_of("import torch\na = torch.amp.GradScaler(enabled=False)\nb = torch.amp.GradScaler(enabled=fp16)\n")
    assert facts.scaler_disabled("a", facts.module_scope)
    assert not facts.scaler_disabled("b", facts.module_scope)


def test_optimizer_identified_by_constructor_and_by_scaler_step() -> None:
    facts = facts_of("import torch\nadam = torch.optim.Adam(p)\nscaler.step(gen)\nscaler.scale(l).backward()\n")
    assert facts.is_optimizer("adam", facts.module_scope)
    assert facts.is_optimizer("gen", facts.module_scope)
    assert not facts.is_optimizer("lr_scheduler", facts.module_scope)


def test_if_and_else_branches_are_mutually_exclusive() -> None:
    facts = facts_of("if amp:\n    a()\nelse:\n    b()\nc()\n")
    a, b, c = (call(facts, n).where for n in ("a(", "b(", "c("))
    assert mutually_exclusive(a, b)
    assert not mutually_exclusive(a, c) and not mutually_exclusive(b, c)


@pytest.mark.parametrize("leave", ["return", "raise StopIteration", "continue", "break"])
def test_an_if_that_always_leaves_excludes_what_follows_it_in_its_block(leave: str) -> None:
    facts = facts_of(f"""
        def f(fast):
            for x in y:
                before()
                if fast:
                    a()
                    {leave}
                b()
            after()
    """)
    before, a, b, after = (call(facts, n).where for n in ("before(", "a(", "b(", "after("))
    assert mutually_exclusive(a, b)
    assert not mutually_exclusive(before, a) and not mutually_exclusive(before, b)
    assert not mutually_exclusive(a, after) and not mutually_exclusive(b, after)  # past the block


def test_an_if_that_may_fall_through_excludes_nothing() -> None:
    facts = facts_of("for x in y:\n    if fast:\n        a()\n        if done:\n            break\n    b()\n")
    assert not mutually_exclusive(call(facts, "a(").where, call(facts, "b(").where)


@pytest.mark.parametrize(
    "first,second",
    [
        ("if args.fp16:\n    a()", "if args.fp16:\n    pass\nelse:\n    b()"),
        ("if args.fp16:\n    a()", "if not args.fp16:\n    b()"),
        ("if scaler is None:\n    a()", "if scaler is not None:\n    b()"),
        ("if mode == 'amp':\n    a()", "if mode != 'amp':\n    b()"),
        ("if args.fp16 and args.amp == 'native':\n    a()", "if args.fp16:\n    if args.amp == 'native':\n        pass\n    else:\n        b()"),
        ("if (use_amp):\n    a()", "if use_amp or debug:\n    pass\nelse:\n    b()"),
        ("if (last := i % 4 == 0):\n    a()", "if not last:\n    b()"),
        ("if use_amp and warm:\n    a()", "if use_amp and warm:\n    pass\nelse:\n    b()"),
        ("if fp16:\n    if amp == 'pt':\n        a()", "if fp16 and amp == 'pt':\n    pass\nelse:\n    b()"),
        ("if fp16:\n    if amp == 'pt':\n        a()", "if not (fp16 and amp == 'pt'):\n    b()"),
        ("if fp16:\n    if not apex:\n        a()", "if fp16 and not apex:\n    pass\nelse:\n    b()"),
    ],
)
def test_two_ifs_on_opposite_outcomes_of_one_condition_contradict(first: str, second: str) -> None:
    facts = facts_of(f"{first}\n{second}\n")
    assert facts.contradictory([call(facts, "a(").where], [call(facts, "b(").where])


@pytest.mark.parametrize(
    "first,second",
    [
        ("if args.fp16:\n    a()", "if args.fp16:\n    b()"),
        ("if args.fp16:\n    a()", "if args.bf16:\n    pass\nelse:\n    b()"),
        ("if use_amp:\n    a()", "if use_amp and warm:\n    pass\nelse:\n    b()"),
        ("if use_amp:\n    a()", "if not (use_amp and warm):\n    b()"),
        ("if use_amp or debug:\n    a()", "if not use_amp:\n    b()"),
    ],
)
def test_ifs_that_can_both_hold_do_not_contradict(first: str, second: str) -> None:
    facts = facts_of(f"{first}\n{second}\n")
    assert not facts.contradictory([call(facts, "a(").where], [call(facts, "b(").where])


def test_a_helper_event_meets_the_conditions_of_its_call_site_and_its_own() -> None:
    facts = facts_of("""
        def helper():
            if use_amp:
                a()

        if ready:
            helper()
        if not ready:
            b()
    """)
    site, inner = call(facts, "helper(").where, call(facts, "a(").where
    assert facts.contradictory([site, inner], [call(facts, "b(").where])
    assert not facts.contradictory([inner], [call(facts, "b(").where])


@pytest.mark.parametrize(
    "source,failed",
    [
        ("if not self.is_in_train:\n    a()", {"self.is_in_train"}),
        ("if ready:\n    pass\nelse:\n    a()", {"ready"}),
        ("if not in_train and args.fp16:\n    a()", {"in_train"}),
        ("if scaler is not None:\n    a()", {"scaler is None"}),
        ("if ready or warm:\n    a()", set()),
    ],
)
def test_failed_conditions_are_those_every_path_to_the_code_fails(source: str, failed: set[str]) -> None:
    facts = facts_of(source)
    assert facts.failed_conditions(call(facts, "a(").where) == failed


def test_statement_code_leaves_out_comments() -> None:
    module = cst.parse_module("# p.grad.norm()\nx = 1  # p.grad.norm()\n")
    assert statement_code(module.body[0]) == "x = 1"


def test_method_on_result() -> None:
    facts = facts_of("emb.half().cpu()\n")
    assert facts.method_on_result(call(facts, "emb.half")) == "cpu"


def test_module_classes_through_bases() -> None:
    facts = facts_of("import torch.nn as nn\nclass A(nn.Module):\n    pass\nclass B(A):\n    pass\nclass C:\n    pass\n")
    assert facts.is_module_class("A") and facts.is_module_class("B") and not facts.is_module_class("C")


# -- the walk -----------------------------------------------------------------------------------

# What the facts walk leaves out: whitespace, comments, brackets and punctuation.
_LAYOUT = (
    cst.BaseParenthesizableWhitespace, cst.TrailingWhitespace, cst.EmptyLine, cst.Comment, cst.Newline,
    cst.LeftParen, cst.RightParen, cst.LeftSquareBracket, cst.RightSquareBracket, cst.LeftCurlyBrace,
    cst.RightCurlyBrace, cst.Comma, cst.Dot, cst.Colon, cst.Semicolon, cst.AssignEqual, cst.Asynchronous,
    cst.BaseBinaryOp, cst.BaseBooleanOp, cst.BaseCompOp, cst.BaseUnaryOp, cst.BaseAugOp,
)


def _walked(node: cst.CSTNode) -> list[cst.CSTNode]:
    found = [node]
    for child in children(node):
        found.extend(_walked(child))
    return found


@pytest.mark.parametrize(
    "path",
    # Every fixture that parses (AMP000's do not) and a file of every construct.
    [FIXTURES / "syntax" / "every_construct.py", *(p for p in sorted((FIXTURES / "static").glob("AMP*/*.py")) if p.parent.name != "AMP000")],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_walk_visits_the_nodes_libcst_visits_in_the_same_order(path: Path) -> None:
    """The facts are recorded in program order: the walk must meet every node that is not
    layout exactly where libcst's own visitor does."""
    module = cst.parse_module(path.read_text(encoding="utf-8"))
    visited: list[cst.CSTNode] = []

    class Order(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            visited.append(node)
            return True

    module.visit(Order())
    expected = [type(n).__name__ for n in visited if not isinstance(n, _LAYOUT)]
    assert [type(n).__name__ for n in _walked(module)] == expected
    assert [id(n) for n in _walked(module)] == [id(n) for n in visited if not isinstance(n, _LAYOUT)]
