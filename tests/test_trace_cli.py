"""`amplint trace` as a launcher: the script's argv, output, exit status and traceback are what
`python SCRIPT` would give; the report is written however the script ends; bad input is one
line and exit status 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import amplint

torch = pytest.importorskip("torch")


def trace(tmp_path: Path, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "amplint", "trace", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, PYTHONWARNINGS="ignore::UserWarning"),
    )


def write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def test_argv_stdout_and_exit_status_pass_through(tmp_path: Path) -> None:
    write(
        tmp_path,
        "train.py",
        """
        import sys
        import torch
        print("args", sys.argv[1:], __name__)
        sys.exit(int(sys.argv[2]))
        """,
    )
    proc = trace(tmp_path, "-q", "--json", "r.json", "train.py", "--lr", "5")
    assert proc.returncode == 5
    assert proc.stdout == "args ['--lr', '5'] __main__\n"
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["exit"] == {"status": "exit", "code": 5, "exception": None}
    assert report["argv"] == ["train.py", "--lr", "5"]
    assert report["script"] == "train.py"


def test_exception_keeps_python_traceback_and_report(tmp_path: Path) -> None:
    write(
        tmp_path,
        "boom.py",
        """
        import torch

        def step():
            raise ValueError("bad batch")

        step()
        """,
    )
    proc = trace(tmp_path, "-q", "--json", "r.json", "boom.py")
    plain = subprocess.run([sys.executable, "boom.py"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == plain.returncode == 1
    # The traceback is the script's own: same frames, no amplint/runpy frames in front.
    traceback_lines = [line for line in proc.stderr.splitlines() if line.startswith(("Traceback", "  File", "ValueError"))]
    plain_lines = [line for line in plain.stderr.splitlines() if line.startswith(("Traceback", "  File", "ValueError"))]
    assert traceback_lines == plain_lines
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["exit"] == {"status": "exception", "code": 1, "exception": "ValueError: bad batch"}


@pytest.mark.parametrize(
    "failing_step",
    [
        # raised inside backward, which amplint wraps
        """
        class Broken(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2
            @staticmethod
            def backward(ctx, grad):
                raise ValueError("backward shape bug")
        Broken.apply(torch.ones(2, requires_grad=True)).sum().backward()
        """,
        # raised inside an optimizer step that GradScaler.step calls, both wrapped
        """
        class Exploding(torch.optim.SGD):
            def step(self, closure=None):
                raise ValueError("optimizer exploded")
        weight = torch.nn.Parameter(torch.ones(2))
        optimizer = Exploding([weight], lr=0.1)
        scaler = torch.amp.GradScaler("cpu")
        scaler.scale(weight.sum()).backward()
        scaler.step(optimizer)
        """,
        # raised by an op under the op recorder (a shape bug in a batch)
        """
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.nn.Linear(8, 2)(torch.randn(4, 9))
        """,
        # raised by a custom op's own kernel, which the op recorder calls
        """
        @torch.library.custom_op("tracebacktest::float32_only", mutates_args=())
        def float32_only(x: torch.Tensor) -> torch.Tensor:
            if x.dtype != torch.float32:
                raise ValueError(f"float32 only, got {x.dtype}")
            return x * 2
        with torch.autocast("cpu", dtype=torch.bfloat16):
            float32_only(torch.nn.Linear(4, 4)(torch.randn(2, 4)))
        """,
    ],
)
def test_the_traceback_has_no_amplint_frames_where_amplint_wraps_torch(tmp_path: Path, failing_step: str) -> None:
    write(tmp_path, "boom.py", "import torch\n" + textwrap.dedent(failing_step))
    proc = trace(tmp_path, "-q", "boom.py")
    plain = subprocess.run([sys.executable, "boom.py"], cwd=tmp_path, capture_output=True, text=True)
    frames = [line for line in proc.stderr.splitlines() if line.startswith(("Traceback", "  File", "ValueError"))]
    assert proc.returncode == plain.returncode == 1
    assert frames == [line for line in plain.stderr.splitlines() if line.startswith(("Traceback", "  File", "ValueError"))]
    assert str(Path(amplint.__file__).parent) not in proc.stderr


def _like_a_terminal() -> None:
    """Ctrl-C reaches a program started from a shell: the test process may itself be running
    with SIGINT ignored or blocked (a child inherits both), which a real terminal never is."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


def test_keyboard_interrupt_still_writes_report(tmp_path: Path) -> None:
    write(
        tmp_path,
        "loop.py",
        """
        import pathlib, time
        import torch
        x = torch.ones(2) * 2
        pathlib.Path("started").write_text("1")
        while True:
            time.sleep(0.05)
        """,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "amplint", "trace", "-q", "--json", "r.json", "loop.py"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_like_a_terminal,
    )
    deadline = time.monotonic() + 180  # importing torch on a loaded CI machine can be slow
    while not (tmp_path / "started").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    try:
        assert (tmp_path / "started").exists(), "the traced script never started"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGINT  # ended by SIGINT, as `python loop.py` is: a shell loop stops too
    assert "KeyboardInterrupt" in stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["exit"]["status"] == "exception" and report["exit"]["code"] == 130
    assert any(op["op"] == "aten::mul.Tensor" and op["line"] == 4 for op in report["ops"])


def test_module_mode_runs_as_main(tmp_path: Path) -> None:
    write(tmp_path, "pkg/__init__.py", "")
    write(
        tmp_path,
        "pkg/train.py",
        """
        import sys
        import torch
        if __name__ == "__main__":
            print("module", sys.argv[1:])
            torch.ones(3).sum()
        """,
    )
    proc = trace(tmp_path, "-q", "--json", "r.json", "-m", "pkg.train", "--epochs", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "module ['--epochs', '1']\n"
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["script"] == "pkg.train"
    assert any(op["path"] == os.path.join("pkg", "train.py") for op in report["ops"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.py"], "no such script: missing.py"),
        (["--nan", "sometimes", "x.py"], "'sometimes' is not one of"),
        (["--probe-dtype", "int8", "x.py"], "--probe-dtype accepts float16, bfloat16"),
        ([], "missing SCRIPT"),
        (["-m", "no_such_module_here"], "no module named 'no_such_module_here'"),
        (["--json", "x.py", "x.py"], "--json: x.py is Python source; the report would overwrite it"),
        (["--json", "r.out", "--html", "r.out", "x.py"], "--json and --html name the same file"),
        (["--nan-from-step", "4", "x.py"], "--nan-from-step delays the `module` and `op` checks"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    write(tmp_path, "x.py", "print('never')\n")
    proc = trace(tmp_path, *args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("amplint trace: error:") and message in lines[0]
    assert "never" not in proc.stdout


def test_strict_fails_on_confirmed_finding_and_summary_goes_to_stderr(tmp_path: Path) -> None:
    write(
        tmp_path,
        "bad.py",
        """
        import torch
        from torch import nn
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(torch.randn(3, 4)).float().pow(2).mean()
                loss.backward()
            opt.step()
        print("done")
        """,
    )
    plain = trace(tmp_path, "bad.py")
    assert plain.returncode == 0 and plain.stdout == "done\n"
    assert "AMP003" in plain.stderr and "confirmed" in plain.stderr
    strict = trace(tmp_path, "--strict", "-q", "bad.py")
    assert strict.returncode == 1
    # -q: no summary, only the one line that says why --strict failed the run
    assert strict.stderr.strip() == "amplint trace: --strict: exit 1: AMP003 confirmed at bad.py:9", strict.stderr


def test_html_report_is_self_contained(tmp_path: Path) -> None:
    write(
        tmp_path,
        "fp16.py",
        """
        import torch
        from torch import nn
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**30)
        for _ in range(4):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(torch.randn(3, 4)).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        """,
    )
    proc = trace(tmp_path, "-q", "--html", "r.html", "--json", "r.json", "fp16.py")
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / "r.html").read_text()
    report = json.loads((tmp_path / "r.json").read_text())
    assert html.startswith("<!DOCTYPE html>")
    assert "<svg" in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "<script src" not in html and "<link" not in html
    skipped = report["scaler"]["steps_skipped"]
    assert skipped >= 1  # 2**30 overflows fp16 gradients at first
    assert f"{skipped} skipped" in html


def test_nan_from_step_delays_only_the_module_and_op_checks(tmp_path: Path) -> None:
    """The cheap loss and gradient checks run at every step: a later start for `--nan op` must
    not hide an earlier non-finite loss."""
    write(
        tmp_path,
        "train.py",
        """
        import torch
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(4):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(torch.randn(8, 4)).float()
            if step == 2:
                out = out + torch.log(torch.zeros(1))
            out.pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        """,
    )
    proc = trace(tmp_path, "-q", "--strict", "--nan", "op", "--nan-from-step", "5", "--json", "r.json", "train.py")
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["nonfinite"]["op"] == "loss" and report["nonfinite"]["step"] == 2, report["nonfinite"]
    assert proc.returncode == 1, proc.stderr


def test_a_package_that_fails_to_import_under_m_is_the_scripts_crash(tmp_path: Path) -> None:
    """`trace -m pkg.train` finds the module without importing `pkg`: its `__init__` runs traced,
    and its exception is reported like any other crash of the user's code."""
    write(tmp_path, "pkg/__init__.py", "raise RuntimeError('package init failed')\n")
    write(tmp_path, "pkg/train.py", "print('never')\n")
    proc = trace(tmp_path, "-q", "--json", "r.json", "-m", "pkg.train")
    assert proc.returncode == 1
    assert "RuntimeError: package init failed" in proc.stderr and "amplint" not in proc.stderr.split("Traceback")[0]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["exit"]["status"] == "exception"


def test_the_summary_reaches_the_terminal_when_the_script_redirected_stderr(tmp_path: Path) -> None:
    write(
        tmp_path,
        "train.py",
        """
        import sys
        import torch
        sys.stderr = open("script.log", "w")
        print("logged", file=sys.stderr)
        sys.stderr.close()
        """,
    )
    proc = trace(tmp_path, "train.py")
    assert proc.returncode == 0, proc.stderr
    assert "amplint trace" in proc.stderr and "lost sys.stderr" not in proc.stderr
    assert (tmp_path / "script.log").read_text() == "logged\n"


def test_sys_exit_true_is_exit_status_1(tmp_path: Path) -> None:
    write(tmp_path, "train.py", "import sys\nimport torch\nsys.exit(True)\n")
    proc = trace(tmp_path, "-q", "--json", "r.json", "train.py")
    assert proc.returncode == 1
    assert json.loads((tmp_path / "r.json").read_text())["exit"]["code"] == 1


def _trivial_report(tmp_path: Path, *options: str) -> dict:
    """The JSON report of a traced script that does almost nothing, for the summaries to render."""
    write(tmp_path, "train.py", "import torch\nprint(torch.ones(2).sum())\n")
    trace(tmp_path, "-q", *options, "--json", "r.json", "train.py")
    return json.loads((tmp_path / "r.json").read_text())


def _terminal_summary(report: dict, tmp_path: Path, width: int) -> str:
    import io

    from rich.console import Console

    from amplint.trace.terminal import print_summary

    out = io.StringIO()
    print_summary(report, str(tmp_path), Console(file=out, width=width))
    return out.getvalue()


def test_the_summary_says_gradients_are_seen_at_the_step_not_made_there(tmp_path: Path) -> None:
    """Non-finite gradients are found where the step uses them: the line is the step's, the phase
    is where they were made."""
    report = _trivial_report(tmp_path)
    report["nonfinite"] = {
        "op": "gradients", "path": "train.py", "line": 21, "phase": "backward", "step": 3, "dtype": "float32",
        "handled_by_scaler": True,
    }
    summary = " ".join(_terminal_summary(report, tmp_path, 200).split())
    assert "first: gradients made in backward, seen at train.py:21, step 3, float32 - handled by GradScaler" in summary


def test_the_summary_says_why_a_forward_overflow_whose_step_was_skipped_is_unhandled(tmp_path: Path) -> None:
    report = _trivial_report(tmp_path)
    report["scaler"]["timeline"] = [{"step": 6, "applied": True}, {"step": 7, "applied": False}]
    report["nonfinite"] = {
        "op": "loss", "path": "train.py", "line": 14, "phase": "forward", "step": 7, "dtype": "float32",
        "handled_by_scaler": False,
    }
    summary = " ".join(_terminal_summary(report, tmp_path, 200).split())
    assert "step 7, float32 - the GradScaler skipped this step, but the forward was already inf/NaN (an overflow, or an inf/NaN in the inputs or weights)" in summary


def test_a_custom_op_missing_its_low_precision_kernel_is_not_said_to_be_kept_in_float32_by_autocast(tmp_path: Path) -> None:
    """Autocast casts no custom op: one the script fed float32 by hand inside a bfloat16 region
    gets bfloat16 if that cast goes, whatever autocast does."""
    write(
        tmp_path,
        "custom.py",
        """
        import torch

        @torch.library.custom_op("amplint_test::f32_only", mutates_args=())
        def f32_only(x: torch.Tensor) -> torch.Tensor:
            if x.dtype != torch.float32:
                raise RuntimeError(f"expected Float but got {x.dtype}")
            return x * 2

        lin = torch.nn.Linear(8, 8)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = f32_only(lin(torch.randn(2, 8)).float())
        """,
    )
    proc = trace(tmp_path, "--probe-dtype", "bfloat16", "--probe-device", "cpu", "--json", "r.json", "custom.py")
    assert proc.returncode == 0, proc.stderr
    summary = " ".join(_terminal_summary(json.loads((tmp_path / "r.json").read_text()), tmp_path, 300).split())
    assert "missing: amplint_test::f32_only bfloat16 on cpu" in summary
    assert "autocast does not cast custom ops" in summary and "autocast keeps it there" not in summary


def test_the_summary_calls_a_runtime_only_read_of_scaled_gradients_a_read(tmp_path: Path) -> None:
    import shutil

    shutil.copy(Path(__file__).parent.parent / "fixtures" / "runtime" / "grad_norm_logged_by_a_callback.py", tmp_path / "train.py")
    proc = trace(tmp_path, "--json", "r.json", "train.py")
    assert proc.returncode == 0, proc.stderr
    summary = " ".join(_terminal_summary(json.loads((tmp_path / "r.json").read_text()), tmp_path, 300).split())
    assert "3 read(s) of still-scaled gradients (scale 1024)" in summary and "clip(s)" not in summary


def test_the_summary_tells_inconclusive_kernel_probes_from_unverified_ones(tmp_path: Path) -> None:
    """The probe could not run an op here: that is "inconclusive", not "unverified" (which means
    the target device is absent)."""
    report = _trivial_report(tmp_path)
    probe = {"op": "aten::mm", "dtype": "bfloat16", "device": "cpu", "available": None}
    report["kernels"] = [{**probe, "status": "inconclusive", "error": "RuntimeError: expected scalar type"}]
    summary = _terminal_summary(report, tmp_path, 120)
    assert "0 available, 0 missing, 1 inconclusive, 0 unverified" in summary
    assert "inconclusive: aten::mm bfloat16 on cpu" in summary


def test_the_summary_shows_every_inconclusive_op_once_with_its_dtypes(tmp_path: Path) -> None:
    report = _trivial_report(tmp_path)
    entry = {"device": "cpu", "available": None, "status": "inconclusive", "error": "RuntimeError: arguments"}
    report["kernels"] = [
        {**entry, "op": "mylib::whiten", "dtype": "float16"},
        {**entry, "op": "mylib::whiten", "dtype": "bfloat16"},
        {**entry, "op": "mylib::rescale", "dtype": "float16"},
    ]
    summary = _terminal_summary(report, tmp_path, 160)
    assert "inconclusive: mylib::whiten float16, bfloat16 on cpu" in summary
    assert "inconclusive: mylib::rescale float16 on cpu" in summary


def test_the_summary_and_the_html_say_none_seen_in_this_process_when_children_ran_untraced(tmp_path: Path) -> None:
    from amplint.trace.html import render

    report = _trivial_report(tmp_path, "--nan", "module")
    report["untraced_processes"] = [{"pid": 4242, "how": "subprocess"}]
    assert "none seen in this process (--nan module)" in _terminal_summary(report, tmp_path, 160)
    assert "None seen in this process (--nan module)." in render(report, str(tmp_path))


@pytest.mark.parametrize(("ends", "status"), [("print('cleaned')", 2), ("raise SystemExit(3)", 3)])
def test_a_report_the_script_made_unwritable_is_one_error_line(tmp_path: Path, ends: str, status: int) -> None:
    write(
        tmp_path,
        "cleanup.py",
        f"""
        import shutil
        import torch
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.nn.Linear(2, 2)(torch.ones(1, 2))
        shutil.rmtree("runs")
        {ends}
        """,
    )
    (tmp_path / "runs").mkdir()
    proc = trace(tmp_path, "-q", "--json", "runs/trace.json", "cleanup.py")
    assert proc.returncode == status  # a clean run whose report is lost fails; a failing script keeps its status
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("amplint trace: error:")]
    assert errors == [f"amplint trace: error: cannot write the report: {tmp_path / 'runs' / 'trace.json'}: No such file or directory"]


def test_a_log_the_script_tees_stdout_into_keeps_its_tail(tmp_path: Path) -> None:
    """A training script that replaces sys.stdout with a logger writing a file too: Python's
    shutdown flushes it in a plain run, and so must the trace."""
    script = write(tmp_path, "tee.py", """
        import sys

        import torch

        class Tee:
            def __init__(self, path):
                self.terminal, self.log = sys.stdout, open(path, "w")
            def write(self, message):
                self.terminal.write(message)
                self.log.write(message)
            def flush(self):
                self.terminal.flush()
                self.log.flush()

        sys.stdout = Tee("train_log.txt")
        sys.stderr = sys.stdout
        model = torch.nn.Linear(2, 2)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(torch.randn(1, 2))
        for epoch in range(2000):
            print("epoch", epoch)
    """)
    result = trace(tmp_path, str(script))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "train_log.txt").read_text().endswith("epoch 1999\n")


def test_a_compiled_model_run_eagerly_by_the_op_recording_is_said_so(tmp_path: Path) -> None:
    """Dynamo does not compile under amplint's op recording: AMP017's evidence says the mismatch
    is read from where forward and backward ran, and how to run the compiled program instead."""
    script = write(tmp_path, "compiled.py", """
        import torch

        model = torch.nn.Linear(8, 8)
        compiled = torch.compile(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = compiled(torch.randn(4, 8))
            out.float().sum().backward()
            optimizer.step()
    """)
    result = trace(tmp_path, "--json", "trace.json", str(script))
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "trace.json").read_text())
    [finding] = [f for f in report["findings"] if f["code"] == "AMP017"]
    assert "--no-ops" in finding["evidence"]["note"]
    [note] = [n for n in report["notes"] if "ran eagerly" in n]  # also in the summary, not only the JSON evidence
    assert note.startswith("the model compiled at compiled.py:5 ran eagerly") and "--no-ops" in note
    in_the_summary = " ".join(result.stderr.split())
    assert "the model compiled at compiled.py:5 ran eagerly" in in_the_summary


def test_a_compiled_model_traced_with_no_ops_gets_no_eager_note(tmp_path: Path) -> None:
    script = write(tmp_path, "compiled.py", """
        import torch

        model = torch.nn.Linear(8, 8)
        compiled = torch.compile(model, backend="eager")
        for _ in range(2):
            compiled(torch.randn(4, 8)).sum().backward()
    """)
    result = trace(tmp_path, "--no-ops", "--json", "trace.json", str(script))
    assert result.returncode == 0, result.stderr
    assert not [n for n in json.loads((tmp_path / "trace.json").read_text())["notes"] if "ran eagerly" in n]


def test_each_name_of_a_deprecated_import_is_confirmed_by_its_own_uses(tmp_path: Path) -> None:
    script = write(tmp_path, "legacy.py", """
        import torch
        from torch.cuda.amp import autocast, GradScaler

        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = GradScaler(enabled=False)
        for _ in range(3):
            with autocast(enabled=False):
                loss = model(torch.randn(4, 2)).mean()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    """)
    result = trace(tmp_path, "--json", "trace.json", str(script))
    assert result.returncode == 0, result.stderr
    imports = [f for f in json.loads((tmp_path / "trace.json").read_text())["findings"] if f["code"] == "AMP001" and f["line"] == 3]
    assert sorted((f["evidence"]["api"], f["evidence"]["warnings"]) for f in imports) == [
        (["torch.cuda.amp.GradScaler"], 1),
        (["torch.cuda.amp.autocast"], 3),
    ]


def test_the_summary_is_not_cut_at_80_columns_in_a_log(tmp_path: Path) -> None:
    """stderr piped into a CI log is no 80-column terminal: the op table keeps its last column."""
    script = write(tmp_path, "infer.py", """
        import torch

        model = torch.nn.Linear(4, 4)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(torch.randn(2, 4)).softmax(-1)
    """)
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    result = subprocess.run(
        [sys.executable, "-m", "amplint", "trace", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr
    [header] = [line for line in result.stderr.splitlines() if line.startswith("┃ op ")]
    assert header.rstrip().endswith("┃ policy ┃")


def test_an_input_tensor_cast_by_hand_is_unchecked_not_refuted(tmp_path: Path) -> None:
    """AMP002's runtime check follows converted modules: a tensor's `.half()` that ran is not
    evidence against the finding, so it is listed as unchecked with its reason."""
    script = write(tmp_path, "inputs.py", """
        import torch

        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu")
        batch = torch.randn(8, 4)
        x = batch.half()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x).float().mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    """)
    result = trace(tmp_path, "--json", "trace.json", str(script))
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "trace.json").read_text())
    assert not [f for f in report["findings"] if f["code"] == "AMP002"]
    [unchecked] = report["unchecked_findings"]
    assert unchecked["code"] == "AMP002" and unchecked["line"] == 8 and "tensor" in unchecked["reason"]


def test_a_thread_started_with_autocast_off_is_not_reached_and_says_why(tmp_path: Path) -> None:
    """The Thread line ran, but autocast was switched off by the script's flag: the case AMP015
    is about did not run, so the run cannot refute it, and the note says which region was off."""
    script = write(tmp_path, "worker.py", """
        import threading

        import torch

        encoder = torch.nn.Linear(6, 6)
        use_amp = False

        def work(x, out):
            out.append(encoder(x))

        for _ in range(2):
            x = torch.randn(3, 6)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_amp):
                out = []
                worker = threading.Thread(target=work, args=(x, out))
                worker.start()
                worker.join()
    """)
    result = trace(tmp_path, "--json", "trace.json", str(script))
    assert result.returncode == 0, result.stderr
    [finding] = [f for f in json.loads((tmp_path / "trace.json").read_text())["findings"] if f["code"] == "AMP015"]
    assert finding["status"] == "not-reached"
    assert "autocast was off in this run" in finding["evidence"]["note"] and "(enabled=use_amp)" in finding["evidence"]["note"]


def test_an_op_that_raises_on_low_precision_inputs_in_a_disabled_region_confirms_amp014(tmp_path: Path) -> None:
    """The crash (`mat1 and mat2 must have the same dtype`) is AMP014's worst case: the op that
    raised is counted, so the finding is confirmed, not refuted."""
    script = write(tmp_path, "predict.py", """
        import torch

        backbone = torch.nn.Linear(32, 64)
        head = torch.nn.Linear(64, 5)

        def predict(x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                feats = backbone(x)
                with torch.autocast("cpu", enabled=False):
                    return head(feats)

        predict(torch.randn(4, 32))
    """)
    result = trace(tmp_path, "--json", "trace.json", str(script))
    assert result.returncode == 1 and "RuntimeError" in result.stderr
    [finding] = [f for f in json.loads((tmp_path / "trace.json").read_text())["findings"] if f["code"] == "AMP014"]
    assert finding["status"] == "confirmed"


def test_a_script_whose_import_of_torch_fails_gets_one_error_line_and_its_status(tmp_path: Path) -> None:
    """A misspelled TORCH_LOGS makes torch's own import raise part-way; torch cannot be imported
    again in that process, so no report can be built: the script's traceback, then one line."""
    script = write(tmp_path, "bad_logs.py", """
        import os
        os.environ["TORCH_LOGS"] = "+dynamoo"
        import torch
    """)
    result = trace(tmp_path, "--json", "r.json", str(script))
    assert result.returncode == 1
    assert result.stderr.count("Traceback") == 1 and "Invalid log settings: +dynamoo" in result.stderr
    assert result.stderr.rstrip().splitlines()[-1] == (
        "amplint trace: error: no report: the script's `import torch` failed (its traceback is above), so nothing could be traced"
    )


def test_a_local_module_that_breaks_torchs_import_part_way_gets_one_error_line_not_an_abort(tmp_path: Path) -> None:
    """A `contextvars.py` beside the script shadows the one torch imports after its C extension
    registered its types: a second import of torch would abort the process (SIGABRT)."""
    write(tmp_path, "contextvars.py", "x = 1\n")
    script = write(tmp_path, "train.py", "import torch\nprint('ok')\n")
    result = trace(tmp_path, "--json", "r.json", str(script))
    assert result.returncode == 1
    assert "cannot import name 'ContextVar'" in result.stderr and "terminate called" not in result.stderr
    assert result.stderr.rstrip().splitlines()[-1] == (
        "amplint trace: error: no report: the script's `import torch` failed (its traceback is above), so nothing could be traced"
    )


def test_a_sigterm_handler_that_chains_to_the_previous_one_sees_the_default_as_under_python(tmp_path: Path) -> None:
    """Lightning's and submitit's idiom: remember the previous handler, call it if callable. The
    tracer's own handler (SIGTERM to SystemExit, for torchrun) must not be what they find."""
    script = write(tmp_path, "preempt.py", """
        import os, signal, sys
        import torch
        print("before:", signal.getsignal(signal.SIGTERM))
        stop = False
        previous = signal.getsignal(signal.SIGTERM)
        def on_term(signum, frame):
            global stop
            stop = True
            if callable(previous):
                previous(signum, frame)
        returned = signal.signal(signal.SIGTERM, on_term)
        print("replaced:", returned)
        model = torch.nn.Linear(4, 1)
        for step in range(50):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(torch.randn(2, 4)).float().pow(2).mean()
            loss.backward()
            if step == 3:
                os.kill(os.getpid(), signal.SIGTERM)
            if stop:
                print("checkpoint saved at step", step)
                sys.exit(0)
    """)
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    result = trace(tmp_path, "--json", "r.json", str(script))
    assert result.returncode == plain.returncode == 0, result.stderr
    assert plain.stdout.splitlines()[2] == "checkpoint saved at step 3"
    assert result.stdout.splitlines()[:3] == plain.stdout.splitlines()


def test_a_module_of_the_scripts_folder_named_like_one_amplint_imported_is_the_one_the_script_gets(tmp_path: Path) -> None:
    """Under `python train.py`, `import uuid` finds `uuid.py` beside the script first; amplint has
    imported the standard library's by then, and must not hand the script that one."""
    write(tmp_path, "project/uuid.py", "def make_run_id():\n    return 'run-0001'\n")
    script = write(tmp_path, "project/train.py", """
        import torch
        from uuid import make_run_id
        print(make_run_id())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.nn.Linear(2, 2)(torch.ones(1, 2))
    """)
    result = trace(tmp_path, "--json", "r.json", str(script))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "run-0001"
    assert json.loads((tmp_path / "r.json").read_text())["exit"]["code"] == 0


def test_a_training_loop_in_a_thread_says_its_ops_are_not_in_the_op_table(tmp_path: Path) -> None:
    """The op recorder is a dispatch mode of the script's thread: a loop run in another thread
    leaves no op rows, and the report says why instead of an empty table."""
    script = write(tmp_path, "threaded.py", """
        import threading
        import torch

        model = torch.nn.Linear(8, 8)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def train():
            for _ in range(2):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = model(torch.randn(4, 8)).float().sum()
                loss.backward()
                optimizer.step()

        worker = threading.Thread(target=train, name="trainer")
        worker.start()
        worker.join()
    """)
    result = trace(tmp_path, "-q", "--json", "r.json", str(script))
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    [note] = [n for n in report["notes"] if "'trainer'" in n]
    assert "first at threaded.py:10" in note and "not in the op table" in note
    assert not [row for row in report["ops"] if row["path"] == "threaded.py" and row["line"] >= 10]  # the thread's lines


def test_a_factory_op_inside_an_autocast_region_is_recorded_in_it(tmp_path: Path) -> None:
    """`torch.randn` has no tensor argument to take the device from: its `device=` says where the
    region it runs in applies, so its row is not shown as outside autocast."""
    script = write(tmp_path, "factory.py", """
        import torch

        w = torch.randn(4, 4)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            noise = torch.randn(4, 4)
            y = noise @ w
    """)
    result = trace(tmp_path, "-q", "--json", "r.json", str(script))
    assert result.returncode == 0, result.stderr
    regions = {row["line"]: row["autocast"] for row in json.loads((tmp_path / "r.json").read_text())["ops"] if row["op"] == "aten::randn"}
    assert regions == {4: None, 6: {"device": "cpu", "dtype": "bfloat16"}}


def test_a_scale_that_falls_below_one_says_the_run_stopped_training(tmp_path: Path) -> None:
    """Every skip is "handled by the GradScaler", but a scale below 1 means gradients that hold
    inf/NaN at any scale: the GradScaler section says the run stopped training."""
    script = write(tmp_path, "diverged.py", """
        import torch

        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
        for _ in range(4):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(torch.randn(2, 4)).float().sum() * float("inf")
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    """)
    result = trace(tmp_path, "--json", "r.json", str(script))
    assert result.returncode == 0, result.stderr
    scaler = json.loads((tmp_path / "r.json").read_text())["scaler"]
    assert scaler["steps_skipped"] == 4 and scaler["scale_history"] == [2.0, 1.0, 0.5, 0.25]
    [note] = [n for n in scaler["notes"] if "fell to" in n]
    assert note.startswith("the GradScaler built at diverged.py:6 skipped 4 of 4 steps and its scale fell to 0.25")
    assert "stopped training" in " ".join(result.stderr.split())


def test_a_scale_that_fell_below_one_once_and_recovered_does_not_say_the_run_stopped(tmp_path: Path) -> None:
    """One bad batch at a scale of 1 sends it to 0.5, then every later step applies."""
    script = write(tmp_path, "one_bad_batch.py", """
        import torch

        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cpu", init_scale=1.0, growth_interval=2)
        for step in range(6):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(torch.randn(8, 4)).float().pow(2).mean()
            scaler.scale(loss).backward()
            if step == 0:
                model.weight.grad[0, 0] = float("inf")
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    """)
    result = trace(tmp_path, "--json", "r.json", str(script))
    assert result.returncode == 0, result.stderr
    scaler = json.loads((tmp_path / "r.json").read_text())["scaler"]
    assert (scaler["steps_applied"], scaler["steps_skipped"]) == (5, 1)
    [note] = [n for n in scaler["notes"] if "fell to 0.5" in n]
    assert "the steps after the last skip applied" in note and "stopped training" not in note


def test_a_script_that_does_not_parse_says_the_static_pass_could_not_read_it(tmp_path: Path) -> None:
    write(tmp_path, "train.py", "import torch\nloss = (\n")
    proc = trace(tmp_path, "--json", "r.json", "train.py")
    assert proc.returncode == 1
    assert "SyntaxError" in proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["exit"]["status"] == "exception"
    assert any("cannot read train.py (line 2" in note for note in report["notes"])
    assert "cannot read train.py" in proc.stderr


_TRANSFORMER_INFERENCE = """
    import sys

    import torch
    from torch import nn

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 5, 32)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = encoder(x)
    low = encoder.to(torch.bfloat16)  # the fused kernel's linears need autocast to cast `x`
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        fully_low = low(x)
    print(mixed.dtype, fully_low.dtype)
    torch.save({"mixed": mixed, "fully_low": fully_low}, sys.argv[1])
"""


@pytest.mark.parametrize("options", [[], ["--nan", "op"], ["--simulate", "cuda"]], ids=["ops", "nan-op", "simulate"])
def test_a_fused_transformer_under_autocast_computes_what_the_plain_run_computes(tmp_path: Path, options: list[str]) -> None:
    """nn.TransformerEncoder in eval runs one fused op whose kernel calls linears that autocast
    casts: the traced run takes the same path and gets the same tensors, bit for bit."""
    import torch

    write(tmp_path, "infer.py", _TRANSFORMER_INFERENCE)
    plain = subprocess.run([sys.executable, "infer.py", "plain.pt"], cwd=tmp_path, capture_output=True, text=True)
    traced = trace(tmp_path, "-q", "--json", "r.json", *options, "infer.py", "traced.pt")
    assert plain.returncode == traced.returncode == 0, traced.stderr
    assert traced.stdout == plain.stdout == "torch.bfloat16 torch.bfloat16\n"
    expected, got = torch.load(tmp_path / "plain.pt"), torch.load(tmp_path / "traced.pt")
    assert all(torch.equal(expected[name], got[name]) for name in expected)
    fused = [op for op in json.loads((tmp_path / "r.json").read_text())["ops"] if op["op"] == "aten::_transformer_encoder_layer_fwd"]
    assert fused and all(op["output_dtypes"] == ["bfloat16"] for op in fused)


def test_simulate_cuda_does_not_replay_the_fused_transformer_path_cuda_autocast_turns_off(tmp_path: Path) -> None:
    """Under CUDA autocast nn.TransformerEncoder does not take its fused fast path: the fused op
    is listed as not simulated, with why, rather than given CUDA dtypes it never has."""
    write(tmp_path, "infer.py", _TRANSFORMER_INFERENCE)
    traced = trace(tmp_path, "-q", "--json", "r.json", "--simulate", "cuda", "infer.py", "traced.pt")
    assert traced.returncode == 0, traced.stderr
    simulation = json.loads((tmp_path / "r.json").read_text())["simulation"]
    assert not [d for d in simulation["differences"] if d["op"].endswith("_transformer_encoder_layer_fwd")]
    skipped = [n for n in simulation["not_simulated"] if n["op"].endswith("_transformer_encoder_layer_fwd")]
    assert skipped and all("turns off the module's fused fast path" in n["error"] for n in skipped)


def test_simulate_cuda_never_guesses_what_is_computed_from_an_unsimulated_fast_path(tmp_path: Path) -> None:
    """`h * 2.0` uses the fused layer's output: on CUDA that output comes from `norm2` (float32),
    on the CPU from the fused kernel (bfloat16); the CPU's dtype is not given as CUDA's."""
    write(
        tmp_path,
        "infer.py",
        """
        import torch
        from torch import nn

        layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            h = layer(torch.randn(2, 3, 16))
            out = h * 2.0
        """,
    )
    traced = trace(tmp_path, "-q", "--json", "r.json", "--simulate", "cuda", "infer.py")
    assert traced.returncode == 0, traced.stderr
    simulation = json.loads((tmp_path / "r.json").read_text())["simulation"]
    assert not [c for c in simulation["calls"] if c["line"] == 8]
    assert [n["error"] for n in simulation["not_simulated"] if n["line"] == 8] == ["an input comes from a call that was not simulated"]


@pytest.mark.skipif(torch.version.cuda is not None, reason="a CUDA build of torch copies fake CUDA tensors")
def test_simulate_cuda_says_a_cpu_build_refuses_multihead_attention_in_training(tmp_path: Path) -> None:
    write(
        tmp_path,
        "attend.py",
        """
        import torch
        from torch import nn

        attention = nn.MultiheadAttention(16, 2, batch_first=True)
        x = torch.randn(2, 3, 16)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out, _ = attention(x, x, x)
        """,
    )
    traced = trace(tmp_path, "-q", "--json", "r.json", "--simulate", "cuda", "attend.py")
    assert traced.returncode == 0, traced.stderr
    errors = [n["error"] for n in json.loads((tmp_path / "r.json").read_text())["simulation"]["not_simulated"]]
    assert any("this torch is a CPU build" in error for error in errors), errors


def test_simulate_cuda_follows_a_cnn_through_batch_norm_in_training(tmp_path: Path) -> None:
    """BatchNorm, on no autocast list, keeps its input's dtype on CUDA: the convolution's bfloat16
    flows on to the activation after it, rather than everything after it going unsimulated."""
    write(
        tmp_path,
        "cnn.py",
        """
        import torch
        from torch import nn

        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(torch.randn(4, 3, 8, 8))
        """,
    )
    traced = trace(tmp_path, "-q", "--json", "r.json", "--simulate", "cuda", "cnn.py")
    assert traced.returncode == 0, traced.stderr
    calls = {c["function"]: c["simulated_output_dtypes"] for c in json.loads((tmp_path / "r.json").read_text())["simulation"]["calls"]}
    assert calls["torch.nn.functional.batch_norm"] == ["bfloat16"] and calls["torch.nn.functional.relu"] == ["bfloat16"]


def test_options_after_the_module_name_belong_to_the_module(tmp_path: Path) -> None:
    write(tmp_path, "pkg/__init__.py", "")
    write(tmp_path, "pkg/train.py", "import sys\nprint(sys.argv[1:])\n")
    proc = trace(tmp_path, "-q", "-m", "pkg.train", "--json", "out.json", "--strict", "-q")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "['--json', 'out.json', '--strict', '-q']\n"
    assert not (tmp_path / "out.json").exists()
    bundled = trace(tmp_path, "-qm", "pkg.train", "--", "--nan", "op")
    assert bundled.stdout == "['--', '--nan', 'op']\n", bundled.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--jsn", "report.json", "x.py"], "no such option: --jsn (did you mean --json?)"),
        (["-q", "--stric", "x.py"], "no such option: --stric (did you mean --strict?)"),
        (["-x", "x.py"], "no such option: -x"),
    ],
)
def test_a_mistyped_option_before_the_script_is_named_as_an_option(tmp_path: Path, args: list[str], message: str) -> None:
    write(tmp_path, "x.py", "print('never')\n")
    proc = trace(tmp_path, *args)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"amplint trace: error: {message}"
    assert proc.stdout == ""


