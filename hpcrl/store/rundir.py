"""The one owner of a run directory's files: markers, train.csv, eval.csv, task manifests (the run lock's
file has its own owner, hpcrl.store.runlock).

Train, the Ape-X learner, evaluate, collect, status and the CLI all read and write these files
through this module, because every rule about them (what a torn line means, which marker
contradicts which, what line N of a manifest names) drifted when it lived in several places.

    runs/<run_id>/
      .lock                  held (flock) by the one process that trains the run (hpcrl.store.runlock)
      starts                 the warnings that reached a trainer and the stop signals it passed on to a program
      DONE | FAILED          train markers with a short reason (DONE: "step N", the steps trained)
      EVAL_DONE | EVAL_FAILED | EVAL_SKIPPED
      train.csv              appended one whole line per logged iteration by TrainLog (a user's program:
                             through hpcrl.job, or converted from its own metrics by the eval stage)
      lifetimes              a user's program: one line per start of the run (requeues, retries)
      program.log            a user's program: its output, appended across lifetimes
      stalled_requeues       how many requeues in a row the run asked for without progress (guard.py)
      eval.csv               written once, atomically, by the eval stage (a two-player game's: a row per game,
                             with the opponent it was played against)
      eval_progress          while a game's eval stage plays: "done total what" (games), which `hpcrl status` shows
      eval_curve.csv         the evaluations during training (eval.every_steps), appended by EvalCurveLog:
                             step,wall_time,mean_return,std_return,mean_length,episodes
      checkpoints/           rl/checkpoint.py's files (and best.pt, the best evaluated policy); their
                             stale temporary files go at the next start
      wandb/                 W&B's offline run folder (tracking.wandb), for `wandb sync`
    tensorboard/<setting>/<run_id>/   TensorBoard event files (tracking.tensorboard): beside runs/, so
                             `tensorboard --logdir logs/<experiment>` groups runs by setting, then seed
    jobs/<attempt>-<chunk>.tasks          line i = the run index of array task i
    jobs/<attempt>-<chunk>.actors.tasks   the k-th line naming run r = actor k of run r

Markers are the source of truth for whether a stage finished: schedulers differ in what they
remember (Slurm without accounting forgets, SGE's qstat forgets at once); a file written by the job
itself does not.
"""

from __future__ import annotations

import csv
import datetime
import errno
import io
import math
import os
import re
import signal
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hpcrl.config.schema import ConfigError
from hpcrl.io import atomic_write_csv, atomic_write_text
from hpcrl.store import columns
from hpcrl.store.runlock import LOCK, last_start
from hpcrl.store.states import REQUEUE_EXIT, State

DONE, FAILED = "DONE", "FAILED"
PRUNED = "PRUNED"
"""Beside DONE: an Optuna pruner ended the training early, for the reason it holds."""
EVAL_DONE, EVAL_FAILED, EVAL_SKIPPED = "EVAL_DONE", "EVAL_FAILED", "EVAL_SKIPPED"
TRAIN_LOG, EVAL_LOG, CHECKPOINTS = "train.csv", "eval.csv", "checkpoints"
EVAL_PROGRESS = "eval_progress"
EVAL_CURVE = "eval_curve.csv"
EVAL_CURVE_COLUMNS = ("step", "wall_time", "mean_return", "std_return", "mean_length", "episodes")
STRENGTH, STRENGTH_CURVE = "strength.csv", "strength_curve.csv"
STRENGTH_COLUMNS = ("opponent", "games", "wins", "draws", "losses", "win_rate", "draw_rate", "loss_rate")
"""A two-player agent's results per fixed opponent (AlphaZero; hpcrl.rl.strength): eval stage, and during training (with step and wall_time first)."""
LADDER = "ladder.csv"
LADDER_COLUMNS = ("player_a", "player_b", "games", "a_wins", "draws", "b_wins")
"""The eval stage's round robin between `random` and a run's own policies (named by their step)."""
TENSORBOARD = "tensorboard"
LIFETIMES, PROGRAM_LOG, PROGRAM_EVAL_LOG = "lifetimes", "program.log", "program-eval.log"
STARTS = "starts"
STALLED = "stalled_requeues"

