"""Vectorised environments from an `env:` config section.

All backends produce a gymnasium VectorEnv in SAME_STEP autoreset mode: a finished sub-env is
reset inside the same `step` and its last observation arrives in `info["final_obs"]`. That keeps
every rollout transition real (NEXT_STEP mode's extra "reset step" would have to be masked) and
gives truncated episodes the observation needed to bootstrap their value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from hpcrl.config import EnvConfig

# Simulators pay for inter-process communication; cheap envs do not (see notes: CartPole runs
# 5x faster in SyncVectorEnv than in AsyncVectorEnv).
_ASYNC_BACKENDS = {"vizdoom", "habitat"}


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
    """One environment with the config's wrappers (frame stacking for pixel observations)."""
    env = BACKENDS[spec.backend](spec, render_mode)
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
        envs = gym.vector.AsyncVectorEnv(thunks, **kwargs)
    else:
        envs = gym.vector.SyncVectorEnv(thunks, **kwargs)
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


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
