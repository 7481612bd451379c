"""Hostile inputs through the real command line: findings or AMP000, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "static" / "AMP000"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "amplint", *args, "--format", "json", "--no-cache"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _expected(path: Path) -> set[tuple[str, int]]:
    words = path.with_suffix(".expected").read_text(encoding="utf-8").split()
    return {(code, int(line)) for code, line in zip(words[0::2], words[1::2])}


@pytest.mark.parametrize(
    "path", [p for p in sorted(FIXTURES.iterdir()) if p.suffix != ".expected"], ids=lambda p: p.name
)
def test_bad_input_through_cli(path: Path) -> None:
    result = _run(str(path))
    assert "Traceback" not in result.stderr
    expected = _expected(path)
    assert result.returncode == (1 if expected else 0), result.stderr
    findings = json.loads(result.stdout)
    assert {(f["code"], f["line"]) for f in findings} == expected
    for finding in findings:
        assert finding["path"] == str(path)
        if finding["code"] == "AMP000":
            assert finding["name"] == "parse-error" and finding["message"]


def test_deeply_nested_code(tmp_path: Path) -> None:
    depth = 400
    body = "".join("    " * i + f"if x{i}:\n" for i in range(depth)) + "    " * depth + "loss.backward()\n"
    path = tmp_path / "nested.py"
    path.write_text("import torch\nwith torch.autocast('cuda'):\n" + "".join("    " + l + "\n" for l in body.splitlines()))
    result = _run(str(path))
    assert "Traceback" not in result.stderr
    assert result.returncode in (0, 1)
    codes = {f["code"] for f in json.loads(result.stdout)}
    assert codes <= {"AMP000", "AMP003"} and codes


def test_deeply_nested_expression(tmp_path: Path) -> None:
    path = tmp_path / "parens.py"
    path.write_text("import torch\nx = " + "(" * 300 + "1" + ")" * 300 + "\n")
    result = _run(str(path))
    assert "Traceback" not in result.stderr
    assert result.returncode in (0, 1)
    json.loads(result.stdout)


def test_a_long_chain_of_operators_is_analysed(tmp_path: Path) -> None:
    """Generated code sums hundreds of terms: libcst's code generation recurses once per term,
    past Python's default limit, and the analysis runs on a deeper stack instead of failing."""
    path = tmp_path / "generated.py"
    path.write_text("import torch\nwith torch.cuda.amp.autocast():\n    y = " + " + ".join(f"x{i}" for i in range(1500)) + "\n")
    result = _run(str(path))
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    assert result.returncode == 1
    assert [(f["code"], f["line"]) for f in json.loads(result.stdout)] == [("AMP001", 2)]


def _chain(path: Path, operators: int) -> Path:
    path.write_text("import torch\nwith torch.cuda.amp.autocast():\n    y = " + "+".join(["x"] * (operators + 1)) + "\n")
    return path


def test_a_chain_too_long_for_libcst_is_reported_not_parsed(tmp_path: Path) -> None:
    """libcst's parse grows with the cube of a chain and crashes past ~8,000 operators."""
    result = _run(str(_chain(tmp_path / "generated.py", 2500)))
    assert result.returncode == 1, result.stderr
    [finding] = json.loads(result.stdout)
    assert finding["code"] == "AMP000" and "chains 2500 operators" in finding["message"]


@pytest.mark.parametrize("named", [True, False], ids=["named", "in a folder"])
def test_a_file_too_deep_for_pythons_parser_is_reported(tmp_path: Path, named: bool) -> None:
    path = _chain(tmp_path / "generated.py", 20000)
    result = _run(str(path) if named else str(tmp_path))
    assert result.returncode == 1, result.stderr
    [finding] = json.loads(result.stdout)
    assert finding["code"] == "AMP000" and "nests too deeply" in finding["message"]


@pytest.mark.parametrize("depth", [500, 3000], ids=["past CPython's limit", "past libcst's stack"])
@pytest.mark.parametrize("named", [True, False], ids=["named", "in a folder"])
def test_brackets_nested_past_pythons_limit_are_amp000_not_a_crash(tmp_path: Path, depth: int, named: bool) -> None:
    """CPython refuses more than 200 nested brackets; libcst's native parser would read a few
    hundred more, then overflow the C stack and kill the process (a generated file in pre-commit)."""
    path = tmp_path / "generated.py"
    path.write_text(f"import torch\nx = {'(' * depth}1{')' * depth}\nwith torch.autocast('cuda'):\n    loss.backward()\n")
    result = _run(str(path) if named else str(tmp_path))
    assert result.returncode == 1, result.stderr
    [finding] = json.loads(result.stdout)
    assert finding["code"] == "AMP000" and finding["line"] == 2
    assert finding["message"] == "cannot parse: too many nested parentheses"


