"""Everything a traced run records, in plain Python structures keyed by callsite.

Sizes depend on the code, not on the number of steps, except the per-step scaler timeline (one
small tuple per `scaler.step`/`update`). Device values (scales, found_inf flags, norms) are kept on
their device and read once after the run (`DeferredValues`): the default mode adds no device sync.
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from amplint.trace.callsite import Callsite


class DeferredValues:
    """Scalars produced on a device, read after the run in one go.

    CPU values are read at once (no sync to avoid). Others are copied into a preallocated buffer
    on their device (an asynchronous copy), grown by doubling.
    """

    def __init__(self) -> None:
        self._slots: list[Any] = []  # float | (device key, index)
        self._buffers: dict[str, Any] = {}
        self._used: dict[str, int] = {}

    def add(self, value) -> int:
        """Store a 0-d/1-element tensor (or a number); returns its slot."""
        import torch

        if not isinstance(value, torch.Tensor):
            self._slots.append(None if value is None else float(value))
        elif value.device.type in ("cpu", "meta") or value.is_meta:
            self._slots.append(float(value.detach().reshape(()).float()) if not value.is_meta else None)
        else:
            key = str(value.device)
            buffer = self._buffers.get(key)
            used = self._used.get(key, 0)
            if buffer is None or used == buffer.numel():
                grown = torch.empty(max(64, 2 * used), dtype=torch.float64, device=value.device)
                if buffer is not None:
                    grown[:used].copy_(buffer)
                self._buffers[key] = buffer = grown
            buffer[used].copy_(value.detach().reshape(()), non_blocking=True)
            self._used[key] = used + 1
            self._slots.append((key, used))
        return len(self._slots) - 1

    def resolve(self) -> list[float | None]:
        host = {key: buf[: self._used[key]].tolist() for key, buf in self._buffers.items()}
        out: list[float | None] = []
        for slot in self._slots:
            out.append(host[slot[0]][slot[1]] if isinstance(slot, tuple) else slot)
        return out


class LastUnscale(NamedTuple):
    """An optimizer's last `unscale_()`: where, the scaler's scale() calls then, and the run's step."""

    site: Callsite | None
    scale_calls: int
    step: int


@dataclass
class ScalerInfo:
    index: int
    callsite: Callsite | None
    called_from: Callsite | None
    enabled: bool
    device: str
    init_scale: float | None  # None for a disabled scaler: torch keeps no scale then
    disabled_on_request: bool = False  # built with enabled=False, not disabled for a missing device
    # The scalers one line builds before any optimizer step (`scaler_g, scaler_d = GradScaler(),
    # GradScaler()`, one per model) live side by side: numbered 0, 1... on their line. One the
    # line builds again after steps (a scaler per epoch) starts at 0 again.
    sibling: int = 0
    built_at_step: int = 0
    # our own state machine (feasibility §6), valid for disabled scalers too
    scaled: bool = False
    unscaled: set = field(default_factory=set)
    steps: int = 0
    updates: int = 0
    # AMP007/AMP008: GradScaler's per-optimizer stage since the last update() (UNSCALED/STEPPED)
    stage: dict = field(default_factory=dict)  # id(optimizer) -> "UNSCALED" | "STEPPED"
    window: list = field(default_factory=list)  # (id(optimizer), step callsite) since the last update()
    last_unscale: dict = field(default_factory=dict)  # id(optimizer) -> LastUnscale
    # AMP008: the parameters each object unscaled since update() held (a wrapper and the optimizer it
    # holds are two objects to the scaler, one set of gradients to unscale)
    unscaled_params: dict = field(default_factory=dict)  # id(optimizer) -> frozenset of id(param)
    stepped_through: set = field(default_factory=set)  # unscaled optimizers a step of such a wrapper took
    # per update(): (callsite, optimizer ids stepped before it, whether a scale() came before the
    # first of those steps: a round of its own, scaled after the previous update)
    windows: list = field(default_factory=list)
    scaled_since_update: bool = False
    window_rescaled: bool = False
    # AMP010: where the scaled losses came from, and the time spent in the scaler's own calls
    scale_calls: int = 0
    scale_dtypes: dict = field(default_factory=dict)  # autocast dtype of the last region entered -> count
    seconds: float = 0.0


