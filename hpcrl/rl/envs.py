"""Vectorised environments from an `env:` config section.

All backends produce a gymnasium VectorEnv in SAME_STEP autoreset mode: a finished sub-env is
reset inside the same `step` and its last observation arrives in `info["final_obs"]`. That keeps
every rollout transition real (NEXT_STEP mode's extra "reset step" would have to be masked) and
gives truncated episodes the observation needed to bootstrap their value.

Simulators step in worker processes (hpcrl.rl.env_workers.Workers), each hosting a share of the
envs (`env.envs_per_worker`; two workers per usable core by default), the workers split into two
groups that a rollout can step one at a time (`GroupedVectorEnv`): where the policy runs on a GPU
(hpcrl.rl.ppo's `pipelined`), while one group's workers step the learner runs the policy on the
other group's observations, so inference and simulation overlap instead of taking turns. For
everyone else the groups are one vector env with the usual `step`.

No wait on a worker is unbounded, nor is the trainer's own process ever given a user's env to build
or close (hpcrl.rl.env_workers). A user's env that runs in the trainer's own process
(`env.vectorization: sync`, the evaluation video's env) has every call bounded there by the same
setting, `env.worker_timeout_s` (hpcrl.rl.env_deadline).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from hpcrl.config.experiment import EnvConfig
from hpcrl.cores import allowed_cores, usable_cores
from hpcrl.rl.env_deadline import BoundedEnv, BoundedVectorEnv, Deadline, known
from hpcrl.rl.env_output import CheckedOutput
from hpcrl.rl.env_workers import Workers, batch_rows, concat_batches, concat_infos, probe_env
from hpcrl.runtime.lifeline import die_with_parent

# Simulators pay for inter-process communication; cheap envs do not (see notes: CartPole runs
# 5x faster in SyncVectorEnv than in AsyncVectorEnv).
_ASYNC_BACKENDS = {"vizdoom", "habitat"}
PIPELINE_GROUPS = 2
"""Worker groups of an async vector env: two are enough for one group to step while the policy
runs on the other's observations (see `pipeline_groups`)."""


def workers_for(num_envs: int, envs_per_worker: int | None, cores: int) -> int:
    """The worker processes that step `num_envs` envs: `envs_per_worker` in each (the last ones one
    fewer where it does not divide), or by default two per usable core, each hosting its share. Two,
    so that each of the two worker groups (`pipeline_groups`) has a worker for every core: where the
    rollout pipelines the groups (a GPU's forward pass), one group's workers keep the cores busy
    while the policy acts on the other's frames. On 2 CPU cores, without pipelining, 8 ViZDoom envs
    in 4 workers of 2 and in 2 of 4 measured alike (async PPO 1,547 / 1,608 and 1,608 / 1,541 env
    steps/s), against 1,435 / 1,438 in 8 of one (benchmarks/vizdoom_speed.py)."""
    return min(num_envs, math.ceil(num_envs / envs_per_worker) if envs_per_worker else 2 * cores)


PINNED_BACKENDS = {"vizdoom"}
"""Backends whose worker processes `worker_affinity: auto` pins: a ViZDoom game's engine is a process of one
thread that steps only while its worker waits for it."""


def worker_cores(affinity: str, backend: str, workers: int, allowed: Sequence[int], offset: int = 0) -> list[int] | None:
    """The core of each of `workers` worker processes (`env.worker_affinity`), from the cores `allowed`
    to this process, starting at the `offset`-th; None where they run free.

    Pinned, a worker and its engine pass each step to each other on one core. On the 2-core Xeon VM a
    ViZDoom game's `new_episode` took 0.50 ms with both on one core against 1.68 ms on two, a step 0.13
    against 0.39 ms (each wake-up across the two virtual CPUs costs about 0.1 ms); with 8 envs in 4
    workers, random actions ran 34% faster and PPO 12% (benchmarks/vizdoom_speed.py). `auto` pins only
    where the workers cover every core: fewer, pinned, would leave cores idle, and every run on a node
    without a cpuset of its own would pin to the same first ones."""
    if not allowed or affinity == "free" or (affinity == "auto" and (backend not in PINNED_BACKENDS or workers < len(allowed))):
        return None
    cores = sorted(allowed)
    return [cores[(offset + w) % len(cores)] for w in range(workers)]


