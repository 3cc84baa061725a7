"""What an env returns is checked where it returns it: an env that lies is named, not learned from.

An observation whose shape drifts from the env's declared observation space failed deep inside
numpy (`all input arrays must have the same shape`) when the vector env batched it; a NaN in an
observation or a reward trained on and ended as `non-finite loss ...: lower train.lr`, blaming the
learning rate for the env's output. Every env `make_env` builds is wrapped in `CheckedOutput`,
innermost (before frame stacking, which would fail on a changed shape first), so the check runs
in whichever process steps the env, and the run fails with one line naming the env, the call and
what it returned. It costs a shape comparison per step, and a finiteness test of float
observations (integer pixels cannot hold a NaN).
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

from hpcrl.store.rundir import RunError


class EnvOutputError(RunError):
    """An env returned what its own spaces (or any learner) cannot take: the run fails with this line."""


class CheckedOutput(gym.Wrapper):
    """The env `env_id`, with every observation checked against its observation space (shape, and
    finite values where the space is of floats) and every reward checked to be finite."""

    def __init__(self, env: gym.Env, env_id: str) -> None:
        super().__init__(env)
        self.env_id = env_id

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self._check("reset", obs, 0.0)
        return obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._check("step", obs, reward)
        return obs, reward, terminated, truncated, info

    def _check(self, call: str, obs: Any, reward: Any) -> None:
        fault = observation_fault(self.observation_space, obs)
        if fault is None and not _finite(reward):
            fault = f"a reward of {reward!r}"
        if fault is not None:
            raise EnvOutputError(f"env {self.env_id}: {call} returned {fault}")


def observation_fault(space: gym.Space, obs: Any) -> str | None:
    """What is wrong with `obs` as an observation of `space`, in words, or None. Box spaces (and
    Box entries of a Dict) are checked; other spaces are the env's own business."""
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(obs, dict) or set(obs) != set(space.spaces):
            keys = sorted(obs) if isinstance(obs, dict) else type(obs).__name__
            return f"an observation with keys {keys}, not its observation space's {sorted(space.spaces)}"
        for key, sub in space.spaces.items():
            fault = observation_fault(sub, obs[key])
            if fault is not None:
                return f"{fault} under {key!r}"
        return None
    if not isinstance(space, gym.spaces.Box):
        return None
    try:
        array = np.asarray(obs)
    except ValueError:  # a ragged nest of lists
        return f"an observation that is no array ({type(obs).__name__} of uneven lengths)"
    if array.shape != space.shape:
        return f"an observation of shape {array.shape}, not its observation space's {space.shape}"
    if np.issubdtype(space.dtype, np.floating) and array.dtype.kind in "fc":
        bad = ~np.isfinite(array)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            return f"an observation holding {array[where]} at index {where}"
    return None


def _finite(reward: Any) -> bool:
    try:
        return math.isfinite(float(reward))
    except (TypeError, ValueError):
        return False
