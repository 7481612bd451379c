"""The processes a traced script starts, which run untraced: multiprocessing children that run
its code, and the Python programs it runs itself (a sweep launcher's `subprocess.run([sys.executable,
"train.py"])`). The report lists where each was started, so that a line they ran is not called
unrun, and says how to trace a program."""

from __future__ import annotations

import functools
import os
import re
import sys


class ChildProcesses:
    """Counts the processes the script starts that run untraced: with multiprocessing (a
    `Process`, `mp.spawn`, a `Pool`, a `ProcessPoolExecutor`) they run its code (a forked child
    passes everything through, a spawned one is a plain Python), so the report must not call their
    lines unrun; a Python program it runs itself (`subprocess.run([sys.executable, "train.py"])`,
    `os.system("torchrun ...")`: a sweep launcher) is a separate run the user can trace.
    DataLoader workers and managers are not counted: they load data or serve objects for this
    process, where the training they feed is traced. Nor are the commands libraries run for
    themselves (inductor's compile workers, a compiler)."""

    _SERVING_MODULES = ("torch.utils.data._utils.worker", "multiprocessing.managers")

    def __init__(self, session):
        self.session = session

    def __enter__(self) -> ChildProcesses:
        import subprocess
        from multiprocessing.process import BaseProcess  # the standard library's: torch stays unimported

        real_start = self._real_start = BaseProcess.start
        real_popen = self._real_popen = subprocess.Popen.__init__
        real_system = self._real_system = os.system
        counted = self._counted

        @functools.wraps(real_start)
        def start(process) -> None:
            serving = getattr(getattr(process, "_target", None), "__module__", None) in self._SERVING_MODULES
            real_start(process)  # it forgets the target
            if not serving:
                counted(self.session.state.untraced_processes, _script_callsite(self.session, subprocess_call=False))

        @functools.wraps(real_popen)
        def popen(process, args, *rest, **options) -> None:
            real_popen(process, args, *rest, **options)  # started: counted only if it did
            if runs_python(args, options.get("executable"), options.get("shell", False)):
                counted(self.session.state.untraced_programs, _script_callsite(self.session, subprocess_call=True))

        @functools.wraps(real_system)
        def system(command):
            status = real_system(command)
            if runs_python(command, None, shell=True):
                counted(self.session.state.untraced_programs, _script_callsite(self.session, subprocess_call=True))
            return status

        BaseProcess.start = start
        subprocess.Popen.__init__ = popen
        os.system = system
        return self

    def __exit__(self, *exc) -> None:
        import subprocess
        from multiprocessing.process import BaseProcess

        BaseProcess.start = self._real_start
        subprocess.Popen.__init__ = self._real_popen
        os.system = self._real_system

    @staticmethod
    def _counted(counter, site) -> None:
        if site is not False:
            counter[site] += 1


def _script_callsite(session, subprocess_call: bool):
    """Where the script's code started a process: the innermost user frame (None: torch is not
    imported yet, so no frame can be told apart), or False when a library started a program for
    itself (the frame that called `subprocess` or `os` is a library's)."""
    from amplint.trace.callsite import library_file_test

    frame = sys._getframe(2)
    if subprocess_call:
        while frame is not None and frame.f_code.co_filename in _PROCESS_MODULE_FILES:
            frame = frame.f_back
        is_library_file = session.classifier.is_library_file if session.classifier is not None else library_file_test()
        if frame is None or is_library_file(frame.f_code.co_filename):
            return False
        return (frame.f_code.co_filename, frame.f_lineno)
    classifier = session.classifier
    return classifier.user_callsite(2) if classifier is not None else None


# As their code names them: `os` is frozen (`<frozen os>`), and its `popen` calls subprocess.
_PROCESS_MODULE_FILES = frozenset({__import__("subprocess").Popen.__init__.__code__.co_filename, os.popen.__code__.co_filename})
# What starts a Python program: an interpreter (`python`, `python3.11`, `pythonw`), and the
# launchers that run one (`torchrun`, `accelerate launch`, `deepspeed`).
_PYTHON_PROGRAM = re.compile(r"(?:python(?:\d+(?:\.\d+)*)?w?|torchrun|accelerate|deepspeed)(?:\.exe)?", re.IGNORECASE)
_ENVIRONMENT_ASSIGNMENT = re.compile(r"\w+=")  # `CUDA_VISIBLE_DEVICES=0 python train.py`
# Commands that run the command after them (`env`, `nohup`, `time`, `timeout 600`, `nice -n 5`).
_WRAPPERS = frozenset({"env", "nohup", "time", "nice", "exec", "stdbuf", "timeout", "taskset", "numactl", "ionice"})
_SHELLS = frozenset({"sh", "bash", "zsh", "dash"})
_SEPARATORS = frozenset({"&&", "||", ";", "|", "&", ";;"})
_WRAPPER_OPTION = re.compile(r"-.*|\d+(?:\.\d+)?[smhd]?")  # `nice -n 5`, `timeout 10m`


def runs_python(args, executable, shell: bool) -> bool:
    """Whether a command line (as `subprocess.Popen` or `os.system` take it) runs a Python program,
    in any of its commands (`cd runs && python train.py`, `bash -c "..."`, `nohup python ...`)."""
    if executable is not None:
        return _is_python(os.fsdecode(executable))
    if isinstance(args, (str, bytes, os.PathLike)):
        line = os.fsdecode(args)
        return _shell_runs_python(line) if shell else _is_python(line)
    try:
        return _words_run_python([os.fsdecode(a) for a in args])
    except TypeError:
        return False


def _shell_runs_python(line: str) -> bool:
    import shlex

    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:
        return False
    commands = [[]]
    for token in tokens:
        if token in _SEPARATORS:
            commands.append([])
        else:
            commands[-1].append(token)
    return any(_words_run_python(words) for words in commands)


def _words_run_python(words: list[str]) -> bool:
    """One command's words: past its environment assignments, wrappers and their options."""
    index, wrapped = 0, False
    while index < len(words):
        word = words[index]
        if _ENVIRONMENT_ASSIGNMENT.match(word) or word in _WRAPPERS:
            wrapped = wrapped or word in _WRAPPERS
        elif not (wrapped and _WRAPPER_OPTION.fullmatch(word)):
            break
        index += 1
    if index >= len(words):
        return False
    program, rest = words[index], words[index + 1 :]
    if os.path.basename(program) in _SHELLS and "-c" in rest[:-1]:
        return _shell_runs_python(rest[rest.index("-c") + 1])
    return _is_python(program)


def _is_python(program: str) -> bool:
    if os.path.realpath(program) == os.path.realpath(sys.executable):
        return True
    return _PYTHON_PROGRAM.fullmatch(os.path.basename(program)) is not None
