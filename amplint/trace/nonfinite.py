"""Where the first inf/NaN came from (feasibility §7).

- cheap  (default): the loss at each `backward()` and the gradients at each optimizer step. On CPU
          the flags are read at once; on other devices they are queued as device tensors and read
          after the run, so no sync is added. Gradients no step took are checked too, before they
          are lost or mixed: at `zero_grad()` (a finite-gradient guard skipped the step), and once
          at the next `backward()` that adds to them (a guard that never clears them). Gradient
          accumulation then costs one check more per step, a plain loop none. A run in which
          they saw nothing gets a note of what they checked: nothing, when no loss reached
          `backward()` (inference), and never the forward pass.
- module: plus a global forward hook on every module: the first module whose output is
          non-finite while its inputs are finite.
- op:     plus a check of every op's floating outputs in the dispatch recorder; the first op
          with a non-finite output and finite inputs, or with a NaN output and no NaN input (a
          softmax over a fully masked row). Infinities the forward pass is handed on purpose
          (`torch.full(..., float("-inf"))`, `masked_fill(mask, -inf)`: attention masks) are
          not a find; one written into a gradient is. An in-place op's inputs include what it
          overwrote (the gradients `clip_grad_norm_` scales): what the check last saw written there.

A non-finite value outside the forward pass (backward, gradients at the optimizer step, a
gradient handled by hand such as a clip) in a step whose `scaler.step` found it and skipped is
what the scaler exists for: it is recorded as "handled by GradScaler" and the search goes on for
an unhandled one. Whether the scaler skips is known only once it has stepped, so such a find waits
for that step; one that no `scaler.step` skipped (an `optimizer.step()` outside the scaler took the
gradients) is unhandled. A non-finite forward pass is never handled: the loss is non-finite before
any scale applies, whatever the scaler then does; unless the loss holds a gradient penalty taken
from a scaled loss (`autograd.grad(scaler.scale(loss), create_graph=True)`), which overflows with
the scale. Handled overflows are counted by the skipped
`scaler.step`, once whichever checks saw them, as the scaler block counts skipped steps.
"""

from __future__ import annotations

import math
import threading
import weakref
from bisect import bisect_left
from dataclasses import dataclass
from itertools import count
from operator import attrgetter

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from torch.multiprocessing.reductions import StorageWeakRef

from amplint.trace.report import SCALED_LOSS, cheap_coverage_note
from amplint.trace.state import NonFinite, TraceState

_FLOATING = {torch.float16, torch.bfloat16, torch.float32, torch.float64}
# Uninitialised memory holds anything; these never count (feasibility §7).
UNINITIALISED_OPS = ("empty", "new_empty", "empty_like", "empty_strided", "new_empty_strided", "resize_", "set_")
# Entries for storages that have since been freed are dropped when the table reaches this size,
# then twice its live size: it stays as small as the non-finite tensors alive at once.
_PRUNE_WRITTEN_FROM = 1024


_COMPRESSED_SPARSE = {torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc}


def stored_values(tensor: torch.Tensor) -> torch.Tensor:
    """The values a check reads: a dense tensor itself; a sparse tensor's stored values (dense
    kernels such as `isfinite` do not take sparse layouts, and the elements it leaves out are
    zeros). A COO tensor is coalesced first, as GradScaler and the sparse optimizers coalesce it:
    float16 values at a repeated index can overflow only once summed."""
    if tensor.layout is torch.sparse_coo:
        return tensor.detach().coalesce().values()
    if tensor.layout in _COMPRESSED_SPARSE:
        return tensor.detach().values()
    return tensor


# A tensor inside a torch.func transform (vmap's batched tensors, grad's): reading its values in
# Python (`.item()`, `bool()`) is an error there, so the checks leave it to the transform's result.
_FUNCTORCH_WRAPPED = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", lambda tensor: False)


def floating_tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        if value.dtype not in _FLOATING or _FUNCTORCH_WRAPPED(value):
            return []
        values = stored_values(value)
        return [values] if values.numel() else []
    if isinstance(value, (list, tuple)):
        found = []
        for item in value:
            found.extend(floating_tensors(item))
        return found
    if isinstance(value, dict):
        return floating_tensors(list(value.values()))
    return []


