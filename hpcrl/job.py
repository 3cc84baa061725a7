"""What a user's own trainer imports to take part in an hpcrl run (`algo: program`).

hpcrl runs the program inside the job with a few environment variables set; this module is the one
place that names them, and it turns them into answers a trainer needs: where to put checkpoints,
which seed to use, whether this start resumes an earlier one, whether the scheduler asked it to stop,
and how to log episodes so that `hpcrl collect` can read them. It needs nothing beyond hpcrl itself
(no torch), and outside hpcrl it degrades to harmless defaults, so the same script runs by hand::

    import sys
    from hpcrl import job

    ckpt_dir = job.checkpoint_dir()                 # HPCRL_CHECKPOINT_DIR, or ./checkpoints by hand
    state = load_newest(ckpt_dir) if job.resumed() else fresh_state(seed=job.seed())
    while state.step < total_steps:
        state = train_one_episode(state)
        job.log(state.step, episodic_return=state.ret, loss=state.loss)   # a row of the run's train.csv
        if job.stop_requested():                    # the scheduler's warning signal arrived
            save(state, ckpt_dir)
            sys.exit(job.requeue_exit())            # hpcrl requeues the run; resume_args bring it back

The stop signal's handler is installed when this module is imported (inside hpcrl, where
HPCRL_STOP_SIGNAL names the signal): a signal that came before the first `stop_requested()` call must
not kill the program. A handler the program had installed before the import is kept and still called
after the flag is set. A program that installs its own handler for that signal after the import
replaces ours, and `stop_requested()` then stays False: that program handles the stop itself.
So, inside hpcrl, importing this module means the stop signal no longer ends the program by itself:
a program that imports it should call `stop_requested()` in its loop (one that never does is
killed by the scheduler at the time limit, as a program that ignores signals is). An ignored
disposition inherited from the parent (SIG_IGN) is replaced: the stop must reach the program.
"""

from __future__ import annotations

import math
import operator
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from hpcrl.store import rundir
from hpcrl.store.states import REQUEUE_EXIT

RUN_DIR, CHECKPOINT_DIR, SEED, RUN_ID = "HPCRL_RUN_DIR", "HPCRL_CHECKPOINT_DIR", "HPCRL_SEED", "HPCRL_RUN_ID"
REQUEUE_EXIT_VAR, STOP_SIGNAL, LIFETIME = "HPCRL_REQUEUE_EXIT", "HPCRL_STOP_SIGNAL", "HPCRL_LIFETIME"
"""The environment contract. HPCRL_STOP_SIGNAL holds a signal name ("USR1", "TERM", "SIGUSR1" also
works); HPCRL_LIFETIME is 1 for the first start of a run, 2 after one requeue, and so on."""

_stop = threading.Event()
_installed: int | None = None
"""The signal number our handler is installed for, once it is."""
_log: rundir.TrainLog | None = None
_columns: list[str] = []
_last_step: int | None = None
_warned_outside = False


# --------------------------------------------------------------------------------------------
# Where the run is.


def inside() -> bool:
    """True when the program runs under hpcrl (HPCRL_RUN_DIR is set)."""
    return bool(os.environ.get(RUN_DIR))


def run_dir() -> Path | None:
    """The run's directory (train.csv, eval.csv and the markers live there); None outside hpcrl."""
    value = os.environ.get(RUN_DIR)
    return Path(value) if value else None


def checkpoint_dir() -> Path:
    """Where this run's checkpoints go, created: HPCRL_CHECKPOINT_DIR, else <run dir>/checkpoints,
    else ./checkpoints when the program runs by hand."""
    value = os.environ.get(CHECKPOINT_DIR)
    here = run_dir()
    path = Path(value) if value else here / rundir.CHECKPOINTS if here else Path("checkpoints")
    path.mkdir(parents=True, exist_ok=True)
    return path


def seed(default: int = 0) -> int:
    """The run's seed (HPCRL_SEED), or `default` when it is not set."""
    return _int_var(SEED, default)


def resumed() -> bool:
    """True when an earlier lifetime of this run exists (HPCRL_LIFETIME > 1): look for its checkpoint."""
    return _int_var(LIFETIME, 1) > 1


def requeue_exit() -> int:
    """The exit code that asks hpcrl to run this run again (HPCRL_REQUEUE_EXIT, default 99)."""
    return _int_var(REQUEUE_EXIT_VAR, REQUEUE_EXIT)


def _int_var(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}: expected an integer, got {value!r}") from None


# --------------------------------------------------------------------------------------------
# The stop signal.


def stop_requested() -> bool:
    """True once the stop signal (HPCRL_STOP_SIGNAL) has arrived: checkpoint, then exit with `requeue_exit()`.

    Always False when no stop signal is configured. Raises ValueError when HPCRL_STOP_SIGNAL names no
    signal a program can catch."""
    if _installed is None and os.environ.get(STOP_SIGNAL):
        _install(_stop_signal())
    return _stop.is_set()


def _stop_signal() -> signal.Signals:
    value = os.environ.get(STOP_SIGNAL, "").strip()
    name = value.upper() if value.upper().startswith("SIG") else "SIG" + value.upper()
    try:
        signum = signal.Signals[name]
    except KeyError:
        raise ValueError(f"{STOP_SIGNAL}: {value!r} is not a signal name (USR1, USR2, TERM, INT, ...)") from None
    if signum in (signal.SIGKILL, signal.SIGSTOP):
        raise ValueError(f"{STOP_SIGNAL}: {value!r} cannot be caught by a program; use USR1 or TERM")
    return signum


