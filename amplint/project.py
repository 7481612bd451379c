"""What a project declares about the torch it runs on: the requirements in its metadata.

A project folder declares its requirements in a pyproject.toml's `[project]` table, a setup.cfg,
a setup.py, its requirements files (`requirements.txt`, `requirements-ci.txt`,
`requirements/*.txt`) or a conda `environment.yml`; what those files in one folder list is read
together (a setup.py often reads its requirements.txt, and a CI pin such as icefall's
`torch==1.13.1+cpu` is a torch the project runs on). The nearest folder above a file whose
requirements name torch decides, and the oldest torch they admit bounds what `--fix` may write,
as ruff's target version follows `requires-python`. A folder whose requirements leave torch out
(`docs/requirements.txt`) says nothing about it.
"""

from __future__ import annotations

import ast
import configparser
import os
import re
from collections.abc import Callable
from pathlib import Path

# A PEP 508 requirement's name and extras, and what follows up to its markers: enough to find the
# torch requirements without importing packaging's full requirement parser (13 ms a run).
_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;#]*)")
_SETUP_KEYWORDS = ("install_requires", "extras_require")


def declared_torch(folder: Path, pyproject: dict) -> list[str]:
    """The torch requirements the project files in `folder` declare (`torch>=1.8.0`), with their
    version specifiers. `pyproject` is the folder's pyproject.toml, read."""
    requirements: list[str] = []
    project = pyproject.get("project")
    if isinstance(project, dict):
        requirements += _listed(project.get("dependencies"))
        extras = project.get("optional-dependencies")
        for listed in extras.values() if isinstance(extras, dict) else ():
            requirements += _listed(listed)
    for path, read in _project_files(folder):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        requirements += read(text)
    return [
        match.group(2).strip()
        for text in requirements
        if (match := _REQUIREMENT.match(text)) and re.sub(r"[-_.]+", "-", match.group(1)).lower() == "torch"
    ]


def _listed(value: object) -> list[str]:
    return [str(item) for item in value] if isinstance(value, list) else []


def _project_files(folder: Path) -> list[tuple[Path, Callable[[str], list[str]]]]:
    """The files of `folder` that may list requirements, each with its reader: setup files, a
    conda environment, `requirements.txt` and its siblings (`requirements-ci.txt`), and the files of
    a `requirements/` folder. One listing of the folder: a walk asks this of every folder."""
    try:
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except OSError:
        return []
    found: list[tuple[Path, Callable[[str], list[str]]]] = []
    for entry in entries:
        name = entry.name
        if name in _READERS:
            found.append((Path(entry.path), _READERS[name]))
        elif name.startswith("requirements") and name.endswith(".txt"):
            found.append((Path(entry.path), _requirements_txt))
        elif name == "requirements" and entry.is_dir():
            found += [(path, _requirements_txt) for path in sorted(Path(entry.path).glob("*.txt"))]
    return [(path, read) for path, read in found if path.is_file()]


# An option that takes a URL or path, written before a requirement on its line (`-f URL torch==1.13.1`).
_LEADING_OPTION = re.compile(r"(?:-f|--find-links|-i|--index-url|--extra-index-url)(?:\s*=\s*|\s+)\S+\s+")


def _requirements_txt(text: str) -> list[str]:
    """Requirement lines: not comments, other options (`-r other.txt`, `--index-url URL` alone) or
    blank lines. A file `conda list --export` wrote (`pytorch=1.13.1=py3.9_cuda11.7_0`, SimCLR's)
    pins torch as conda's `=` does."""
    lines = (_LEADING_OPTION.sub("", line.split(" #", 1)[0].strip(), count=1) for line in text.splitlines())
    return [_CONDA_EXPORT.sub(r"torch==\1", line) for line in lines if line and not line.startswith(("#", "-"))]


# `pytorch=1.13.1=<build>` or `torch=1.13.1`: one `=`, which no pip requirement writes.
_CONDA_EXPORT = re.compile(r"^(?:py)?torch=([^=\s]+)(?:=\S*)?$")


# A conda environment's torch, in its dependencies or their `pip:` list: `- pytorch=1.12.1`,
# `- pytorch::pytorch>=2.0`, `- pytorch=1.12.1=py3.8_cuda11.3_0` (a build string), `- torch==1.13.1`.
_CONDA_TORCH = re.compile(r"^\s*-\s*(?:[\w.-]+::)?(?:py)?torch(?![\w.-])\s*(=?=|>=|~=|>|<=?|!=)?\s*([^=\s#]*)", re.MULTILINE)


