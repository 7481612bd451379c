"""`--simulate cuda`: what CUDA autocast would do, on a machine without a GPU (amp-rules §0.6).

While the script runs for real (on CPU), every torch call made inside an autocast region during
the first steps is shadowed: the same call runs again on fake CUDA tensors (`FakeTensorMode`,
no data, no GPU) with CUDA autocast enabled in the same dtype, and a dispatch recorder under the
fake mode notes the dtypes CUDA's autocast policy produces. Shadow outputs are remembered per
real tensor, so a dtype CUDA would change (softmax in float32 on CUDA, bf16 on CPU) flows into the
next simulated call as it would on a GPU. Regions written for CUDA (`torch.autocast("cuda")`, which
a CPU-only machine disables) are shadowed too, with the dtype they asked for.

Forward only: backward and optimizer steps are not simulated. A call that fails on fake CUDA
tensors is listed as "not simulated" with its error, never guessed, and so is a call that uses
what it returned; indexing and views keep their input's simulated dtype.
"""

from __future__ import annotations

import sys
import weakref
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode, resolve_name

from amplint.trace.dispatch_mode import TracerDispatchMode
from amplint.trace.nonfinite import floating_tensors

MAX_STEPS = 2  # the dtype policy does not change with the step; keep the cost bounded
_NOT_SIMULATED = object()  # what a call that failed on fake CUDA tensors returns

# Tensor methods that return their input's dtype, viewed, indexed or copied: autocast casts none.
# So does `batch_norm`, on no autocast list (cuDNN takes float16 input beside float32 statistics),
# which a CPU build refuses in training on fake CUDA tensors (its running statistics' update).
_KEEPS_ITS_DTYPE = frozenset({
    "__getitem__", "view", "reshape", "permute", "transpose", "select", "squeeze", "unsqueeze", "flatten",
    "chunk", "split", "narrow", "expand", "contiguous", "clone", "detach", "t", "unbind", "view_as", "reshape_as",
    "batch_norm",
})


class _InputNotSimulated(Exception):
    """A call's input came from a call that was not simulated."""


# nn.TransformerEncoderLayer and nn.MultiheadAttention skip their fused eval fast path when
# `torch.overrides.has_torch_function` sees a function mode: the shadow mode alone would send the
# real run down the unfused path, which computes other dtypes than the plain run.
_FAST_PATH_MODULES = frozenset({"torch.nn.modules.transformer", "torch.nn.modules.activation"})
# Those fused kernels are taken only while CUDA autocast is off (`why_not_sparsity_fast_path =
# "autocast is enabled"`): under CUDA autocast the module runs its parts one by one, so replaying
# the fused call there would show a path CUDA never takes.
_FUSED_FAST_PATHS = frozenset({"_transformer_encoder_layer_fwd", "_native_multi_head_attention"})
_FAST_PATH_NOT_TAKEN = (
    "not simulated: CUDA autocast turns off the module's fused fast path, so on CUDA its attention, "
    "linear and normalisation ops run one by one instead of this fused kernel"
)


# A composite call (`F.multi_head_attention_forward` in training) that makes a layout copy of a fake
# CUDA tensor inside (`.contiguous()`): a torch built without CUDA refuses to.
_CPU_BUILD_ERROR = "not linked with support for cuda"
_CPU_BUILD = " (this torch is a CPU build, which refuses an op inside this call, a copy of a fake CUDA tensor, even on fake tensors)"


def _dtypes(value) -> list[str]:
    out = []
    if isinstance(value, torch.Tensor):
        out.append(str(value.dtype).replace("torch.", ""))
    elif isinstance(value, (list, tuple)):
        for item in value:
            out.extend(_dtypes(item))
    return out


class _SimRecorder(TracerDispatchMode):
    def __init__(self, sink: Counter, site):
        super().__init__()
        self.sink, self.site = sink, site

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            name = func._schema.name + (f".{func._schema.overload_name}" if func._schema.overload_name not in ("", "default") else "")
            self.sink[(name, tuple(_dtypes(list(args))), tuple(_dtypes(out)), self.site)] += 1
        return out


class _ShadowMode(TorchFunctionMode):
    def __init__(self, simulator: CudaSimulator):
        super().__init__()
        self.sim = simulator

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        sim = self.sim
        state = sim.state
        if state.paused or state.step >= MAX_STEPS:
            return result
        dtype = sim.autocast_dtype()
        if dtype is None or not floating_tensors(result):
            return result
        sim.shadow(func, args, kwargs, result, dtype)
        return result


