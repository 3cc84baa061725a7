"""Vectorised environments from an `env:` config section.

All backends produce a gymnasium VectorEnv in SAME_STEP autoreset mode: a finished sub-env is
reset inside the same `step` and its last observation arrives in `info["final_obs"]`. That keeps
every rollout transition real (NEXT_STEP mode's extra "reset step" would have to be masked) and
gives truncated episodes the observation needed to bootstrap their value.

Simulators step in worker processes (AsyncVectorEnv), split into two groups that a rollout can
step one at a time (`GroupedVectorEnv`): while one group's workers step, the learner runs the
policy on the other group's observations, so inference and simulation overlap instead of taking
turns. For everyone else the groups are one vector env with the usual `step`.

No wait on a worker is unbounded (`Workers`): a worker that does not answer its start, a reset, a
step or its close within `env.worker_timeout_s`, or that dies, fails the run in one line naming the
env, the worker and what it was doing, and the vector env's workers are killed with whatever they
started (a ViZDoom worker's game is a process of its own). Nor is the trainer's own process ever
given a user's env to build or close: the spaces the workers need are read from worker 0's env in
a probe process (`probe_env`), under the same bound. A user's env that runs in the trainer's own
process (`env.vectorization: sync`, the evaluation video's env) has every call bounded there by the
same setting (hpcrl.rl.env_deadline).
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.async_vector_env import AsyncState
from gymnasium.vector.utils import CloudpickleWrapper, batch_space

from hpcrl.config.experiment import EnvConfig
from hpcrl.cores import usable_cores
from hpcrl.rl.env_deadline import BoundedEnv, BoundedVectorEnv, Deadline, known
from hpcrl.rl.env_output import CheckedOutput
from hpcrl.runtime.launch import how_it_ended
from hpcrl.runtime.lifeline import die_with_parent
from hpcrl.store.rundir import RunError

# Simulators pay for inter-process communication; cheap envs do not (see notes: CartPole runs
# 5x faster in SyncVectorEnv than in AsyncVectorEnv).
_ASYNC_BACKENDS = {"vizdoom", "habitat"}
PIPELINE_GROUPS = 2
"""Worker groups of an async vector env: two are enough for one group to step while the policy
runs on the other's observations (see `pipeline_groups`)."""


def pipeline_groups(num_envs: int, cores: int) -> int:
    """The worker groups for `num_envs` workers on `cores`: PIPELINE_GROUPS, or one where the workers
    are more than twice the cores. Then half of them alone already keep every core busy, so stepping
    one group while the policy runs on the other's frames hides nothing, and each group costs its own
    forward pass and pipe round trips per step: on 2 cores with 8 ViZDoom workers, one group of 8
    used 0.65 ms of the learner's CPU per env step against 0.75 ms for two of 4 (async PPO,
    benchmarks/vizdoom_speed.py's CPU column)."""
    return 1 if num_envs > 2 * cores else min(PIPELINE_GROUPS, num_envs)


def _gymnasium_env(spec: EnvConfig, render_mode: str | None) -> gym.Env:
    kwargs = dict(spec.kwargs)
    if render_mode:
        kwargs["render_mode"] = render_mode
    if spec.max_episode_steps:
        kwargs["max_episode_steps"] = spec.max_episode_steps
    return gym.make(spec.id, **kwargs)


def _vizdoom_env(spec: EnvConfig, render_mode: str | None) -> gym.Env:
    from hpcrl.rl.vizdoom_env import make_vizdoom_env

    return make_vizdoom_env(spec, render_mode)


def _habitat_env(spec: EnvConfig, render_mode: str | None) -> gym.Env:
    from hpcrl.rl.habitat_env import make_habitat_env

    return make_habitat_env(spec, render_mode)


BACKENDS: dict[str, Callable[[EnvConfig, str | None], gym.Env]] = {
    "gymnasium": _gymnasium_env,
    "vizdoom": _vizdoom_env,
    "habitat": _habitat_env,
}