@dataclass
class ScalerStep:
    scaler: int
    optimizer: int  # id()
    step: int  # global step index at the attempt
    callsite: Callsite | None
    applied: bool | None  # None: decided by a deferred found_inf (fused optimizers)
    found_inf_slot: int | None = None
    optimizer_seconds: float = 0.0  # inside optimizer.step() (AMP010 counts the scaler's own time)
    optimizer_serial: int | None = None  # TraceState.optimizer_serial: the same object, not a reused id
    # Given a wrapper rather than a torch optimizer (fairseq's FP32Optimizer): the parameters it
    # holds, by which the torch optimizer stepped inside is recognised as this step's.
    wrapped_params: frozenset = frozenset()

    def takes(self, optimizer) -> bool:
        """Whether `optimizer.step()` is the step this scaler.step() runs: the object it was given,
        or the torch optimizer inside the wrapper it was given."""
        if self.optimizer == id(optimizer):
            return True
        return bool(self.wrapped_params) and any(
            id(p) in self.wrapped_params for group in optimizer.param_groups for p in group["params"]
        )

    def applied_given(self, values: list | None) -> bool | None:
        """Whether the optimizer step ran, reading a deferred found_inf from `values`
        (`DeferredValues.resolve()`); None while it is unread, or when there is none to read."""
        if self.applied is not None or self.found_inf_slot is None or values is None:
            return self.applied
        found_inf = values[self.found_inf_slot]
        return None if found_inf is None else found_inf == 0


@dataclass
class Update:
    scaler: int
    step: int
    scale_slot: int


@dataclass
class ClipEvent:
    callsite: Callsite | None
    function: str
    step: int
    still_scaled: bool
    scaler: int | None
    scale_slot: int | None
    norm_slot: int | None


@dataclass
class SchedulerStep:
    callsite: Callsite | None
    optimizer: int
    step: int
    after: ScalerStep | None  # the optimizer's last scaler step, if any


@dataclass
class Conversion:
    callsite: Callsite | None
    module: str  # class name
    dtype: str
    forwards_under_autocast: int = 0
    autocast: tuple | None = None  # (device, dtype) at the first such forward
    param_dtype: str | None = None
    # Forwards inside an autocast region entered disabled (`enabled=args.amp` left off), and where
    # the first such region was entered: the finding's case did not run, whatever other regions did.
    forwards_in_off_region: int = 0
    off_region: Callsite | None = None
    # Forwards under autocast with gradients off or no trainable low-precision parameter (a frozen
    # float16 teacher under no_grad): nothing trains those weights, the rule's exemption.
    forwards_frozen: int = 0


@dataclass
class WarningRecord:
    callsite: Callsite
    category: str
    message: str
    count: int = 0


@dataclass
class NonFinite:
    op: str
    callsite: Callsite | None
    phase: str
    step: int
    dtype: str | None
    inputs_finite: bool | None
    check: str  # cheap | module | op
    seq: int = 0  # order of detection (deferred flags resolve after the run)
    handled_by_scaler: bool = False
    # Found outside the forward pass while an enabled GradScaler had a scaled loss in flight:
    # handled if that scaler then skips the step, which is known only once it has stepped.
    awaits_scaler: bool = False
    node: str | None = None
    module: str | None = None  # `--nan module`: the instance's attribute path (`block2.fc`)
    detail: str | None = None
    # A cheap find: the `--nan-from-step` of the `--nan op` rerun that localises it; None when
    # this run's op check already searched from there (the rerun would be this run again).
    rerun_from_step: int | None = None


@dataclass
class Float16Region:
    """AMP009: a float16 autocast region (one place: where it was entered and where it was built)
    entered since the last backward or optimizer step."""

    device: str | None
    entered_at: Callsite | None
    created_at: Callsite | None
    # [first, end) of the autograd node numbers each exited entry built (autograd numbers the
    # nodes it makes, per thread): a loss comes from the region when its graph holds one of them.
    # The latest entries only: a run that never steps (inference) enters its regions forever.
    node_ranges: deque = field(default_factory=lambda: deque(maxlen=64))
    # The first node number of each entry not exited yet: the nodes it has built so far follow it.
    open_since: list = field(default_factory=list)

    @property
    def open(self) -> int:
        """Entries not exited yet."""
        return len(self.open_since)

    def ranges_so_far(self, now: int) -> list[tuple[int, int]]:
        """The node numbers its exited entries built, and those its open entries have built until `now`."""
        return [*self.node_ranges, *((first, now) for first in self.open_since)]


