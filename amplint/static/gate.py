"""Which rules could fire on a file, decided from its raw bytes before any parse.

Each rule lists text that must occur in any file it can flag, whatever the import spelling:
every alias still has to import the original name once. A file that passes no gate is never
parsed, and libcst is never imported for it. A property test checks that every INVALID fixture
and rule example passes its rule's gate, so the gate never costs recall.
"""

from __future__ import annotations

import re

# Whole words: every spelling that reaches torch's autocast names `autocast` itself somewhere
# (`torch.autocast`, `autocast_mode.autocast`, an import), unlike `_autocast_to_full_precision`.
_AUTOCAST = re.compile(rb"\bautocast\b")
_UNSCALE = re.compile(rb"\bunscale_\b")


def _autocast(source: bytes) -> bool:
    return b"autocast" in source and _AUTOCAST.search(source) is not None


_AMP_WORD = re.compile(rb"\bamp\b|autocast_(?:gpu|cpu|xla|ipu)_")
_CONVERSION = re.compile(rb"half|float16", re.IGNORECASE)


def _amp001(source: bytes) -> bool:
    return (b"amp" in source or b"autocast_" in source) and _AMP_WORD.search(source) is not None


def _amp002(source: bytes) -> bool:
    return (_autocast(source) or b"GradScaler" in source) and _CONVERSION.search(source) is not None


def _amp003(source: bytes) -> bool:
    return _autocast(source) and (b"backward" in source or b"step" in source)


def _amp004(source: bytes) -> bool:
    return b"GradScaler" in source


# A scaled backward needs a `.scale(...)` call; a scaler is constructed, scales, or is named so.
_SCALE_CALL = re.compile(rb"\.scale\s*\(")
# Mirrors AmpFacts.is_scaler: constructed, scaling a backward, unscaling, or a `*scaler*.step(`.
_SCALER = re.compile(rb"GradScaler|\.scale\s*\(|\bunscale_\b|get_scale|(?i:scaler)\w*\s*\.\s*(?:step|update|scale)\b")
_GRADIENTS = re.compile(rb"clip_grad|\.grad\b|get_total_norm")


def _amp005(source: bytes) -> bool:
    return b"scale" in source and _SCALE_CALL.search(source) is not None and _GRADIENTS.search(source) is not None


def _amp006(source: bytes) -> bool:
    return b"step" in source and _SCALE_CALL.search(source) is not None


def _scaler_steps(source: bytes) -> bool:
    """AMP007 and AMP011: a scaler's step or update."""
    return (b"step" in source or b"update" in source) and _SCALER.search(source) is not None


def _amp008(source: bytes) -> bool:
    return b"unscale_" in source and _UNSCALE.search(source) is not None


def _amp009(source: bytes) -> bool:
    return _autocast(source) and b"backward" in source


def _amp010(source: bytes) -> bool:
    return b"GradScaler" in source and b"bfloat16" in source or b"GradScaler" in source and b"cpu" in source


def _amp012(source: bytes) -> bool:
    return b"GradScaler" in source and (b"save" in source or b"load_state_dict" in source)


def _amp013(source: bytes) -> bool:
    amp_aware = _autocast(source) or b"GradScaler" in source or b"custom_fwd" in source or b"custom_bwd" in source
    return amp_aware and b"Function" in source


_THREADS = re.compile(rb"Thread|submit|Executor|Pool|\.map\(|apply_async|imap|starmap")


def _amp015(source: bytes) -> bool:
    return _autocast(source) and _THREADS.search(source) is not None


def _amp017(source: bytes) -> bool:
    return _autocast(source) and b"compile" in source and b"backward" in source


def _amp014(source: bytes) -> bool:
    """A region switched off by a literal `False` inside another."""
    return _autocast(source) and b"False" in source


_AMP016_DTYPES = re.compile(rb"float32|float64|double|torch\.float\b|bfloat16|binary_cross_entropy|BCELoss")


def _amp016(source: bytes) -> bool:
    """A dtype autocast ignores, bfloat16 (on CUDA), or binary cross-entropy."""
    return _autocast(source) and _AMP016_DTYPES.search(source) is not None


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
    return frozenset(code for code in enabled if code != "AMP000" and GATES.get(code, _always)(source))


def _always(source: bytes) -> bool:
    return True