def make_env(spec: EnvConfig, render_mode: str | None = None) -> gym.Env:
    """One environment with the config's wrappers: its output checked (`CheckedOutput`), then
    frame stacking for pixel observations."""
    env: gym.Env = CheckedOutput(BACKENDS[spec.backend](spec, render_mode), spec.id)
    if spec.frame_stack > 1:
        if not isinstance(env.observation_space, gym.spaces.Box):
            raise ValueError(f"env.frame_stack needs Box observations, {spec.id} has {type(env.observation_space).__name__} (use train.recurrent_size for memory)")
        env = gym.wrappers.FrameStackObservation(env, spec.frame_stack)
        if len(env.observation_space.shape) == 4:  # (stack, C, H, W) -> (stack*C, H, W) for a CNN
            env = _MergeStackedChannels(env)
    return env


class _MergeStackedChannels(gym.ObservationWrapper):
    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        k, c, h, w = space.shape
        self.observation_space = gym.spaces.Box(
            low=space.low.reshape(k * c, h, w), high=space.high.reshape(k * c, h, w), dtype=space.dtype
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation.reshape(self.observation_space.shape)


def make_vec_env(spec: EnvConfig, num_envs: int | None = None, render_mode: str | None = None) -> gym.vector.VectorEnv:
    """`num_envs` copies stepped together, with episode statistics in `info["episode"]`."""
    if spec.normalize_obs:
        # Statistics kept in env wrappers would differ per worker and be lost to evaluation.
        raise ValueError("env.normalize_obs is not supported: set train.normalize_obs, which keeps the statistics in the policy")
    n = num_envs or spec.num_envs
    thunks = [lambda: make_env(spec, render_mode) for _ in range(n)]
    mode = spec.vectorization
    if mode == "auto":
        mode = "async" if spec.backend in _ASYNC_BACKENDS and n > 1 else "sync"
    kwargs: dict[str, Any] = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    if mode == "async":
        if spec.backend == "habitat":
            # Simulators that render on the GPU must not inherit a parent's CUDA state through
            # fork (evaluation starts its envs after the policy is on the GPU); habitat-baselines
            # uses forkserver for the same reason.
            kwargs["context"] = "forkserver"
        described = probe_env(_worker_thunk(thunks[0]), env_id=spec.id, timeout=spec.worker_timeout_s, context=kwargs.get("context"))
        groups: list[gym.vector.VectorEnv] = []
        try:
            for part in np.array_split(np.arange(n), pipeline_groups(n, usable_cores())):
                thunks_of_part = [_worker_thunk(thunks[i]) for i in part]
                workers = Workers(thunks_of_part, described, env_id=spec.id, first=int(part[0]), timeout=spec.worker_timeout_s, **kwargs)
                groups.append(gym.wrappers.vector.RecordEpisodeStatistics(_SendReceive(workers)))
        except BaseException:
            _close_all(groups)  # a group that did start must not outlive the one that did not
            raise
        return GroupedVectorEnv(groups)
    return gym.wrappers.vector.RecordEpisodeStatistics(_here(spec, lambda: gym.vector.SyncVectorEnv(thunks, **kwargs), BoundedVectorEnv))


def make_env_here(spec: EnvConfig, render_mode: str | None = None) -> gym.Env:
    """One env in this process (the evaluation video's), a user's env with every call bounded like
    a sync vector env's (hpcrl.rl.env_deadline)."""
    return _here(spec, lambda: make_env(spec, render_mode), BoundedEnv)


def _here(spec: EnvConfig, build: Callable[[], Any], bounded: Callable[[Any, Deadline], Any]) -> Any:
    """`build()` in this process: as it is for gymnasium's own envs; a user's env built, and then
    called, under `env.worker_timeout_s` (hpcrl.rl.env_deadline)."""
    if spec.backend == "gymnasium" and known(spec.id):
        return build()
    deadline = Deadline(spec.id, spec.worker_timeout_s)
    with deadline("start"):
        built = build()
    return bounded(built, deadline)


def _worker_thunk(thunk: Callable[[], gym.Env]) -> Callable[[], gym.Env]:
    """An env factory for a worker process, whose numeric libraries (loaded there, or in the
    simulator's own processes) get one thread each: every worker already takes a core. The worker
    dies with the trainer (a SIGKILLed trainer's workers, holding each other's pipe ends, never saw
    end of file, and one stuck in the env's code lived on for ever)."""

    def make() -> gym.Env:
        die_with_parent()
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ[var] = "1"
        return thunk()

    return make


class EnvWorkerError(RunError):
    """An env worker process that did not answer in time, or died: the run fails with this line."""


@dataclasses.dataclass(frozen=True)
class EnvDescription:
    """What gymnasium's AsyncVectorEnv reads from a copy of the env before its workers start."""

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
    process = ctx.Process(target=_describe, args=(CloudpickleWrapper(thunk), child_end), name="Worker<probe>-0", daemon=True)
    process.start()
    child_end.close()
    try:
        described = _probe_answer(answers, process, env_id, timeout, "start")
        _probe_answer(answers, process, env_id, timeout, "close")
        process.join(timeout)
        return described
    finally:
        answers.close()
        if process.exitcode is None:
            _kill_trees([process.pid] if process.pid is not None else [])
            process.join(5.0)


def _probe_answer(answers: multiprocessing.connection.Connection, process: Any, env_id: str, timeout: float, doing: str) -> Any:
    """The probe's next answer; EnvWorkerError when it is late or the probe died; the env's own
    error when it raised one."""
    who = f"env {env_id}: worker 0's spaces probe"
    try:
        if not answers.poll(timeout):
            raise EnvWorkerError(f"{who} did not answer {doing} within {timeout:g} s")
        kind, value = answers.recv()
    except (EOFError, ConnectionResetError) as exc:
        process.join(1.0)  # its pipe closes as it exits, a moment before its exit code can be read
        raise EnvWorkerError(f"{who} {how_it_ended(process.exitcode) if process.exitcode is not None else 'stopped answering'} during {doing}") from exc
    if kind == "error":
        error_type, message = value
        try:
            error = error_type(message)
        except Exception:  # noqa: BLE001 - a type built from other arguments: its name and message
            error = RuntimeError(f"{error_type.__name__}: {message}")
        raise error
    return value


def _describe(thunk: CloudpickleWrapper, answers: multiprocessing.connection.Connection) -> None:
    """The probe process: build the env, send what describes it, close it, say so. An error the
    env raises goes back as its type and message (a traceback here would be a second message)."""
    try:
        die_with_parent()
        env = thunk()
        answers.send(("ok", EnvDescription(env.observation_space, env.action_space, dict(env.metadata), env.render_mode)))
        env.close()
        answers.send(("ok", None))
    except Exception as exc:  # noqa: BLE001 - raised again in the trainer by _probe_answer
        try:
            answers.send(("error", (type(exc), str(exc))))
        except Exception:  # noqa: BLE001 - a type that does not pickle: its name survives
            answers.send(("error", (RuntimeError, f"{type(exc).__name__}: {exc}")))


class _Described(gym.Env):
    """The env gymnasium's AsyncVectorEnv builds in the calling process to read the spaces,
    standing in for worker 0's real one with what the probe read from it."""

    def __init__(self, described: EnvDescription) -> None:
        self.observation_space, self.action_space = described.observation_space, described.action_space
        self.metadata, self.render_mode = dict(described.metadata), described.render_mode


class _RealOnlyInWorkers:
    """Worker 0's env factory: in the process that made it (the trainer), the stand-in for the
    env; in the worker process it is handed to, the env itself."""

    def __init__(self, thunk: Callable[[], gym.Env], described: EnvDescription) -> None:
        self.thunk, self.described, self.home = thunk, described, os.getpid()

    def __call__(self) -> gym.Env:
        return _Described(self.described) if os.getpid() == self.home else self.thunk()


class Workers(gym.vector.AsyncVectorEnv):
    """gymnasium's AsyncVectorEnv with every wait on a worker bounded by `timeout` seconds.

    gymnasium bounds `reset_wait` and `step_wait` when given a timeout, but not a worker's start
    (its first answer, after it built its env) nor its close, and on a timeout it neither names the
    worker nor stops it. Here each of the four waits raises EnvWorkerError (`env <id>: worker <i> did
    not answer <what> within <t> s`, or how a dead worker ended), after killing every worker of this
    vector env and the processes they started: SIGTERM is not enough, since a forked worker inherits
    the trainer's signal handlers, and a killed worker's children (ViZDoom's game) would live on.
    Worker numbers count across the groups of a GroupedVectorEnv (`first` is this group's first).
    The spaces are `described` (`probe_env`): gymnasium's own copy of the env in this process is a
    stand-in that holds them."""

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], described: EnvDescription, *, env_id: str, first: int, timeout: float, **kwargs: Any) -> None:
        self.env_id, self.first, self.timeout = env_id, first, timeout
        self._failed = False
        self._doing = "start"
        spaces = (batch_space(described.observation_space, len(env_fns)), described.observation_space)
        super().__init__([_RealOnlyInWorkers(env_fns[0], described), *env_fns[1:]], observation_mode=spaces, **kwargs)

    def _check_spaces(self) -> None:
        # Called once, by __init__, as the workers start; a worker builds its env before it reads
        # its first command, so the answer to a first cheap call is its start.
        with self._waiting("start"):
            for pipe in self.parent_pipes:
                pipe.send(("_call", ("render_mode", (), {})))
            self._poll_pipe_envs(self.timeout)
            for pipe in self.parent_pipes:
                pipe.recv()
        super()._check_spaces()

    def reset_async(self, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None) -> None:
        with self._waiting("reset"):
            super().reset_async(seed=seed, options=options)

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        with self._waiting("reset"):
            return super().reset_wait(self.timeout if timeout is None else timeout)

    def step_async(self, actions: Any) -> None:
        with self._waiting("step"):
            super().step_async(actions)

    def step_wait(self, timeout: float | None = None) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        with self._waiting("step"):
            return super().step_wait(self.timeout if timeout is None else timeout)

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        with self._waiting("call"):
            return super().call_wait(self.timeout if timeout is None else timeout)

    def _raise_if_errors(self, successes: Sequence[bool]) -> None:
        """Raise here what the workers' envs raised. A RunError (an env that returned what it must
        not) is one line with the worker named; any other error is a bug in the env, whose
        traceback is logged as gymnasium does. A worker that raised has left its loop: this vector
        env is spent."""
        successes = list(successes)
        if all(successes):
            return
        errors = [self.error_queue.get() for _ in range(len(successes) - sum(successes))]
        for index, *_ in errors:
            self.parent_pipes[index].close()
            self.parent_pipes[index] = None
        self._state = AsyncState.DEFAULT
        self._fail()
        for index, exctype, value, _ in errors:
            if issubclass(exctype, RunError):
                raise exctype(f"{value} (worker {self.first + index})")
        for index, _, _, trace in errors:
            gym.logger.error(f"env {self.env_id}: worker {self.first + index} raised:\n{trace}")
        _, exctype, value, _ = errors[-1]
        raise exctype(value)

    def _poll_pipe_envs(self, timeout: float | None = None) -> bool:
        """Every worker's answer is ready within `timeout` seconds, or EnvWorkerError names the first late one."""
        self._assert_is_running()
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        for i, pipe in enumerate(self.parent_pipes):
            if pipe is None or pipe.closed:  # its env raised earlier: this vector env is spent
                raise EOFError
            if not pipe.poll(max(deadline - time.monotonic(), 0.0)):
                self._fail()
                raise EnvWorkerError(f"env {self.env_id}: worker {self.first + i} did not answer {self._doing} within {limit:g} s")
        return True

    @contextlib.contextmanager
    def _waiting(self, doing: str) -> Iterator[None]:
        """Name what the workers are doing, for the timeout's message, and turn a worker that died
        (a closed pipe) into an EnvWorkerError that says which one and how it ended."""
        self._doing = doing
        try:
            yield
        except (EOFError, BrokenPipeError, ConnectionResetError) as exc:
            # A worker's pipe closes as it exits, a moment before its exit code can be read.
            ended = multiprocessing.connection.wait([p.sentinel for p in self.processes], timeout=1.0)
            dead = [i for i, p in enumerate(self.processes) if p.sentinel in ended]
            for i in dead:
                self.processes[i].join(1.0)
            self._fail()
            if not dead or self.processes[dead[0]].exitcode is None:
                raise EnvWorkerError(f"env {self.env_id}: a worker stopped answering during {doing}") from exc
            code = self.processes[dead[0]].exitcode
            raise EnvWorkerError(f"env {self.env_id}: worker {self.first + dead[0]} {how_it_ended(code)} during {doing}") from exc

    def _fail(self) -> None:
        self._failed = True
        _kill_trees([p.pid for p in self.processes if p.pid is not None and p.exitcode is None])
        for process in self.processes:
            process.join(5.0)  # killed: gone as soon as the kernel has reaped it

    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Close the workers within the timeout; kill them (with their children) when that is asked
        for, when a call is still pending, when they failed, or when they do not close in time."""
        limit = self.timeout if timeout is None else timeout
        try:
            if not (terminate or self._failed or self._state is not AsyncState.DEFAULT or None in self.parent_pipes):
                with self._waiting("close"):
                    for pipe in self.parent_pipes:
                        pipe.send(("close", None))
                    self._poll_pipe_envs(limit)
                    for pipe in self.parent_pipes:
                        pipe.recv()
                deadline = time.monotonic() + limit
                for i, process in enumerate(self.processes):  # a worker closes its env after it answered
                    process.join(max(deadline - time.monotonic(), 0.0))
                    if process.exitcode is None:
                        self._fail()
                        raise EnvWorkerError(f"env {self.env_id}: worker {self.first + i} did not answer close within {limit:g} s")
        finally:
            self._fail()
            for pipe in self.parent_pipes:
                if pipe is not None:
                    pipe.close()


def _kill_trees(pids: Sequence[int]) -> None:
    """SIGKILL these processes and every process under them. Each is stopped first, so that it
    starts nothing while its descendants are listed (from /proc; without /proc, only the processes)."""
    if not pids:
        return
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    children: dict[int, list[int]] = {}
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    with open(os.path.join(entry.path, "stat")) as f:
                        ppid = int(f.read().rpartition(")")[2].split()[1])
                except (OSError, IndexError, ValueError):
                    continue  # gone meanwhile
                children.setdefault(ppid, []).append(int(entry.name))
    victims = list(pids)
    for pid in victims:  # grows as it goes: breadth first down the tree
        victims.extend(children.get(pid, ()))
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _close_all(envs: Sequence[gym.vector.VectorEnv], **kwargs: Any) -> None:
    """Close each env, also when one fails to close; then raise the first failure."""
    errors = []
    for env in envs:
        try:
            env.close(**kwargs)
        except Exception as exc:  # noqa: BLE001 - raised below, once the others are closed too
            errors.append(exc)
    if errors:
        raise errors[0]


class GroupedVectorEnv(gym.vector.VectorEnv):
    """Groups of envs in worker processes, stepped all together (`step`) or one group at a time
    (`send`, then `receive`), as one vector env: env i of the whole is env i of the groups in order.

    A rollout sends a group's actions, runs the policy on the next group's observations while the
    first group's workers step, and so on round the groups. Every env sees the same actions and
    seeds as in one AsyncVectorEnv; episode statistics are kept per group (each group is wrapped in
    RecordEpisodeStatistics) and `step` and `reset` concatenate the groups' infos.
    """

    def __init__(self, groups: Sequence[gym.vector.VectorEnv]) -> None:
        self.groups = list(groups)
        sizes = [g.num_envs for g in self.groups]
        bounds = np.cumsum([0, *sizes])
        self.slices = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        """The envs of each group, as a slice of the whole batch."""
        self.num_envs = int(bounds[-1])
        first = self.groups[0]
        self.single_observation_space = first.single_observation_space
        self.single_action_space = first.single_action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.metadata = dict(first.metadata)
        self.render_mode = first.render_mode
        self.closed = False

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if seed is None or isinstance(seed, int):
            seeds = [None if seed is None else seed + s.start for s in self.slices]
        else:
            seeds = [list(seed[s]) for s in self.slices]
        for g, sd in zip(self.groups, seeds):  # every group's envs reset (a simulator: start) at once
            g.env.send_reset(sd, options)
        results = [g.reset(seed=sd, options=options) for g, sd in zip(self.groups, seeds)]
        return _concat([obs for obs, _ in results]), self._infos([info for _, info in results])

    def send(self, group: int, actions: Any) -> None:
        """Start group `group` stepping with its envs' actions (rows `slices[group]` of the batch)."""
        self.groups[group].env.send(actions)

    def receive(self, group: int) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Wait for the step `send` started; the group's (obs, reward, terminated, truncated, info)."""
        return self.groups[group].step(RECEIVE)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        for k, part in enumerate(self.slices):
            self.send(k, _rows(actions, part))
        results = [self.receive(k) for k in range(len(self.groups))]
        obs, reward, terminated, truncated, infos = zip(*results)
        return _concat(obs), np.concatenate(reward), np.concatenate(terminated), np.concatenate(truncated), self._infos(infos)

    def _infos(self, infos: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return _concat_infos(infos, [g.num_envs for g in self.groups])

    def close_extras(self, **kwargs: Any) -> None:
        _close_all(self.groups, **kwargs)


RECEIVE = object()
"""The "actions" that make a `_SendReceive` collect the step already sent instead of sending one."""


class _SendReceive(gym.vector.VectorWrapper):
    """An AsyncVectorEnv's two halves of `step` through the wrappers above it: `send` starts a
    step; `step(RECEIVE)` collects it, so RecordEpisodeStatistics, which passes the actions down
    unchanged, counts it as any other step. Likewise `send_reset`, then `reset` collects it."""

    _reset_sent = False

    def send_reset(self, seed: int | list[int | None] | None, options: dict[str, Any] | None) -> None:
        self.env.reset_async(seed=seed, options=options)
        self._reset_sent = True

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if self._reset_sent:
            self._reset_sent = False
            return self.env.reset_wait()
        return self.env.reset(seed=seed, options=options)

    def send(self, actions: Any) -> None:
        self.env.step_async(actions)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        return self.env.step_wait() if actions is RECEIVE else self.env.step(actions)


def _rows(batch: Any, rows: slice) -> Any:
    return {k: v[rows] for k, v in batch.items()} if isinstance(batch, dict) else batch[rows]


def _concat(parts: Sequence[Any]) -> Any:
    if isinstance(parts[0], dict):
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return np.concatenate(parts)


def _concat_infos(parts: Sequence[dict[str, Any]], sizes: Sequence[int]) -> dict[str, Any]:
    """Vector infos of consecutive groups as the info of one vector env: a key some group lacks
    is filled for its envs as gymnasium fills an env without it (zeros, False, None)."""
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for p in parts for k in p):
        values = [p.get(key) for p in parts]
        like = next(v for v in values if v is not None)
        if isinstance(like, dict):
            out[key] = _concat_infos([v if v is not None else {} for v in values], sizes)
        else:
            out[key] = np.concatenate([v if v is not None else _blank(like, n) for v, n in zip(values, sizes)])
    return out


