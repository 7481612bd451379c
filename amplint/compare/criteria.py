"""Pass criteria: fixed in the spec before any trial runs, validated strictly, recorded in the report.

The guide (SEED.md §1, §4): fix the tolerance, the minimum quality and "no non-finite values" before
the trial; never widen a tolerance afterwards to make an awkward case disappear. So a criterion that
is misspelt, of the wrong type or negative is an error, never silently replaced by a default.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from amplint.compare.errors import CompareError

# The contract's keys first (DESIGN.md "Compare spec and report"), then amplint's extensions.
DEFAULT_CRITERIA: dict[str, object] = {
    "atol": 1e-2,
    "rtol": 0.0,
    "max_decision_changes": 0,
    "near_tie_margin": 1e-3,
    "min_quality": None,
    # Extension: how many cases may fall outside atol/rtol (their decisions still count).
    "max_out_of_tolerance_cases": 0,
}

# A per-output tolerance dict may name this key for every output it does not list.
OTHER_OUTPUTS = "*"

# Names that a failed trial lists in "failed_criteria", in this order.
FAILED_NONFINITE = "nonfinite_cases"
FAILED_TOLERANCE = "out_of_tolerance_cases"
FAILED_DECISIONS = "decision_changes"
FAILED_QUALITY = "quality"
FAILED_ERROR = "error"


@dataclass(frozen=True)
class Criteria:
    atol: float | Mapping[str, float] = 1e-2
    rtol: float | Mapping[str, float] = 0.0
    max_decision_changes: int = 0
    near_tie_margin: float = 1e-3
    min_quality: float | None = None
    max_out_of_tolerance_cases: int = 0
    explicit: frozenset[str] = field(default=frozenset(), compare=False)

    def to_json(self) -> dict:
        return {
            "atol": _plain(self.atol),
            "rtol": _plain(self.rtol),
            "max_decision_changes": self.max_decision_changes,
            "near_tie_margin": self.near_tie_margin,
            "min_quality": self.min_quality,
            "max_out_of_tolerance_cases": self.max_out_of_tolerance_cases,
        }

    def tolerance_for(self, output_name: str) -> tuple[float, float]:
        """(atol, rtol) for one named output leaf; see `check_output_names` for coverage."""
        return _pick(self.atol, output_name), _pick(self.rtol, output_name)

    def check_output_names(self, names: list[str]) -> None:
        """A per-output tolerance must cover every output and name no output that does not exist."""
        for key in ("atol", "rtol"):
            value = getattr(self, key)
            if not isinstance(value, Mapping):
                continue
            unknown = [name for name in value if name != OTHER_OUTPUTS and name not in names]
            if unknown:
                raise CompareError(
                    f"CRITERIA[{key!r}] names output {unknown[0]!r}, but the model's outputs are "
                    f"{', '.join(repr(n) for n in names)}"
                )
            missing = [name for name in names if name not in value and OTHER_OUTPUTS not in value]
            if missing:
                raise CompareError(
                    f"CRITERIA[{key!r}] gives no tolerance for output {missing[0]!r} "
                    f"(list it or add a {OTHER_OUTPUTS!r} entry)"
                )

    def describe(self) -> str:
        """One line for the terminal, printed before any trial runs."""
        return ", ".join(f"{key}={_shown_criterion(value)}" for key, value in self.to_json().items())


def changes_since(saved: Mapping, current: Mapping) -> list[str]:
    """Each criterion that differs from the one saved with a baseline, as "atol 0.001 -> 0.1"."""
    return [
        f"{key} {_shown_criterion(saved.get(key))} -> {_shown_criterion(current.get(key))}"
        for key in dict.fromkeys([*current, *saved])
        if saved.get(key) != current.get(key)
    ]


def _shown_criterion(value) -> str:
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) + "}"
    return _fmt(value)


def _pick(value: float | Mapping[str, float], name: str) -> float:
    if isinstance(value, Mapping):
        return value[name] if name in value else value[OTHER_OUTPUTS]
    return value


def _plain(value):
    return dict(value) if isinstance(value, Mapping) else value


def _fmt(value) -> str:
    if value is None:
        return "None"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def parse_criteria(raw: object) -> Criteria:
    """Validate the spec's CRITERIA (None when absent) and fill in the defaults."""
    if raw is None:
        return Criteria()
    if not isinstance(raw, Mapping):
        raise CompareError(f"CRITERIA must be a dict, got {type(raw).__name__}")
    values: dict[str, object] = {}
    for key, value in raw.items():
        if key not in DEFAULT_CRITERIA:
            close = difflib.get_close_matches(str(key), DEFAULT_CRITERIA, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(DEFAULT_CRITERIA)})"
            raise CompareError(f"CRITERIA: unknown key {key!r}{hint}")
        values[key] = _validate(key, value)
    return Criteria(**values, explicit=frozenset(values))


def _validate(key: str, value: object) -> object:
    if key in ("atol", "rtol"):
        if isinstance(value, Mapping):
            if not value:
                raise CompareError(f"CRITERIA[{key!r}] is an empty dict; give a number or one per output")
            return {str(name): _tolerance(f"CRITERIA[{key!r}][{name!r}]", v) for name, v in value.items()}
        return _tolerance(f"CRITERIA[{key!r}]", value)
    if key == "near_tie_margin":
        return _tolerance(f"CRITERIA[{key!r}]", value)
    if key in ("max_decision_changes", "max_out_of_tolerance_cases"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise CompareError(f"CRITERIA[{key!r}] must be a whole number, got {_shown(value)}")
        if value < 0:
            raise CompareError(f"CRITERIA[{key!r}] must be >= 0, got {value}")
        return value
    if key == "min_quality":
        if value is None:
            return None
        return _number(f"CRITERIA[{key!r}]", value)
    raise AssertionError(key)  # pragma: no cover - DEFAULT_CRITERIA and this function move together


def _number(where: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CompareError(f"{where} must be a number, got {_shown(value)}")
    number = float(value)
    if not math.isfinite(number):
        raise CompareError(f"{where} must be finite, got {value}")
    return number


def _tolerance(where: str, value: object) -> float:
    number = _number(where, value)
    if number < 0:
        raise CompareError(f"{where} must be >= 0, got {value}")
    return number


def _shown(value: object) -> str:
    return f"{type(value).__name__} {value!r}"