@pytest.mark.skipif(sys.platform != "linux", reason="needs a file system that takes any bytes in names")
@pytest.mark.parametrize("output_format", ["text", "concise", "json", "sarif", "github"])
def test_a_file_name_that_is_not_utf8_is_reported_in_every_format(tmp_path: Path, output_format: str) -> None:
    folder = tmp_path / "src"
    folder.mkdir()
    (Path(os.fsdecode(bytes(folder))) / os.fsdecode(b"caf\xe9.py")).write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    report = tmp_path / "report"
    for extra in ([], ["--output-file", str(report)]):
        result = subprocess.run(
            [sys.executable, "-m", "amplint", str(folder), "--no-cache", "--format", output_format, *extra],
            capture_output=True, timeout=120,
        )
        assert result.returncode == 1 and b"Traceback" not in result.stderr and b"internal error" not in result.stderr, result.stderr
    written = report.read_bytes()
    assert b"caf\xe9.py" in written or b"caf%E9.py" in written or b"caf\\udce9.py" in written


def test_a_folder_that_cannot_be_listed_is_an_error_not_a_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Permissions cannot be taken from root (CI), so the listing itself is made to fail."""
    from amplint.config import Settings
    from amplint.static import discovery
    from amplint.static.runner import check_paths

    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / "train.py").write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    (tmp_path / "ok.py").write_text("x = 1\n")
    real_scandir = os.scandir

    def scandir(path):
        if os.path.basename(path) == "locked":
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    monkeypatch.setattr(discovery.os, "scandir", scandir)
    result = check_paths([str(tmp_path)], Settings(root=tmp_path), use_cache=False)
    assert result.errors == [f"{tmp_path / 'locked'}: cannot read: Permission denied"]


def test_a_file_linked_twice_in_a_tree_is_checked_once(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "tree").mkdir()
    (tmp_path / "real" / "train.py").write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    (tmp_path / "tree" / "link.py").symlink_to(tmp_path / "real" / "train.py")
    result = _run(str(tmp_path))
    assert len(json.loads(result.stdout)) == 1


def test_a_file_reached_through_a_link_first_is_reported_under_its_own_name(tmp_path: Path) -> None:
    """icefall's recipes link `scaling.py` to another recipe's; the link's folder sorts first."""
    (tmp_path / "b_recipe").mkdir()
    (tmp_path / "a_recipe").mkdir()
    (tmp_path / "b_recipe" / "scaling.py").write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    (tmp_path / "a_recipe" / "scaling.py").symlink_to(Path("..") / "b_recipe" / "scaling.py")
    result = _run(str(tmp_path))
    assert [f["path"] for f in json.loads(result.stdout)] == [str(tmp_path / "b_recipe" / "scaling.py")]


def test_missing_path_is_a_usage_error(tmp_path: Path) -> None:
    missing = tmp_path / "no_such_file.py"
    result = _run(str(missing))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = [l for l in result.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "no_such_file.py" in lines[0]


def test_a_named_broken_link_says_where_it_points(tmp_path: Path) -> None:
    link = tmp_path / "train.py"
    link.symlink_to(tmp_path / "moved" / "train.py")
    result = _run(str(link))
    assert result.returncode == 2
    assert result.stderr.strip() == f"amplint: error: {link}: a symbolic link to {tmp_path / 'moved' / 'train.py'}, which does not exist"


def test_a_named_link_in_a_loop_of_links_says_so(tmp_path: Path) -> None:
    link = tmp_path / "self.py"
    link.symlink_to(link)
    result = _run(str(link))
    assert result.returncode == 2
    assert result.stderr.strip() == f"amplint: error: {link}: a symbolic link in a loop of links"


def test_links_in_a_loop_inside_a_walked_folder_are_passed_over_like_broken_ones(tmp_path: Path) -> None:
    (tmp_path / "self.py").symlink_to(tmp_path / "self.py")
    (tmp_path / "a.py").symlink_to(tmp_path / "b.py")
    (tmp_path / "b.py").symlink_to(tmp_path / "a.py")
    (tmp_path / "train.py").write_text("from torch.cuda.amp import GradScaler\n")
    result = _run(str(tmp_path))
    assert result.returncode == 1 and "Traceback" not in result.stderr and result.stderr == "", result.stderr
    assert [f["path"] for f in json.loads(result.stdout)] == [str(tmp_path / "train.py")]


def test_good_and_bad_files_together(tmp_path: Path) -> None:
    """One unparsable file does not stop the others from being checked."""
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    fine = tmp_path / "train.py"
    fine.write_text("from torch.cuda.amp import GradScaler\n")
    result = _run(str(broken), str(fine))
    assert result.returncode == 1
    found = {(Path(f["path"]).name, f["code"]) for f in json.loads(result.stdout)}
    assert found == {("broken.py", "AMP000"), ("train.py", "AMP001")}


def test_reading_a_file_keeps_the_compilers_warnings_to_itself() -> None:
    """An invalid escape makes CPython warn while parsing (a SyntaxWarning printed on stderr since
    Python 3.12): that is the user's Python's to say, not the linter's."""
    import warnings

    from amplint.static.source import python_tree

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        python_tree('PATTERN = "\\d+"\n')
