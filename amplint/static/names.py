"""The torch names the rules know, as fully qualified names.

Every spelling that reaches the same object is listed (public re-exports and the defining
module), so a rule never depends on how a user imported it.
"""

from __future__ import annotations

import re

DEPRECATED_AMP = {
    # qualified name -> (device, object kind)
    "torch.cuda.amp.autocast": ("cuda", "autocast"),
    "torch.cuda.amp.autocast_mode.autocast": ("cuda", "autocast"),
    "torch.cpu.amp.autocast": ("cpu", "autocast"),
    "torch.cpu.amp.autocast_mode.autocast": ("cpu", "autocast"),
    "torch.cuda.amp.GradScaler": ("cuda", "GradScaler"),
    "torch.cuda.amp.grad_scaler.GradScaler": ("cuda", "GradScaler"),
    "torch.cpu.amp.GradScaler": ("cpu", "GradScaler"),
    "torch.cpu.amp.grad_scaler.GradScaler": ("cpu", "GradScaler"),
    "torch.cuda.amp.custom_fwd": ("cuda", "custom_fwd"),
    "torch.cuda.amp.autocast_mode.custom_fwd": ("cuda", "custom_fwd"),
    "torch.cuda.amp.custom_bwd": ("cuda", "custom_bwd"),
    "torch.cuda.amp.autocast_mode.custom_bwd": ("cuda", "custom_bwd"),
}

# Module-level autocast state functions deprecated in torch 2.4 (pytorch/pytorch#124359).
DEPRECATED_AUTOCAST_STATE = {
    "torch.get_autocast_gpu_dtype": 'torch.get_autocast_dtype("cuda")',
    "torch.get_autocast_cpu_dtype": 'torch.get_autocast_dtype("cpu")',
    "torch.set_autocast_gpu_dtype": 'torch.set_autocast_dtype("cuda", dtype)',
    "torch.set_autocast_cpu_dtype": 'torch.set_autocast_dtype("cpu", dtype)',
    "torch.is_autocast_cpu_enabled": 'torch.is_autocast_enabled("cpu")',
    "torch.set_autocast_cpu_enabled": 'torch.set_autocast_enabled("cpu", enabled)',
    "torch.get_autocast_xla_dtype": 'torch.get_autocast_dtype("xla")',
    "torch.set_autocast_xla_dtype": 'torch.set_autocast_dtype("xla", dtype)',
    "torch.is_autocast_xla_enabled": 'torch.is_autocast_enabled("xla")',
    "torch.set_autocast_xla_enabled": 'torch.set_autocast_enabled("xla", enabled)',
    "torch.get_autocast_ipu_dtype": 'torch.get_autocast_dtype("ipu")',
    "torch.set_autocast_ipu_dtype": 'torch.set_autocast_dtype("ipu", dtype)',
    "torch.is_autocast_ipu_enabled": 'torch.is_autocast_enabled("ipu")',
    "torch.set_autocast_ipu_enabled": 'torch.set_autocast_enabled("ipu", enabled)',
}

# AMP012's save helpers from another file, by name: a verb that writes paired with what a
# checkpoint holds (`write_checkpoint`, `dump_state`, `persist_model`). The byte gate and the slicer
# read the same words, so that a file holding only such a call is analysed at all.
CHECKPOINT_WRITE_VERBS = frozenset({"save", "write", "dump", "store", "persist"})
CHECKPOINT_CONTENTS = frozenset({"checkpoint", "checkpoints", "ckpt", "state", "states", "model", "models"})

# Functions that read the autocast state: code that calls them is written to run under autocast.
AUTOCAST_STATE_GETTERS = {
    "torch.is_autocast_enabled",
    "torch.get_autocast_dtype",
    *(name for name in DEPRECATED_AUTOCAST_STATE if name.startswith(("torch.is_", "torch.get_"))),
}

# Autocast's own cast of an op's inputs to the region's dtype: code calling it implements autocast.
AUTOCAST_CAST = "torch.amp.autocast_mode._cast"

AUTOCAST = {
    "torch.autocast",
    "torch.amp.autocast",
    "torch.amp.autocast_mode.autocast",
    "torch.cuda.amp.autocast",
    "torch.cuda.amp.autocast_mode.autocast",
    "torch.cpu.amp.autocast",
    "torch.cpu.amp.autocast_mode.autocast",
}

# Training frameworks whose object opens torch's autocast itself, as its mixed-precision setting
# says: `with accelerator.autocast():` (accelerate), `with fabric.autocast():` (Lightning Fabric).
FRAMEWORK_AUTOCAST_OWNERS = frozenset({"accelerator", "fabric"})
ACCELERATORS = frozenset({"accelerate.Accelerator", "accelerate.accelerator.Accelerator"})
FABRICS = frozenset({"lightning.Fabric", "lightning.fabric.Fabric", "lightning_fabric.Fabric"})
FRAMEWORK_AUTOCAST_CLASSES = ACCELERATORS | FABRICS
LIGHTNING_TRAINERS = frozenset({"lightning.Trainer", "lightning.pytorch.Trainer", "pytorch_lightning.Trainer"})