def test_a_worker_thread_is_traced_while_the_main_thread_is_being_simulated(tmp_path: Path) -> None:
    """`--simulate cuda` pauses the tracer for its own work on fake tensors in the main thread; a
    worker's float32 matmul meanwhile is the script's, and still confirms AMP015. The custom op's
    fake kernel (run only by the simulation) holds the main thread until the worker is done."""
    write(tmp_path, "side.py", """
        import threading

        import torch

        simulating, worker_done = threading.Event(), threading.Event()

        @torch.library.custom_op("sidetest::scale", mutates_args=())
        def scale(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @scale.register_fake
        def _(x):
            simulating.set()
            worker_done.wait(30)
            return torch.empty_like(x)

        def gram(w, out):
            out.append(simulating.wait(30))  # True only if the simulation held the main thread
            out.append(w @ w.t())
            worker_done.set()

        weight, out = torch.randn(16, 16), []
        with torch.autocast("cpu", dtype=torch.bfloat16):
            worker = threading.Thread(target=gram, args=(weight, out))
            worker.start()
            torch.ops.sidetest.scale(torch.nn.functional.linear(torch.randn(4, 16), weight))
        worker.join()
        print(out[0], out[1].dtype)
    """)
    proc = trace(tmp_path, "-q", "--simulate", "cuda", "--json", "r.json", "side.py")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "True torch.float32\n"  # the worker ran while the simulation held the main thread
    [finding] = [f for f in json.loads((tmp_path / "r.json").read_text())["findings"] if f["code"] == "AMP015"]
    assert finding["status"] == "confirmed" and finding["evidence"]["fp32_matmuls"] == 1


