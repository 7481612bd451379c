"""Which rules could fire on a file, decided from its raw bytes before any parse.

Each rule lists text that must occur in any file it can flag, whatever the import spelling:
every alias still has to import the original name once. A file in a folder that passes no
gate is never parsed (one named on the command line gets only CPython's syntax check), and libcst
is never imported for it. A property test checks that every INVALID fixture
and rule example passes its rule's gate, so the gate never costs recall.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property


@dataclass
class _Text:
    """A file's bytes, and their lower-case form for the case-insensitive words."""

    raw: bytes

    @cached_property
    def lower(self) -> bytes:
        return self.raw.lower()


def _word(word: bytes) -> re.Pattern[bytes]:
    """`word` as a whole word. The literal comes first so that `re` scans for it at C speed (a
    leading `\\b` or alternation makes it try every position: 5x slower on a large tree)."""
    escaped = re.escape(word)
    return re.compile(escaped + rb"(?<!\w" + escaped + rb")\b")


# Whole words: every spelling that reaches torch's autocast names `autocast` itself somewhere
# (`torch.autocast`, `autocast_mode.autocast`, an import), unlike `_autocast_to_full_precision`.
_AUTOCAST = _word(b"autocast")
_UNSCALE = _word(b"unscale_")
# The deprecated API lives under `torch.cuda.amp` / `torch.cpu.amp`, however it is imported
# (`from torch.cuda import amp`, `import torch.cuda as tc; tc.amp`); `torch.amp` is its
# replacement, so an `amp` that follows `torch.` leads to nothing deprecated.
_DEPRECATED_AMP = re.compile(rb"amp(?<!\wamp)(?<!torch\.amp)\b")
_AUTOCAST_DEVICE = re.compile(rb"autocast_(?:gpu|cpu|xla|ipu)_")


def _autocast(text: _Text) -> bool:
    return b"autocast" in text.raw and _AUTOCAST.search(text.raw) is not None


def _amp001(text: _Text) -> bool:
    return _DEPRECATED_AMP.search(text.raw) is not None or _AUTOCAST_DEVICE.search(text.raw) is not None


def _amp002(text: _Text) -> bool:
    converts = b"half" in text.lower or b"float16" in text.lower
    return converts and (b"GradScaler" in text.raw or _autocast(text))


def _amp003(text: _Text) -> bool:
    return _autocast(text) and (b"backward" in text.raw or b"step" in text.raw)


def _amp004(text: _Text) -> bool:
    return b"GradScaler" in text.raw


# A scaled backward needs a `.scale(...)` call; a scaler is constructed, scales, or is named so.
_SCALE_CALL = re.compile(rb"\.scale\s*\(")
_GRAD_ATTRIBUTE = re.compile(rb"\.grad\b")
# A `*scaler*.step(` / `.update(` / `.scale(`, searched in the lower-case text.
_SCALER_NAME = re.compile(rb"scaler\w*\s*\.\s*(?:step|update|scale)\b")


def _scaler(text: _Text) -> bool:
    """Mirrors AmpFacts.is_scaler: constructed, scaling a backward, unscaling, or a `*scaler*.step(`."""
    raw = text.raw
    return (
        b"GradScaler" in raw
        or b"get_scale" in raw
        or _SCALE_CALL.search(raw) is not None
        or _UNSCALE.search(raw) is not None
        or (b"scaler" in text.lower and _SCALER_NAME.search(text.lower) is not None)
    )


def _amp005(text: _Text) -> bool:
    raw = text.raw
    gradients = b"clip_grad" in raw or b"get_total_norm" in raw or _GRAD_ATTRIBUTE.search(raw) is not None
    return gradients and _SCALE_CALL.search(raw) is not None


def _amp006(text: _Text) -> bool:
    return b"step" in text.raw and _SCALE_CALL.search(text.raw) is not None


def _scaler_steps(text: _Text) -> bool:
    """AMP007 and AMP011: a scaler's step or update."""
    return (b"step" in text.raw or b"update" in text.raw) and _scaler(text)


def _amp008(text: _Text) -> bool:
    return _UNSCALE.search(text.raw) is not None


def _amp009(text: _Text) -> bool:
    return _autocast(text) and b"backward" in text.raw


def _amp010(text: _Text) -> bool:
    return b"GradScaler" in text.raw and (b"bfloat16" in text.raw or b"cpu" in text.raw)


def _amp012(text: _Text) -> bool:
    return b"GradScaler" in text.raw and (b"save" in text.raw or b"load_state_dict" in text.raw)


def _amp013(text: _Text) -> bool:
    raw = text.raw
    amp_aware = b"GradScaler" in raw or b"custom_fwd" in raw or b"custom_bwd" in raw or _autocast(text)
    return b"Function" in raw and amp_aware


_THREAD_WORDS = (b"Thread", b"submit", b"Executor", b"Pool", b".map(", b"apply_async", b"imap", b"starmap")


def _amp015(text: _Text) -> bool:
    return _autocast(text) and any(word in text.raw for word in _THREAD_WORDS)


def _amp017(text: _Text) -> bool:
    return _autocast(text) and b"compile" in text.raw and b"backward" in text.raw


def _amp014(text: _Text) -> bool:
    """A region switched off by a literal `False` inside another."""
    return _autocast(text) and b"False" in text.raw


_AMP016_DTYPES = re.compile(rb"float32|float64|double|torch\.float\b|bfloat16|binary_cross_entropy|BCELoss")


def _amp016(text: _Text) -> bool:
    """A dtype autocast ignores, bfloat16 (on CUDA), or binary cross-entropy."""
    return _autocast(text) and _AMP016_DTYPES.search(text.raw) is not None


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


def possible_rules(source: bytes, enabled: frozenset[str]) -> frozenset[str]:
    """The enabled rules this file could trigger. Rules without a gate are always possible."""
    text = _Text(source)
    answers: dict = {}  # a gate shared by two rules runs once
    possible = []
    for code in enabled:
        if code == "AMP000":
            continue
        gate = GATES.get(code, _always)
        if gate not in answers:
            answers[gate] = gate(text)
        if answers[gate]:
            possible.append(code)
    return frozenset(possible)


def _always(text: _Text) -> bool:
    return True
