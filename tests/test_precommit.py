"""`.pre-commit-hooks.yaml`, exercised by the real pre-commit tool.

Hooks are installed from this repository's committed HEAD (`--ref`/`rev` below), so the answers
do not depend on anyone's uncommitted work. Building the hook environment pip-installs amplint
from that clone (its dependencies come from the package index) and takes ~15 s. `try-repo`
builds it afresh on every call (it uses a throw-away store), so one test runs `try-repo` itself
and the others run what try-repo runs, `pre-commit run` with a config naming this repository at
HEAD, sharing one store.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
BAD = "import torch\nfrom torch.cuda.amp import GradScaler\nscaler = GradScaler()\n"
CLEAN = 'import torch\nscaler = torch.amp.GradScaler("cuda")\n'
OFFLINE_SIGNS = ("Failed to establish a new connection", "Temporary failure in name resolution", "No matching distribution found")

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _pre_commit() -> list[str]:
    return [sys.executable, "-m", "pre_commit"]


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def pre_commit_env(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One hook environment for the whole module: it is built once, on the first try-repo."""
    pytest.importorskip("pre_commit")
    home = tmp_path_factory.mktemp("pre-commit-home")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PRE_COMMIT", "GIT_", "VIRTUAL_ENV"))}
    return {**environ, "PRE_COMMIT_HOME": str(home), "NO_COLOR": "1", "PRE_COMMIT_COLOR": "never"}


@pytest.fixture(scope="module")
def head() -> str:
    ref = _git("rev-parse", "HEAD", cwd=REPO)
    _git("cat-file", "-e", f"{ref}:.pre-commit-hooks.yaml", cwd=REPO)  # committed, so try-repo sees it
    return ref


def make_repo(tmp_path: Path, files: dict[str, str]) -> Path:
    repo = tmp_path / "user-repo"
    repo.mkdir(parents=True)
    _git("init", "-q", cwd=repo)
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text, encoding="utf-8")
    _git("add", "-A", cwd=repo)
    return repo


def try_repo(hook: str, repo: Path, env: dict, ref: str) -> subprocess.CompletedProcess:
    """`pre-commit try-repo REPO HOOK --ref HEAD --all-files` (a fresh hook environment)."""
    return _pre_commit_run(["try-repo", str(REPO), hook, "--ref", ref, "--all-files"], repo, env)


def run_hook(hook: str, repo: Path, env: dict, ref: str) -> subprocess.CompletedProcess:
    """The same as try_repo, with the module's shared store: the environment is built once."""
    config = repo.parent / "pre-commit-config.yaml"
    config.write_text(yaml.safe_dump({"repos": [{"repo": str(REPO), "rev": ref, "hooks": [{"id": hook}]}]}), encoding="utf-8")
    return _pre_commit_run(["run", "--config", str(config), "--all-files"], repo, env)


def _pre_commit_run(args: list[str], repo: Path, env: dict) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [*_pre_commit(), *args, "--color", "never"], cwd=repo, env=env, capture_output=True, text=True, timeout=600,
    )
    output = result.stdout + result.stderr
    if result.returncode == 3 and any(sign in output for sign in OFFLINE_SIGNS):
        pytest.skip("the hook environment needs the package index, which is unreachable")
    assert "An unexpected error has occurred" not in output, output
    return result


def test_hooks_file_declares_both_hooks() -> None:
    hooks = {hook["id"]: hook for hook in yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))}
    assert set(hooks) == {"amplint", "amplint-fix"}
    for hook in hooks.values():
        assert hook["language"] == "python"
        assert hook["types_or"] == ["python", "pyi"]
        assert hook["require_serial"] is False
        assert hook["entry"].split()[0] == "amplint" and "--force-exclude" in hook["entry"].split()
    assert "--fix" in hooks["amplint-fix"]["entry"].split() and "--fix" not in hooks["amplint"]["entry"].split()


def test_try_repo_fails_on_a_bad_file_with_the_finding(tmp_path: Path, pre_commit_env: dict, head: str) -> None:
    repo = make_repo(tmp_path, {"train.py": BAD})
    result = try_repo("amplint", repo, pre_commit_env, head)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Failed" in result.stdout
    assert "train.py:2:28: AMP001" in result.stdout


def test_hook_passes_on_a_clean_file(tmp_path: Path, pre_commit_env: dict, head: str) -> None:
    repo = make_repo(tmp_path, {"train.py": CLEAN, "notes.txt": "from torch.cuda.amp import GradScaler\n"})
    result = run_hook("amplint", repo, pre_commit_env, head)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Passed" in result.stdout


def test_hook_honours_exclude_for_files_pre_commit_names(tmp_path: Path, pre_commit_env: dict, head: str) -> None:
    repo = make_repo(tmp_path, {
        "pyproject.toml": '[tool.amplint]\nexclude = ["vendor/"]\n',
        "vendor/old.py": BAD,
        "train.py": CLEAN,
    })
    result = run_hook("amplint", repo, pre_commit_env, head)
    assert result.returncode == 0, result.stdout + result.stderr
    unforced = make_repo(tmp_path / "b", {"vendor/old.py": BAD})  # no exclude: the same file fails
    assert run_hook("amplint", unforced, pre_commit_env, head).returncode == 1


def test_fix_hook_rewrites_the_file(tmp_path: Path, pre_commit_env: dict, head: str) -> None:
    repo = make_repo(tmp_path, {"train.py": BAD})
    result = run_hook("amplint-fix", repo, pre_commit_env, head)
    assert result.returncode == 1  # pre-commit fails a hook that modified files
    assert "files were modified by this hook" in result.stdout
    fixed = (repo / "train.py").read_text(encoding="utf-8")
    assert "torch.cuda.amp" not in fixed and 'GradScaler("cuda")' in fixed
    again = run_hook("amplint-fix", repo, pre_commit_env, head)
    assert again.returncode == 0, again.stdout + again.stderr
