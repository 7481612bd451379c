"""Kernel availability (feasibility §8, L4): replay every distinct op signature the run recorded
in another dtype on a target device, after the run.

Each signature is rebuilt from its template (floating tensors drawn in [0.25, 0.75), integer
tensors as zeros, other arguments, keyword ones included, as recorded), first in its recorded
dtypes as a baseline, then with the same values cast to the target dtype. A signature that
mixes float16/bfloat16 with float32 keeps its float32 tensors: the kernel takes them so (flash
attention's float32 logsumexp beside float16 queries), and only the low-precision ones move to
the target dtype. As the two calls differ only in the dtype, an op that runs in its recorded
dtypes and fails in the target dtype has no working kernel for that signature: "missing",
whatever the error says (a custom kernel may raise any text, or mix in a float32 constant),
unless another signature of the op runs in the target dtype: one that works shows the kernel
exists (a float32 call cast whole to float16 fails where the kernel wants a float32 statistic).
A failure of the baseline itself, arguments that cannot be rebuilt,
or an op no longer registered give "inconclusive" (reported, never "available"). A target device this machine does not have
gives "unverified" for every op, never "available". The RNG state is saved and restored so the
probe leaves no trace.
"""

from __future__ import annotations

import re
import warnings

import torch

from amplint.native_stderr import native_stderr_without
from amplint.trace.recorder import LOW_PRECISION, TensorSpec, mixes_low_precision_with_float32

# Same values in the baseline and the target call, so that only the dtype differs between them.
_VALUES_SEED = 0
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Never replayed: collectives would wait for other ranks; profiler markers hold no kernel.
_SKIP_NAMESPACES = ("c10d", "_c10d_functional", "profiler", "_dtensor")


def _device_available(device: str) -> bool:
    if device == "cpu":
        return True
    if device == "cuda":
        return torch.cuda.is_available()
    return False


def _build(value, dtype, device, generator, keep_float32=False):
    if isinstance(value, TensorSpec):
        if value.layout != torch.strided:
            raise _Unrebuildable(f"layout {value.layout}")
        cast = dtype is not None and value.dtype in _FLOATS and value.dtype != torch.float64
        target_dtype = dtype if cast and not (keep_float32 and value.dtype == torch.float32) else value.dtype
        if target_dtype.is_floating_point:
            # Positive, away from zero and inside [0, 1]: in the domain of log, sqrt, division,
            # asin/acos and probability arguments (binary_cross_entropy's target), so that a
            # baseline rarely fails on the values alone. Drawn in float32, then cast: the same
            # values whatever the dtype.
            drawn = torch.rand(value.shape, dtype=torch.float32, device=device, generator=generator)
            return (drawn * 0.5 + 0.25).to(target_dtype)
        if target_dtype.is_complex:
            return torch.rand(value.shape, dtype=target_dtype, device=device, generator=generator)
        return torch.zeros(value.shape, dtype=target_dtype, device=device)
    if isinstance(value, (list, tuple)):
        return type(value)(_build(v, dtype, device, generator, keep_float32) for v in value)
    if isinstance(value, dict):  # the keyword arguments: `out=` tensors, `dtype=`
        return {key: _build(v, dtype, device, generator, keep_float32) for key, v in value.items()}
    if isinstance(value, torch.device):
        return torch.device(device)
    if isinstance(value, torch.dtype) and dtype is not None and value in (torch.float16, torch.bfloat16, torch.float32):
        return dtype  # an explicit output dtype follows the probe
    return value


class _Unrebuildable(Exception):
    pass


def _has_input(args, kwargs, wanted) -> bool:
    """Whether a tensor argument's dtype satisfies `wanted`."""
    def walk(value):
        if isinstance(value, TensorSpec):
            return wanted(value.dtype)
        if isinstance(value, (list, tuple)):
            return any(walk(v) for v in value)
        return False

    return walk(args) or walk(list(kwargs.values()))


def _probed(dtype: torch.dtype) -> bool:
    return dtype in _FLOATS and dtype != torch.float64


def _complex(dtype: torch.dtype) -> bool:
    return dtype.is_complex


# An op on complex tensors only (an FFT's inverse, a spectral layer's complex einsum): the probe
# casts real floating tensors, so it says what it did not check rather than leave the op out.
_COMPLEX_ONLY = "complex inputs only: not probed (the probe casts real float tensors; complex32 is experimental in torch)"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _registered_name(func) -> str:
    schema = func._schema
    return schema.name + (f".{schema.overload_name}" if schema.overload_name else "")