def _conda_environment(text: str) -> list[str]:
    """The torch requirements of an environment.yml (LDM, ControlNet and Stable Diffusion pin
    theirs there). conda's `pytorch=1.12.1` means any 1.12.1 build: pip's `==1.12.1`."""
    found = []
    for match in _CONDA_TORCH.finditer(text):
        operator, version = match.group(1), match.group(2)
        found.append(f"torch{'==' if operator == '=' else operator or ''}{version if operator else ''}")
    return found


def _setup_cfg(text: str) -> list[str]:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error:
        return []
    found = _requirements_txt(parser.get("options", "install_requires", fallback=""))
    if parser.has_section("options.extras_require"):
        for _extra, listed in parser.items("options.extras_require"):
            found += _requirements_txt(listed)
    return found


def _setup_py(text: str) -> list[str]:
    """The string literals a `setup(...)` call lists in `install_requires` / `extras_require`
    (a list, or a dict of lists), and every torch requirement with a version written anywhere in
    the file: a list in a variable (AutoGPTQ's `requirements = [..., "torch>=1.13.0"]`) or a table
    of pins the call picks from (transformers' `_deps`)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _VERSIONED_TORCH.match(node.value):
            found.append(node.value)
        if not isinstance(node, ast.Call):
            continue
        for keyword in node.keywords:
            if keyword.arg not in _SETUP_KEYWORDS:
                continue
            value = keyword.value
            lists = value.values if isinstance(value, ast.Dict) else [value]
            for listed in lists:
                if isinstance(listed, (ast.List, ast.Tuple)):
                    found += [e.value for e in listed.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return found


_VERSIONED_TORCH = re.compile(r"\s*torch\s*(?:[<>=!~]=|[<>])")


# The files that list requirements under a fixed name, and how each is read.
_READERS: dict[str, Callable[[str], list[str]]] = {
    "setup.cfg": _setup_cfg,
    "setup.py": _setup_py,
    "environment.yml": _conda_environment,
    "environment.yaml": _conda_environment,
}


def oldest_torch(torch: list[str]) -> tuple[int, ...] | None:
    """The oldest torch the version specifiers of torch requirements admit: their lowest lower
    bound (`>=`, `==`, `~=`, `>`); None when none has one (`torch`, `torch<3`, a URL). A
    requirement without a bound admits any torch, so it lowers no floor the others state."""
    if not torch:
        return None
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    bounds = []
    for specifiers in torch:
        lower = []
        try:
            for spec in SpecifierSet(specifiers.strip("()")):
                if spec.operator in (">=", "==", "~=", ">", "==="):
                    lower.append(Version(spec.version.removesuffix(".*")).release)
        except (InvalidSpecifier, InvalidVersion):
            continue  # `torch @ https://...`, or a version torch's own tags never take
        if lower:
            bounds.append(max(lower))
    return min(bounds, default=None)


# A comparison of the running torch's version with a 1.x one, on one line: `Version(torch.__version__)
# < Version("1.10.0")`, `digit_version(TORCH_VERSION) >= digit_version('1.5.0')`, `torch_version() >=
# (1, 7, 0)`, diffusers' `is_torch_version(">=", "1.9.0")`.
_VERSION_OF_TORCH = r"(?i:torch\.__version__|torch_version)"
_ONE_DOT = r"""(?:["']1\.(\d+)(?:\.\d+)*["']|\(\s*1\s*,\s*(\d+))"""
_TORCH_1_CHECK = re.compile(rf"{_VERSION_OF_TORCH}[^\n]*?{_ONE_DOT}|{_ONE_DOT}[^\n]*?{_VERSION_OF_TORCH}")


def oldest_torch_checked(text: str, declared: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The oldest torch a file keeps working on: the project's, or older where the file itself
    branches on a torch 1.x (mmengine's `amp.py`, which declares no torch and asserts torch >= 1.5):
    a fix must not drop what the file supports."""
    if "1" not in text or not re.search(_VERSION_OF_TORCH, text):
        return declared
    minors = [int(next(group for group in m.groups() if group)) for m in _TORCH_1_CHECK.finditer(text)]
    if not minors:
        return declared
    checked = (1, min(minors))
    return checked if declared is None or checked < declared else declared