# How many in-file calls deep the facts follow a region or a loop (semantics' region_of and
# loops_per_caller); the rules that follow helpers, and the slicer, go as deep.
CALL_DEPTH = 3

GRAD_SCALER = {
    "torch.GradScaler",  # the same class as torch.amp.GradScaler, from torch 2.3
    "torch.amp.GradScaler",
    "torch.amp.grad_scaler.GradScaler",
    "torch.cuda.amp.GradScaler",
    "torch.cuda.amp.grad_scaler.GradScaler",
    "torch.cpu.amp.GradScaler",
    "torch.cpu.amp.grad_scaler.GradScaler",
    # FSDP's subclass, which all-reduces the inf checks across ranks: a GradScaler in every respect here.
    "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler",
}

CLIP_GRAD = {
    "torch.nn.utils.clip_grad_norm_",
    "torch.nn.utils.clip_grad_norm",
    "torch.nn.utils.clip_grad_value_",
    "torch.nn.utils.clip_grad.clip_grad_norm_",
    "torch.nn.utils.clip_grad.clip_grad_norm",
    "torch.nn.utils.clip_grad.clip_grad_value_",
    "torch.nn.utils.clip_grads_with_norm_",
    "torch.nn.utils.clip_grad.clip_grads_with_norm_",
}
# Wrappers that hand a module back sharded, replicated or compiled: running the wrapper runs the module.
MODULE_WRAPPERS = frozenset({
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
    "torch.compile",
})
# What accelerate's Accelerator and Lightning's Fabric wrap a module with.
FRAMEWORK_WRAPPING_METHODS = frozenset({"prepare", "prepare_model", "setup", "setup_module"})
# Builtins that only look at an object (its type, identity or text): `print(type(model))` does not
# run a model (AMP002's frozen-model exemption; the slicer keeps a file's own function so named).
INSPECTION_BUILTINS = frozenset({"type", "isinstance", "id", "str", "repr", "print", "hasattr"})
# Take the gradients' norm and clip nothing (a logged maximum, a norm handed to
# `clip_grads_with_norm_` later): read before `unscale_`, it is scale x norm.
GRAD_NORM = {"torch.nn.utils.get_total_norm", "torch.nn.utils.clip_grad.get_total_norm"}

AUTOGRAD_BACKWARD = {"torch.autograd.backward"}
AUTOGRAD_FUNCTION = {"torch.autograd.Function", "torch.autograd.function.Function"}

LOW_PRECISION_DTYPES = {"torch.float16", "torch.half", "torch.bfloat16"}
LOW_PRECISION_TENSOR_TYPES = {
    "torch.HalfTensor",
    "torch.BFloat16Tensor",
    "torch.cuda.HalfTensor",
    "torch.cuda.BFloat16Tensor",
}

FUNCTOOLS_PARTIAL = {"functools.partial"}

# Autocast signatures: the new API takes the device first; the deprecated classes do not.
AUTOCAST_POSITIONAL = {
    "new": ("device_type", "dtype", "enabled", "cache_enabled"),
    "deprecated": ("enabled", "dtype", "cache_enabled"),
}

# Star-import sources whose public names the resolver knows.
STAR_EXPORTS = {
    "torch.cuda.amp": {"autocast", "GradScaler", "custom_fwd", "custom_bwd"},
    "torch.cpu.amp": {"autocast", "GradScaler"},
    "torch.amp": {"autocast", "GradScaler", "custom_fwd", "custom_bwd"},
    "torch.nn.utils": {"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm"},
    "torch": {"autocast"},
}

# What code reads or calls on an optimizer: any other attribute (`opt.niter`) says the name holds
# something else, such as parsed command-line options.
OPTIMIZER_ATTRIBUTES = frozenset({
    "step", "zero_grad", "param_groups", "state", "state_dict", "load_state_dict", "defaults",
    "add_param_group", "optimizer", "register_step_pre_hook", "register_step_post_hook", "train", "eval",
    "consolidate_state_dict", "synchronize", "skip_synchronize", "backward", "pre_step", "post_step",
    "loss_scale", "cur_scale", "update_scale", "clip_grad_norm", "clip_master_grads", "get_lr",
})

EXIT_STACKS = frozenset({"contextlib.ExitStack", "contextlib.AsyncExitStack"})
# What code enters instead of autocast when AMP is off (`autocast if amp else suppress`).
NO_OP_CONTEXTS = frozenset({"contextlib.suppress", "contextlib.nullcontext"})