def _install(signum: signal.Signals) -> None:
    """Set the flag on `signum`, then call the handler the program had installed, if it had one."""
    global _installed
    previous = signal.getsignal(signum)

    def handler(number: int, frame: FrameType | None) -> None:
        _stop.set()
        if callable(previous):
            previous(number, frame)

    signal.signal(signum, handler)
    _installed = signum


def _install_at_import() -> None:
    """Install the handler now if the environment asks for one. A bad HPCRL_STOP_SIGNAL is reported
    by `stop_requested()`, not by the import; and only the main thread may install handlers, so an
    import from another thread leaves it to the first `stop_requested()` call."""
    if not os.environ.get(STOP_SIGNAL) or threading.current_thread() is not threading.main_thread():
        return
    try:
        _install(_stop_signal())
    except ValueError:
        pass


# --------------------------------------------------------------------------------------------
# Logging to the run's train.csv and eval.csv.


def log(step: int, **metrics: float) -> None:
    """Append one row to the run's train.csv: `step`, then the metrics (`episodic_return` is what
    `hpcrl collect` reads). The first call of a process fixes the columns; a later call with a name
    not among them raises ValueError, and a name left out is an empty cell, as is a value that is
    not a finite number. The first step logged by a resumed process cuts away the earlier lifetime's
    rows from that step on: they are being produced again. Steps must not go down."""
    global _log, _columns, _last_step
    here = _where_to_log()
    if here is None:
        return
    step = _integer(step)
    if _last_step is not None and step < _last_step:
        raise ValueError(f"log: step {step} is below the step logged before it ({_last_step})")
    cells = {name: _cell(name, value) for name, value in metrics.items()}
    if _log is None:
        _columns = _first_columns(here, list(metrics))
        here.mkdir(parents=True, exist_ok=True)
        _log = rundir.TrainLog(here, _columns, resume_step=step - 1)
    unknown = [name for name in metrics if name not in _columns]
    if unknown:
        raise ValueError(f"log: unknown metric {unknown[0]!r}; train.csv's columns are {','.join(_columns)} (fixed by the first row logged)")
    _log.write([step, *(cells.get(name, "") for name in _columns[1:])])
    _last_step = step


def log_eval(returns: Sequence[float], lengths: Sequence[int] | None = None) -> None:
    """Write the run's eval.csv (one row per episode, replacing an earlier one): the final score
    `hpcrl collect` reports when the config has a `program.eval` command."""
    here = _where_to_log()
    if here is None:
        return
    values = [float(r) for r in returns]
    if not values:
        raise ValueError("log_eval: no episode returns")
    bad = next((i for i, r in enumerate(values) if not math.isfinite(r)), None)
    if bad is not None:
        raise ValueError(f"log_eval: returns[{bad}] is {values[bad]}, not a finite number")
    if lengths is not None and len(lengths) != len(values):
        raise ValueError(f"log_eval: {len(values)} returns but {len(lengths)} lengths")
    # An unknown length is an empty cell rather than a made-up number.
    cells: Sequence[Any] = [int(n) for n in lengths] if lengths is not None else [""] * len(values)
    here.mkdir(parents=True, exist_ok=True)
    rundir.write_eval(here, [(r, n, {}) for r, n in zip(values, cells)])


def _where_to_log() -> Path | None:
    """The run directory, or None after one line on stderr (the first time) when outside hpcrl."""
    global _warned_outside
    here = run_dir()
    if here is None and not _warned_outside:
        print(f"hpcrl.job: not inside an hpcrl run ({RUN_DIR} is not set): log() and log_eval() write nothing", file=sys.stderr)
        _warned_outside = True
    return here


def _first_columns(here: Path, names: list[str]) -> list[str]:
    """step, then episodic_return when given, then the other names in the order given. A resumed run's
    train.csv keeps its header, so its columns are used when they cover `names`; a start that does not
    resume (HPCRL_LIFETIME 1) logs everything again, so an earlier attempt's file with other columns goes."""
    if "episodic_return" in names:
        names = ["episodic_return", *(n for n in names if n != "episodic_return")]
    for name in names:
        if not name or any(c in name for c in ',"\n\r'):
            raise ValueError(f"log: metric name {name!r} cannot be a CSV column")
    existing = rundir.train_columns(here)
    missing = [n for n in names if n not in existing] if existing else []
    if existing and (existing[:1] != ["step"] or missing) and not resumed():
        rundir.clear(here, rundir.TRAIN_LOG)
        existing = None
    if existing is None:
        return ["step", *names]
    if existing[:1] != ["step"] or missing:
        raise ValueError(
            f"log: {here / rundir.TRAIN_LOG} has columns {','.join(existing)} from an earlier lifetime; "
            f"this one logs {','.join(['step', *names])}"
        )
    return existing


def _integer(step: object) -> int:
    """An int, numpy's integers included; not a bool, nor 2.0 (a float step would be truncated unseen)."""
    if not isinstance(step, bool):
        try:
            return operator.index(step)  # type: ignore[call-overload]
        except TypeError:
            pass
    raise ValueError(f"log: step must be an integer, got {step!r}")


def _cell(name: str, value: object) -> str:
    if isinstance(value, (str, bytes)):
        raise ValueError(f"log: metric {name!r} must be a number, got {value!r}")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"log: metric {name!r} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        return ""
    return rundir.cell(number)


_install_at_import()
