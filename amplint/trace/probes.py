"""API patches (feasibility L1): cheap, always on, each records the user's callsite.

- `torch.set_autocast_enabled/dtype` mirror, `autocast.__enter__` (where the region was opened)
- `torch.autograd.backward/grad` (AMP003), optimizer step hooks (AMP003, steps, phases)
- GradScaler `__init__/scale/unscale_/step/update` (AMP004, skipped steps, scale history)
- the clip functions (AMP005), LR schedulers (steps right after a skipped step)
- `nn.Module.half/bfloat16/to` and a forward pre-hook (AMP002)
- `warnings.warn` (AMP001 deprecations attributed to user lines; keeps torch's own warnings
  pointing at the user's line although our wrappers sit in between)

Everything is undone by `Probes.remove()`.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Iterator

import torch
import torch.nn.utils.clip_grad as clip_grad_module
import torch.optim.lr_scheduler as lr_scheduler_module
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from amplint.static.names import VALUE_INSPECTIONS
from amplint.trace.callsite import Callsite, CodeClassifier
from amplint.trace.nonfinite import NonFiniteMonitor, gradients_by_storage, storage_of, stored_values
from amplint.trace.recorder import LOW_PRECISION
from amplint.trace.state import ClipEvent, Conversion, Float16Region, LastUnscale, SchedulerStep, ScalerInfo, ScalerStep, TraceState, Update, WarningRecord

_AMP_WARNING = re.compile(
    r"torch\.(cuda|cpu)\.amp\.|get_autocast_(gpu|cpu|xla|ipu)_dtype|set_autocast_(gpu|cpu)_|"
    r"is_autocast_(cpu|xla|ipu)_enabled|autocast|GradScaler|lr_scheduler\.step\(\)` before `optimizer\.step\(\)",
)
_DEPRECATED_API = re.compile(r"`?(torch\.(?:cuda|cpu)\.amp\.[\w.]+)\(args\.\.\.\)`? is deprecated")
# How many user frames above a probe's line are kept: the caller of a helper, and of a helper's
# helper; bounded, so a deep (recursive) stack costs no more.
_CALLERS_KEPT = 8
# torch.compile's AOT autograd calls `torch.autograd.grad` on fake tensors to build the backward
# graph, from the user's line that called the compiled model: the compiler's backward, not the script's.
_compiling = getattr(torch.compiler, "is_compiling", lambda: False)
# A backward or grad call made while the autograd engine runs a node's backward (reentrant
# activation checkpointing recomputes its block and backpropagates through it; a custom
# Function's backward may take gradients): the engine's work inside the script's own backward.
_current_autograd_node = getattr(torch._C, "_current_autograd_node", lambda: None)


# A loss multiplied by at least this much before backward is scaled by hand (static loss scales
# run from 8 to 2^16): gradient-accumulation weights are fractions, and a loss weight of 2 or 5
# lifts no gradient out of float16's underflow.
_HAND_SCALE_MIN = 8.0


def hand_loss_scale(tensors, seed) -> float | None:
    """AMP009: the constant a loss was scaled by for its backward, without a GradScaler:
    `(loss * 1024).backward()` (the last op of its graph multiplies by a constant, which autograd
    saved) or `loss.backward(torch.tensor(1024.))` (the seed gradient). None for anything else."""
    roots = tensors if isinstance(tensors, (list, tuple)) else [tensors]
    seeds = seed if isinstance(seed, (list, tuple)) else [seed]
    if len(roots) != 1 or len(seeds) != 1:
        return None
    node = getattr(roots[0], "grad_fn", None)
    candidates = [seeds[0]]
    if node is not None and type(node).__name__.startswith("MulBackward"):
        candidates += [getattr(node, "_saved_other", None), getattr(node, "_saved_self", None)]
    for value in candidates:
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.requires_grad:
            try:  # past the recorder: a saved Python number is a wrapped-number tensor it would unwrap
                with torch._C._DisableTorchDispatch():
                    number = float(value)
            except Exception:  # noqa: BLE001 - a tensor subclass that cannot be read here scales nothing we know of
                continue
            if abs(number) >= _HAND_SCALE_MIN and math.isfinite(number):
                return number
    return None


def _inside_a_backward() -> bool:
    return _current_autograd_node() is not None


@contextlib.contextmanager
def _keeping_torch_error(event: dict | None):
    """torch's own error, kept in the event that predicted it (AMP007/AMP008), then raised as before."""
    try:
        yield
    except Exception as exc:
        if event is not None:
            event["torch_raised"] = f"{type(exc).__name__}: {exc}"
        raise


def _parameter_ids(optimizer) -> frozenset:
    """The parameters an optimizer (or a wrapper exposing `param_groups`) steps."""
    try:
        return frozenset(id(p) for group in optimizer.param_groups for p in group["params"])
    except (AttributeError, KeyError, TypeError):  # an object GradScaler cannot unscale either
        return frozenset()


def _dtype_name(dtype) -> str | None:
    return None if dtype is None else str(dtype).replace("torch.", "")