def test_amp014_counts_each_call_on_the_line_once_not_the_pieces_of_a_matmul(tmp_path: Path) -> None:
    write(tmp_path, "attn.py", """
        import torch

        q, k = torch.randn(2, 6, 8), torch.randn(2, 6, 8)
        for _ in range(5):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                q_low, k_low = torch.nn.functional.linear(q, torch.eye(8)), torch.nn.functional.linear(k, torch.eye(8))
                with torch.autocast("cpu", enabled=False):
                    scores = torch.matmul(q_low, k_low.transpose(-1, -2)) / 8.0
    """)
    proc = trace(tmp_path, "-q", "--json", "r.json", "attn.py")
    assert proc.returncode == 0, proc.stderr
    [finding] = [f for f in json.loads((tmp_path / "r.json").read_text())["findings"] if f["code"] == "AMP014"]
    # Five executions of one matmul and one division: ten calls (matmul's reshape of its result
    # is a view, which is not recorded).
    assert finding["count"] == 10
    assert {op["op"]: op["count"] for op in finding["evidence"]["ops"]} == {"aten::bmm": 5, "aten::div.Tensor": 5}


_CONVERTED_MODEL = """
    import torch
    from torch import nn

    model = nn.Linear(8, 3).to(getattr(torch, "bfloat16"))  # a dtype the static rule cannot read
    for step in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(4, 8)).float().pow(2).mean()
        {train}
"""


