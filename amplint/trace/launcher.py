"""Run the user's script (or module) as `__main__`, exactly as `python SCRIPT ARGS` would, and
record how it ended instead of letting it end the process: the report must be written first.

What Python does when a script ends happens here too, in Python's order, before the report: the
traceback of an uncaught exception is printed, the script's non-daemon threads are waited for (an
asynchronous checkpoint writer finishes), then the `atexit` handlers the script registered run (a
save-on-exit checkpoint is part of the run). The caller exits with `exit_code`.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import functools
import os
import runpy
import signal
import struct
import sys
import threading
import traceback
import types
import zipfile
from dataclasses import dataclass
from importlib.machinery import PathFinder, SourceFileLoader
from types import TracebackType

import amplint

_HERE = os.path.dirname(os.path.abspath(__file__))
_AMPLINT_DIR = os.path.dirname(_HERE)
# torch's frames that only run because amplint's modes sit between the script and torch: the
# wrappers torch puts around a mode's `__torch_dispatch__`/`__torch_function__` (before amplint's
# frame), and the Python call of the operator the mode makes (after it), which a plain run's
# dispatcher makes from C.
_HANDED_TO_MODE = {(os.path.join("torch", "overrides.py"), "handle_torch_function")}
_MODE_ENTRY_FRAMES = {
    (os.path.join("torch", "_compile.py"), "inner"),
    (os.path.join("torch", "_dynamo", "eval_frame.py"), "_fn"),
    *_HANDED_TO_MODE,
}
_MODE_EXIT_FRAMES = {(os.path.join("torch", "_ops.py"), "__call__")}


@dataclass
class RunOutcome:
    status: str  # "ok" | "exception" | "exit"
    code: int
    exception: BaseException | None = None  # the script's uncaught exception (its traceback is printed)
    message: str | None = None  # "RuntimeError: ..." for the report

    @property
    def exit_code(self) -> int:
        return self.code


def resolve_target(target: str, module: bool, cwd: str) -> tuple[str, str | None]:
    """(absolute path of the code that runs as __main__, module name or None)."""
    if not module:
        path = path_as_opened(os.path.join(cwd, target))
        if os.path.isdir(path):
            path = os.path.join(path, "__main__.py")
        return path, None
    search_path = _sys_path_for_main(cwd)  # where `python -m` looks for the name
    spec = _find_without_importing(target, search_path)
    if spec is None:
        raise LookupError(f"no module named {target!r}")
    if spec.submodule_search_locations is not None:  # a package: runs pkg.__main__
        main_spec = _find_without_importing(f"{target}.__main__", search_path)
        if main_spec is None or not main_spec.origin:
            raise LookupError(f"{target!r} is a package and cannot be directly executed (no __main__)")
        return path_as_opened(main_spec.origin), target
    if not spec.origin or not os.path.exists(spec.origin):
        raise LookupError(f"module {target!r} has no source file to run")
    return path_as_opened(spec.origin), target


def path_as_opened(path: str) -> str:
    """The absolute path, without `..`, of the file the system opens for `path`. `os.path.abspath`
    drops the folder before a `..` by spelling alone, which names another file when that folder
    is a symlink (`L/../train.py` with `L -> real/a/sub` is `real/a/train.py`, as `python` runs
    it): the part up to the last `..` is resolved on the file system, the rest is kept as written
    (a symlinked script keeps its own name, as its `__file__` does under `python`)."""
    parts = path.split(os.sep)
    if os.pardir not in parts:
        return os.path.abspath(path)
    last_step_up = len(parts) - 1 - parts[::-1].index(os.pardir)
    resolved = os.path.realpath(os.sep.join(parts[: last_step_up + 1]))
    return os.path.abspath(os.path.join(resolved, *parts[last_step_up + 1 :]))


def script_import_folder(path: str) -> str:
    """The folder `python SCRIPT` puts first on sys.path: the real one of a symlinked script, where
    the modules it imports sit."""
    return os.path.dirname(os.path.realpath(path))


def _sys_path_for_main(folder: str) -> list[str]:
    """sys.path as `python SCRIPT` (`folder`: the script's) or `python -m` (the current folder)
    starts it: `folder` first, in the place of the entry Python put there for amplint's own start
    (its console script's folder, or the current folder under `python -m amplint`), which a plain
    run does not have. Under `-P`/PYTHONSAFEPATH Python puts no such entry, for either."""
    if sys.flags.safe_path:
        return sys.path[:]
    return [folder, *sys.path[1:]]


def _find_without_importing(name: str, search_path: list[str]):
    """The spec of a module found on `search_path`, its packages looked up but not imported:
    `importlib.util.find_spec("pkg.mod")` would run `pkg/__init__.py` before the trace starts."""
    parts = name.split(".")
    spec, path = None, search_path
    for depth in range(1, len(parts) + 1):
        if spec is not None and spec.submodule_search_locations is None:
            return None  # `mod.sub` where `mod` is not a package
        spec = PathFinder.find_spec(".".join(parts[:depth]), path)
        if spec is None:
            return None
        path = spec.submodule_search_locations
    return spec


class _AfterFirstImport:
    """Calls `callback()` once module `name` has been imported, in the thread that imported it,
    before that import statement returns (at once if it already was). So the script's own
    `import torch` loads torch, and torch reads the environment the script prepared
    (OMP_NUM_THREADS set just before the import), as under `python`; the instrumentation goes in
    before the script's next line. The module and the callback load inside `process_context`:
    what they register for the process's exit (torch frees its op libraries, logging closes its
    files) is not the script's. A meta path finder: it finds the module as the finders after it
    do and wraps that loader's `exec_module`. It stays in place until the module is loaded:
    `importlib.util.find_spec("torch")` (an availability check) asks it too, and loads nothing."""

    def __init__(self, name: str, callback, process_context) -> None:
        self.name, self.callback, self.process_context = name, callback, process_context

    def __enter__(self) -> _AfterFirstImport:
        if self.name in sys.modules:
            with self.process_context():
                self.callback()
        else:
            sys.meta_path.insert(0, self)
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(ValueError):  # the module was loaded: it took itself off
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None  # not installed: the script's import fails as under `python`
        loader, load = spec.loader, spec.loader.exec_module

        def exec_module(module) -> None:
            del loader.exec_module  # the loader is its class's again
            with self.process_context():
                load(module)
                self.__exit__()
                self.callback()

        loader.exec_module = exec_module
        return spec


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_target(
    path: str,
    module_name: str | None,
    args: list[str],
    argv0: str | None = None,
    when_imported: tuple | None = None,
    strict: bool = False,
) -> RunOutcome:
    """Run the target, then what Python runs when a script ends (its traceback, the wait for its
    threads, its atexit handlers); never raises (the outcome says how it ended). `argv0` is the
    script as the user typed it: `python ../train.py` gives the script `sys.argv[0] ==
    "../train.py"`, while `python -m` gives the module's full path, which is `path`.
    `when_imported`: (module name, callback), the callback called once the script has imported
    that module (see `_AfterFirstImport`)."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [argv0 or path, *args]
    sys.path[:] = _sys_path_for_main(script_import_folder(path) if module_name is None else os.getcwd())
    shadowed = _shadowed_by_the_script(sys.path[0]) if not sys.flags.safe_path else {}
    previous_sigterm = _raise_on_sigterm()
    real_os_exit = os._exit
    os._exit = _os_exit_that_says_so(real_os_exit, strict)
    try:
        with contextlib.ExitStack() as run_context:
            exit_handlers = run_context.enter_context(_ExitHandlers())
            thread_shutdown = run_context.enter_context(_ThreadShutdown())
            if when_imported is not None:
                run_context.enter_context(_AfterFirstImport(*when_imported, exit_handlers.for_the_process))
            outcome = _run_main(path, module_name, _file_as_python_names_it(path, argv0))
            _print_script_traceback(outcome)
            with _main_thread_seen_as_ended():  # as Python's shutdown: through the atexit handlers too
                thread_shutdown.run()
                exit_handlers.run()
        return outcome
    finally:
        os._exit = real_os_exit
        if previous_sigterm is not None:
            _restore_sigterm(previous_sigterm)
        sys.argv = saved_argv
        sys.path[:] = saved_path
        sys.modules.update(shadowed)  # amplint's own later imports find what they imported


def _shadowed_by_the_script(folder: str) -> dict[str, types.ModuleType]:
    """Take out of sys.modules what amplint imported (not the interpreter at its start) and a
    module of the script's folder shadows, so that the script's `import uuid` finds its own
    `uuid.py` first, as under `python`; returns them, to put back once the run is over."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return {}
    local = {entry[:-3] for entry in entries if entry.endswith(".py")}
    local |= {entry for entry in entries if os.path.isfile(os.path.join(folder, entry, "__init__.py"))}
    shadowed = (local & sys.modules.keys()) - amplint.MODULES_AT_START - {"amplint"}
    return {
        name: sys.modules.pop(name)
        for name in list(sys.modules)
        if name.partition(".")[0] in shadowed
    }


def _file_as_python_names_it(path: str, argv0: str | None) -> str:
    """The script's `__file__` under `python`: the path as typed, joined to the working folder but
    not normalised (`python ../train.py` in `run/` gives `/home/u/run/../train.py`). `path`, the
    tracer's own name for the file, has no `..`."""
    if not argv0:
        return path
    typed = os.path.join(os.getcwd(), argv0)
    try:
        return typed if os.path.samefile(typed, path) else path
    except OSError:
        return path


def _run_main(path: str, module_name: str | None, file_name: str) -> RunOutcome:
    try:
        if module_name is None and _is_source(path):
            _run_script(path, file_name)
        elif module_name is None:
            runpy.run_path(path, run_name="__main__")  # a zipapp or a .pyc
        else:
            runpy.run_module(module_name, run_name="__main__", alter_sys=True)
        return RunOutcome("ok", 0)
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return RunOutcome("exit", 0)
        if isinstance(code, int):
            return RunOutcome("exit", _process_status(code))  # `sys.exit(True)` exits 1
        # Python prints a non-integer exit argument to stderr and exits with 1.
        print(code, file=sys.stderr)
        return RunOutcome("exit", 1, message=f"SystemExit: {code}")  # the script's own diagnosis
    except KeyboardInterrupt as exc:
        return RunOutcome("exception", 130, exc, _describe(exc))
    except BaseException as exc:  # noqa: BLE001 - the script's own failure, reported and re-printed
        return RunOutcome("exception", 1, exc, _describe(exc))


_C_LONG_BITS = 8 * struct.calcsize("l")


def _process_status(code: int) -> int:
    """The status `sys.exit(code)` ends the process with: Python reads the code as a C long (-1
    when it does not fit) and the system keeps its low byte, so `sys.exit(300)` exits 44."""
    if not -(2 ** (_C_LONG_BITS - 1)) <= code < 2 ** (_C_LONG_BITS - 1):
        code = -1
    return code & 0xFF if os.name == "posix" else code & 0xFFFFFFFF


class _ExitHandlers:
    """The `atexit` handlers registered while the script runs. Python runs them when the script
    ends, however it ends (but `os._exit`): they belong to the run, so they run before the
    report, last registered first, each with the script's `__main__` in place (a checkpoint of a
    model class defined in the script pickles by `__main__.Net`). Those registered earlier, by
    amplint's own imports, or while the script's `import torch` loads torch (`for_the_process`),
    still run when the process exits, after the report, which needs torch whole."""

    def __init__(self) -> None:
        self._handlers: list = []  # (function, args, kwargs, __main__ when it was registered)

    def __enter__(self) -> _ExitHandlers:
        self._real = atexit.register, atexit.unregister
        atexit.register, atexit.unregister = self.register, self.unregister
        return self

    def __exit__(self, *exc) -> None:
        atexit.register, atexit.unregister = self._real

    @contextlib.contextmanager
    def for_the_process(self):
        """Handlers registered meanwhile are the process's, not the run's: they run when it exits."""
        atexit.register, atexit.unregister = self._real
        try:
            yield
        finally:
            atexit.register, atexit.unregister = self.register, self.unregister

    def register(self, func, *args, **kwargs):
        if not callable(func):
            raise TypeError("the first argument must be callable")
        self._handlers.append((func, args, kwargs, sys.modules.get("__main__")))
        return func

    def unregister(self, func) -> None:
        self._handlers = [handler for handler in self._handlers if handler[0] != func]
        self._real[1](func)  # one registered before the run

    def run(self) -> None:
        # Like Python: a handler registered by a handler does not run, and a handler's exception
        # (SystemExit included) is printed and ignored: the exit status stays the script's.
        handlers, self._handlers = self._handlers, []
        saved_main = sys.modules.get("__main__")
        try:
            for func, args, kwargs, main in reversed(handlers):
                sys.modules["__main__"] = main
                try:
                    func(*args, **kwargs)
                except BaseException as exc:  # noqa: BLE001 - printed as Python prints it
                    _print_ignored(f"Exception ignored in atexit callback: {func!r}", exc)
        finally:
            sys.modules["__main__"] = saved_main


class _ThreadShutdown:
    """What Python does when the main module has ended, before the atexit handlers: it calls
    threading's exit callbacks (concurrent.futures registers one that has an executor's workers
    finish their queued work and stop), then waits for every non-daemon thread to end. The
    script's threads (a checkpoint writer) finish their work traced, and before the handlers
    that may read what they wrote. Only the run's callbacks and threads: those registered or
    started before it belong to amplint's host."""

    def __enter__(self) -> _ThreadShutdown:
        self._callbacks: list = []
        self._threads_before = set(threading.enumerate())
        self._real_register = threading._register_atexit
        threading._register_atexit = self.register
        return self

    def __exit__(self, *exc) -> None:
        threading._register_atexit = self._real_register

    def register(self, func, *args, **kwargs) -> None:
        self._callbacks.append(functools.partial(func, *args, **kwargs))

    def run(self) -> None:
        callbacks, self._callbacks = self._callbacks, []
        current = threading.current_thread()
        try:
            for callback in reversed(callbacks):
                callback()
            while pending := [
                thread
                for thread in threading.enumerate()
                if not thread.daemon and thread is not current and thread not in self._threads_before
            ]:
                for thread in pending:  # a thread may start others before it ends: look again
                    thread.join()
        except BaseException as exc:  # noqa: BLE001 - Ctrl-C stops the wait: printed, as Python does
            _print_ignored(f"Exception ignored in: {threading!r}", exc)


@contextlib.contextmanager
def _main_thread_seen_as_ended():
    """While the script's other threads are waited for and its atexit handlers run, the main
    thread counts as ended, as in Python's own shutdown (it releases the main thread's lock and
    marks it stopped first): a watchdog looping `while threading.main_thread().is_alive():` ends,
    and so does a `threading.main_thread().join()`, instead of waiting for amplint's report
    forever. Then it is alive again, as amplint is still running."""
    main = threading.main_thread()
    lock = getattr(main, "_tstate_lock", None)  # Python 3.11/3.12 internals; newer ones: no change
    if threading.current_thread() is not main or lock is None or not lock.locked() or not hasattr(main, "_is_stopped"):
        yield
        return
    lock.release()
    main._is_stopped = True
    try:
        yield
    finally:
        lock.acquire()  # a `join()` of the main thread took and released it, and cleared these
        main._tstate_lock, main._is_stopped = lock, False


def _print_ignored(heading: str, exc: BaseException) -> None:
    """An exception Python prints and ignores while the script's process ends."""
    _strip_amplint_frames(exc, set())
    stream = _stderr()
    print(heading, file=stream)
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=stream)


