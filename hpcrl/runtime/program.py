"""A user's own trainer inside its job: what `hpcrl train` and `hpcrl eval` do for `algo: program`.

The job script shows the program's command line literally (hpcrl.config.program_spec renders it) and hands
it to `hpcrl train ... -- <command>`; this module runs it as a child, the way hpcrl runs its own
trainer, so that everything around a run holds for it:

- the run lock and the DONE/FAILED markers (hpcrl.runtime.guard): exit 0 is DONE; any other exit is FAILED
  with the tail of the program's output as the reason, which `status` and `collect` show;
- the environment contract of hpcrl.job (`HPCRL_RUN_DIR`, `HPCRL_CHECKPOINT_DIR`, `HPCRL_SEED`,
  `HPCRL_RUN_ID`, `HPCRL_REQUEUE_EXIT`, `HPCRL_STOP_SIGNAL`, `HPCRL_LIFETIME`);
- preemption: the scheduler's warning reaches this process (the job script forwards it as USR1;
  Grid Engine also signals every process of the job) and is passed on as `program.stop_signal`,
  once: the program runs in a session of its own, out of reach of the job's signals. A program
  that then exits with the requeue code, or dies of that signal, is requeued; one that ignores it
  is killed by the scheduler at its limit, and the next sweep retries it. Each later start adds
  `resume_args`: resuming is the program's own;
- output: the program's stdout and stderr go to the job log and to `runs/<id>/program.log` as
  they come; the run ends when the program's process ends, and what it left running is ended.
- containment: the program runs under a keeper (hpcrl.runtime.keeper) that ends everything it
  started when this process dies, however it dies, and holds the run's lock until then: nothing of
  a run outlives its `hpcrl train`, not even a trainer a wrapper script forked without `exec`, and
  not when the keeper itself is killed (its two processes watch each other).

The eval stage then turns what the program wrote (hpcrl.runtime.metrics) into the run's training curve and
its score: the episodes of `program.eval`'s command when there is one, else the mean of the last
`metrics.last_episodes` training episodes.
"""

from __future__ import annotations

import collections
import contextlib
import csv
import os
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO, TextIO

from hpcrl import job
from hpcrl.config import program_spec
from hpcrl.config.program_spec import MetricsConfig, ProgramConfig
from hpcrl.leftovers import end_leftovers
from hpcrl.runtime.guard import StopFlag, guarded_eval, guarded_run
from hpcrl.store import expdir, rundir, runlock
from hpcrl.store.expdir import Run
from hpcrl.store.states import REQUEUE_EXIT

TAIL_LINES = 20
"""Lines of the program's output kept in a FAILED marker."""
LINE_CHARS = 1000
"""Characters of one line kept there (its end): a progress bar without newlines is one endless line."""
CHUNK = 1 << 16
OUTPUT_GRACE_S = 2.0
"""After the program exits, how long the rest of its output may take to arrive: a process it left
behind that holds the pipe must not keep the run open for as long as it lives."""
POLL_S = 0.1


def placeholder_values(experiment_dir: Path, run: Run) -> dict[str, str]:
    return expdir.run_values(experiment_dir, run.run_id, run.seed)


def command(experiment_dir: Path, run: Run) -> list[str]:
    """The run's command line, as its job script shows it."""
    return program_spec.argv(_program(run), placeholder_values(experiment_dir, run))


def workdir(program: ProgramConfig, values: dict[str, str]) -> Path:
    """The run's working directory (`program.workdir`, its placeholders filled), created when missing:
    `{run_dir}` there gives each run its own, for a program that writes into its working directory."""
    path = Path(program_spec.fill(program.workdir or ".", values, program.params)).resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise rundir.RunError(f"program.workdir: cannot create {path}: {exc.strerror or exc}") from None
    return path


CONTAINER_ENV_PREFIXES = ("APPTAINERENV_", "SINGULARITYENV_")


def into_container(env: dict[str, str], names: list[str]) -> dict[str, str]:
    """`env` with each of `names` also as APPTAINERENV_/SINGULARITYENV_NAME: when the command is a
    container's (`container.runs: program`), the contract reaches the program even through
    `--cleanenv`; elsewhere the runtimes' prefixes mean nothing. A prefixed value the job already
    exports (container.env) wins."""
    copies = {prefix + name: env[name] for name in names for prefix in CONTAINER_ENV_PREFIXES if name in env}
    return {**copies, **env}


