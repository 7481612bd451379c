"""[tool.amplint] discovery, validation and rule selection: unit checks, then the real command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from amplint.config import (
    ConfigError,
    Settings,
    discover,
    load_config_file,
    parse_codes_option,
    settings_from_table,
    with_overrides,
)
from amplint.project import declared_torch, oldest_torch

ALL = ["AMP000", "AMP001", "AMP002", "AMP003", "AMP004", "AMP005"]

# One file with an AMP001 (line 2) and an AMP003 (line 5) finding.
TWO_RULES = """import torch
scaler = torch.cuda.amp.GradScaler()
with torch.autocast("cuda"):
    loss = model(x)
    loss.backward()
"""


def amplint(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "amplint", *args, "--no-cache"],
        capture_output=True, text=True, cwd=cwd, timeout=120,
        env={**os.environ, "NO_COLOR": "1"},
    )


def found(result: subprocess.CompletedProcess) -> set[tuple[str, str, int]]:
    assert "Traceback" not in result.stderr, result.stderr
    return {(Path(f["path"]).name, f["code"], f["line"]) for f in json.loads(result.stdout)}


def assert_config_error(result: subprocess.CompletedProcess, config: Path, key: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result
    assert len(lines) == 1, result.stderr
    assert str(config.resolve()) in lines[0] or str(config) in lines[0], lines[0]
    assert key in lines[0], lines[0]
    assert result.stdout == ""


def enabled(settings: Settings) -> set[str]:
    return set(settings.enabled_codes(ALL))


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# --- selection -------------------------------------------------------------------------------

def test_default_enables_every_rule() -> None:
    assert enabled(Settings()) == set(ALL)


def test_prefix_selects_a_family() -> None:
    settings = settings_from_table({"select": ["AMP00"]}, Path("/p/pyproject.toml"))
    assert enabled(settings) == {"AMP000", "AMP001", "AMP002", "AMP003", "AMP004", "AMP005"}
    settings = settings_from_table({"select": ["AMP003"]}, Path("/p/pyproject.toml"))
    assert enabled(settings) == {"AMP003", "AMP000"}


def test_more_specific_selector_wins_within_a_layer() -> None:
    settings = settings_from_table({"select": ["AMP003"], "ignore": ["AMP00"]}, Path("/p/pyproject.toml"))
    assert enabled(settings) == {"AMP003"}  # AMP00 also ignores AMP000


def test_ignore_wins_a_tie() -> None:
    settings = settings_from_table({"select": ["AMP003"], "ignore": ["AMP003"]}, Path("/p/pyproject.toml"))
    assert "AMP003" not in enabled(settings)


def test_extend_select_adds_to_select() -> None:
    settings = settings_from_table({"select": ["AMP001"], "extend-select": ["AMP004"]}, Path("/p/pyproject.toml"))
    assert enabled(settings) == {"AMP000", "AMP001", "AMP004"}


def test_command_line_select_replaces_the_file_including_its_ignores() -> None:
    settings = settings_from_table({"ignore": ["AMP003"], "extend-select": ["AMP001"]}, Path("/p/pyproject.toml"))
    settings = with_overrides(settings, ("AMP003",), None, None)
    assert enabled(settings) == {"AMP000", "AMP003"}


def test_command_line_extend_select_overrides_a_file_ignore() -> None:
    settings = settings_from_table({"ignore": ["AMP003"]}, Path("/p/pyproject.toml"))
    assert "AMP003" not in enabled(settings)
    assert "AMP003" in enabled(with_overrides(settings, None, None, ("AMP003",)))


def test_command_line_ignore_prefix_beats_a_specific_file_select() -> None:
    settings = settings_from_table({"select": ["AMP003", "AMP004"]}, Path("/p/pyproject.toml"))
    assert enabled(with_overrides(settings, None, ("AMP",), None)) == set()


def test_command_line_ignore_keeps_the_rest_of_the_file_selection() -> None:
    settings = settings_from_table({"select": ["AMP003", "AMP004"]}, Path("/p/pyproject.toml"))
    assert enabled(with_overrides(settings, None, ("AMP004",), None)) == {"AMP000", "AMP003"}


def test_parse_errors_stay_reported_unless_ignored() -> None:
    assert "AMP000" in enabled(with_overrides(Settings(), ("AMP005",), None, None))
    assert "AMP000" not in enabled(with_overrides(Settings(), ("AMP005",), ("AMP000",), None))


def test_codes_option_is_comma_separated_and_case_insensitive() -> None:
    assert parse_codes_option(" amp001 ,AMP00,", "--select") == ("AMP001", "AMP00")
    assert parse_codes_option(None, "--select") is None


@pytest.mark.parametrize("value", ["E501", "AMP0001", "ALL", "AMP999"])
def test_codes_option_rejects_what_matches_no_rule(value: str) -> None:
    with pytest.raises(ConfigError, match=rf"--ignore has '{value}'"):
        parse_codes_option(value, "--ignore")


# --- validation --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("table", "key"),
    [
        ({"selct": ["AMP001"]}, "selct"),
        ({"select": "E501"}, "select"),
        ({"select": 3}, "select"),
        ({"ignore": ["AMP9"]}, "ignore"),
        ({"extend-select": [1]}, "extend-select"),
        ({"per-file-ignores": ["tests/*"]}, "per-file-ignores"),
        ({"per-file-ignores": {"tests/*": ["X1"]}}, "per-file-ignores.tests/*"),
        ({"exclude": 3}, "exclude"),
        ({"min-torch": 2.4}, "min-torch"),
        ({"min-torch": "2"}, "min-torch"),
        ({"min-torch": "two"}, "min-torch"),
        ({"respect-gitignore": "yes"}, "respect-gitignore"),
    ],
)
def test_bad_values_name_the_key_and_the_file(table: dict, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_from_table(table, Path("/proj/pyproject.toml"))
    message = str(caught.value)
    assert message.startswith("/proj/pyproject.toml: ") and f"`{key}`" in message
    assert "\n" not in message


def test_min_torch_is_parsed() -> None:
    assert settings_from_table({"min-torch": "2.3"}, Path("/p/pyproject.toml")).min_torch == (2, 3)
    assert settings_from_table({"min-torch": "2.4.1"}, Path("/p/pyproject.toml")).min_torch == (2, 4, 1)


def test_per_file_ignores_are_relative_to_the_config_folder(tmp_path: Path) -> None:
    settings = settings_from_table({"per-file-ignores": {"tests/*.py": ["AMP00"], "legacy_*.py": ["AMP001"]}}, tmp_path / "pyproject.toml")
    assert settings.ignored_for(tmp_path / "tests" / "test_a.py") == ("AMP00",)
    assert settings.ignored_for(tmp_path / "src" / "tests" / "test_a.py") == ()  # anchored: only <root>/tests
    assert settings.ignored_for(tmp_path / "src" / "legacy_train.py") == ("AMP001",)  # no slash: any folder
    assert settings.codes_for(tmp_path / "tests" / "t.py", ALL) == frozenset()
    assert settings.codes_for(tmp_path / "src" / "legacy_a.py", ALL) == frozenset(set(ALL) - {"AMP001"})


def test_discover_finds_the_nearest_table_and_skips_pyprojects_without_one(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.amplint]\nselect = ["AMP004"]\n')
    write(tmp_path / "pkg" / "pyproject.toml", '[project]\nname = "pkg"\n')
    inner = write(tmp_path / "pkg" / "src" / "train.py", "")
    settings = discover(inner)
    assert settings.select == ("AMP004",)
    assert settings.root == tmp_path.resolve()


def test_discover_reads_a_pyproject_once_for_the_files_below_it(tmp_path: Path) -> None:
    pyproject = write(tmp_path / "pyproject.toml", '[tool.amplint]\nselect = ["AMP004"]\n')
    known: dict[Path, Settings] = {}
    first = discover(write(tmp_path / "a" / "train.py", ""), known)
    pyproject.unlink()  # the sibling folder is answered from what the first call passed
    assert discover(write(tmp_path / "b" / "eval.py", ""), known) == first
    assert discover(tmp_path / "b" / "eval.py").select == ("AMP",)


def test_discover_without_any_table_gives_defaults(tmp_path: Path) -> None:
    assert enabled(discover(tmp_path)) == set(ALL)


def test_config_file_may_be_an_amplint_toml_with_top_level_keys(tmp_path: Path) -> None:
    config = write(tmp_path / "amplint.toml", 'select = ["AMP002"]\n')
    assert load_config_file(config).select == ("AMP002",)


def test_invalid_toml_is_a_config_error(tmp_path: Path) -> None:
    config = write(tmp_path / "pyproject.toml", "[tool.amplint\nselect = [\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config_file(config)


# --- through the command line -------------------------------------------------------------------

def test_pyproject_selection_applies(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.amplint]\nselect = ["AMP003"]\n')
    write(tmp_path / "train.py", TWO_RULES)
    result = amplint("train.py", "--format", "json", cwd=tmp_path)
    assert result.returncode == 1
    assert found(result) == {("train.py", "AMP003", 5)}


def test_nearest_pyproject_above_the_checked_path_is_used(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.amplint]\nselect = ["AMP003"]\n')
    write(tmp_path / "sub" / "pyproject.toml", '[tool.amplint]\nselect = ["AMP001"]\n')
    write(tmp_path / "sub" / "train.py", TWO_RULES)
    result = amplint("sub/train.py", "--format", "json", cwd=tmp_path)
    assert found(result) == {("train.py", "AMP001", 2)}


def test_each_named_file_takes_the_configuration_nearest_to_it_in_any_order(tmp_path: Path) -> None:
    """pre-commit names the files of every project in a repository in one command line."""
    write(tmp_path / "pyproject.toml", '[tool.amplint]\nselect = ["AMP003"]\n')
    write(tmp_path / "sub" / "pyproject.toml", '[tool.amplint]\nselect = ["AMP001"]\n')
    write(tmp_path / "sub" / "train.py", TWO_RULES)
    write(tmp_path / "top.py", TWO_RULES)
    expected = {("train.py", "AMP001", 2), ("top.py", "AMP003", 5)}
    assert found(amplint("sub/train.py", "top.py", "--format", "json", cwd=tmp_path)) == expected
    assert found(amplint("top.py", "sub/train.py", "--format", "json", cwd=tmp_path)) == expected


def test_a_file_named_beside_the_folder_that_holds_it_is_checked_once_under_its_own_configuration(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.amplint]\nselect = ["AMP003"]\n')
    write(tmp_path / "sub" / "pyproject.toml", '[tool.amplint]\nselect = ["AMP001"]\n')
    write(tmp_path / "sub" / "train.py", TWO_RULES)
    for order in ((".", "sub/train.py"), ("sub/train.py", ".")):
        result = amplint(*order, "--format", "json", cwd=tmp_path)
        assert [(f["code"], f["line"]) for f in json.loads(result.stdout)] == [("AMP001", 2)]


def monorepo(root: Path) -> None:
    """A root project selecting AMP003, and services/api, a nested project selecting AMP001."""
    write(root / "pyproject.toml", '[tool.amplint]\nselect = ["AMP003"]\n')
    write(root / "services" / "api" / "pyproject.toml", '[tool.amplint]\nselect = ["AMP001"]\n')
    write(root / "services" / "api" / "train.py", TWO_RULES)
    write(root / "top.py", TWO_RULES)


def test_files_found_in_a_nested_project_take_its_configuration(tmp_path: Path) -> None:
    monorepo(tmp_path)
    result = amplint(".", "--format", "json", cwd=tmp_path)
    assert found(result) == {("train.py", "AMP001", 2), ("top.py", "AMP003", 5)}


def test_a_nested_projects_exclude_and_per_file_ignores_count_from_its_folder(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.amplint]\nselect = ["AMP001"]\n')
    write(
        tmp_path / "api" / "pyproject.toml",
        '[tool.amplint]\nselect = ["AMP001"]\nexclude = ["/gen/"]\n[tool.amplint.per-file-ignores]\n"/scripts/*.py" = ["AMP001"]\n',
    )
    for name in ("gen/a.py", "scripts/a.py", "src/a.py"):
        write(tmp_path / "api" / name, TWO_RULES)
        write(tmp_path / name, TWO_RULES)  # the root project's own gen/ and scripts/ are not excluded
    result = amplint(".", "--format", "json", cwd=tmp_path)
    assert checked(result) == {"api/src/a.py", "gen/a.py", "scripts/a.py", "src/a.py"}


def test_command_line_flags_apply_on_top_of_a_nested_configuration(tmp_path: Path) -> None:
    monorepo(tmp_path)
    result = amplint(".", "--extend-select", "AMP003", "--format", "json", cwd=tmp_path)
    assert found(result) == {("train.py", "AMP001", 2), ("train.py", "AMP003", 5), ("top.py", "AMP003", 5)}


def test_config_option_applies_to_nested_projects_too(tmp_path: Path) -> None:
    monorepo(tmp_path)
    result = amplint(".", "--config", "pyproject.toml", "--format", "json", cwd=tmp_path)
    assert found(result) == {("train.py", "AMP003", 5), ("top.py", "AMP003", 5)}


def test_a_bad_nested_configuration_exits_2_with_one_line(tmp_path: Path) -> None:
    monorepo(tmp_path)
    nested = write(tmp_path / "services" / "api" / "pyproject.toml", '[tool.amplint]\nselect = ["AMP9"]\n')
    assert_config_error(amplint(".", cwd=tmp_path), nested, "select")


def test_fixes_in_a_nested_project_follow_its_selection(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.amplint]\nselect = ["AMP001"]\n')
    write(tmp_path / "legacy" / "pyproject.toml", '[tool.amplint]\nignore = ["AMP001"]\n')
    kept = write(tmp_path / "legacy" / "train.py", TWO_RULES)
    fixed = write(tmp_path / "train.py", TWO_RULES)
    amplint(".", "--fix", cwd=tmp_path)
    assert kept.read_text(encoding="utf-8") == TWO_RULES
    assert "torch.cuda.amp" not in fixed.read_text(encoding="utf-8")


def test_a_nested_project_keeps_its_results_in_its_own_cache(tmp_path: Path) -> None:
    monorepo(tmp_path)
    run = [sys.executable, "-m", "amplint", ".", "--format", "json"]
    first = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert (tmp_path / "services" / "api" / ".amplint_cache").is_dir()
    write(tmp_path / "services" / "api" / "pyproject.toml", '[tool.amplint]\nselect = ["AMP003"]\n')
    second = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert found(first) == {("train.py", "AMP001", 2), ("top.py", "AMP003", 5)}
    assert found(second) == {("train.py", "AMP003", 5), ("top.py", "AMP003", 5)}


def test_config_option_replaces_discovery(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.amplint]\nselect = ["AMP003"]\n')
    other = write(tmp_path / "elsewhere" / "ci.toml", '[tool.amplint]\nselect = ["AMP001"]\n')
    write(tmp_path / "train.py", TWO_RULES)
    result = amplint("train.py", "--config", str(other), "--format", "json", cwd=tmp_path)
    assert found(result) == {("train.py", "AMP001", 2)}


def test_flags_override_the_file(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.amplint]\nselect = ["AMP003"]\n')
    write(tmp_path / "train.py", TWO_RULES)
    result = amplint("train.py", "--select", "AMP001", "--format", "json", cwd=tmp_path)
    assert found(result) == {("train.py", "AMP001", 2)}
    result = amplint("train.py", "--ignore", "AMP003", "--format", "json", cwd=tmp_path)
    assert result.returncode == 0 and found(result) == set()
    result = amplint("train.py", "--extend-select", "AMP001", "--format", "json", cwd=tmp_path)
    assert found(result) == {("train.py", "AMP001", 2), ("train.py", "AMP003", 5)}


def test_per_file_ignores_glob_relative_to_config_folder_from_another_cwd(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.amplint.per-file-ignores]\n"scripts/*.py" = ["AMP001"]\n')
    write(tmp_path / "scripts" / "a.py", TWO_RULES)
    write(tmp_path / "src" / "a.py", TWO_RULES)
    result = amplint(".", "--format", "json", "--select", "AMP001,AMP003", cwd=tmp_path)
    assert {(Path(f["path"]).parent.name, f["code"]) for f in json.loads(result.stdout)} == {
        ("scripts", "AMP003"), ("src", "AMP001"), ("src", "AMP003"),
    }
    # Run from inside a folder: the glob still counts from the pyproject's folder.
    result = amplint("a.py", "--format", "json", "--select", "AMP001,AMP003", cwd=tmp_path / "scripts")
    assert found(result) == {("a.py", "AMP003", 5)}


def test_exclude_skips_folders_and_files_when_walking(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.amplint]\nexclude = ["generated/", "legacy_*.py"]\n')
    write(tmp_path / "generated" / "a.py", TWO_RULES)
    write(tmp_path / "src" / "legacy_train.py", TWO_RULES)
    write(tmp_path / "src" / "train.py", TWO_RULES)
    result = amplint(".", "--format", "json", cwd=tmp_path)
    assert {Path(f["path"]).as_posix() for f in json.loads(result.stdout)} == {"src/train.py"}


def test_build_output_folders_are_skipped_but_a_package_named_dist_is_walked(tmp_path: Path) -> None:
    """`build/` and `dist/` hold a build's copies; `pkg/dist/__init__.py` (mmengine's) is source."""
    write(tmp_path / "build" / "lib" / "pkg" / "train.py", TWO_RULES)
    write(tmp_path / "dist" / "train.py", TWO_RULES)
    write(tmp_path / "pkg" / "dist" / "__init__.py", "")
    write(tmp_path / "pkg" / "dist" / "train.py", TWO_RULES)
    result = amplint(".", "--format", "json", cwd=tmp_path)
    assert {Path(f["path"]).as_posix() for f in json.loads(result.stdout)} == {"pkg/dist/train.py"}


def test_an_exclude_pattern_starting_with_dot_slash_counts_from_the_config_folder(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.amplint]\nexclude = ["./generated/"]\n')
    write(tmp_path / "generated" / "a.py", TWO_RULES)
    write(tmp_path / "src" / "generated" / "b.py", TWO_RULES)
    result = amplint(".", "--format", "json", cwd=tmp_path)
    assert {Path(f["path"]).as_posix() for f in json.loads(result.stdout)} == {"src/generated/b.py"}


def test_a_per_file_ignores_glob_starting_with_dot_slash_counts_from_the_config_folder(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.amplint.per-file-ignores]\n"./scripts/*.py" = ["AMP001"]\n')
    write(tmp_path / "scripts" / "a.py", TWO_RULES)
    result = amplint("scripts/a.py", "--format", "json", "--select", "AMP001,AMP003", cwd=tmp_path)
    assert found(result) == {("a.py", "AMP003", 5)}


def test_named_excluded_file_is_checked_unless_force_exclude(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.amplint]\nexclude = ["legacy_*.py"]\n')
    write(tmp_path / "legacy_train.py", TWO_RULES)
    assert amplint("legacy_train.py", cwd=tmp_path).returncode == 1
    result = amplint("legacy_train.py", "--force-exclude", cwd=tmp_path)
    assert result.returncode == 0, result.stdout


def checked(result: subprocess.CompletedProcess) -> set[str]:
    assert "Traceback" not in result.stderr, result.stderr
    return {Path(f["path"]).as_posix() for f in json.loads(result.stdout)}


def repository(root: Path, gitignore: str) -> Path:
    (root / ".git").mkdir(parents=True)
    write(root / ".gitignore", gitignore)
    return root


def test_gitignored_folders_and_files_are_skipped_when_walking(tmp_path: Path) -> None:
    repository(tmp_path, "generated/\n*_pb2.py\n")
    write(tmp_path / "sub" / ".gitignore", "scratch.py\n")
    for name in ("generated/a.py", "src/model_pb2.py", "sub/scratch.py", "sub/train.py", "train.py"):
        write(tmp_path / name, TWO_RULES)
    assert checked(amplint(".", "--format", "json", "--select", "AMP001", cwd=tmp_path)) == {"sub/train.py", "train.py"}


def test_a_gitignore_above_the_named_folder_applies_up_to_the_repository_root(tmp_path: Path) -> None:
    repository(tmp_path / "repo", "src/legacy.py\n")
    write(tmp_path / ".gitignore", "*.py\n")  # outside the repository: not ours
    write(tmp_path / "repo" / "src" / "legacy.py", TWO_RULES)
    write(tmp_path / "repo" / "src" / "train.py", TWO_RULES)
    result = amplint("src", "--format", "json", "--select", "AMP001", cwd=tmp_path / "repo")
    assert checked(result) == {"src/train.py"}


def test_a_named_folder_is_checked_though_a_gitignore_ignores_it(tmp_path: Path) -> None:
    """As in ruff: `amplint .venv/lib/python3.11/site-packages/pkg` checks the package; the
    patterns that do not ignore the folder itself still apply below it."""
    repository(tmp_path, ".venv/\n*_pb2.py\n")
    package = tmp_path / ".venv" / "lib" / "pkg"
    write(package / "train.py", TWO_RULES)
    write(package / "model_pb2.py", TWO_RULES)
    result = amplint(".venv/lib/pkg", "--format", "json", "--select", "AMP001", cwd=tmp_path)
    assert checked(result) == {".venv/lib/pkg/train.py"}
    assert checked(amplint(".", "--format", "json", cwd=tmp_path)) == set()


def test_a_pattern_overridden_for_the_named_folder_still_applies_below_it(tmp_path: Path) -> None:
    """`out*` ignores `out/`; naming `out` overrides that for the folder, not for `out/out_gen.py`."""
    repository(tmp_path, "out*\n")
    for name in ("out/train.py", "out/out_gen.py", "out/run/eval.py", "out/run/out_tmp/scratch.py"):
        write(tmp_path / name, TWO_RULES)
    result = amplint("out", "--format", "json", "--select", "AMP001", cwd=tmp_path)
    assert checked(result) == {"out/train.py", "out/run/eval.py"}


def test_a_named_folder_is_checked_though_exclude_names_it_unless_force_exclude(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.amplint]\nexclude = ["vendor/", "*_pb2.py"]\n')
    write(tmp_path / "vendor" / "train.py", TWO_RULES)
    write(tmp_path / "vendor" / "model_pb2.py", TWO_RULES)
    result = amplint("vendor", "--format", "json", "--select", "AMP001", cwd=tmp_path)
    assert checked(result) == {"vendor/train.py"}
    result = amplint("vendor", "--force-exclude", "--format", "json", cwd=tmp_path)
    assert checked(result) == set() and result.returncode == 0


def test_anchored_patterns_count_from_their_own_folder_when_a_subfolder_is_walked(tmp_path: Path) -> None:
    """`src/gen/` in the configuration and `/nested/tmp.py` in src/.gitignore name paths from the
    folder that holds them, whichever folder the command line names."""
    repository(tmp_path, "")
    write(tmp_path / "pyproject.toml", '[tool.amplint]\nexclude = ["src/gen/"]\n')
    write(tmp_path / "src" / ".gitignore", "/nested/tmp.py\n")
    for name in ("src/gen/a.py", "src/nested/tmp.py", "src/nested/train.py", "src/nested/gen/b.py"):
        write(tmp_path / name, TWO_RULES)
    result = amplint("src/nested", "--format", "json", "--select", "AMP001", cwd=tmp_path)
    assert checked(result) == {"src/nested/train.py", "src/nested/gen/b.py"}
    assert checked(amplint("src", "--format", "json", "--select", "AMP001", cwd=tmp_path)) == {
        "src/nested/train.py",
        "src/nested/gen/b.py",
    }


def test_a_gitignore_line_that_is_no_pattern_is_passed_over_as_git_does(tmp_path: Path) -> None:
    repository(tmp_path, "[z-a]\ngenerated/\n")
    for name in ("generated/a.py", "train.py"):
        write(tmp_path / name, TWO_RULES)
    assert checked(amplint(".", "--format", "json", "--select", "AMP001", cwd=tmp_path)) == {"train.py"}


def test_respect_gitignore_false_walks_ignored_files(tmp_path: Path) -> None:
    repository(tmp_path, "generated/\n")
    write(tmp_path / "pyproject.toml", "[tool.amplint]\nrespect-gitignore = false\n")
    write(tmp_path / "generated" / "a.py", TWO_RULES)
    assert checked(amplint(".", "--format", "json", "--select", "AMP001", cwd=tmp_path)) == {"generated/a.py"}


def test_min_torch_reaches_the_fixes(tmp_path: Path) -> None:
    """torch.amp.GradScaler exists from 2.3: with min-torch 2.2 the finding stays, without a fix."""
    source = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
    write(tmp_path / "new" / "train.py", source)
    write(tmp_path / "old" / "train.py", source)
    write(tmp_path / "old" / "pyproject.toml", '[tool.amplint]\nmin-torch = "2.2"\n')
    new = json.loads(amplint("new/train.py", "--format", "json", "--select", "AMP001", cwd=tmp_path).stdout)
    old = json.loads(amplint("old/train.py", "--format", "json", "--select", "AMP001", cwd=tmp_path).stdout)
    assert [f["code"] for f in new] == [f["code"] for f in old] == ["AMP001"]
    assert new[0]["fix"] is not None and old[0]["fix"] is None


@pytest.mark.parametrize(
    ("project", "oldest"),
    [
        ({"dependencies": ["numpy", "torch>=1.8.0"]}, (1, 8, 0)),
        ({"dependencies": ["torch>=2.1,<3; python_version >= '3.9'"]}, (2, 1)),
        ({"dependencies": ["torch==2.4.*"]}, (2, 4)),
        ({"dependencies": ["torch~=2.3.1"]}, (2, 3, 1)),
        ({"dependencies": ["Torch >= 2.2"], "optional-dependencies": {"old": ["torch>=1.13"]}}, (1, 13)),
        ({"dependencies": ["torch"]}, None),  # any torch
        ({"dependencies": ["torch<3"]}, None),
        ({"dependencies": ["torch @ https://download.pytorch.org/whl/torch.whl"]}, None),
        ({"dependencies": ["torch (>=1.9)"]}, (1, 9)),
        ({"dependencies": ["torchvision>=0.15"]}, None),
        ({"dependencies": ["not a requirement ("]}, None),
        ({}, None),
    ],
)
def test_the_oldest_torch_a_pyproject_declares(project: dict, oldest: tuple | None, tmp_path: Path) -> None:
    assert oldest_torch(declared_torch(tmp_path, {"project": project})) == oldest


@pytest.mark.parametrize(
    ("name", "text", "oldest"),
    [
        ("requirements.txt", "numpy\n-r base.txt\n# torch>=0.4\ntorch>=1.8.0  # see pytorch.org\n", (1, 8, 0)),
        ("setup.py", "from setuptools import setup\nsetup(name='x', install_requires=['torch>=2.1,<2.3'])\n", (2, 1)),
        ("setup.py", "import setuptools\nsetuptools.setup(extras_require={'gpu': ['torch>=1.10']})\n", (1, 10)),
        ("setup.py", "setup(install_requires=open('requirements.txt').read().split())\n", None),  # computed: not read
        ("setup.py", "setup(install_requires=[\n", None),  # not Python: nothing read, no error
        # AutoGPTQ: the list is a variable; transformers: a table of pins the call picks from.
        ("setup.py", "requirements = ['numpy', 'torch>=1.13.0']\nsetup(install_requires=requirements)\n", (1, 13, 0)),
        ("setup.py", "_deps = ['numpy>=1.17', 'torch>=1.0', 'torchvision']\nsetup(install_requires=deps_list('torch'))\n", (1, 0)),
        ("setup.py", "print('torch is required')\nsetup(install_requires=reqs)\n", None),  # prose, not a requirement
        ("setup.cfg", "[options]\ninstall_requires =\n    numpy\n    torch>=1.13.1\n", (1, 13, 1)),
        ("setup.cfg", "[options.extras_require]\ntrain = torch>=2.0\n", (2, 0)),
    ],
)
def test_the_oldest_torch_setup_files_and_requirements_declare(name: str, text: str, oldest, tmp_path: Path) -> None:
    write(tmp_path / name, text)
    assert oldest_torch(declared_torch(tmp_path, {})) == oldest


def test_a_ci_requirements_file_pinned_behind_a_find_links_option_bounds_the_torch(tmp_path: Path) -> None:
    """icefall: requirements.txt names no torch; requirements-ci.txt pins the CPU wheel of 1.13.1."""
    write(tmp_path / "requirements.txt", "kaldialign\nlhotse\n")
    write(tmp_path / "requirements-ci.txt", "-f https://download.pytorch.org/whl/cpu/torch_stable.html torch==1.13.1+cpu\n")
    assert oldest_torch(declared_torch(tmp_path, {})) == (1, 13, 1)


def test_a_conda_environment_pins_the_torch_of_a_project_without_other_requirements(tmp_path: Path) -> None:
    """ControlNet: `pytorch=1.12.1` with its build string; other torch* packages say nothing."""
    write(
        tmp_path / "environment.yaml",
        "name: control\nchannels:\n  - pytorch\ndependencies:\n  - python=3.8.5\n"
        "  - pytorch=1.12.1=py3.8_cuda11.3_cudnn8.3.2_0\n  - torchvision=0.13.1\n"
        "  - pip:\n      - pytorch-lightning==1.5.0\n      - torchmetrics==0.6.0\n",
    )
    assert oldest_torch(declared_torch(tmp_path, {})) == (1, 12, 1)


def test_a_requirements_file_conda_exported_pins_its_torch(tmp_path: Path) -> None:
    """SimCLR: `conda list --export` output saved as requirements.txt; torchvision says nothing."""
    write(tmp_path / "requirements.txt", "# platform: linux-64\npytorch=1.13.1=py3.9_cuda11.6_cudnn8.3.2_0\ntorchvision=0.14.1=py39_cu116\n")
    assert oldest_torch(declared_torch(tmp_path, {})) == (1, 13, 1)


def test_the_files_of_a_requirements_folder_are_read(tmp_path: Path) -> None:
    write(tmp_path / "requirements" / "base.txt", "numpy\n")
    write(tmp_path / "requirements" / "train.txt", "-r base.txt\ntorch>=2.0\n")
    assert oldest_torch(declared_torch(tmp_path, {})) == (2, 0)


def test_a_bare_torch_requirement_leaves_the_floor_to_the_pinned_ones(tmp_path: Path) -> None:
    """A bare `torch` admits any torch; the CI's pin says which old one the project runs on."""
    write(tmp_path / "requirements.txt", "torch\n")
    write(tmp_path / "requirements_test.txt", "torch==1.12.0\n")
    assert oldest_torch(declared_torch(tmp_path, {})) == (1, 12, 0)