def _is_source(path: str) -> bool:
    return not path.endswith(".pyc") and not zipfile.is_zipfile(path)


def _run_script(path: str, file_name: str) -> None:
    """`runpy.run_path`, except that it leaves `sys.argv[0]` alone (run_path sets it to the path it
    was given, which is absolute here) and sets `__file__` as Python would (`file_name`): a fresh
    `__main__` module for the run, as Python makes."""
    with open(path, "rb") as handle:  # bytes: compile() honours a coding cookie, as Python does
        code = compile(handle.read(), path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")  # __name__, __doc__, __package__, __loader__, __spec__
    main.__dict__.update(
        __loader__=SourceFileLoader("__main__", path), __annotations__={}, __builtins__=builtins, __file__=file_name, __cached__=None
    )
    saved_main = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    finally:
        sys.modules["__main__"] = saved_main


def _os_exit_that_says_so(real_os_exit, strict: bool):
    """`os._exit` ends the process on the spot, skipping the `finally` that writes the report, as
    the script intends (it often means to skip a cleanup that hangs). Say so rather than leave the
    report missing without a word; forked children (DataLoader workers) exit silently as before.
    Under --strict a run that succeeded exits 1: nothing was checked, and a CI gate must not pass."""
    tracing_pid = os.getpid()

    def os_exit(status: int) -> None:
        if os.getpid() == tracing_pid:
            stream = sys.__stderr__ if getattr(sys.stderr, "closed", False) else sys.stderr
            print(f"amplint trace: the script called os._exit({status}), which ends the process at once: no report was written", file=stream, flush=True)
            if strict and status == 0:
                print("amplint trace: --strict: exit 1: the run ended before it could be checked", file=stream, flush=True)
                status = 1
        real_os_exit(status)

    return os_exit


def _raise_on_sigterm():
    """torchrun stops the other ranks with SIGTERM when one fails: turn it into SystemExit so the
    `finally` that writes the report runs. Only the main thread may install handlers. The script
    still sees Python's default where it asks (`signal.getsignal`, or what `signal.signal` returns):
    a handler that chains to the previous one (Lightning's, submitit's) calls it only if callable."""
    try:
        previous = signal.getsignal(signal.SIGTERM)
        if previous not in (signal.SIG_DFL, None):
            return None  # the script or a launcher already handles it
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        signal.getsignal, signal.signal = _hiding_ours(_REAL_GETSIGNAL), _hiding_ours(_REAL_SIGNAL)
        return previous
    except (ValueError, OSError):  # not the main thread
        return None


_REAL_GETSIGNAL, _REAL_SIGNAL = signal.getsignal, signal.signal


def _restore_sigterm(previous) -> None:
    signal.getsignal, signal.signal = _REAL_GETSIGNAL, _REAL_SIGNAL
    signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum, frame):
    sys.exit(128 + signum)