def _program(run: Run) -> ProgramConfig:
    if run.config.program is None:
        raise ValueError(f"{run.run_id} is not a program run (algo {run.config.algo!r})")
    return run.config.program


def train_program(experiment_dir: Path, run: Run, words: list[str] | None = None, out: TextIO | None = None) -> int:
    """Run the program of one run to its end (or to the next preemption); the process exit code.

    `words` is the command line the job script shows; without it (a template that predates it, a
    run started by hand) the run's config renders it again.
    """
    words = list(words) if words else command(experiment_dir, run)
    return guarded_run(experiment_dir, run, lambda rd, stop: _train(experiment_dir, rd, run, words, stop, out), out)


def _train(experiment_dir: Path, rd: Path, run: Run, words: list[str], stop: StopFlag, out: TextIO | None) -> int:
    program = _program(run)
    values = placeholder_values(experiment_dir, run)
    ckpt = Path(values["checkpoint_dir"])
    ckpt.mkdir(parents=True, exist_ok=True)
    lifetime = rundir.begin_lifetime(rd)
    if lifetime > 1 and program.resume_args:
        latest = newest_file(ckpt)
        if latest is None and any("{latest_checkpoint}" in w for w in program.resume_args):
            print(f"{run.run_id}: start {lifetime}, but {ckpt} is empty: starting afresh, without resume_args", file=out)
        else:
            words += program_spec.resume_words(program, {**values, "latest_checkpoint": str(latest or "")})
            print(f"{run.run_id}: start {lifetime}: resuming with {shlex.join(words[-len(program.resume_args):])}", file=out)
    contract = {
        job.RUN_DIR: values["run_dir"], job.CHECKPOINT_DIR: values["checkpoint_dir"], job.SEED: values["seed"],
        job.RUN_ID: run.run_id, job.REQUEUE_EXIT_VAR: str(REQUEUE_EXIT), job.STOP_SIGNAL: program.stop_signal,
        job.LIFETIME: str(lifetime),
    }  # fmt: skip
    env = into_container({**thread_limits(run), **os.environ, **contract}, [*thread_limits(run), *contract])
    print(f"{run.run_id}: running {shlex.join(words)}", file=out, flush=True)
    lock = runlock.held_lock(rd)
    stop_signal = getattr(signal, f"SIG{program.stop_signal}")

    def passed_on(received: int) -> None:  # the warning's arrival and what the program got, in the job log and the run
        rundir.record_signal(rd, rundir.PASSED_ON, stop_signal)
        print(f"{run.run_id}: warning {signal.Signals(received).name} arrived: passed on to the program as SIG{program.stop_signal}", file=out, flush=True)

    code, tail = supervise(
        words, env, workdir(program, values), rd / rundir.PROGRAM_LOG, stop, stop_signal, out, hold=[lock] if lock is not None else [], passed_on=passed_on,
    )
    if code == 0:
        steps = rundir.last_logged_step(rd)
        rundir.mark(rd, rundir.DONE, f"step {steps}" if steps else "program exited with 0")
        print(f"{run.run_id}: done", file=out)
        return 0
    if code == REQUEUE_EXIT or stop.signal is not None:
        # After the warning any ending is the preemption's doing: the next lifetime resumes.
        why = f"after the warning {signal.Signals(stop.signal).name} (passed on as SIG{program.stop_signal})" if stop.signal is not None else "on its own"
        print(f"{run.run_id}: program stopped ({describe_exit(code)}) {why}: asking for a requeue", file=out)
        return REQUEUE_EXIT
    raise rundir.RunError(failure(f"program {describe_exit(code)}", tail))


def thread_limits(run: Run) -> dict[str, str]:
    """OMP_NUM_THREADS and MKL_NUM_THREADS at the task's `resources.cpus`, unless the job sets them:
    torch and numpy otherwise start a thread per core of the node, and array tasks sharing a node
    then spin against each other (RL Zoo's PPO ran 7x slower with two tasks on two cores)."""
    cpus = str(run.config.resources.cpus)
    return {"OMP_NUM_THREADS": cpus, "MKL_NUM_THREADS": cpus}


