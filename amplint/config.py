"""`[tool.amplint]` discovery and validation, and rule selection.

Selection follows ruff: the configuration is one layer (`select`, `extend-select`, `ignore`) and
the command-line flags another on top of it. Within a layer the most specific selector decides
(`AMP003` beats `AMP00` beats `AMP`) and on a tie `ignore` wins. A layer with `select` starts
afresh; a layer without it only changes the rules its selectors name. AMP000 (a file that cannot
be parsed) is reported whatever `select` says, unless an `ignore` names it: a linter that silently
passes a file it could not read would let a broken file through CI.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from amplint.project import declared_torch, oldest_torch

KNOWN_KEYS = {"select", "ignore", "extend-select", "per-file-ignores", "exclude", "extend-exclude", "min-torch", "respect-gitignore"}
_CODE = re.compile(r"^AMP\d{0,3}$")
_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?$")
PARSE_ERROR = "AMP000"

# One layer of rule selection: (select or None, extend-select, ignore).
Layer = tuple[tuple[str, ...] | None, tuple[str, ...], tuple[str, ...]]


class ConfigError(Exception):
    """A configuration problem, worded for the user: names the file and the key."""


def _specificity(prefixes, code: str) -> int:
    return max((len(p) for p in prefixes if code.startswith(p)), default=-1)


def _decide(layer: Layer, code: str, previous: bool) -> bool:
    select, extend, ignore = layer
    chosen = _specificity((*(select or ()), *extend), code)
    ignored = _specificity(ignore, code)
    if select is None and chosen < 0 and ignored < 0:
        return previous  # this layer says nothing about the rule
    return chosen > ignored


@dataclass(frozen=True)
class Settings:
    select: tuple[str, ...] = ("AMP",)
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    exclude: tuple[str, ...] = ()
    min_torch: tuple[int, ...] | None = None
    min_torch_set: bool = False  # by `min-torch` in the configuration (else read off the project's torch requirement)
    respect_gitignore: bool = True
    root: Path = field(default_factory=Path.cwd)  # patterns are relative to this folder
    source: Path | None = None  # the file the settings came from
    overrides: tuple[Layer, ...] = ()  # command-line layers, applied after the file's

    def is_enabled(self, code: str) -> bool:
        """The most specific matching prefix decides; on a tie `ignore` wins (as in ruff)."""
        layers = ((self.select, self.extend_select, self.ignore), *self.overrides)
        enabled = False
        for layer in layers:
            enabled = _decide(layer, code, enabled)
        if code == PARSE_ERROR and not enabled:
            return not any(_specificity(layer[2], code) >= 0 for layer in layers)
        return enabled

    def enabled_codes(self, all_codes: list[str]) -> frozenset[str]:
        return frozenset(code for code in all_codes if self.is_enabled(code))

    def ignored_for(self, path: str | Path) -> tuple[str, ...]:
        """The code prefixes `per-file-ignores` switches off for one file (as reported)."""
        if not self.per_file_ignores:
            return ()
        import pathspec

        candidate = Path(path)
        try:
            relative = candidate.resolve().relative_to(self.root.resolve()).as_posix()
        except (ValueError, OSError):
            relative = candidate.as_posix()
        ignored: list[str] = []
        for pattern, codes in self.per_file_ignores:
            if pathspec.GitIgnoreSpec.from_lines([pattern]).match_file(relative):
                ignored.extend(codes)
        return tuple(ignored)

    def codes_for(self, path: str | Path, all_codes: list[str]) -> frozenset[str]:
        """The rules to run on one file: the enabled ones less its per-file ignores."""
        ignored = self.ignored_for(path)
        return frozenset(c for c in self.enabled_codes(all_codes) if not any(c.startswith(p) for p in ignored))

    def fingerprint(self) -> str:
        """What changes results: part of every cache key."""
        return repr((self.select, self.ignore, self.extend_select, self.overrides, self.per_file_ignores, self.min_torch))


def known_codes() -> list[str]:
    from amplint.catalogue import catalogue

    return sorted(catalogue())


def _check_code(code: str, where: str) -> str:
    if not _CODE.match(code):
        raise ConfigError(f"{where} has {code!r}, which is not a rule code or prefix (AMP, AMP00, AMP003)")
    if not any(known.startswith(code) for known in known_codes()):
        raise ConfigError(f"{where} has {code!r}, which matches no rule (run `amplint rule` for the list)")
    return code


def _patterns(patterns: list[str], key: str, source: Path) -> list[str]:
    from amplint.static.discovery import pattern_problem

    for pattern in patterns:
        if problem := pattern_problem(pattern):
            raise ConfigError(f"{source}: `{key}` has {pattern!r}, which is not a valid glob pattern ({problem})")
    return patterns


def _codes(value, key: str, source: Path) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{source}: `{key}` must be a list of rule codes such as [\"AMP003\"], not {value!r}")
    return tuple(_check_code(v.strip().upper(), f"{source}: `{key}`") for v in value)


def _anchored(pattern: str) -> str:
    """`./gen/` means the folder beside the configuration, as `/gen/` does in gitignore syntax,
    which would otherwise read `.` as a name and match nothing."""
    negated = pattern.startswith("!")
    body = pattern[negated:]
    if not body.startswith("./"):
        return pattern
    while body.startswith("./"):
        body = body[2:].lstrip("/")
    return f"{'!' if negated else ''}/{body}"


def parse_codes_option(value: str | None, option: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    codes = tuple(_check_code(c.strip().upper(), option) for c in value.split(",") if c.strip())
    if not codes and option == "--select":  # `--select ""` would pass every file having checked nothing
        raise ConfigError(f"{option} names no rule code (give codes or prefixes such as AMP003 or AMP)")
    return codes


def settings_from_table(table: dict, source: Path) -> Settings:
    unknown = sorted(set(table) - KNOWN_KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown key `{unknown[0]}` in [tool.amplint] (known: {', '.join(sorted(KNOWN_KEYS))})")
    settings = Settings(root=source.parent, source=source)
    updates: dict = {}
    if "select" in table:
        updates["select"] = _codes(table["select"], "select", source)
    if "ignore" in table:
        updates["ignore"] = _codes(table["ignore"], "ignore", source)
    if "extend-select" in table:
        updates["extend_select"] = _codes(table["extend-select"], "extend-select", source)
    if "per-file-ignores" in table:
        value = table["per-file-ignores"]
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: `per-file-ignores` must be a table of glob = [codes], not {value!r}")
        _patterns(list(value), "per-file-ignores", source)
        updates["per_file_ignores"] = tuple(
            (_anchored(str(pattern)), _codes(codes, f"per-file-ignores.{pattern}", source)) for pattern, codes in value.items()
        )
    excludes: list[str] = []
    for key in ("exclude", "extend-exclude"):
        if key in table:
            value = table[key]
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{source}: `{key}` must be a list of glob patterns, not {value!r}")
            excludes.extend(_anchored(v) for v in _patterns(value, key, source))
    updates["exclude"] = tuple(excludes)
    if "min-torch" in table:
        value = table["min-torch"]
        if not isinstance(value, str) or not _VERSION.match(value.strip()):
            raise ConfigError(f"{source}: `min-torch` must be a version string such as \"2.3\", not {value!r}")
        updates["min_torch"] = tuple(int(part) for part in value.strip().split("."))
        updates["min_torch_set"] = True
    if "respect-gitignore" in table:
        if not isinstance(table["respect-gitignore"], bool):
            raise ConfigError(f"{source}: `respect-gitignore` must be true or false, not {table['respect-gitignore']!r}")
        updates["respect_gitignore"] = table["respect-gitignore"]
    return replace(settings, **updates)


def _read_toml(path: Path) -> dict:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: not UTF-8 ({exc.reason})") from None


def _amplint_table(data: dict, path: Path, top_level: bool) -> dict | None:
    tool = data.get("tool", {})
    if not isinstance(tool, dict):
        tool = {}
    table = tool.get("amplint", data if top_level else None)
    if table is not None and not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.amplint] must be a table")
    return table


def load_config_file(path: Path) -> Settings:
    """`--config FILE`: a pyproject.toml (its [tool.amplint]) or an amplint.toml (top level)."""
    data = _read_toml(path)
    table = _amplint_table(data, path, top_level=path.name != "pyproject.toml")
    return settings_from_table(table or {}, path.resolve())


def discover(start: Path, known: dict[Path, Settings] | None = None, folder_resolved: bool = False) -> Settings:
    """The nearest pyproject.toml with a [tool.amplint] table, from `start` upwards.

    Without `min-torch` there, the oldest torch the nearest project folder declares stands for it
    (`amplint.project`), as ruff reads `requires-python` for its target version: a `--fix` must
    not write APIs newer than the torch the project declares (yolov5: `torch>=1.8.0`).

    `known` (folder -> its settings) carries the answers of earlier calls into the next: the
    files pre-commit names share a few folders, and each pyproject is read once.
    `folder_resolved`: `start` is a folder's resolved path already (a walk's)."""
    known = {} if known is None else known
    if folder_resolved:
        if start in known:
            return known[start]
        folder = start
    else:
        start = start.resolve()
        folder = start if start.is_dir() else start.parent
    visited: list[tuple[Path, dict]] = []  # each folder walked, with its pyproject.toml read
    settings = None
    for candidate in (folder, *folder.parents):
        if candidate in known:
            settings = known[candidate]
            break
        pyproject = candidate / "pyproject.toml"
        data = _read_toml(pyproject) if pyproject.is_file() else {}
        visited.append((candidate, data))
        table = _amplint_table(data, pyproject, top_level=False) if data else None
        if table is not None:
            settings = settings_from_table(table, pyproject.resolve())
            break
    if settings is None:
        settings = Settings(root=Path.cwd())
    # From the top down: each folder takes the nearest torch requirement at or above it (project
    # files are read only when the configuration does not set min-torch).
    for candidate, data in reversed(visited):
        torch = [] if settings.min_torch_set else declared_torch(candidate, data)
        if torch:
            settings = replace(settings, min_torch=oldest_torch(torch))
        known[candidate] = settings
    return settings


def with_overrides(
    settings: Settings,
    select: tuple[str, ...] | None,
    ignore: tuple[str, ...] | None,
    extend_select: tuple[str, ...] | None,
) -> Settings:
    """Command-line flags win over the file: --select starts afresh, --ignore and --extend-select
    change only the rules they name."""
    if select is None and ignore is None and extend_select is None:
        return settings
    layer: Layer = (select, extend_select or (), ignore or ())
    return replace(settings, overrides=(*settings.overrides, layer))