def test_a_setup_py_that_reads_its_requirements_txt_is_bounded_by_that_file(tmp_path: Path) -> None:
    """audiocraft: setup.py reads requirements.txt, which pins `torch==2.1.0`."""
    write(tmp_path / "setup.py", "setup(install_requires=[l for l in open('requirements.txt')])\n")
    write(tmp_path / "requirements.txt", "torch==2.1.0\ntorchaudio>=2.0.0\n")
    assert oldest_torch(declared_torch(tmp_path, {})) == (2, 1, 0)


def test_a_declared_torch_requirement_stands_for_min_torch_unless_it_is_set(tmp_path: Path) -> None:
    write(tmp_path / "lib" / "pyproject.toml", '[project]\nname = "lib"\ndependencies = ["torch>=1.8.0"]\n')
    write(tmp_path / "lib" / "src" / "docs" / "requirements.txt", "sphinx\n")  # says nothing of torch
    write(tmp_path / "app" / "pyproject.toml", '[project]\nname = "app"\ndependencies = ["torch>=2.4"]\n')
    write(tmp_path / "set" / "pyproject.toml", '[project]\nname = "s"\ndependencies = ["torch>=1.8"]\n[tool.amplint]\nmin-torch = "2.3"\n')
    for folder in ("lib/src", "app", "set"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    known: dict = {}  # one cache for all: a sibling's answer must not leak into another folder
    assert discover(tmp_path / "lib" / "src" / "docs", known).min_torch == (1, 8, 0)
    assert discover(tmp_path / "lib" / "src", known).min_torch == (1, 8, 0)
    assert discover(tmp_path / "app", known).min_torch == (2, 4)
    assert discover(tmp_path / "set", known).min_torch == (2, 3)
    assert discover(tmp_path, known).min_torch is None


def test_a_project_declaring_an_old_torch_gets_no_fix_that_needs_a_newer_one(tmp_path: Path) -> None:
    """yolov5 declares `torch>=1.8.0`: `torch.amp.GradScaler("cuda")` (torch 2.3) would break it."""
    source = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
    write(tmp_path / "old" / "pyproject.toml", '[project]\nname = "old"\ndependencies = ["torch>=1.8.0"]\n')
    write(tmp_path / "old" / "train.py", source)
    write(tmp_path / "new" / "pyproject.toml", '[project]\nname = "new"\ndependencies = ["torch>=2.4"]\n')
    write(tmp_path / "new" / "train.py", source)
    write(tmp_path / "setup_py" / "setup.py", "from setuptools import setup\nsetup(install_requires=['torch>=2.1,<2.3'])\n")
    write(tmp_path / "setup_py" / "train.py", source)
    amplint("--fix", "old/train.py", "new/train.py", "setup_py/train.py", cwd=tmp_path)
    assert (tmp_path / "old" / "train.py").read_text() == source
    assert (tmp_path / "setup_py" / "train.py").read_text() == source  # torch.amp.GradScaler needs 2.3
    assert (tmp_path / "new" / "train.py").read_text() == 'import torch\nscaler = torch.amp.GradScaler("cuda")\n'


def test_a_file_that_branches_on_a_torch_1_version_gets_no_fix_that_drops_it(tmp_path: Path) -> None:
    """mmengine declares no torch, and its amp.py asserts torch >= 1.5: `torch.get_autocast_dtype`
    (torch 2.4) would break the torch it checks for; a file without such a check is fixed."""
    checked = (
        "import torch\nfrom packaging.version import Version\n\n"
        "assert Version(torch.__version__) >= Version('1.6.0')\n"
        "dtype = torch.get_autocast_gpu_dtype()\n"
    )
    plain = "import torch\n\ndtype = torch.get_autocast_gpu_dtype()\n"
    write(tmp_path / "checked.py", checked)
    write(tmp_path / "plain.py", plain)
    amplint("--fix", "checked.py", "plain.py", cwd=tmp_path)
    assert (tmp_path / "checked.py").read_text() == checked
    assert (tmp_path / "plain.py").read_text() == 'import torch\n\ndtype = torch.get_autocast_dtype("cuda")\n'


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("if digit_version(TORCH_VERSION) < digit_version('1.10.0'):", (1, 10)),
        ("if torch_version() >= (1, 7, 0):  # vissl", (1, 7)),
        ("if is_torch_version('>=', '1.9.0'):", (1, 9)),
        ("if torch.__version__ >= '2.1':", None),  # torch 2: the declared floor holds
        ("print('see release 1.5 notes')", None),  # a version, but not torch's
    ],
)
def test_the_oldest_torch_a_file_branches_on(text: str, version) -> None:
    from amplint.project import oldest_torch_checked

    assert oldest_torch_checked(text, None) == version
    assert oldest_torch_checked(text, (1, 8)) == min(version or (1, 8), (1, 8))


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[tool.amplint]\nselct = ["AMP001"]\n', "selct"),
        ('[tool.amplint]\nselect = ["AMP999"]\n', "select"),
        ('[tool.amplint]\nmin-torch = 2.4\n', "min-torch"),
        ('[tool.amplint.per-file-ignores]\n"a.py" = "nonsense"\n', "per-file-ignores"),
        ('[tool.amplint]\nexclude = ["gen/[z-a].py"]\n', "`exclude` has 'gen/[z-a].py', which is not a valid glob pattern"),
        ('[tool.amplint.per-file-ignores]\n"!" = ["AMP001"]\n', "`per-file-ignores` has '!', which is not a valid glob pattern"),
        ('[tool.amplint\n', "invalid TOML"),
    ],
)
def test_bad_configuration_exits_2_with_one_line(tmp_path: Path, text: str, key: str) -> None:
    config = write(tmp_path / "pyproject.toml", text)
    write(tmp_path / "train.py", TWO_RULES)
    assert_config_error(amplint("train.py", cwd=tmp_path), config, key)


