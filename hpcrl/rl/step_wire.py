"""A vector step's messages between the trainer and an env worker, as raw bytes where they can be.

Every step crosses a worker's pipe twice: the actions of its envs one way, their observations,
rewards, ends and infos the other. Pickled (multiprocessing's `Connection.send`), each crossing
reduces every array to a pickle and builds it again on the other side; on 2 cores, with 8 ViZDoom
envs in 4 workers, sending the actions took 0.16 ms of the trainer's rollout thread a vector step
(0.085 ms raw), a third of that thread's CPU beside the policy's forward pass, and the thread's time
is the rollout's pace. As raw bytes, the arrays are their buffers one after another, in the order
and dtypes both sides know from the spaces (`StepWire`): PPO made 2,123-2,170 env steps/s against
1,996-2,032 pickled, random actions 4,249-4,295 against 3,628-3,794 (benchmarks/vizdoom_speed.py,
alternated runs).

What does not fit (a Dict or Tuple space, an observation or action of another dtype or shape
than its space's, rewards that are not float64) goes pickled as before, whole, so a lying env
meets the same checks. An info goes pickled after the arrays, and only where it has something
in it (at an episode's end, SAME_STEP autoreset's final observation and info).
"""

from __future__ import annotations

import multiprocessing.reduction
from typing import Any

import gymnasium as gym
import numpy as np

RAW = b"S"
"""The first byte of a raw message; a pickle (protocol 2 or later) starts with 0x80."""


def is_raw(message: bytes) -> bool:
    """Whether `message` is a raw step message (else a pickle)."""
    return message[:1] == RAW


def _fits(array: Any, dtype: np.dtype, shape: tuple[int, ...]) -> bool:
    return isinstance(array, np.ndarray) and array.dtype == dtype and array.shape == shape


class StepWire:
    """The raw messages of one worker's `num_envs` envs, whose spaces are `observation_space` and
    `action_space` (each env's): Box or Discrete spaces, whose dtype and shape fix every buffer's size."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, num_envs: int) -> None:
        self.num_envs = num_envs
        self.obs = self._layout(observation_space, num_envs)
        self.actions = self._layout(action_space, num_envs)
        self._obs_count = 0 if self.obs is None else int(np.prod(self.obs[1]))
        """The observations' number of items, counted once (np.prod takes half of a decode's time)."""
        self._ends_at = len(RAW) + self._obs_count * (0 if self.obs is None else self.obs[0].itemsize)
        """Where the observations end and the rewards begin in a raw result."""

    @staticmethod
    def _layout(space: gym.Space, n: int) -> tuple[np.dtype, tuple[int, ...]] | None:
        """(dtype, batched shape) of a space whose batch is one array; None for any other."""
        if isinstance(space, (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)) and space.dtype is not None:
            return np.dtype(space.dtype), (n, *space.shape)
        return None

    def actions_message(self, actions: Any) -> bytes | None:
        """The raw message of these actions (the worker's rows), or None where they must go pickled."""
        if self.actions is None or not _fits(actions, *self.actions):
            return None
        return RAW + actions.tobytes()

    def actions_of(self, message: bytes) -> np.ndarray:
        """The actions of a raw message (a fresh, writable array: an env may keep or change what it is given)."""
        assert self.actions is not None
        dtype, shape = self.actions
        return np.frombuffer(message, dtype, offset=len(RAW)).reshape(shape).copy()

    def result_message(self, result: tuple[Any, Any, Any, Any, dict[str, Any]]) -> bytes | None:
        """The raw message of a vector step's (obs, rewards, terminated, truncated, info), or None where it
        must go pickled."""
        obs, rewards, terminated, truncated, info = result
        n = self.num_envs
        if self.obs is None or not (_fits(obs, *self.obs) and _fits(rewards, np.dtype(np.float64), (n,))
                                    and _fits(terminated, np.dtype(np.bool_), (n,)) and _fits(truncated, np.dtype(np.bool_), (n,))):  # fmt: skip
            return None
        parts = [RAW, obs.tobytes(), rewards.tobytes(), terminated.tobytes(), truncated.tobytes()]
        if info:
            parts.append(multiprocessing.reduction.ForkingPickler.dumps(info))
        return b"".join(parts)

    def result_of(self, message: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """The vector step of a raw message: fresh, writable arrays (the message copied once), and its info."""
        assert self.obs is not None
        dtype, shape = self.obs
        n, at = self.num_envs, self._ends_at
        data = bytearray(message)  # writable, as unpickled arrays are (torch.from_numpy warns of a read-only one)
        obs = np.frombuffer(data, dtype, self._obs_count, len(RAW)).reshape(shape)
        rewards = np.frombuffer(data, np.float64, n, at)
        terminated = np.frombuffer(data, np.bool_, n, at + 8 * n)
        truncated = np.frombuffer(data, np.bool_, n, at + 9 * n)
        at += 10 * n
        info = multiprocessing.reduction.ForkingPickler.loads(data[at:]) if len(data) > at else {}
        return obs, rewards, terminated, truncated, info