def _op_name(func) -> str:
    name = _registered_name(func)
    return name[: -len(".default")] if name.endswith(".default") else name


# A warning torch's C++ side prints itself ("[W1203 10:11:52.02 EmptyTensor.cpp:54] Warning:
# ComplexHalf support is experimental"): the probe's own calls cause these, not the script.
_NATIVE_WARNING = re.compile(rb"\[W[\d ][^\]]*\] Warning: ")


def probe_kernels(templates: dict, dtypes: tuple[str, ...], device: str, raised: frozenset = frozenset()) -> list[dict]:
    """`raised`: the (op, input dtypes) signatures whose calls raised in the run; their baseline is
    the same call in float32, since their own dtypes are known to fail."""
    with warnings.catch_warnings(), native_stderr_without(lambda line: _NATIVE_WARNING.match(line) is not None):
        warnings.simplefilter("ignore")
        return _probe_all(templates, dtypes, device, raised)


def _probe_all(templates: dict, dtypes: tuple[str, ...], device: str, raised: frozenset) -> list[dict]:
    results: dict[tuple, dict] = {}
    available = _device_available(device)
    cpu_rng = torch.random.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        for (func, in_dtypes), (_, args, kwargs) in templates.items():
            namespace = func._schema.name.split("::")[0]
            if namespace in _SKIP_NAMESPACES:
                continue
            complex_only = not _has_input(args, kwargs, _probed) and _has_input(args, kwargs, _complex)
            if not complex_only and not _has_input(args, kwargs, _probed):
                continue
            name = _op_name(func)
            mixed = mixes_low_precision_with_float32(in_dtypes)
            for dtype_name in dtypes:
                key = (name, dtype_name, device)
                entry = results.setdefault(
                    key,
                    {
                        "op": name,
                        "dtype": dtype_name,
                        "device": device,
                        "available": None,
                        "error": None,
                        "status": None,
                        "signatures": 0,
                        "custom": namespace != "aten",
                        "ran_in_low_precision": False,
                    },
                )
                entry["signatures"] += 1
                # Whether the script needs the op's low-precision kernel at all: autocast keeps its
                # float32-list ops (cdist) and everything outside its regions in float32.
                entry["ran_in_low_precision"] |= any(d in LOW_PRECISION for d in in_dtypes)
                if complex_only:
                    if entry["status"] is None:
                        entry.update(status="inconclusive", error=_COMPLEX_ONLY)
                    continue
                if not available:
                    entry["status"] = "unverified"
                    entry["error"] = f"no {device} device on this machine: not verified"
                    continue
                if entry["status"] == "available":
                    continue  # one signature that runs in the dtype is enough
                baseline = torch.float32 if (func, in_dtypes) in raised else None
                verdict, error = _probe_one(func, args, kwargs, getattr(torch, dtype_name), device, keep_float32=mixed, baseline=baseline)
                if verdict == "available":
                    entry.update(available=True, status="available", error=None)
                elif verdict == "missing":
                    entry.update(available=False, status="missing", error=error)
                elif entry["status"] is None:
                    entry.update(status="inconclusive", error=error)
    finally:
        torch.random.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    return sorted(results.values(), key=lambda e: (e["available"] is not False, e["op"], e["dtype"]))


def _probe_one(func, args, kwargs, dtype, device, keep_float32=False, baseline=None) -> tuple[str, str | None]:
    if not torch._C._dispatch_has_kernel(_registered_name(func)):
        # A torch.library op whose library was destroyed during the run (a scoped library, or
        # one freed with the script's objects): calling it would use a freed registration.
        return "inconclusive", "the op was no longer registered when the probe ran"

    def rebuild(target_dtype):
        generator = torch.Generator(device=device).manual_seed(_VALUES_SEED)
        return (
            _build(args, target_dtype, device, generator, keep_float32),
            _build(kwargs, target_dtype, device, generator, keep_float32),
        )

    try:
        base_args, base_kwargs = rebuild(baseline)
    except _Unrebuildable as exc:
        return "inconclusive", f"cannot rebuild the arguments ({exc})"
    try:
        with torch.no_grad():
            func(*base_args, **base_kwargs)
    except Exception as exc:  # noqa: BLE001 - the baseline itself fails: nothing to conclude
        return "inconclusive", f"baseline failed: {_first_line(exc)}"
    try:
        probe_args, probe_kwargs = rebuild(dtype)
        with torch.no_grad():
            func(*probe_args, **probe_kwargs)
    except Exception as exc:  # noqa: BLE001 - only the dtype changed since the baseline ran
        return "missing", _first_line(exc)
    return "available", None