@pytest.mark.parametrize(
    ("train", "confirmed"),
    [("loss.backward()", True), ("print(loss.item() > -1)", False)],
    ids=["trained", "inference-only"],
)
def test_a_runtime_only_amp002_needs_a_run_that_trains(tmp_path: Path, train: str, confirmed: bool) -> None:
    """AMP002 leaves modules that do not train alone (rules/AMP002.md, "Not flagged"): a
    low-precision model that only predicts under autocast is a note, not an error."""
    write(tmp_path, "model.py", _CONVERTED_MODEL.replace("{train}", train))
    proc = trace(tmp_path, "-q", "--json", "r.json", "model.py")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    amp002 = [f for f in report["findings"] if f["code"] == "AMP002"]
    noted = [note for note in report["notes"] if "not an AMP002 finding" in note]
    if confirmed:
        assert [(f["source"], f["status"], f["count"], f["line"]) for f in amp002] == [("runtime", "confirmed", 2, 5)]
        assert not noted
    else:
        assert amp002 == []
        assert len(noted) == 1 and "model.py:5" in noted[0] and "ran 2 forward(s) under autocast" in noted[0]


def test_a_non_finite_feature_computed_before_the_loss_is_forward_and_a_gradient_written_by_hand_is_other(tmp_path: Path) -> None:
    """`other` is for gradients handled by hand outside backward and the optimizer (a NaN literal
    written into one is found at its line); data turned into features is the forward pass."""
    write(tmp_path, "features.py", """
        import sys

        import torch
        from torch import nn

        model = nn.Linear(6, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            x = torch.rand(4, 6) - (1.0 if step == 1 and sys.argv[1] == "feature" else 0.0)
            opt.zero_grad()
            features = torch.log(x)  # line 12: no autocast, no autograd, and still the forward pass
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(features).float().pow(2).mean()
            loss.backward()
            if step == 1 and sys.argv[1] == "gradient":
                model.weight.grad[0, 0] = float("nan")  # line 17
            opt.step()
    """)
    for where, line, phase in (("feature", 12, "forward"), ("gradient", 17, "other")):
        proc = trace(tmp_path, "-q", "--nan", "op", "--json", "r.json", "features.py", where)
        assert proc.returncode == 0, proc.stderr
        nonfinite = json.loads((tmp_path / "r.json").read_text())["nonfinite"]
        assert (nonfinite["line"], nonfinite["phase"], nonfinite["step"], nonfinite["check"]) == (line, phase, 1, "op"), nonfinite


def test_an_attention_mask_of_minus_inf_is_not_the_first_non_finite_value_the_nan_it_makes_is(tmp_path: Path) -> None:
    """`--nan op` passes over the infinities a script writes on purpose (a causal mask, a padding
    mask), and finds the NaN a softmax makes of a fully masked row, although its inputs hold -inf."""
    write(tmp_path, "attention.py", """
        import sys

        import torch

        torch.manual_seed(0)
        proj = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(proj.parameters(), lr=0.1)
        causal = torch.triu(torch.full((5, 5), float("-inf")), diagonal=1)
        for step in range(3):
            x = torch.randn(2, 5, 8)
            padded = torch.zeros(2, 5, dtype=torch.bool)
            padded[1, :] = step == 2 and sys.argv[1] == "empty-row"  # a sequence with no token
            with torch.autocast("cpu", dtype=torch.bfloat16):
                q = proj(x)
                scores = (q @ q.transpose(1, 2) + causal).masked_fill(padded[:, None, :], float("-inf"))
                weights = scores.softmax(-1)  # line 17
                loss = (weights @ q).float().pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """)
    proc = trace(tmp_path, "-q", "--strict", "--nan", "op", "--json", "r.json", "attention.py", "healthy")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "r.json").read_text())["nonfinite"] is None

    proc = trace(tmp_path, "-q", "--nan", "op", "--json", "r.json", "attention.py", "empty-row")
    assert proc.returncode == 0, proc.stderr
    nonfinite = json.loads((tmp_path / "r.json").read_text())["nonfinite"]
    assert (nonfinite["op"], nonfinite["line"], nonfinite["step"], nonfinite["inputs_finite"]) == ("aten::_softmax", 17, 2, False), nonfinite


def test_a_gpu_script_tried_without_cuda_says_why_its_scaler_findings_are_not_refuted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The summary gives the note of a not-reached finding whose line ran, not "the line never ran"."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("states facts of a machine without CUDA")
    monkeypatch.setenv("COLUMNS", "240")  # the notes whole in their table cells, whatever the terminal
    fixture = Path(__file__).resolve().parent.parent / "fixtures" / "runtime" / "cuda_scaler_on_cpu.py"
    (tmp_path / fixture.name).write_text(fixture.read_text())
    proc = trace(tmp_path, fixture.name)
    assert proc.returncode == 0, proc.stderr
    summary = " ".join(proc.stderr.split())
    assert "the line never ran" not in summary
    assert "scaled nothing" in summary and "CUDA autocast disabled itself here" in summary


