"""Where the first inf/NaN came from (feasibility §7).

- cheap  (default): the loss at each `backward()` and the gradients at each optimizer step. On CPU
          the flags are read at once; on other devices they are queued as device tensors and read
          after the run, so no sync is added.
- module: plus a global forward hook on every module: the first module whose output is
          non-finite while its inputs are finite.
- op:     plus a check of every op's floating outputs in the dispatch recorder; the first op
          with a non-finite output and finite inputs, or with a NaN output and no NaN input (a
          softmax over a fully masked row). Infinities the forward pass is handed on purpose
          (`torch.full(..., float("-inf"))`, `masked_fill(mask, -inf)`: attention masks) are
          not a find; one written into a gradient is.

A non-finite value in backward (or in gradients at `scaler.step`) while an enabled GradScaler has
a scaled loss in flight is what the scaler exists for: it is recorded as "handled by GradScaler"
and the search goes on for an unhandled one.
"""

from __future__ import annotations

import math
import weakref
from itertools import count

import torch

from amplint.trace.state import NonFinite, TraceState

_FLOATING = {torch.float16, torch.bfloat16, torch.float32, torch.float64}
# Uninitialised memory holds anything; these never count (feasibility §7).
UNINITIALISED_OPS = ("empty", "new_empty", "empty_like", "empty_strided", "new_empty_strided", "resize_", "set_")


def floating_tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.dtype in _FLOATING and value.numel() else []
    if isinstance(value, (list, tuple)):
        found = []
        for item in value:
            found.extend(floating_tensors(item))
        return found
    if isinstance(value, dict):
        return floating_tensors(list(value.values()))
    return []


def all_finite_now(tensors: list[torch.Tensor]) -> bool:
    """Exact check, syncing. The float32 sum is a one-op pre-check; it can only overflow on huge
    finite values, so a non-finite sum is confirmed element-wise."""
    for t in tensors:
        if t.is_meta or getattr(t, "fake_mode", None) is not None:
            continue
        total = t.detach().sum(dtype=torch.float64 if t.dtype == torch.float64 else torch.float32)
        if not math.isfinite(total.item()) and not bool(torch.isfinite(t.detach()).all()):
            return False
    return True


def any_nan_now(tensors: list[torch.Tensor]) -> bool:
    """Exact check, syncing; only asked about values already known to be non-finite."""
    return any(
        bool(torch.isnan(t.detach()).any()) for t in tensors if not t.is_meta and getattr(t, "fake_mode", None) is None
    )