TORCH_OPTIMIZER_PREFIXES = (
    "torch.optim.", "bitsandbytes.optim.", "apex.optimizers.", "timm.optim.", "transformer_engine.pytorch.optimizers.",
)
THIRD_PARTY_OPTIMIZERS = {"transformers.AdamW", "transformers.Adafactor", "transformers.optimization.AdamW"}
SCHEDULER_PREFIXES = ("torch.optim.lr_scheduler.",)
MODEL_FACTORIES = {"timm.create_model", "torch.hub.load"}
MODEL_PREFIXES = ("torchvision.models.",)
# Packages whose training loop scales the loss itself: accelerate's Accelerator, Lightning's
# precision plugins, DeepSpeed's engine, apex.amp, ColossalAI's booster, Composer's Trainer.
FRAMEWORK_PACKAGES = frozenset({"lightning", "pytorch_lightning", "accelerate", "deepspeed", "apex", "colossalai", "composer"})
# Their helper modules hand them nothing: `from accelerate.utils import set_seed`.
_FRAMEWORK_HELPERS = re.compile(r"\.(?:utils?|utilities|internal|testing|test_utils|logging|ops|optimizers|normalization|parallel|data)(?:\.|$)")
# Objects of those frameworks whose `backward(loss)` and `clip_grad_norm_(...)` scale and unscale
# for the caller (`accelerator.backward`, `engine.clip_grad_norm_`).
FRAMEWORK_OWNERS = ("accelerator", "fabric", "engine", "model_engine", "trainer", "strategy")


# apex is mostly fused kernels (`apex.mlp`, `apex.fused_dense`, `apex.contrib.*`): only these of its
# modules scale a loss (`amp.scale_loss`, `FP16_Optimizer`, Megatron's GradScaler).
_APEX_LOSS_SCALING = re.compile(r"apex(?:\.(?:amp|fp16_utils|transformer\.amp)(?:\..*)?)?")


def imports_a_framework(qualname: str) -> bool:
    """Whether an imported name (`accelerate.Accelerator`, `deepspeed`, `apex.amp`) brings a
    framework that scales the loss for the code that uses it."""
    package = qualname.split(".")[0]
    if package == "apex":
        return _APEX_LOSS_SCALING.fullmatch(qualname) is not None
    return package in FRAMEWORK_PACKAGES and not _FRAMEWORK_HELPERS.search(qualname)


# A name that says it holds a loss scaler (`scaler`, `grad_scaler`, timm's `NativeScaler`), in any
# case; not scikit-learn's feature scalers (`StandardScaler`, `MinMaxScaler`, ...).
SCALER_WORD = re.compile(
    r"(?<!standard)(?<!standard_)(?<!minmax)(?<!min_max)(?<!robust)(?<!maxabs)(?<!max_abs)scaler", re.IGNORECASE
)
# A loop over epochs, by what it is written with (`for epoch in range(args.epochs)`).
EPOCH = re.compile(r"epoch")
FEATURE_SCALER = re.compile(r"(?:standard|min_?max|robust|max_?abs)_?scaler|^sklearn\.", re.IGNORECASE)


def names_a_test(function_name: str) -> bool:
    """`test` or `test_...`: what pytest and unittest collect as a test."""
    return function_name == "test" or function_name.startswith("test_")


# Functions (and tensor methods) that read a tensor's values without computing with them: a
# finiteness check or a comparison at the top of an fp32 block is not low-precision arithmetic
# (AMP014, statically and at run time).
VALUE_INSPECTIONS = frozenset({"isfinite", "isnan", "isinf", "isposinf", "isneginf", "isreal", "equal", "allclose", "isclose"})


# Clocks a benchmark reads around the work it times.
CLOCKS = frozenset({
    "time.time", "time.time_ns", "time.perf_counter", "time.perf_counter_ns", "time.monotonic", "time.process_time",
    "timeit.timeit", "timeit.repeat", "timeit.default_timer", "torch.utils.benchmark.Timer",
})
# A timer, a profiler or a project's timing helper, by its name's last part (vissl's
# `with_timing(...)`, `Timer()`, `torch.profiler.profile`, `record_function`, `benchmark_fn`):
# what measures a backward, as a clock read does.
TIMING_NAME = re.compile(r"tim(?:er|ing|ed)|benchmark|profil|record_function", re.IGNORECASE)
# A Triton kernel converting what it loads (`tl.load(X + offs).to(tl.float32)`): it picks its dtypes
# (AMP013's _launches_a_converting_kernel, and what the slicer keeps for it).
CONVERTING_KERNEL = r"\.to\(\s*tl\.float32"