@pytest.mark.parametrize("typed", ["train.py", "./train.py", "jobs/../train.py", "pkg"])
def test_the_script_sees_sys_argv_0_and_its_file_as_typed_like_a_plain_run(tmp_path: Path, typed: str) -> None:
    source = """
        import os
        import sys
        print(sys.argv[0], os.path.dirname(sys.argv[0]) or ".", sys.argv[1:])
        print(__file__)
        """
    write(tmp_path, "train.py", source)
    write(tmp_path, "pkg/__main__.py", source)
    (tmp_path / "jobs").mkdir()
    proc = trace(tmp_path, "-q", typed, "--epochs", "1")
    plain = subprocess.run([sys.executable, typed, "--epochs", "1"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == plain.stdout
    assert proc.stdout.startswith(f"{typed} {os.path.dirname(typed) or '.'} ['--epochs', '1']\n")


def test_a_script_ending_with_os_exit_keeps_its_status_and_says_no_report_was_written(tmp_path: Path) -> None:
    write(
        tmp_path,
        "train.py",
        """
        import os
        import torch
        print("trained", flush=True)
        os._exit(3)
        """,
    )
    proc = trace(tmp_path, "--json", "r.json", "train.py")
    assert proc.returncode == 3
    assert proc.stdout == "trained\n"
    assert proc.stderr.strip().splitlines()[-1] == (
        "amplint trace: the script called os._exit(3), which ends the process at once: no report was written"
    )
    assert not (tmp_path / "r.json").exists()


def test_under_strict_a_successful_run_ended_by_os_exit_fails_as_unchecked(tmp_path: Path) -> None:
    write(tmp_path, "train.py", "import os\nimport torch\nos._exit(0)\n")
    proc = trace(tmp_path, "--strict", "train.py")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == "amplint trace: --strict: exit 1: the run ended before it could be checked"
    assert trace(tmp_path, "train.py").returncode == 0


def test_a_symlinked_script_imports_from_its_real_folder_like_a_plain_run(tmp_path: Path) -> None:
    write(tmp_path, "project/helper.py", "MESSAGE = 'helper found'\n")
    write(tmp_path, "project/train.py", "import helper\nprint(helper.MESSAGE)\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "train.py").symlink_to(tmp_path / "project" / "train.py")
    proc = trace(tmp_path, "-q", "--json", "r.json", "bin/train.py")
    plain = subprocess.run([sys.executable, "bin/train.py"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == plain.returncode == 0, proc.stderr
    assert proc.stdout == plain.stdout == "helper found\n"
    assert "project/helper.py" in json.loads((tmp_path / "r.json").read_text())["traced_files"]


def test_a_zipapp_still_runs_as_python_runs_it(tmp_path: Path) -> None:
    import zipfile

    with zipfile.ZipFile(tmp_path / "app.pyz", "w") as archive:
        archive.writestr("__main__.py", "import sys\nprint('zipapp', sys.argv[1:])\n")
    proc = trace(tmp_path, "-q", "app.pyz", "--epochs", "1")
    plain = subprocess.run([sys.executable, "app.pyz", "--epochs", "1"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == plain.returncode == 0, proc.stderr
    assert proc.stdout == plain.stdout == "zipapp ['--epochs', '1']\n"


@pytest.mark.parametrize(("ending", "status"), [("pass", 0), ("sys.exit(3)", 3), ("raise ValueError('diverged')", 1)])
def test_atexit_handlers_run_traced_before_the_report_however_the_script_ends(tmp_path: Path, ending: str, status: int) -> None:
    """Python runs the script's atexit handlers when it ends (after printing its traceback): a
    save-on-exit checkpoint is part of the run, so the trace runs them before writing the report,
    in Python's order, and a handler's exception is printed and ignored as Python does."""
    write(
        tmp_path,
        "train.py",
        f"""
        import atexit
        import sys
        import torch

        def summary():
            print("final norm", torch.ones(4).norm().item(), flush=True)  # line 7
            raise RuntimeError("upload failed")

        atexit.register(summary)
        atexit.register(print, "registered last, runs first", flush=True)
        {ending}
        """,
    )
    proc = trace(tmp_path, "-q", "--json", "r.json", "train.py")
    plain = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == plain.returncode == status
    assert proc.stdout == plain.stdout == "registered last, runs first\nfinal norm 2.0\n"

    def python_lines(stderr: str) -> list[str]:
        import re

        kept = ("Traceback", "  File", "ValueError", "RuntimeError", "Exception ignored")
        return [re.sub(r" at 0x[0-9a-f]+", "", line) for line in stderr.splitlines() if line.startswith(kept)]

    assert python_lines(proc.stderr) == python_lines(plain.stderr)
    assert "Exception ignored in atexit callback: <function summary" in proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["exit"]["code"] == status
    assert any(op["line"] == 7 for op in report["ops"])  # the handler ran while traced


def test_sys_exit_with_a_code_beyond_a_byte_reports_the_status_the_process_ends_with(tmp_path: Path) -> None:
    write(tmp_path, "train.py", "import sys\nimport torch\nsys.exit(300)\n")
    proc = trace(tmp_path, "-q", "--json", "r.json", "train.py")
    plain = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == plain.returncode == 44
    assert json.loads((tmp_path / "r.json").read_text())["exit"] == {"status": "exit", "code": 44, "exception": None}


def test_the_script_sees_the_main_module_and_sys_path_of_a_plain_run(tmp_path: Path) -> None:
    """`__main__` as Python makes it (a SourceFileLoader, the builtins module, `__annotations__`),
    and sys.path with the script's folder first and not amplint's own start folder."""
    write(
        tmp_path,
        "jobs/train.py",
        """
        import sys
        import torch
        print(type(__loader__).__name__, __loader__.name, type(__builtins__).__name__, __annotations__)
        print(sorted(name for name in globals() if name.startswith("__")))
        print(sys.path)
        """,
    )
    proc = trace(tmp_path, "-q", "jobs/train.py")
    plain = subprocess.run([sys.executable, "jobs/train.py"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == plain.returncode == 0, proc.stderr
    assert proc.stdout == plain.stdout
    assert proc.stdout.startswith("SourceFileLoader __main__ module {}\n")


def test_each_gradscaler_gets_its_own_scale_history_in_the_summary_and_the_html(tmp_path: Path) -> None:
    """Two scalers (one per optimizer): the discriminator's backs off at a skipped step, the
    generator's does not; one history of both would zigzag between their scales."""
    write(
        tmp_path,
        "gan.py",
        """
        import torch
        from torch import nn
        torch.manual_seed(0)
        gen, disc = nn.Linear(4, 8), nn.Linear(8, 1)
        opt_g = torch.optim.SGD(gen.parameters(), lr=0.01)
        opt_d = torch.optim.SGD(disc.parameters(), lr=0.01)
        scaler_d = torch.amp.GradScaler("cpu", init_scale=1024.0)
        scaler_g = torch.amp.GradScaler("cpu", init_scale=1024.0)
        for it in range(4):
            with torch.autocast("cpu", dtype=torch.float16):
                fake = gen(torch.randn(4, 4))
                loss_d = disc(fake.detach()).mean() - disc(torch.randn(4, 8)).mean()
            opt_d.zero_grad()
            scaler_d.scale(loss_d).backward()
            if it == 1:
                disc.weight.grad[0, 0] = float("inf")
            scaler_d.step(opt_d)
            scaler_d.update()
            with torch.autocast("cpu", dtype=torch.float16):
                loss_g = -disc(fake).mean()
            opt_g.zero_grad()
            scaler_g.scale(loss_g).backward()
            scaler_g.step(opt_g)
            scaler_g.update()
        """,
    )
    proc = trace(tmp_path, "--html", "r.html", "gan.py")
    assert proc.returncode == 0, proc.stderr
    summary = " ".join(proc.stderr.split())
    assert "scaler built at gan.py:8: 4 step(s), 1 skipped; scale after each update: 1024, 512 x3" in summary
    assert "scaler built at gan.py:9: 4 step(s), 0 skipped; scale after each update: 1024 x4" in summary
    html = (tmp_path / "r.html").read_text()
    assert html.count("<h3>scaler built at") == 2 and html.count("<polyline") == 2


def test_an_autocast_context_kept_in_a_variable_is_confirmed_at_its_construction(tmp_path: Path) -> None:
    """AMP009 points at `torch.autocast(...)`; the region is entered at each `with amp:`. The run's
    evidence joins the finding there, not a runtime-only finding at the backward line."""
    write(
        tmp_path,
        "train.py",
        """
        import torch
        from torch import nn
        torch.manual_seed(0)
        model = nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        amp = torch.autocast("cpu", dtype=torch.float16)
        for step in range(3):
            with amp:
                out = model(torch.randn(4, 8))
            loss = out.float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        """,
    )
    proc = trace(tmp_path, "-q", "--json", "r.json", "train.py")
    assert proc.returncode == 0, proc.stderr
    findings = json.loads((tmp_path / "r.json").read_text())["findings"]
    assert [(f["code"], f["line"], f["source"], f["status"], f["count"]) for f in findings] == [("AMP009", 7, "static", "confirmed", 3)]
    evidence = findings[0]["evidence"]
    assert (evidence["autocast_entered_at"], evidence["autocast_created_at"], evidence["backward_at"]) == ("train.py:9", "train.py:7", "train.py:12")


def test_a_step_up_through_a_symlinked_folder_runs_the_file_python_runs(tmp_path: Path) -> None:
    """`L/../train.py` with `L -> real/a/sub` is `real/a/train.py` to the system (and to
    `python`); dropping `L/..` by spelling would run `./train.py`. The report names the file that ran
    and keeps argv[0] as typed."""
    write(tmp_path, "train.py", "print('the decoy next to the link')\n")
    write(tmp_path, "real/a/train.py", "import torch\nprint('real/a/train.py', torch.ones(2).sum().item())\n")
    (tmp_path / "real" / "a" / "sub").mkdir()
    (tmp_path / "L").symlink_to(tmp_path / "real" / "a" / "sub")
    typed = os.path.join("L", os.pardir, "train.py")
    proc = trace(tmp_path, "-q", "--json", "r.json", typed, "--lr", "3")
    plain = subprocess.run([sys.executable, typed, "--lr", "3"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == plain.returncode == 0, proc.stderr
    assert proc.stdout == plain.stdout == "real/a/train.py 2.0\n"
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["script"] == os.path.join("real", "a", "train.py")
    assert report["argv"] == [typed, "--lr", "3"]
    assert {op["path"] for op in report["ops"]} == {os.path.join("real", "a", "train.py")}


def test_the_report_shows_the_command_as_typed(tmp_path: Path) -> None:
    write(tmp_path, "jobs/train.py", "import torch\ntorch.ones(2).sum()\n")
    write(tmp_path, "pkg/__init__.py", "")
    write(tmp_path, "pkg/train.py", "import torch\ntorch.ones(2).sum()\n")
    proc = trace(tmp_path / "jobs", "-q", "--json", "r.json", "../jobs/train.py", "--lr", "3")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "jobs" / "r.json").read_text())["argv"] == ["../jobs/train.py", "--lr", "3"]
    proc = trace(tmp_path, "-q", "--json", "r.json", "-m", "pkg.train", "--lr", "3")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "r.json").read_text())["argv"] == ["-m", "pkg.train", "--lr", "3"]


def test_the_strict_help_says_an_overflow_the_scaler_handled_does_not_fail_the_run(tmp_path: Path) -> None:
    proc = trace(tmp_path, "--help")
    assert "a non-finite value appeared that the GradScaler did not handle" in " ".join(proc.stdout.split())


def test_torch_is_first_imported_by_the_script_and_a_script_without_torch_is_said_so(tmp_path: Path) -> None:
    """The script's own `import torch` loads torch, so what it set up before (the environment torch
    reads when it loads) holds; a script that never imports torch still gets a report that says so."""
    write(tmp_path, "prepare.py", "import sys\nprint('torch' in sys.modules, 'numpy' in sys.modules)\n")
    proc = trace(tmp_path, "-q", "--json", "r.json", "prepare.py")
    plain = subprocess.run([sys.executable, "prepare.py"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == plain.returncode == 0, proc.stderr
    assert proc.stdout == plain.stdout == "False False\n"
    notes = json.loads((tmp_path / "r.json").read_text())["notes"]
    assert "the script did not import torch in this process: nothing was traced" in notes


def test_a_script_that_never_compiles_runs_without_dynamo_loaded_as_under_python(tmp_path: Path) -> None:
    """torch loads torch._dynamo (seconds of CPU) at the first op of any dispatch mode; the
    tracer's modes leave it to the script, so an inference script is traced without it and its
    ops are still recorded."""
    write(
        tmp_path,
        "infer.py",
        """
        import sys
        import torch

        x = torch.randn(4, 4)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ x
        print(y.dtype, "torch._dynamo" in sys.modules)
        """,
    )
    proc = trace(tmp_path, "-q", "--json", "r.json", "infer.py")
    plain = subprocess.run([sys.executable, "infer.py"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == plain.returncode == 0, proc.stderr
    assert proc.stdout == plain.stdout == "torch.bfloat16 False\n"
    ops = json.loads((tmp_path / "r.json").read_text())["ops"]
    assert {"op": "aten::mm", "line": 7, "output_dtypes": ["bfloat16"]}.items() <= next(o for o in ops if o["op"] == "aten::mm").items()


def test_dynamo_never_compiles_the_tracers_own_frames(tmp_path: Path) -> None:
    """A compiled model called while the tracer's dispatch mode records its ops: Dynamo must skip
    the mode's frames as torch's own wrapper makes it, not trace (and recompile) them."""
    write(
        tmp_path,
        "train.py",
        """
        import torch
        from torch import nn

        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        compiled = torch.compile(model, backend="aot_eager")
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for step in range(3):
            x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(compiled(x), y)
            loss.backward()
            opt.step()
        print("done")
        """,
    )
    proc = trace(tmp_path, "-q", "--json", "r.json", "train.py")
    assert proc.returncode == 0 and proc.stdout == "done\n", proc.stderr
    assert "amplint" not in proc.stderr and "recompile" not in proc.stderr, proc.stderr


def test_a_finding_whose_line_never_ran_says_so_in_its_evidence(tmp_path: Path) -> None:
    """`not-reached` always carries its reason in `note`, as for the cases that ran but missed."""
    write(tmp_path, "train.py", """
        import torch
        from torch import nn


        def never_called(model, opt, loader):
            for x, y in loader:
                scaler = torch.amp.GradScaler("cpu")
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = nn.functional.cross_entropy(model(x), y)
                scaler.scale(loss).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(opt)
                scaler.update()


        print("done")
        """)
    proc = trace(tmp_path, "-q", "--json", "r.json", "train.py")
    assert proc.returncode == 0 and proc.stdout == "done\n", proc.stderr
    findings = {f["code"]: f for f in json.loads((tmp_path / "r.json").read_text())["findings"]}
    assert {"AMP004", "AMP005"} <= set(findings), findings
    for code in ("AMP004", "AMP005"):
        assert findings[code]["status"] == "not-reached"
        assert findings[code]["evidence"]["note"] == "the line never ran in this run"
    assert findings["AMP004"]["evidence"]["enabled"] is None  # no scaler was built, on or off


_FULLGRAPH_SCRIPT = """
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")

    @torch.compile(fullgraph=True, backend="aot_eager")
    def loss_of(out, y):
        return nn.functional.cross_entropy(out, y)

    for step in range(2):
        x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_of(compiled(x), y)
        loss.backward()
    print("done")
    """


def test_a_fullgraph_compile_runs_under_the_op_recording_and_says_it_ran_eagerly(tmp_path: Path) -> None:
    """Under the op recorder Dynamo skips every frame, which `fullgraph=True` makes an error the
    script never raises untraced: the trace runs it with fullgraph off and a note says so."""
    write(tmp_path, "train.py", _FULLGRAPH_SCRIPT)
    proc = trace(tmp_path, "-q", "--json", "r.json", "train.py")
    assert proc.returncode == 0 and proc.stdout == "done\n", proc.stderr
    notes = json.loads((tmp_path / "r.json").read_text())["notes"]
    assert any(n.startswith("torch.compile(fullgraph=True) at train.py:6 ran with fullgraph=False") for n in notes), notes


def test_a_fullgraph_compile_keeps_fullgraph_without_op_recording(tmp_path: Path) -> None:
    write(tmp_path, "train.py", _FULLGRAPH_SCRIPT)
    proc = trace(tmp_path, "-q", "--no-ops", "--json", "r.json", "train.py")
    assert proc.returncode == 0 and proc.stdout == "done\n", proc.stderr
    notes = json.loads((tmp_path / "r.json").read_text())["notes"]
    assert not any("fullgraph" in n for n in notes), notes


def test_an_executor_left_running_finishes_its_queue_before_the_atexit_handlers(tmp_path: Path) -> None:
    """Python, when the script ends, tells a ThreadPoolExecutor that was never shut down to finish
    its queued work and waits for it, then runs the atexit handlers: the trace does the same (and
    does not wait forever for the executor's idle workers)."""
    write(
        tmp_path,
        "train.py",
        """
        import atexit
        import time
        from concurrent.futures import ThreadPoolExecutor

        import torch

        uploads = ThreadPoolExecutor(max_workers=1)
        done = []

        def upload(step):
            time.sleep(0.2)
            done.append(torch.full((2,), float(step)).sum().item())

        atexit.register(lambda: print("uploaded before exit:", done, flush=True))
        for step in range(3):
            uploads.submit(upload, step)
        """,
    )
    proc = trace(tmp_path, "-q", "train.py", timeout=60)
    plain = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == plain.returncode == 0, proc.stderr
    assert proc.stdout == plain.stdout == "uploaded before exit: [0.0, 2.0, 4.0]\n"


def test_torch_first_imported_by_a_thread_is_traced_without_the_per_op_modes(tmp_path: Path) -> None:
    """The op recorder is a dispatch mode, which holds for the thread that enters it: when torch
    is first imported by another thread than the script's, the report says the per-op recording
    stayed off, and the probes still confirm what they see."""
    write(
        tmp_path,
        "train.py",
        """
        import threading
        threading.Thread(target=__import__, args=("torch",)).start()
        import time
        while "torch" not in __import__("sys").modules:
            time.sleep(0.01)
        import torch
        x = torch.ones(4, 4, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = (x @ x).float().sum()
            loss.backward()
        """,
    )
    proc = trace(tmp_path, "-q", "--json", "r.json", "train.py")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert any("not by the script's main thread: the per-op recording" in note for note in report["notes"])
    assert report["ops"] == []
    assert [(f["code"], f["status"]) for f in report["findings"]] == [("AMP003", "confirmed")]


def test_threads_waiting_for_the_main_thread_end_as_under_python(tmp_path: Path) -> None:
    """Python's shutdown counts the main thread as ended before it waits for the others: a
    heartbeat looping while the main thread is alive, and a join of the main thread, end."""
    script = write(tmp_path, "watch.py", """
        import atexit
        import threading
        import time

        import torch


        def heartbeat():
            while threading.main_thread().is_alive():
                time.sleep(0.02)
            print("heartbeat: main thread ended")


        def wait_for_main():
            threading.main_thread().join()
            print("waiter: main thread joined")


        threading.Thread(target=heartbeat).start()
        threading.Thread(target=wait_for_main).start()
        atexit.register(lambda: print("atexit: main thread alive:", threading.main_thread().is_alive()))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            print("out", torch.nn.Linear(4, 2)(torch.randn(3, 4)).dtype)
    """)
    plain = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    proc = trace(tmp_path, "-q", "--json", "r.json", str(script), timeout=60)
    assert proc.returncode == plain.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == sorted(plain.stdout.splitlines())
    assert "heartbeat: main thread ended" in proc.stdout and (tmp_path / "r.json").exists()
    assert "atexit: main thread alive: False" in proc.stdout


def test_a_region_switched_off_is_quoted_where_it_was_built_not_where_another_starts(tmp_path: Path) -> None:
    """`with amp_ctx:` holds no autocast call: the note quotes the construction's `enabled=`,
    not the nested full-precision region on a later line."""
    script = write(tmp_path, "train.py", """
        import argparse

        import torch
        import torch.nn as nn

        parser = argparse.ArgumentParser()
        parser.add_argument("--amp", action="store_true")
        args = parser.parse_args()
        model = nn.Linear(8, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        amp_ctx = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp)
        for step in range(2):
            with amp_ctx:
                logits = model(torch.randn(4, 8))
                with torch.autocast("cpu", enabled=False):
                    loss = nn.functional.cross_entropy(logits.float(), torch.randint(0, 4, (4,)))
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    """)
    proc = trace(tmp_path, "-q", "--json", "r.json", str(script))
    assert proc.returncode == 0, proc.stderr
    [finding] = [f for f in json.loads((tmp_path / "r.json").read_text())["findings"] if f["code"] == "AMP003"]
    assert finding["status"] == "not-reached"
    assert "the region entered at train.py:14 was disabled (enabled=args.amp, set by the script option --amp)" in finding["evidence"]["note"]


def test_a_custom_function_is_judged_by_the_backward_autograd_calls_for_it(tmp_path: Path) -> None:
    """`vjp` with custom_bwd is what autograd runs (no finding), and a subclass that inherits its
    parent's backward has its own runs counted, not the parent's."""
    write(tmp_path, "fused.py", """
        import torch


        class Scale(torch.autograd.Function):
            @staticmethod
            @torch.amp.custom_fwd(device_type="cpu")
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                return grad * 2


        class HalfScale(Scale):
            @staticmethod
            @torch.amp.custom_fwd(device_type="cpu")
            def forward(ctx, x):
                return x * 0.5

            @staticmethod
            def backward(ctx, grad):
                return grad * 0.5


        class Square(torch.autograd.Function):
            @staticmethod
            @torch.amp.custom_fwd(device_type="cpu")
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x * x

            @staticmethod
            @torch.amp.custom_bwd(device_type="cpu")
            def vjp(ctx, grad):
                (x,) = ctx.saved_tensors
                return 2 * x * grad


        class Quarter(Scale):
            @staticmethod
            @torch.amp.custom_fwd(device_type="cpu")
            def forward(ctx, x):
                return x * 0.25


        w = torch.ones(4, requires_grad=True)
        for step in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = Scale.apply(w) + Square.apply(w) + Quarter.apply(w)
            y.sum().backward()
    """)
    proc = trace(tmp_path, "-q", "--json", "r.json", "fused.py")
    assert proc.returncode == 0, proc.stderr
    findings = [f for f in json.loads((tmp_path / "r.json").read_text())["findings"] if f["code"] == "AMP013"]
    assert {f["evidence"]["class"] for f in findings} == {"Scale", "Quarter"}  # not Square: its vjp has custom_bwd
    assert all(f["status"] == "confirmed" and f["evidence"]["backward_runs"] == 2 for f in findings)


def test_a_cuda_region_the_script_switched_off_is_quoted_not_blamed_on_the_machine(tmp_path: Path) -> None:
    write(tmp_path, "train.py", """
        import argparse

        import torch

        parser = argparse.ArgumentParser()
        parser.add_argument("--amp", action="store_true")
        args = parser.parse_args()
        model = torch.nn.Linear(8, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(2):
            with torch.autocast("cuda", enabled=args.amp):
                loss = model(torch.randn(4, 8)).square().mean()
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    """)
    proc = trace(tmp_path, "-q", "--json", "r.json", "train.py")
    assert proc.returncode == 0, proc.stderr
    [finding] = [f for f in json.loads((tmp_path / "r.json").read_text())["findings"] if f["code"] == "AMP003"]
    assert finding["status"] == "not-reached"
    assert "was disabled (enabled=args.amp, set by the script option --amp)" in finding["evidence"]["note"]


SRC_LAYOUT = Path(__file__).resolve().parent.parent / "fixtures" / "trace_projects" / "src_layout"


def _src_layout_project(tmp_path: Path, marker: str | None) -> Path:
    import shutil

    project = tmp_path / "project"
    shutil.copytree(SRC_LAYOUT, project)
    if marker:
        (project / marker).write_text("[project]\nname = 'ampproj'\n")
    return project


def _clip_finding(report: dict) -> dict:
    [clip] = [f for f in report["findings"] if f["code"] == "AMP005"]
    return clip


def test_the_package_beside_a_scripts_folder_is_linted_when_run_from_the_project_top(tmp_path: Path) -> None:
    project = _src_layout_project(tmp_path, marker=None)
    trace(project, "-q", "--json", "r.json", "scripts/train.py")
    clip = _clip_finding(json.loads((project / "r.json").read_text()))
    assert (clip["path"], clip["line"], clip["source"], clip["status"]) == ("src/ampproj/engine.py", 16, "static", "confirmed")


def test_the_repository_around_the_script_is_the_project_when_run_from_its_scripts_folder(tmp_path: Path) -> None:
    project = _src_layout_project(tmp_path, marker="pyproject.toml")
    trace(project / "scripts", "-q", "--json", "r.json", "train.py")
    report = json.loads((project / "scripts" / "r.json").read_text())
    clip = _clip_finding(report)
    assert (clip["path"], clip["source"], clip["status"]) == ("../src/ampproj/engine.py", "static", "confirmed")
    assert "../src/ampproj/engine.py" in report["traced_files"]


def test_the_op_table_folds_a_long_path_rather_than_cut_its_line_number(tmp_path: Path) -> None:
    project = _src_layout_project(tmp_path, marker="pyproject.toml")
    trace(project, "-q", "--json", "r.json", "scripts/train.py")
    report = json.loads((project / "r.json").read_text())
    long_path = "src/ampproj/" + "very_long_subpackage_name/" * 3 + "engine.py"
    for row in report["ops"]:
        row["path"] = long_path
    summary = _terminal_summary(report, project, width=100)
    op_cells = "".join(line.split("│")[1].strip() for line in summary.splitlines() if line.startswith("│"))
    assert f"{long_path}:14" in op_cells


def _plain_steps_after_scaled_backward(tmp_path: Path) -> None:
    write(
        tmp_path,
        "train.py",
        """
        import torch
        from torch import nn
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu")
        for _ in range(3):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(torch.randn(3, 4)).float().pow(2).mean()
            scaler.scale(loss).backward()
            opt.step()
            opt.zero_grad()
        """,
    )


def test_the_summary_names_optimizer_steps_that_bypassed_the_scaler(tmp_path: Path) -> None:
    _plain_steps_after_scaled_backward(tmp_path)
    summary = " ".join(trace(tmp_path, "train.py").stderr.split())
    assert "3 optimizer.step() call(s) bypassed the scaler" in summary and "train.py:11 x3" in summary


def test_the_html_report_names_optimizer_steps_that_bypassed_the_scaler(tmp_path: Path) -> None:
    _plain_steps_after_scaled_backward(tmp_path)
    trace(tmp_path, "-q", "--html", "r.html", "train.py")
    html = (tmp_path / "r.html").read_text()
    assert "3 optimizer.step() call(s) bypassed the scaler" in html and "train.py:11 x3" in html


def test_the_summary_says_how_many_custom_function_calls_had_one_dtype_when_none_mixed(tmp_path: Path) -> None:
    report = _trivial_report(tmp_path)
    report["findings"] = [
        {"code": "AMP013", "path": "train.py", "line": 4, "source": "static", "status": "refuted", "count": 0,
         "evidence": {"class": "Fused", "calls_under_autocast": 10, "mixed_dtype_calls": 0}, "message": ""}
    ]
    summary = " ".join(_terminal_summary(report, tmp_path, 200).split())
    assert "10 call(s) under autocast, none mixing float32 with float16/bfloat16 inputs" in summary


CLIP_BEFORE_UNSCALE = Path(__file__).resolve().parent.parent / "fixtures" / "runtime" / "clip_without_unscale.py"


def _clip_project(tmp_path: Path, pyproject: str | None = None, clip_comment: str = "") -> Path:
    source = CLIP_BEFORE_UNSCALE.read_text()
    if clip_comment:
        source = source.replace("max_norm=1.0)  # line 16: AMP005, 4 times", f"max_norm=1.0)  {clip_comment}")
    (tmp_path / "train.py").write_text(source)
    if pyproject is not None:
        (tmp_path / "pyproject.toml").write_text(pyproject)
    return tmp_path


def _codes_reported(tmp_path: Path) -> list[str]:
    return [f["code"] for f in json.loads((tmp_path / "r.json").read_text())["findings"]]


def test_a_rule_the_projects_configuration_ignores_is_reported_neither_statically_nor_at_run_time(tmp_path: Path) -> None:
    project = _clip_project(tmp_path, '[tool.amplint]\nignore = ["AMP005"]\n')
    trace(project, "-q", "--json", "r.json", "train.py")
    assert "AMP005" not in _codes_reported(project)


def test_a_noqa_comment_silences_the_runtime_finding_at_its_line_too(tmp_path: Path) -> None:
    project = _clip_project(tmp_path, clip_comment="# noqa: AMP005 - clipped on purpose")
    trace(project, "-q", "--json", "r.json", "train.py")
    assert "AMP005" not in _codes_reported(project)


def test_a_noqa_comment_for_another_rule_leaves_the_finding(tmp_path: Path) -> None:
    project = _clip_project(tmp_path, clip_comment="# noqa: AMP003")
    trace(project, "-q", "--json", "r.json", "train.py")
    assert _codes_reported(project) == ["AMP005"]


def test_a_configuration_that_cannot_be_read_is_noted_and_every_rule_runs(tmp_path: Path) -> None:
    project = _clip_project(tmp_path, '[tool.amplint]\nselect = ["AMP999"]\n')
    proc = trace(project, "-q", "--json", "r.json", "train.py")
    report = json.loads((project / "r.json").read_text())
    assert proc.returncode == 0 and [f["source"] for f in report["findings"]] == ["static"]
    assert any("configuration cannot be used" in note and "AMP999" in note for note in report["notes"])


_TRAIN_THEN = """
import torch
from torch import nn
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(torch.randn(8, 4)).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    if step == 1:
        {ending}
"""


def _early_stop_notes(tmp_path: Path, ending: str) -> list[str]:
    write(tmp_path, "train.py", _TRAIN_THEN.replace("{ending}", ending))
    trace(tmp_path, "-q", "--json", "r.json", "train.py")
    return _early_stop_notes_of(tmp_path)


@pytest.mark.parametrize(
    "ending",
    ["raise KeyboardInterrupt", "raise OSError('disk full')", "open('/nonexistent/data.bin')", "import sys; sys.exit(0)"],
    ids=["ctrl-c", "oserror", "missing-file", "exit-0"],
)
def test_a_run_stopped_by_something_no_value_explains_gets_no_early_stop_note(tmp_path: Path, ending: str) -> None:
    assert _early_stop_notes(tmp_path, ending) == []


@pytest.mark.parametrize(
    "ending",
    ["assert loss.item() > 1e9", "raise ValueError('loss is nan')", "import sys; sys.exit(3)"],
    ids=["assert", "nan-message", "exit-3"],
)
def test_a_run_stopped_by_a_test_of_its_values_is_told_what_the_cheap_check_misses(tmp_path: Path, ending: str) -> None:
    [note] = _early_stop_notes(tmp_path, ending)
    assert "no unhandled inf/NaN was seen" in note and "`--nan op`" in note


def test_a_run_stopped_by_anomaly_mode_is_told_where_the_nan_was_and_how_to_find_its_op(tmp_path: Path) -> None:
    write(
        tmp_path,
        "train.py",
        """
        import torch
        from torch import nn
        torch.autograd.set_detect_anomaly(True)
        fc = nn.Linear(8, 8, bias=False)
        opt = torch.optim.SGD(fc.parameters(), lr=0.01)
        for step in range(3):
            x = torch.randn(4, 8)
            if step == 1:
                x[0] = 0
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h = fc(x)
                loss = (h * torch.sqrt(h.pow(2).sum(-1, keepdim=True))).float().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        """,
    )
    proc = trace(tmp_path, "--json", "r.json", "train.py")
    [note] = _early_stop_notes_of(tmp_path)
    assert "anomaly mode found in the backward of SqrtBackward0" in note
    assert "`--nan op --nan-from-step 1`" in note
    assert "no unhandled inf/NaN seen" not in proc.stderr


def _early_stop_notes_of(tmp_path: Path) -> list[str]:
    return [n for n in json.loads((tmp_path / "r.json").read_text())["notes"] if "stopped" in n]


def test_the_message_a_script_exits_with_is_in_the_report(tmp_path: Path) -> None:
    write(tmp_path, "train.py", "import sys\nimport torch\nsys.exit('loss diverged at step 3')\n")
    proc = trace(tmp_path, "--json", "r.json", "train.py")
    assert proc.returncode == 1
    assert json.loads((tmp_path / "r.json").read_text())["exit"] == {
        "status": "exit", "code": 1, "exception": "SystemExit: loss diverged at step 3"
    }
    assert "exit 1 (exit): SystemExit: loss diverged at step 3" in proc.stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CUDA scaler is enabled where CUDA is")
def test_a_loss_scaled_by_a_scaler_that_disabled_itself_names_that_scaler(tmp_path: Path) -> None:
    """PyTorch's AMP recipe run on a machine without CUDA: `GradScaler("cuda")` beside an autocast on
    the script's device scales nothing, and the finding says which scaler and why."""
    write(
        tmp_path,
        "train.py",
        """
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
        net = torch.nn.Linear(8, 8).to(device)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cuda")
        for _ in range(2):
            with torch.autocast(device_type=device, dtype=torch.float16):
                loss = net(torch.randn(4, 8, device=device)).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        """,
    )
    trace(tmp_path, "-q", "--json", "r.json", "train.py")
    report = json.loads((tmp_path / "r.json").read_text())
    [finding] = [f for f in report["findings"] if f["code"] == "AMP009"]
    assert finding["evidence"]["disabled_scaler"] == {"built_at": "train.py:6", "device": "cuda", "why": "device 'cuda' unavailable"}
    assert "no GradScaler.scale()" not in finding["message"] and "GradScaler('cpu')" in finding["message"]
    assert "the scaler at train.py:6 is disabled (device 'cuda' unavailable)" in _terminal_summary(report, tmp_path, 240)


def test_unscaled_float16_gradients_report_the_share_below_float16s_normal_range(tmp_path: Path) -> None:
    write(
        tmp_path,
        "train.py",
        """
        import torch
        net = torch.nn.Linear(64, 64)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = net(torch.randn(32, 64)).float().mean() * 1e-3
            loss.backward()
            opt.step()
            opt.zero_grad()
        """,
    )
    trace(tmp_path, "-q", "--json", "r.json", "train.py")
    report = json.loads((tmp_path / "r.json").read_text())
    [finding] = [f for f in report["findings"] if f["code"] == "AMP009"]
    assert finding["evidence"]["subnormal_grad_fraction"] > 0.5
    summary = _terminal_summary(report, tmp_path, 240)
    assert "of non-zero ones below float16's normal range" in summary and "zero grads" not in summary


def test_the_op_table_shows_float32_compute_in_a_low_precision_region_before_casts(tmp_path: Path) -> None:
    """A line whose ops outnumber the table's rows (a model's forward) shows first what an AMP
    user looks for: a float32 matmul under bfloat16 autocast, not autocast's own casts."""
    cast = {"op": "aten::_to_copy", "path": "train.py", "line": 3, "count": 100, "autocast": {"device": "cpu", "dtype": "bfloat16"},
            "input_dtypes": ["float32"], "output_dtypes": ["bfloat16"], "phase": "forward"}
    rows = [cast] * 10 + [
        {"op": "aten::bmm", "path": "train.py", "line": 3, "count": 2, "autocast": {"device": "cpu", "dtype": "bfloat16"},
         "input_dtypes": ["float32", "float32"], "output_dtypes": ["float32"], "phase": "forward"},
        {"op": "aten::_foreach_norm.Scalar", "path": "train.py", "line": 4, "count": 1, "autocast": None,
         "input_dtypes": ["float32"] * 30, "output_dtypes": ["float32"] * 30, "phase": "forward"},
    ]
    report = dict(_trivial_report(tmp_path), ops=rows)
    summary = _terminal_summary(report, tmp_path, 200)
    op_rows = [line.split("│")[1].strip() for line in summary.splitlines() if line.startswith("│")]
    assert op_rows.index("bmm") < op_rows.index("_to_copy")
    assert "... 3 more" in op_rows and "in the JSON report (--json FILE)" in summary
    assert "f32 x30 -> f32 x30" in summary


def test_a_region_switching_off_another_devices_autocast_is_said_to_switch_off_nothing(tmp_path: Path) -> None:
    """A GPU repository's "loss in fp32" block, `autocast("cuda", enabled=False)`, run under a CPU
    autocast: the ops inside still run in bfloat16. A block switching off the CPU's own autocast
    gets no such note."""
    write(
        tmp_path,
        "train.py",
        """
        import torch
        model = torch.nn.Linear(8, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(2):
            x, y = torch.randn(4, 8), torch.randn(4, 4)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                pred = model(x)
                with torch.autocast("cuda", enabled=False):
                    d = pred - y
                    loss = (d @ d.t()).diagonal().mean()
                with torch.autocast("cpu", enabled=False):
                    other = (pred.float() - y).pow(2).mean()
            (loss + other).backward()
            opt.step()
            opt.zero_grad()
        """,
    )
    trace(tmp_path, "-q", "--json", "r.json", "train.py")
    report = json.loads((tmp_path / "r.json").read_text())
    [note] = [n for n in report["notes"] if "switched nothing off" in n]
    assert note.startswith('autocast("cuda", enabled=False) at train.py:9 ran inside an enabled cpu autocast region (bfloat16)')
    [finding] = [f for f in report["findings"] if f["code"] == "AMP014" and f["line"] == 9]  # `pred` uncast
    assert finding["status"] == "not-reached" and "which it leaves on" in finding["evidence"]["note"]


def test_checking_low_precision_values_in_a_disabled_region_is_not_computing_with_them(tmp_path: Path) -> None:
    """`torch.isfinite(h)` and `h > 0` read a bfloat16 `h` in an fp32 block (isfinite is `abs`
    and `ne` inside); `h.sum()` computes with it."""
    write(
        tmp_path,
        "train.py",
        """
        import torch
        model = torch.nn.Linear(8, 8)
        for step in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h = model(torch.randn(4, 8))
                with torch.autocast("cpu", enabled=False):
                    assert torch.isfinite(h).all() and not h.isnan().any()
                    positive = h > 0
                    total = h.sum()
        """,
    )
    trace(tmp_path, "-q", "--json", "r.json", "train.py")
    findings = [f for f in json.loads((tmp_path / "r.json").read_text())["findings"] if f["code"] == "AMP014"]
    [confirmed] = [f for f in findings if f["status"] == "confirmed"]
    assert confirmed["evidence"]["ops"] == [{"op": "aten::sum", "line": "train.py:10", "input_dtypes": ["bfloat16"], "count": 2}]


def test_a_double_dash_before_the_scripts_arguments_is_explained_when_argparse_refuses_it(tmp_path: Path) -> None:
    write(
        tmp_path,
        "train.py",
        """
        import argparse
        import torch
        parser = argparse.ArgumentParser()
        parser.add_argument("--lr", type=float, required=True)
        parser.parse_args()
        """,
    )
    proc = trace(tmp_path, "-q", "--json", "r.json", "train.py", "--", "--lr", "0.1")
    assert proc.returncode == 2
    [note] = [n for n in json.loads((tmp_path / "r.json").read_text())["notes"] if "drop the `--`" in n]
    assert note.startswith("the script exited 2 (argparse's usage error?) with `--` as its first argument")
    assert trace(tmp_path, "-q", "--json", "r.json", "--", "train.py", "--lr", "0.1").returncode == 0


def test_an_input_beyond_float16s_range_is_named_as_the_cast_that_overflowed(tmp_path: Path) -> None:
    write(
        tmp_path,
        "train.py",
        """
        import torch
        model = torch.nn.Linear(8, 1)
        x = torch.randn(4, 8) * 1e5  # unnormalised
        with torch.autocast("cpu", dtype=torch.float16):
            y = model(x)
        """,
    )
    trace(tmp_path, "-q", "--nan", "op", "--json", "r.json", "train.py")
    nonfinite = json.loads((tmp_path / "r.json").read_text())["nonfinite"]
    assert (nonfinite["op"], nonfinite["line"], nonfinite["inputs_finite"]) == ("aten::_to_copy", 6, True)
    assert nonfinite["detail"].startswith("a cast of float32 values up to ")
    assert "to float16, whose largest is 65504" in nonfinite["detail"]


def test_a_scaled_gradient_overflowing_a_backward_cast_is_named_as_the_scalers_own_calibration(tmp_path: Path) -> None:
    """The first step of the float16 recipe overflows in backward because the scale starts at 65536:
    the cast is of scaled gradients, not an input to normalise."""
    write(
        tmp_path,
        "train.py",
        """
        import torch
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu")
        for step in range(3):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(torch.randn(4, 8)).float().mean() * 10
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        """,
    )
    trace(tmp_path, "-q", "--nan", "op", "--json", "r.json", "train.py")
    nonfinite = json.loads((tmp_path / "r.json").read_text())["nonfinite"]
    assert (nonfinite["op"], nonfinite["phase"], nonfinite["handled_by_scaler"]) == ("aten::_to_copy", "backward", True)
    assert "in backward: gradients carrying the GradScaler's scale" in nonfinite["detail"]
    assert "normalise" not in nonfinite["detail"]


@pytest.mark.parametrize("mode", ["module", "op"])
def test_per_sample_gradients_under_vmap_run_as_they_do_untraced(tmp_path: Path, mode: str) -> None:
    """The value checks leave torch.func's batched tensors alone: reading them in Python is an
    error inside vmap, and the trace must not fail a run that passes."""
    write(
        tmp_path,
        "train.py",
        """
        import torch
        from torch.func import functional_call, grad, vmap
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        params = {k: v.detach() for k, v in model.named_parameters()}
        def loss_fn(p, x, y):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = functional_call(model, p, (x[None],))
            return (out.float().squeeze() - y) ** 2
        for step in range(2):
            g = vmap(grad(loss_fn), in_dims=(None, 0, 0))(params, torch.randn(4, 8), torch.randn(4))
        print("ok")
        """,
    )
    proc = trace(tmp_path, "-q", "--nan", mode, "train.py")
    assert (proc.returncode, proc.stdout) == (0, "ok\n"), proc.stderr


def test_scalers_one_line_builds_side_by_side_are_reported_apart(tmp_path: Path) -> None:
    """A GAN's `scaler_g, scaler_d = GradScaler(), GradScaler()`: each backs off on its own, so
    each has its own steps and scales; a line that builds one scaler per epoch keeps one entry."""
    write(
        tmp_path,
        "train.py",
        """
        import torch
        g, d = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
        opt_g, opt_d = torch.optim.SGD(g.parameters(), lr=0.1), torch.optim.SGD(d.parameters(), lr=0.1)
        scaler_g, scaler_d = torch.amp.GradScaler("cpu"), torch.amp.GradScaler("cpu")
        for step in range(3):
            for scaler, model, opt in ((scaler_d, d, opt_d), (scaler_g, g, opt_g)):
                with torch.autocast("cpu", dtype=torch.float16):
                    loss = model(torch.randn(2, 4)).float().mean()
                scaler.scale(loss).backward()
                if step == 1 and model is d:
                    d.weight.grad[0, 0] = float("inf")
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()
        for epoch in range(2):
            per_epoch = torch.amp.GradScaler("cpu")
            per_epoch.scale(g(torch.randn(2, 4)).mean()).backward()
            per_epoch.step(opt_g)
            per_epoch.update()
        """,
    )
    trace(tmp_path, "-q", "--json", "r.json", "train.py")
    scaler = json.loads((tmp_path / "r.json").read_text())["scaler"]
    built = [(c["line"], c.get("nth_on_line"), c["count"], c["steps_attempted"], c["steps_skipped"]) for c in scaler["constructions"]]
    # D's first step overflows at the initial scale too, as in a plain run; G's never does.
    assert built == [(5, 1, 1, 3, 0), (5, 2, 1, 3, 2), (17, None, 2, 2, 0)]
    assert {t["scaler"] for t in scaler["timeline"]} == {"train.py:5", "train.py:5#2", "train.py:17"}


def test_a_float64_model_under_autocast_is_said_to_compute_in_float64(tmp_path: Path) -> None:
    write(
        tmp_path,
        "train.py",
        """
        import torch
        model = torch.nn.Linear(8, 4).double()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            wide = model(torch.randn(4, 8, dtype=torch.float64))
            narrow = model.float()(torch.randn(4, 8))
        """,
    )
    trace(tmp_path, "-q", "--json", "r.json", "train.py")
    [note] = [n for n in json.loads((tmp_path / "r.json").read_text())["notes"] if "float64" in n]
    assert note.startswith("1 call(s) of ops autocast runs in bfloat16 got float64 inputs and ran in float64 (first aten::addmm at train.py:5)")


def test_the_summary_of_a_frozen_teacher_says_it_ran_forward_frozen(tmp_path: Path) -> None:
    """AMP002 refuted for a converted teacher run under no_grad: it did run under autocast."""
    report = _trivial_report(tmp_path)
    report["findings"] = [{
        "code": "AMP002", "status": "refuted", "count": 0, "path": "train.py", "line": 6, "source": "static",
        "evidence": {"module": "Sequential", "converted_to": "bfloat16", "forwards_frozen": 8},
    }]
    summary = " ".join(_terminal_summary(report, tmp_path, 250).split())
    assert "converted module ran forward 8x under autocast, frozen or with gradients off" in summary


def test_the_summary_of_a_grad_read_counts_reads_and_a_later_norm_shows_its_own_scale(tmp_path: Path) -> None:
    report = _trivial_report(tmp_path)
    report["findings"] = [
        {"code": "AMP005", "status": "confirmed", "count": 4, "path": "train.py", "line": 12, "source": "static",
         "evidence": {"executions": 4, "on_scaled_gradients": 4, "first_step": 0, "scale": 256.0}},
        {"code": "AMP005", "status": "confirmed", "count": 3, "path": "train.py", "line": 20, "source": "static",
         "evidence": {"clip_calls": 3, "on_scaled_gradients": 3, "scale": 65536.0, "total_norm_seen": 36112.0,
                      "total_norm_unscaled": 1.102, "norm_step": 1, "norm_scale": 32768.0}},
    ]
    summary = " ".join(_terminal_summary(report, tmp_path, 300).split())
    assert "4 read(s) of still-scaled gradients (scale 256)" in summary
    assert "3 clip(s) on still-scaled gradients (scale 65536); norm 3.611e+04 seen at step 1 (scale 32768), 1.102 unscaled" in summary


def _simulated(tmp_path: Path, source: str) -> dict:
    script = write(tmp_path, "sim.py", source)
    result = trace(tmp_path, "-q", "--simulate", "cuda", "--json", "r.json", str(script))
    assert result.returncode == 0, result.stderr
    return json.loads((tmp_path / "r.json").read_text())["simulation"]


def test_simulate_cuda_follows_a_tensor_made_inside_the_region_as_a_cuda_tensor(tmp_path: Path) -> None:
    """`torch.randn(4, 8)` in the region has no device: the GPU run's code makes it on CUDA too,
    so the softmax of it follows CUDA's policy (float32), like that of a tensor made outside."""
    simulation = _simulated(tmp_path, """
        import torch
        w = torch.randn(8, 8)
        with torch.autocast("cpu", dtype=torch.float16):
            a = torch.randn(4, 8).half()
            b = w.half()
            pa = torch.softmax(a, dim=-1)
            pb = torch.softmax(b, dim=-1)
    """)
    softmax = {d["line"]: d["simulated_output_dtypes"] for d in simulation["differences"] if d["op"] == "torch.softmax"}
    assert softmax == {7: ["float32"], 8: ["float32"]}


def test_simulate_cuda_carries_a_dtype_through_indexing_and_never_guesses_after_a_failed_call(tmp_path: Path) -> None:
    simulation = _simulated(tmp_path, """
        import torch
        import torch.nn.functional as F
        torch.manual_seed(0)
        enc = torch.nn.Linear(8, 8)
        x = torch.randn(2, 5, 8)
        with torch.autocast("cpu", dtype=torch.float16):
            h = F.layer_norm(enc(x), (8,))
            cls = h[:, 0]
            g = F.gelu(cls)
            distinct = torch.unique(h)  # data-dependent shape: fake tensors cannot run it
            after = F.gelu(distinct)
    """)
    simulated = {(c["function"], c["line"]): c["simulated_output_dtypes"] for c in simulation["calls"]}
    assert simulated[("torch.Tensor.__getitem__", 9)] == ["float32"]  # layer_norm's float32, indexed
    assert simulated[("torch.nn.functional.gelu", 10)] == ["float32"]  # not the CPU run's float16
    not_simulated = {entry["line"]: entry["error"] for entry in simulation["not_simulated"]}
    assert 11 in not_simulated
    assert not_simulated[12] == "an input comes from a call that was not simulated"
    assert ("torch.nn.functional.gelu", 12) not in simulated


def test_python_programs_the_script_runs_are_listed_and_other_commands_are_not(tmp_path: Path) -> None:
    """A sweep launcher: each Python run it starts is separate and untraced; `echo` is not one."""
    write(
        tmp_path,
        "sweep.py",
        """
        import os
        import subprocess
        import sys

        for lr in ("0.1", "0.01"):
            subprocess.run([sys.executable, "-c", "pass"], check=True)
        subprocess.run(["echo", "logged"], check=True)
        os.system("OMP_NUM_THREADS=1 python -c pass")
        """,
    )
    proc = trace(tmp_path, "--json", "r.json", "sweep.py")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["untraced_processes"] == [
        {"path": "sweep.py", "line": 7, "count": 2, "how": "program"},
        {"path": "sweep.py", "line": 9, "count": 1, "how": "program"},
    ]
    assert any(note.startswith("the script ran 3 Python program(s) that amplint does not trace (sweep.py:7, sweep.py:9)") for note in report["notes"])
    # Nothing to check here is no sign of inference or an early end: the programs may have trained.
    assert any(note.startswith("--nan cheap checked nothing in this process") for note in report["notes"]), report["notes"]
