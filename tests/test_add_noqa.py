"""`amplint check --add-noqa`: every current finding gets a `# noqa: CODE` comment, and nothing
else in the file changes. Through the real command line, then the edge cases of the edit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from amplint.model import Finding, Severity
from amplint.static.noqa import add_noqa
from amplint.static.source import SourceError

# AMP001 on lines 2 and 3 (line 3 also opens the region), AMP003 on line 5.
TRAIN = (
    "import torch\n"
    "scaler = torch.cuda.amp.GradScaler()\n"
    "with torch.cuda.amp.autocast():\n"
    "    loss = model(x)\n"
    "    loss.backward()\n"
)


def amplint(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "amplint", "check", *args],
        capture_output=True, text=True, cwd=cwd, timeout=120, env={**os.environ, "NO_COLOR": "1"},
    )


def finding(code: str, line: int, statement_line: int | None = None) -> Finding:
    return Finding(code, "name", Severity.WARNING, "f.py", line, 1, line, 2, "message", noqa_line=statement_line)


def test_add_noqa_silences_every_finding_and_a_second_run_adds_nothing(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN, encoding="utf-8")
    first = amplint("--add-noqa", "train.py", cwd=tmp_path)
    assert first.returncode == 0 and "Added 3 noqa directives." in first.stderr, first.stderr
    assert script.read_text(encoding="utf-8").splitlines()[1:] == [
        "scaler = torch.cuda.amp.GradScaler()  # noqa: AMP001",
        "with torch.cuda.amp.autocast():  # noqa: AMP001",
        "    loss = model(x)",
        "    loss.backward()  # noqa: AMP003",
    ]
    assert amplint("--no-cache", "train.py", cwd=tmp_path).returncode == 0
    again = amplint("--add-noqa", "train.py", cwd=tmp_path)
    assert again.returncode == 0 and "Added 0 noqa directives." in again.stderr


def test_a_file_with_lone_carriage_returns_gets_its_comments_and_they_suppress(tmp_path: Path) -> None:
    """Classic Mac line endings: Python ends a line at a lone CR, and so do --add-noqa and noqa."""
    script = tmp_path / "train.py"
    script.write_bytes(TRAIN.replace("\n", "\r").encode())
    first = amplint("--add-noqa", "train.py", cwd=tmp_path)
    assert first.returncode == 0 and "Added 3 noqa directives." in first.stderr, first.stderr
    assert script.read_bytes().split(b"\r")[4] == b"    loss.backward()  # noqa: AMP003"
    assert amplint("--no-cache", "train.py", cwd=tmp_path).returncode == 0


def test_add_noqa_comments_only_the_selected_rules(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN, encoding="utf-8")
    amplint("--add-noqa", "--select", "AMP003", "train.py", cwd=tmp_path)
    assert "AMP001" not in script.read_text(encoding="utf-8")
    assert "loss.backward()  # noqa: AMP003" in script.read_text(encoding="utf-8")


def test_add_noqa_refuses_to_be_combined_with_fixes(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAIN, encoding="utf-8")
    result = amplint("--add-noqa", "--fix", "train.py", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert (tmp_path / "train.py").read_text(encoding="utf-8") == TRAIN


def test_add_noqa_leaves_a_file_that_does_not_parse_untouched(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_bytes(b"import torch\nwith torch.cuda.amp.autocast(:\n")
    result = amplint("--add-noqa", "broken.py", cwd=tmp_path)
    assert result.returncode == 0 and broken.read_bytes() == b"import torch\nwith torch.cuda.amp.autocast(:\n"


def test_line_endings_encoding_and_bom_are_kept_byte_for_byte() -> None:
    source = "\ufeff# -*- coding: utf-8 -*-\r\nx = 'é'\r\nscaler = GradScaler()\r\n".encode()
    added = add_noqa(source, [finding("AMP001", 3)])
    assert added.source == source.replace(b"GradScaler()\r\n", b"GradScaler()  # noqa: AMP001\r\n")


def test_a_latin1_file_gets_its_comment_in_its_own_encoding() -> None:
    source = "# -*- coding: latin-1 -*-\nname = 'café'\nscaler = GradScaler()  # réglé\n".encode("latin-1")
    added = add_noqa(source, [finding("AMP001", 3)])
    assert added.source.decode("latin-1").endswith("GradScaler()  # réglé  # noqa: AMP001\n")


@pytest.mark.parametrize(
    "line,expected",
    [
        ("x()  # noqa: AMP001", "x()  # noqa: AMP001, AMP003"),
        ("x()  # noqa:AMP001", "x()  # noqa:AMP001, AMP003"),
        ("x()  # NOQA", "x()  # NOQA"),  # a bare noqa covers every code already
        ("x()  # noqa: AMP0", "x()  # noqa: AMP0"),  # so does a prefix
        ("x()    ", "x()  # noqa: AMP003"),
    ],
)
def test_an_existing_noqa_is_extended_rather_than_repeated(line: str, expected: str) -> None:
    assert add_noqa(f"{line}\n".encode(), [finding("AMP003", 1)]).source == f"{expected}\n".encode()


def test_a_finding_inside_a_multiline_string_or_continuation_goes_to_its_statements_first_line() -> None:
    source = b"y = f(a,\n      b)\nz = 1 + \\\n    g()\n"
    added = add_noqa(source, [finding("AMP002", 2, statement_line=1), finding("AMP002", 3, statement_line=3)])
    assert added.source == b"y = f(a,\n      b)  # noqa: AMP002\nz = 1 + \\\n    g()\n"
    assert added.comments == 1 and added.skipped == 1


def test_a_line_that_only_continues_a_string_gets_no_comment() -> None:
    source = b's = """\nGradScaler()\n"""\n'
    added = add_noqa(source, [finding("AMP001", 2, statement_line=1)])
    assert added.source == source and added.skipped == 1


def test_a_file_in_an_encoding_that_is_not_ascii_compatible_is_refused() -> None:
    with pytest.raises(SourceError):
        add_noqa(b"# -*- coding: utf-16 -*-\nx = 1\n", [finding("AMP001", 2)])
