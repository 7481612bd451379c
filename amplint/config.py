"""`[tool.amplint]` discovery and validation, and rule selection."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

KNOWN_KEYS = {"select", "ignore", "extend-select", "per-file-ignores", "exclude", "extend-exclude", "min-torch", "respect-gitignore"}
_CODE = re.compile(r"^AMP\d{0,3}$")
_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?$")


class ConfigError(Exception):
    """A configuration problem, worded for the user: names the file and the key."""


@dataclass(frozen=True)
class Settings:
    select: tuple[str, ...] = ("AMP",)
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    exclude: tuple[str, ...] = ()
    min_torch: tuple[int, ...] | None = None
    respect_gitignore: bool = True
    root: Path = field(default_factory=Path.cwd)  # patterns are relative to this folder
    source: Path | None = None  # the file the settings came from

    def is_enabled(self, code: str) -> bool:
        """The most specific matching prefix decides; on a tie `ignore` wins (as in ruff)."""
        chosen = max((len(p) for p in (*self.select, *self.extend_select) if code.startswith(p)), default=-1)
        ignored = max((len(p) for p in self.ignore if code.startswith(p)), default=-1)
        return chosen >= 0 and chosen > ignored

    def enabled_codes(self, all_codes: list[str]) -> frozenset[str]:
        return frozenset(code for code in all_codes if self.is_enabled(code))

    def fingerprint(self) -> str:
        """What changes results: part of every cache key."""
        return repr((self.select, self.ignore, self.extend_select, self.per_file_ignores, self.min_torch))


def _codes(value, key: str, source: Path) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{source}: `{key}` must be a list of rule codes such as [\"AMP003\"]")
    codes = tuple(v.strip().upper() for v in value)
    for code in codes:
        if not _CODE.match(code):
            raise ConfigError(f"{source}: `{key}` has {code!r}, which is not a rule code or prefix (AMP, AMP00, AMP003)")
    return codes


def parse_codes_option(value: str | None, option: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    codes = tuple(c.strip().upper() for c in value.split(",") if c.strip())
    for code in codes:
        if not _CODE.match(code):
            raise ConfigError(f"{option}: {code!r} is not a rule code or prefix (AMP, AMP00, AMP003)")
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
            raise ConfigError(f"{source}: `per-file-ignores` must be a table of glob = [codes]")
        updates["per_file_ignores"] = tuple(
            (str(pattern), _codes(codes, f"per-file-ignores.{pattern}", source)) for pattern, codes in value.items()
        )
    excludes: list[str] = []
    for key in ("exclude", "extend-exclude"):
        if key in table:
            value = table[key]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{source}: `{key}` must be a list of glob patterns")
            excludes.extend(value)
    updates["exclude"] = tuple(excludes)
    if "min-torch" in table:
        value = table["min-torch"]
        if not isinstance(value, str) or not _VERSION.match(value):
            raise ConfigError(f"{source}: `min-torch` must be a version string such as \"2.3\", not {value!r}")
        updates["min_torch"] = tuple(int(part) for part in value.split("."))
    if "respect-gitignore" in table:
        if not isinstance(table["respect-gitignore"], bool):
            raise ConfigError(f"{source}: `respect-gitignore` must be true or false")
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


def load_config_file(path: Path) -> Settings:
    """`--config FILE`: a pyproject.toml (its [tool.amplint]) or an amplint.toml (top level)."""
    data = _read_toml(path)
    if path.name == "pyproject.toml":
        table = data.get("tool", {}).get("amplint", {})
    else:
        table = data.get("tool", {}).get("amplint", data)
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.amplint] must be a table")
    return settings_from_table(table, path.resolve())


def discover(start: Path) -> Settings:
    """The nearest pyproject.toml with a [tool.amplint] table, from `start` upwards."""
    start = start.resolve()
    folder = start if start.is_dir() else start.parent
    for candidate in (folder, *folder.parents):
        pyproject = candidate / "pyproject.toml"
        if pyproject.is_file():
            data = _read_toml(pyproject)
            table = data.get("tool", {}).get("amplint")
            if table is not None:
                if not isinstance(table, dict):
                    raise ConfigError(f"{pyproject}: [tool.amplint] must be a table")
                return settings_from_table(table, pyproject.resolve())
    return Settings(root=Path.cwd())


def with_overrides(
    settings: Settings,
    select: tuple[str, ...] | None,
    ignore: tuple[str, ...] | None,
    extend_select: tuple[str, ...] | None,
) -> Settings:
    """Command-line flags win over the file: --select replaces, --ignore and --extend-select add."""
    updates: dict = {}
    if select is not None:
        updates["select"] = select
        updates["extend_select"] = ()
    if ignore is not None:
        updates["ignore"] = (*settings.ignore, *ignore)
    if extend_select is not None:
        updates["extend_select"] = (*updates.get("extend_select", settings.extend_select), *extend_select)
    return replace(settings, **updates)
