"""API patches for AMP012, AMP013, AMP015, AMP016 (BCE) and AMP017, installed with the others
by `Probes.install` and undone by `Probes.remove`. Each costs nothing outside its own API, or one
attribute test on its fast path (`Function.apply` outside autocast).

- `torch.save` (AMP012): an optimizer state dict saved while an enabled GradScaler lives, and no
  mapping with the scaler's `scale` + `_growth_tracker` keys in the object
- `torch.autograd.Function.apply` (AMP013): under autocast, a project-defined Function whose
  forward has no `custom_fwd` receiving float16/bfloat16 and float32 tensors together; or a
  `custom_fwd` forward whose backward has no `custom_bwd`
- `threading.Thread.start`, `ThreadPoolExecutor.submit` (AMP015): work started while the parent
  thread had autocast on; in the worker, a small dispatch mode counts matmul-class ops in float32
- `torch.nn.functional.binary_cross_entropy` (AMP016): the "unsafe to autocast" error
- `torch.compile` (AMP017): calls of the compiled object under autocast
"""

from __future__ import annotations

import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Mapping

import torch

from amplint.trace.dispatch_mode import TracerDispatchMode
from amplint.trace.recorder import mixes_low_precision_with_float32

_MATMUL_OPS = frozenset(
    {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "convolution", "_convolution", "conv1d",
     "conv2d", "conv3d", "addmv", "mv", "dot", "_scaled_dot_product_flash_attention_for_cpu",
     "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention"}
)


def _dtype_name(dtype) -> str | None:
    return None if dtype is None else str(dtype).replace("torch.", "")


def _float_dtypes(values) -> set:
    found = set()
    for value in values:
        if isinstance(value, torch.Tensor):
            if value.is_floating_point():
                found.add(value.dtype)
        elif isinstance(value, (list, tuple)):
            found |= _float_dtypes(value)
    return found


def checkpoint_contents(obj, depth: int = 0, budget: list | None = None) -> tuple[bool, bool]:
    """(holds an optimizer state dict, holds a GradScaler's state: its state dict or the scaler
    itself), looked for a few levels deep."""
    budget = budget if budget is not None else [2000]
    budget[0] -= 1
    if depth > 5 or budget[0] < 0:
        return False, False
    if isinstance(obj, Mapping):
        keys = set()
        try:
            keys = {k for k in obj.keys() if isinstance(k, str)}
        except Exception:  # noqa: BLE001 - an odd mapping: look no further
            return False, False
        optimizer = "state" in keys and "param_groups" in keys
        scaler = "scale" in keys and "_growth_tracker" in keys
        if optimizer or scaler:
            return optimizer, scaler
        values = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        values = list(obj)
    else:
        return False, isinstance(obj, torch.amp.GradScaler)
    optimizer = scaler = False
    for value in values:
        if isinstance(value, (Mapping, list, tuple)):
            o, s = checkpoint_contents(value, depth + 1, budget)
            optimizer, scaler = optimizer or o, scaler or s
        else:
            scaler = scaler or isinstance(value, torch.amp.GradScaler)  # the scaler itself, pickled whole
    return optimizer, scaler


def _backward_method(cls) -> tuple[str, type | None, object]:
    """What autograd calls for a Function's backward: `vjp` when a class of the project
    overrides it, else `backward`; its name, the class that defines it and the attribute."""
    for name in ("vjp", "backward"):
        for klass in cls.__mro__:
            if klass.__module__.split(".")[0] == "torch":  # torch's own Function bases
                break
            if name in klass.__dict__:
                return name, klass, klass.__dict__[name]
    return "backward", None, None


def _autocast_on(device: str) -> bool:
    try:
        return bool(torch.is_autocast_enabled(device))
    except (TypeError, RuntimeError):  # a torch whose is_autocast_enabled takes no device
        return bool(torch.is_autocast_enabled())


def _closure_value(function, name: str):
    """The value a closure (torch's `decorate_fwd`) holds for `name`; None if it holds none."""
    code, cells = getattr(function, "__code__", None), getattr(function, "__closure__", None) or ()
    if code is None or name not in code.co_freevars:
        return None
    try:
        return cells[code.co_freevars.index(name)].cell_contents
    except (IndexError, ValueError):
        return None


def _decorated(function, code_name: str) -> bool:
    code = getattr(function, "__code__", None)
    return code is not None and code.co_name == code_name and code.co_filename.replace("\\", "/").endswith("amp/autocast_mode.py")


