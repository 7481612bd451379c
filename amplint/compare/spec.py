"""Loading a compare spec: a Python file whose names say what to compare and how to judge it.

Required: ``model`` and ``cases``. Optional: ``decide``, ``margin`` (an amplint extension),
``quality``, ``CRITERIA``, ``TRIALS``, ``DEVICE``. Every problem is raised as a `CompareError` with
one line of text; the command prefixes it with the spec's path.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from amplint.compare import spec_modules
from amplint.compare.criteria import Criteria, parse_criteria
from amplint.compare.errors import CompareError, describe_exception

# Autocast lower-precision dtypes amplint can try, with the spellings accepted for them.
TRIAL_DTYPES = {
    "float16": "float16",
    "half": "float16",
    "fp16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}
DEFAULT_TRIALS = ("bfloat16", "float16")
DEFAULT_DEVICE = "cpu"

KNOWN_NAMES = ("model", "cases", "decide", "margin", "quality", "CRITERIA", "TRIALS", "DEVICE")


@dataclass(frozen=True)
class Spec:
    path: str  # as the user gave it; used in the report and in error messages
    model: Callable[[], Any] | Any  # a factory, or an nn.Module instance
    cases: Callable[[], Any] | Any  # a factory, or an iterable of (id, input)
    decide: Callable[[Any], Any] | None
    margin: Callable[[Any], Any] | None
    quality: Callable[[dict, list], Any] | None
    criteria: Criteria
    trials: tuple[str, ...]
    device: str
    criteria_by_default: bool = False  # the spec sets no CRITERIA: amplint's defaults stand

    @property
    def device_type(self) -> str:
        """What torch.autocast wants: "cuda" for "cuda:1"."""
        return self.device.split(":", 1)[0]


def load_spec(path: str, device: str | None = None, trials: tuple[str, ...] | None = None) -> Spec:
    """Import the spec file and validate its names. ``device``/``trials`` override DEVICE/TRIALS."""
    module = _import_spec(path)
    names = vars(module)
    for required in ("model", "cases"):
        if required not in names:
            raise CompareError(f"the spec defines no `{required}`{_did_you_mean(required, names)}")
    _reject_misspellings(names, module.__name__)
    for optional in ("decide", "margin", "quality"):
        if names.get(optional) is not None and not callable(names[optional]):
            raise CompareError(f"`{optional}` must be a function, got {type(names[optional]).__name__}")
    if not callable(names["model"]) and not _is_module(names["model"]):
        raise CompareError(f"`model` must be a function returning a torch.nn.Module, got {type(names['model']).__name__}")

    criteria = parse_criteria(names.get("CRITERIA"))
    if criteria.min_quality is not None and names.get("quality") is None:
        raise CompareError("CRITERIA['min_quality'] is set but the spec defines no `quality(outputs, ids)`")
    return Spec(
        path=path,
        model=names["model"],
        cases=names["cases"],
        decide=names.get("decide"),
        margin=names.get("margin"),
        quality=names.get("quality"),
        criteria=criteria,
        trials=parse_trials(trials if trials is not None else names.get("TRIALS", DEFAULT_TRIALS)),
        device=parse_device(device if device is not None else names.get("DEVICE", DEFAULT_DEVICE)),
        criteria_by_default="CRITERIA" not in names,
    )


def parse_trials(raw: object) -> tuple[str, ...]:
    if isinstance(raw, str) or not _is_sequence(raw):
        raise CompareError(f"TRIALS must be a list of dtypes such as ['bfloat16', 'float16'], got {raw!r}")
    trials: list[str] = []
    for item in raw:
        name = _dtype_name(item)
        if name not in TRIAL_DTYPES:
            raise CompareError(
                f"TRIALS: unknown dtype {name!r}; autocast trials are 'float16' or 'bfloat16' "
                "(the FP32 baseline always runs)"
            )
        canonical = TRIAL_DTYPES[name]
        if canonical in trials:
            raise CompareError(f"TRIALS lists {canonical!r} twice")
        trials.append(canonical)
    if not trials:
        raise CompareError("TRIALS is empty; name at least one of 'bfloat16', 'float16'")
    return tuple(trials)


def parse_device(raw: object) -> str:
    text = str(raw) if _is_torch_device(raw) else raw
    if not isinstance(text, str):
        raise CompareError(f"DEVICE must be 'cpu' or 'cuda', got {raw!r}")
    kind, _, index = text.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()) or (kind == "cpu" and index):
        raise CompareError(f"DEVICE must be 'cpu', 'cuda' or 'cuda:N', got {text!r}")
    return text


def _dtype_name(item: object) -> str:
    # torch.float16 prints as "torch.float16"; accept it without importing torch here.
    text = str(item)
    return text.removeprefix("torch.")


def _is_sequence(raw: object) -> bool:
    return isinstance(raw, (list, tuple))


def _is_module(obj: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def _is_torch_device(obj: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.device)


def _did_you_mean(name: str, names: dict) -> str:
    candidates = [n for n in names if not n.startswith("_")]
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.75)
    return f" (found `{close[0]}`; the name must be `{name}`)" if close else ""


def _reject_misspellings(names: dict, module_name: str) -> None:
    """`criteria = {...}`, `TRIAL = [...]` or `def decied(outputs)` would otherwise be ignored
    and the defaults used: a name the spec itself defines that is a known name in another case,
    or close to one the spec lacks, is an error."""
    for name, value in names.items():
        if name in KNOWN_NAMES or name.startswith("_") or not _defined_in(value, module_name):
            continue
        known = _meant(name, callable(value))
        if known is not None and known not in names:
            raise CompareError(
                f"the spec defines `{name}`; did you mean `{known}`? amplint reads only `{known}` "
                f"(name it `_{name}` if it is for your own code)"
            )


_FUNCTIONS = ("decide", "margin", "quality")


def _meant(name: str, is_function: bool) -> str | None:
    """The known name `name` looks like a misspelling of: the same in another case, close to it
    (`decied`, `CRITERION`), or for a function the same start (`decision`, `quality_score`)."""
    lower = name.lower()
    for known in KNOWN_NAMES:
        if known.lower() == lower or (is_function and known in _FUNCTIONS and lower.startswith(known[:4])):
            return known
    close = difflib.get_close_matches(lower, [k.lower() for k in KNOWN_NAMES], n=1, cutoff=0.8)
    return next((k for k in KNOWN_NAMES if close and k.lower() == close[0]), None)


def _defined_in(value: object, module_name: str) -> bool:
    """Defined by the spec rather than imported into it: its own functions and classes, and plain
    values (an imported module or another module's function is not a spec name)."""
    if type(value).__name__ == "module":
        return False
    owner = getattr(value, "__module__", None)
    return owner == module_name if callable(value) else True


def _import_spec(path: str):
    if not os.path.exists(path):
        raise CompareError("no such file")
    if os.path.isdir(path):
        raise CompareError("is a directory, not a spec file")
    absolute = os.path.abspath(path)
    # Registered so that a DataLoader worker started by spawn can import the spec's classes again.
    module_spec = importlib.util.spec_from_file_location(spec_modules.register(path), absolute)
    if module_spec is None or module_spec.loader is None:
        raise CompareError("cannot be imported as a Python file")
    module = importlib.util.module_from_spec(module_spec)
    # Let a spec import helpers that sit beside it, at import time or when `model()` runs.
    directory = os.path.dirname(absolute)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    # Registered like any imported module: dataclasses and pickling look their module up here.
    sys.modules[module_spec.name] = module
    try:
        module_spec.loader.exec_module(module)
    except SyntaxError as exc:
        del sys.modules[module_spec.name]
        raise CompareError(f"line {exc.lineno}: SyntaxError: {exc.msg}") from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - user code or torch internals may raise anything
        del sys.modules[module_spec.name]
        raise CompareError(spec_exception(exc, absolute)) from None
    return module


def spec_exception(exc: BaseException, spec_file: str | None = None, where: str = "") -> str:
    """'model(), line 12: ValueError: ...' - where amplint called, and the innermost spec line that raised."""
    line = None
    if spec_file is not None:
        for frame in traceback.extract_tb(exc.__traceback__):
            if os.path.abspath(frame.filename) == spec_file:
                line = (frame.lineno, frame.name)
    parts = [where] if where else []
    if line is not None:
        lineno, function = line
        shown_function = function not in ("<module>", "<lambda>") and f"{function}(" not in where
        parts.append(f"line {lineno}" + (f" in {function}()" if shown_function else ""))
    return (", ".join(parts) + ": " if parts else "") + describe_exception(exc)
