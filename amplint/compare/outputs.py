"""Model outputs as named leaves; the default decision and margin; hashing weights and inputs.

An output may be a tensor, a (nested) tuple/list/dict/namedtuple of tensors, or a Python number.
Every numeric leaf is compared within a tolerance; every other leaf (a string label, a bool, None)
must be equal. Leaves are named by their path ("output" for a lone tensor, "0", "logits", "aux.1"
inside containers) so reports and per-output tolerances can refer to them.
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import hashlib
import math
import sys
from collections.abc import Iterator
from typing import Any

import torch

from amplint.compare.spec_modules import PREFIX as SPEC_MODULE_PREFIX

ROOT = "output"


def leaves(output: Any) -> Iterator[tuple[str, Any]]:
    """(name, leaf) for every tensor or Python number in ``output``, in a stable order."""
    return ((name, leaf) for name, leaf in all_leaves(output) if is_numeric(leaf))


def all_leaves(output: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(name, leaf) for every leaf in ``output``: the numeric ones and the rest (strings, bools,
    None, other objects), which carry no number to compare but still say what the model answered."""
    fields = _fields(output)
    if fields is not None:
        for key, value in fields.items():
            yield from all_leaves(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(output, (tuple, list)):
        for index, value in enumerate(output):
            yield from all_leaves(value, f"{prefix}.{index}" if prefix else str(index))
    else:
        yield (prefix or ROOT), output


def is_numeric(leaf: Any) -> bool:
    return isinstance(leaf, torch.Tensor) or _is_number(leaf)


def is_exact(leaf: Any) -> bool:
    """An integer or bool tensor (argmax labels, indices, masks), or a Python int: compared exactly,
    since a tolerance meant for scores would let a class id change from 1 to 0 pass."""
    if isinstance(leaf, torch.Tensor):
        return not (leaf.is_floating_point() or leaf.is_complex())
    return isinstance(leaf, int)


def same_value(base: Any, trial: Any) -> bool:
    """Equality of two non-numeric leaves. A value (a label, a bool, None, an Enum, any type with
    its own `==`) must be equal; an object compared by identity only (Hugging Face's
    `DynamicCache`, a handle) is a new object on every run, so only its type is compared.
    Objects whose == gives no single answer (arrays) are compared by repr."""
    if type(base).__eq__ is object.__eq__:
        return type(base) is type(trial)
    try:
        return bool(base == trial)
    except (TypeError, ValueError, RuntimeError):
        return repr(base) == repr(trial)


def plain(output: Any) -> Any:
    """Detached CPU copy in the model's own containers, so `decide`, `margin` and `quality` read it
    as they read the model's output (`out.logits` of a namedtuple, a dataclass, Hugging Face's
    `ModelOutput`). `storable` turns it into plain containers for torch.save."""
    if isinstance(output, torch.Tensor):
        return output.detach().to("cpu", copy=True)
    fields = _fields(output)
    if fields is not None:
        return _with_fields(output, {key: plain(value) for key, value in fields.items()})
    if isinstance(output, tuple):
        return tuple(plain(value) for value in output)
    if isinstance(output, list):
        return [plain(value) for value in output]
    return output


# How `storable` names a container of the model's own type (a namedtuple, a dataclass, a dict
# subclass such as Hugging Face's ModelOutput): torch.load(weights_only=True) reads no classes.
_CONTAINER = "__amplint_container__"


def storable(output: Any) -> Any:
    """A `plain` output in dicts, tuples and lists only, each container of the model's own type
    recorded by its class's name, for `restore` to rebuild."""
    fields = _fields(output)
    if fields is not None:
        parts = {key: storable(value) for key, value in fields.items()}
        if type(output) is dict:
            return parts
        return {_CONTAINER: f"{_module_of(type(output))}:{type(output).__qualname__}", "fields": parts}
    if isinstance(output, (tuple, list)):
        return (tuple if isinstance(output, tuple) else list)(storable(value) for value in output)
    return output


def restore(stored: Any, spec_module: Any = None) -> Any:
    """Undo `storable`: a container class already imported (by the spec, given as `spec_module`,
    or the library its model comes from) is rebuilt; one that is not, or refuses, stays a dict of
    its parts. Nothing is imported here: a baseline file names classes, it does not choose code to run."""
    if isinstance(stored, dict):
        if set(stored) == {_CONTAINER, "fields"}:
            parts = {key: restore(value, spec_module) for key, value in stored["fields"].items()}
            return _build(_imported_class(stored[_CONTAINER], spec_module), parts)
        return {key: restore(value, spec_module) for key, value in stored.items()}
    if isinstance(stored, (tuple, list)):
        return type(stored)(restore(value, spec_module) for value in stored)
    return stored


_THE_SPEC = "<spec>"  # a class the spec file itself defines


def _module_of(cls: type) -> str:
    # Not the spec's import name (its path's digest): a spec moved to another folder or machine
    # still finds its classes in a stored baseline.
    return _THE_SPEC if cls.__module__.startswith(SPEC_MODULE_PREFIX) else cls.__module__


def _imported_class(name: str, spec_module: Any) -> type | None:
    module_name, _, qualname = name.partition(":")
    # A class of the spec is looked up in the spec compared now, wherever its file has moved.
    found: Any = spec_module if module_name == _THE_SPEC else sys.modules.get(module_name)
    for attribute in qualname.split("."):
        found = getattr(found, attribute, None)
    return found if isinstance(found, type) else None


def _build(cls: type | None, parts: dict) -> Any:
    if cls is None:
        return parts
    try:
        if issubclass(cls, dict) and not dataclasses.is_dataclass(cls):
            return cls(parts)
        return cls(**parts)  # a namedtuple, a dataclass (ModelOutput is both a dataclass and a dict)
    except Exception:  # noqa: BLE001 - a class whose constructor wants other arguments
        return parts


def to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {key: to_device(item, device) for key, item in value.items()}
    if isinstance(value, tuple) and not _has_fields(value):
        return tuple(to_device(item, device) for item in value)
    if isinstance(value, list):
        return [to_device(item, device) for item in value]
    return value


def call_model(model: torch.nn.Module, case_input: Any) -> Any:
    """A tuple input is positional arguments, a dict keyword arguments, anything else one argument."""
    if isinstance(case_input, tuple) and not _has_fields(case_input):
        return model(*case_input)
    if isinstance(case_input, dict):
        return model(**case_input)
    return model(case_input)


def is_finite(output: Any) -> bool:
    for _, leaf in leaves(output):
        if isinstance(leaf, torch.Tensor):
            if (leaf.is_floating_point() or leaf.is_complex()) and not bool(torch.isfinite(leaf).all()):
                return False
        elif isinstance(leaf, float) and not math.isfinite(leaf):
            return False
    return True


def has_nan(output: Any) -> bool:
    return any(
        bool(torch.isnan(leaf).any()) if isinstance(leaf, torch.Tensor) else isinstance(leaf, float) and math.isnan(leaf)
        for _, leaf in leaves(output)
    )


def as_float64(leaf: Any) -> torch.Tensor:
    if isinstance(leaf, torch.Tensor):
        return leaf.detach().to("cpu", torch.complex128 if leaf.is_complex() else torch.float64)
    return torch.tensor(leaf, dtype=torch.float64)


def first_float_tensor(output: Any) -> torch.Tensor | None:
    for _, leaf in leaves(output):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
            return leaf
    return None


def default_decide(output: Any) -> Any:
    """The contract's default: argmax of the last dimension, ties going to the lowest index.

    Applied to the first floating tensor of the output. Rows of one element (a scalar regressor, a
    single logit, also a batch of them: `[B, 1]`) have nothing to choose between, and per-pixel
    scores (`[B, C, H, W]`) hold their classes in dimension 1, so neither has a default decision
    (None): define ``decide``. A row holding NaN has no decision either (None).
    """
    scores = _class_scores(output)
    if scores is None:
        return None
    scores = scores.detach().to("cpu", torch.float64)
    size = scores.shape[-1]
    is_top = scores == scores.amax(dim=-1, keepdim=True)
    index = torch.arange(size).expand_as(scores)
    # Lowest index among the maxima; `size` marks a row where NaN made every comparison false.
    choice = torch.where(is_top, index, torch.full_like(index, size)).amin(dim=-1)
    return _rows_to_json(choice, size)


def _class_scores(output: Any) -> torch.Tensor | None:
    """The first floating tensor when its last dimension can hold class scores: `[C]`, `[B, C]`
    or `[B, T, C]`. Rows of one element have nothing to choose between; four dimensions and more
    are images or volumes (`[B, C, H, W]`), whose classes are not the last dimension."""
    scores = first_float_tensor(output)
    if scores is None or not 1 <= scores.dim() <= 3 or scores.shape[-1] <= 1:
        return None
    return scores


def default_margin(output: Any) -> float | None:
    """Gap between the two highest scores of the last dimension (smallest over rows), or None.

    Rows whose gap is not finite are left out: scores masked with -inf leave a row with a single
    candidate (an infinite gap) or none (-inf minus -inf); None when no row has a finite gap."""
    scores = _class_scores(output)
    if scores is None:
        return None
    top_two = scores.detach().to("cpu", torch.float64).topk(2, dim=-1).values
    gaps = top_two[..., 0] - top_two[..., 1]
    finite = gaps[torch.isfinite(gaps)]  # a row masked to one candidate or none has no finite gap
    return float(finite.min()) if finite.numel() else None


def batch_rows(output: Any) -> int | None:
    """The case's batch size: the first dimension of its first floating tensor, when that has two
    dimensions or more; None for an unbatched output."""
    scores = first_float_tensor(output)
    return scores.shape[0] if scores is not None and scores.dim() >= 2 else None


def decision_units(decision: Any, *, rows: int | None, default: bool) -> list:
    """A case's decision split into the units that count one each against `max_decision_changes`.

    The default decision holds one argmax per row of the last dimension (one per sample of
    `[B, C]`, one per token of `[B, T, C]`): each is a unit. A custom decide() gives one decision
    per case, or one per row of the batch when it returns a list as long as the batch (``rows``):
    a top-k ranking per query is one unit however many entries it has."""
    if default:
        return _flatten(decision)
    if rows is not None and isinstance(decision, list) and len(decision) == rows:
        return decision
    return [decision]


def count_decided(units: list) -> int:
    return sum(unit is not None for unit in units)


def count_changed(base_units: list, trial_units: list) -> int:
    """Units whose decision differs; a trial decision of another shape changes every unit."""
    if len(base_units) != len(trial_units):
        return max(1, count_decided(base_units))
    return sum(base != trial for base, trial in zip(base_units, trial_units))


def _flatten(value: Any) -> list:
    return [leaf for item in value for leaf in _flatten(item)] if isinstance(value, list) else [value]


def _rows_to_json(choice: torch.Tensor, missing: int) -> Any:
    values = choice.tolist()

    def clean(value):
        if isinstance(value, list):
            return [clean(v) for v in value]
        return None if value == missing else value

    values = clean(values)
    # A batch of one row ([1, C] scores) decides like a single row.
    while isinstance(values, list) and len(values) == 1:
        values = values[0]
    return values


def python_scalar(value: Any) -> Any:
    """A one-element tensor or numpy scalar as a Python number, NaN and inf kept; else unchanged."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value
    if not isinstance(value, (int, float)) and hasattr(value, "item") and callable(value.item):
        try:
            return value.item()
        except (TypeError, ValueError):  # an array of several values is no scalar
            return value
    return value


def is_finite_number(value: Any) -> bool:
    return _is_number(value) and math.isfinite(value)


def jsonable(value: Any) -> Any:
    """A decision as JSON: tensors become numbers or lists; other objects their repr (an Enum's
    `<Action.ALARM: 1>`). An object whose repr is only its address would "change" on every call:
    TypeError."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return jsonable(value.item() if value.numel() == 1 else value.tolist())
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars, without importing numpy
        return jsonable(value.item())
    if type(value).__repr__ is object.__repr__:
        raise TypeError(
            f"a {type(value).__name__!r} instance has no value to compare, only an address; "
            "return numbers, strings, booleans or lists of them"
        )
    return repr(value)


def hash_tensors(named: Iterator[tuple[str, Any]]) -> str:
    """sha256 over names, dtypes, shapes and bytes: equal exactly when the values are identical."""
    digest = hashlib.sha256()
    for name, value in named:
        digest.update(name.encode())
        if isinstance(value, torch.Tensor):
            tensor = value.detach().to("cpu").contiguous()
            digest.update(f"|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
            if tensor.numel():
                digest.update(ctypes.string_at(tensor.data_ptr(), tensor.numel() * tensor.element_size()))
        else:
            digest.update(f"|{type(value).__name__}|{value!r}|".encode())
    return digest.hexdigest()


def weights_hash(model: torch.nn.Module) -> str:
    return hash_tensors(iter(sorted(model.state_dict().items())))


def inputs_hash(cases: list[tuple[str, Any]]) -> str:
    return hash_tensors((f"{case_id}/{name}", leaf) for case_id, case_input in cases for name, leaf in leaves(case_input))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _has_fields(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_asdict")


def _fields(value: Any) -> dict | None:
    """The named parts of a dict, a namedtuple or a dataclass instance; None for anything else."""
    if isinstance(value, dict):
        return dict(value)
    if _has_fields(value):
        return value._asdict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    return None


def _with_fields(container: Any, values: dict) -> Any:
    """`container` with its named parts replaced by `values`, keeping its type where it can."""
    if type(container) is dict:
        return values
    if _has_fields(container):
        return type(container)(**values)
    try:
        clone = copy.copy(container)
        for key, value in values.items():
            if isinstance(clone, dict):
                clone[key] = value  # a dict subclass (ModelOutput keeps its attributes in step)
            else:
                object.__setattr__(clone, key, value)  # a dataclass, frozen ones too
        return clone
    except Exception:  # noqa: BLE001 - a container type that refuses copies: its parts still count
        return values
