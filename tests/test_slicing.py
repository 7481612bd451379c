"""Relevance slicing never changes results: sliced analysis == whole-file analysis."""

from __future__ import annotations

from pathlib import Path

import pytest

from amplint.static import slicing
from amplint.static.analyse import analyse_source

ROOT = Path(__file__).parent.parent
SOURCES = sorted(
    p for p in [*ROOT.glob("fixtures/static/*/*.py"), *ROOT.glob("fixtures/fix/*.py"), *ROOT.glob("examples/*.py")]
)


def _helpers(count: int) -> str:
    return "".join(
        f"\n\ndef unrelated_helper_{i}(values):\n    total = 0\n    for v in values:\n        total += v * {i}\n    return total\n"
        for i in range(count)
    )


FILLER = _helpers(400)  # past SLICE_MIN_CHARS: the tests of what a large file's slice keeps
# After every fixture: enough helpers to blank, with the size threshold patched to 0 rather
# than reached, since the whole-file analysis each such test compares with costs libcst ~0.5 s
# per 400 helpers, times ~700 fixtures.
FEW_HELPERS = _helpers(12)


def _codes() -> frozenset[str]:
    from amplint.static.checks import all_checks

    return frozenset({*all_checks(), "AMP000"})


def _result(source: str | bytes, name: str, sliced: bool) -> list[tuple]:
    return [(f.code, f.line, f.column, f.message) for f in analyse_source(source, name, _codes(), slicing=sliced)]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_slicing_a_fixture_keeps_its_findings(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slicing, "SLICE_MIN_CHARS", 0)
    source = path.read_bytes()
    assert _result(source, path.name, sliced=True) == _result(source, path.name, sliced=False)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_slicing_a_fixture_followed_by_unrelated_helpers_keeps_its_findings(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slicing, "SLICE_MIN_CHARS", 0)
    try:
        source = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        pytest.skip("not UTF-8: covered by the whole-file test above")
    if source.startswith(("#!", "# -*-", "\ufeff")) or "from __future__" in source:
        pytest.skip("a coding line or future import must stay first")
    padded = source + FEW_HELPERS
    assert _result(padded, path.name, sliced=True) == _result(padded, path.name, sliced=False)


RULE_FIXTURES = sorted(p for p in ROOT.glob("fixtures/static/AMP0*/*.py") if p.parent.name != "AMP000")  # AMP000: the syntax check