def failure(headline: str, tail: list[str]) -> str:
    """A FAILED marker: the headline with the program's last line, then the tail of its output."""
    last = next((line for line in reversed(tail) if line.strip()), "")
    return f"{headline}: {last.strip()[:200]}" + ("\n" + "\n".join(tail) if tail else "") if last else headline


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exited with {code}"


def supervise(
    words: list[str], env: dict[str, str], cwd: Path, log: Path, stop: StopFlag | None, stop_signal: int, out: TextIO | None = None, hold: Sequence[int] = (),
    passed_on: Callable[[int], None] | None = None,
) -> tuple[int, list[str]]:
    """Run `words`; copy its output to our stdout and to `log`; pass a stop on as `stop_signal`, once,
    and then tell `passed_on` which warning it was (it logs that: a job killed next leaves no other word).
    Returns the exit code (negative: the signal that killed it) and the last lines it printed.

    The program runs under a keeper (hpcrl.runtime.keeper) in a session of its own: Grid Engine
    signals every process of the job's process group (USR1, USR2), and the program must get the
    configured stop signal only, from here. Whatever kills this process or the keeper (an OOM kill,
    a SIGKILL of either alone or of both), the keeper's two processes then kill everything the
    program started, also below a wrapper that did not `exec` it, and hold the run's lock (`hold`:
    descriptors they keep open) until nothing is left. The run ends when the program's process ends: what it left running in its session (a
    `cmd &`, DataLoader workers, a logging service) would otherwise hold the output pipe open for as
    long as it lives; it is ended and named in the job log."""
    status_read, status_write = os.pipe()
    control_read, control = os.pipe()  # never written: its end of file tells the keeper we are gone
    started = time.time()
    try:
        keeper = subprocess.Popen(
            [sys.executable, "-I", "-S", KEEPER, str(status_write), "--", *words], cwd=cwd, env=env, stdin=control_read,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(status_write, *hold),
        )  # fmt: skip
    except (FileNotFoundError, NotADirectoryError):
        os.close(control)
        os.close(status_read)
        raise rundir.RunError(f"program: working directory {cwd} does not exist") from None
    finally:
        os.close(status_write)
        os.close(control_read)
    reports = _Reports(status_read)
    code: int | None = None
    tail: list[str] = []
    try:
        program, deputy = _started(reports, words, cwd)
        assert keeper.stdout is not None
        with log.open("ab") as sink:
            copier = _Copier(keeper.stdout, sink)
            copier.start()
            forwarded = False
            while code is None:
                if stop is not None and stop.signal is not None and not forwarded:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(program, stop_signal)
                    forwarded = True
                    if passed_on is not None:
                        passed_on(stop.signal)
                code = reports.exit_code(POLL_S)
                if code is None and reports.closed:  # the keeper was killed, and the program with it
                    code = keeper.wait()
            # The rest of its output: until EOF, unless the pipe stays quiet for OUTPUT_GRACE_S (something
            # it left holds it) or, whatever keeps writing, for long.
            ended = time.monotonic()
            while copier.is_alive() and min(copier.quiet_for(), time.monotonic() - ended) < OUTPUT_GRACE_S and time.monotonic() - ended < 10 * OUTPUT_GRACE_S:
                copier.join(POLL_S)
            end_leftovers(keeper.pid, out, "the program", spare=(keeper.pid, deputy), since=started)
            copier.closing.set()
            copier.join()
            tail = copier.tail.lines()
    finally:
        os.close(control)  # the keeper ends whatever is left, then exits
        reports.close()
        try:
            keeper.wait(KEEPER_EXIT_S)
        except subprocess.TimeoutExpired:
            keeper.kill()
            keeper.wait()
        if keeper.stdout is not None:
            keeper.stdout.close()
    return code, tail


KEEPER = str(Path(__file__).with_name("keeper.py"))
KEEPER_START_S = 60.0
"""Bound on the keeper's start (an interpreter without site-packages) and the program's exec."""
KEEPER_EXIT_S = 15.0
"""Bound on the keeper's last sweep (it gives up on a process after 10 s of SIGKILLs)."""