def _hiding_ours(function):
    """`signal.getsignal` / `signal.signal` answering SIG_DFL where they would return our handler."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        handler = function(*args, **kwargs)
        return signal.SIG_DFL if handler is _exit_on_sigterm else handler

    return wrapper


def _is_launcher_frame(filename: str) -> bool:
    return (
        filename.startswith(_AMPLINT_DIR + os.sep)
        or filename.endswith(os.sep + "runpy.py")
        or filename == "<frozen runpy>"
    )


def _is_frame_of(tb: TracebackType, functions: set) -> bool:
    code = tb.tb_frame.f_code
    return any(code.co_name == name and code.co_filename.endswith(os.sep + path) for path, name in functions)


def _user_traceback(tb: TracebackType | None) -> TracebackType | None:
    """The traceback `python script.py` would show: without the launcher's and runpy's frames in
    front, nor amplint's probes wherever they sat (a patched `backward` or `scaler.step`, the op
    recorder), nor the frames torch adds to reach amplint's modes."""
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    ours = [_is_launcher_frame(frame.tb_frame.f_code.co_filename) for frame in frames]
    dropped = list(ours)
    for index in reversed(range(len(frames) - 1)):  # a chain of wrappers ends at amplint's frame
        dropped[index] = dropped[index] or dropped[index + 1] and (
            _is_frame_of(frames[index], _MODE_ENTRY_FRAMES)
            # a Python function that handed its call to the mode: the mode runs it again below
            or _is_frame_of(frames[index + 1], _HANDED_TO_MODE)
        )
    for index in range(1, len(frames)):
        dropped[index] = dropped[index] or (ours[index - 1] and _is_frame_of(frames[index], _MODE_EXIT_FRAMES))
    kept = [frame for frame, drop in zip(frames, dropped) if not drop]
    for frame, following in zip(kept, [*kept[1:], None]):
        frame.tb_next = following
    return kept[0] if kept else None


def _strip_amplint_frames(exc: BaseException | None, seen: set[int]) -> None:
    """Also from the exceptions it was raised from or during, which the traceback prints too."""
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = _user_traceback(exc.__traceback__)
        _strip_amplint_frames(exc.__cause__, seen)
        exc = exc.__context__


def _stderr():
    """sys.stderr, open: the process's own stream where the script closed the one it put there."""
    if getattr(sys.stderr, "closed", False):
        sys.stderr = sys.__stderr__
    return sys.stderr


def _print_script_traceback(outcome: RunOutcome) -> None:
    exc = outcome.exception
    if exc is None:
        return
    _strip_amplint_frames(exc, set())
    tb = exc.__traceback__
    _stderr()  # the hook writes to sys.stderr
    hook = sys.excepthook
    try:
        hook(type(exc), exc, tb)  # respects a hook the script installed (rich, IPython...)
    except Exception:  # noqa: BLE001 - a broken hook must not hide the script's error
        traceback.print_exception(type(exc), exc, tb)
