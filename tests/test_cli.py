"""The click layer: `amplint PATH` is `amplint check PATH`, one-line errors, no tracebacks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from amplint import __version__
from amplint.cli import main

BAD = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"


def amplint(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "amplint", *args], capture_output=True, text=True, cwd=cwd, timeout=120,
        env={**os.environ, "NO_COLOR": "1"},
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(BAD, encoding="utf-8")
    return tmp_path


def test_path_alone_means_check(project: Path) -> None:
    implicit = amplint("train.py", "--no-cache", "--format", "concise", "--select", "AMP001", cwd=project)
    explicit = amplint("check", "train.py", "--no-cache", "--format", "concise", "--select", "AMP001", cwd=project)
    assert implicit.returncode == explicit.returncode == 1
    assert implicit.stdout == explicit.stdout and "train.py:2:10: AMP001" in implicit.stdout


def test_a_selection_that_names_no_rule_is_a_usage_error(project: Path) -> None:
    """`--select ""` (an unset CI variable) would pass every file having checked nothing."""
    result = amplint("train.py", "--select", "", cwd=project)
    assert result.returncode == 2
    assert result.stderr.strip() == "amplint: error: --select names no rule code (give codes or prefixes such as AMP003 or AMP)"


def test_a_closed_standard_output_is_one_error_line(project: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "amplint", "train.py"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=project,
        timeout=120, pass_fds=(), preexec_fn=lambda: os.close(1),
    )
    assert result.returncode == 2
    assert result.stderr.strip() == "amplint: error: cannot write to standard output: it is closed"


def test_options_first_still_mean_check(project: Path) -> None:
    result = amplint("--select", "AMP001", "--format", "concise", "train.py", cwd=project)
    assert result.returncode == 1 and result.stdout.startswith("train.py:2:10: AMP001")


def test_no_paths_checks_the_current_folder(project: Path) -> None:
    result = amplint("--no-cache", "--format", "concise", "--select", "AMP001", cwd=project)
    assert result.returncode == 1 and "train.py:2:10: AMP001" in result.stdout


def test_version(tmp_path: Path) -> None:
    result = amplint("--version", cwd=tmp_path)
    assert result.returncode == 0 and __version__ in result.stdout


def test_help_lists_the_contract_options() -> None:
    result = CliRunner().invoke(main, ["check", "--help"])
    assert result.exit_code == 0
    for option in ("--select", "--ignore", "--extend-select", "--format", "--output-file", "--fix", "--unsafe-fixes",
                   "--diff", "--exit-zero", "--statistics", "--no-cache", "--jobs", "--config", "--quiet",
                   "--stdin-filename", "--force-exclude"):
        assert option in result.output


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["train.py", "--bogus"], "amplint: error: No such option '--bogus'"),
        (["train.py", "--format", "xml"], "amplint: error: Invalid value for '--format'"),
        (["train.py", "--jobs", "zero"], "amplint: error: Invalid value for '--jobs'"),
        (["train.py", "--select"], "amplint: error: Option '--select' requires an argument"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(project: Path, args: list[str], expected: str) -> None:
    result = amplint(*args, cwd=project)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), result.stderr
    assert result.stdout == ""


def test_unreadable_path_is_one_line_and_exit_2(project: Path) -> None:
    result = amplint("train.py", "missing.py", "--no-cache", "--format", "concise", cwd=project)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["amplint: error: missing.py: no such file or directory"]
    assert "train.py:2:10: AMP001" in result.stdout  # the readable file is still reported


def test_unexpected_exception_is_an_internal_error_not_a_traceback(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import amplint.static.command as command

    def explode(*args, **kwargs):
        raise ValueError("boom\nsecond line")

    monkeypatch.setattr(command, "check_paths", explode)
    monkeypatch.chdir(project)
    monkeypatch.delenv("AMPLINT_DEBUG", raising=False)
    result = CliRunner().invoke(main, ["train.py", "--no-cache"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "amplint: internal error: ValueError: boom second line"


def test_amplint_debug_shows_the_traceback(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import amplint.static.command as command

    monkeypatch.setattr(command, "check_paths", lambda *a, **k: 1 / 0)
    monkeypatch.chdir(project)
    monkeypatch.setenv("AMPLINT_DEBUG", "1")
    result = CliRunner().invoke(main, ["train.py", "--no-cache"])
    assert isinstance(result.exception, ZeroDivisionError)


def test_closed_pipe_is_quiet(tmp_path: Path) -> None:
    for index in range(1000):  # more output than a pipe buffer holds
        (tmp_path / f"m{index:04}.py").write_text(BAD, encoding="utf-8")
    process = subprocess.Popen(
        [sys.executable, "-m", "amplint", ".", "--no-cache", "--format", "concise"], cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    process.stdout.readline()
    process.stdout.close()  # like `| head -1`
    stderr = process.stderr.read().decode()
    process.wait(timeout=120)
    assert "Traceback" not in stderr and "internal error" not in stderr


def test_rule_usage_error_is_one_line(tmp_path: Path) -> None:
    result = amplint("rule", "--bogus", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["amplint: error: No such option '--bogus'. (see `amplint rule --help`)"]


def test_rule_command_is_not_taken_for_a_path(tmp_path: Path) -> None:
    result = amplint("rule", "AMP001", cwd=tmp_path)
    assert result.returncode == 0 and "deprecated-amp-api" in result.stdout


def test_cache_gives_the_same_answer(project: Path) -> None:
    first = amplint("train.py", "--format", "json", cwd=project)
    second = amplint("train.py", "--format", "json", cwd=project)
    assert first.returncode == second.returncode == 1
    assert first.stdout == second.stdout
    assert (project / ".amplint_cache").is_dir()
    assert amplint("train.py", "--format", "json", "--no-cache", cwd=project).stdout == first.stdout


def test_jobs_gives_the_same_answer(tmp_path: Path) -> None:
    for index in range(6):
        (tmp_path / f"m{index}.py").write_text(BAD + "# " + "x" * 60_000 + "\n", encoding="utf-8")  # past the parallel threshold
    one = amplint(".", "--format", "json", "--no-cache", "--jobs", "1", "--select", "AMP001", cwd=tmp_path)
    two = amplint(".", "--format", "json", "--no-cache", "--jobs", "2", "--select", "AMP001", cwd=tmp_path)
    assert one.returncode == two.returncode == 1 and one.stdout == two.stdout


# --- which files are parsed ------------------------------------------------------------------------

def test_a_named_file_always_gets_its_syntax_checked(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("def evaluate(:\n", encoding="utf-8")
    result = amplint("broken.py", "--no-cache", "--format", "concise", cwd=tmp_path)
    assert result.returncode == 1 and "broken.py:1:14: AMP000" in result.stdout


def test_a_folders_file_without_amp_code_is_not_parsed(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "broken.py").write_text("def evaluate(:\n", encoding="utf-8")
    result = amplint("src", "--no-cache", "--format", "concise", cwd=tmp_path)
    assert result.returncode == 0 and "AMP000" not in result.stdout, result.stdout


def test_a_folders_file_with_amp_code_gets_its_syntax_checked(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "broken.py").write_text("scaler = torch.cuda.amp.GradScaler(\n", encoding="utf-8")
    result = amplint("src", "--no-cache", "--format", "concise", cwd=tmp_path)
    assert result.returncode == 1 and "AMP000" in result.stdout


def test_a_folders_file_that_names_amp_only_in_comments_and_strings_is_not_parsed(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    broken = '"""Builds a GradScaler and calls loss.backward() under torch.autocast."""\ndef evaluate(:  # autocast\n'
    (tmp_path / "src" / "notes.py").write_text(broken, encoding="utf-8")
    walked = amplint("src", "--no-cache", "--format", "concise", cwd=tmp_path)
    assert walked.returncode == 0 and "AMP000" not in walked.stdout, walked.stdout
    named = amplint("src/notes.py", "--no-cache", "--format", "concise", cwd=tmp_path)
    assert named.returncode == 1 and "notes.py:2:14: AMP000" in named.stdout, named.stdout


def test_a_folders_undecodable_file_is_reported_even_without_amp_code(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "latin.py").write_bytes(b"name = 'caf\xe9'\n")
    result = amplint("src", "--no-cache", "--format", "concise", cwd=tmp_path)
    assert result.returncode == 1 and "latin.py:1:1: AMP000" in result.stdout


def test_newer_python_syntax_is_not_a_parse_error(tmp_path: Path) -> None:
    """CPython 3.11 refuses `def f[T]()`; libcst, the parser of record, reads it."""
    (tmp_path / "generic.py").write_text("def first[T](xs: list[T]) -> T:\n    return xs[0]\n", encoding="utf-8")
    result = amplint("generic.py", "--no-cache", "--format", "concise", cwd=tmp_path)
    assert result.returncode == 0 and "AMP000" not in result.stdout
