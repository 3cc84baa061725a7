"""Env worker processes, each stepping several envs, with every wait on them bounded.

A worker process hosts a share of a vector env's envs (`env.envs_per_worker`) and steps them in
turn on one message each way per step, as Sample Factory's rollout workers do: on 2 cores, 8
ViZDoom envs in 2 workers of 4 step at 0.30 ms of CPU a step against 0.44 ms in 8 workers of one
(benchmarks/vizdoom_speed.py), the difference being the per-process wake-ups and messages. Inside a
worker the envs are a gymnasium SyncVectorEnv in SAME_STEP autoreset mode, so each env's episodes,
seeds (env i gets seed + i) and infos are what one AsyncVectorEnv of single-env workers gives.

No wait on a worker is unbounded: a worker that does not answer its start, a reset, a step or its
close within `timeout`, or that dies, raises EnvWorkerError naming the env, the worker (and its envs)
and what it was doing, after every worker of the vector env and whatever they started (a ViZDoom
env's game is a process of its own) are killed. Nor is the trainer's own process given a user's env
to build: the spaces come from worker 0's env in a probe process (`probe_env`), under the same bound.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import multiprocessing
import multiprocessing.connection
import os
import select
import shutil
import signal
import tempfile
import time
import traceback
import weakref
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.reduction import ForkingPickler
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import CloudpickleWrapper, batch_space, clear_mpi_env_vars

from hpcrl.leftovers import kill_holding, process_stat, processes, stop_all_found
from hpcrl.rl.step_wire import StepWire, is_raw
from hpcrl.runtime.group_watch import watch_own_group
from hpcrl.runtime.guard import leave_stops_to_the_trainer
from hpcrl.runtime.launch import how_it_ended
from hpcrl.runtime.lifeline import die_with_parent
from hpcrl.store.rundir import RunError

SCRATCH_PREFIX = "hpcrl-envs-"
"""The name of each worker's (and the spaces probe's) temporary directory, in $TMPDIR: `hpcrl-envs-XXXX`."""


class EnvWorkerError(RunError):
    """An env worker process that did not answer in time, or died: the run fails with this line."""


@dataclasses.dataclass(frozen=True)
class EnvDescription:
    """What a vector env needs to know of its envs before its workers start."""

    observation_space: gym.Space
    action_space: gym.Space
    metadata: dict[str, Any]
    render_mode: str | None


def probe_env(thunk: Callable[[], gym.Env], *, env_id: str, timeout: float, context: str | None) -> EnvDescription:
    """The spaces of the env `thunk` builds (worker 0's), read in a process of its own.

    gymnasium's AsyncVectorEnv builds and closes one env in the calling process for this, outside
    every bound: an env whose constructor or close hangs froze the trainer. Here the probe must
    answer its start and its close within `timeout` seconds, or EnvWorkerError names it and it is
    killed with whatever it started; an error the env raised is raised here as it was there."""
    ctx = multiprocessing.get_context(context)
    answers, child_end = ctx.Pipe(duplex=False)
    scratch = tempfile.mkdtemp(prefix=SCRATCH_PREFIX)
    process = ctx.Process(target=_describe, args=(CloudpickleWrapper(thunk), child_end, scratch), name="Worker<probe>-0", daemon=True)
    started = time.time()
    process.start()
    child_end.close()
    who = f"env {env_id}: worker 0's spaces probe"
    try:
        described = _answer(answers, process, who, "start", timeout)
        _answer(answers, process, who, "close", timeout)
        process.join(timeout)
        return described
    finally:
        answers.close()
        end_workers([process], started)
        shutil.rmtree(scratch, ignore_errors=True)


def _answer(
    pipe: multiprocessing.connection.Connection, process: Any, who: str, doing: str, bound: float,
    wait: float | None = None, where: str | None = None, poller: select.poll | None = None,
) -> Any:  # fmt: skip
    """The next answer of a worker (or the probe) within `wait` seconds (what is left of `bound`): its
    value, or a raw step message's bytes (`hpcrl.rl.step_wire`), which the caller decodes;
    EnvWorkerError when it is late or the process died; the env's own error when it raised one (a
    RunError with `where` it was raised). `poller`, the pipe's own poll object, waits in one system
    call: `pipe.poll` builds and registers a selector at every call (8 ViZDoom envs in 4 workers,
    random actions: 0.49-0.62 ms of the trainer's CPU a vector step with it, 0.46-0.49 without)."""
    seconds = bound if wait is None else wait
    try:
        if not (poller.poll(seconds * 1000) if poller is not None else pipe.poll(seconds)):
            raise EnvWorkerError(f"{who} did not answer {doing} within {bound:g} s")
        message = pipe.recv_bytes()
        if is_raw(message):  # a step's result, decoded by the caller (`StepWire.result_of`)
            return message
        kind, value = ForkingPickler.loads(message)
    except (EOFError, ConnectionResetError, BrokenPipeError) as exc:
        process.join(1.0)  # its pipe closes as it exits, a moment before its exit code can be read
        raise EnvWorkerError(f"{who} {how_it_ended(process.exitcode) if process.exitcode is not None else 'stopped answering'} during {doing}") from exc
    if kind == "error":
        raise _raised(value, who, where)
    return value


def _raised(value: tuple[type[BaseException], str, str], who: str, where: str | None) -> BaseException:
    """The error an env raised in a worker, to raise here. A RunError (an env that returned what it
    must not) is one line with the worker named; any other error is a bug in the env, whose
    traceback is logged, as gymnasium does, before it is raised again under its own type."""
    error_type, message, trace = value
    if issubclass(error_type, RunError):
        return error_type(message if where is None else f"{message} ({where})")
    if trace:
        gym.logger.error(f"{who} raised:\n{trace}")
    try:
        return error_type(message)
    except Exception:  # noqa: BLE001 - a type built from other arguments: its name and message
        return RuntimeError(f"{error_type.__name__}: {message}")


def _error(exc: BaseException, with_trace: bool) -> tuple[type[BaseException], str, str]:
    """An env's error as it crosses the pipe: its type (RuntimeError where the type does not pickle), message and traceback."""
    trace = traceback.format_exc() if with_trace else ""
    try:
        ForkingPickler.dumps(type(exc))
    except Exception:  # noqa: BLE001 - a type the trainer could not unpickle: its name survives
        return RuntimeError, f"{type(exc).__name__}: {exc}", trace
    return type(exc), str(exc), trace


def _describe(thunk: CloudpickleWrapper, answers: multiprocessing.connection.Connection, scratch: str) -> None:
    """The probe process: build the env, send what describes it, close it, say so. An error the
    env raises goes back as its type and message (a traceback here would be a second message).
    Its env's temporary files go under `scratch`, as a worker's do (`_serve`)."""
    die_with_parent()
    release = _lead_own_group(scratch)
    try:
        env = thunk()
        answers.send(("ok", EnvDescription(env.observation_space, env.action_space, dict(env.metadata), env.render_mode)))
        env.close()
        answers.send(("ok", None))
    except Exception as exc:  # noqa: BLE001 - raised again in the trainer by _answer
        answers.send(("error", _error(exc, with_trace=False)))
    finally:
        release()


def _lead_own_group(scratch: str) -> Callable[[], None]:
    """First thing in a worker or the probe: lead a process group of its own, which whatever it starts joins (a
    ViZDoom game's engine), deaf to the signals the trainer stops on (`leave_stops_to_the_trainer`), and watched
    (`group_watch`); returns what the process calls at its normal end (the watcher's release).

    A worker killed from outside (the OOM killer, a segfault, a user's kill) left its engine to init, out of reach
    of any walk down from the worker, where the engine waited for its controller for ever; in the worker's group it
    is still found, by the trainer (`end_workers`) or, where the trainer died too, by the group's watcher. A group
    outside a terminal's foreground is stopped when it writes there under `stty tostop`: the worker ignores SIGTTOU,
    and its engines inherit that. Where a group cannot be had (a platform that refuses it), the worker runs in the
    trainer's, unwatched, as it did before. It and what it starts never preempt the trainer (`_never_preempting`).
    `scratch` becomes the process's temporary directory (`tempfile.tempdir`), and goes when the group has ended,
    however the process ended."""
    tempfile.tempdir = scratch
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    _never_preempting()
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    leave_stops_to_the_trainer()
    return watch_own_group(scratch)  # last: the watcher inherits the signals ignored above


def _never_preempting() -> None:
    """Put this process, and what it starts (a ViZDoom game's engine inherits it), in Linux's batch class
    (SCHED_BATCH): the same share of the cores, but a wake-up no longer preempts the thread running on a core.

    The rollout thread sends each worker its actions in turn, and every send wakes a worker; at normal priority the
    woken worker took the core from the rollout thread before it had sent the rest, so the last worker started
    late: on 2 cores (8 ViZDoom envs in 4 workers, async PPO) sending the actions took 0.63-0.68 ms of wall time a
    vector step for 0.21 ms of CPU, and 0.22 ms for 0.18 in the batch class; the games' step, from the first send
    to the last answer, 2.9-3.0 ms against 3.1-3.3. A worker still takes an idle core at once, and a core the
    update (SCHED_IDLE) holds. Only from the normal class: a run started in another (`chrt --idle` to leave a shared
    node to others, a real-time class) keeps it in its workers too; and where the class cannot be set (not Linux, a
    sandbox that refuses the call) the worker runs in the class it has."""
    with contextlib.suppress(AttributeError, OSError):
        if os.sched_getscheduler(0) == os.SCHED_OTHER:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


def _serve(thunks: CloudpickleWrapper, pipe: multiprocessing.connection.Connection, parent_end: multiprocessing.connection.Connection, scratch: str, core: int | None = None) -> None:
    """A worker process: build its envs, say so with their spaces, then step and reset them on
    command until `close`, which it answers before closing them (a close that hangs is the
    trainer's to bound). An error in an env goes back with its traceback, and the worker ends.
    Its envs' temporary files go under `scratch` (ViZDoom's game directories), a directory of its
    own, which its group's watcher removes when the worker ends, however it ends (a trainer killed
    with SIGKILL runs no cleanup), and the trainer too once the workers are gone. Deaf to the signals the trainer stops on
    (`_lead_own_group`), and so are its envs' engines: the trainer ends the worker. Given a `core`, it runs
    there, and so do the processes its envs start (`env.worker_affinity`; a core taken away since is ignored)."""
    parent_end.close()
    if core is not None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {core})
    release = _lead_own_group(scratch)  # what this worker starts ends with it, however it ends
    envs = None
    try:
        envs = gym.vector.SyncVectorEnv(thunks.fn, copy=False, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        pipe.send(("ok", (envs.single_observation_space, envs.single_action_space)))
        wire = StepWire(envs.single_observation_space, envs.single_action_space, envs.num_envs)
        while True:
            message = pipe.recv_bytes()
            command, data = ("step", wire.actions_of(message)) if is_raw(message) else ForkingPickler.loads(message)
            if command == "step":  # answered raw where the result fits the spaces (`StepWire`), else pickled
                result = envs.step(data)
                pipe.send_bytes(wire.result_message(result) or ForkingPickler.dumps(("ok", result)))
            elif command == "reset":
                pipe.send(("ok", envs.reset(seed=data[0], options=data[1])))
            else:  # close
                pipe.send(("ok", None))
                break
    except EOFError:
        pass  # the trainer is gone
    except Exception as exc:  # noqa: BLE001 - raised again in the trainer by _answer
        with contextlib.suppress(OSError):
            pipe.send(("error", _error(exc, with_trace=True)))
    finally:
        try:
            if envs is not None:
                envs.close()
        finally:
            release()


class Workers(gym.vector.VectorEnv):
    """The envs of `chunks` (one list of env factories per worker process) as one vector env in
    SAME_STEP autoreset mode, every wait on a worker bounded by `timeout` seconds.

    Each of the four waits (start, reset, step, close) raises EnvWorkerError (`env <id>: worker <w>
    (envs a-b) did not answer <what> within <t> s`, or how a dead worker ended), after killing every
    worker of this vector env and the processes they started: SIGTERM is not enough, since a forked
    worker inherits the trainer's signal handlers, and a killed worker's children (ViZDoom's game)
    would live on. Worker and env numbers count across the groups of a GroupedVectorEnv (`first_worker`
    and `first_env` are this group's first). The spaces are `described` (`probe_env`); a worker
    whose envs have other spaces fails the start."""

    def __init__(
        self, chunks: Sequence[Sequence[Callable[[], gym.Env]]], described: EnvDescription, *, env_id: str, first_worker: int, first_env: int,
        timeout: float, context: str | None = None, cores: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        self.env_id, self.timeout = env_id, timeout
        sizes = [len(chunk) for chunk in chunks]
        bounds = np.cumsum([0, *sizes])
        self.rows = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        """Each worker's envs, as rows of the batch."""
        hosts = [f"envs {first_env + r.start}-{first_env + r.stop - 1}" if n > 1 else "" for n, r in zip(sizes, self.rows)]
        self.names = [f"worker {first_worker + w}" + (f" ({h})" if h else "") for w, h in enumerate(hosts)]
        """Each worker in the messages of timeouts and deaths: `worker 3`, or `worker 1 (envs 2-3)`."""
        self.places = [f"worker {first_worker + w}" + (f", {h}" if h else "") for w, h in enumerate(hosts)]
        """Where an env's RunError came from, at the end of its line: `(worker 3)`, or `(worker 1, envs 2-3)`."""
        self.num_envs = int(bounds[-1])
        self.single_observation_space, self.single_action_space = described.observation_space, described.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = {**described.metadata, "autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
        self.render_mode = described.render_mode
        self.wires = [StepWire(self.single_observation_space, self.single_action_space, r.stop - r.start) for r in self.rows]
        """Each worker's raw step messages."""
        self.closed = False
        self._failed = False
        self._started = time.time()
        self._pending: str | None = None
        ctx = multiprocessing.get_context(context)
        self.pipes: list[multiprocessing.connection.Connection] = []
        self.processes: list[Any] = []
        self.pollers: list[select.poll] = []
        """Each pipe's poll object, registered once (`_answer`)."""
        self.scratches: list[str] = []
        """Each worker's temporary directory: what a killed env leaves there goes with it."""
        self._at_exit = functools.partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._at_exit)
        try:
            with clear_mpi_env_vars():
                for w, chunk in enumerate(chunks):
                    pipe, child_end = ctx.Pipe()
                    self.scratches.append(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
                    core = None if cores is None else cores[w]
                    process = ctx.Process(target=_serve, args=(CloudpickleWrapper(list(chunk)), child_end, pipe, self.scratches[-1], core), name=f"EnvWorker-{first_worker + w}", daemon=True)
                    process.start()
                    child_end.close()
                    self.pipes.append(pipe)
                    self.processes.append(process)
                    self.pollers.append(select.poll())
                    self.pollers[-1].register(pipe.fileno(), select.POLLIN)
            for (observation_space, action_space), name in zip(self._gather("start"), self.names):
                if observation_space != self.single_observation_space or action_space != self.single_action_space:
                    raise EnvWorkerError(
                        f"env {env_id}: {name} built envs with observation space {observation_space} and action space {action_space}, "
                        f"where the spaces probe's had {self.single_observation_space} and {self.single_action_space}: every env of a run needs the same spaces"
                    )
        except BaseException:
            self._fail()
            raise

    def reset_async(self, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None) -> None:
        if seed is None or isinstance(seed, int):
            seed = [None if seed is None else seed + i for i in range(self.num_envs)]
        if len(seed) != self.num_envs:
            raise ValueError(f"{len(seed)} seeds for {self.num_envs} envs")
        self._send("reset", [(list(seed[rows]), options) for rows in self.rows])

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        answers = self._gather("reset", timeout)
        return concat_batches([obs for obs, _ in answers]), concat_infos([info for _, info in answers], [r.stop - r.start for r in self.rows])

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

    def step_async(self, actions: Any) -> None:
        rows = [batch_rows(actions, r) for r in self.rows]
        raw = [wire.actions_message(part) for wire, part in zip(self.wires, rows)]
        self._send("step", rows, None if None in raw else raw)

    def step_wait(self, timeout: float | None = None) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        answers = [wire.result_of(a) if isinstance(a, bytes) else a for wire, a in zip(self.wires, self._gather("step", timeout))]
        obs, reward, terminated, truncated, infos = zip(*answers)
        return (
            concat_batches(obs), np.concatenate(reward), np.concatenate(terminated), np.concatenate(truncated),
            concat_infos(infos, [r.stop - r.start for r in self.rows]),
        )  # fmt: skip

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        self.step_async(actions)
        return self.step_wait()

    def _send(self, command: str, data: Sequence[Any], raw: Sequence[bytes] | None = None) -> None:
        """`command` with each worker's item of `data`, pickled, or the messages `raw` where given (a step's, `StepWire`)."""
        if self.closed or self._failed:
            raise EnvWorkerError(f"env {self.env_id}: the workers were {'closed' if self.closed else 'stopped after a failure'}")
        if self._pending is not None:
            raise RuntimeError(f"env {self.env_id}: {command} sent while a {self._pending} is pending")
        messages = raw if raw is not None else [ForkingPickler.dumps((command, item)) for item in data]
        with self._dead_named(command):
            for pipe, message in zip(self.pipes, messages):
                pipe.send_bytes(message)
        self._pending = command

    def _gather(self, doing: str, timeout: float | None = None) -> list[Any]:
        """Every worker's answer to `doing`, each within what is left of `timeout` seconds (the
        configured bound by default). On any failure every worker is killed before the error rises."""
        if self._pending not in (None, doing):
            raise RuntimeError(f"env {self.env_id}: waiting for {doing} while a {self._pending} is pending")
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        answers = []
        try:
            for pipe, process, name, place, poller in zip(self.pipes, self.processes, self.names, self.places, self.pollers):
                answers.append(_answer(pipe, process, f"env {self.env_id}: {name}", doing, limit, max(deadline - time.monotonic(), 0.0), place, poller))
        except BaseException:
            self._fail()
            raise
        self._pending = None
        return answers

    @contextlib.contextmanager
    def _dead_named(self, doing: str) -> Iterator[None]:
        """A send to a worker that died (a broken pipe) as an EnvWorkerError saying which one and how it ended."""
        try:
            yield
        except (BrokenPipeError, ConnectionResetError, EOFError) as exc:
            ended = multiprocessing.connection.wait([p.sentinel for p in self.processes], timeout=1.0)
            dead = [w for w, p in enumerate(self.processes) if p.sentinel in ended]
            self._fail()
            if not dead:
                raise EnvWorkerError(f"env {self.env_id}: a worker stopped answering during {doing}") from exc
            raise EnvWorkerError(f"env {self.env_id}: {self.names[dead[0]]} {how_it_ended(self.processes[dead[0]].exitcode)} during {doing}") from exc

    def _fail(self) -> None:
        """End the workers and what they started, once (a failure, then the close that follows, call it twice)."""
        if self._failed:
            return
        self._failed = True
        end_workers(self.processes, self._started)
        for scratch in self.scratches:
            shutil.rmtree(scratch, ignore_errors=True)

    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Close the workers within the timeout; kill them (with their children) when that is asked
        for, when a call is still pending, when they failed, or when they do not close in time."""
        limit = self.timeout if timeout is None else timeout
        try:
            if not (terminate or self._failed or self._pending is not None):
                self._send("close", [None] * len(self.pipes))
                self._gather("close", limit)
                deadline = time.monotonic() + limit
                for process, name in zip(self.processes, self.names):  # a worker closes its envs after it answered
                    process.join(max(deadline - time.monotonic(), 0.0))
                    if process.exitcode is None:
                        raise EnvWorkerError(f"env {self.env_id}: {name} did not answer close within {limit:g} s")
        finally:
            self._fail()
            for pipe in self.pipes:
                pipe.close()
            atexit.unregister(self._at_exit)


def _close_at_exit(workers: weakref.ref[Workers]) -> None:
    """At the exit of a program that never closed its workers (an exception, or a script that ends
    without `close`): close them. Otherwise multiprocessing's own exit hook would SIGTERM the workers
    alone, and their children (ViZDoom's game engines) would live on, orphans, for ever. A close that
    raises kills the workers (with their engines and files): that hook then joins its children without
    a bound, and a worker ignores the SIGTERM it sends them first (`leave_stops_to_the_trainer`)."""
    envs = workers()
    if envs is not None and not envs.closed:
        try:
            envs.close()
        except BaseException:
            envs._fail()
            raise


STOP_WAIT_S = 1.0
"""How long `kill_trees` waits for a process it stopped to stop (one in an uninterruptible wait does not), before it kills."""


def end_workers(workers: Sequence[Any], started: float) -> None:
    """Kill these worker processes (multiprocessing's, each leading its group: `_lead_own_group`), live or dead,
    with all they started, and reap them. A worker that died by itself (killed from outside, a crash, an exit in a
    user's env) leaves its game in its group, and may leave files it alone held (its game's message queues, made
    since `started`, which `kill_trees` removes then)."""
    live = [p.pid for p in workers if p.pid is not None and p.exitcode is None]
    died = any(p.exitcode not in (None, 0) for p in workers)  # before the kill below: not by a clean close, nor by it
    kill_trees(live, groups=[p.pid for p in workers if p.pid is not None], since=started if died else None)
    for process in workers:
        process.join(5.0)  # killed: gone as soon as the kernel has reaped it


def kill_trees(pids: Sequence[int], groups: Sequence[int] = (), since: float | None = None) -> None:
    """SIGKILL these processes, every process of this session in the process groups `groups` (those env workers
    lead: a dead worker's game is still there), and every process under them, and remove the shared memory only
    they held (hpcrl.leftovers), and, given `since`, the games' files made since then that nobody holds (what a
    process that died before held alone). Each is stopped before the next listing, and the listing repeats until
    it finds none new, so that nothing they start goes unlisted (from /proc; without /proc, only the processes)."""
    session, leaders = os.getsid(0), set(groups)
    victims = stop_all_found(lambda: _trees(pids, leaders, session), STOP_WAIT_S)
    if victims or since is not None:
        kill_holding(victims, STOP_WAIT_S, since=since)  # stopped: a game engine in its start makes its files no later


def _trees(pids: Sequence[int], groups: set[int], session: int) -> list[int]:
    """`pids`, the processes of `session` in `groups`, and every process under them, parents first."""
    children: dict[int, list[int]] = {}
    found = list(pids)
    for pid in processes():
        if (stat := process_stat(pid)) is not None:  # None: gone meanwhile
            children.setdefault(stat.parent, []).append(pid)
            if stat.group in groups and stat.session == session and stat.live:
                found.append(pid)
    found = list(dict.fromkeys(found))  # a group's member may be under a listed process too
    seen = set(found)
    for pid in found:  # grows as it goes: breadth first down the trees
        for child in children.get(pid, ()):
            if child not in seen:
                seen.add(child)
                found.append(child)
    return found


def batch_rows(batch: Any, rows: slice) -> Any:
    """Rows `rows` of a batch: an array, or a dict or tuple of them (Dict and Tuple spaces)."""
    if isinstance(batch, dict):
        return {k: batch_rows(v, rows) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(batch_rows(v, rows) for v in batch)
    return batch[rows]


def concat_batches(parts: Sequence[Any]) -> Any:
    """Consecutive batches as one: arrays, or dicts or tuples of them. One batch is itself, not a copy
    (each is a fresh answer of a worker or a group, owned by nobody else)."""
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], dict):
        return {k: concat_batches([p[k] for p in parts]) for k in parts[0]}
    if isinstance(parts[0], tuple):
        return tuple(concat_batches(list(p)) for p in zip(*parts))
    return np.concatenate(parts)


def concat_infos(parts: Sequence[dict[str, Any]], sizes: Sequence[int]) -> dict[str, Any]:
    """Vector infos of consecutive batches as the info of one vector env: a key some batch lacks
    is filled for its envs as gymnasium fills an env without it (zeros, False, None). One info is itself."""
    if len(parts) == 1:
        return parts[0]
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for p in parts for k in p):
        values = [p.get(key) for p in parts]
        like = next(v for v in values if v is not None)
        if isinstance(like, dict):
            out[key] = concat_infos([v if v is not None else {} for v in values], sizes)
        else:
            out[key] = np.concatenate([v if v is not None else _blank(like, n) for v, n in zip(values, sizes)])
    return out


def _blank(like: np.ndarray, n: int) -> np.ndarray:
    """An info array for n envs that did not report it, shaped and typed like `like`."""
    return np.full(n, None, dtype=object) if like.dtype == object else np.zeros((n, *like.shape[1:]), like.dtype)
