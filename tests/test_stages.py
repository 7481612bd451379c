"""Speed never trades correctness: `amplint check` (gates, screens, slices, workers) reports
exactly what the full analysis of every file with every rule reports, file by file.

The comparison is `bench/check_stages.py`, run as a developer runs it. On the torch tree the
full analysis takes about two minutes of CPU: it is the issue's own acceptance tree.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def files_and_findings_compared(tree: Path) -> tuple[int, int]:
    """Run the comparison; fail with its report unless every file agrees."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "check_stages.py"), str(tree)],
        capture_output=True, text=True, timeout=900, check=False,
    )
    summary = re.search(r"(\d+) files, (\d+) findings; 0 files differ", result.stdout)
    assert result.returncode == 0 and summary, result.stdout + result.stderr
    return int(summary[1]), int(summary[2])


@pytest.mark.parametrize("tree", ["fixtures", "examples"])
def test_staged_results_equal_the_full_analysis_on_the_projects_own_files(tree: str) -> None:
    files, findings = files_and_findings_compared(ROOT / tree)
    assert files > 0 and findings > 0


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the torch tree needs torch installed")
def test_staged_results_equal_the_full_analysis_on_the_torch_tree() -> None:
    files, findings = files_and_findings_compared(Path(importlib.util.find_spec("torch").submodule_search_locations[0]))
    assert files > 2000 and findings > 0
