"""The dispatch recorder (feasibility L2): sees every aten op after autocast's casts, in forward
and backward, and counts (op, input dtypes, output dtypes, autocast, phase, user line, autograd
node). The table's size depends on the code, not on the number of steps.

Per op it costs a frame walk (cached per code object) and a dict update; view ops (`t`, `view`,
`expand`...) and ops inside optimizer steps are passed through unrecorded: they cannot change a
dtype and would only hide the interesting rows.
"""

from __future__ import annotations

import torch

from amplint.trace.dispatch_mode import TracerDispatchMode
from amplint.trace.nonfinite import UNINITIALISED_OPS, NonFiniteMonitor
from amplint.trace.state import TraceState

_Tensor = torch.Tensor
LOW_PRECISION = (torch.float16, torch.bfloat16)


def mixes_low_precision_with_float32(dtypes) -> bool:
    """float16/bfloat16 beside float32 among one call's dtypes."""
    return any(d in LOW_PRECISION for d in dtypes) and torch.float32 in dtypes
_PASSIVE_OPS = frozenset(
    {"_to_copy", "to", "copy_", "clone", "contiguous", "empty_like", "zeros_like", "ones_like", "full_like",
     "rand_like", "randn_like", "fill_", "zero_", "eq", "ne", "isfinite", "isnan", "isinf", "_local_scalar_dense",
     "_has_compatible_shallow_copy_type", "set_", "resize_"}
)
_AUTOCAST_KEYS = {
    device: getattr(torch._C.DispatchKey, f"Autocast{suffix}")
    for device, suffix in (("cpu", "CPU"), ("cuda", "CUDA"), ("xpu", "XPU"), ("mps", "MPS"), ("hpu", "HPU"), ("xla", "XLA"))
    if hasattr(torch._C.DispatchKey, f"Autocast{suffix}")
}
# Private dispatcher hooks: a torch without them runs ops as the mode sees them (fused ops uncast).
_is_excluded = getattr(torch._C, "_dispatch_tls_is_dispatch_key_excluded", None)
_set_excluded = getattr(torch._C, "_dispatch_tls_set_dispatch_key_excluded", None)
_graph_task_id = torch._C._current_graph_task_id
_current_node = torch._C._current_autograd_node


class OpInfo:
    __slots__ = ("name", "skip", "mutated", "uninitialised", "constant_source", "passive", "overwrites", "_op", "_autocast_keys")

    def __init__(self, func):
        schema = func._schema
        self._op = func.name()
        self._autocast_keys: dict = {}
        self.name = f"{schema.name}" + (f".{schema.overload_name}" if schema.overload_name else "")
        self.mutated = tuple(
            i for i, arg in enumerate(schema.arguments) if arg.alias_info is not None and arg.alias_info.is_write
        )
        base = schema.name.split("::")[-1]
        self.uninitialised = base in UNINITIALISED_OPS
        # Python constants becoming tensors (`g[0] = float("inf")`): a source, not a culprit.
        self.constant_source = base in ("lift_fresh", "lift", "lift_fresh_copy", "scalar_tensor")
        # Casts, copies and allocations in a disabled region are the fix, not the problem (AMP014).
        self.passive = base in _PASSIVE_OPS
        # Writes that do not read what they overwrite (`grad[0, 0] = float("inf")`, `grad.zero_()`).
        self.overwrites = base in ("fill_", "zero_", "copy_", "index_put_", "index_fill_", "masked_fill_")
        # Views and aliasing ops keep their input's dtype: nothing to learn, and they are many.
        # `_unsafe_view` is a view that autograd is not told about (matmul's reshape of its result):
        # counted, each `torch.matmul` was two AMP014 calls.
        self.skip = (
            bool(func.is_view)
            or base in ("detach", "alias", "lift_fresh", "_local_scalar_dense", "_unsafe_view")
            or schema.name.startswith("profiler::")  # record_function markers around optimizer steps
        )

    def autocast_keys_to_restore(self, active: tuple) -> tuple:
        """The autocast dispatch keys a plain run would leave on while this op's kernel runs:
        those of the enabled devices for which the op has no autocast kernel (autocast falls
        through it, and ops its kernel calls are cast, e.g. the linears inside
        `_transformer_encoder_layer_fwd`). `__torch_dispatch__` runs with every autocast key
        excluded, so without this the kernel's inner ops would run uncast."""
        keys = self._autocast_keys.get(active)
        if keys is None:
            keys = self._autocast_keys[active] = tuple(
                key for key in (_AUTOCAST_KEYS.get(entry[0]) for entry in active) if key is not None and self._falls_through(key)
            )
        return keys

    def _falls_through(self, autocast_key) -> bool:
        try:
            return not torch._C._dispatch_has_kernel_for_dispatch_key(self._op, autocast_key)
        except (RuntimeError, AttributeError):  # not a dispatcher operator (`prim::device`), or a torch without the hook
            return False