class CudaSimulator:
    def __init__(self, state, classifier):
        self.state = state
        self.classifier = classifier
        self.fake_mode = None
        self._fakes: dict[int, tuple] = {}
        self.calls: Counter = Counter()  # (site, function, run dtypes, simulated dtypes) -> count
        self.aten: Counter = Counter()
        self.failures: dict = {}
        self.dtypes_used: set = set()
        self._mode = _ShadowMode(self)

    def install(self, probes) -> None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
        self._original_has_torch_function = torch.overrides.has_torch_function
        torch.overrides.has_torch_function = self._has_torch_function_without_shadow
        self._mode.__enter__()

    def remove(self) -> None:
        try:
            self._mode.__exit__(None, None, None)
        except Exception:  # noqa: BLE001 - the script may have left modes unbalanced
            pass
        torch.overrides.has_torch_function = self._original_has_torch_function
        self._fakes.clear()

    def _has_torch_function_without_shadow(self, args) -> bool:
        """`has_torch_function` as the fast-path checks would see it in a plain run; every other
        caller keeps seeing the shadow mode (that is how it shadows their calls)."""
        original = self._original_has_torch_function
        if sys._getframe(1).f_globals.get("__name__") not in _FAST_PATH_MODULES:
            return original(args)
        stack = torch.overrides._get_current_function_mode_stack()
        if not stack or stack[-1] is not self._mode:
            return original(args)
        with torch.overrides._pop_mode_temporarily():
            return original(args)

    def autocast_dtype(self):
        mirror = self.state.mirror
        requested = [r for r in getattr(mirror, "requested", []) if r is not None]
        if requested:
            return requested[-1]
        for device, dtype in mirror.active:
            if device == "cpu" and dtype is not None:
                return getattr(torch, dtype)
        return None

    def _fake(self, value):
        if isinstance(value, torch.Tensor):
            entry = self._fakes.get(id(value))
            if entry is not None and entry[0]() is value:
                if entry[1] is _NOT_SIMULATED:  # its CUDA dtype is not known: never guessed from the CPU's
                    raise _InputNotSimulated("an input comes from a call that was not simulated")
                return entry[1]
            # `.to("cuda")` needs a CUDA build even for fake tensors; a fresh fake allocation does not.
            with self.fake_mode:
                fake = torch.empty_strided(tuple(value.shape), tuple(value.stride()), dtype=value.dtype, device="cuda")
            self._remember(value, fake)
            return fake
        if isinstance(value, (list, tuple)):
            return type(value)(self._fake(v) for v in value)
        if isinstance(value, dict):
            return {k: self._fake(v) for k, v in value.items()}
        if isinstance(value, torch.device) and value.type == "cpu":
            return torch.device("cuda")
        if value == "cpu" and isinstance(value, str):
            return "cuda"
        return value

    def _same_dtype_as_input(self, args, result, key):
        """What indexing or a view gives on CUDA when fake CUDA tensors cannot run it (a CPU build
        refuses `__getitem__` on them): the input's simulated dtype, in the real output's shape;
        autocast casts no such op. Still not simulated when the input's CUDA dtype is unknown."""
        source = next((a for a in args if isinstance(a, torch.Tensor)), None)
        try:
            fake = self._fake(source) if source is not None else None
        except _InputNotSimulated:
            return _NOT_SIMULATED
        if fake is None:
            return _NOT_SIMULATED
        self.failures.pop(key, None)
        with self.fake_mode:
            return [
                torch.empty_strided(tuple(out.shape), tuple(out.stride()), dtype=fake.dtype, device="cuda")
                if isinstance(out, torch.Tensor) else out
                for out in _flat(result)
            ]

    def _on_cuda(self, fake: torch.Tensor) -> torch.Tensor:
        """A fake made on the CPU (`torch.randn(4, 8)` in the region: a factory with no device
        argument) as the CUDA tensor the GPU run's code would hold, so that what is computed from
        it follows CUDA's policy, not the CPU's."""
        if fake.device.type == "cuda":
            return fake
        with self.fake_mode:
            return torch.empty_strided(tuple(fake.shape), tuple(fake.stride()), dtype=fake.dtype, device="cuda")

    def _remember(self, real, fake) -> None:
        try:
            self._fakes[id(real)] = (weakref.ref(real), fake)
        except TypeError:
            pass

    def shadow(self, func, args, kwargs, result, dtype) -> None:
        state = self.state
        site = self.classifier.user_callsite(2)
        name = resolve_name(func) or getattr(func, "__name__", repr(func))
        if name.rsplit(".", 1)[-1] in _FUSED_FAST_PATHS:
            self.failures.setdefault((site, name), _FAST_PATH_NOT_TAKEN)
            fake_result = _NOT_SIMULATED  # what is computed from it is not guessed from the CPU's dtypes
        else:
            with state.pause():
                fake_result = self._run_on_fake_cuda(func, args, kwargs, dtype, site, name)
                if fake_result is _NOT_SIMULATED and name.rsplit(".", 1)[-1] in _KEEPS_ITS_DTYPE:
                    fake_result = self._same_dtype_as_input(args, result, (site, name))
        if fake_result is _NOT_SIMULATED:
            for real in _flat(result):  # what is computed from it is not simulated either
                if isinstance(real, torch.Tensor):
                    self._remember(real, _NOT_SIMULATED)
            return
        self.dtypes_used.add(str(dtype).replace("torch.", ""))
        real_outs, fake_outs = _flat(result), _flat(fake_result)
        for real, fake in zip(real_outs, fake_outs):
            if isinstance(real, torch.Tensor) and isinstance(fake, torch.Tensor):
                self._remember(real, self._on_cuda(fake))
        self.calls[(site, name, tuple(_dtypes(result)), tuple(_dtypes(fake_result)))] += 1

    def _run_on_fake_cuda(self, func, args, kwargs, dtype, site, name):
        was_enabled = torch.is_autocast_enabled("cuda")
        was_dtype = torch.get_autocast_dtype("cuda")
        try:
            fake_args, fake_kwargs = self._fake(args), self._fake(kwargs)
            torch.set_autocast_enabled("cuda", True)
            torch.set_autocast_dtype("cuda", dtype)
            with torch.no_grad(), self.fake_mode, _SimRecorder(self.aten, site):
                return func(*fake_args, **fake_kwargs)
        except Exception as exc:  # noqa: BLE001 - reported as "not simulated", never guessed
            text = str(exc).strip().splitlines()
            key = (site, name)
            if key not in self.failures:
                kind = "" if isinstance(exc, _InputNotSimulated) else f"{type(exc).__name__}: "
                self.failures[key] = f"{kind}{text[0] if text else ''}"[:300] + (_CPU_BUILD if _CPU_BUILD_ERROR in str(exc) else "")
            return _NOT_SIMULATED
        finally:
            torch.set_autocast_enabled("cuda", was_enabled)
            torch.set_autocast_dtype("cuda", was_dtype)

    def results(self, display, run_ops: list[dict]) -> dict:
        def place(site):
            return (display(site[0]), site[1]) if site else ("<unknown>", 0)

        calls = []
        for (site, name, run, simulated), count in sorted(self.calls.items(), key=lambda kv: (place(kv[0][0]), kv[0][1])):
            path, line = place(site)
            calls.append(
                {
                    "function": name,
                    "path": path,
                    "line": line,
                    "count": count,
                    "run_output_dtypes": list(run),
                    "simulated_output_dtypes": list(simulated),
                }
            )
        ops = []
        for (op, ins, outs, site), count in sorted(self.aten.items(), key=lambda kv: (place(kv[0][3]), kv[0][0])):
            path, line = place(site)
            ops.append(
                {"op": op, "path": path, "line": line, "count": count, "input_dtypes": list(ins), "output_dtypes": list(outs), "device": "cuda"}
            )
        differences = [
            {
                "op": c["function"],
                "path": c["path"],
                "line": c["line"],
                "run_device": "cpu",
                "run_output_dtypes": c["run_output_dtypes"],
                "simulated_output_dtypes": c["simulated_output_dtypes"],
            }
            for c in calls
            if c["run_output_dtypes"] != c["simulated_output_dtypes"]
        ]
        not_simulated = [
            {"op": name, "path": place(site)[0], "line": place(site)[1], "error": error}
            for (site, name), error in self.failures.items()
        ]
        return {
            "device": "cuda",
            "dtypes": sorted(self.dtypes_used),
            "steps": MAX_STEPS,
            "calls": calls,
            "ops": ops,
            "differences": differences,
            "not_simulated": not_simulated,
            "note": "forward only, on fake CUDA tensors with CUDA autocast; dtypes from the CUDA autocast kernels of this torch build",
        }


def _flat(value) -> list:
    if isinstance(value, (list, tuple)):
        out = []
        for item in value:
            out.extend(_flat(item))
        return out
    return [value]