def pipeline_groups(workers: int, cores: int) -> int:
    """The worker groups for `workers` worker processes on `cores`: PIPELINE_GROUPS, or one where the workers
    are more than twice the cores. Then half of them alone already keep every core busy, so stepping
    one group while the policy runs on the other's frames hides nothing, and each group costs its own
    forward pass and pipe round trips per step: on 2 cores with 8 ViZDoom workers, one group of 8
    used 0.65 ms of the learner's CPU per env step against 0.75 ms for two of 4 (async PPO,
    benchmarks/vizdoom_speed.py's CPU column)."""
    return 1 if workers > 2 * cores else min(PIPELINE_GROUPS, workers)


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


def make_vec_env(spec: EnvConfig, num_envs: int | None = None, render_mode: str | None = None, *, pipelined: bool = False) -> gym.vector.VectorEnv:
    """`num_envs` copies stepped together, with episode statistics in `info["episode"]`. Async envs
    sit in worker processes, in `pipeline_groups` groups where `pipelined` (a rollout that steps one
    group while the policy acts on another's frames: hpcrl.rl.algorithms.pipelines_envs), else in one:
    stepped together, two groups cost a second round of messages, merges and episode statistics at
    every step (the rollout thread of async PPO on configs/vizdoom_ppo.yaml, 2 cores: 1.45-1.46 ms of
    CPU a vector step in one group against 1.52-1.54 in two)."""
    if spec.normalize_obs:
        # Statistics kept in env wrappers would differ per worker and be lost to evaluation.
        raise ValueError("env.normalize_obs is not supported: set train.normalize_obs, which keeps the statistics in the policy")
    n = num_envs or spec.num_envs
    thunks = [lambda: make_env(spec, render_mode) for _ in range(n)]
    mode = spec.vectorization
    if mode == "auto":
        mode = "async" if spec.backend in _ASYNC_BACKENDS and n > 1 else "sync"
    if mode == "async":
        # Simulators that render on the GPU must not inherit a parent's CUDA state through fork
        # (evaluation starts its envs after the policy is on the GPU); habitat-baselines uses
        # forkserver for the same reason.
        context = "forkserver" if spec.backend == "habitat" else None
        described = probe_env(_worker_thunk(thunks[0]), env_id=spec.id, timeout=spec.worker_timeout_s, context=context)
        cores = usable_cores()
        chunks = [[int(i) for i in chunk] for chunk in np.array_split(np.arange(n), workers_for(n, spec.envs_per_worker, cores))]
        # Round the cores from one this process's pid picks, so that runs sharing a node without cpusets put their extra workers apart.
        pinned = worker_cores(spec.worker_affinity, spec.backend, len(chunks), allowed_cores(), os.getpid())
        groups: list[gym.vector.VectorEnv] = []
        try:
            for part in np.array_split(np.arange(len(chunks)), pipeline_groups(len(chunks), cores) if pipelined else 1):
                first = int(part[0])
                workers = Workers(
                    [[_worker_thunk(thunks[i]) for i in chunks[w]] for w in part], described,
                    env_id=spec.id, first_worker=first, first_env=chunks[first][0], timeout=spec.worker_timeout_s, context=context,
                    cores=None if pinned is None else [pinned[int(w)] for w in part],
                )  # fmt: skip
                groups.append(gym.wrappers.vector.RecordEpisodeStatistics(_SendReceive(workers)))
        except BaseException:
            _close_all(groups)  # a group that did start must not outlive the one that did not
            raise
        return GroupedVectorEnv(groups)
    same_step = gym.vector.AutoresetMode.SAME_STEP
    return gym.wrappers.vector.RecordEpisodeStatistics(_here(spec, lambda: gym.vector.SyncVectorEnv(thunks, autoreset_mode=same_step), BoundedVectorEnv))


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
        return concat_batches([obs for obs, _ in results]), self._infos([info for _, info in results])

    def send(self, group: int, actions: Any) -> None:
        """Start group `group` stepping with its envs' actions (rows `slices[group]` of the batch)."""
        self.groups[group].env.send(actions)

    def receive(self, group: int) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Wait for the step `send` started; the group's (obs, reward, terminated, truncated, info)."""
        return self.groups[group].step(RECEIVE)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        for k, part in enumerate(self.slices):
            self.send(k, batch_rows(actions, part))
        results = [self.receive(k) for k in range(len(self.groups))]
        obs, reward, terminated, truncated, infos = zip(*results)
        return concat_batches(obs), np.concatenate(reward), np.concatenate(terminated), np.concatenate(truncated), self._infos(infos)

    def _infos(self, infos: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return concat_infos(infos, [g.num_envs for g in self.groups])

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
