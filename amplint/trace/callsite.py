"""Which frame is the user's: the innermost one that is neither torch, amplint, the standard
library nor an installed package. Classification is cached per code object, so a walk costs
~150 ns per frame (feasibility §3)."""

from __future__ import annotations

import functools
import itertools
import os
import site
import sys
import sysconfig
from collections.abc import Callable, Iterator
from types import FrameType

Callsite = tuple[str, int]  # (absolute filename, line)


def _library_dirs(with_torch: bool) -> list[str]:
    dirs = set()
    # "scripts": console entry points (`.venv/bin/amplint`) call into amplint, not the user's code.
    for scheme_key in ("stdlib", "platstdlib", "purelib", "platlib", "scripts"):
        for vars_ in ({}, {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}):
            try:
                dirs.add(sysconfig.get_path(scheme_key, vars=vars_ or None))
            except KeyError:
                pass
    try:
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    except AttributeError:  # virtualenv's old site module
        pass
    if with_torch:  # an editable build of torch lives outside site-packages
        import torch

        dirs.add(os.path.dirname(torch.__file__))
    dirs.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # amplint itself
    return sorted({os.path.normcase(os.path.abspath(d)) + os.sep for d in dirs if d})


class CodeClassifier:
    """Answers "is this file user code?" and "is it part of the traced project?"."""

    def __init__(self, project_roots: list[str], with_torch: bool = True):
        self.library_dirs = tuple(_library_dirs(with_torch))
        self.project_roots = tuple(
            os.path.normcase(os.path.abspath(r)).rstrip(os.sep) + os.sep for r in project_roots
        )
        self._internal_by_code: dict = {}

    def is_library_file(self, filename: str) -> bool:
        if not filename or filename.startswith("<"):
            return True  # <frozen ...>, <string>, <stdin>: never a line the user can open
        return os.path.normcase(os.path.abspath(filename)).startswith(self.library_dirs)

    def is_project_file(self, filename: str) -> bool:
        if self.is_library_file(filename):
            return False
        return os.path.normcase(os.path.abspath(filename)).startswith(self.project_roots)

    def user_callsite(self, depth: int = 1) -> Callsite | None:
        """The innermost user frame above the caller's `depth`-th frame."""
        return next(self._user_frames(sys._getframe(depth + 1)), None)

    def user_callsites(self, depth: int = 1, limit: int = 2) -> list[Callsite]:
        """The innermost `limit` user frames (a helper's line and the line that called it)."""
        return list(itertools.islice(self._user_frames(sys._getframe(depth + 1)), limit))

    def construction_sites(self, obj, depth: int = 1, limit: int = 2) -> list[Callsite]:
        """The user lines that built `obj`, past the `__init__` of its own class (a subclass of the
        file calling `super().__init__(...)`: two instances are built where they are built)."""
        def inside_its_init(frame: FrameType) -> bool:
            code = frame.f_code
            return code.co_name == "__init__" and code.co_argcount > 0 and frame.f_locals.get(code.co_varnames[0]) is obj

        return list(itertools.islice(self._user_frames(sys._getframe(depth + 1), skip=inside_its_init), limit))

    def _user_frames(self, frame: FrameType | None, skip=None) -> Iterator[Callsite]:
        internal = self._internal_by_code
        while frame is not None:
            code = frame.f_code
            is_internal = internal.get(code)
            if is_internal is None:
                is_internal = internal[code] = self.is_library_file(code.co_filename)
            if not is_internal and not (skip is not None and skip(frame)):
                yield (code.co_filename, frame.f_lineno)
            frame = frame.f_back


@functools.lru_cache(maxsize=1)
def library_file_test() -> Callable[[str], bool]:
    """`is_library_file` before the script has imported torch (the tracer does not import it first)."""
    return CodeClassifier([], with_torch=False).is_library_file


# What marks a folder as a project's top: its repository or its packaging.
_PROJECT_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")


def _too_wide(folder: str) -> bool:
    """The home folder or the filesystem's root: never one project (a dotfiles repository in the
    home folder is not the project of every script below it)."""
    folder = os.path.abspath(folder)
    return os.path.dirname(folder) == folder or os.path.normcase(folder) == os.path.normcase(os.path.expanduser("~"))


def repository_root(folder: str) -> str | None:
    """The nearest folder at or above `folder` with a project marker."""
    current = os.path.abspath(folder)
    while not _too_wide(current):
        if any(os.path.exists(os.path.join(current, marker)) for marker in _PROJECT_MARKERS):
            return current
        current = os.path.dirname(current)
    return None


def project_roots(script: str, cwd: str, as_module: bool) -> list[str]:
    """The folders whose files are the traced project's (linted when the run imports them): the
    script's folder, and the repository around it, so that `scripts/train.py` brings in the
    package in `src/`. Without a marker, the folder amplint was started in stands for the
    repository when the script lies below it (`amplint trace scripts/train.py` from the project's
    top); under `-m` it always does."""
    from amplint.trace.launcher import script_import_folder

    folder = os.path.dirname(os.path.abspath(script))
    roots = [folder, script_import_folder(script)]
    top = repository_root(folder)
    if top is not None:
        roots.append(top)
    if as_module or (top is None and _is_below(folder, cwd) and not _too_wide(cwd)):
        roots.append(os.path.abspath(cwd))
    return list(dict.fromkeys(roots))


def _is_below(path: str, folder: str) -> bool:
    path, folder = os.path.normcase(os.path.abspath(path)), os.path.normcase(os.path.abspath(folder))
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def display_path(filename: str, cwd: str, roots: tuple = ()) -> str:
    """Paths in the report are relative to where amplint was started when they lie below it, or in
    the project around it (`../src/pkg/engine.py` from `scripts/`); absolute otherwise."""
    if filename.startswith("<"):
        return filename
    absolute = os.path.abspath(filename)
    try:
        relative = os.path.relpath(absolute, cwd)
    except ValueError:  # another drive on Windows
        return absolute
    if not relative.startswith(".."):
        return relative
    shared = any(_is_below(absolute, root) and _is_below(cwd, root) for root in roots)
    return relative if shared else absolute