_OPPOSITE = {
    DONE: (FAILED,), FAILED: (DONE, PRUNED), PRUNED: (FAILED,),
    EVAL_DONE: (EVAL_FAILED, EVAL_SKIPPED), EVAL_FAILED: (EVAL_DONE, EVAL_SKIPPED), EVAL_SKIPPED: (EVAL_DONE, EVAL_FAILED),
}  # fmt: skip


class RunError(Exception):
    """A run failed for a reason its one-line message tells whole (a full disk, unreadable
    checkpoints): the FAILED marker and the log get that line, not a traceback."""


# --------------------------------------------------------------------------------------------
# Markers.


def mark(run_dir: Path, name: str, reason: str = "") -> None:
    """Write one marker and clear the markers it contradicts."""
    for other in _OPPOSITE[name]:
        (run_dir / other).unlink(missing_ok=True)
    atomic_write_text(run_dir / name, reason.strip() + "\n")


def clear(run_dir: Path, *names: str) -> None:
    for name in names:
        (run_dir / name).unlink(missing_ok=True)


def reason(run_dir: Path, name: str) -> str:
    """A marker's text, "" where there is none. status and collect print it whatever it holds: bytes that are not
    UTF-8 (a program's words, a damaged disk) are replaced, and a marker that cannot be read says so."""
    try:
        return (run_dir / name).read_bytes().decode(errors="replace").strip()
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return unreadable(exc)


def unreadable(exc: OSError) -> str:
    """How status and collect name a run's file that exists but cannot be read (another user's, a directory in its
    place, an I/O error of the file system): `unreadable eval.csv (Permission denied)`, never a traceback."""
    return f"unreadable {Path(exc.filename).name if exc.filename else 'file'} ({exc.strerror or exc})"


def damage(name: str, exc: Exception) -> str:
    """How collect names a run's file `name` that its reader refused: `corrupt eval.csv (ValueError: ...)`, or
    `unreadable` where it could not be read."""
    return unreadable(exc) if isinstance(exc, OSError) else f"corrupt {name} ({type(exc).__name__}: {exc})"


def first_line(run_dir: Path, name: str) -> str:
    """A marker's headline, printable: FAILED may carry a traceback below it, and what a program
    wrote may hold colour codes or a carriage return (see `printable`)."""
    return printable((reason(run_dir, name).splitlines() or [""])[0])


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: str) -> str:
    """Text from a run's files as status, collect and the job log print it: control characters
    escaped (ESC as `\\x1b`), so that nothing a program wrote moves the cursor, clears the line or
    recolours the user's terminal."""
    return _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], text)


def failed_line(stage: str, reason: str) -> str:
    """The one wording of a run's failed stage, as the job's log (when it fails), `hpcrl status`
    and `hpcrl collect` print it: `train failed: <the reason's first line>`."""
    head = printable((reason.strip().splitlines() or [""])[0])
    return f"{stage} failed: {head or f'no reason recorded (see the {stage} log under jobs/logs)'}"


def failure_reason(run_dir: Path, stage: str = "train") -> str:
    """What the run recorded of why its train (FAILED) or eval (EVAL_FAILED) stage failed: the marker's headline,
    or for training what its lock and `starts` say of a start that left none (`silent_end`); "" where nothing does."""
    return first_line(run_dir, EVAL_FAILED if stage == "eval" else FAILED) or (silent_end(run_dir) if stage == "train" else "")


def failure(run_dir: Path, stage: str = "train") -> str:
    """`failed_line` of a run's train (FAILED) or eval (EVAL_FAILED) marker."""
    return failed_line(stage, failure_reason(run_dir, stage))


NO_DIRECTORY = "missing: no run directory"
"""How collect and status name a run that runs.csv lists and whose directory is gone (deleted, never
written): the other runs are reported as they are."""


def is_done(run_dir: Path) -> bool:
    return (run_dir / DONE).exists()


def is_failed(run_dir: Path) -> bool:
    return (run_dir / FAILED).exists()


def listing(run_dir: Path) -> frozenset[str]:
    """The names in a run directory that exist, as ``(run_dir / name).exists()`` says (a symlink
    counts when its target exists), from one read of the directory: what the state functions
    below take as `names` when many runs are looked at (collect), instead of a stat per marker.
    A missing run directory has none."""
    try:
        with os.scandir(run_dir) as entries:
            return frozenset(e.name for e in entries if not e.is_symlink() or os.path.exists(e.path))
    except (FileNotFoundError, NotADirectoryError):
        return frozenset()