def _blank(like: np.ndarray, n: int) -> np.ndarray:
    """An info array for n envs that did not report it, shaped and typed like `like`."""
    return np.full(n, None, dtype=object) if like.dtype == object else np.zeros((n, *like.shape[1:]), like.dtype)


def final_observations(obs: np.ndarray | dict[str, np.ndarray], info: dict[str, Any]) -> np.ndarray | dict[str, np.ndarray]:
    """The true last observations of this step: `obs` with the finished envs' final_obs put back
    (per key for Dict observations)."""
    if "_final_obs" not in info or not info["_final_obs"].any():
        return obs
    finished = np.flatnonzero(info["_final_obs"])
    if isinstance(obs, dict):
        out = {key: value.copy() for key, value in obs.items()}
        for i in finished:
            for key in out:
                out[key][i] = info["final_obs"][i][key]
        return out
    out = obs.copy()
    for i in finished:
        out[i] = info["final_obs"][i]
    return out


def finished_episodes(info: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Returns and lengths of the episodes that ended at this step."""
    if "_episode" not in info or not info["_episode"].any():
        return np.empty(0), np.empty(0, dtype=np.int64)
    mask = info["_episode"]
    return info["episode"]["r"][mask].astype(np.float64), info["episode"]["l"][mask].astype(np.int64)


def episode_metrics(info: dict[str, Any], i: int) -> dict[str, float]:
    """Task metrics env `i` reported for the episode it just finished (Habitat: success, SPL,
    distance_to_goal). In SAME_STEP mode the finished episode's last info is batched under
    `info["final_info"]`; the top level holds the info of the reset that followed it."""
    final = info.get("final_info")
    if not final or not info["_final_info"][i] or "episode_metrics" not in final or not final["_episode_metrics"][i]:
        return {}
    metrics = final["episode_metrics"]
    return {k: float(v[i]) for k, v in metrics.items() if not k.startswith("_") and metrics[f"_{k}"][i]}
