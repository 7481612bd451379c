"""`--fix` for AMP001 and AMP005: exact output, idempotence, no-fix cases, min-torch, encodings."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import libcst
import pytest

FIXTURES = Path(__file__).parent.parent / "fixtures" / "fix"
CASES = sorted(p.name.removesuffix(".fixed.py") for p in FIXTURES.glob("*.fixed.py"))


def fix_options(case: str) -> tuple[str, ...]:
    """A case named `unsafe_*` shows fixes that need `--unsafe-fixes`."""
    return ("--fix", "--unsafe-fixes") if case.startswith("unsafe_") else ("--fix",)


def amplint(*args: str, cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "amplint", *args], cwd=cwd, input=stdin, capture_output=True, timeout=120
    )


@pytest.mark.parametrize("case", CASES)
def test_fix_rewrites_file_exactly_as_expected(case: str, tmp_path: Path) -> None:
    target = tmp_path / f"{case}.py"
    shutil.copy(FIXTURES / f"{case}.py", target)
    amplint(*fix_options(case), "--no-cache", target.name, cwd=tmp_path)
    assert target.read_text() == (FIXTURES / f"{case}.fixed.py").read_text()


@pytest.mark.parametrize("case", CASES)
def test_second_fix_changes_nothing(case: str, tmp_path: Path) -> None:
    target = tmp_path / f"{case}.py"
    shutil.copy(FIXTURES / f"{case}.fixed.py", target)
    before = target.read_bytes()
    amplint(*fix_options(case), "--no-cache", target.name, cwd=tmp_path)
    assert target.read_bytes() == before


@pytest.mark.parametrize("case", CASES)
def test_fixed_output_parses_and_has_no_fixable_findings(case: str, tmp_path: Path) -> None:
    target = tmp_path / f"{case}.py"
    shutil.copy(FIXTURES / f"{case}.py", target)
    amplint(*fix_options(case), "--no-cache", target.name, cwd=tmp_path)
    libcst.parse_module(target.read_text())
    report = amplint("--format", "json", "--no-cache", target.name, cwd=tmp_path)
    assert '"fix": {' not in report.stdout.decode()


def test_unfixable_cases_are_reported_and_left_byte_identical(tmp_path: Path) -> None:
    target = tmp_path / "no_fix_cases.py"
    shutil.copy(FIXTURES / "no_fix_cases.py", target)
    result = amplint("--fix", "--no-cache", "--format", "concise", target.name, cwd=tmp_path)
    assert target.read_bytes() == (FIXTURES / "no_fix_cases.py").read_bytes()
    assert result.returncode == 1
    codes = [line.split()[1] for line in result.stdout.decode().splitlines() if line.startswith("no_fix_cases.py")]
    assert codes == ["AMP001", "AMP001", "AMP001", "AMP005", "AMP007", "AMP001"]


def test_autocast_fix_that_cannot_name_the_dtype_waits_for_unsafe_fixes(tmp_path: Path) -> None:
    """With no name for torch in the file, `autocast("cuda")` would take an enclosing region's dtype."""
    target = tmp_path / "unsafe_no_torch_name.py"
    shutil.copy(FIXTURES / "unsafe_no_torch_name.py", target)
    result = amplint("--fix", "--no-cache", "--format", "concise", target.name, cwd=tmp_path)
    assert target.read_bytes() == (FIXTURES / "unsafe_no_torch_name.py").read_bytes()
    assert "4 more with `--unsafe-fixes`" in result.stdout.decode()


def test_diff_prints_the_change_and_writes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "rooted_calls.py"
    shutil.copy(FIXTURES / "rooted_calls.py", target)
    result = amplint("--diff", "--no-cache", target.name, cwd=tmp_path)
    assert target.read_bytes() == (FIXTURES / "rooted_calls.py").read_bytes()
    assert '+scaler = T.amp.GradScaler("cuda", 2.0**10, growth_interval=100)' in result.stdout.decode()


def test_min_torch_withholds_replacements_that_do_not_exist_yet(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.amplint]\nmin-torch = "2.2"\n')
    target = tmp_path / "rooted_calls.py"
    shutil.copy(FIXTURES / "rooted_calls.py", target)
    amplint("--fix", "--no-cache", target.name, cwd=tmp_path)
    fixed = target.read_text()
    assert "T.cuda.amp.GradScaler(2.0**10" in fixed  # torch.amp.GradScaler needs 2.3
    assert 'T.amp.autocast("cpu", dtype=T.bfloat16)' in fixed  # autocast's replacement is old enough
    assert "T.get_autocast_cpu_dtype()" in fixed  # get_autocast_dtype needs 2.4