def _started(reports: _Reports, words: list[str], cwd: Path) -> tuple[int, int]:
    """The program's pid and its parent's (the keeper's deputy) once it started; RunError, one line, when it could not."""
    line = reports.line(KEEPER_START_S)
    if line is None:
        raise rundir.RunError(f"program: the keeper of {words[0]!r} did not start within {KEEPER_START_S:g} s")
    kind, _, rest = line.partition(" ")
    if kind == "pid":
        program, deputy = rest.split()
        return int(program), int(deputy)
    error = rest.partition(" ")[0]
    if error == "FileNotFoundError":
        raise rundir.RunError(f"program: {words[0]!r} not found (in {cwd}, on the PATH of the job)")
    if error == "PermissionError":
        raise rundir.RunError(f"program: {words[0]!r} is not executable")
    raise rundir.RunError(f"program: {words[0]!r} could not start: {rest}")


class _Reports:
    """The keeper's lines (`pid N`, `exit N`, `error ...`), read without waiting longer than asked."""

    def __init__(self, fd: int) -> None:
        self.fd, self.closed, self._buffer = fd, False, b""

    def line(self, timeout: float) -> str | None:
        """The next line within `timeout` seconds, or None (`closed`: the keeper is gone)."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer and not self.closed:
            ready, _, _ = select.select([self.fd], [], [], max(deadline - time.monotonic(), 0.0))
            if not ready:
                return None
            chunk = os.read(self.fd, 1 << 10)
            self._buffer += chunk
            self.closed = not chunk
        if b"\n" not in self._buffer:
            return None
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def exit_code(self, timeout: float) -> int | None:
        """The program's exit code once the keeper reported it, else None after `timeout` seconds."""
        line = self.line(timeout)
        return int(line.split()[1]) if line is not None and line.startswith("exit ") else None

    def close(self) -> None:
        os.close(self.fd)


class _Tail:
    r"""The last TAIL_LINES lines of the output, as a terminal shows them (a `\r` returns to the
    start of the line: a progress bar keeps its latest state only), each cut to LINE_CHARS: what is
    kept is bounded however the program writes (a tqdm bar is one endless line without newlines)."""

    def __init__(self) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._partial = b""

    def feed(self, chunk: bytes) -> None:
        *complete, partial = (self._partial + chunk).split(b"\n")
        self._lines.extend(_shown(line) for line in complete[-TAIL_LINES:])
        cut = partial.rfind(b"\r", 0, len(partial) - 1)  # a final \r may be the first half of \r\n
        self._partial = partial[cut + 1 :][-4 * LINE_CHARS :]

    def lines(self) -> list[str]:
        last = _shown(self._partial)
        return [*self._lines, last] if last.strip() else list(self._lines)


def _shown(line: bytes) -> str:
    """A line as a terminal leaves it: what follows its last carriage return, its end if too long."""
    line = line.rstrip(b"\r")
    text = line[line.rfind(b"\r") + 1 :].decode(errors="replace").rstrip()
    return text if len(text) <= LINE_CHARS else "..." + text[-LINE_CHARS:]


class _Copier(threading.Thread):
    r"""Copies the program's output to the job log and `sink` in chunks as they come (a `\r`
    progress bar reaches the logs at once, not at the next newline) and keeps its tail. Ends at
    EOF; once `closing` is set (the program is gone, whatever it left may hold the pipe), also when
    the pipe has nothing more to give at once, or OUTPUT_GRACE_S later whatever still comes."""

    def __init__(self, pipe: BinaryIO, sink: BinaryIO) -> None:
        super().__init__(daemon=True)
        self.fd, self.sink, self.tail = pipe.fileno(), sink, _Tail()
        self.closing = threading.Event()
        self.last_data = time.monotonic()

    def quiet_for(self) -> float:
        return time.monotonic() - self.last_data

    def run(self) -> None:
        out = getattr(sys.stdout, "buffer", None)
        stop_at = None
        while True:
            if stop_at is None and self.closing.is_set():
                stop_at = time.monotonic() + OUTPUT_GRACE_S
            ready, _, _ = select.select([self.fd], [], [], POLL_S if stop_at is None else 0)
            chunk = os.read(self.fd, CHUNK) if ready else b""
            if chunk:
                self.last_data = time.monotonic()
                self.sink.write(chunk)
                self.sink.flush()
                if out is not None:
                    out.write(chunk)
                    out.flush()
                self.tail.feed(chunk)
            if (ready and not chunk) or (stop_at is not None and (not ready or time.monotonic() > stop_at)):
                return


