"""The base of the tracer's dispatch modes: Dynamo kept out of their frames, loaded by the script.

torch wraps the `__torch_dispatch__` of every TorchDispatchMode subclass in
`torch._disable_dynamo`, so that a compiled region never compiles the mode's own frames; that
wrapper imports torch._dynamo at the first op (1.5-2 s of CPU). A script that never loads Dynamo
would pay for it only because it is traced. Here the mode's frames are kept from Dynamo the same
way from the first op after the script itself loaded torch._dynamo (nothing can be compiling
before: `torch.compile` imports it), and the frame of the wrapper that decides is marked, through
torch's C API, as one Dynamo never compiles. A torch without that API keeps its own wrapper.
"""

from __future__ import annotations

import functools
import sys

from torch.utils._python_dispatch import TorchDispatchMode


def _kept_from_dynamo(dispatch):
    disabled = None

    @functools.wraps(dispatch)
    def dispatch_outside_dynamo(self, func, types, args=(), kwargs=None):
        nonlocal disabled
        if disabled is None:
            # Until `torch._dynamo.disable` is bound, Dynamo is not even imported in full.
            disable = getattr(sys.modules.get("torch._dynamo"), "disable", None)
            if disable is None:
                return dispatch(self, func, types, args, kwargs)
            disabled = disable(dispatch, recursive=True)
        return disabled(self, func, types, args, kwargs)

    return dispatch_outside_dynamo


def _never_compiled(code) -> bool:
    """Mark a code object as one Dynamo skips (what `torch._dynamo.eval_frame.skip_code` does),
    without importing torch._dynamo; False where this torch has no such API."""
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
    except ImportError:
        return False
    set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.DEFAULT))
    return True


_LAZY = _never_compiled(_kept_from_dynamo(None).__code__)


class TracerDispatchMode(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return not _LAZY  # with the lazy wrapper below, torch's eager one is not wanted

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if _LAZY and "__torch_dispatch__" in cls.__dict__:
            cls.__torch_dispatch__ = _kept_from_dynamo(cls.__dict__["__torch_dispatch__"])