class AutocastMirror(threading.local):
    """The autocast state per thread, kept by our `torch.set_autocast_enabled/dtype` wrappers,
    because `torch.is_autocast_enabled` lies inside `__torch_dispatch__` (feasibility §2)."""

    def __init__(self) -> None:
        self.enabled: dict[str, bool] = {}
        self.dtypes: dict[str, Any] = {}
        self.active: tuple = ()  # ((device, dtype), ...) of the enabled devices
        self.entered: list = []  # (entered at, created at) of open enabled `with autocast` blocks
        self.requested: list = []  # dtype of open CUDA blocks disabled for want of a GPU
        # (device, enabled, dtype name, entered at, AMP009 (Float16Region, autograd node count at
        # entry) or None) of every open `with autocast`
        self.regions: list = []
        # AMP014: ((device, outer dtype, outer entered at, disabled entered at), ...) while a region
        # disables autocast on a device an outer region enabled
        self.suppressed: tuple = ()
        self.parent: tuple | None = None  # AMP015: in a worker thread, (parent's active autocast, record)

    def off_region(self):
        """Where the innermost open `with autocast` was entered, when it was entered disabled (the
        script's flag left it off): work under it is not the case a finding about autocast is about."""
        regions = self.regions
        return regions[-1][3] if regions and not regions[-1][1] else None


class _ThreadPauses(threading.local):
    depth = 0