def newest_file(directory: Path) -> Path | None:
    """The most recently written file under `directory` (a program's own checkpoint naming is unknown)."""
    newest, when = None, -1.0
    for path in directory.rglob("*"):
        try:
            stat = path.stat()
        except OSError:
            continue
        if path.is_file() and not path.name.startswith(".") and stat.st_mtime > when:
            newest, when = path, stat.st_mtime
    return newest


# --------------------------------------------------------------------------------------------
# The eval stage.


def evaluate_program(experiment_dir: Path, run: Run, words: list[str] | None = None, out: TextIO | None = None) -> int:
    """The curve and score of a trained program run (see the module docstring); markers as for hpcrl's own runs.
    `words`: the `program.eval` command line its job script shows (else the config renders it)."""
    return guarded_eval(experiment_dir, run, lambda rd: _evaluate(experiment_dir, rd, run, words, out), out)


def _evaluate(experiment_dir: Path, rd: Path, run: Run, words: list[str] | None, out: TextIO | None) -> int:
    from hpcrl.runtime import metrics  # tensorboard's reader is imported only by the runs that need it

    program = _program(run)
    training = _read(metrics, experiment_dir, rd, program.metrics, run)
    if program.metrics.source != "hpcrl":
        rundir.write_curve(rd, training.steps, training.returns)
    if program.eval is None:
        returns = [float(r) for r in training.returns[-program.metrics.last_episodes :]]
        what = f"mean of the last {len(returns)} training episodes"
    else:
        returns = _run_eval(experiment_dir, rd, run, program, metrics, words, out)
        what = f"mean return over {len(returns)} evaluation episodes"
    if not returns:
        raise metrics.MetricsError(f"metrics: no episodes in {', '.join(map(str, training.files))}")
    if program.eval is None or program.eval.metrics.source != "hpcrl":
        rundir.write_eval(rd, [(r, 0, {}) for r in returns])
    mean = sum(returns) / len(returns)
    rundir.mark(rd, rundir.EVAL_DONE, f"{what}: {mean:.6g}")
    print(f"{run.run_id}: score {mean:.2f} ({what})", file=out)
    return 0


def _read(metrics, experiment_dir: Path, rd: Path, spec: MetricsConfig, run: Run):
    pattern = spec.path and program_spec.fill(spec.path, placeholder_values(experiment_dir, run), _program(run).params)
    return metrics.read_episodes(rd, spec.source, pattern, tag=spec.tag, step=spec.step, value=spec.value)


def _run_eval(experiment_dir: Path, rd: Path, run: Run, program: ProgramConfig, metrics, words: list[str] | None, out: TextIO | None) -> list[float]:
    """Run `program.eval.command` and read the episodes it wrote."""
    assert program.eval is not None
    values = placeholder_values(experiment_dir, run)
    words = list(words) if words else program_spec.eval_argv(program, values)
    contract = {job.RUN_DIR: values["run_dir"], job.CHECKPOINT_DIR: values["checkpoint_dir"], job.SEED: values["seed"], job.RUN_ID: run.run_id}
    env = into_container({**thread_limits(run), **os.environ, **contract}, [*thread_limits(run), *contract])
    print(f"{run.run_id}: evaluating with {shlex.join(words)}", file=out, flush=True)
    code, tail = supervise(words, env, workdir(program, values), rd / rundir.PROGRAM_EVAL_LOG, None, signal.SIGTERM, out)
    if code != 0:
        raise rundir.RunError(failure(f"eval program {describe_exit(code)}", tail))
    if program.eval.metrics.source == "hpcrl":
        if not rundir.has_eval(rd):
            raise metrics.MetricsError(f"metrics: the eval program wrote no {rd / rundir.EVAL_LOG} (hpcrl.job.log_eval writes it)")
        try:
            return rundir.read_eval_returns(rd)
        except (ValueError, KeyError, TypeError, csv.Error) as exc:
            raise metrics.MetricsError(f"metrics: {rd / rundir.EVAL_LOG} written by the eval program is unreadable ({type(exc).__name__}: {exc})") from None
    return [float(r) for r in _read(metrics, experiment_dir, rd, program.eval.metrics, run).returns]