def _exists(run_dir: Path, names: frozenset[str] | None, name: str) -> bool:
    return name in names if names is not None else (run_dir / name).exists()


def run_state(run_dir: Path, names: frozenset[str] | None = None) -> State:
    """Training state from markers: done, failed, started (checkpoints or logs exist) or new.
    `names`: the run directory's `listing`, when the caller has it."""
    if _exists(run_dir, names, DONE):
        return State.DONE
    if _exists(run_dir, names, FAILED):
        return State.FAILED
    if _exists(run_dir, names, TRAIN_LOG) or _exists(run_dir, names, LIFETIMES) or ((names is None or CHECKPOINTS in names) and any((run_dir / CHECKPOINTS).glob("*.pt"))):
        return State.STARTED
    return State.NEW


def eval_state(run_dir: Path, names: frozenset[str] | None = None) -> State:
    for name, state in ((EVAL_DONE, State.DONE), (EVAL_SKIPPED, State.SKIPPED), (EVAL_FAILED, State.FAILED)):
        if _exists(run_dir, names, name):
            return state
    return State.NEW


def stage_marker(stage: str, where: Path, names: frozenset[str] | None = None) -> State:
    """What a stage left on disk: done, failed, skipped (an evaluation) or new. `where` is the run
    directory, or the experiment directory for the aggregate (done once results/summary.csv holds a score).
    With the scheduler's state, `schedulers.base.shown_state` makes the state status shows."""
    if stage == "aggregate":
        return _aggregate_marker(where / "results" / "summary.csv")
    if stage == "eval":
        return eval_state(where, names)
    return State.DONE if _exists(where, names, DONE) else State.FAILED if _exists(where, names, FAILED) else State.NEW


def _aggregate_marker(summary: Path) -> State:
    """done once the aggregate wrote a summary with a score in it; failed for a summary of runs that
    all lack one (collect writes it, naming them, and exits 1): the results are not there, whatever
    the scheduler remembers of the task (Grid Engine forgets its exit code)."""
    try:
        with summary.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except FileNotFoundError:
        return State.NEW
    except (OSError, csv.Error, UnicodeDecodeError):
        return State.FAILED
    return State.DONE if any((row.get("n") or "0").strip() not in ("", "0") for row in rows) else State.FAILED


def mark_done(run_dir: Path, steps: int) -> None:
    """DONE with the number of environment steps really trained, which `status` shows."""
    mark(run_dir, DONE, f"step {steps}")


def begin_lifetime(run_dir: Path) -> int:
    """Record one more start of a user's program and return its number (1 for the first): the
    program is told (HPCRL_LIFETIME), and from the second on its `resume_args` are added."""
    path = run_dir / LIFETIMES
    try:
        earlier = len(_complete_lines(path.read_bytes()))
    except FileNotFoundError:
        earlier = 0
    with path.open("a") as f:  # one short line per write: a kill cannot tear it
        f.write(f"{earlier + 1} {datetime.datetime.now().astimezone().isoformat(timespec='milliseconds')} {socket.gethostname()} {os.getpid()}\n")
    return earlier + 1


def lifetime_starts(run_dir: Path) -> list[float]:
    """When each recorded start of a user's program began (epoch seconds, in order; to the millisecond,
    to the second in files written before 2026-11); empty without a `lifetimes` file. The metrics
    readers tell a resumed program's files from the earlier lifetime's by it: a program's own files
    do not say which start wrote them, and a requeue can follow a short lifetime within a second."""
    try:
        lines = _complete_lines((run_dir / LIFETIMES).read_bytes())
    except OSError:
        return []
    starts = []
    for line in lines:
        words = line.decode(errors="replace").split()
        try:
            starts.append(datetime.datetime.fromisoformat(words[1]).timestamp())
        except (IndexError, ValueError):
            continue  # a line another version wrote: its start is unknown
    return sorted(starts)


WARNED, PASSED_ON = "warned", "passed"
"""`starts` lines of a warning that reached the trainer, and of the stop signal it passed on to a
user's program: a job killed after them (the time limit) leaves no marker, and they say what happened."""


