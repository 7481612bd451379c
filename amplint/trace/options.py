"""What the user asked `amplint trace` to do. Plain data, no torch, so it can be validated before
the (slow) torch import and passed around by tests."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

NAN_MODES = ("off", "cheap", "module", "op")
PROBE_DTYPES = ("float16", "bfloat16")
PROBE_DEVICES = ("cpu", "cuda")


class TraceUsageError(ValueError):
    """Bad input from the user: reported as one line, exit status 2."""


@dataclass
class TraceOptions:
    target: str  # a script path, or a module name when `module` is true
    args: list[str] = field(default_factory=list)
    module: bool = False
    json_path: str | None = None
    html_path: str | None = None
    strict: bool = False
    nan: str = "cheap"
    nan_from_step: int = 0
    probe_dtypes: tuple[str, ...] = ()
    probe_device: str | None = None  # None: the device the run used
    simulate: str | None = None
    record_ops: bool = True
    quiet: bool = False
    # Where the script's own paths are resolved from (tests run the CLI in other folders).
    cwd: str = field(default_factory=os.getcwd)

    def validate(self) -> None:
        if self.nan not in NAN_MODES:
            raise TraceUsageError(f"--nan must be one of {', '.join(NAN_MODES)}, not {self.nan!r}")
        for dtype in self.probe_dtypes:
            if dtype not in PROBE_DTYPES:
                raise TraceUsageError(
                    f"--probe-dtype accepts {', '.join(PROBE_DTYPES)} (comma-separated), not {dtype!r}"
                )
        if self.probe_device is not None and self.probe_device not in PROBE_DEVICES:
            raise TraceUsageError(f"--probe-device must be cpu or cuda, not {self.probe_device!r}")
        if self.probe_device is not None and not self.probe_dtypes:
            raise TraceUsageError("--probe-device needs --probe-dtype (which dtypes to probe)")
        if self.simulate not in (None, "cuda"):
            raise TraceUsageError(f"--simulate accepts only 'cuda', not {self.simulate!r}")
        if self.nan_from_step < 0:
            raise TraceUsageError("--nan-from-step must be 0 or more")
        if self.nan_from_step and self.nan not in ("module", "op"):
            raise TraceUsageError("--nan-from-step delays the `module` and `op` checks: use it with --nan module or --nan op")
        if not self.module:
            path = os.path.join(self.cwd, self.target)
            if not os.path.exists(path):
                raise TraceUsageError(f"no such script: {self.target}")
            if os.path.isdir(path) and not os.path.exists(os.path.join(path, "__main__.py")):
                raise TraceUsageError(f"{self.target} is a directory without a __main__.py")
        elif not self.target or any(not part.isidentifier() for part in self.target.split(".")):
            raise TraceUsageError(f"not a module name: {self.target!r}")
        for flag, path in (("--json", self.json_path), ("--html", self.html_path)):
            if path is None:
                continue
            folder = os.path.dirname(os.path.join(self.cwd, path)) or "."
            if not os.path.isdir(folder):
                raise TraceUsageError(f"{flag}: folder does not exist: {os.path.dirname(path)}")
            if path.endswith((".py", ".pyw")) and os.path.exists(os.path.join(self.cwd, path)):
                raise TraceUsageError(f"{flag}: {path} is Python source; the report would overwrite it")
        if self.json_path is not None and self.json_path == self.html_path:
            raise TraceUsageError("--json and --html name the same file")


def parse_dtype_list(value: str | None) -> tuple[str, ...]:
    if not value:
        return ()
    aliases = {"fp16": "float16", "half": "float16", "bf16": "bfloat16"}
    names = [aliases.get(v.strip().lower(), v.strip().lower()) for v in value.split(",") if v.strip()]
    return tuple(dict.fromkeys(names))
