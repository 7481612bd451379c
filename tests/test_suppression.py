"""`# noqa` through the real command line: codes, bare, the statement's first line, file level."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# AMP001 on line 2 (the deprecated GradScaler); AMP003 on line 5 (backward inside autocast).
SOURCE = """import torch
scaler = torch.cuda.amp.GradScaler(){c2}
with torch.autocast("cuda"):
    loss = model(x)
    loss.backward(){c5}
"""


def findings(tmp_path: Path, text: str) -> list[tuple[str, int]]:
    path = tmp_path / "train.py"
    path.write_text(text, encoding="utf-8")
    result = subprocess.run(
        # Only the two rules these sources are about: new rules must not change the answers.
        [sys.executable, "-m", "amplint", str(path), "--format", "json", "--no-cache", "--select", "AMP001,AMP003"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"},
    )
    assert result.returncode in (0, 1) and "Traceback" not in result.stderr, result.stderr
    found = [(f["code"], f["line"]) for f in json.loads(result.stdout)]
    assert result.returncode == (1 if found else 0)
    return found


def source(c2: str = "", c5: str = "") -> str:
    return SOURCE.format(c2=c2, c5=c5)


def test_without_comments_both_are_reported(tmp_path: Path) -> None:
    assert findings(tmp_path, source()) == [("AMP001", 2), ("AMP003", 5)]


def test_noqa_with_the_code_suppresses_that_finding(tmp_path: Path) -> None:
    assert findings(tmp_path, source(c5="  # noqa: AMP003")) == [("AMP001", 2)]


def test_noqa_with_another_code_suppresses_nothing(tmp_path: Path) -> None:
    assert findings(tmp_path, source(c5="  # noqa: AMP001")) == [("AMP001", 2), ("AMP003", 5)]
    assert findings(tmp_path, source(c2="  # noqa: E501")) == [("AMP001", 2), ("AMP003", 5)]


@pytest.mark.parametrize("comment", ["# noqa: AMP002, AMP003", "# noqa: AMP002 AMP003", "# noqa:AMP002,AMP003", "# NOQA: amp003"])
def test_several_codes_comma_or_space_separated(tmp_path: Path, comment: str) -> None:
    assert findings(tmp_path, source(c5=f"  {comment}")) == [("AMP001", 2)]


def test_bare_noqa_suppresses_every_code_on_its_line(tmp_path: Path) -> None:
    assert findings(tmp_path, source(c2="  # noqa", c5="  # noqa")) == []


def test_noqa_on_one_line_leaves_other_lines_alone(tmp_path: Path) -> None:
    assert findings(tmp_path, source(c2="  # noqa")) == [("AMP003", 5)]


def test_trailing_explanation_after_the_codes_is_allowed(tmp_path: Path) -> None:
    assert findings(tmp_path, source(c5="  # noqa: AMP003 -- measured, harmless here")) == [("AMP001", 2)]


MULTILINE = """import torch
scaler = ({first}
    torch.cuda.amp.GradScaler(){reported}
){last}
"""


def test_multiline_statement_first_line_suppresses(tmp_path: Path) -> None:
    text = MULTILINE.format(first="  # noqa: AMP001", reported="", last="")
    assert findings(tmp_path, text) == []


def test_multiline_statement_reported_line_suppresses(tmp_path: Path) -> None:
    text = MULTILINE.format(first="", reported="  # noqa: AMP001", last="")
    assert findings(tmp_path, text) == []


def test_multiline_statement_other_lines_do_not_suppress(tmp_path: Path) -> None:
    text = MULTILINE.format(first="", reported="", last="  # noqa: AMP001")
    assert findings(tmp_path, text) == [("AMP001", 3)]


def test_multiline_call_inside_autocast(tmp_path: Path) -> None:
    text = (
        'import torch\nwith torch.autocast("cuda"):\n'
        "    result = compute(  # noqa: AMP003\n        loss.backward()\n    )\n"
        "    other = compute(\n        loss.backward()\n    )\n"
    )
    assert findings(tmp_path, text) == [("AMP003", 7)]


def test_file_level_amplint_noqa(tmp_path: Path) -> None:
    assert findings(tmp_path, "# amplint: noqa\n" + source()) == []


def test_file_level_amplint_noqa_may_be_indented(tmp_path: Path) -> None:
    assert findings(tmp_path, source() + "if True:\n    # amplint: noqa\n    pass\n") == []


def test_file_level_amplint_noqa_in_a_string_suppresses_nothing(tmp_path: Path) -> None:
    text = source() + 'HELP = """\n# amplint: noqa\n"""\n'
    assert findings(tmp_path, text) == [("AMP001", 2), ("AMP003", 5)]


def test_a_fix_never_edits_a_line_whose_noqa_covers_it(tmp_path: Path) -> None:
    """The uses of a deprecated import are fixed with the import; an import marked `# noqa`
    keeps its line, so its uses are reported without a fix."""
    path = tmp_path / "train.py"
    text = "from torch.cuda.amp import GradScaler  # noqa: AMP001\nscaler = GradScaler()\n"
    path.write_text(text, encoding="utf-8")
    command = [sys.executable, "-m", "amplint", str(path), "--no-cache", "--select", "AMP001"]
    reported = subprocess.run([*command, "--format", "json"], capture_output=True, text=True, timeout=120)
    assert [(f["line"], f["fix"]) for f in json.loads(reported.stdout)] == [(2, None)]
    subprocess.run([*command, "--fix"], capture_output=True, text=True, timeout=120)
    assert path.read_text(encoding="utf-8") == text


def test_suppressed_findings_are_not_fixed(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    text = "import torch\nscaler = torch.cuda.amp.GradScaler()  # noqa: AMP001\n"
    path.write_text(text, encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "amplint", str(path), "--fix", "--no-cache"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert path.read_text(encoding="utf-8") == text
