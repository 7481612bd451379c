"""Which rules could fire on a file, decided from its raw bytes before any parse.

Each rule lists text that must occur in any file it can flag, whatever the import spelling:
every alias still has to import the original name once. A file in a folder that passes no
gate is never parsed (one named on the command line gets only CPython's syntax check), and libcst
is never imported for it. A property test checks that every INVALID fixture
and rule example passes its rule's gate, so the gate never costs recall.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

from amplint.static import names


@dataclass
class _Text:
    """A file's bytes, its lower-case form for the case-insensitive words, and the answers
    already given: several gates ask for the same word, and each scan reads the whole file."""

    raw: bytes
    _found: dict[bytes, bool] = field(default_factory=dict)
    _whole: dict[bytes, bool] = field(default_factory=dict)

    def has(self, word: bytes) -> bool:
        if word not in self._found:
            part = _PART_OF.get(word)
            self._found[word] = (part is None or self.has(part)) and word in self.raw
        return self._found[word]

    def whole_word(self, word: bytes) -> bool:
        """One of _WHOLE_WORDS present as a whole word."""
        if word not in self._whole:
            self._whole[word] = self.has(word) and _WHOLE_WORDS[word].search(self.raw) is not None
        return self._whole[word]

    @cached_property
    def lower(self) -> bytes:
        return self.raw.lower()

    @cached_property
    def scale_call(self) -> bool:
        return self.has(b".scale") and _SCALE_CALL.search(self.raw) is not None


# A word that can only be present where a shorter one is: files without the short one (most of
# them) answer for the long ones without another scan.
_PART_OF = {
    b"GradScaler": b"cale",
    b".scale": b"cale",
    b"unscale_": b"cale",
    b"get_scale": b"cale",
    b"custom_fwd": b"custom_",
    b"custom_bwd": b"custom_",
    b"is_autocast_": b"autocast",
    b"get_autocast_": b"autocast",
}


def _word(word: bytes) -> re.Pattern[bytes]:
    """`word` as a whole word. The literal comes first so that `re` scans for it at C speed (a
    leading `\\b` or alternation makes it try every position: 5x slower on a large tree)."""
    escaped = re.escape(word)
    return re.compile(escaped + rb"(?<!\w" + escaped + rb")\b")


# Whole words: every spelling that reaches torch's autocast names `autocast` itself somewhere
# (`torch.autocast`, `autocast_mode.autocast`, an import), unlike `_autocast_to_full_precision`;
# a scaler's `unscale_` and `get_scale` are not `_amp_..._unscale_` or `get_scale_value`.
_WHOLE_WORDS = {word: _word(word) for word in (b"autocast", b"unscale_", b"get_scale")}
# The deprecated API lives under `torch.cuda.amp` / `torch.cpu.amp`, however it is imported
# (`from torch.cuda import amp`, `import torch.cuda as tc; tc.amp`); `torch.amp` is its
# replacement, so an `amp` that follows `torch.` leads to nothing deprecated.
_DEPRECATED_AMP = re.compile(rb"amp(?<!\wamp)(?<!torch\.amp)\b")
_AUTOCAST_DEVICE = re.compile(rb"autocast_(?:gpu|cpu|xla|ipu)_")


def _amp001(text: _Text) -> bool:
    return _DEPRECATED_AMP.search(text.raw) is not None or (text.has(b"autocast") and _AUTOCAST_DEVICE.search(text.raw) is not None)


def _amp002(text: _Text) -> bool:
    if not (text.has(b"GradScaler") or text.whole_word(b"autocast")):
        return False
    return b"half" in text.lower or b"float16" in text.lower


def _amp003(text: _Text) -> bool:
    return text.whole_word(b"autocast") and (text.has(b"backward") or text.has(b"step"))


def _amp004(text: _Text) -> bool:
    return text.has(b"GradScaler")


# A scaled backward needs a `.scale(...)` call; a scaler is constructed, scales, or is named so.
_SCALE_CALL = re.compile(rb"\.scale\s*\(")
_GRAD_ATTRIBUTE = re.compile(rb"\.grad\b")
# A `*scaler*.step(` / `.update(` / `.scale(`, searched in the lower-case text.
_SCALER_NAME = re.compile(rb"scaler\w*\s*\.\s*(?:step|update|scale)\b")


def _scaler(text: _Text) -> bool:
    """Mirrors AmpFacts.is_scaler: constructed, scaling a backward, unscaling, or a `*scaler*.step(`."""
    return (
        text.has(b"GradScaler")
        or text.whole_word(b"get_scale")
        or text.scale_call
        or text.whole_word(b"unscale_")
        or (b"scaler" in text.lower and _SCALER_NAME.search(text.lower) is not None)
    )


# accelerate's `accelerator.backward(loss)` scales the loss: called on a name that says so, or in a
# file that imports accelerate (`acc = Accelerator()`); `torch.accelerator` is neither. So do
# Lightning's `fabric.backward(loss)` and `self.manual_backward(loss)`.
_ACCELERATOR_BACKWARD = re.compile(rb"accelerator\s*\.\s*backward\s*\(")


def _scaled_by_a_framework(text: _Text) -> bool:
    return text.has(b"backward") and (
        text.has(b"accelerate")
        or _ACCELERATOR_BACKWARD.search(text.raw) is not None
        or text.has(b"manual_backward")  # a LightningModule's, under the Trainer's precision
        or text.has(b"abric")  # Lightning Fabric's `fabric.backward(loss)`, `Fabric(...)`
    )


def _amp005(text: _Text) -> bool:
    if not (text.scale_call or _scaled_by_a_framework(text)):
        return False
    return (
        text.has(b"clip_grad")
        or text.has(b"get_total_norm")
        or _GRAD_ATTRIBUTE.search(text.raw) is not None
        or b"grad_norm" in text.lower  # a gradient-norm helper from another file
        or b"gradnorm" in text.lower
    )


def _amp006(text: _Text) -> bool:
    return text.scale_call and text.has(b"step")


def _scaler_steps(text: _Text) -> bool:
    """AMP007 and AMP011: a scaler's step or update. The words come first: `_scaler` lowers
    the whole file to find a name like `Scaler`."""
    return (text.has(b"step") or text.has(b"update")) and _scaler(text)


def _amp008(text: _Text) -> bool:
    return text.whole_word(b"unscale_")


def _amp009(text: _Text) -> bool:
    return text.whole_word(b"autocast") and text.has(b"backward")


def _amp010(text: _Text) -> bool:
    return text.has(b"GradScaler") and (text.has(b"bfloat16") or text.has(b"bf16") or text.has(b"cpu"))


def _amp012(text: _Text) -> bool:
    # A scaler of its own, or accelerate's when it may run in fp16 (`Accelerator(mixed_precision=...)`,
    # imported from accelerate: AMP005's gate has often looked for that word already).
    scaler = text.has(b"GradScaler") or (text.has(b"accelerate") and text.has(b"mixed_precision"))
    # A checkpoint: saved, restored, or handed to a helper named for writing one (`write_checkpoint`).
    return scaler and any(text.has(word) for word in _CHECKPOINT_WORDS)


_CHECKPOINT_WORDS = (
    b"load_state_dict", b"Checkpoint", b"checkpoint", b"ckpt", *sorted(verb.encode() for verb in names.CHECKPOINT_WRITE_VERBS)
)


# A class with `Function` among its bases, or a name for it (`Fn = torch.autograd.Function`,
# `import Function as Fn`): where a module that only reads the autocast state defines one.
_DEFINES_A_FUNCTION = re.compile(rb"class\s+\w+\s*\([^)]*Function|=\s*[\w.]*Function\b|Function\s+as\s+\w")


def _amp013(text: _Text) -> bool:
    if not text.has(b"Function"):
        return False
    if text.has(b"GradScaler") or text.has(b"custom_fwd") or text.has(b"custom_bwd") or text.whole_word(b"autocast"):
        return True
    # `torch.is_autocast_enabled()`: written to run under autocast (see AMP013's `_amp_aware`).
    reads_state = text.has(b"is_autocast_") or text.has(b"get_autocast_")
    return reads_state and _DEFINES_A_FUNCTION.search(text.raw) is not None


_THREAD_WORDS = (b"Thread", b"submit", b"Executor", b"Pool", b".map(", b"apply_async", b"imap", b"starmap")


def _amp015(text: _Text) -> bool:
    return text.whole_word(b"autocast") and any(text.has(word) for word in _THREAD_WORDS)


def _amp017(text: _Text) -> bool:
    return text.whole_word(b"autocast") and text.has(b"compile") and text.has(b"backward")


def _amp014(text: _Text) -> bool:
    """A region switched off by a literal `False` inside another."""
    return text.whole_word(b"autocast") and text.has(b"False")


_AMP016_DTYPES = re.compile(rb"float32|float64|double|torch\.float\b|bfloat16|binary_cross_entropy|BCELoss")


def _amp016(text: _Text) -> bool:
    """A dtype autocast ignores, bfloat16 (on CUDA), or binary cross-entropy."""
    return text.whole_word(b"autocast") and _AMP016_DTYPES.search(text.raw) is not None


GATES = {
    "AMP001": _amp001,
    "AMP002": _amp002,
    "AMP003": _amp003,
    "AMP004": _amp004,
    "AMP005": _amp005,
    "AMP006": _amp006,
    "AMP007": _scaler_steps,
    "AMP008": _amp008,
    "AMP009": _amp009,
    "AMP010": _amp010,
    "AMP011": _scaler_steps,
    "AMP012": _amp012,
    "AMP013": _amp013,
    "AMP014": _amp014,
    "AMP015": _amp015,
    "AMP016": _amp016,
    "AMP017": _amp017,
}


def possible_rules(source: bytes, enabled: AbstractSet[str]) -> frozenset[str]:
    """The enabled rules this file could trigger. Rules without a gate are always possible."""
    text = _Text(source)
    possible: list[str] = []
    for gate, codes in _gates_of(frozenset(enabled)):
        if gate(text):
            possible.extend(codes)
    return frozenset(possible)


@lru_cache(maxsize=8)
def _gates_of(enabled: frozenset[str]) -> tuple[tuple[Callable[[_Text], bool], tuple[str, ...]], ...]:
    """Each distinct gate once, with the enabled rules it answers for: a gate shared by two
    rules runs once, and a run over thousands of files sorts them out once."""
    codes_of: dict[Callable[[_Text], bool], list[str]] = {}
    for code in sorted(enabled - {"AMP000"}):
        codes_of.setdefault(GATES.get(code, _always), []).append(code)
    return tuple((gate, tuple(codes)) for gate, codes in codes_of.items())


def _always(text: _Text) -> bool:
    return True
