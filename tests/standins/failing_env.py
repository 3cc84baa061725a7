"""A user's gymnasium env that misbehaves in a vector env's worker process, for tests only.

`gym.make("failing_env:FailingEnv-v0", fail_in=..., how=..., seed=...)` (with this folder on the
PYTHONPATH, as a user's own module would be): a CartPole-sized env (Box(4) observations, two
actions, episodes of 20 steps) that, in a worker process only, hangs for ever (`how: hang`) or
exits (`how: exit`, code 3) when it is started (`fail_in: start`, every worker: no seed is known
yet), or, in the env whose first reset had seed `seed` (with a run's seed 0, env i), at its first
reset, its third step, or its close. With `everywhere=True` every env fails there, in any process,
as the copy gymnasium's AsyncVectorEnv builds in the trainer's own process to read the spaces would
(only `start` and `close` can be reached without a reset). An env that lies instead (`lie: shape`
or `lie: nan`) returns, at the failing env's third step and in any process, an observation of
shape (5,) or one holding a NaN; with `lie: space` its observation space is Box(5) in a worker process
(Box(4) in the probe and in the trainer). Each process's env writes its process id into `pid_dir` when given, so
a test can check that no worker outlives the run.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any

import gymnasium as gym
import numpy as np


class FailingEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, fail_in: str = "", how: str = "hang", seed: int = 0, pid_dir: str | None = None, everywhere: bool = False, lie: str = "") -> None:
        self.fail_in, self.how, self.failing_seed, self.everywhere, self.lie = fail_in, how, seed, everywhere, lie
        self.failing = everywhere
        self.t = 0
        in_child = multiprocessing.parent_process() is not None
        # hpcrl reads the spaces from a probe process (`Worker<probe>-0`) that fails only `everywhere`
        self.in_worker = in_child and "<probe>" not in multiprocessing.current_process().name
        if lie == "space" and self.in_worker:
            self.observation_space = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)
        if pid_dir and in_child:
            with open(os.path.join(pid_dir, str(os.getpid())), "w"):
                pass
        if fail_in == "start":
            self._fail()

    def _fail(self) -> None:
        if not (self.in_worker or self.everywhere):  # gymnasium builds one copy in the main process, to read the spaces
            return
        if self.how == "exit":
            os._exit(3)
        while True:
            time.sleep(3600)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None:
            self.failing = seed == self.failing_seed
            if self.failing and self.fail_in == "reset":
                self._fail()
        self.t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        if self.failing and self.fail_in == "step" and self.t == 3:
            self._fail()
        obs = np.full(4, self.t / 20, np.float32)
        if self.failing and self.t == 3 and self.lie:
            obs = np.zeros(5, np.float32) if self.lie == "shape" else np.array([0.1, np.nan, 0.3, 0.4], np.float32)
        return obs, 1.0, False, self.t >= 20, {}

    def close(self) -> None:
        if self.failing and self.fail_in == "close":
            self._fail()


gym.register("FailingEnv-v0", entry_point=FailingEnv)