def _dtypes(values) -> tuple:
    found = []
    for value in values:
        if isinstance(value, _Tensor):
            found.append(value.dtype)
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, _Tensor):
                    found.append(item.dtype)
    return tuple(found)


def _factory_device(kwargs: dict) -> str | None:
    """The device a factory op (`randn`, `arange`: no tensor arguments) creates on."""
    device = kwargs.get("device")
    return getattr(device, "type", None)


def _first_device(values) -> str | None:
    for value in values:
        if isinstance(value, _Tensor):
            return value.device.type
        if isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, _Tensor):
                    return item.device.type
    return None


class DispatchRecorder(TracerDispatchMode):
    def __init__(self, state: TraceState, monitor: NonFiniteMonitor, *, record: bool, check_ops: bool, keep_templates: bool):
        super().__init__()
        self.state = state
        self.monitor = monitor
        self.record = record
        self.check_ops = check_ops
        self.keep_templates = keep_templates
        self._infos: dict = {}
        self._user_callsite = state.classifier.user_callsite

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        state = self.state
        info = self._infos.get(func)
        if info is None:
            info = self._infos[func] = OpInfo(func)
        try:
            out = _run_as_plain(func, info, state.mirror.active, args, kwargs)
        except Exception as exc:
            if not state.paused and state.mirror.suppressed:
                self._raised_in_disabled_region(info, args)
            if not state.paused and not (info.skip or info.uninitialised):
                self._record_raise(func, info, args, kwargs, exc)
            raise
        if state.paused:
            return out
        if info.constant_source and self.check_ops:
            self.monitor.note_constant(out)
        if info.skip or info.uninitialised:
            return out

        phase, site, node = self._place()
        mirror = state.mirror
        if self.record and phase != "optimizer":
            out_dtypes = _dtypes((out,)) if not isinstance(out, (list, tuple)) else _dtypes(out)
            self._count(func, info, args, kwargs, out_dtypes, phase, site, node)

        suppressed = mirror.suppressed
        if suppressed and phase == "forward" and not info.passive and not state.inspecting and not _only_bool(out):
            self._disabled_region_op(suppressed, info, args, site)

        watch = state.watch
        if watch and site in watch:
            with state.pause():
                watch[site](site)
        elif phase == "forward" and site is not None and state.scaled_gradient_reads is not None and not state.clipping:
            state.scaled_gradient_reads(info, args, site)
        if self.check_ops and self.monitor.searching:
            self.monitor.check_op(info, args, kwargs, out, site, phase, node)
        return out

    def _count(self, func, info: OpInfo, args, kwargs, out_dtypes: tuple, phase: str, site, node) -> tuple:
        """One more call of the op in the table, under the autocast region of its device; its
        signature kept for the kernel probe. Returns the table's key."""
        state = self.state
        active = state.mirror.active
        autocast = None
        if active:
            device = _first_device(args) or _factory_device(kwargs)
            autocast = next((entry for entry in active if entry[0] == device), None)
        in_dtypes = _dtypes(args)
        key = (info.name, in_dtypes, out_dtypes, autocast, phase, site, node)
        state.ops[key] = state.ops.get(key, 0) + 1
        if site is not None:
            state.lines_seen.add(site)
            if active:
                state.lines_under_autocast.add(site)
        if self.keep_templates and (func, in_dtypes) not in state.op_templates:
            state.op_templates[(func, in_dtypes)] = _template(func, args, kwargs)
        return key

    def _record_raise(self, func, info: OpInfo, args, kwargs, exc: Exception) -> None:
        """An op that raised (no kernel for its dtype, `"zeta_cpu" not implemented for 'Half'`): a
        row with no outputs and the error, and its signature for the probe, which replays it
        against a float32 baseline, since its own dtypes are known to fail."""
        if not self.record:
            return
        phase, site, node = self._place()
        if phase == "optimizer":
            return
        key = self._count(func, info, args, kwargs, (), phase, site, node)
        lines = str(exc).strip().splitlines()
        self.state.raised_ops.setdefault(key, f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300])
        self.state.raised_signatures.add((func, key[1]))  # the op and its input dtypes

    def _place(self) -> tuple[str, tuple | None, str | None]:
        """Where the op runs: its phase, the user line, and in backward the autograd node."""
        if _graph_task_id() == -1:
            return ("optimizer" if self.state.in_optimizer else "forward"), self._user_callsite(2), None
        site = self._user_callsite(2)
        if site is None:
            site = self.state.backward_callsite  # backward on a device thread: no Python frames
        current = _current_node()
        return "backward", site, current.name() if current is not None else None

    def _raised_in_disabled_region(self, info: OpInfo, args) -> None:
        """An op that raised on its inputs (`mat1 and mat2 must have the same dtype`) in a region
        that disables autocast: AMP014's worst case, counted like one that ran."""
        if info.passive or _graph_task_id() != -1:
            return
        site = self._user_callsite(1)
        if site is not None:
            self.state.lines_seen.add(site)
        self._disabled_region_op(self.state.mirror.suppressed, info, args, site)

    def _disabled_region_op(self, suppressed, info, args, site) -> None:
        """AMP014: an op in a region that disables autocast inside an enabled one, receiving
        float16/bfloat16 tensors (the outer region made them; nothing casts them back)."""
        device = _first_device(args)
        for entry in suppressed:
            if entry[0] == device:
                in_dtypes = _dtypes(args)
                if any(d in LOW_PRECISION for d in in_dtypes):
                    key = (entry[3], site, info.name, tuple(str(d).replace("torch.", "") for d in in_dtypes), entry[1], entry[2], device)
                    table = self.state.disabled_region_ops
                    table[key] = table.get(key, 0) + 1
                return


