"""The namespace compare specs are imported under, importable again in child processes.

A spec's functions and classes (a Dataset, a collate function) travel to DataLoader workers and
other processes by pickle, which names them by module. A process started with `spawn` or
`forkserver` imports that module again by name, so the name must lead back to the spec's file
there too. Each spec is therefore a submodule of this module (a module with `__path__` is a
package): `amplint.compare.spec_modules.<stem>_<digest of the path>`. The digest keeps two specs
with the same file name apart, and the namespace keeps a spec called `torch.py` or `json.py` from
taking the place of the real module. The name-to-file map travels in the environment, which child
processes inherit; importing this module, as unpickling such a name does, installs the finder that
reads it.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import json
import os
import re
import sys

__path__: list[str] = []  # submodules come from the finder below, not from a folder

PREFIX = __name__ + "."
_ENVIRONMENT_MAP = "AMPLINT_COMPARE_SPEC_MODULES"  # JSON: {module name: absolute path}


def module_name(path: str) -> str:
    """The name the spec at `path` is imported under: its own, whatever other specs are loaded."""
    absolute = os.path.abspath(path)
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(absolute))[0])
    return f"{PREFIX}{stem}_{hashlib.sha1(absolute.encode()).hexdigest()[:12]}"


def register(path: str) -> str:
    """Record where the spec's module comes from, for this process and the ones it starts."""
    name = module_name(path)
    modules = _registered()
    modules[name] = os.path.abspath(path)
    os.environ[_ENVIRONMENT_MAP] = json.dumps(modules)
    return name


def _registered() -> dict[str, str]:
    return json.loads(os.environ.get(_ENVIRONMENT_MAP, "{}"))


class _SpecFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        location = _registered().get(fullname) if fullname.startswith(PREFIX) else None
        return importlib.util.spec_from_file_location(fullname, location) if location else None


sys.meta_path.append(_SpecFinder())