def test_bad_config_option_file_exits_2(tmp_path: Path) -> None:
    write(tmp_path / "train.py", TWO_RULES)
    config = write(tmp_path / "custom.toml", 'ignore = ["nope"]\n')
    assert_config_error(amplint("train.py", "--config", str(config), cwd=tmp_path), config, "ignore")
    missing = tmp_path / "missing.toml"
    assert_config_error(amplint("train.py", "--config", str(missing), cwd=tmp_path), missing, "cannot read")


def test_bad_select_flag_exits_2_with_one_line(tmp_path: Path) -> None:
    write(tmp_path / "train.py", TWO_RULES)
    result = amplint("train.py", "--select", "AMP003,E501", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "amplint: error: --select has 'E501', which is not a rule code or prefix (AMP, AMP00, AMP003)"
    ]


def test_readme_configuration_example_is_valid() -> None:
    """The `[tool.amplint]` example in README's "Pre-commit and CI" section loads as documented."""
    import re
    import tomllib

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Pre-commit and CI"):]
    block = next(b for b in re.findall(r"```toml\n(.*?)```", section, re.DOTALL) if "[tool.amplint]" in b)
    settings = settings_from_table(tomllib.loads(block)["tool"]["amplint"], Path("/proj/pyproject.toml"))
    assert "AMP002" not in enabled(settings) and settings.min_torch == (2, 2)
    assert settings.codes_for(Path("/proj/tests/test_a.py"), ALL) == frozenset(set(ALL) - {"AMP002", "AMP004"})