def _only_bool(out) -> bool:
    """A comparison's result (`h > 0`, `torch.ne`): it reads low-precision values, computes nothing in them."""
    outputs = out if isinstance(out, (tuple, list)) else (out,)
    tensors = [t for t in outputs if isinstance(t, torch.Tensor)]
    return bool(tensors) and all(t.dtype == torch.bool for t in tensors)


def _run_as_plain(func, info: OpInfo, active: tuple, args, kwargs):
    """Run the op with the autocast state its kernel would see without the recorder."""
    if not active or _set_excluded is None or _is_excluded is None:
        return func(*args, **kwargs)
    restored = [key for key in info.autocast_keys_to_restore(active) if _is_excluded(key)]
    if not restored:
        return func(*args, **kwargs)
    for key in restored:
        _set_excluded(key, False)
    try:
        return func(*args, **kwargs)
    finally:
        for key in restored:
            _set_excluded(key, True)


def _template(func, args, kwargs):
    """The op's arguments with tensors replaced by (shape, dtype, device, requires_grad), for
    replaying it later in another dtype or on another device (kernels.py)."""

    def strip(value):
        if isinstance(value, _Tensor):
            return TensorSpec(tuple(value.shape), value.dtype, value.device.type, value.layout)
        if isinstance(value, (list, tuple)):
            return type(value)(strip(v) for v in value)
        return value

    return func, strip(tuple(args)), {k: strip(v) for k, v in kwargs.items()}


class TensorSpec:
    __slots__ = ("shape", "dtype", "device", "layout")

    def __init__(self, shape, dtype, device, layout):
        self.shape, self.dtype, self.device, self.layout = shape, dtype, device, layout

    def __repr__(self) -> str:
        return f"TensorSpec({list(self.shape)}, {self.dtype}, {self.device})"