class _WorkerMatmuls(TracerDispatchMode):
    """In a worker thread started under autocast: matmul-class ops that ran in float32 there
    (the dispatch mode stack is thread-local, so the main recorder does not see them)."""

    def __init__(self, probes, record: dict):
        super().__init__()
        self.probes = probes
        self.record = record

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        state = self.probes.state
        if state.paused or state.mirror.active:  # the worker entered autocast itself: fine
            return out
        name = func._schema.name.split("::")[-1]
        if name in _MATMUL_OPS:
            dtypes = _float_dtypes(args)
            if dtypes == {torch.float32}:
                record = self.record
                record["fp32_matmuls"] += 1
                ops = record["ops"]
                ops[name] = ops.get(name, 0) + 1
                if record.get("first_op_at") is None:
                    record["first_op_at"] = self.probes.classifier.user_callsite(1)
        return out


class RuleProbes:
    def __init__(self, probes):
        self.probes = probes
        self.state = probes.state
        self.classifier = probes.classifier
        self._watched: set = set()  # Function classes whose backward (or vjp) is patched to count its runs

    def install(self) -> None:
        self._install_save()
        self._install_function_apply()
        self._install_threads()
        self._install_bce()
        self._install_compile()

    # -- AMP012 -------------------------------------------------------------------------------
    def _live_enabled_scaler(self):
        for index, ref in list(self.probes._scaler_objects.items()):
            info = self.state.scalers[index]
            if info.enabled and ref() is not None:
                return info
        return None

    def _install_save(self) -> None:
        rules, state = self, self.state

        def wrap(real):
            @functools.wraps(real)
            def save(obj, *args, **kwargs):
                if not state.paused:
                    try:
                        rules._record_save(obj)
                    except Exception:  # noqa: BLE001 - recording never changes the script's behaviour
                        pass
                return real(obj, *args, **kwargs)

            return save

        self.probes._patch(torch, "save", wrap)
        if getattr(torch.serialization, "save", None) is not None:
            self.probes._patch(torch.serialization, "save", lambda _real: torch.save)

    def _record_save(self, obj) -> None:
        """One `torch.save`. A checkpoint written as several files in one step (the Hugging Face
        Trainer's `optimizer.pt`, then `scaler.pt`) holds the scaler's state if one of them holds
        it without an optimizer's: a file that holds both is a whole checkpoint of its own
        (`last.pt`), and another saved beside it without the scaler (`best.pt`) resumes with a
        fresh scale."""
        state = self.state
        site = self.probes._callsite(2)
        optimizer, scaler = checkpoint_contents(obj)
        live = self._live_enabled_scaler()
        record = state.saves.get(site)
        if record is None:
            record = state.saves[site] = {"site": site, "saves": 0, "with_optimizer_state": 0, "with_scaler_state": 0, "missing_scaler_state": 0}
        record["saves"] += 1
        record["with_optimizer_state"] += optimizer
        record["with_scaler_state"] += scaler
        if scaler and not optimizer:
            state.scaler_state_saved_at.add(state.step)
            for earlier in state.saves_missing_the_scaler.pop(state.step, ()):
                earlier["missing_scaler_state"] -= 1
                earlier["scaler_state_in_another_save"] = earlier.get("scaler_state_in_another_save", 0) + 1
                if not earlier["missing_scaler_state"]:
                    earlier.pop("first_step", None)
                    earlier.pop("live_scaler", None)
        elif optimizer and not scaler and live is not None:
            if state.step in state.scaler_state_saved_at:
                record["scaler_state_in_another_save"] = record.get("scaler_state_in_another_save", 0) + 1
            else:
                record["missing_scaler_state"] += 1
                record.setdefault("first_step", state.step)
                record.setdefault("live_scaler", live.callsite)
                state.saves_missing_the_scaler.setdefault(state.step, []).append(record)

    # -- AMP013 -------------------------------------------------------------------------------
    def _function_record(self, cls):
        functions = self.state.custom_functions
        if cls in functions:
            return functions[cls]
        record = None
        forward = cls.__dict__.get("forward")
        forward = getattr(forward, "__func__", forward)
        code = getattr(getattr(forward, "__wrapped__", forward), "__code__", None)
        if code is not None and not self.classifier.is_library_file(code.co_filename):
            name, defining, backward = _backward_method(cls)
            backward = getattr(backward, "__func__", backward)
            fwd, bwd = _decorated(forward, "decorate_fwd"), _decorated(backward, "decorate_bwd")
            kind = "undecorated" if not fwd else ("fwd-without-bwd" if not bwd else None)
            if kind is not None:
                line, span = None, None
                try:
                    import inspect

                    lines, line = inspect.getsourcelines(cls)
                    span = (code.co_filename, line, line + len(lines) - 1)
                except (OSError, TypeError):
                    pass
                record = {
                    "class": cls.__qualname__,
                    "kind": kind,
                    # custom_fwd(cast_inputs=...) runs forward with autocast off (and records that
                    # for custom_bwd): only a backward run under autocast then differs from it.
                    "casts_inputs": fwd and _closure_value(forward, "cast_inputs") is not None,
                    "defined_at": (code.co_filename, line) if line else None,
                    "span": span,
                    "forward_at": (code.co_filename, code.co_firstlineno),
                    "calls_under_autocast": 0,
                    "off_region": None,  # where a region left off around an apply was entered
                    "mixed_calls": 0,
                    "sites": {},
                }
                if kind == "fwd-without-bwd" and self._watch_backward(defining, name):
                    record["device"] = _closure_value(forward, "device_type") or "cuda"
                    record["backward_runs"] = record["backward_runs_under_autocast"] = 0
        functions[cls] = record
        return record

    def _watch_backward(self, defining, name: str) -> bool:
        """Count the runs of a Function's own backward (the `backward` or `vjp` autograd calls,
        patched once on the class that defines it), and those with autocast on, into the record
        of the Function each run belongs to (a subclass inherits its parent's backward): what the
        finding is about is the state that backward ran in, not another backward's."""
        original = defining.__dict__.get(name) if defining is not None else None
        if not isinstance(original, staticmethod):
            return False
        if defining in self._watched:
            return True
        function, records = original.__func__, self.state.custom_functions

        @functools.wraps(function)
        def backward(ctx, *grads):
            record = records.get(getattr(ctx, "_forward_cls", None))
            if record is not None and "backward_runs" in record:
                record["backward_runs"] += 1
                record["backward_runs_under_autocast"] += _autocast_on(record["device"])
            return function(ctx, *grads)

        setattr(defining, name, staticmethod(backward))
        self._watched.add(defining)
        self.probes._undo.append(lambda: setattr(defining, name, original))
        return True

    def _install_function_apply(self) -> None:
        rules, state = self, self.state
        function_cls = torch.autograd.Function
        original = function_cls.__dict__["apply"]
        raw = original.__func__

        def apply(cls, *args, **kwargs):
            mirror = state.mirror
            if (mirror.active or mirror.regions) and not state.paused:
                record = state.custom_functions.get(cls, False)
                if record is False:
                    record = rules._function_record(cls)
                if record is not None:
                    rules._record_apply(record, args, kwargs)
            return raw(cls, *args, **kwargs)

        function_cls.apply = classmethod(functools.wraps(raw)(apply))
        self.probes._undo.append(lambda: setattr(function_cls, "apply", original))

    def _record_apply(self, record: dict, args, kwargs) -> None:
        mirror = self.state.mirror
        if not mirror.active:  # inside a region the script's flag left off, say, while another is on
            if record["off_region"] is None:
                record["off_region"] = mirror.off_region()
            return
        site = self.probes._callsite(1)
        sites = record["sites"]
        record["calls_under_autocast"] += 1
        if record["kind"] == "undecorated":
            dtypes = _float_dtypes(args) | _float_dtypes(kwargs.values())
            if mixes_low_precision_with_float32(dtypes):
                record["mixed_calls"] += 1
                sites[site] = sites.get(site, 0) + 1
                if "input_dtypes" not in record:
                    record["input_dtypes"] = sorted(_dtype_name(d) for d in dtypes)
                    record["autocast"] = self.state.mirror.active[-1]
                    record["first_step"] = self.state.step
        else:
            sites[site] = sites.get(site, 0) + 1
            record.setdefault("autocast", self.state.mirror.active[-1])

    # -- AMP015 -------------------------------------------------------------------------------
    def _thread_record(self, site, created, parent) -> dict:
        key = created or site
        record = self.state.threads.get(key)
        if record is None:
            record = self.state.threads[key] = {
                "site": key, "started_at": site, "workers": 0, "fp32_matmuls": 0, "ops": {},
                "parent_autocast": parent[-1], "workers_with_fp32_matmuls": 0,
            }
        record["workers"] += 1
        return record

    def _run_in_worker(self, record: dict, call):
        mirror = self.state.mirror  # the worker's own (thread-local) mirror
        before = record["fp32_matmuls"]
        mode = _WorkerMatmuls(self.probes, record)
        try:
            with mode:
                return call()
        finally:
            if record["fp32_matmuls"] > before:
                record["workers_with_fp32_matmuls"] += 1
            mirror.parent = None

    def _install_threads(self) -> None:
        rules, state, probes = self, self.state, self.probes
        from concurrent.futures import thread as futures_thread

        worker_target = getattr(futures_thread, "_worker", None)

        def wrap_init(real):
            @functools.wraps(real)
            def __init__(self_, *args, **kwargs):
                real(self_, *args, **kwargs)
                if state.mirror.active and not state.paused:
                    self_._amplint_created_at = probes.classifier.user_callsite(1)
                elif not state.paused:
                    probes._callsite()  # the line ran (see `start`)

            return __init__

        def wrap_start(real):
            @functools.wraps(real)
            def start(self_):
                active = state.mirror.active
                if active and not state.paused and getattr(self_, "_target", None) is not worker_target:
                    site = probes._callsite()
                    record = rules._thread_record(site, getattr(self_, "_amplint_created_at", None), active)
                    run = self_.run

                    def run_under_probe():
                        return rules._run_in_worker(record, run)

                    self_.run = run_under_probe
                elif not state.paused:
                    probes._callsite()  # the line ran: with autocast off, AMP015's finding is refuted, not unreached
                return real(self_)

            return start

        def wrap_submit(real):
            @functools.wraps(real)
            def submit(self_, fn, /, *args, **kwargs):
                active = state.mirror.active
                if active and not state.paused:
                    site = probes._callsite()
                    record = rules._thread_record(site, None, active)

                    def call_under_probe(*a, **k):
                        return rules._run_in_worker(record, lambda: fn(*a, **k))

                    return real(self_, call_under_probe, *args, **kwargs)
                if not state.paused:
                    probes._callsite()
                return real(self_, fn, *args, **kwargs)

            return submit

        probes._patch(threading.Thread, "__init__", wrap_init)
        probes._patch(threading.Thread, "start", wrap_start)
        probes._patch(ThreadPoolExecutor, "submit", wrap_submit)

    # -- AMP016 (BCE) ---------------------------------------------------------------------------
    def _install_bce(self) -> None:
        state, probes = self.state, self.probes
        functional = torch.nn.functional

        def wrap(real):
            @functools.wraps(real)
            def binary_cross_entropy(*args, **kwargs):
                try:
                    result = real(*args, **kwargs)
                    active = state.mirror.active
                    if active and not state.paused:  # ran under autocast without raising (CPU allows it)
                        state.bce_devices.setdefault(probes._callsite(), set()).add(active[-1][0])
                    return result
                except RuntimeError as exc:
                    if "unsafe to autocast" in str(exc) and not state.paused:
                        site = probes._callsite()
                        record = state.bce_errors.get(site)
                        if record is None:
                            active = state.mirror.active
                            record = state.bce_errors[site] = {
                                "site": site, "count": 0, "error": str(exc).splitlines()[0],
                                "autocast": active[-1] if active else None,
                            }
                        record["count"] += 1
                    raise

            return binary_cross_entropy

        probes._patch(functional, "binary_cross_entropy", wrap)

    # -- AMP017 -------------------------------------------------------------------------------
    def _install_compile(self) -> None:
        rules, state, probes = self, self.state, self.probes

        def wrap(real):
            @functools.wraps(real)
            def compile(model=None, *args, **kwargs):
                site = probes._callsite()
                # Under amplint's dispatch modes Dynamo skips every frame, which fullgraph=True
                # turns into an error the script never raises untraced: it runs eagerly instead.
                fullgraph_dropped = bool(kwargs.get("fullgraph")) and state.dispatch_modes_on and not state.paused
                if fullgraph_dropped:
                    kwargs["fullgraph"] = False
                result = real(model, *args, **kwargs)
                if state.paused:
                    return result
                backend = kwargs.get("backend", "inductor")
                if model is None and callable(result):  # @torch.compile(...) with options
                    decorator = result

                    @functools.wraps(decorator)
                    def decorate(fn):
                        return rules._watch_compiled(decorator(fn), site, backend, fullgraph_dropped)

                    return decorate
                return rules._watch_compiled(result, site, backend, fullgraph_dropped)

            return compile

        probes._patch(torch, "compile", wrap)

    def _watch_compiled(self, compiled, site, backend, fullgraph_dropped: bool):
        state = self.state
        record = {
            "site": site, "backend": backend if isinstance(backend, str) else None,
            "calls": 0, "calls_under_autocast": 0, "mismatched_backwards": 0, "backwards_with_setting": 0,
            "off_region": None,  # where a region left off around a call was entered
            "fullgraph_dropped": fullgraph_dropped,
        }
        state.compiled.append(record)

        def note_call():
            record["calls"] += 1
            if state.paused:
                return
            active = state.mirror.active
            if active:
                record["calls_under_autocast"] += 1
                state.compiled_pending = (record, active[-1])
            elif record["off_region"] is None:
                record["off_region"] = state.mirror.off_region()

        if isinstance(compiled, torch.nn.Module):
            compiled.register_forward_pre_hook(lambda module, inputs: note_call())
            return compiled
        if not callable(compiled):
            return compiled

        @functools.wraps(compiled)
        def call_compiled(*args, **kwargs):
            note_call()
            return compiled(*args, **kwargs)

        return call_compiled
