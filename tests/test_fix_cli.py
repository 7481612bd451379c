"""`--fix`, `--unsafe-fixes` and `--diff` through the command line, on fixtures/cli/deprecated/."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import errno
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from amplint.cli import main
from amplint.model import Applicability
from amplint.static.checks import FixPlan

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "cli" / "deprecated"


def amplint(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "amplint", *args, "--no-cache"],
        capture_output=True, text=True, cwd=cwd, timeout=120, env={**os.environ, "NO_COLOR": "1"},
    )


def findings(cwd: Path, *args: str) -> list[dict]:
    result = amplint(".", "--format", "json", *args, cwd=cwd)
    assert result.returncode in (0, 1) and "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*.py"))}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    target = tmp_path / "proj"
    shutil.copytree(FIXTURES, target)
    return target


def _edited_lines(before: list[dict]) -> dict[str, set[int]]:
    """Per file, the original lines that some reported fix may touch."""
    lines: dict[str, set[int]] = {}
    for finding in before:
        if finding["fix"]:
            for edit in finding["fix"]["edits"]:
                lines.setdefault(Path(finding["path"]).as_posix(), set()).update(range(edit["line"], edit["end_line"] + 1))
    return lines


def _changed_lines(old: bytes, new: bytes) -> set[int]:
    matcher = difflib.SequenceMatcher(a=old.splitlines(keepends=True), b=new.splitlines(keepends=True), autojunk=False)
    changed: set[int] = set()
    for tag, i1, i2, _, _ in matcher.get_opcodes():
        if tag != "equal":
            changed.update(range(i1 + 1, max(i2, i1 + 1) + 1))
    return changed


def test_fix_on_a_directory_of_deprecated_api_files(tree: Path) -> None:
    before_bytes = snapshot(tree)
    before = findings(tree, "--select", "AMP001")
    fixable_files = {Path(f["path"]).as_posix() for f in before if f["fix"]}
    assert {"from_imports.py", "attribute_calls.py"} <= fixable_files  # the fixture really exercises fixes

    result = amplint(".", "--fix", "--select", "AMP001", cwd=tree)
    assert "Traceback" not in result.stderr and "error" not in result.stderr, result.stderr
    assert result.stderr.startswith("Fixed ")
    after_bytes = snapshot(tree)

    allowed = _edited_lines(before)
    with_amp001 = {Path(f["path"]).as_posix() for f in before}
    for name, old in before_bytes.items():
        new = after_bytes[name]
        ast.parse(new)  # every file still parses
        if name not in with_amp001:
            assert new == old, f"{name} had no AMP001 finding but changed"
        elif name not in fixable_files:
            assert new == old, f"{name} had no fixable finding but changed"
        else:
            assert new != old
            assert _changed_lines(old, new) <= allowed[name], f"{name}: lines outside the fixes changed"
    after = findings(tree, "--select", "AMP001")
    assert [f for f in after if f["fix"]] == []  # nothing fixable left
    # what is left is exactly what had no fix
    assert sorted((f["path"], f["line"]) for f in after) == sorted((f["path"], f["line"]) for f in before if not f["fix"])
    assert result.returncode == (1 if after else 0)


def test_a_second_fix_changes_nothing(tree: Path) -> None:
    amplint(".", "--fix", cwd=tree)
    once = snapshot(tree)
    second = amplint(".", "--fix", cwd=tree)
    assert snapshot(tree) == once
    assert "Fixed" not in second.stderr


def test_fix_exit_status_is_0_when_everything_was_fixed(tree: Path) -> None:
    result = amplint("from_imports.py", "--fix", "--select", "AMP001", cwd=tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == "Fixed 4 findings.\n"
    assert "All checks passed" in result.stdout


def test_fix_exit_status_is_1_when_findings_remain(tree: Path) -> None:
    result = amplint("star_args.py", "--fix", "--select", "AMP001", cwd=tree)
    assert result.returncode == 1
    assert "AMP001" in result.stdout and "Fixed" not in result.stderr


def test_diff_writes_nothing_and_prints_what_fix_would_write(tree: Path, tmp_path: Path) -> None:
    before = snapshot(tree)
    times = {p: p.stat().st_mtime_ns for p in tree.rglob("*.py")}
    result = amplint(".", "--diff", cwd=tree)
    assert snapshot(tree) == before
    assert {p: p.stat().st_mtime_ns for p in tree.rglob("*.py")} == times
    assert result.returncode == 1  # the findings are all still there
    assert result.stdout.startswith("--- a/")
    assert "+++ b/from_imports.py\n" in result.stdout
    assert result.stderr.startswith("Would fix ")

    # Applying the diff with patch(1) gives exactly what --fix writes.
    patched = tmp_path / "patched"
    shutil.copytree(tree, patched)
    applied = subprocess.run(["patch", "-s", "-p1", "-d", str(patched)], input=result.stdout, text=True, capture_output=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    amplint(".", "--fix", cwd=tree)
    assert snapshot(patched) == snapshot(tree)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_diff_of_a_folder_applies_with_git_apply(tree: Path, tmp_path: Path) -> None:
    """`amplint . --diff | git apply`: git refuses a path with a `.` component (`a/./train.py`)."""
    patched = tmp_path / "patched"
    shutil.copytree(tree, patched)
    subprocess.run(["git", "init", "-q"], cwd=patched, check=True)
    diff = amplint(".", "--diff", cwd=tree).stdout
    assert diff.startswith("--- a/")
    applied = subprocess.run(["git", "apply"], input=diff, text=True, capture_output=True, cwd=patched)
    assert applied.returncode == 0, applied.stderr
    amplint(".", "--fix", cwd=tree)
    assert snapshot(patched) == snapshot(tree)


@pytest.mark.parametrize(
    ("encoding", "comment"), [("latin-1", "# rébuilt"), ("shift_jis", "# 日本語のコメント"), ("gb18030", "# 中文注释")]
)
def test_diff_of_a_file_in_its_own_encoding_applies_with_git_apply_and_patch(tmp_path: Path, encoding: str, comment: str) -> None:
    """patch and git apply match a hunk byte for byte: a non-UTF-8 file's lines stay in its encoding."""
    original = f"# -*- coding: {encoding} -*-\nimport torch\n{comment}\nscaler = torch.cuda.amp.GradScaler()\n".encode(encoding)
    for name in ("fixed", "git", "patch"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.py").write_bytes(original)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path / "git", check=True)
    diff = subprocess.run(
        [sys.executable, "-m", "amplint", "--diff", "--no-cache", "train.py"], capture_output=True, cwd=tmp_path / "fixed", timeout=120
    ).stdout
    assert comment.encode(encoding) in diff  # the context line, in the file's own bytes
    assert subprocess.run(["git", "apply"], input=diff, capture_output=True, cwd=tmp_path / "git").returncode == 0
    assert subprocess.run(["patch", "-p1", "-s"], input=diff, capture_output=True, cwd=tmp_path / "patch").returncode == 0
    amplint("--fix", "train.py", cwd=tmp_path / "fixed")
    fixed = (tmp_path / "fixed" / "train.py").read_bytes()
    assert fixed != original and (tmp_path / "git" / "train.py").read_bytes() == (tmp_path / "patch" / "train.py").read_bytes() == fixed


def test_diff_of_a_path_through_a_parent_folder_names_it_plainly(tree: Path) -> None:
    """`git apply` refuses `..` in a path as it refuses `.`: `sub/../x.py` is written `x.py`."""
    (tree / "sub").mkdir()
    diff = amplint("sub/../from_imports.py", "--diff", cwd=tree).stdout
    assert diff.startswith("--- a/from_imports.py\n"), diff[:80]


def test_diff_of_an_absolute_path_is_written_as_git_writes_one(tree: Path) -> None:
    """`a/tmp/x.py`, not `a//tmp/x.py`, which `git apply` refuses."""
    target = (tree / "from_imports.py").resolve()
    diff = amplint(str(target), "--diff", cwd=tree).stdout
    assert diff.startswith(f"--- a{target.as_posix()}\n"), diff[:80]


def test_diff_of_a_file_with_a_space_in_its_name_applies_with_patch(tree: Path, tmp_path: Path) -> None:
    """The name ends at a tab, as git writes it; patch(1) otherwise stops at the space."""
    (tree / "from_imports.py").rename(tree / "from imports.py")
    patched = tmp_path / "patched"
    shutil.copytree(tree, patched)
    diff = amplint("from imports.py", "--diff", cwd=tree).stdout
    assert diff.startswith("--- a/from imports.py\t\n")
    applied = subprocess.run(["patch", "-s", "-p1", "-d", str(patched)], input=diff, text=True, capture_output=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    amplint("from imports.py", "--fix", cwd=tree)
    assert snapshot(patched) == snapshot(tree)


def test_diff_goes_to_the_output_file(tree: Path, tmp_path: Path) -> None:
    before = snapshot(tree)
    result = amplint(".", "--diff", "--output-file", "patches/amplint.diff", cwd=tree)
    patch = (tree / "patches" / "amplint.diff").read_text(encoding="utf-8")
    assert (result.returncode, result.stdout) == (1, "")
    assert patch == amplint(".", "--diff", cwd=tree).stdout and patch.startswith("--- a/")
    assert snapshot(tree) == before


def test_diff_to_an_unwritable_output_file_exits_2_with_one_line(tree: Path) -> None:
    result = amplint(".", "--diff", "--output-file", "clean.py/amplint.diff", cwd=tree)  # under a file
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("amplint: error:")]
    assert len(errors) == 1 and errors[0].startswith("amplint: error: clean.py/amplint.diff: cannot write: ")
    assert "Traceback" not in result.stderr


def test_diff_of_a_clean_tree_is_empty(tree: Path) -> None:
    result = amplint("clean.py", "--diff", cwd=tree)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_fix_keeps_permissions(tree: Path) -> None:
    script = tree / "from_imports.py"
    script.chmod(0o751)
    before = script.read_bytes()
    amplint("from_imports.py", "--fix", cwd=tree)
    assert script.read_bytes() != before
    assert stat.S_IMODE(script.stat().st_mode) == 0o751
    assert not [p for p in tree.iterdir() if p.name.startswith(".") and p.name.endswith(".amplint")]  # no temporary left


def test_fix_keeps_a_hard_link_a_link(tree: Path) -> None:
    script = tree / "from_imports.py"
    other = tree / "hard_link.txt"
    os.link(script, other)
    amplint("from_imports.py", "--fix", cwd=tree)
    assert b"from torch.amp import" in script.read_bytes()
    assert other.read_bytes() == script.read_bytes() and other.stat().st_ino == script.stat().st_ino


def test_fix_refuses_a_file_the_user_may_not_write(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As root (CI) every file is writable, so the permission check itself answers no."""
    from amplint.static import fixes

    script = tree / "from_imports.py"
    before = script.read_bytes()
    monkeypatch.setattr(fixes.os, "access", lambda path, mode: not str(path).endswith("from_imports.py"))
    with pytest.raises(PermissionError):
        fixes.write_atomically(script, b"x = 1\n")
    assert script.read_bytes() == before


def test_fix_keeps_bom_line_endings_and_other_bytes(tmp_path: Path) -> None:
    path = tmp_path / "bom.py"
    original = "\ufeffimport torch\r\nscaler = torch.cuda.amp.GradScaler()  # café\r\nx = 1\t# tab\r\n".encode("utf-8")
    path.write_bytes(original)
    result = amplint("bom.py", "--fix", "--select", "AMP001", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    fixed = path.read_bytes()
    assert fixed.startswith(b"\xef\xbb\xbfimport torch\r\n")
    assert fixed.endswith("  # café\r\nx = 1\t# tab\r\n".encode("utf-8"))
    assert b"torch.amp.GradScaler(" in fixed and fixed.count(b"\r\n") == 3 and b"\n" not in fixed.replace(b"\r\n", b"")


@pytest.mark.parametrize(
    ("name", "original", "expected"),
    [
        # A lone "\r" inside a comment ends a line for Python and libcst, so the lines after it
        # are numbered one more than "\n" alone would say.
        ("lone_cr.py", b"import torch\nx = 1  # a\rb\nscaler = torch.cuda.amp.GradScaler()\nz = 3\n",
         b'import torch\nx = 1  # a\rb\nscaler = torch.amp.GradScaler("cuda")\nz = 3\n'),
        ("cr_only.py", b"import torch\rscaler = torch.cuda.amp.GradScaler()\r",
         b'import torch\rscaler = torch.amp.GradScaler("cuda")\r'),
        ("cr_crlf.py", b"import torch\r\r\nscaler = torch.cuda.amp.GradScaler()\r\r\n",
         b'import torch\r\r\nscaler = torch.amp.GradScaler("cuda")\r\r\n'),
        ("form_feed.py", b"import torch\n\x0c\nscaler = torch.cuda.amp.GradScaler()\n",
         b'import torch\n\x0c\nscaler = torch.amp.GradScaler("cuda")\n'),
    ],
)
def test_fix_and_diff_count_lines_as_python_does(tmp_path: Path, name: str, original: bytes, expected: bytes) -> None:
    path = tmp_path / name
    path.write_bytes(original)
    diff = subprocess.run(  # bytes: text mode would turn the file's "\r" into "\n"
        [sys.executable, "-m", "amplint", name, "--diff", "--select", "AMP001", "--no-cache"],
        capture_output=True, cwd=tmp_path, timeout=120,
    )
    assert b"Traceback" not in diff.stderr and b"internal error" not in diff.stderr, diff.stderr
    patched = tmp_path / "patched.py"
    patched.write_bytes(original)
    applied = subprocess.run(["patch", "-s", str(patched)], input=diff.stdout, capture_output=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    result = amplint(name, "--fix", "--select", "AMP001", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert path.read_bytes() == patched.read_bytes() == expected


def test_fix_keeps_a_latin1_file_in_its_encoding(tmp_path: Path) -> None:
    path = tmp_path / "latin.py"
    original = "# -*- coding: latin-1 -*-\nimport torch\nscaler = torch.cuda.amp.GradScaler()  # déjà\n".encode("latin-1")
    path.write_bytes(original)
    amplint("latin.py", "--fix", "--select", "AMP001", cwd=tmp_path)
    fixed = path.read_bytes()
    assert fixed != original and "# déjà\n".encode("latin-1") in fixed


def test_fix_honours_per_file_ignores(tree: Path) -> None:
    (tree / "pyproject.toml").write_text('[tool.amplint.per-file-ignores]\n"from_*.py" = ["AMP001"]\n', encoding="utf-8")
    before = (tree / "from_imports.py").read_bytes()
    amplint(".", "--fix", cwd=tree)
    assert (tree / "from_imports.py").read_bytes() == before
    assert (tree / "attribute_calls.py").read_bytes() != (FIXTURES / "attribute_calls.py").read_bytes()


def test_fix_honours_the_selection(tree: Path) -> None:
    before = snapshot(tree)
    result = amplint(".", "--fix", "--select", "AMP003", cwd=tree)
    assert snapshot(tree) == before
    assert "Fixed" not in result.stderr


# --- --unsafe-fixes: every AMP001 fix of the fixture tree is marked unsafe here ---

@pytest.fixture
def unsafe_amp001(monkeypatch: pytest.MonkeyPatch) -> None:
    from amplint.static.checks import amp001_deprecated_api as rule

    original = rule.check

    def check(facts):
        for hit in original(facts):
            if hit.fix is not None:
                hit = dataclasses.replace(hit, fix=FixPlan(Applicability.UNSAFE, hit.fix.replacements))
            yield hit

    monkeypatch.setattr(rule, "check", check)


def test_fix_leaves_unsafe_fixes_alone(tree: Path, unsafe_amp001, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tree)
    before = snapshot(tree)
    result = CliRunner().invoke(main, ["from_imports.py", "--fix", "--no-cache", "--select", "AMP001", "--format", "concise"])
    assert result.exit_code == 1, result.output
    assert snapshot(tree) == before
    assert "more with `--unsafe-fixes`" in result.output


def test_unsafe_fixes_applies_them(tree: Path, unsafe_amp001, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tree)
    result = CliRunner().invoke(main, ["from_imports.py", "--fix", "--unsafe-fixes", "--no-cache", "--select", "AMP001"])
    assert result.exit_code == 0, result.output
    assert b"from torch.cuda.amp import" not in (tree / "from_imports.py").read_bytes()


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="only root can give a file another group")
def test_fix_keeps_the_group_of_a_file_the_user_cannot_give_it(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file shared through its group's permissions, of a group the user is not in: the
    temporary file cannot take that group, so the file is rewritten in place."""
    from amplint.static import fixes

    script = tree / "from_imports.py"
    os.chown(script, 0, 4242)
    inode = script.stat().st_ino

    def refused(*args: object) -> None:
        raise PermissionError(errno.EPERM, "not permitted")

    monkeypatch.setattr(fixes.os, "chown", refused)
    fixes.write_atomically(script, b"x = 1\n")
    assert script.read_bytes() == b"x = 1\n"
    assert (script.stat().st_gid, script.stat().st_ino) == (4242, inode)
    assert not [p for p in tree.iterdir() if p.name.endswith(".amplint")]  # no temporary left
