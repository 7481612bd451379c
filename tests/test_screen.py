"""The screens on CPython's tree never hide a finding, and keep libcst away from files they rule out."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from amplint.catalogue import catalogue, code_examples
from amplint.static import analyse
from amplint.static.analyse import analyse_source
from amplint.static.screen import PRECONDITIONS, Screen
from amplint.static.slicing import _code_view
from amplint.static.source import decode_source

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "static"


def _screen(source: str) -> Screen:
    return Screen(source, _code_view(source))


def _kept(source: str, code: str) -> bool:
    return code in _screen(source).possible(frozenset({code}))


def _flagged_fixtures() -> list[tuple[str, Path]]:
    cases = []
    for path in sorted(FIXTURES.glob("AMP0[0-9][0-9]/*.py")):
        words = path.with_suffix(".expected").read_text(encoding="utf-8").split()
        cases.extend((code, path) for code in sorted(set(words[0::2])) if code in PRECONDITIONS)
    return cases


@pytest.mark.parametrize("code,path", _flagged_fixtures(), ids=lambda v: v if isinstance(v, str) else f"{v.parent.name}/{v.name}")
def test_a_flagged_fixture_passes_its_rules_screen(code: str, path: Path) -> None:
    text, _encoding = decode_source(path.read_bytes())
    try:
        ast.parse(text)
    except SyntaxError:
        pytest.skip("CPython cannot parse it: every rule is kept for libcst")
    assert _kept(text, code)


@pytest.mark.parametrize(
    "code,source",
    [(r.code, s) for r in catalogue().values() if r.code in PRECONDITIONS for s in code_examples(r, "Example")],
    ids=lambda v: v if str(v).startswith("AMP") else "",
)
def test_a_rule_example_passes_its_rules_screen(code: str, source: str) -> None:
    assert _kept(source, code)


@pytest.mark.parametrize(
    "source",
    [
        "with torch.autocast('cuda'):\n    pass\n",
        "from torch.cuda.amp import autocast as ac\nwith ac():\n    pass\n",
        "ac = torch.autocast\nwith ac('cuda'):\n    pass\n",
        "import functools\nctx = functools.partial(torch.autocast, 'cuda')\nwith ctx():\n    pass\n",
        "class T:\n    def __init__(self):\n        self.amp = torch.autocast\n    def run(self):\n        with self.amp('cuda'):\n            pass\n",
        "@torch.autocast('cuda')\ndef f():\n    pass\n",
        "@autocast\ndef f():\n    pass\n",
        "def amp_ctx():\n    return torch.autocast('cuda')\n",
        "first = torch.autocast\nsecond = first\nwith second('cuda'):\n    pass\n",
        "def step(ctx):\n    with ctx():\n        pass\nstep(ctx=functools.partial(torch.autocast, 'cuda'))\n",
        "def step(batch, ctx):\n    with ctx():\n        pass\nstep(x, torch.autocast)\n",
        "class T:\n    def step(self, ctx):\n        with ctx():\n            pass\n    def fit(self):\n        self.step(torch.autocast)\n",
        "def step(ctx=torch.autocast):\n    with ctx('cuda'):\n        pass\n",
        "def get_autocast(p):\n    return torch.autocast if p else contextlib.suppress\nwith get_autocast(1)('cuda'):\n    pass\n",
    ],
)
def test_every_way_of_opening_autocast_opens_autocast(source: str) -> None:
    assert _screen(source).opens_autocast


@pytest.mark.parametrize(
    "source",
    [
        "if isinstance(mode, torch.amp.autocast_mode.autocast):\n    pass\n",
        "SUPPORTED = {torch.autocast, torch.cuda.amp.autocast}\n",
        "torch._C._autocast_increment_nesting()\n",
        "# with torch.autocast('cuda'):\nmessage = 'use torch.autocast(...)'\n",
        "def step(ctx=contextlib.suppress):\n    with ctx():\n        pass\nstep(ctx=contextlib.nullcontext)\n",
    ],
)
def test_naming_autocast_without_entering_it_opens_nothing(source: str) -> None:
    assert not _screen(source).opens_autocast


@pytest.mark.parametrize(
    ("source", "constructs"),
    [
        ("scaler = torch.amp.GradScaler('cuda')\n", True),
        ("from torch.cuda.amp import GradScaler as GS\nscaler = GS()\n", True),
        ("SCALERS = (torch.amp.GradScaler,)\n", False),
        ("def f(scaler: 'GradScaler'):\n    scaler.step(opt)\n", False),
    ],
)
def test_a_scaler_is_constructed_only_when_called(source: str, constructs: bool) -> None:
    assert _screen(source).constructs_scaler is constructs


@pytest.mark.parametrize(
    ("source", "mentions"),
    [
        ("def step(model, loss_scaler):\n    pass\n", True),
        ("build_scaler()\n", True),
        ("scaler = timm.utils.NativeScaler()\n", True),
        # An assigned name or a receiver may hold scikit-learn's feature scaler: left to the facts.
        ("scaler = make()\n", False),
        ("self.grad_scaler = None\n", False),
        ("scaler = StandardScaler()\nx = scaler.fit_transform(x)\n", False),
        ("# a scaler\nx = 'scaler'\n", False),
        ("a, *scaler = 1, 2\n", False),  # a starred target: left to the facts, the screen stays sure
    ],
)
def test_a_scaler_is_surely_mentioned_only_by_names_the_facts_record(source: str, mentions: bool) -> None:
    assert _screen(source).surely_mentions_scaler is mentions


@pytest.mark.parametrize(
    ("source", "owned"),
    [
        ("import lightning.pytorch as pl\n", True),
        ("from accelerate import Accelerator\n", True),
        ("from accelerate import *\n", False),  # the facts do not record star imports
        ("from .accelerate import helper\n", False),
    ],
)
def test_a_framework_is_surely_in_charge_only_when_imported_by_name(source: str, owned: bool) -> None:
    assert _screen(source).surely_framework_owned is owned


def test_a_function_subclass_is_seen_through_an_alias() -> None:
    assert _screen("from torch.autograd import Function as F\nclass Op(F):\n    pass\n").subclasses_function
    assert not _screen("class Op(torch.nn.Module):\n    pass\n").subclasses_function


def test_amp009_is_screened_out_where_a_scaler_is_mentioned() -> None:
    source = "def train(scaler):\n    with torch.autocast('cuda'):\n        loss = model(x)\n    loss.backward()\n"
    assert not _kept(source, "AMP009")
    assert _kept(source.replace("scaler", "opt"), "AMP009")


def test_a_module_that_only_lists_autocast_never_reaches_libcst(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(text: str):
        raise AssertionError("libcst was asked to parse a screened-out file")

    monkeypatch.setattr(analyse, "parse", refuse)
    source = "import torch\nCONTEXTS = {torch.autocast: 'amp'}\n\ndef backward(x):\n    return x.step()\n"
    assert analyse_source(source, "table.py") == []


@pytest.mark.parametrize(
    ("source", "disables"),
    [
        ("with torch.autocast('cuda', enabled=False):\n    pass\n", True),
        ("with torch.cuda.amp.autocast(False):\n    pass\n", True),
        ("off = functools.partial(torch.autocast, 'cuda', enabled=False)\n", True),
        ("with torch.autocast('cuda', enabled=use_amp):\n    pass\n", False),
        ("with torch.autocast('cuda'):\n    run(strict=False)\n", False),
    ],
)
def test_amp014_needs_autocast_called_with_a_literal_false(source: str, disables: bool) -> None:
    assert _screen(source).disables_autocast is disables


@pytest.mark.parametrize(
    ("source", "calls"),
    [
        ("scaler.scale(loss).backward()\n", True),
        ("torch.autograd.backward(loss)\n", True),
        ("from torch.autograd import backward as bw\nbw(loss)\n", True),
        ("def backward(ctx, grad):\n    return grad\n", False),
        ("graph = trace_backward_graph(fn)\n", False),
    ],
)
def test_a_backward_call_is_a_call_not_a_word(source: str, calls: bool) -> None:
    assert _screen(source).calls_backward is calls


@pytest.mark.parametrize(
    ("source", "called", "not_called"),
    [
        ("fast = torch.compile(model)\n", "fast", "model"),
        ("run(torch.compile(model))\n", "model", "run"),
        ("model.compile()\n", "model", "compile"),
        ("fast = torch._dynamo.optimize(model)\n", "fast", "model"),
    ],
)
def test_compiled_models_are_named_as_amp017_calls_them(source: str, called: str, not_called: str) -> None:
    names = _screen(source).compiled_names
    assert called in names and not_called not in names


def test_a_compiled_function_may_be_called_by_any_name() -> None:
    assert _screen("@torch.compile(mode='max-autotune')\ndef f(x):\n    return x\n").compiled_names is None


@pytest.mark.parametrize(
    ("source", "uses"),
    [
        ("def is_autocast_cpu_enabled() -> bool: ...\nclass GradScaler: ...\n", False),  # a stub defines them
        ("enabled = torch.is_autocast_cpu_enabled()\n", True),
        ("from torch.cuda.amp import autocast as ac\n", True),
        ("# torch.cuda.amp.GradScaler is deprecated\n", False),
        ("from torch import amp as amp\nwith torch.autocast('cuda'):\n    pass\n", False),  # the replacement API
        ("scaler = torch.amp.GradScaler('cuda')\n", False),
        ("import torch.cuda as tc\nwith tc.amp.autocast():\n    pass\n", True),
        ("from torch.cuda import amp\nscaler = amp.GradScaler()\n", True),
        ("from torch.cuda import *\nscaler = amp.GradScaler()\n", True),
        ("from torch import cuda\nwith cuda.amp.autocast():\n    pass\n", True),
        ("import torch.cuda as torch\nwith torch.amp.autocast():\n    pass\n", True),
    ],
)
def test_amp001_needs_a_deprecated_name_used_in_code(source: str, uses: bool) -> None:
    assert _kept(source, "AMP001") is uses


@pytest.mark.parametrize(
    ("source", "uses"),
    [
        ("scaler = torch.amp.GradScaler()\n", True),
        ("self.loss_scaler.step(optimizer)\n", True),
        ("opt.unscale_(x)\n", True),
        ("s.scale(loss).backward()\n", True),
        ("x = g.op('Mul').scale(2)\nt.step()\n", False),  # a scale() that no backward follows
        ("optimizer.step()\nscheduler.step()\n", False),
    ],
)
def test_scaler_events_need_something_the_facts_call_a_scaler(source: str, uses: bool) -> None:
    assert _screen(source).uses_a_scaler is uses