def finite_flag(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """A 0-d float tensor on the tensors' device: 1.0 when all are finite (no sync)."""
    if not tensors:
        return None
    flags = [torch.isfinite(t.detach()).all() for t in tensors]
    return torch.stack(flags).all().float() if len(flags) > 1 else flags[0].float()


class NonFiniteMonitor:
    def __init__(self, state: TraceState, mode: str, from_step: int):
        self.state = state
        self.mode = mode
        self.from_step = from_step
        self._seq = count()
        self.found_unhandled = False
        self.found_handled = False
        # By identity: a WeakSet compares live tensors with `==`, and `nan == nan` is false, so a
        # NaN literal was never found in it.
        self._constants: dict[int, weakref.ref] = {}

    # -- shared -------------------------------------------------------------------------
    @property
    def searching(self) -> bool:
        """The `module` and `op` checks run from `--nan-from-step` on, until a first find."""
        return not self.found_unhandled and self.state.step >= self.from_step

    def scaler_in_flight(self) -> bool:
        """An enabled scaler has scaled a loss whose update has not happened yet."""
        return any(s.enabled and s.scaled for s in self.state.scalers)

    def record(self, item: NonFinite) -> None:
        item.seq = next(self._seq)
        if item.handled_by_scaler:
            # per step: the op check and the gradient check see the same overflow
            self.state.handled_overflow_steps.add(item.step)
            if self.found_handled:
                return
            self.found_handled = True
        else:
            self.found_unhandled = True
        self.state.nonfinite_candidates.append(item)

    def _check(self, tensors, make: callable) -> None:
        """Immediate on CPU, deferred elsewhere (only the cheap checks call this)."""
        if not tensors:
            return
        with self.state.pause():
            if all(t.device.type == "cpu" for t in tensors):
                if not all_finite_now(tensors):
                    self.record(make())
                return
            flag = finite_flag(tensors)
            slot = self.state.deferred.add(flag)
        item = make()
        item.seq = next(self._seq)
        self.state.nonfinite_pending.append((slot, item))

    # -- cheap --------------------------------------------------------------------------
    def check_loss(self, tensors, callsite) -> None:
        if self.mode == "off" or self.found_unhandled:  # cheap checks run at every step
            return
        floats = floating_tensors(tensors)
        if not floats:
            return
        step = self.state.step
        self._check(
            floats,
            lambda: NonFinite(
                op="loss",
                callsite=callsite,
                phase="forward",
                step=step,
                dtype=str(floats[0].dtype).replace("torch.", ""),
                inputs_finite=None,
                check="cheap",
                detail="the tensor passed to backward() is non-finite",
            ),
        )

    def check_gradients(self, optimizer, callsite, *, handled: bool) -> None:
        if self.mode == "off" or self.found_unhandled:  # cheap checks run at every step
            return
        grads = [
            p.grad
            for group in optimizer.param_groups
            for p in group["params"]
            if p.grad is not None and p.grad.dtype in _FLOATING and not p.grad.is_sparse
        ]
        if not grads:
            return
        step = self.state.step
        self._check(
            grads,
            lambda: NonFinite(
                op="gradients",
                callsite=callsite,
                phase="backward",
                step=step,
                dtype=str(grads[0].dtype).replace("torch.", ""),
                inputs_finite=None,
                check="cheap",
                handled_by_scaler=handled,
                detail="a parameter gradient is non-finite at the optimizer step",
            ),
        )

    # -- module -------------------------------------------------------------------------
    def module_hook(self, module, inputs, output) -> None:
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
            )
        )

    # -- op -----------------------------------------------------------------------------
    def note_constant(self, tensor) -> None:
        if isinstance(tensor, torch.Tensor):
            self._constants[id(tensor)] = weakref.ref(tensor, lambda _, key=id(tensor): self._constants.pop(key, None))

    def check_op(self, info, args, kwargs, out, callsite, phase, node) -> None:
        """Called by the recorder after each op (already outside the mode: our ops are unseen)."""
        outs = floating_tensors(out)
        if info.mutated:
            outs += floating_tensors([args[i] for i in info.mutated if i < len(args)])
        if not outs or all_finite_now(outs):
            return
        inputs = [a for i, a in enumerate(args) if i not in info.mutated]
        tensors = floating_tensors(inputs) + floating_tensors(list((kwargs or {}).values()))
        # A literal written by the user (`grad[0] = float("inf")`) is where the value starts.
        tensors = [t for t in tensors if not self._is_constant(t)]
        # A NaN made from infinities (a softmax over a fully masked row, inf - inf) starts here too.
        makes_nan = any_nan_now(outs) and not any_nan_now(tensors)
        if not makes_nan and not all_finite_now(tensors):
            return
        if phase == "forward" and self._handles_gradients(tensors + outs):
            phase = "other"  # a gradient read or written by hand, outside backward and the optimizer
        if phase == "forward" and not makes_nan and self._writes_infinite_literal(inputs, kwargs):
            return  # an attention mask (`torch.full(..., float("-inf"))`): infinite on purpose
        handled = phase == "backward" and self.scaler_in_flight()
        self.record(
            NonFinite(
                op=info.name,
                callsite=callsite,
                phase=phase,
                step=self.state.step,
                dtype=str(outs[0].dtype).replace("torch.", ""),
                inputs_finite=not makes_nan or all_finite_now(tensors),
                check="op",
                handled_by_scaler=handled,
                node=node,
            )
        )

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
        gradients = {
            _storage(param.grad)
            for optimizer in list(self.state.optimizers)
            for group in optimizer.param_groups
            for param in group["params"]
            if param.grad is not None
        } - {None}
        return any(_storage(t) in gradients for t in tensors)

    # -- after the run ------------------------------------------------------------------
    def resolve(self, values: list) -> NonFinite | None:
        for slot, item in self.state.nonfinite_pending:
            flag = values[slot]
            if flag is not None and flag < 0.5:
                self.state.nonfinite_candidates.append(item)
                if item.handled_by_scaler:
                    self.state.handled_overflow_steps.add(item.step)
        candidates = sorted(self.state.nonfinite_candidates, key=lambda c: c.seq)
        unhandled = [c for c in candidates if not c.handled_by_scaler]
        if unhandled:
            return unhandled[0]
        return candidates[0] if candidates else None


def _storage(tensor: torch.Tensor) -> int | None:
    """Where a tensor's data lives, or None for one without plain storage of its own: sparse,
    a wrapper subclass (DTensor, FSDP2's gradients), or an empty tensor (they all share 0)."""
    if tensor.layout is not torch.strided:
        return None
    try:
        pointer = tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    return pointer or None