def test_a_ci_requirements_pin_withholds_replacements_its_torch_lacks(tmp_path: Path) -> None:
    """icefall pins torch 1.13.1 for its CI in requirements-ci.txt: `torch.amp.custom_fwd` (2.4)
    would break the module on that torch, so the finding keeps no fix."""
    (tmp_path / "requirements.txt").write_text("lhotse\n")
    (tmp_path / "requirements-ci.txt").write_text("-f https://download.pytorch.org/whl/cpu/torch_stable.html torch==1.13.1+cpu\n")
    source = "import torch\nfrom torch.cuda.amp import custom_fwd\n\n\n@custom_fwd\ndef forward(ctx, x):\n    return x\n"
    target = tmp_path / "scaling.py"
    target.write_text(source)
    done = amplint("--fix", "--no-cache", target.name, cwd=tmp_path)
    assert target.read_text() == source
    assert b"AMP001" in done.stdout


def test_a_sub_projects_requirements_bound_its_files_in_a_walk_from_the_root(tmp_path: Path) -> None:
    """A monorepo of examples: the root names no torch, `app/requirements.txt` pins 1.13.1. Checked
    from the root, app's files get only the fixes that torch runs (autocast's spelling of torch
    2.1 and older; no `torch.amp.GradScaler`, which needs 2.3)."""
    (tmp_path / "requirements.txt").write_text("numpy\n")
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "requirements.txt").write_text("torch==1.13.1\n")
    target = tmp_path / "app" / "train.py"
    target.write_text("import torch\n\nscaler = torch.cuda.amp.GradScaler()\nwith torch.cuda.amp.autocast():\n    pass\n")
    amplint("--fix", "--no-cache", ".", cwd=tmp_path)
    assert target.read_text() == (
        'import torch\n\nscaler = torch.cuda.amp.GradScaler()\nwith torch.autocast("cuda", dtype=torch.float16):\n    pass\n'
    )


def test_fix_keeps_bom_crlf_and_latin1_bytes_outside_the_edit(tmp_path: Path) -> None:
    bom_crlf = b"\xef\xbb\xbfimport torch\r\n# caf\xc3\xa9\r\nwith torch.cuda.amp.autocast():\r\n    pass\r\n"
    latin1 = b"# -*- coding: latin-1 -*-\nimport torch\n# caf\xe9\nctx = torch.cpu.amp.autocast(True)\n"
    (tmp_path / "bom.py").write_bytes(bom_crlf)
    (tmp_path / "latin.py").write_bytes(latin1)
    amplint("--fix", "--no-cache", "bom.py", "latin.py", cwd=tmp_path)
    assert (tmp_path / "bom.py").read_bytes() == bom_crlf.replace(
        b"torch.cuda.amp.autocast()", b'torch.amp.autocast("cuda", dtype=torch.float16)'
    )
    assert (tmp_path / "latin.py").read_bytes() == latin1.replace(
        b"torch.cpu.amp.autocast(True)", b'torch.amp.autocast("cpu", dtype=torch.bfloat16, enabled=True)'
    )


def test_fix_keeps_file_permissions(tmp_path: Path) -> None:
    target = tmp_path / "script.py"
    target.write_text("import torch\nwith torch.cuda.amp.autocast():\n    pass\n")
    target.chmod(0o754)
    amplint("--fix", "--no-cache", target.name, cwd=tmp_path)
    assert target.stat().st_mode & 0o777 == 0o754


def test_fixed_cpu_autocast_still_runs_in_the_same_dtype(tmp_path: Path) -> None:
    """The positional-argument trap: the fixed call must keep `enabled` and `dtype` where they were."""
    pytest.importorskip("torch")
    script = tmp_path / "run.py"
    script.write_text(
        "import torch\n"
        "with torch.cpu.amp.autocast(True, torch.bfloat16):\n"
        "    inside = (torch.is_autocast_enabled('cpu'), torch.get_autocast_dtype('cpu'))\n"
        "print(inside == (True, torch.bfloat16))\n"
    )
    amplint("--fix", "--no-cache", script.name, cwd=tmp_path)
    assert "torch.amp.autocast" in script.read_text()
    run = subprocess.run([sys.executable, "-W", "error::FutureWarning", str(script)], capture_output=True, timeout=120)
    assert run.stdout.decode().strip() == "True", run.stderr.decode()


