"""Swept flags that a user's Python program does not take, named at sweep time from its own `--help`.

A misspelled `program.params` key (`learning_rat`) renders as a flag the program never defined,
and argparse refuses it in every job, after the queue wait. When the program is a Python script
that parses its arguments with argparse (or tyro, CleanRL's, whose help lists flags the same way)
and runs on this machine (no image), `hpcrl sweep` asks the script for its `--help` and names in
one line the parameter flags it does not list. It is a warning, not an error: a program may take
flags its help does not show (`parse_known_args`).

Asking for `--help` runs the script's imports and module-level code, never its training: it is
asked only of a script whose text uses argparse or tyro (their parser exits after printing the
help, before any training in a `main()`), with no GPU visible, stdin closed, and the whole process
group killed after HELP_TIMEOUT_S. Inside an image it is not asked (the host may lack the
program's dependencies, and running the image is the job's business).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from hpcrl.config import program_spec
from hpcrl.config.experiment import Experiment
from hpcrl.submit.jobplan import located

HELP_TIMEOUT_S = 10.0
_PARSERS = re.compile(r"^\s*(import|from)\s+(argparse|tyro)\b", re.MULTILINE)
_FLAG = re.compile(r"(?<![\w-])--[A-Za-z0-9][\w.-]*")
_MAX_SCRIPT = 1 << 20


def param_flags(exp: Experiment) -> dict[str, str]:
    """Flag -> the key that makes it, for every parameter of the config and of its grid."""
    program = exp.program
    if program is None or program.style not in ("argparse", "equals"):
        return {}
    keys = [name for name, _ in program_spec.flat_params(program.params)]
    for key, values in exp.sweep.grid.items():
        if key.startswith("program.params."):
            keys.append(key.removeprefix("program.params."))
        elif key == "program.params":
            keys += [name for value in values if isinstance(value, dict) for name, _ in program_spec.flat_params(value)]
    return {program_spec.option(key, program.names): f"program.params.{key}" for key in keys}


def help_script(exp: Experiment) -> tuple[list[str], Path] | None:
    """`[python, script.py]` and its working directory, where the program is a Python argparse or
    tyro script that runs on this machine; None otherwise."""
    program = exp.program
    if program is None or exp.container.image or len(program.command) < 2 or "{" in (program.workdir or ""):
        return None
    first, script = program.command[0], program.command[1]
    if not Path(first).name.startswith("python") or not script.endswith(".py") or "{" in script:
        return None
    cwd = Path(program.workdir or ".")
    try:
        with (cwd / script).open(encoding="utf-8", errors="replace") as f:
            text = f.read(_MAX_SCRIPT)
    except OSError:
        return None
    return (located(exp, [first, script]), cwd) if _PARSERS.search(text) else None


def warn_unlisted_flags(exp: Experiment) -> None:
    """`hpcrl sweep`'s one line on stderr, when there is something to say."""
    if warning := unlisted_flags(exp):
        print(f"hpcrl: warning: {exp.source or 'config'}: program.params: {warning}", file=sys.stderr)


def unlisted_flags(exp: Experiment, timeout: float = HELP_TIMEOUT_S) -> str | None:
    """One line naming the parameter flags the program's `--help` does not list (or why it could
    not be asked); None when there is nothing to say."""
    flags = param_flags(exp)
    found = help_script(exp) if flags else None
    if found is None:
        return None
    words, cwd = found
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    try:
        proc = subprocess.Popen([*words, "--help"], cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        return f"{words[1]} --help could not start ({exc.strerror}); program.params flags not checked"
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return f"{words[1]} --help did not answer within {timeout:g} s (killed); program.params flags not checked"
    listed = set(_FLAG.findall(out.decode(errors="replace")))
    if proc.returncode != 0 or "--help" not in listed:
        return f"{words[1]} --help exited with {proc.returncode} without a usage; program.params flags not checked"
    missing = [f"{flag} ({key})" for flag, key in flags.items() if flag not in listed]
    if not missing:
        return None
    return f"{words[1]} --help does not list {', '.join(missing)}: a misspelled key is passed as a flag the program does not take"