@pytest.mark.parametrize("path", RULE_FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_slicing_for_the_fixtures_rule_alone_keeps_its_findings(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--select AMPNNN`: the slice holds only what that rule's own words reach, not what other
    rules' words happened to keep."""
    monkeypatch.setattr(slicing, "SLICE_MIN_CHARS", 0)
    source, code = path.read_bytes(), frozenset({path.parent.name})
    whole = [(f.code, f.line, f.column, f.message) for f in analyse_source(source, path.name, code, slicing=False)]
    assert [(f.code, f.line, f.column, f.message) for f in analyse_source(source, path.name, code, slicing=True)] == whole



# What AMP002's exemptions read outside the function of a cast, each in a module whose other
# functions would not keep it: (source, the lines the whole-file analysis reports).
AMP002_READS = {
    "a test's training through a helper": (
        "import torch\ndef other(model):\n    model(1).backward()\ndef do_backward(loss):\n    loss.backward()\n"
        "def test_half(model, x):\n    model.half()\n    with torch.autocast('cuda'):\n        loss = model(x)\n"
        "    do_backward(loss)\n",
        [7],
    ),
    "module-level code's training": (
        "import torch\ndef other(m):\n    m(1).backward()\ndef test_half(model, x):\n    model.half()\n"
        "    with torch.autocast('cuda'):\n        return model(x)\ndef fit(model):\n    model(1).sum().backward()\n"
        "if __name__ == '__main__':\n    fit(None)\n",
        [5],
    ),
    "a caller on the way to autocast": (
        "import torch\ndef other(model, x):\n    model(x).backward()\ndef prepare(batch):\n    with torch.no_grad():\n"
        "        return batch.half()\ndef step(model, x):\n    with torch.autocast('cuda'):\n        return model(x)\n"
        "def train(model, loader):\n    for batch in loader:\n        loss = step(model, prepare(batch))\n",
        [6],
    ),
    "callers that are tests without AMP": (
        "import torch\ndef make(model):\n    return model.half()\ndef test_a(model):\n    m = make(model)\n    m(1)\n"
        "def test_b(model, x):\n    with torch.autocast('cuda'):\n        model(x).sum().backward()\n",
        [],
    ),
    "a mention of the helper as a value": (
        "import threading\nimport torch\ndef make(model):\n    return model.half()\ndef test_a(model):\n    m = make(model)\n"
        "    m(torch.ones(1, dtype=torch.float16))\ndef test_b(model, x):\n    with torch.autocast('cuda'):\n"
        "        model(x).sum().backward()\ndef elsewhere(mod):\n    threading.Thread(target=mod.make).start()\n",
        [4],
    ),
    "a nested helper's other uses": (
        "import torch\nclass Opt(torch.optim.Optimizer):\n    def step(self):\n        def ortho(g):\n"
        "            return g.bfloat16()\n        for p in self.params:\n            p.add_(ortho(p.grad))\n"
        "def other(x):\n    return ortho(x)\ndef train(model, x):\n    with torch.autocast('cuda'):\n        loss = model(x)\n"
        "    loss.backward()\n",
        [5],
    ),
    "the callers of an autocast factory": (
        "import torch\ndef get_ctx(amp):\n    return torch.autocast('cuda', enabled=amp != 'none')\ndef evaluate(model, x):\n"
        "    with get_ctx('fp16'):\n        return model(x)\ndef main(args, model, x):\n    if args.full_bf16:\n"
        "        assert args.amp == 'none'\n        model.bfloat16()\n    with get_ctx(args.amp):\n        loss = model(x)\n"
        "    loss.backward()\n",
        [10],
    ),
    "a builtin the file defines": (
        "import torch\ndef print(*args):\n    return args\ndef train(model, x):\n    ref = load_reference().half()\n"
        "    print(ref)\n    with torch.no_grad():\n        ref(x)\n    with torch.autocast('cuda'):\n        loss = model(x)\n"
        "    loss.backward()\n",
        [5],
    ),
    "helpers down to a wrapper": (
        "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\ndef wrap_inner(m):\n    return DDP(m)\n"
        "def wrap(m):\n    return wrap_inner(m)\ndef train(model, x):\n    enc = load_encoder().half()\n    enc = wrap(enc)\n"
        "    with torch.no_grad():\n        f = enc(x)\n    with torch.autocast('cuda'):\n        loss = model(f)\n"
        "    loss.backward()\n",
        [],
    ),
    "a wrapper around a cast in a script": (
        "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\ndef other(m):\n    m(1).backward()\n"
        "def wrap(m):\n    return DDP(m)\nenc = wrap(load_encoder().half())\nfor x in loader:\n    with torch.no_grad():\n"
        "        f = enc(x)\n    with torch.autocast('cuda'):\n        loss = model(f)\n    loss.backward()\n",
        [],
    ),
    "AMP reached by a script's other branch": (
        "import torch\ndef other(m):\n    m(1).backward()\ndef forward(net, x):\n    with torch.autocast('cuda'):\n"
        "        return net(x)\ndef run_epoch(net, x):\n    return forward(net, x)\nif args.fp16:\n    model = model.half()\n"
        "else:\n    run_epoch(model, 1)\n",
        [],
    ),
}


@pytest.mark.parametrize(("source", "lines"), AMP002_READS.values(), ids=AMP002_READS.keys())
def test_amp002_alone_keeps_what_its_exemptions_read(source: str, lines: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slicing, "SLICE_MIN_CHARS", 0)
    code = frozenset({"AMP002"})
    whole = [(f.code, f.line, f.column, f.message) for f in analyse_source(source, "large.py", code, slicing=False)]
    assert [line for _code, line, _column, _message in whole] == lines
    assert [(f.code, f.line, f.column, f.message) for f in analyse_source(source, "large.py", code, slicing=True)] == whole

def test_slicing_blanks_functions_that_no_rule_can_see() -> None:
    source = "import torch\n\n\ndef train():\n    with torch.autocast('cuda'):\n        loss.backward()\n" + FILLER
    codes, sliced = slicing.prepare(source, frozenset({"AMP003"}))
    assert codes == {"AMP003"}
    assert sliced is not None
    assert "unrelated_helper_7" not in sliced
    assert sliced.count("\n") == source.count("\n")


def test_a_rule_without_triggers_turns_slicing_off() -> None:
    source = "import torch\n" + FILLER
    assert slicing.prepare(source, frozenset({"AMP999"}))[1] is None


def test_rules_mentioned_only_in_strings_are_set_aside_for_a_large_file() -> None:
    docstring = '"""Call loss.backward() outside torch.autocast, and build one GradScaler."""\n'
    source = docstring + "import torch\n" + FILLER
    codes, _ = slicing.prepare(source, frozenset({"AMP000", "AMP003", "AMP004", "AMP010"}))
    assert codes == {"AMP000"}


def test_a_string_sensitive_rule_stays_when_its_subject_is_named_in_code() -> None:
    """AMP010 reads the device from a string ("cpu"), but its GradScaler must be named in code."""
    source = 'import torch\nscaler = torch.amp.GradScaler("cpu")  # GradScaler\n' + FILLER
    codes, _ = slicing.prepare(source, frozenset({"AMP000", "AMP010"}))
    assert codes == {"AMP000", "AMP010"}
    only_in_a_comment = "import torch\n# GradScaler('cpu') is not used here\n" + FILLER
    assert slicing.prepare(only_in_a_comment, frozenset({"AMP000", "AMP010"}))[0] == {"AMP000"}


@pytest.mark.parametrize(
    ("source", "view"),
    [
        ('x = "autocast"  # GradScaler\n', "x = " + " " * 24 + "\n"),
        ("s = 'it\\'s # not a comment'; y = 1\n", "s = " + " " * 23 + "; y = 1\n"),
        ('"""doc\nautocast"""\nz = 2\n', '      \n           \nz = 2\n'),
        ("b = rb'\\d+' + Rb\"#\"\n", "b = " + " " * 7 + " + " + " " * 5 + "\n"),  # prefixes too
        ('if"autocast"in x: pass\n', "if" + " " * 10 + "in x: pass\n"),  # a keyword, not a prefix
        ('f"{torch.autocast}" # c\n', 'f"{torch.autocast}"    \n'),  # an f-string's fields are code
        ('t = ("a" f"{x}"\n     "b")\n', 't = (    f"{x}"\n        )\n'),
    ],
)
def test_code_view_blanks_comments_and_plain_strings_only(source: str, view: str) -> None:
    assert slicing._code_view(source).decode() == view


def _large(source: str) -> str:
    return "import threading\nimport torch\n" + source + FILLER


def _sliced_equals_whole(source: str) -> list[tuple]:
    found = _result(source, "large.py", sliced=True)
    assert found == _result(source, "large.py", sliced=False)
    return found


REGION = "\n\ndef forward_pass(model, x):\n    with torch.autocast('cuda'):\n        return {call}\n"
FAR_AWAY = "\n\ndef housekeeping(optimizer, loss, pool, compiled):\n    loss.backward()\n    optimizer.step()\n    pool.submit(print)\n    compiled(1)\n"


@pytest.mark.parametrize(
    ("code", "call"),
    [
        ("AMP003", "model(x).sum().backward()"),
        ("AMP015", "threading.Thread(target=model).start()"),
        ("AMP017", "compiled(x)"),
    ],
)
def test_a_rule_that_reports_calls_inside_regions_is_set_aside_when_none_is_reachable(code: str, call: str) -> None:
    compiled = "\ncompiled = torch.compile(model)\n"
    far = _large(compiled + REGION.format(call="model(x)") + FAR_AWAY)
    assert code not in slicing.prepare(far, frozenset({code}))[0]
    assert not [f for f in _sliced_equals_whole(far) if f[0] == code]
    near = _large(compiled + REGION.format(call=call) + FAR_AWAY)
    assert code in slicing.prepare(near, frozenset({code}))[0]


def test_a_step_reached_through_a_call_from_the_region_keeps_amp003() -> None:
    source = _large("\n\ndef run(model, x, opt):\n    with torch.autocast('cuda'):\n        update(opt)\n\n\ndef update(opt):\n    opt.step()\n")
    codes, sliced = slicing.prepare(source, frozenset({"AMP003"}))
    assert codes == {"AMP003"} and "opt.step()" in sliced
    assert [f[0] for f in _sliced_equals_whole(source)].count("AMP003") == 1


def test_amp009_keeps_one_backward_as_its_witness() -> None:
    region = "\n\ndef train_step(model, x):\n    with torch.autocast('cuda', dtype=torch.float16):\n        return model(x)\n"
    backwards = "".join(f"\n\ndef backward_{i}(loss):\n    loss.backward()\n" for i in range(5))
    source = _large(region + backwards)
    codes, sliced = slicing.prepare(source, frozenset({"AMP009"}))
    assert codes == {"AMP009"}
    assert sliced.count("loss.backward()") == 1
    assert [f[0] for f in _sliced_equals_whole(source)] == ["AMP009"]


def test_amp013_keeps_the_methods_of_function_classes_only() -> None:
    source = _large(
        "\nscaler = torch.amp.GradScaler('cuda')\n"
        "\n\nclass Square(torch.autograd.Function):\n    @staticmethod\n    def forward(ctx, x, y):\n        return torch.matmul(x, y)\n"
        "\n\nclass Net(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n"
    )
    codes, sliced = slicing.prepare(source, frozenset({"AMP013"}))
    assert codes == {"AMP013"}
    assert "torch.matmul(x, y)" in sliced and "return x * 2" not in sliced
    assert [f[0] for f in _sliced_equals_whole(source)] == ["AMP013"]


@pytest.mark.parametrize(
    ("binding", "use"),
    [
        ("from torch.cuda.amp import autocast as ac", "with ac():\n        pass"),
        ("from torch.cuda.amp import autocast", "with autocast():\n        pass"),
        ("import torch.cuda.amp as A", "scaler = A.GradScaler()"),
        ("ac = torch.autocast", "with ac('cuda'):\n        loss.backward()"),
    ],
)
def test_a_function_that_uses_a_name_bound_at_module_level_is_kept(binding: str, use: str) -> None:
    """The function never spells the rule's words: the import or assignment that binds its name does."""
    source = _large(f"{binding}\n\n\ndef run(x):\n    {use}\n    return x\n")
    found = _sliced_equals_whole(source)
    assert any(line == 7 for _code, line, _column, _message in found)


def _amp001_slice(source: str) -> str:
    codes, sliced = slicing.prepare(source, frozenset({"AMP001"}))
    assert codes == {"AMP001"} and sliced is not None
    assert sliced.count("\n") == source.count("\n")
    return sliced


def test_a_large_tables_inert_entries_are_blanked_and_its_amp_entries_kept() -> None:
    entries = "".join(f"        torch.op_{i}: lambda input, out=None: -1,\n" for i in range(40))
    source = _large(
        "\n\ndef get_testing_overrides():\n    return {\n" + entries
        + "        torch.cuda.amp.autocast: lambda enabled=True: -1,\n"
        + "        torch.compute(x): -1,\n    }\n"
    )
    sliced = _amp001_slice(source)
    assert "torch.op_7" not in sliced and "torch.cuda.amp.autocast" in sliced
    assert "torch.compute(x)" in sliced  # a call is never blanked
    assert [f[:2] for f in _sliced_equals_whole(source)] == [("AMP001", 47)]


def test_nested_functions_no_rule_can_see_become_pass() -> None:
    handlers = "".join(
        f"    @register(torch.op_{i})\n    def handle_op_{i}(self, tx):\n        return tx.constant({i})\n\n" for i in range(30)
    )
    source = _large(
        "\n\ndef get_handlers():\n" + handlers
        + "    @register(torch.is_autocast_cpu_enabled)\n    def handle_amp(self, tx):\n        return tx.constant(0)\n\n"
        + "    def worker():\n        print('done')\n\n    threading.Thread(target=worker).start()\n    return handlers\n"
    )
    sliced = _amp001_slice(source)
    assert "handle_op_7" not in sliced and "torch.is_autocast_cpu_enabled" in sliced
    assert "def worker():" in sliced  # named elsewhere: rules may look into it
    assert [f[0] for f in _sliced_equals_whole(source)] == ["AMP001"]


def test_blanked_functions_become_one_string_statement_and_no_line_moves() -> None:
    """libcst makes nodes of every empty line; a run of them that starts where a statement may
    is folded into one string statement, at the indentation of the block it is in."""
    helpers = "".join(f"    def helper_{i}(self):\n        return {i}\n\n" for i in range(20))
    source = _large(
        "\n\nclass Trainer:\n" + helpers
        + "    def step(self, model, x):\n        with torch.cuda.amp.autocast():\n            return model(x)\n"
        + "\n\nclass Unrelated:\n" + helpers
    )
    sliced = _amp001_slice(source)
    assert "helper_7" not in sliced
    assert '    """\n' in sliced  # the methods of Trainer, at the class body's indentation
    assert "\n\"\"\"\n" in sliced  # and the filler's module-level functions
    assert "class Unrelated:\n    pass\n    \"\"\"\n" in sliced  # a class left with no method keeps a body
    assert sliced.count("\n") == source.count("\n")
    assert [f[:2] for f in _sliced_equals_whole(source)] == [("AMP001", 67)]


def test_a_short_blank_run_is_left_as_it_is() -> None:
    out = ["x = 1\n", "\n", "\n", "y = 2\n"]
    slicing._fold_blank_runs(out, {2: ""})  # two lines: nothing to gain
    assert out == ["x = 1\n", "\n", "\n", "y = 2\n"]


def test_the_methods_that_assign_what_kept_methods_use_are_kept() -> None:
    """The facts read what `self.net` is from its assignments in the same class (else in any):
    `__init__` stays, a nested class's own `self.net` does not."""
    source = _large(
        "\n\nclass Trainer:\n"
        "    def __init__(self):\n        self.net = build_network()\n\n"
        "    def make_toy(self):\n        class Toy:\n            def __init__(self):\n                self.net = None\n        return Toy()\n\n"
        "    def fit(self, x):\n        with torch.cuda.amp.autocast():\n            return self.net(x)\n"
    )
    sliced = _amp001_slice(source)
    assert "self.net = build_network()" in sliced
    assert "class Toy" not in sliced


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_slice_parses_as_it_is(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slice that did not parse would be analysed whole again: right, but silently slow."""
    import libcst

    monkeypatch.setattr(slicing, "SLICE_MIN_CHARS", 0)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        pytest.skip("not UTF-8")
    _codes_kept, sliced = slicing.prepare(text + FEW_HELPERS, _codes())
    if sliced is None:
        pytest.skip("not sliced")
    libcst.parse_module(sliced)


def test_a_large_files_slice_keeps_a_loss_scaled_by_hand_beside_another_backward() -> None:
    """AMP009's witness of a backward is one function; a loss scaled by hand in another one
    exempts the module, so the slice keeps every backward of a product."""
    source = _large(
        "\n\ndef evaluate_gradients(model, x):\n    model(x).sum().backward()\n"
        "\n\nLOSS_SCALE = 1024.0\n"
        "\n\ndef forward_loss(model, x):\n    with torch.autocast('cuda', dtype=torch.float16):\n"
        "        return model(x).sum()\n"
        "\n\ndef apply(loss, optimizer):\n    (loss * LOSS_SCALE).backward()\n    optimizer.step()\n"
    )
    assert not [f for f in _sliced_equals_whole(source) if f[0] == "AMP009"]


TIMED_BACKWARD = "\n\ndef fwd_bwd(model, x):\n    with torch.autocast('cuda'):\n        loss = model(x).sum()\n    loss.backward()\n"


@pytest.mark.parametrize(
    "clock",
    [
        "\n\nclass Clock:\n    def start(self):\n        import time\n        self.t0 = time.perf_counter()\n",
        "\n\ndef outer():\n    def tick():\n        return start.elapsed_time(end)\n\n    return tick\n",  # nested: not an inert placeholder
    ],
)
def test_a_large_files_slice_keeps_the_clock_that_makes_a_backward_a_benchmark(clock: str) -> None:
    """A module that reads a clock and never steps times its backward and trains nothing
    (rg.times_a_backward): the function with the clock is kept, however far from the region."""
    assert not [f for f in _sliced_equals_whole(_large(TIMED_BACKWARD + clock)) if f[0] == "AMP009"]


def test_a_large_files_slice_keeps_a_step_that_makes_a_timed_backward_train() -> None:
    step = "\n\ndef apply(opt):\n    opt.step()\n"
    clock = "\n\ndef now():\n    import time\n    return time.time()\n"
    assert [f[0] for f in _sliced_equals_whole(_large(TIMED_BACKWARD + clock + step))] == ["AMP009"]


def test_a_large_files_slice_keeps_what_callers_pass_a_helper_that_switches_flash_attention() -> None:
    """AMP016 reads `make_model(True)` where the helper sets `cfg.flash_attention = flash_attn`."""
    source = _large(
        "\n\ndef make_model(cfg, flash_attn):\n    cfg.flash_attention = flash_attn\n    return build(cfg)\n"
        "\n\ndef test_compare(cfg, batch):\n    fast = make_model(cfg, True)\n    return fast(batch)\n"
        "\n\ndef run(model, batch):\n    with torch.autocast('cuda', dtype=torch.bfloat16):\n        return model(batch)\n"
    )
    assert not [f for f in _sliced_equals_whole(source) if f[0] == "AMP016"]


def test_a_large_files_slice_keeps_a_triton_kernel_that_converts_its_loads() -> None:
    """AMP013 reads the kernel a Function's forward launches (`_fwd[grid](x, w)`), however far away."""
    source = _large(
        "\nimport triton\nimport triton.language as tl\n"
        "\n\n@triton.jit\ndef _fwd(X, W, Y):\n    x = tl.load(X).to(tl.float32)\n    w = tl.load(W).to(tl.float32)\n    tl.store(Y, x * w)\n"
        + "".join(f"\n\ndef unrelated_{i}(a):\n    return a + {i}\n" for i in range(40))
        + "\n\nclass ScaleFn(torch.autograd.Function):\n    @staticmethod\n    def forward(ctx, x, w):\n"
        "        y = torch.empty_like(x)\n        _fwd[(1,)](x, w, y)\n        return y\n\n"
        "    @staticmethod\n    def backward(ctx, dy):\n        return dy, None\n"
        "\n\ndef run(x, w):\n    with torch.autocast('cuda'):\n        return ScaleFn.apply(x, w)\n"
    )
    assert not [f for f in _sliced_equals_whole(source) if f[0] == "AMP013"]