def test_fixed_checkpoint_of_a_scaler_built_under_a_constructor_argument_saves_without_amp(tmp_path: Path) -> None:
    """Without AMP the attribute never exists: the added entry must not raise on those runs."""
    pytest.importorskip("torch")
    case = "unsafe_scaler_built_under_a_constructor_argument"
    shutil.copy(FIXTURES / f"{case}.py", tmp_path / "trainer.py")
    amplint("--fix", "--unsafe-fixes", "--no-cache", "trainer.py", cwd=tmp_path)
    run = subprocess.run(
        [sys.executable, "-c",
         "import types, torch, trainer\n"
         "t = trainer.Trainer(types.SimpleNamespace(enable_amp=False), torch.nn.Linear(2, 1))\n"
         "t.train_step(torch.ones(3, 2))\n"
         "t.save_checkpoint('ckpt.pt')\n"
         "print(sorted(torch.load('ckpt.pt')))\n"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    assert run.stdout.strip() == "['model', 'optimizer', 'scaler']", run.stderr


def test_fixed_autocast_keeps_its_dtype_inside_an_enclosing_region(tmp_path: Path) -> None:
    """`torch.cpu.amp.autocast()` computes in bfloat16 even inside a float16 region; the fixed call
    must too, where `torch.amp.autocast("cpu")` alone would take the enclosing float16."""
    pytest.importorskip("torch")
    script = tmp_path / "run.py"
    script.write_text(
        "import torch\n"
        "with torch.autocast('cpu', dtype=torch.float16):\n"
        "    with torch.cpu.amp.autocast():\n"
        "        inside = torch.get_autocast_dtype('cpu')\n"
        "print(inside == torch.bfloat16)\n"
    )
    amplint("--fix", "--no-cache", script.name, cwd=tmp_path)
    assert 'torch.amp.autocast("cpu", dtype=torch.bfloat16)' in script.read_text()
    run = subprocess.run([sys.executable, "-W", "error::FutureWarning", str(script)], capture_output=True, timeout=120)
    assert run.stdout.decode().strip() == "True", run.stderr.decode()


def test_min_torch_moves_autocast_out_of_an_import_it_shares_with_a_gradscaler_that_must_stay(tmp_path: Path) -> None:
    """torch.amp.GradScaler needs torch 2.3; autocast's replacement is older. With `min-torch = "1.10"`,
    the GradScaler keeps its import (and its finding, without a fix) and autocast leaves it."""
    (tmp_path / "pyproject.toml").write_text('[tool.amplint]\nmin-torch = "1.10"\n')
    target = tmp_path / "train.py"
    target.write_text(
        "import torch\nfrom torch.cuda.amp import autocast, GradScaler\n\n"
        "scaler = GradScaler()\nwith autocast():\n    pass\n"
    )
    amplint("--fix", "--no-cache", target.name, cwd=tmp_path)
    assert target.read_text() == (
        "import torch\nfrom torch.cuda.amp import GradScaler\n\n"
        'scaler = GradScaler()\nwith torch.autocast("cuda", dtype=torch.float16):\n    pass\n'
    )
    remaining = amplint("--no-cache", "--format", "concise", target.name, cwd=tmp_path).stdout.decode()
    assert "GradScaler" in remaining and "[*]" not in remaining


def test_min_torch_below_2_1_imports_autocast_from_torch_itself(tmp_path: Path) -> None:
    """`from torch.amp import autocast` is not known before torch 2.1; `torch.autocast` is there
    from 1.10, so a project on `torch>=1.10` (LAVIS) gets `from torch import autocast`."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "demo"\nversion = "0"\ndependencies = ["torch>=1.10.0"]\n')
    target = tmp_path / "blip2.py"
    target.write_text("import torch\nfrom torch.cuda.amp import autocast\n\nwith autocast():\n    pass\n")
    amplint("--fix", "--no-cache", target.name, cwd=tmp_path)
    assert target.read_text() == 'import torch\nfrom torch import autocast\n\nwith autocast("cuda", dtype=torch.float16):\n    pass\n'