def _checkable(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors holding values: a wrapper subclass (FSDP2's DTensor) by the tensors it wraps,
    its local shard, whose ops need no sharding rule (a DTensor's `.item()` of a partial sum has
    none); meta and fake tensors hold none."""
    plain = []
    for t in tensors:
        if is_traceable_wrapper_subclass(t):
            names, _ = t.__tensor_flatten__()
            plain += _checkable([inner for name in names if isinstance(inner := getattr(t, name), torch.Tensor)])
        elif not t.is_meta and getattr(t, "fake_mode", None) is None:
            plain.append(t.detach())
    return plain


def all_finite_now(tensors: list[torch.Tensor]) -> bool:
    """Exact check, syncing. The float32 sum is a one-op pre-check; it can only overflow on huge
    finite values, so a non-finite sum is confirmed element-wise."""
    for t in _checkable(tensors):
        total = t.sum(dtype=torch.float64 if t.dtype == torch.float64 else torch.float32)
        if not math.isfinite(total.item()) and not bool(torch.isfinite(t).all()):
            return False
    return True


def any_nan_now(tensors: list[torch.Tensor]) -> bool:
    """Exact check, syncing; only asked about values already known to be non-finite."""
    return any(bool(torch.isnan(t).any()) for t in _checkable(tensors))


def finite_flag(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """A 0-d float tensor on the tensors' device: 1.0 when all are finite (no sync)."""
    tensors = _checkable(tensors)
    if not tensors:
        return None
    flags = [torch.isfinite(t).all() for t in tensors]
    return torch.stack(flags).all().float() if len(flags) > 1 else flags[0].float()


# A find waiting for the scaler whose outcome is not known yet (see `_scaler_outcome`).
_UNDECIDED = object()


@dataclass
class _GradientWindow:
    """One optimizer's gradients since its last `zero_grad()`, as the cheap checks see them."""

    checked_through: int  # the `backward()` calls whose gradients a check has seen (a count)
    first_backward_step: int | None = None  # the step at which the first `backward()` since its last step began
    # An optimizer step took them: what later backward() calls add (a GAN generator's backward
    # writing the discriminator's gradients) is a by-product the next zero_grad() drops, never used.
    stepped: bool = False
    checked_at_backward: bool = False  # a later `backward()` already checked them once


# Where a cheap check found non-finite gradients (the find's `detail`).
_AT_STEP = "a parameter gradient is non-finite at the optimizer step"
_DROPPED_AT_ZERO_GRAD = (
    "a parameter gradient is non-finite where zero_grad() cleared it, and no optimizer step had taken it "
    "(a step the script skipped, as a finite-gradient guard does)"
)
_LEFT_BY_EARLIER_BACKWARD = (
    "a parameter gradient an earlier backward() left, and no optimizer step took, is non-finite where a later backward() adds to it"
)


class _ModuleCalls(threading.local):
    """The modules being called in this thread, outermost first (each thread starts empty)."""

    def __init__(self) -> None:
        self.stack: list = []


class NonFiniteMonitor:
    def __init__(self, state: TraceState, mode: str, from_step: int):
        self.state = state
        self.mode = mode
        self.from_step = from_step
        self._seq = count()
        self._backwards = 0  # `backward()` calls begun
        self._windows: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> _GradientWindow
        # What the cheap checks looked at, for the report when they saw nothing
        self._losses_checked = 0
        self._gradient_checks = 0
        self._found_unhandled = False
        self._found_handled = False
        # step -> its first find waiting for the scaler (the op check and the gradient check see
        # the same overflow: one step, one outcome)
        self._awaiting_scaler: dict[int, NonFinite] = {}
        self._settled_at: tuple[int, int] | None = None  # (steps, updates) when last settled
        # By identity: a WeakSet compares live tensors with `==`, and `nan == nan` is false, so a
        # NaN literal was never found in it.
        self._constants: dict[int, weakref.ref] = {}
        self._calling = _ModuleCalls()
        # storage -> (a weak reference to it, holds a NaN): the non-finite values the op check saw
        # written. An in-place op has overwritten its inputs by the time it is checked; what they
        # held before is what was last written there. By storage, not tensor: autograd stores a
        # gradient as a detached alias of the tensor the backward op returned.
        self._nonfinite_written: dict[int, tuple[StorageWeakRef, bool]] = {}
        self._prune_written_at = _PRUNE_WRITTEN_FROM

    # -- shared -------------------------------------------------------------------------
    @property
    def searching(self) -> bool:
        """The `module` and `op` checks run from `--nan-from-step` on, until a first unhandled find."""
        return not self.found_unhandled() and self.state.step >= self.from_step

    def found_unhandled(self) -> bool:
        if self._awaiting_scaler and not self._found_unhandled:
            self._settle()
        return self._found_unhandled

    def scaler_in_flight(self) -> bool:
        """An enabled scaler has scaled a loss whose update has not happened yet."""
        return any(s.enabled and s.scaled for s in self.state.scalers)

    def record(self, item: NonFinite) -> None:
        item.seq = next(self._seq)
        self._admit(item)

    def _admit(self, item: NonFinite) -> None:
        if item.op == SCALED_LOSS:
            self.state.scale_overflow_steps.add(item.step)
        if not item.awaits_scaler:
            self._conclude(item, skipped_at=None)
            return
        earlier = self._awaiting_scaler.get(item.step)
        if earlier is None or item.seq < earlier.seq:
            self._awaiting_scaler[item.step] = item

    def _conclude(self, item: NonFinite, *, skipped_at: int | None) -> None:
        """`skipped_at`: the step index of the `scaler.step` that skipped for this find, or None.
        Overflows are counted by that skipped step, so one the op check and the gradient check
        both saw (at the backward op, then at the step) counts once, in every mode, as the
        scaler block counts its skipped steps."""
        item.handled_by_scaler = skipped_at is not None
        if item.handled_by_scaler:
            self.state.handled_overflow_steps.add(skipped_at)
            if self._found_handled:
                return
            self._found_handled = True
        else:
            self._found_unhandled = True
        self.state.nonfinite_candidates.append(item)

    def _settle(self, values: list | None = None, *, final: bool = False) -> None:
        """Conclude the finds whose scaler has stepped (all of them after the run). Outcomes change
        only when a step or an update happens: the recorder asks at every op."""
        progress = (self.state.step, len(self.state.updates))
        if progress == self._settled_at and not final:
            return
        self._settled_at = progress
        for step, item in list(self._awaiting_scaler.items()):
            outcome = self._scaler_outcome(step, values, final=final)
            if outcome is not _UNDECIDED:
                del self._awaiting_scaler[step]
                self._conclude(item, skipped_at=outcome)

    def _scaler_outcome(self, step: int, values: list | None, *, final: bool):
        """The index of the `scaler.step` that took the gradients of `step` and skipped (it found
        an inf): those are the scaler steps from index `step` on (one per optimizer) up to the
        next update. None when none skipped, or an `optimizer.step()` outside the scaler took them
        (no scaler step has index `step`); _UNDECIDED while that is not known yet (after the run:
        None)."""
        undecided = None if final else _UNDECIDED
        scaler_steps, index = self.state.scaler_steps, step
        at = bisect_left(scaler_steps, step, key=attrgetter("step"))
        while at < len(scaler_steps) and scaler_steps[at].step == index:
            applied = scaler_steps[at].applied_given(values)
            if applied is False:
                return index
            if applied is None:  # a fused optimizer's found_inf, read after the run
                return undecided
            if self._updated_after(index):
                return None
            at, index = at + 1, index + 1
        return None if index < self.state.step else undecided

    def _updated_after(self, step: int) -> bool:
        """`scaler.update()` ran right after the scaler step with index `step`."""
        updates = self.state.updates
        at = bisect_left(updates, step + 1, key=attrgetter("step"))
        return at < len(updates) and updates[at].step == step + 1

    def _check(self, tensors, make: callable, unless_finite: tuple | None = None) -> None:
        """Immediate on CPU, deferred elsewhere (only the cheap checks call this). `unless_finite`:
        (a tensor, another `make`) for a find that is the other one's when that tensor is finite."""
        if not tensors:
            return
        with self.state.pause():
            if all(t.device.type == "cpu" for t in tensors):
                if not all_finite_now(tensors):
                    finite_before = unless_finite is not None and all_finite_now([unless_finite[0]])
                    self.record(unless_finite[1]() if finite_before else make())
                return
            flag = finite_flag(tensors)
            slot = self.state.deferred.add(flag)
            other = None
            if unless_finite is not None:
                other = (self.state.deferred.add(finite_flag([unless_finite[0]])), unless_finite[1]())
        item = make()
        item.seq = next(self._seq)
        if other is not None:
            other[1].seq = item.seq
        self.state.nonfinite_pending.append((slot, item, other))

    # -- cheap --------------------------------------------------------------------------
    def _rerun_from_step(self, made_at: int, op: str) -> int | None:
        """The step a `--nan op` rerun starts at to localise a cheap find whose value began to be
        made at step `made_at` (a loss: its forward's; gradients: the step at which the first
        `backward()` that wrote them began, earlier than the check's when another optimizer
        stepped in between); None when this run's op check already searched from there and no
        op it saw made the value.

        A non-finite loss may come from weights the step before wrote (a NaN learning rate): the
        op check then starts one step early, where the update that made them runs."""
        start = max(0, made_at - 1) if op == "loss" else made_at
        return None if self.mode == "op" and self.from_step <= start else start

    def _why_unlocalised(self) -> str:
        """Why this run's op check, searching at the step, did not find the op that made a value."""
        return (
            f"the op check ran from step {self.from_step} and no op it saw made this value from finite inputs: "
            "it came in from outside them (a tensor read from a file or raw memory, a DataLoader worker, "
            "another thread) or from an infinity written on purpose"
        )

    def _cheap_find(self, op: str, callsite, phase: str, floats: list, detail: str, *, made_at: int, awaits_scaler: bool) -> NonFinite:
        rerun_from_step = self._rerun_from_step(made_at, op)
        return NonFinite(
            op=op,
            callsite=callsite,
            phase=phase,
            step=self.state.step,
            dtype=str(floats[0].dtype).replace("torch.", ""),
            inputs_finite=None,
            check="cheap",
            awaits_scaler=awaits_scaler,
            detail=detail if rerun_from_step is not None else f"{detail}; {self._why_unlocalised()}",
            rerun_from_step=rerun_from_step,
        )

    def check_loss(self, tensors, callsite) -> None:
        if self.mode == "off" or self.found_unhandled():  # cheap checks run at every step
            return
        floats = floating_tensors(tensors)
        if not floats:
            return
        self._losses_checked += 1
        detail = "the tensor passed to backward() is non-finite"
        step = self.state.step
        # A loss holding a gradient penalty of a scaled loss overflows with the scale: the
        # scaler's skip (and back-off) is what handles it, not a forward pass gone wrong.
        penalty = self.state.scaled_penalty_step == step and self.scaler_in_flight()

        def make() -> NonFinite:
            return self._cheap_find("loss", callsite, "forward", floats, detail, made_at=step, awaits_scaler=penalty)

        self._check(floats, make, unless_finite=self._scaled_from(floats, callsite))

    def _scaled_from(self, floats: list, callsite) -> tuple | None:
        """For the result of the last `scaler.scale(loss)`: the loss, and the find for a finite one
        that the scale made non-finite (a loss of 1e35 times 65536 overflows float32). The scaler
        skips that step and lowers its scale: nothing in the forward went wrong."""
        scaled = self.state.last_scaled
        if scaled is None or len(floats) != 1 or scaled[0]() is not floats[0]:
            return None
        loss = scaled[1]()
        if loss is None:
            return None

        def make() -> NonFinite:
            return NonFinite(
                op=SCALED_LOSS,
                callsite=callsite,
                phase="forward",
                step=self.state.step,
                dtype=str(floats[0].dtype).replace("torch.", ""),
                inputs_finite=True,
                check="cheap",
                awaits_scaler=True,
                detail=(
                    "the loss is finite, but times the GradScaler's scale it overflows: the scaler skips the step and "
                    "lowers its scale; a loss this large comes from an outlier batch or an unnormalised target"
                ),
            )

        return loss, make

    def backward_begins(self, tensors, callsite) -> None:
        """A `backward()` is about to add to the parameters' gradients. Those an earlier one left
        that no step took are checked first, once until the next step or `zero_grad()` (what
        later micro-batches add, the step checks); then the loss."""
        if self.mode == "off" or self.found_unhandled():
            return
        optimizers = list(self.state.optimizers)
        for optimizer in optimizers:
            window = self._window(optimizer)
            if self._unused(window) and not window.checked_at_backward:
                window.checked_at_backward = True
                self._check_gradients_of(optimizer, callsite, _LEFT_BY_EARLIER_BACKWARD, awaits_scaler=self.scaler_in_flight())
        self.check_loss(tensors, callsite)
        self._backwards += 1
        for optimizer in optimizers:
            window = self._window(optimizer)
            if window.first_backward_step is None:
                window.first_backward_step = self.state.step

    def check_gradients(self, optimizer, callsite, *, handled: bool) -> None:
        """At an optimizer step. `handled`: the gradients go to an enabled scaler's `scaler.step`
        with a scaled loss in flight, which handles them if it skips the step."""
        if self.mode == "off" or self.found_unhandled():  # cheap checks run at every step
            return
        self._check_gradients_of(optimizer, callsite, _AT_STEP, awaits_scaler=handled)
        window = self._window(optimizer)
        window.stepped, window.first_backward_step, window.checked_at_backward = True, None, False

    def zero_grad(self, optimizer) -> None:
        """`optimizer.zero_grad()` is about to drop the gradients: those no step took (a
        finite-gradient guard skipped it) are checked."""
        if self.mode == "off" or self.found_unhandled():
            return
        self._drop_gradients([optimizer])

    def module_zero_grad(self, module) -> None:
        """`module.zero_grad()` is about to drop its parameters' gradients: as `zero_grad()` of
        the optimizers that hold them (all of their gradients are checked)."""
        if self.mode == "off" or self.found_unhandled():
            return
        dropped = {id(p) for p in module.parameters()}
        owners = [
            optimizer
            for optimizer in list(self.state.optimizers)
            if any(id(p) in dropped for group in optimizer.param_groups for p in group["params"])
        ]
        self._drop_gradients(owners)

    def _drop_gradients(self, optimizers: list) -> None:
        callsite = None
        for optimizer in optimizers:
            if self._unused(self._window(optimizer)):
                callsite = callsite or self.state.classifier.user_callsite(1)
                self._check_gradients_of(optimizer, callsite, _DROPPED_AT_ZERO_GRAD, awaits_scaler=False)
            self._windows[optimizer] = _GradientWindow(checked_through=self._backwards)

    def _unused(self, window: _GradientWindow) -> bool:
        """A `backward()` wrote gradients that no check saw and no step took."""
        return not window.stepped and window.checked_through < self._backwards

    def _window(self, optimizer) -> _GradientWindow:
        window = self._windows.get(optimizer)
        if window is None:  # an optimizer new to the checks: the backward() calls before it are not its
            window = self._windows[optimizer] = _GradientWindow(checked_through=self._backwards)
        return window

    def _check_gradients_of(self, optimizer, callsite, detail: str, *, awaits_scaler: bool) -> None:
        window = self._window(optimizer)
        window.checked_through = self._backwards
        grads = floating_tensors([p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None])
        if not grads:
            return
        self._gradient_checks += 1
        made_at = self.state.step if window.first_backward_step is None else window.first_backward_step
        self._check(
            grads, lambda: self._cheap_find("gradients", callsite, "backward", grads, detail, made_at=made_at, awaits_scaler=awaits_scaler)
        )

    # -- module -------------------------------------------------------------------------
    def module_called(self, module) -> None:
        """`--nan module`, as a module call begins: the modules being called, outermost first, so
        that a find can name the instance (`layers.2`), not only its class."""
        self._calling.stack.append(module)

    def module_returned(self, module) -> None:
        stack = self._calling.stack
        if stack and stack[-1] is module:
            stack.pop()

    def _module_path(self, module) -> str | None:
        """`encoder.layers.2.fc`: the name of `module` among the submodules of the outermost
        module being called (a ModuleList is iterated, not called, so it is not on the stack);
        None when it is that module or not one of its submodules."""
        stack = self._calling.stack
        if not stack or stack[0] is module:
            return None
        return next((name for name, candidate in stack[0].named_modules() if candidate is module), None)

    def module_hook(self, module, inputs, output) -> None:
        """`--nan module`, as a module call returns: a non-finite output from finite inputs."""
        state = self.state
        if state.paused or not self.searching:
            return
        outs = floating_tensors(output)
        if not outs:
            return
        with state.pause():
            if all_finite_now(outs):
                return
            inputs_finite = all_finite_now(floating_tensors(inputs))
        if not inputs_finite:
            return  # not where it started: an earlier module or op made it
        in_backward = torch._C._current_graph_task_id() != -1
        self.record(
            NonFinite(
                op=type(module).__name__,
                callsite=state.classifier.user_callsite(1),
                phase="backward" if in_backward else "forward",
                step=state.step,
                dtype=str(outs[0].dtype).replace("torch.", ""),
                inputs_finite=True,
                check="module",
                awaits_scaler=in_backward and self.scaler_in_flight(),
                module=self._module_path(module),
            )
        )

    # -- op -----------------------------------------------------------------------------
    def note_constant(self, tensor) -> None:
        if isinstance(tensor, torch.Tensor):
            self._constants[id(tensor)] = weakref.ref(tensor, lambda _, key=id(tensor): self._constants.pop(key, None))

    def check_op(self, info, args, kwargs, out, callsite, phase, node) -> None:
        """Called by the recorder after each op (already outside the mode: our ops are unseen)."""
        overwritten = floating_tensors([args[i] for i in info.mutated if i < len(args)]) if info.mutated else []
        outs = floating_tensors(out) + overwritten
        if not outs:
            return
        if all_finite_now(outs):
            self._forget_written(overwritten)
            return
        held_before = [self._held_before(t) for t in overwritten]  # before `outs` are remembered
        self._remember_written(outs)
        inputs = [a for i, a in enumerate(args) if i not in info.mutated]
        tensors = floating_tensors(inputs) + floating_tensors(list((kwargs or {}).values()))
        # A literal written by the user (`grad[0] = float("inf")`) is where the value starts.
        tensors = [t for t in tensors if not self._is_constant(t)]
        inputs_finite = all_finite_now(tensors) and not any(held_before)
        # A NaN made from infinities (a softmax over a fully masked row, inf - inf, a clip's
        # inf * 0) starts here too.
        makes_nan = any_nan_now(outs) and not any_nan_now(tensors) and "nan" not in held_before
        if not makes_nan and not inputs_finite:
            return
        if phase == "forward" and self._handles_gradients(tensors + outs):
            phase = "other"  # a gradient read or written by hand, outside backward and the optimizer
        if phase == "forward" and not makes_nan and self._writes_infinite_literal(inputs, kwargs):
            return  # an attention mask (`torch.full(..., float("-inf"))`): infinite on purpose
        awaits_scaler = phase != "forward" and self.scaler_in_flight()
        self.record(
            NonFinite(
                op=info.name,
                callsite=callsite,
                phase=phase,
                step=self.state.step,
                dtype=str(outs[0].dtype).replace("torch.", ""),
                inputs_finite=inputs_finite,
                check="op",
                awaits_scaler=awaits_scaler,
                node=node,
                detail=_narrowing_cast(info, tensors, outs, phase, self._scale_in_flight() if awaits_scaler else None) if inputs_finite else None,
            )
        )

    def _scale_in_flight(self) -> float | None:
        """The scale of the scaler whose scaled loss is being back-propagated (0.0 when not known)."""
        scaler = self.state.last_scaled[2]() if self.state.last_scaled is not None else None
        try:
            return float(scaler.get_scale()) if scaler is not None else 0.0
        except Exception:  # the script's own subclass; the scale only sharpens a message
            return 0.0

    def _held_before(self, tensor: torch.Tensor) -> str | None:
        """What an in-place op's overwritten input held, as last seen written: "nan", "inf"
        (non-finite, no NaN) or None (finite, or never seen non-finite)."""
        entry = self._nonfinite_written.get(storage_of(tensor))
        if entry is None or entry[0].expired():  # a freed storage whose address was reused
            return None
        return "nan" if entry[1] else "inf"

    def _remember_written(self, tensors: list[torch.Tensor]) -> None:
        """Note which of an op's outputs hold non-finite values, and whether NaN, by storage."""
        written = self._nonfinite_written
        for tensor in tensors:
            key = storage_of(tensor)
            if key is None:
                continue
            if all_finite_now([tensor]):
                self._forget_written([tensor])
            else:
                written[key] = (StorageWeakRef(tensor.untyped_storage()), any_nan_now([tensor]))
        if len(written) >= self._prune_written_at:
            for key in [key for key, (storage, _) in written.items() if storage.expired()]:
                del written[key]
            self._prune_written_at = max(_PRUNE_WRITTEN_FROM, 2 * len(written))

    def _forget_written(self, tensors: list[torch.Tensor]) -> None:
        """Finite values overwrote these. Only a write over a whole storage clears it: one into
        part of it (`grad[0] = 0.0`) leaves the rest as it was."""
        if self._nonfinite_written:
            for tensor in tensors:
                key = storage_of(tensor)
                if key is not None and tensor.numel() * tensor.element_size() == tensor.untyped_storage().nbytes():
                    self._nonfinite_written.pop(key, None)

    def _writes_infinite_literal(self, inputs: list, kwargs: dict | None) -> bool:
        """The op was handed an infinite Python number, or a tensor lifted from one."""
        for value in [*inputs, *(kwargs or {}).values()]:
            if isinstance(value, float) and math.isinf(value):
                return True
            if isinstance(value, torch.Tensor) and self._is_constant(value) and not all_finite_now(floating_tensors(value)):
                return True
        return False

    def _is_constant(self, tensor: torch.Tensor) -> bool:
        ref = self._constants.get(id(tensor))
        return ref is not None and ref() is tensor

    def _handles_gradients(self, tensors: list[torch.Tensor]) -> bool:
        """Whether any tensor is (a view of) the gradient of an optimizer's parameter. Only asked
        about an op that made a non-finite value, so the scan costs nothing in a healthy run."""
        gradients = gradients_by_storage(self.state.optimizers)
        return any(storage_of(t) in gradients for t in tensors)

    # -- after the run ------------------------------------------------------------------
    @property
    def checked_anything(self) -> bool:
        """Whether the cheap checks looked at any loss or gradient."""
        return bool(self._losses_checked or self._gradient_checks)

    def resolve(self, values: list) -> NonFinite | None:
        for slot, item, other in self.state.nonfinite_pending:
            flag = values[slot]
            if flag is not None and flag < 0.5:
                finite_before = other is not None and values[other[0]] is not None and values[other[0]] >= 0.5
                self._admit(other[1] if finite_before else item)
        self._settle(values, final=True)
        candidates = sorted(self.state.nonfinite_candidates, key=lambda c: c.seq)
        unhandled = [c for c in candidates if not c.handled_by_scaler]
        first = unhandled[0] if unhandled else (candidates[0] if candidates else None)
        if first is None and self.mode == "cheap":  # "none seen" says nothing without what was looked at
            children = bool(self.state.untraced_processes or self.state.untraced_programs)
            self.state.notes.append(cheap_coverage_note(self._losses_checked, self._gradient_checks, children))
        return first


def gradients_by_storage(optimizers) -> dict[int, torch.Tensor]:
    """The parameters of these optimizers that hold a gradient, by where the gradient lives."""
    found = {}
    for optimizer in list(optimizers):
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None and (key := storage_of(param.grad)) is not None:
                    found[key] = param
    return found


def storage_of(tensor: torch.Tensor) -> int | None:
    """Where a tensor's data lives, or None for one without plain storage of its own: sparse,
    a wrapper subclass (DTensor, FSDP2's gradients), or an empty tensor (they all share 0)."""
    if tensor.layout is not torch.strided:
        return None
    try:
        pointer = tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    return pointer or None


def _narrowing_cast(info, inputs: list, outs: list, phase: str, scale: float | None) -> str | None:
    """Why a cast made infinities from finite values: they lie beyond the range of the narrower
    dtype (unnormalised inputs or targets cast to float16 by autocast or `.half()`; in backward,
    gradients cast back through autocast's casts). `scale`: the GradScaler's scale the gradients
    carry (None: no scaled loss in flight; 0.0: one whose scale is not known)."""
    if info.name.split("::")[-1].split(".")[0] not in ("_to_copy", "copy_", "to") or not inputs:
        return None
    target = outs[0].dtype
    if not target.is_floating_point or torch.finfo(target).bits >= torch.finfo(inputs[0].dtype).bits:
        return None
    largest = float(inputs[0].detach().abs().max())
    name = str(target).replace("torch.", "")
    cast = f"a cast of {str(inputs[0].dtype).replace('torch.', '')} values up to {largest:.4g} to {name}, whose largest is {torch.finfo(target).max:.6g}"
    top = torch.finfo(target).max
    if phase == "backward" and scale and largest / scale > top:
        return (
            f"{cast}, in backward: even without the GradScaler's scale ({scale:g}) these gradients reach "
            f"{largest / scale:.4g}, beyond {name}: an outlier batch or an unnormalised target, whose steps the scaler "
            f"skips each time; normalise it, clip the loss, or use bfloat16"
        )
    if phase == "backward" and scale is not None:
        return (
            f"{cast}, in backward: gradients carrying the GradScaler's scale; overflowing is how the scaler finds "
            f"its scale too high (it skips the step and lowers the scale), nothing to fix unless it never settles"
        )
    if phase == "backward":
        return f"{cast}, in backward: the gradients outgrow {name}; scale the loss down or use bfloat16"
    return f"{cast} (autocast's own cast of an input, or a `.half()`): normalise or scale those values first, or use bfloat16"
