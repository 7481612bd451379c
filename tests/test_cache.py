"""The result cache: a warm run equals a cold one, and any change that matters misses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from amplint import __version__
from amplint.config import Settings
from amplint.static import cache as cache_module
from amplint.static.runner import check_paths

BAD = "import torch\nwith torch.cuda.amp.autocast():\n    loss = model(x)\n    loss.backward()\n"
GOOD = "import torch\nwith torch.autocast('cuda'):\n    loss = model(x)\nloss.backward()\n"


def _codes(root: Path, settings: Settings | None = None) -> list[tuple[str, int]]:
    result = check_paths([str(root)], settings or Settings(root=root, select=("AMP001", "AMP003")))
    return [(f.code, f.line) for f in result.findings]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(BAD)
    (tmp_path / "utils.py").write_text("def f():\n    return 1\n")
    return tmp_path


def test_warm_run_reports_what_the_cold_run_reported(project: Path) -> None:
    cold = _codes(project)
    assert (project / ".amplint_cache").is_dir()
    assert _codes(project) == cold == [("AMP001", 2), ("AMP003", 4)]


def test_warm_run_answers_from_the_cache_without_analysing(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _codes(project)
    import amplint.static.runner as runner

    monkeypatch.setattr(runner, "_analyse", lambda job: pytest.fail(f"{job.display} was analysed again"))
    assert _codes(project) == [("AMP001", 2), ("AMP003", 4)]


def test_changing_a_file_invalidates_its_entry(project: Path) -> None:
    _codes(project)
    (project / "train.py").write_text(GOOD)
    assert _codes(project) == []


def test_same_size_edit_with_its_mtime_set_back_still_misses(project: Path) -> None:
    _codes(project)
    target = project / "train.py"
    before = target.stat()
    edited = GOOD.ljust(len(BAD))
    assert len(edited.encode()) == before.st_size
    target.write_text(edited)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert _codes(project) == []


def test_touching_a_file_without_changing_it_reuses_the_entry(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _codes(project)
    (project / "train.py").touch()
    import amplint.static.runner as runner

    monkeypatch.setattr(runner, "_analyse", lambda job: pytest.fail(f"{job.display} was analysed again"))
    assert _codes(project) == [("AMP001", 2), ("AMP003", 4)]


def test_changing_the_configuration_uses_another_entry(project: Path) -> None:
    assert _codes(project) == [("AMP001", 2), ("AMP003", 4)]
    narrowed = Settings(root=project, select=("AMP003",))
    assert _codes(project, narrowed) == [("AMP003", 4)]
    assert _codes(project) == [("AMP001", 2), ("AMP003", 4)]


def test_another_amplint_version_does_not_read_this_versions_cache(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _codes(project)
    monkeypatch.setattr(cache_module, "__version__", __version__ + ".post1")
    import amplint.static.runner as runner

    analysed: list[str] = []
    real = runner._analyse
    monkeypatch.setattr(runner, "_analyse", lambda job: analysed.append(job.display) or real(job))
    _codes(project)
    assert any(name.endswith("train.py") for name in analysed)


def test_a_corrupt_cache_file_is_ignored(project: Path) -> None:
    _codes(project)
    for entry_file in (project / ".amplint_cache").rglob("*.json"):
        entry_file.write_text("{not json")
    assert _codes(project) == [("AMP001", 2), ("AMP003", 4)]


@pytest.mark.parametrize("content", ["[]", "null", '{"x": [1, 2]}', '{"x": [[1, 2, 3], "h", [{"code": "AMP001"}]]}'])
def test_a_cache_file_of_the_wrong_shape_is_ignored(project: Path, content: str) -> None:
    cold = _codes(project)
    for stored in (project / ".amplint_cache").rglob("*.json"):
        entries = json.loads(stored.read_text())
        stored.write_text(content if content[0] != "{" else json.dumps({**entries, **{str(project / "train.py"): json.loads(content)["x"]}}))
    assert _codes(project) == cold


def test_a_file_found_in_a_folder_then_named_still_gets_its_syntax_checked(tmp_path: Path) -> None:
    """A folder run does not parse a file without AMP code; a later pre-commit run naming it must."""
    (tmp_path / "broken.py").write_text("x = (\n")
    settings = Settings(root=tmp_path)
    assert check_paths([str(tmp_path)], settings).findings == []
    named = check_paths([str(tmp_path / "broken.py")], settings).findings
    assert [f.code for f in named] == ["AMP000"]
    assert check_paths([str(tmp_path)], settings).findings == []


def test_two_processes_writing_the_cache_at_once_leave_a_readable_cache(project: Path) -> None:
    for index in range(30):
        (project / f"script_{index}.py").write_text(BAD)
    command = [sys.executable, "-m", "amplint", "-q", "--format", "json", "."]
    runs = [subprocess.Popen(command, cwd=project, stdout=subprocess.PIPE) for _ in range(2)]
    outputs = [json.loads(run.communicate(timeout=120)[0]) for run in runs]
    assert outputs[0] == outputs[1]
    for entry_file in (project / ".amplint_cache").rglob("*.json"):
        json.loads(entry_file.read_text())
    warm = subprocess.run(command, cwd=project, capture_output=True, timeout=120)
    assert json.loads(warm.stdout) == outputs[0]


def test_no_cache_flag_neither_reads_nor_writes(project: Path) -> None:
    subprocess.run([sys.executable, "-m", "amplint", "--no-cache", "."], cwd=project, capture_output=True, timeout=120)
    assert not (project / ".amplint_cache").exists()