class TraceState:
    def __init__(self) -> None:
        self.owner_pid = os.getpid()
        self.classifier = None  # CodeClassifier, set by the session
        # Per thread: our own tensor work in one thread must not hide the script's ops that other
        # threads run meanwhile (a worker's matmuls while the main thread is being simulated).
        self._pauses = _ThreadPauses()
        # Threads other than the script's that ran autocast or a backward, with the first place:
        # the op recorder is a mode of the script's thread only.
        self.script_thread = threading.current_thread()
        self.other_threads: dict[str, tuple] = {}
        self._in_forked_child = 0
        self.mirror = AutocastMirror()
        self.deferred = DeferredValues()
        self.step = 0  # completed scaler.step()/optimizer.step() attempts
        self.in_scaler_step: ScalerStep | None = None
        self.in_optimizer = 0
        self.optimizers: weakref.WeakSet = weakref.WeakSet()  # every optimizer the script built
        self._optimizer_serials: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._next_optimizer_serial = itertools.count()
        self.backward_callsite: Callsite | None = None
        self.backward_depth = 0

        # ops: (op, in dtypes, out dtypes, autocast (device, dtype) | None, phase, callsite, node) -> count
        self.ops: Counter = Counter()
        self.op_templates: dict = {}  # (op, in dtypes) -> (func, args template, kwargs template)
        self.raised_ops: dict = {}  # op table key -> the error of a call that raised
        self.raised_signatures: set = set()  # (op, in dtypes) of the calls that raised
        self.op_devices: dict = {}  # op name -> device type seen

        # backward / step calls: callsite -> [with autocast, without]
        self.backward_calls: dict[Callsite | None, list[int]] = defaultdict(lambda: [0, 0])
        self.backward_autocast: dict[Callsite | None, dict] = {}  # evidence of the first one
        self.step_calls: dict[Callsite | None, list[int]] = defaultdict(lambda: [0, 0])
        self.step_autocast: dict[Callsite | None, dict] = {}
        self.autocast_entries: Counter = Counter()  # callsite of `with autocast` -> count
        # `with autocast` entered disabled: by the script (`enabled=False`), or a CUDA region on a
        # machine without CUDA, which --simulate cuda shadows (then it is not "off")
        self.autocast_off_entries: Counter = Counter()  # callsite -> count
        self.autocast_without_device_entries: Counter = Counter()  # callsite -> count
        self.autocast_created_at: dict = {}  # entered callsite of a disabled region -> where it was built
        self.autocast_refused_dtype: dict = {}  # entered callsite -> (device, dtype) autocast turned off
        # backward / step calls made with autocast off inside a region entered disabled (AMP003)
        self.calls_in_off_region: Counter = Counter()  # callsite -> count
        self.off_region_of: dict = {}  # callsite -> entered callsite of the first such region
        self.simulating = False

        self.scalers: list[ScalerInfo] = []
        self.scaler_by_id: dict[int, int] = {}
        self.scaler_steps: list[ScalerStep] = []
        self.updates: list[Update] = []
        self.last_step_of_optimizer: dict[int, ScalerStep] = {}
        self.direct_steps: Counter = Counter()  # optimizer.step() outside scaler.step, per callsite
        self.bypass_steps: Counter = Counter()  # ... while an enabled scaler's scaled loss is in flight (AMP006)
        self.bypass_steps_after_unscale: Counter = Counter()  # ... of which on gradients unscale_() had unscaled
        self.scheduler_steps: list[SchedulerStep] = []
        self.clips: list[ClipEvent] = []
        self.watched_hits: dict[Callsite, list] = defaultdict(list)  # AMP005 lines without a clip call
        self.watch: dict = {}  # callsite -> callback, run by the recorder when an op runs there
        # AMP005 at run time: an op outside backward and the optimizer on a parameter's `.grad`
        # while an enabled scaler's scale is still in it (a grad-norm logger in a callback).
        # Set by the probes: called by the recorder with the op's inputs and user line.
        self.scaled_gradient_reads: callable | None = None
        self.grad_reads: dict[Callsite, list] = defaultdict(list)  # line -> [{step, scale_slot, called_from}]
        self.clipping = False  # inside a clip call, which the clip probe reports itself

        self.conversions: list[Conversion] = []
        self.conversion_by_module: dict[int, int] = {}

        self.warnings: dict[tuple, WarningRecord] = {}
        self.nonfinite_candidates: list[NonFinite] = []  # first unhandled + first handled
        # deferred flag slot, record, and (slot, record) of the find it is when that slot's tensor is finite
        self.nonfinite_pending: list[tuple[int, NonFinite, tuple[int, NonFinite] | None]] = []
        self.handled_overflow_steps: set[int] = set()  # steps whose non-finite values the scaler handled
        self.lines_seen: set[Callsite] = set()  # user lines that ran torch ops or probes
        self.lines_under_autocast: set[Callsite] = set()  # those that ran them with autocast on in their thread
        self.suppressing_regions: set[Callsite] = set()  # AMP014: entered disabling autocast inside an enabled region
        # A region disabling one device's autocast entered inside an enabled region of another
        # device only: site -> (its device, the enabled region's device, that region's dtype)
        self.misdirected_disables: dict[Callsite, tuple] = {}
        self.inspecting = 0  # inside torch.isfinite / isnan / equal...: ops that read values, not compute
        self.files_seen: set[str] = set()
        self.notes: list[str] = []
        # processes started with multiprocessing, which run untraced: start callsite (None: torch
        # not imported yet, or no line of the script's on the stack) -> count
        self.untraced_processes: Counter = Counter()
        # Python programs the script ran (subprocess, os.system): start callsite -> count
        self.untraced_programs: Counter = Counter()

        # AMP007-AMP017 (events keyed by rule; see confirm.rule_events for how each is joined)
        self.pairing: list[dict] = []  # AMP007: missing update / update without step
        self.unscales: list[dict] = []  # AMP008: unscale_ again before step/update, unscale_ with no step
        self.last_region: tuple | None = None  # (device, dtype, entered at) of the last enabled region entered
        self.fp16_regions: dict = {}  # AMP009: (entered at, created at) -> Float16Region
        self.scaled_since_backward = False
        # AMP009: a disabled GradScaler whose scale() the loss went through since the last backward
        # (`GradScaler("cuda")` on a machine without CUDA, beside a CPU autocast): it scaled nothing.
        self.disabled_scaler_since_backward: ScalerInfo | None = None
        # The step at which a gradient penalty took the gradients of a scaled loss (PyTorch's recipe:
        # `autograd.grad(scaler.scale(loss), create_graph=True)`): an overflow in the penalty comes
        # from the scale, and the loss it is added to is the scaler's to skip.
        self.scaled_penalty_step: int | None = None
        # The last enabled scaler.scale(): weak references to its result, to the loss it was given
        # (a non-finite result of a finite loss is the scale's overflow) and to the scaler.
        self.last_scaled: tuple | None = None
        # Steps whose backward got a finite loss that the scale made non-finite (AMP010 reads them).
        self.scale_overflow_steps: set[int] = set()
        self.fp16_backwards: dict = {}  # AMP009: (entered at, created at) -> record of the backward calls after it
        # AMP009: (backward callsite, regions that ended their entries) -> those the loss's graph held:
        # the graph is walked once per pattern of a training step, not at every step
        self.fp16_loss_sources: dict = {}
        self.zero_grad_pending: list = []  # AMP009: records waiting for the next optimizer step's zero-gradient share
        self.saves: dict = {}  # AMP012: torch.save callsite -> record
        # AMP012: the steps at which a save held a GradScaler's state without an optimizer's (a part of a
        # checkpoint written in files), and the saves of an optimizer
        # state alone at a step none did yet (a checkpoint written as separate files, the scaler's
        # last, clears them).
        self.scaler_state_saved_at: set[int] = set()
        self.saves_missing_the_scaler: dict[int, list[dict]] = {}
        self.custom_functions: dict = {}  # AMP013: class -> record (None: not a user class)
        self.disabled_region_ops: Counter = Counter()  # AMP014: (disabled at, op line, op, in dtypes, outer dtype)
        self.threads: dict = {}  # AMP015: creation callsite -> record
        self.autocast_constructions: dict = {}  # AMP016: callsite -> record
        self.bce_errors: dict = {}  # AMP016: callsite -> record
        self.bce_devices: dict = {}  # AMP016: callsite -> autocast devices binary_cross_entropy ran under
        self.compiled: list = []  # AMP017: records of torch.compile results
        self.dispatch_modes_on = False  # the op recorder or the CUDA simulator holds the script's thread
        self.compiled_pending = None  # a compiled call under autocast since the last backward

    def optimizer_serial(self, optimizer) -> int | None:
        """A number per optimizer object that no later object takes, unlike `id()`, which a new
        optimizer reuses once the old one is freed (a fold's optimizer after the previous fold's)."""
        try:
            if optimizer not in self._optimizer_serials:
                self._optimizer_serials[optimizer] = next(self._next_optimizer_serial)
            return self._optimizer_serials[optimizer]
        except TypeError:  # an object that takes no weak reference
            return None

    def step_completed(self) -> None:
        """A `scaler.step()`/`optimizer.step()` attempt ended: the training step it closes took its
        losses' gradients, so its float16 regions have nothing more to answer for (AMP009)."""
        self.step += 1
        self.end_fp16_window()

    def end_fp16_window(self) -> list[Float16Region]:
        """AMP009: the float16 regions a loss reaching backward() now can come from: those entered
        since the last backward or optimizer step that are still open or built autograd nodes.
        The next window starts with the open ones only."""
        sources = [region for region in self.fp16_regions.values() if region.open or region.node_ranges]
        self.fp16_regions = {key: region for key, region in self.fp16_regions.items() if region.open}
        for region in self.fp16_regions.values():
            region.node_ranges.clear()
        return sources

    @property
    def paused(self) -> int:
        """> 0 while this thread runs our own tensor work, and in every thread of a forked child."""
        return self._pauses.depth + self._in_forked_child

    def stop_in_forked_child(self) -> None:
        self._in_forked_child = 1

    @property
    def active(self) -> bool:
        return self.paused == 0

    def pause(self) -> _Pause:
        return _Pause(self)


class _Pause:
    """Our own tensor work (and torch's scaler internals): the recorder passes it through
    unrecorded and unchecked. A counter, not `_DisableTorchDispatch`, so tensor subclasses
    (DTensor, fake tensors) keep working underneath."""

    __slots__ = ("state",)

    def __init__(self, state: TraceState):
        self.state = state

    def __enter__(self):
        self.state._pauses.depth += 1
        return self

    def __exit__(self, *exc):
        self.state._pauses.depth -= 1
        return False
