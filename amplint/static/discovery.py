"""Which files a run checks: walk folders for *.py / *.pyi, honouring .gitignore and `exclude`."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pathspec

# pathspec is imported only when a pattern must be matched: a pre-commit run on a couple of
# named files never needs it.

# Folders that never hold the user's own source (the same defaults as ruff).
SKIPPED_DIRS = frozenset(
    {
        ".bzr", ".direnv", ".eggs", ".git", ".git-rewrite", ".hg", ".ipynb_checkpoints", ".mypy_cache",
        ".nox", ".pants.d", ".pyenv", ".pytest_cache", ".pytype", ".ruff_cache", ".amplint_cache", ".svn",
        ".tox", ".venv", ".vscode", "__pycache__", "__pypackages__", "_build", "buck-out", "build", "dist",
        "node_modules", "site-packages", "venv",
    }
)
# Of those, the names a build writes its output to, which a project may also give a package of its
# own (mmengine's `mmengine/dist/`): a folder so named that holds an `__init__.py` is walked.
_BUILD_OUTPUT_DIRS = frozenset({"_build", "build", "dist"})
PYTHON_SUFFIXES = (".py", ".pyi")


@dataclass(frozen=True)
class SourceFile:
    path: Path  # on disk
    display: str  # as reported: the command-line argument joined with the relative path
    named: bool = False  # named on the command line rather than found in a folder
    # The absolute path that identifies it (dedup, cache): the resolved folder joined with the
    # name, so that a walk does not pay for resolving every file again.
    key: str = ""

    def __post_init__(self) -> None:
        if not self.key:
            object.__setattr__(self, "key", str(self.path.resolve()))


class Excluder:
    """`exclude` patterns from the configuration, relative to the configuration's folder."""

    def __init__(self, patterns: tuple[str, ...], root: Path) -> None:
        self.specs: list[tuple[Path, pathspec.GitIgnoreSpec]] = []  # (folder they count from, patterns)
        if patterns:
            import pathspec

            self.specs.append((root.resolve(), pathspec.GitIgnoreSpec.from_lines(patterns)))

    def excludes(self, path: Path, is_dir: bool = False) -> bool:
        return any(spec.match_file(_relative(path, root, is_dir)) for root, spec in self.specs)

    def below(self, folder: Path) -> Excluder:
        """The excluder for what lies below a folder named on the command line: naming a folder
        overrides the patterns that exclude it (as in ruff). Those then count from the folder,
        so they still exclude what lies below it by its own name (`out*` on `out/out_gen.py`)."""
        below = Excluder((), folder)
        for root, spec in self.specs:
            below.specs.extend(_rerooted(root, spec, folder.resolve()))
        return below


def _relative(path: Path, root: Path, is_dir: bool) -> str:
    try:
        relative = path.resolve().relative_to(root).as_posix()
    except ValueError:
        relative = path.as_posix().lstrip("/")
    return relative + "/" if is_dir else relative


def _rerooted(root: Path, spec: pathspec.GitIgnoreSpec, folder: Path) -> list[tuple[Path, pathspec.GitIgnoreSpec]]:
    """`spec` (counting from `root`) for the paths below `folder`, a folder named on the command
    line: the patterns that match the folder itself count from the folder instead."""
    named = _relative(folder, root, True)
    if not spec.match_file(named):
        return [(root, spec)]
    import pathspec

    matching = [p for p in spec.patterns if p.include and p.match_file(named)]
    others = [p for p in spec.patterns if not any(p is m for m in matching)]
    return [(root, pathspec.GitIgnoreSpec(others)), (folder, pathspec.GitIgnoreSpec(matching))]


def _gitignore(folder: Path) -> pathspec.GitIgnoreSpec | None:
    try:
        lines = (folder / ".gitignore").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    import pathspec

    try:
        return pathspec.GitIgnoreSpec.from_lines(lines)
    except (ValueError, re.error):
        # git passes over a line it cannot read as a pattern (`[z-a]`, a lone `!`); so does the walk.
        return pathspec.GitIgnoreSpec.from_lines([line for line in lines if pattern_problem(line) is None])


