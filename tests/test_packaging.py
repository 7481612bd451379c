"""The wheel: the rule catalogue ships inside it, and torch is only an extra."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if built.returncode != 0:
        pytest.skip(f"cannot build a wheel here: {built.stderr.strip().splitlines()[-1:]}")
    return next(out.glob("amplint-*.whl"))


def test_wheel_ships_every_rule_document(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for document in (ROOT / "rules").glob("AMP*.md"):
        assert f"amplint/_rules/{document.name}" in names


def test_torch_is_only_an_optional_dependency(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(archive.read(n).decode() for n in archive.namelist() if n.endswith("METADATA"))
    requirements = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    torch = [line for line in requirements if "torch" in line.split(";")[0]]
    assert torch and all("extra ==" in line for line in torch)


def test_the_static_checker_never_imports_torch() -> None:
    probe = (
        "import runpy, sys\n"
        "sys.argv = ['amplint', '--no-cache', '-q', 'examples/']\n"
        "try:\n    runpy.run_module('amplint', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr


def test_an_installation_without_rule_documents_fails_loudly(tmp_path: Path) -> None:
    """A package copied without its rules must not check nothing and report success."""
    import shutil

    shutil.copytree(ROOT / "amplint", tmp_path / "amplint", ignore=shutil.ignore_patterns("__pycache__", "_rules"))
    (tmp_path / "train.py").write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n", encoding="utf-8")
    site = [p for p in sys.path if p.endswith("site-packages")]
    code = f"import sys; sys.path[:0] = {[str(tmp_path), *site]!r}; from amplint.cli import main; main()"
    # -S: no site processing, so the editable install's finder cannot bring the real package back.
    result = subprocess.run(
        [sys.executable, "-S", "-c", code, "check", "train.py", "--no-cache"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == f"amplint: internal error: RuntimeError: no rule documentation in {tmp_path / 'rules'}; reinstall amplint"