class Probes:
    def __init__(self, state: TraceState, classifier: CodeClassifier, monitor: NonFiniteMonitor):
        self.state = state
        self.classifier = classifier
        self.monitor = monitor
        self._undo: list = []
        self._forward_pre_hook = None
        self._scaler_objects: dict[int, weakref.ref] = {}
        self.callers: dict = {}  # probe callsite -> user lines on the call stack above it (confirm.Facts)
        self.direct_callers: dict = {}  # probe callsite -> the user lines right above it (a helper's call)
        self._backwards_seen = 0
        self._gradients_for: tuple | None = None
        self._gradients_seen: dict = {}
        state.scaled_gradient_reads = self.read_scaled_gradients

    # -- plumbing -------------------------------------------------------------------------
    def _patch(self, owner, name: str, make) -> None:
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        replacement = make(getattr(owner, name))
        if isinstance(original, (staticmethod, classmethod)):
            replacement = type(original)(replacement)
        setattr(owner, name, replacement)
        self._undo.append(lambda: setattr(owner, name, original))

    def _callsite(self, depth: int = 1):
        """The user's line that called the probed API; the user lines above it on the call stack
        are kept in `callers` (a helper's callers: a static finding may point at the helper's call)."""
        stack = self.classifier.user_callsites(depth + 1, limit=1 + _CALLERS_KEPT)
        if not stack:
            return None
        site = stack[0]
        self.state.lines_seen.add(site)
        if self.state.mirror.active:
            self.state.lines_under_autocast.add(site)
        if len(stack) > 1:
            self.callers.setdefault(site, set()).update(stack[1:])
            self.direct_callers.setdefault(site, set()).add(stack[1])
        return site

    def note_thread(self, site) -> None:
        """Remember a thread other than the script's that trains or autocasts: its ops escape
        the op recorder, a mode of the script's thread."""
        thread = threading.current_thread()
        if thread is not self.state.script_thread and thread.name not in self.state.other_threads:
            self.state.other_threads[thread.name] = site

    def watch_scaled_gradient_use(self, site) -> None:
        """AMP005 on a line that reads or changes `.grad` (no clip call to wrap): when an op runs
        there, record whether the gradients were still scaled (once per line and step)."""
        state = self.state
        hits = state.watched_hits[site]
        if hits and hits[-1]["step"] == state.step:
            return
        info = self.still_scaled(None)
        scale_slot = self.defer_scale(info)
        hits.append({"step": state.step, "still_scaled": info is not None, "scale_slot": scale_slot})

    def read_scaled_gradients(self, op, args, site) -> None:
        """An op reading a parameter's `.grad` while an enabled scaler's scale is still in it,
        outside backward and the optimizer: whatever it computes (a norm, a maximum, an inf check)
        sees the scaled values. Recorded once per line and step, with the line that called the
        function holding it (where `scaler.unscale_(optimizer)` belongs)."""
        state = self.state
        if state.in_scaler_step is not None or not any(scaler.enabled and scaler.scaled for scaler in state.scalers):
            return  # no scaled loss in flight (the common case), or the scaler's own step reading them
        reads = state.grad_reads.get(site)
        if reads and reads[-1]["step"] == state.step:
            return
        grads = self._gradients()
        inputs = [a for i, a in enumerate(args) if i not in op.mutated] if op.overwrites else args
        # A gradient needs no gradient itself: activations and parameters are passed over cheaply.
        read = {storage_of(t) for t in _tensors_in(inputs) if not t.requires_grad} & grads.keys()
        if not read:
            return
        info = self.still_scaled([grads[key] for key in read])
        if info is None:
            return
        # The first user line above this one (a comprehension or generator on the line runs in a frame of its own).
        caller = next((s for s in self.classifier.user_callsites(2, limit=4) if s != site), None)
        state.grad_reads[site].append({"step": state.step, "scale_slot": self.defer_scale(info), "called_from": caller})

    def _gradients(self) -> dict:
        """The optimizers' parameters by where their gradients live, read once after each backward
        (a backward may allocate them; later ones accumulate into the same storage)."""
        key = (self.state.step, self._backwards_seen)
        if self._gradients_for != key:
            self._gradients_for = key
            self._gradients_seen = gradients_by_storage(self.state.optimizers)
        return self._gradients_seen

    def defer_scale(self, info):
        """A deferred slot for the scale of the scaler whose gradients are still scaled (read after
        the run, so no device sync now), or None."""
        if info is None:
            return None
        ref = self._scaler_objects.get(info.index)
        scaler = ref() if ref else None
        if scaler is None or getattr(scaler, "_scale", None) is None:
            return None
        with self.state.pause():
            return self.state.deferred.add(scaler._scale)

    def install(self) -> None:
        self._install_autocast_mirror()
        self._install_backward()
        self._install_optimizer()
        self._install_scaler()
        self._install_clip()
        self._install_schedulers()
        self._install_conversions()
        self._install_warnings()
        self._install_inspections()
        from amplint.trace.amp_probes import RuleProbes

        RuleProbes(self).install()

    def _install_inspections(self) -> None:
        """AMP014: a finiteness check or a comparison (`torch.isfinite(h).all()` at the top of an
        fp32 block) reads its low-precision input without computing with it; the ops it is made of
        (`abs`, `ne`) are not the block's arithmetic."""
        state = self.state

        def wrap(real):
            @functools.wraps(real)
            def inspect(*args, **kwargs):
                state.inspecting += 1
                try:
                    return real(*args, **kwargs)
                finally:
                    state.inspecting -= 1

            return inspect

        for name in sorted(VALUE_INSPECTIONS):
            if hasattr(torch, name):
                self._patch(torch, name, wrap)
            if name in torch.Tensor.__dict__:
                self._patch(torch.Tensor, name, wrap)
            elif hasattr(torch.Tensor, name):  # the C base class's method: shadowed here, unshadowed after
                setattr(torch.Tensor, name, wrap(getattr(torch.Tensor, name)))
                self._undo.append(lambda name=name: delattr(torch.Tensor, name))

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()

    # -- autocast ----------------------------------------------------------------------------
    def _install_autocast_mirror(self) -> None:
        mirror = self.state.mirror
        for device in ("cpu", "cuda"):
            try:
                mirror.enabled[device] = torch.is_autocast_enabled(device)
            except RuntimeError:
                continue
        refresh = self._refresh_mirror
        refresh()

        def wrap_setter(real):
            @functools.wraps(real)
            def set_autocast_state(*args, **kwargs):
                result = real(*args, **kwargs)
                refresh_from(args, kwargs, real)
                return result

            return set_autocast_state

        def refresh_from(args, kwargs, real):
            name = real.__name__
            if name == "set_autocast_enabled":
                device, enabled = (args[0], args[1]) if len(args) >= 2 else ("cuda", (args or [kwargs.get("enabled")])[0])
                mirror.enabled[str(device)] = bool(enabled)
            refresh()

        self._patch(torch, "set_autocast_enabled", wrap_setter)
        self._patch(torch, "set_autocast_dtype", wrap_setter)

        probes = self

        def wrap_init(real):
            @functools.wraps(real)
            def __init__(self_, *args, **kwargs):
                try:
                    real(self_, *args, **kwargs)
                except RuntimeError as exc:
                    if "does not support bfloat16" in str(exc):  # AMP016, bf16 on an old GPU
                        probes.autocast_construction(probes._callsite(), "bfloat16-unsupported", "bfloat16", str(exc))
                    raise
                # where the object was made: a helper in another module, for runtime-only AMP003
                self_._amplint_created_at = site = probes._callsite()
                requested = kwargs.get("enabled", args[2] if len(args) > 2 else True)
                self_._amplint_requested = bool(requested)
                dtype = getattr(self_, "fast_dtype", None)
                if requested and not getattr(self_, "_enabled", True) and dtype not in LOW_PRECISION and not probes.state.paused:
                    # AMP016: the constructor warned "target dtype is not supported. Disabling autocast"
                    probes.autocast_construction(site, "dtype-disabled", _dtype_name(dtype), None, getattr(self_, "device", None))

            return __init__

        def wrap_enter(real):
            @functools.wraps(real)
            def __enter__(self_):
                site = probes._callsite()
                result = real(self_)
                enabled = getattr(self_, "_enabled", False)
                if enabled:
                    probes.state.autocast_entries[site] += 1
                    probes.note_thread(site)
                created = getattr(self_, "_amplint_created_at", None)
                mirror = probes.state.mirror
                mirror.entered.append((site, created) if enabled else None)
                device = getattr(self_, "device", None)
                dtype = _dtype_name(getattr(self_, "fast_dtype", None))
                if enabled:
                    probes.state.last_region = (device, dtype, site)
                fp16_entry = probes._enter_fp16_region(device, site, created) if enabled and dtype == "float16" else None
                requested = getattr(self_, "_amplint_requested", True)
                if not requested:
                    probes._note_misdirected_disable(device, site)
                mirror.regions.append((device, bool(enabled), dtype, site, fp16_entry))
                if mirror.suppressed or (not enabled and len(mirror.regions) > 1):
                    probes._refresh_suppressed()
                # A CUDA region a CPU-only machine disabled (not one the script switched off):
                # --simulate cuda shadows it anyway.
                wanted_cuda = not enabled and requested and getattr(self_, "device", None) == "cuda" and not torch.cuda.is_available()
                if not enabled:
                    (probes.state.autocast_without_device_entries if wanted_cuda else probes.state.autocast_off_entries)[site] += 1
                    probes.state.autocast_created_at.setdefault(site, created)
                    if requested and not wanted_cuda:  # asked for, refused: a dtype autocast does not support there
                        probes.state.autocast_refused_dtype.setdefault(site, (device, dtype))
                probes.state.mirror.requested.append(getattr(self_, "fast_dtype", None) if wanted_cuda else None)
                return result

            return __enter__

        def wrap_exit(real):
            @functools.wraps(real)
            def __exit__(self_, *exc):
                try:
                    return real(self_, *exc)
                finally:
                    if probes.state.mirror.entered:
                        probes.state.mirror.entered.pop()
                    mirror = probes.state.mirror
                    if mirror.requested:
                        mirror.requested.pop()
                    if mirror.regions:
                        fp16_entry = mirror.regions.pop()[4]
                        if fp16_entry is not None:
                            probes._exit_fp16_region(*fp16_entry)
                        if mirror.suppressed:
                            probes._refresh_suppressed()

            return __exit__

        autocast_cls = torch.amp.autocast_mode.autocast
        self._patch(autocast_cls, "__init__", wrap_init)
        self._patch(autocast_cls, "__enter__", wrap_enter)
        self._patch(autocast_cls, "__exit__", wrap_exit)

    def _enter_fp16_region(self, device, site, created) -> tuple[Float16Region, int]:
        """AMP009: a loss from this float16 region needs scaling. Returns what its exit reads."""
        key = (site, created)
        region = self.state.fp16_regions.get(key)
        if region is None:
            region = self.state.fp16_regions[key] = Float16Region(device, site, created)
        nodes_at_entry = torch.autograd._get_sequence_nr()
        region.open_since.append(nodes_at_entry)
        return region, nodes_at_entry

    @staticmethod
    def _exit_fp16_region(region: Float16Region, nodes_at_entry: int) -> None:
        region.open_since.remove(nodes_at_entry)
        nodes_at_exit = torch.autograd._get_sequence_nr()  # per thread: a region exits where it entered
        if nodes_at_exit > nodes_at_entry:
            region.node_ranges.append((nodes_at_entry, nodes_at_exit))

    def _refresh_mirror(self) -> None:
        mirror = self.state.mirror
        active = []
        for device, enabled in mirror.enabled.items():
            if enabled:
                try:
                    active.append((device, _dtype_name(torch.get_autocast_dtype(device))))
                except RuntimeError:
                    active.append((device, None))
        mirror.active = tuple(active)

    def _note_misdirected_disable(self, device, site) -> None:
        """A region switched off for one device inside an enabled region of another only
        (`autocast("cuda", enabled=False)` in a CPU autocast): it switches off nothing."""
        regions = self.state.mirror.regions
        if any(d == device and on for d, on, *_ in regions):
            return
        around = [(d, dtype) for d, on, dtype, *_ in regions if on]
        if around:
            self.state.misdirected_disables.setdefault(site, (device, *around[-1]))

    def _refresh_suppressed(self) -> None:
        """AMP014: devices whose innermost open region disables autocast inside an enabled one."""
        mirror = self.state.mirror
        innermost: dict = {}
        outer_enabled: dict = {}
        for device, enabled, dtype, site, _fp16 in mirror.regions:
            if enabled:
                outer_enabled[device] = (dtype, site)
            innermost[device] = (enabled, site)
        mirror.suppressed = tuple(
            (device, outer_enabled[device][0], outer_enabled[device][1], site)
            for device, (enabled, site) in innermost.items()
            if not enabled and device in outer_enabled
        )
        self.state.suppressing_regions.update(entry[3] for entry in mirror.suppressed)

    def autocast_construction(self, site, kind: str, dtype, message, device=None) -> None:
        record = self.state.autocast_constructions.get((site, kind))
        if record is None:
            record = self.state.autocast_constructions[(site, kind)] = {"kind": kind, "site": site, "dtype": dtype, "device": device, "count": 0}
            if message:
                record["error"] = message
        record["count"] += 1

    def count_call(self, table: dict, site, evidence: dict | None) -> None:
        """A backward or optimizer step at `site`, with autocast on or off (AMP003); off inside an
        autocast region entered disabled, that region is noted: the finding's case did not run."""
        table[site][0 if evidence else 1] += 1
        off_region = self.state.mirror.off_region() if evidence is None else None
        if off_region is not None:
            self.state.calls_in_off_region[site] += 1
            self.state.off_region_of.setdefault(site, off_region)

    def autocast_evidence(self) -> dict | None:
        mirror = self.state.mirror
        if not mirror.active:
            return None
        device, dtype = mirror.active[-1]
        opened = next((s for s in reversed(mirror.entered) if s is not None), (None, None))
        return {"device": device, "dtype": dtype, "entered_at": opened[0], "created_at": opened[1]}

    # -- backward ----------------------------------------------------------------------------
    def _install_backward(self) -> None:
        state, monitor, probes = self.state, self.monitor, self

        def wrap_backward(real):
            @functools.wraps(real)
            def backward(tensors, *args, **kwargs):
                if state.paused or not state.active or _compiling() or _inside_a_backward():
                    return real(tensors, *args, **kwargs)
                site = probes._callsite()
                probes.note_thread(site)
                evidence = probes.autocast_evidence()
                probes.count_call(state.backward_calls, site, evidence)
                if evidence and site not in state.backward_autocast:
                    state.backward_autocast[site] = dict(evidence, step=state.step)
                monitor.backward_begins(tensors, site)
                probes._backward_events(site, evidence, tensors, args[0] if args else kwargs.get("grad_tensors"))
                state.scaled_since_backward = False
                state.disabled_scaler_since_backward = None
                outer = state.backward_callsite
                state.backward_callsite = site
                try:
                    return real(tensors, *args, **kwargs)
                finally:
                    state.backward_callsite = outer
                    probes._backwards_seen += 1  # the gradients it wrote exist now

            return backward

        def wrap_grad(real):
            @functools.wraps(real)
            def grad(outputs, inputs, *args, **kwargs):
                # create_graph=True is a gradient penalty: forward work, allowed under autocast.
                create_graph = kwargs.get("create_graph", args[2] if len(args) > 2 else False)
                if create_graph and state.scaled_since_backward and not state.paused:
                    state.scaled_penalty_step = state.step
                if state.paused or create_graph or _compiling() or _inside_a_backward():
                    return real(outputs, inputs, *args, **kwargs)
                site = probes._callsite()
                evidence = probes.autocast_evidence()
                state.backward_calls[site][0 if evidence else 1] += 1
                if evidence and site not in state.backward_autocast:
                    state.backward_autocast[site] = dict(evidence, step=state.step, function="torch.autograd.grad")
                outer = state.backward_callsite
                state.backward_callsite = site
                try:
                    return real(outputs, inputs, *args, **kwargs)
                finally:
                    state.backward_callsite = outer

            return grad

        self._patch(torch.autograd, "backward", wrap_backward)
        self._patch(torch.autograd, "grad", wrap_grad)

    def _backward_events(self, site, evidence, tensors, seed) -> None:
        state = self.state
        # AMP009: the loss may come from any float16 region of this training step (an encoder and
        # a decoder in two regions), not only from the last one entered.
        regions = state.end_fp16_window()
        by_hand = None
        if regions and not state.scaled_since_backward:
            regions = self._loss_sources(site, tensors, regions)
            if regions:  # read only for a loss from a float16 region: once per such backward
                with state.pause():
                    by_hand = hand_loss_scale(tensors, seed)
        for region in regions:
            key = (region.entered_at, region.created_at)
            record = state.fp16_backwards.get(key)
            if record is None:
                record = state.fp16_backwards[key] = {"region": region, "unscaled": 0, "scaled": 0, "scaled_by_hand": 0}
            if state.scaled_since_backward:
                record["scaled"] += 1
                continue
            if by_hand is not None:
                record["scaled_by_hand"] += 1
                record.setdefault("hand_scale", by_hand)
                continue
            if not record["unscaled"]:
                record.update(first_step=state.step, backward_at=site)
                state.zero_grad_pending.append(record)
            if state.disabled_scaler_since_backward is not None:
                record.setdefault("disabled_scaler", state.disabled_scaler_since_backward)
            record["unscaled"] += 1
        pending = state.compiled_pending
        if pending is not None:
            state.compiled_pending = None
            if evidence is None:  # AMP017: compiled forward under autocast, eager backward outside it
                try:
                    import torch._functorch.config as functorch_config

                    setting = getattr(functorch_config, "backward_pass_autocast", None)
                except ImportError:
                    setting = None
                record, autocast = pending
                key = "mismatched_backwards" if setting in (None, "same_as_forward") else "backwards_with_setting"
                record[key] += 1
                record.setdefault("backward_at", site)
                record.setdefault("autocast", autocast)
                record["setting"] = setting if isinstance(setting, str) else repr(setting)

    def _loss_sources(self, site, tensors, regions: list[Float16Region]) -> list[Float16Region]:
        """AMP009: the regions whose autograd nodes the graph of `tensors` holds, those still open
        included (a loop body in one region). A region of the step whose output the loss does not
        use (an evaluation under no_grad, a metric, a block that holds only the backward call) is
        no source of the loss."""
        pattern = (site, tuple((region.entered_at, region.created_at, bool(region.open)) for region in regions))
        sources = self.state.fp16_loss_sources.get(pattern)
        if sources is None:
            now = torch.autograd._get_sequence_nr()
            ranges = [region.ranges_so_far(now) for region in regions]
            sources = self.state.fp16_loss_sources[pattern] = self._regions_in_graph(tensors, ranges)
        return [regions[i] for i in sources]

    @staticmethod
    def _regions_in_graph(tensors, ranges: list[list[tuple[int, int]]]) -> tuple[int, ...]:
        """Indices of the regions (by the node numbers each built) that built a node of the graph
        backward() starts from `tensors`."""
        roots = tensors if isinstance(tensors, (list, tuple)) else [tensors]
        stack = [t.grad_fn for t in roots if isinstance(t, torch.Tensor)]
        missing = set(range(len(ranges)))
        seen = set()
        while stack and missing:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            number = node._sequence_nr()
            missing -= {i for i in missing if any(first <= number < end for first, end in ranges[i])}
            stack.extend(child for child, _index in node.next_functions)
        return tuple(i for i in range(len(ranges)) if i not in missing)

    # -- optimizers ----------------------------------------------------------------------------
    def _install_optimizer(self) -> None:
        state, monitor, probes = self.state, self.monitor, self
        optimizers = state.optimizers

        def wrap_init(real):
            @functools.wraps(real)
            def __init__(self_, *args, **kwargs):
                real(self_, *args, **kwargs)
                optimizers.add(self_)

            return __init__

        self._patch(torch.optim.Optimizer, "__init__", wrap_init)

        def pre_hook(optimizer, args, kwargs):
            if state.paused:
                return None
            current = state.in_scaler_step
            if current is not None and current.takes(optimizer):
                state.last_step_of_optimizer[id(optimizer)] = current  # (the wrapped optimizer's, for its schedulers)
                current.optimizer_seconds = -time.perf_counter()
                current.applied = True
                found_inf = getattr(optimizer, "found_inf", None)  # fused optimizers skip inside
                if isinstance(found_inf, torch.Tensor):
                    with state.pause():
                        current.found_inf_slot = state.deferred.add(found_inf)
                    current.applied = None
            else:
                site = probes._callsite(2)
                evidence = probes.autocast_evidence()
                probes.count_call(state.step_calls, site, evidence)
                if evidence and site not in state.step_autocast:
                    state.step_autocast[site] = dict(evidence, step=state.step, function="optimizer.step()")
                state.direct_steps[site] += 1
                if probes.still_scaled([p for g in optimizer.param_groups for p in g["params"]]) is not None:
                    state.bypass_steps[site] += 1
                elif (unscaled_by := probes.unscaled_for(optimizer)) is not None:
                    # Unscaled, then stepped past the scaler: the inf check unscale_() made skips nothing.
                    state.bypass_steps[site] += 1
                    state.bypass_steps_after_unscale[site] += 1
                    unscaled_by.stepped_through.add(id(optimizer))  # stepped: not AMP008's unscale without a step
                monitor.check_gradients(optimizer, site, handled=False)
                floor = probes._gradient_floor(optimizer) if state.zero_grad_pending else None
                if floor is not None:
                    for record in state.zero_grad_pending:
                        record.update(floor)
                    state.zero_grad_pending.clear()
            state.in_optimizer += 1
            return _with_closure_outside_the_step(args, kwargs)

        def _with_closure_outside_the_step(args, kwargs):
            """`optimizer.step(closure)` (LBFGS, SAM): the closure's forward and backward are the
            script's training step, not the optimizer's update, and are recorded as such."""
            # The hook's `args` start with the optimizer itself.
            closure = args[1] if len(args) > 1 else kwargs.get("closure")
            if not callable(closure):
                return None

            def closure_as_script():
                inside, state.in_optimizer = state.in_optimizer, 0
                try:
                    return closure()
                finally:
                    state.in_optimizer = inside

            if len(args) > 1:
                return (args[0], closure_as_script, *args[2:]), kwargs
            return args, {**kwargs, "closure": closure_as_script}

        def post_hook(optimizer, args, kwargs):
            if state.paused:
                return
            state.in_optimizer = max(0, state.in_optimizer - 1)
            current = state.in_scaler_step
            taken = current is not None and current.takes(optimizer)
            if taken and current.optimizer_seconds < 0:
                current.optimizer_seconds += time.perf_counter()
            if not taken:
                record = ScalerStep(-1, id(optimizer), state.step, None, True)
                state.last_step_of_optimizer[id(optimizer)] = record
                state.step_completed()

        pre = register_optimizer_step_pre_hook(pre_hook)
        post = register_optimizer_step_post_hook(post_hook)
        self._undo.append(pre.remove)
        self._undo.append(post.remove)

        # Gradients a script drops without a step (a finite-gradient guard skipped it) are
        # checked before they go.
        def wrap_zero_grad(real, check_before):
            @functools.wraps(real)
            def zero_grad(self_, *args, **kwargs):
                if not state.paused:
                    check_before(self_)
                return real(self_, *args, **kwargs)

            return zero_grad

        self._patch(torch.optim.Optimizer, "zero_grad", lambda real: wrap_zero_grad(real, monitor.zero_grad))
        self._patch(torch.nn.Module, "zero_grad", lambda real: wrap_zero_grad(real, monitor.module_zero_grad))

    def _gradient_floor(self, optimizer) -> dict | None:
        """AMP009 evidence, at the optimizer step after a region's first unscaled backward: the
        share of gradient elements that are exactly zero (dead ReLU units and masks give zeros in
        any precision, so this is an upper bound on underflow), and the share of the others below
        float16's smallest normal number, where float16 keeps fewer bits and then flushes to zero:
        what loss scaling lifts. Of a sparse gradient, its stored values (the rows a batch did not
        touch are no underflow). None without gradients."""
        with self.state.pause(), torch.no_grad():
            grads = [stored_values(p.grad) for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            total = sum(g.numel() for g in grads)
            if not total:
                return None
            zeros = sum(int((g == 0).sum()) for g in grads)
            tiny = torch.finfo(torch.float16).tiny
            subnormal = sum(int(((g != 0) & (g.abs() < tiny)).sum()) for g in grads)
            nonzero = total - zeros
            return {
                "zero_grad_fraction": round(zeros / total, 4),
                "subnormal_grad_fraction": round(subnormal / nonzero, 4) if nonzero else 0.0,
            }

    def owners_of(self, params: list) -> list:
        ids = {id(p) for p in params}
        return [
            opt
            for opt in list(self.state.optimizers)
            if any(id(p) in ids for group in opt.param_groups for p in group["params"])
        ]

    # -- GradScaler ------------------------------------------------------------------------------
    def scaler_info(self, scaler) -> ScalerInfo:
        index = self.state.scaler_by_id.get(id(scaler))
        if index is None or self.state.scalers[index].device is None:
            index = self._register_scaler(scaler, None, None)
        return self.state.scalers[index]

    def _register_scaler(self, scaler, site, called_from, requested_enabled: bool = True) -> int:
        state = self.state
        enabled = bool(getattr(scaler, "_enabled", False))
        init_scale = getattr(scaler, "_init_scale", None) if enabled else None
        previous = next((s for s in reversed(state.scalers) if s.callsite == site), None) if site is not None else None
        side_by_side = previous is not None and previous.built_at_step == state.step
        info = ScalerInfo(
            index=len(state.scalers),
            callsite=site,
            called_from=called_from,
            enabled=enabled,
            device=str(getattr(scaler, "_device", "cuda")),
            init_scale=float(init_scale) if init_scale is not None else None,
            disabled_on_request=not requested_enabled,
            sibling=previous.sibling + 1 if side_by_side else 0,
            built_at_step=state.step,
        )
        state.scalers.append(info)
        state.scaler_by_id[id(scaler)] = info.index
        try:  # to read the scale at clip time; never keeps a scaler alive
            self._scaler_objects[info.index] = weakref.ref(scaler)
        except TypeError:
            pass
        return info.index

    def _install_scaler(self) -> None:
        state, monitor, probes = self.state, self.monitor, self
        scaler_cls = torch.amp.grad_scaler.GradScaler

        def wrap_init(real):
            @functools.wraps(real)
            def __init__(self_, *args, **kwargs):
                # subclasses (torch.cuda.amp.GradScaler) call this through super(): count once
                outer = getattr(self_, "_amplint_constructing", False)
                if not outer:
                    sites = probes.classifier.construction_sites(self_, 1, limit=2)
                    self_._amplint_constructing = True
                try:
                    real(self_, *args, **kwargs)
                finally:
                    if not outer:
                        del self_._amplint_constructing
                if not outer:
                    site = sites[0] if sites else None
                    if site is not None:
                        state.lines_seen.add(site)
                    # GradScaler(device, init_scale, growth_factor, backoff_factor, growth_interval, enabled)
                    requested = kwargs.get("enabled", args[5] if len(args) > 5 else True)
                    probes._register_scaler(self_, site, sites[1] if len(sites) > 1 else None, bool(requested))

            return __init__

        clock = time.perf_counter

        def wrap_scale(real):
            @functools.wraps(real)
            def scale(self_, outputs):
                started = clock()
                info = probes.scaler_info(self_)
                info.scaled_since_update = True
                if info.enabled:
                    info.scaled = True
                    state.scaled_since_backward = True
                elif state.disabled_scaler_since_backward is None:
                    state.disabled_scaler_since_backward = info
                if not state.paused:
                    info.scale_calls += 1
                    region = state.last_region
                    key = region[1] if region is not None else None
                    info.scale_dtypes[key] = info.scale_dtypes.get(key, 0) + 1
                with state.pause():
                    result = real(self_, outputs)
                if info.enabled and not state.paused and isinstance(outputs, torch.Tensor) and isinstance(result, torch.Tensor):
                    state.last_scaled = (weakref.ref(result), weakref.ref(outputs), weakref.ref(self_))
                info.seconds += clock() - started
                return result

            return scale

        def wrap_unscale(real):
            @functools.wraps(real)
            def unscale_(self_, optimizer):
                if state.in_scaler_step is not None or state.paused:  # step() unscales internally
                    with state.pause():
                        result = real(self_, optimizer)
                    probes.scaler_info(self_).unscaled.add(id(optimizer))
                    return result
                started = clock()
                info = probes.scaler_info(self_)
                site = probes._callsite()
                key = id(optimizer)
                event = None
                if info.stage.get(key) == "UNSCALED":  # AMP008: torch raises below (enabled scalers)
                    previous = info.last_unscale.get(key, LastUnscale(site, info.scale_calls, state.step))
                    event = {
                        "kind": "unscale-twice",
                        "site": previous.site or site,
                        "again_at": site,
                        "scaler": info.index,
                        "step": state.step,
                        "scale_calls_between": info.scale_calls - previous.scale_calls,
                        "enabled": info.enabled,
                    }
                    state.unscales.append(event)
                else:
                    probes._note_unscaled_through_another(info, optimizer, site)
                try:
                    with _keeping_torch_error(event), state.pause():
                        result = real(self_, optimizer)
                finally:
                    info.seconds += clock() - started
                info.unscaled.add(key)
                if info.stage.get(key) != "STEPPED":
                    info.stage[key] = "UNSCALED"
                info.last_unscale[key] = LastUnscale(site, info.scale_calls, state.step)
                info.unscaled_params[key] = _parameter_ids(optimizer)
                return result

            return unscale_

        def wrap_step(real):
            @functools.wraps(real)
            def step(self_, optimizer, *args, **kwargs):
                if state.in_scaler_step is not None:  # a subclass calling super().step()
                    return real(self_, optimizer, *args, **kwargs)
                started = clock()
                info = probes.scaler_info(self_)
                site = probes._callsite()
                evidence = probes.autocast_evidence()
                probes.count_call(state.step_calls, site, evidence)
                if evidence and site not in state.step_autocast:
                    state.step_autocast[site] = dict(evidence, step=state.step, function="scaler.step()")
                event = None
                if info.stage.get(id(optimizer)) == "STEPPED":  # AMP007: torch raises below (enabled)
                    pending = [s for opt, s in info.window]
                    event = {
                        "kind": "missing-update",
                        "sites": pending,
                        "site": pending[-1] if pending else site,
                        "again_at": site,
                        "scaler": info.index,
                        "step": state.step,
                        "enabled": info.enabled,
                    }
                    state.pairing.append(event)
                if id(optimizer) not in info.stage:  # step() will unscale it: was that done through another object?
                    other = probes._note_unscaled_through_another(info, optimizer, site)
                    if other is not None:  # its parameters are stepped now: not an unscale_ without a step
                        info.stepped_through.add(other)
                monitor.check_gradients(optimizer, site, handled=info.enabled and info.scaled)
                wrapped = frozenset() if isinstance(optimizer, torch.optim.Optimizer) else _parameter_ids(optimizer)
                record = ScalerStep(
                    info.index, id(optimizer), state.step, site, applied=False, wrapped_params=wrapped,
                    optimizer_serial=state.optimizer_serial(optimizer),
                )
                state.in_scaler_step = record
                try:
                    with _keeping_torch_error(event):
                        result = real(self_, optimizer, *args, **kwargs)
                except BaseException:
                    # A step that raised (float16 gradients to unscale) was attempted all the same;
                    # raising before the optimizer ran, it neither applied nor skipped: applied is
                    # None with no found_inf to read. torch's stage is unchanged: no STEPPED.
                    if record.applied is False:
                        record.applied = None
                    raise
                else:
                    info.stage[id(optimizer)] = "STEPPED"
                    if not info.window:
                        info.window_rescaled = info.scaled_since_update
                    info.window.append((id(optimizer), site))
                finally:
                    state.in_scaler_step = None
                    info.seconds += clock() - started - max(0.0, record.optimizer_seconds)
                    info.steps += 1
                    state.scaler_steps.append(record)
                    state.last_step_of_optimizer[id(optimizer)] = record
                    state.step_completed()
                return result

            return step

        def wrap_update(real):
            @functools.wraps(real)
            def update(self_, new_scale=None):
                started = clock()
                info = probes.scaler_info(self_)
                site = probes._callsite() if not state.paused else None
                event = None
                if site is not None:
                    if not info.window and "UNSCALED" not in info.stage.values():
                        # AMP007: no step since the last update (torch: "No inf checks were recorded")
                        event = {"kind": "update-without-step", "site": site, "scaler": info.index, "step": state.step, "enabled": info.enabled}
                        state.pairing.append(event)
                    for key, stage in info.stage.items():
                        if stage == "UNSCALED" and key not in info.stepped_through:  # AMP008: unscale_ on an iteration with no step
                            # The step is the unscale's: steps of other optimizers since then counted more.
                            unscaled = info.last_unscale.get(key, LastUnscale(site, 0, state.step))
                            state.unscales.append(
                                {"kind": "unscale-without-step", "site": unscaled.site, "update_at": site, "scaler": info.index, "step": unscaled.step, "enabled": info.enabled}
                            )
                    info.windows.append((site, tuple(opt for opt, _ in info.window), info.window_rescaled))
                try:
                    with _keeping_torch_error(event), state.pause():
                        result = real(self_, new_scale)
                        if info.enabled and getattr(self_, "_scale", None) is not None:
                            slot = state.deferred.add(self_._scale)
                            state.updates.append(Update(info.index, state.step, slot))
                finally:
                    info.seconds += clock() - started
                info.updates += 1
                info.scaled = info.scaled_since_update = False
                info.unscaled.clear()
                info.stage.clear()
                info.window.clear()
                info.unscaled_params.clear()
                info.stepped_through.clear()
                return result

            return update

        self._patch(scaler_cls, "__init__", wrap_init)
        self._patch(scaler_cls, "scale", wrap_scale)
        self._patch(scaler_cls, "unscale_", wrap_unscale)
        self._patch(scaler_cls, "step", wrap_step)
        self._patch(scaler_cls, "update", wrap_update)

    def _note_unscaled_through_another(self, info: ScalerInfo, optimizer, site: Callsite) -> int | None:
        """AMP008: `optimizer` is about to be unscaled (by `unscale_` or inside `step`) while another
        object holding the same parameters was unscaled since update(): an optimizer wrapper and
        the optimizer it holds. The scaler tracks each object apart and divides the same gradients
        by the scale again. Returns that other object's key."""
        mine = _parameter_ids(optimizer)
        other = next((key for key, params in info.unscaled_params.items() if key != id(optimizer) and mine & params), None)
        if other is None:
            return None
        self.state.unscales.append({
            "kind": "unscale-through-another-object",
            "site": info.last_unscale[other].site,
            "again_at": site,
            "scaler": info.index,
            "step": self.state.step,
            "enabled": info.enabled,
        })
        return other

    def unscaled_for(self, optimizer) -> ScalerInfo | None:
        """An enabled scaler that unscaled this optimizer's gradients since its last update()."""
        return next((info for info in reversed(self.state.scalers) if info.enabled and info.stage.get(id(optimizer)) == "UNSCALED"), None)

    def still_scaled(self, params: list | None) -> ScalerInfo | None:
        """An enabled scaler whose scaled gradients (for these params' optimizers) are not unscaled."""
        owners = self.owners_of(params) if params else []
        for info in reversed(self.state.scalers):
            if not (info.enabled and info.scaled):
                continue
            if owners:
                # (an optimizer is unscaled too when a wrapper holding its parameters was)
                through_wrappers = frozenset().union(*info.unscaled_params.values())
                if any(id(opt) not in info.unscaled for opt in owners) and not all(id(p) in through_wrappers for p in params):
                    return info
            elif not info.unscaled:
                return info
        return None

    # -- clipping -------------------------------------------------------------------------------
    def _install_clip(self) -> None:
        state, probes = self.state, self

        depth = [0]  # clip_grad_norm_ calls _clip_grads_with_norm_: count the outer call only

        def wrap_clip(real, name):
            @functools.wraps(real)
            def clip(parameters, *args, **kwargs):
                if state.paused or depth[0]:
                    return real(parameters, *args, **kwargs)
                params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
                site = probes._callsite()
                info = probes.still_scaled(params)
                scale_slot = probes.defer_scale(info)
                depth[0] += 1
                state.clipping = True  # its reads of the gradients are this clip's, reported as one
                try:
                    result = real(params, *args, **kwargs)
                finally:
                    depth[0] -= 1
                    state.clipping = False
                norm_slot = None
                if isinstance(result, torch.Tensor) and result.numel() == 1:
                    with state.pause():
                        norm_slot = state.deferred.add(result)
                state.clips.append(
                    ClipEvent(site, name, state.step, info is not None, info.index if info else None, scale_slot, norm_slot)
                )
                return result

            return clip

        names = ("clip_grad_norm_", "clip_grad_norm", "clip_grad_value_", "_clip_grads_with_norm_")
        wrapped: dict = {}
        for name in names:
            real = getattr(clip_grad_module, name, None)
            if real is None:
                continue
            public = name.lstrip("_")
            wrapped[real] = wrap_clip(real, public)
            self._patch(clip_grad_module, name, lambda _r, w=wrapped[real]: w)
        for name in ("clip_grad_norm_", "clip_grad_norm", "clip_grad_value_", "clip_grads_with_norm_"):
            current = getattr(torch.nn.utils, name, None)
            if current in wrapped:
                self._patch(torch.nn.utils, name, lambda _r, w=wrapped[current]: w)

    # -- schedulers -----------------------------------------------------------------------------
    def _install_schedulers(self) -> None:
        state, probes = self.state, self
        # Steps inside another step (SequentialLR/ChainedScheduler step their children) or inside a
        # constructor (LRScheduler.__init__ takes one; ReduceLROnPlateau's takes none) are not the
        # script's.
        depth = [0]

        def nested(real):
            @functools.wraps(real)
            def call(self_, *args, **kwargs):
                depth[0] += 1
                try:
                    return real(self_, *args, **kwargs)
                finally:
                    depth[0] -= 1

            return call

        def wrap_step(real):
            inner = nested(real)

            @functools.wraps(real)
            def step(self_, *args, **kwargs):
                optimizer = getattr(self_, "optimizer", None)
                if not depth[0] and not state.paused and optimizer is not None:
                    site = probes._callsite()
                    last = state.last_step_of_optimizer.get(id(optimizer))
                    state.scheduler_steps.append(SchedulerStep(site, id(optimizer), state.step, last))
                return inner(self_, *args, **kwargs)

            return step

        for cls in vars(lr_scheduler_module).values():
            if isinstance(cls, type) and cls.__module__ == lr_scheduler_module.__name__:
                if "__init__" in cls.__dict__:
                    self._patch(cls, "__init__", nested)
                if "step" in cls.__dict__:
                    self._patch(cls, "step", wrap_step)

    # -- module conversions (AMP002) -------------------------------------------------------------
    def _install_conversions(self) -> None:
        state, probes = self.state, self
        module_cls = torch.nn.Module

        def remember(module, dtype):
            if dtype not in LOW_PRECISION:
                return
            site = probes._callsite(2)
            state.conversions.append(Conversion(site, type(module).__name__, _dtype_name(dtype)))
            state.conversion_by_module[id(module)] = len(state.conversions) - 1
            probes._ensure_forward_pre_hook()

        def wrap_half(real, dtype):
            @functools.wraps(real)
            def convert(self_, *args, **kwargs):
                result = real(self_, *args, **kwargs)
                if not state.paused:
                    remember(self_, dtype)
                return result

            return convert

        def wrap_to(real):
            @functools.wraps(real)
            def to(self_, *args, **kwargs):
                result = real(self_, *args, **kwargs)
                if not state.paused:
                    try:
                        dtype = torch._C._nn._parse_to(*args, **kwargs)[1]
                    except (TypeError, RuntimeError):
                        dtype = None
                    remember(self_, dtype)
                return result

            return to

        self._patch(module_cls, "half", lambda real: wrap_half(real, torch.float16))
        self._patch(module_cls, "bfloat16", lambda real: wrap_half(real, torch.bfloat16))
        self._patch(module_cls, "to", wrap_to)

    def _ensure_forward_pre_hook(self) -> None:
        if self._forward_pre_hook is not None:
            return
        state = self.state

        def pre_hook(module, inputs):
            index = state.conversion_by_module.get(id(module))
            mirror = state.mirror
            if index is None or state.paused or not (mirror.active or mirror.regions):
                return None
            record = state.conversions[index]
            low = next((p.dtype for p in module.parameters() if p.dtype in LOW_PRECISION), None)
            if low is None:
                return None
            if not mirror.active:
                off_region = mirror.off_region()
                if off_region is not None:
                    record.forwards_in_off_region += 1
                    record.off_region = record.off_region or off_region
                return None
            if not torch.is_grad_enabled() or not any(p.requires_grad for p in module.parameters() if p.dtype in LOW_PRECISION):
                record.forwards_frozen += 1
                return None
            record.forwards_under_autocast += 1
            if record.autocast is None:
                record.autocast = mirror.active[-1]
                record.param_dtype = _dtype_name(low)
            return None

        handle = torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
        self._forward_pre_hook = handle
        self._undo.append(handle.remove)

    def install_module_nan_hook(self) -> None:
        """Every module call is checked as the caller receives it: `Module._call_impl` is wrapped
        (on the class, so no module's own hooks or pickled state change), and what it returns has
        passed the module's own forward hooks, which may replace the output (a hook that patches
        or corrupts it is the module's doing; a global hook would run before them). The modules
        being called are kept on a stack, so a find names the instance (`layers.2.fc`)."""
        monitor = self.monitor
        module_class = torch.nn.Module
        real = module_class.__dict__["_call_impl"]

        @functools.wraps(real)
        def _call_impl(module, *args, **kwargs):
            if _compiling() or torch.jit.is_tracing():  # reads of values would break the graph or trace
                return real(module, *args, **kwargs)
            monitor.module_called(module)
            try:
                output = real(module, *args, **kwargs)
                monitor.module_hook(module, (args, kwargs), output)
                return output
            finally:
                monitor.module_returned(module)

        module_class._call_impl = _call_impl
        self._undo.append(lambda: setattr(module_class, "_call_impl", real))

    # -- warnings (AMP001) -----------------------------------------------------------------------
    def _install_warnings(self) -> None:
        state, classifier = self.state, self.classifier
        real_warn = warnings.warn
        amplint_prefix = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

        def warn(message, category=None, stacklevel=1, source=None, **kwargs):
            # Skip our own wrapper frames so the warning points where it would without amplint.
            try:
                frame = sys._getframe(stacklevel)
                while frame is not None and frame.f_code.co_filename.startswith(amplint_prefix):
                    frame = frame.f_back
                    stacklevel += 1
            except ValueError:
                frame = None
            try:
                text = str(message.args[0]) if isinstance(message, Warning) and message.args else str(message)
                cat = type(message) if isinstance(message, Warning) else (category or UserWarning)
                if frame is not None and state.paused == 0 and _AMP_WARNING.search(text):
                    site = _first_user_frame(frame, classifier)
                    if site is not None:
                        key = (site, cat.__name__, text)
                        record = state.warnings.get(key)
                        if record is None:
                            record = state.warnings[key] = WarningRecord(site, cat.__name__, text)
                        record.count += 1
            except Exception:  # noqa: BLE001 - recording must never change the script's behaviour
                pass
            return real_warn(message, category, stacklevel + 1, source, **kwargs)

        warnings.warn = warn
        self._undo.append(lambda: setattr(warnings, "warn", real_warn))


def _first_user_frame(frame, classifier: CodeClassifier):
    while frame is not None:
        if not classifier.is_library_file(frame.f_code.co_filename):
            return (frame.f_code.co_filename, frame.f_lineno)
        frame = frame.f_back
    return None


def deprecated_api_of(message: str) -> str | None:
    match = _DEPRECATED_API.search(message)
    return match.group(1) if match else None


def _tensors_in(args) -> Iterator[torch.Tensor]:
    """The tensors among an op's arguments, and in its lists of them (`torch.stack`, `_foreach_norm`)."""
    for arg in args:
        if isinstance(arg, torch.Tensor):
            yield arg
        elif isinstance(arg, (list, tuple)):
            yield from (item for item in arg if isinstance(item, torch.Tensor))
