"""`amplint - --stdin-filename path.py` for editors, through the real command line."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

SOURCE = """import torch
from torch.cuda.amp import GradScaler
scaler = GradScaler()
with torch.autocast("cuda"):
    loss = model(x)
    loss.backward()
"""
SELECT = ("--select", "AMP001,AMP003")


def amplint(*args: str, stdin: str | bytes, cwd: Path) -> subprocess.CompletedProcess:
    data = stdin.encode("utf-8") if isinstance(stdin, str) else stdin
    result = subprocess.run(
        [sys.executable, "-m", "amplint", *args], input=data, capture_output=True, cwd=cwd, timeout=120,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert b"Traceback" not in result.stderr, result.stderr
    return result


def test_findings_carry_the_stdin_filename(tmp_path: Path) -> None:
    result = amplint("-", "--stdin-filename", "src/train.py", "--format", "json", *SELECT, stdin=SOURCE, cwd=tmp_path)
    assert result.returncode == 1
    data = json.loads(result.stdout)
    assert [(f["path"], f["code"], f["line"]) for f in data] == [
        ("src/train.py", "AMP001", 2), ("src/train.py", "AMP001", 3), ("src/train.py", "AMP003", 6),
    ]


def test_without_a_name_the_path_is_a_dash(tmp_path: Path) -> None:
    result = amplint("-", "--format", "concise", *SELECT, stdin=SOURCE, cwd=tmp_path)
    assert result.stdout.decode().startswith("-:2:28: AMP001")


def test_stdin_filename_alone_reads_stdin(tmp_path: Path) -> None:
    result = amplint("--stdin-filename", "a.py", "--format", "json", *SELECT, stdin=SOURCE, cwd=tmp_path)
    assert result.returncode == 1 and json.loads(result.stdout)[0]["path"] == "a.py"


def test_text_format_shows_the_buffer_not_the_file_on_disk(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("# the saved file differs\n" * 10, encoding="utf-8")
    result = amplint("-", "--stdin-filename", "train.py", *SELECT, stdin=SOURCE, cwd=tmp_path)
    assert "6 |     loss.backward()" in result.stdout.decode()


def test_clean_source_exits_0(tmp_path: Path) -> None:
    result = amplint("-", "--stdin-filename", "ok.py", stdin="import torch\n", cwd=tmp_path)
    assert result.returncode == 0


def test_unparsable_source_is_amp000(tmp_path: Path) -> None:
    result = amplint("-", "--stdin-filename", "bad.py", "--format", "json", stdin="def f(:\n", cwd=tmp_path)
    assert result.returncode == 1 and json.loads(result.stdout)[0]["code"] == "AMP000"


def test_fix_prints_the_fixed_source_only_on_stdout(tmp_path: Path) -> None:
    result = amplint("-", "--stdin-filename", "train.py", "--fix", *SELECT, stdin=SOURCE, cwd=tmp_path)
    fixed = result.stdout.decode()
    ast.parse(fixed)
    assert "torch.cuda.amp" not in fixed and "from torch.amp import GradScaler" in fixed
    assert fixed.splitlines()[3:] == SOURCE.splitlines()[3:]  # the rest is untouched
    # The AMP003 finding has no fix: it stays, on stderr, and sets the exit status.
    assert result.returncode == 1
    assert "AMP003" in result.stderr.decode() and "AMP001" not in result.stderr.decode()
    assert not (tmp_path / "train.py").exists()  # nothing written to disk


def test_fix_of_clean_source_echoes_it_byte_for_byte(tmp_path: Path) -> None:
    data = b"\xef\xbb\xbfimport torch\r\nx = 1  # caf\xc3\xa9\r\n"
    result = amplint("-", "--stdin-filename", "ok.py", "--fix", stdin=data, cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (0, data, b"")


def test_fix_output_is_a_fixed_point(tmp_path: Path) -> None:
    once = amplint("-", "--stdin-filename", "t.py", "--fix", stdin=SOURCE, cwd=tmp_path).stdout
    twice = amplint("-", "--stdin-filename", "t.py", "--fix", stdin=once, cwd=tmp_path).stdout
    assert once == twice and once != SOURCE.encode()


def test_diff_on_stdin(tmp_path: Path) -> None:
    result = amplint("-", "--stdin-filename", "train.py", "--diff", *SELECT, stdin=SOURCE, cwd=tmp_path)
    out = result.stdout.decode()
    assert out.startswith("--- a/train.py\n+++ b/train.py\n")
    assert "\n-from torch.cuda.amp import GradScaler\n-scaler = GradScaler()\n" in out
    assert "\n+from torch.amp import GradScaler\n+scaler = GradScaler(\"cuda\")\n" in out
    assert result.returncode == 1


def test_diff_on_stdin_goes_to_the_output_file(tmp_path: Path) -> None:
    result = amplint("-", "--stdin-filename", "train.py", "--diff", "--output-file", "train.diff", *SELECT, stdin=SOURCE, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (1, b"")
    assert (tmp_path / "train.diff").read_text(encoding="utf-8").startswith("--- a/train.py\n+++ b/train.py\n")


def test_config_is_found_from_the_stdin_filename(tmp_path: Path) -> None:
    (tmp_path / "proj" / "src").mkdir(parents=True)
    (tmp_path / "proj" / "pyproject.toml").write_text('[tool.amplint]\nselect = ["AMP003"]\n', encoding="utf-8")
    result = amplint("-", "--stdin-filename", "proj/src/train.py", "--format", "json", stdin=SOURCE, cwd=tmp_path)
    assert [f["code"] for f in json.loads(result.stdout)] == ["AMP003"]


def test_per_file_ignores_apply_to_the_stdin_filename(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.amplint.per-file-ignores]\n"legacy/*" = ["AMP001"]\n', encoding="utf-8")
    result = amplint("-", "--stdin-filename", "legacy/train.py", "--format", "json", *SELECT, stdin=SOURCE, cwd=tmp_path)
    assert [f["code"] for f in json.loads(result.stdout)] == ["AMP003"]
    fixed = amplint("-", "--stdin-filename", "legacy/train.py", "--fix", *SELECT, stdin=SOURCE, cwd=tmp_path)
    assert fixed.stdout.decode() == SOURCE  # an ignored rule is not fixed either


def test_force_exclude_passes_an_excluded_buffer_through(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.amplint]\nexclude = ["vendor/"]\n', encoding="utf-8")
    checked = amplint("-", "--stdin-filename", "vendor/x.py", "--force-exclude", stdin=SOURCE, cwd=tmp_path)
    assert (checked.returncode, checked.stdout) == (0, b"")
    fixed = amplint("-", "--stdin-filename", "vendor/x.py", "--force-exclude", "--fix", stdin=SOURCE, cwd=tmp_path)
    assert (fixed.returncode, fixed.stdout.decode()) == (0, SOURCE)
    not_forced = amplint("-", "--stdin-filename", "vendor/x.py", stdin=SOURCE, cwd=tmp_path)
    assert not_forced.returncode == 1


def test_dash_with_other_paths_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("", encoding="utf-8")
    result = amplint("-", "a.py", stdin=SOURCE, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.decode().strip().splitlines() == ["amplint: error: `-` (standard input) cannot be combined with other paths"]
