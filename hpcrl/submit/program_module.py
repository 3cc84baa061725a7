"""A program run as `python -m MODULE` whose interpreter cannot find MODULE, refused at sweep time.

`command: [python, -m, rl_zoo3.train]` swept from a shell whose `python` is not the one with RL Zoo passed
the sweep, and every run failed after its queue wait (`No module named 'rl_zoo3'`). Where the program runs
on the cluster's own nodes (no image: inside one, `python` is the image's), the sweep asks that interpreter,
resolved as the job script will show it, whether it finds the module, without importing it (a package's
`__init__` may import torch): each dotted part is looked up in its parent's search path, and a package
needs its `__main__`, as `python -m` does. The answer is bounded by FIND_TIMEOUT_S; one that does not come
is said in one line and the sweep goes on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from hpcrl.config.experiment import Experiment
from hpcrl.config.schema import ConfigError
from hpcrl.submit.jobplan import located

FIND_TIMEOUT_S = 15.0
NOT_FOUND = 3
"""The finder's exit code for a module it cannot find (1 is any other failure of the interpreter)."""

FINDER = """
import importlib.machinery, importlib.util, sys
parts = sys.argv[1].split(".")
spec = importlib.util.find_spec(parts[0])
for part in parts[1:] + ["__main__"]:
    if spec is None or spec.submodule_search_locations is None:
        break
    spec = importlib.machinery.PathFinder.find_spec(part, list(spec.submodule_search_locations))
sys.exit(0 if spec is not None else 3)
"""
"""Finds MODULE (argv[1]) as `python -m` would, without running its code or its packages' `__init__`."""


def module_of(exp: Experiment) -> tuple[list[str], str, Path] | None:
    """(the interpreter as the job will run it, the `-m` module, the working directory) of a program that
    runs `python -m MODULE` without an image; None for any other program."""
    program = exp.program
    if program is None or exp.container.image or len(program.command) < 3 or program.command[1] != "-m":
        return None
    first, module = program.command[0], program.command[2]
    if not Path(first).name.startswith("python") or "{" in first + module + (program.workdir or ""):
        return None
    return located(exp, [first]), module, Path(program.workdir or ".")


def check_module(exp: Experiment, timeout: float = FIND_TIMEOUT_S) -> None:
    """ConfigError (one line) where the program's interpreter cannot find its `-m` module."""
    found = module_of(exp)
    if found is None:
        return
    interpreter, module, cwd = found
    try:
        proc = subprocess.Popen([*interpreter, "-c", FINDER, module], cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        raise ConfigError(f"program.command: {interpreter[0]} cannot run here ({exc.strerror}); every run would fail after its queue wait") from None
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        print(f"hpcrl: warning: program.command: {interpreter[0]} did not say within {timeout:g} s whether it finds module {module!r} (killed); not checked", file=sys.stderr)
        return
    if proc.returncode == NOT_FOUND:
        raise ConfigError(
            f"program.command: {interpreter[0]} finds no module {module!r} (python -m {module} would fail in every job after its queue wait): "
            "sweep from the environment that has it, or give that environment's python"
        )
    if proc.returncode != 0:
        last = (err.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
        raise ConfigError(f"program.command: {interpreter[0]} failed to look for module {module!r} (exit {proc.returncode}: {last[:200]})")