def pattern_problem(pattern: str) -> str | None:
    """Why a gitignore-style pattern cannot be compiled, or None."""
    import pathspec

    try:
        pathspec.GitIgnoreSpec.from_lines([pattern])
    except (ValueError, re.error) as exc:
        return str(exc)
    return None


class _Patterns:
    """Patterns counting from one folder, with the folder being walked relative to it: a walk
    matches the strings it builds as it descends, not a resolved path per file (on a tree of
    thousands of files, Path arithmetic was most of discovery's time)."""

    __slots__ = ("spec", "prefix")

    def __init__(self, spec: pathspec.GitIgnoreSpec, prefix: str) -> None:
        self.spec = spec
        self.prefix = prefix  # "" at the patterns' folder, else the relative path with a "/"

    @classmethod
    def at(cls, root: Path, spec: pathspec.GitIgnoreSpec, folder: Path) -> _Patterns:
        relative = _relative(folder, root, is_dir=True)
        return cls(spec, "" if relative == "./" else relative)

    def matches(self, name: str, is_dir: bool) -> bool:
        return self.spec.match_file(f"{self.prefix}{name}/" if is_dir else self.prefix + name)

    def below(self, name: str) -> _Patterns:
        return _Patterns(self.spec, f"{self.prefix}{name}/")


def _is_file(entry: os.DirEntry) -> bool:
    """A file, or a link to one; a link that leads nowhere (missing, or a loop of links) is not."""
    try:
        return entry.is_file()
    except OSError:
        return False


def walk(argument: str, excluder: Excluder, respect_gitignore: bool, unreadable: list[str] | None = None) -> Iterator[SourceFile]:
    """Python files below a folder named on the command line, in a stable order. Folders that
    cannot be listed are added to `unreadable` (as "display: reason")."""
    top = Path(argument)
    resolved = top.resolve()
    excludes = [_Patterns.at(root, spec, resolved) for root, spec in excluder.below(top).specs]
    gitignores: list[_Patterns] = []
    if respect_gitignore:
        # .gitignore files above the folder, up to the repository root, apply too (its own is read
        # by the walk, like every folder's); naming the folder overrides those that ignore it (a
        # package in an ignored virtual environment).
        for parent in [] if (resolved / ".git").exists() else resolved.parents:
            spec = _gitignore(parent)
            if spec is not None:
                gitignores.extend(_Patterns.at(root, part, resolved) for root, part in _rerooted(parent, spec, resolved))
            if (parent / ".git").exists():
                break
    problems = unreadable if unreadable is not None else []
    yield from _walk(argument, str(resolved), argument, excludes + gitignores, respect_gitignore, problems)


def _walk(folder: str, resolved: str, display: str, patterns: list[_Patterns], respect_gitignore: bool, unreadable: list[str]) -> Iterator[SourceFile]:
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        unreadable.append(f"{display}: cannot read: {exc.strerror or exc}")
        return
    if respect_gitignore and any(e.name == ".gitignore" for e in entries):
        spec = _gitignore(Path(resolved))
        if spec is not None:
            patterns = [*patterns, _Patterns(spec, "")]
    # Paths are built only for Python files: a package tree holds many times more headers,
    # libraries and data files than sources.
    for entry in entries:
        name = entry.name
        if entry.is_dir(follow_symlinks=False):
            if name in SKIPPED_DIRS and not (name in _BUILD_OUTPUT_DIRS and os.path.isfile(os.path.join(entry.path, "__init__.py"))):
                continue
            if os.path.exists(os.path.join(entry.path, "pyvenv.cfg")):
                continue
            if any(p.matches(name, is_dir=True) for p in patterns):
                continue
            below = [p.below(name) for p in patterns]
            yield from _walk(entry.path, os.path.join(resolved, name), os.path.join(display, name), below, respect_gitignore, unreadable)
        elif name.endswith(PYTHON_SUFFIXES) and _is_file(entry):
            if any(p.matches(name, is_dir=False) for p in patterns):
                continue
            # A link is known by what it points to, so a file linked twice is checked once.
            key = os.path.realpath(entry.path) if entry.is_symlink() else os.path.join(resolved, name)
            yield SourceFile(Path(entry.path), os.path.join(display, name), key=key)