def record_signal(run_dir: Path, kind: str, signum: int) -> None:
    """One `starts` line: a warning arrived (WARNED) or a stop signal was passed on (PASSED_ON). One
    os.write of an O_APPEND file: safe from a signal handler, where a buffered file or print is not."""
    line = f"{kind} {datetime.datetime.now().astimezone().isoformat(timespec='seconds')} {socket.gethostname()} {os.getpid()} {signal.Signals(signum).name}\n"
    fd = os.open(run_dir / STARTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def silent_end(run_dir: Path) -> str:
    """Why the last start of a run left no marker, from what its lock file and `starts` say; empty when
    nothing says. A job killed at its time limit after the warning, or one that asked for a requeue the
    scheduler never made, showed `train failed: no reason recorded`."""
    last = last_start(run_dir)
    if last is None:
        return ""
    who, code = last
    try:
        lines = [line.decode(errors="replace").split() for line in _complete_lines((run_dir / STARTS).read_bytes())]
    except OSError:
        lines = []
    mine = [words for words in lines if len(words) >= 5 and words[2:4] == [who.host, str(who.pid)]]
    warned = next((w for w in mine if w[0] == WARNED), None)
    passed = next((w for w in mine if w[0] == PASSED_ON), None)
    warning = f"the warning {warned[4]} at {warned[1][11:19]}" if warned else "no warning"
    handed = f", passed on to the program as {passed[4]} at {passed[1][11:19]}" if passed else ""
    if code is not None:
        if code != REQUEUE_EXIT:
            return ""
        return f"asked for a requeue (after {warning}{handed}) and was not started again: the scheduler ended the task instead (its time limit?)"
    if warned:
        return f"killed after {warning}{handed} on {who.host} (pid {who.pid}): the job did not stop before the scheduler's time limit"
    return ""


def progress_mark(run_dir: Path) -> tuple[int, int, int]:
    """What the run's own output looks like now (files, bytes, newest mtime), hpcrl's bookkeeping
    (markers, the lock, the program's console logs, the lifetimes) left out: it changes when a
    lifetime writes a checkpoint, a train.csv row or any metric file under the run directory."""
    bookkeeping = {DONE, FAILED, PRUNED, EVAL_DONE, EVAL_FAILED, EVAL_SKIPPED, LOCK, LIFETIMES, STARTS, PROGRAM_LOG, PROGRAM_EVAL_LOG, STALLED}
    files = size = newest = 0
    for path in run_dir.rglob("*"):
        if path.parent == run_dir and path.name in bookkeeping:
            continue
        try:
            stat = path.stat()
        except OSError:  # went while we looked
            continue
        if path.is_file():
            files, size, newest = files + 1, size + stat.st_size, max(newest, stat.st_mtime_ns)
    return files, size, newest


def count_stalled_requeue(run_dir: Path, stalled: bool) -> int:
    """One more requeue without progress (`stalled`), or none (the count starts again); the count."""
    path = run_dir / STALLED
    try:
        count = int(path.read_text().split()[0]) + 1 if stalled else 0
    except (FileNotFoundError, ValueError, IndexError):
        count = 1 if stalled else 0
    if count or path.exists():
        atomic_write_text(path, f"{count}\n")
    return count


def done_step(run_dir: Path) -> int | None:
    """The steps a finished run trained, from its DONE marker (None when it does not say)."""
    head = first_line(run_dir, DONE).split()
    return int(head[1]) if len(head) == 2 and head[0] == "step" and head[1].isdigit() else None


# --------------------------------------------------------------------------------------------
# train.csv: written by TrainLog only; every reader drops a torn last line.
#
# A kill -9 cannot tear a line (each row is one write), but a node that dies on a network
# filesystem can leave half a line or a run of NUL bytes at the end. Readers therefore use only
# lines that end in a newline and parse, and the writer cuts the file back before appending.


def _complete_lines(data: bytes) -> list[bytes]:
    """Lines that end in a newline; what follows the last newline is a torn tail."""
    return data.split(b"\n")[:-1]


def _step_of(line: bytes) -> int | None:
    try:
        return int(float(line.split(b",", 1)[0]))
    except ValueError:
        return None


def cell(value: object) -> str:
    """A cell of a run's CSV files, as every writer here writes it: a float at full precision (the
    shortest text that reads back as the same float: 1234567.8 stays 1234567.8, where 6 significant
    digits wrote 1.23457e+06 and every mean and curve inherited the rounding; a whole number without
    `.0`), empty for NaN or None; integers and text as they are."""
    if value is None:
        return ""
    if isinstance(value, (float, np.floating)):
        number = float(value)
        if math.isnan(number):
            return ""
        return str(int(number)) if number.is_integer() and abs(number) < 2**53 else repr(number)
    if isinstance(value, np.integer):
        return str(int(value))
    return str(value)


class AppendLog:
    """An append-only CSV log: one whole line per row, flushed at once.

    Opened at the step the run resumes from, it first cuts the file back to its header and the
    complete rows that step covers: rows logged after the checkpoint will be produced again, and a
    torn tail (half a line, NUL bytes) would otherwise sit in the middle of the log for good.
    """

    def __init__(self, path: Path, columns: Sequence[str], resume_step: int) -> None:
        self.path = path
        has_header = _cut_back(self.path, resume_step)
        self._file = self.path.open("a")
        if not has_header:
            self.write(columns)

    def write(self, values: Sequence[object]) -> None:
        self._file.write(",".join(map(cell, values)) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> AppendLog:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class TrainLog(AppendLog):
    """The one writer of train.csv."""

    def __init__(self, run_dir: Path, columns: Sequence[str], resume_step: int) -> None:
        super().__init__(run_dir / TRAIN_LOG, columns, resume_step)


def _cut_back(path: Path, max_step: int) -> bool:
    """Truncate a log after its last complete row with step <= max_step; False: no header kept."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return False
    end = data.find(b"\n")
    if end < 0 or b"\0" in data[:end] or not data[:end].strip():
        keep, header = 0, False
    else:
        keep, header = end + 1, True
        while (nxt := data.find(b"\n", keep)) >= 0:
            step = _step_of(data[keep:nxt])
            if step is None or step > max_step:
                break
            keep = nxt + 1
    if keep < len(data):
        os.truncate(path, keep)
    return header


def read_curve(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(step, episodic return) of each logged iteration that finished an episode.

    Raises ValueError when a complete line in the middle of the file does not parse: that is
    damage, not a torn tail, and collect reports it by run.
    """
    return columns.read_columns(run_dir / TRAIN_LOG, "episodic_return")


def read_curves(run_dirs: Sequence[Path]) -> list[tuple[np.ndarray, np.ndarray] | Exception]:
    """`read_curve` of many runs: each run's curve, or the exception `read_curve` raises for it; the
    same arrays, read faster (`columns.read_many`)."""
    return columns.read_many([rd / TRAIN_LOG for rd in run_dirs], "episodic_return")


def write_curve(run_dir: Path, steps: Sequence[float], returns: Sequence[float]) -> None:
    """train.csv of a user's program, converted whole from the metrics it wrote (hpcrl.runtime.metrics):
    one row per episode, which `read_curve` and the rest read as they read hpcrl's own log."""
    rows = "".join(f"{int(s)},{cell(float(r))}\n" for s, r in zip(steps, returns))
    atomic_write_text(run_dir / TRAIN_LOG, "step,episodic_return\n" + rows)


def final_return(run_dir: Path, last: int = 10) -> float:
    """Mean episodic return over the last `last` logged iterations that finished episodes (NaN if none)."""
    try:
        _, returns = read_curve(run_dir)
    except FileNotFoundError:
        return math.nan
    return float(np.mean(returns[-last:])) if len(returns) else math.nan


def last_logged_step(run_dir: Path) -> int:
    """The step of train.csv's last complete row, read from the end (logs can be long)."""
    try:
        with (run_dir / TRAIN_LOG).open("rb") as f:
            start = max(0, f.seek(0, os.SEEK_END) - 4096)
            f.seek(start)
            lines = _complete_lines(f.read())
    except FileNotFoundError:
        return 0
    if start > 0:
        lines = lines[1:]  # begins mid-line
    for line in reversed(lines):
        step = _step_of(line)
        if step is not None:
            return step
    return 0


def train_columns(run_dir: Path) -> list[str] | None:
    """train.csv's header, or None when there is no complete one (a resumed user program keeps it)."""
    try:
        with (run_dir / TRAIN_LOG).open("rb") as f:
            lines = _complete_lines(f.readline())
    except FileNotFoundError:
        return None
    if not lines or b"\0" in lines[0] or not lines[0].strip():
        return None
    return lines[0].decode(errors="replace").strip().split(",")


def has_train_log(run_dir: Path, names: frozenset[str] | None = None) -> bool:
    return _exists(run_dir, names, TRAIN_LOG)


# --------------------------------------------------------------------------------------------
# eval.csv


def write_eval(run_dir: Path, results: Sequence[tuple[float, int, dict[str, float]]], opponents: Sequence[str] | None = None) -> None:
    """One row per episode: return, length and the task metrics the env reported (Habitat: success, SPL).
    `opponents` (a two-player game's eval stage): whom each game was played against, an `opponent`
    column after `episode`, since the returns of one file are against several players. The readers
    take files with and without it (`read_eval_returns` reads the return column by name)."""
    if opponents is not None and len(opponents) != len(results):
        raise ValueError(f"{len(opponents)} opponents for {len(results)} games")
    buf = io.StringIO()
    writer = csv.writer(buf)
    metric_names = sorted({name for *_, metrics in results for name in metrics})
    writer.writerow(["episode", *(["opponent"] if opponents is not None else []), "return", "length", *metric_names])
    for i, (ret, length, metrics) in enumerate(results):
        who = [opponents[i]] if opponents is not None else []
        writer.writerow([i, *who, cell(float(ret)), length, *(cell(float(metrics[k])) if k in metrics else "" for k in metric_names)])
    atomic_write_text(run_dir / EVAL_LOG, buf.getvalue())


def write_eval_progress(run_dir: Path, done: int, total: int, what: str) -> None:
    """How far a game's eval stage is (`done` of `total` games, and what it plays now), replaced
    atomically as it goes, so that `hpcrl status` can tell a long evaluation from a hung one."""
    atomic_write_text(run_dir / EVAL_PROGRESS, f"{done} {total} {printable(' '.join(what.split()))}\n")


def read_eval_progress(run_dir: Path) -> tuple[int, int, str] | None:
    """(games done, games in all, what it plays now) of an eval stage under way; None when it
    wrote none (not a game, not started, or finished: the stage removes it) or it does not parse."""
    try:
        done, total, what = (run_dir / EVAL_PROGRESS).read_text().strip().split(" ", 2)
        return int(done), int(total), what
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def has_eval(run_dir: Path, names: frozenset[str] | None = None) -> bool:
    return _exists(run_dir, names, EVAL_LOG)


def read_eval_returns(run_dir: Path) -> list[float]:
    """Each evaluation episode's return; ValueError/KeyError/TypeError/csv.Error for a damaged file."""
    try:
        with (run_dir / EVAL_LOG).open(newline="") as f:
            text = f.read()
    except UnicodeDecodeError:
        text = None  # read as DictReader reads it, so that the error says what it said
    returns = _plain_returns(text) if text is not None else None
    if returns is None:
        with (run_dir / EVAL_LOG).open(newline="") if text is None else io.StringIO(text, newline="") as f:
            returns = [float(row["return"]) for row in csv.DictReader(f)]
    if not returns:
        raise ValueError("no episodes")
    return returns


def _plain_returns(text: str) -> list[float] | None:
    """The `return` column as csv.DictReader reads it, when the file is plain (no quotes, carriage
    returns, NUL bytes or blank lines; one `return` column; every row as wide as the header), which
    splitting on commas reads the same; else None, and DictReader reads it."""
    if '"' in text or "\r" in text or "\0" in text:
        return None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if len(lines) < 2 or "" in lines:
        return None
    header = lines[0].split(",")
    if header.count("return") != 1:
        return None
    commas, column = len(header) - 1, header.index("return")
    rows = lines[1:]
    if any(line.count(",") != commas for line in rows):
        return None
    return [float(line.split(",")[column]) for line in rows]


def read_eval(run_dir: Path) -> float:
    """Mean evaluation return; ValueError/KeyError/TypeError/csv.Error for a damaged file."""
    return float(np.mean(read_eval_returns(run_dir)))


# --------------------------------------------------------------------------------------------
# eval_curve.csv and the TensorBoard directory: what training writes about itself besides train.csv


class EvalCurveLog(AppendLog):
    """The one writer of eval_curve.csv: one row per evaluation during training, cut back on resume
    like train.csv (an evaluation after the checkpoint is run again)."""

    def __init__(self, run_dir: Path, resume_step: int) -> None:
        super().__init__(run_dir / EVAL_CURVE, EVAL_CURVE_COLUMNS, resume_step)


class StrengthCurveLog(AppendLog):
    """The one writer of strength_curve.csv: per evaluation during training, a row per opponent."""

    def __init__(self, run_dir: Path, resume_step: int) -> None:
        super().__init__(run_dir / STRENGTH_CURVE, ("step", "wall_time", *STRENGTH_COLUMNS), resume_step)


def write_strength(run_dir: Path, rows: Sequence[Sequence[object]]) -> None:
    """strength.csv of the eval stage: a row per opponent (STRENGTH_COLUMNS)."""
    atomic_write_csv(run_dir / STRENGTH, STRENGTH_COLUMNS, rows)


def write_ladder(run_dir: Path, rows: Sequence[Sequence[object]]) -> None:
    """ladder.csv of the eval stage: a row per pair of players (LADDER_COLUMNS)."""
    atomic_write_csv(run_dir / LADDER, LADDER_COLUMNS, rows)


def _read_table(path: Path, columns: Sequence[str], numeric: Sequence[str], whole: bool = False) -> list[dict[str, Any]]:
    """The rows of strength.csv, strength_curve.csv or ladder.csv, `numeric` columns as floats.
    FileNotFoundError when absent; ValueError for a missing column or a cell that does not parse.
    A torn last line of a log being written is dropped; in a file written `whole` (atomically, so
    it always ends in a newline) it is damage, named: dropping it changed the Elo table unseen."""
    text = path.read_text()
    lines = text.split("\n")
    if not text.endswith("\n"):
        if whole and text:
            raise ValueError(f"line {len(lines)} is cut short (the file ends without a newline: truncated)")
        lines = lines[:-1]  # torn (or empty file)
    rows = list(csv.DictReader(lines))
    missing = [c for c in columns if not rows or c not in rows[0]] if rows else list(columns)
    if missing:
        raise ValueError(f"no rows with the columns {', '.join(columns)}" if not rows else f"no column {missing[0]}")
    out = []
    for n, row in enumerate(rows, start=2):
        try:
            out.append({c: float(row[c]) if c in numeric else str(row[c]) for c in columns})
        except (TypeError, ValueError):
            raise ValueError(f"line {n} does not parse: {','.join(str(row.get(c)) for c in columns)}") from None
    return out


def _game_counts(row: dict[str, Any], n: int, games: str, outcomes: Sequence[str]) -> None:
    """A row's game counts are whole numbers, at least one game, the outcomes adding up to it."""
    counts = [row[games], *(row[k] for k in outcomes)]
    if not all(math.isfinite(c) and c == int(c) and c >= 0 for c in counts) or row[games] < 1 or sum(row[k] for k in outcomes) != row[games]:
        raise ValueError(f"line {n}: {', '.join(f'{row[k]:g} {k}' for k in outcomes)} in {row[games]:g} games (whole numbers, at least one game, adding up to it)")


def read_strength(path: Path, curve: bool = False) -> list[dict[str, Any]]:
    """The rows of strength.csv (the eval stage's, written whole) or, with `curve`, strength_curve.csv
    (a log: its torn last line is dropped), each checked: wins, draws and losses whole numbers that
    add up to at least one game, and the rates their shares of it (as written, to 4 digits). The one
    reader results use: a row of 9 wins in 4 games printed a win rate of 2.25, a row of 0 games 0.
    FileNotFoundError when absent, ValueError naming the line of the first damage."""
    columns = ("step", *STRENGTH_COLUMNS) if curve else STRENGTH_COLUMNS
    rows = _read_table(path, columns, ("step", "games", "wins", "draws", "losses", "win_rate", "draw_rate", "loss_rate"), whole=not curve)
    for n, row in enumerate(rows, start=2):
        _game_counts(row, n, "games", ("wins", "draws", "losses"))
        for count, rate in (("wins", "win_rate"), ("draws", "draw_rate"), ("losses", "loss_rate")):
            if not abs(row[rate] - row[count] / row["games"]) <= 5e-4:
                raise ValueError(f"line {n}: {rate} {row[rate]:g} is not {row[count]:g} {count} in {row['games']:g} games")
    return rows


LADDER_ANCHOR = "random"
"""The player of every ladder who is not a policy (the others are named by the step they were saved at)."""


def read_ladder(path: Path) -> list[dict[str, Any]]:
    """ladder.csv's round robin, checked: each row two different players (`random` or a step) and
    whole game counts that add up; each pair once; every pair of its players present, with `random`
    among them. A file cut at a line's end (one pair gone) changed every rating with no message.
    The one reader results use; FileNotFoundError when absent, ValueError naming the damage."""
    rows = _read_table(path, LADDER_COLUMNS, ("games", "a_wins", "draws", "b_wins"), whole=True)
    pairs: set[frozenset[str]] = set()
    for n, row in enumerate(rows, start=2):
        a, b = row["player_a"], row["player_b"]
        strange = [p for p in (a, b) if p != LADDER_ANCHOR and not (p.isascii() and p.isdigit())]
        if strange:
            raise ValueError(f"line {n}: player {strange[0]!r} is neither {LADDER_ANCHOR} nor a policy's step")
        if a == b or frozenset((a, b)) in pairs:
            raise ValueError(f"line {n}: {a} vs {b} " + ("is a player against itself" if a == b else "again"))
        pairs.add(frozenset((a, b)))
        _game_counts(row, n, "games", ("a_wins", "draws", "b_wins"))
    players = {p for pair in pairs for p in pair}
    if len(pairs) != len(players) * (len(players) - 1) // 2 or LADDER_ANCHOR not in players:
        raise ValueError(f"{len(pairs)} pairs of {len(players)} players, where a round robin with {LADDER_ANCHOR} has every pair (truncated?)")
    return rows


def read_eval_curve(run_dir: Path, names: frozenset[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(step, mean return) of each evaluation during training; empty arrays when the run has none.
    A torn last line is dropped; ValueError for damage, as `read_curve`. `names`: as `run_state`'s."""
    if names is not None and EVAL_CURVE not in names:
        return np.empty(0), np.empty(0)
    try:
        return columns.read_columns(run_dir / EVAL_CURVE, "mean_return")
    except FileNotFoundError:
        return np.empty(0), np.empty(0)


def tensorboard_dir(experiment_dir: Path, setting_label: str, run_id: str) -> Path:
    """Where a run's TensorBoard event files go: `<experiment>/tensorboard/<setting>/<run_id>/`.

    Outside runs/ so that `tensorboard --logdir logs/<experiment>` shows one group per setting with
    one line per seed (the run id ends in `-s<seed>`). A label's `/` (an env id like `ALE/Pong-v5`)
    would split the group in two directories, so it becomes `_`."""
    return experiment_dir / TENSORBOARD / setting_label.replace("/", "_") / run_id


# --------------------------------------------------------------------------------------------
# Task manifests: how an array task finds its run on every scheduler.


def write_manifest(experiment_dir: Path, manifest: str, runs: Sequence[int]) -> None:
    atomic_write_text(experiment_dir / manifest, "".join(f"{i}\n" for i in runs))


def read_manifest(experiment_dir: Path, manifest: str) -> list[int]:
    """Run indices of a job's array tasks, in task order (line i is task i)."""
    path = experiment_dir / manifest
    try:
        return [int(word) for word in path.read_text().split()]
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"{path}: unreadable task manifest ({why})") from None


def task_run(experiment_dir: Path, manifest: str, task: int) -> int:
    """The run index of array task `task` (counted from 1, as every scheduler's array is mapped)."""
    runs = read_manifest(experiment_dir, manifest)
    if not 1 <= task <= len(runs):
        raise ConfigError(f"--task {task}: the manifest {manifest} has {len(runs)} tasks")
    return runs[task - 1]


def actor_of_task(experiment_dir: Path, manifest: str, task: int) -> tuple[int, int]:
    """(run index, actor index) of an actors-array task: the k-th line naming run r is actor k."""
    run = task_run(experiment_dir, manifest, task)
    return run, read_manifest(experiment_dir, manifest)[: task - 1].count(run)


# --------------------------------------------------------------------------------------------
# The run lock.


# --------------------------------------------------------------------------------------------
# Failures that need one line, not a traceback.

DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})
"""OSErrors about the filesystem rather than the code: the user must act, a traceback does not help."""


def one_line_reason(exc: BaseException) -> str | None:
    """The whole story of a failure in one line, or None when it is a bug that needs its traceback."""
    if isinstance(exc, (RunError, FloatingPointError)):  # a non-finite loss says where and what to change
        return str(exc)
    if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror or os.strerror(exc.errno)}{where}"
    return None


def remove_stale_temp(directory: Path) -> list[Path]:
    """Remove the temporary files of checkpoint writes that were killed (kill -9, a node crash).

    Only safe while holding the run lock: then no live writer owns one.
    """
    if not directory.is_dir():
        return []
    stale = [p for p in directory.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale
