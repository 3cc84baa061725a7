"""What an env returns is checked where it returns it (hpcrl.rl.env_output): each kind of lie is named in
one line, and what is not a lie passes. The env-level tests (a vector env, in workers and in the trainer's
process) are in test_env_workers.py; these hold the check itself to each case it words."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from hpcrl.rl.env_output import CheckedOutput, EnvOutputError, observation_fault

BOX = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
DICT = gym.spaces.Dict({"pos": BOX, "map": gym.spaces.Box(0, 255, (2, 2), np.uint8)})


@pytest.mark.parametrize(
    ("obs", "fault"),
    [
        ({"pos": np.zeros(4, np.float32)}, "an observation with keys ['pos'], not its observation space's ['map', 'pos']"),
        ({"pos": np.zeros(4, np.float32), "map": np.zeros((2, 2), np.uint8), "extra": 1}, "an observation with keys ['extra', 'map', 'pos'], not its observation space's ['map', 'pos']"),
        (np.zeros(4, np.float32), "an observation with keys ndarray, not its observation space's ['map', 'pos']"),
        ({"pos": np.array([0, np.nan, 0, 0], np.float32), "map": np.zeros((2, 2), np.uint8)}, "an observation holding nan at index (1,) under 'pos'"),
        ({"pos": np.zeros(4, np.float32), "map": np.zeros(4, np.uint8)}, "an observation of shape (4,), not its observation space's (2, 2) under 'map'"),
        ({"pos": np.zeros(4, np.float32), "map": np.zeros((2, 2), np.uint8)}, None),
    ],
)
def test_a_dict_observation_is_checked_key_by_key(obs: Any, fault: str | None) -> None:
    assert observation_fault(DICT, obs) == fault


def test_the_first_value_that_is_not_finite_is_named() -> None:
    assert observation_fault(BOX, np.array([0.0, np.inf, np.nan, 0.0], np.float32)) == "an observation holding inf at index (1,)"
    assert observation_fault(BOX, [[0.0, 1.0], [0.0]]) == "an observation that is no array (list of uneven lengths)"
    assert observation_fault(gym.spaces.Discrete(3), "anything") is None  # other spaces are the env's own business


class Paying(gym.Env):
    """An env whose step pays `reward`."""

    observation_space = BOX
    action_space = gym.spaces.Discrete(2)

    def __init__(self, reward: Any) -> None:
        self.reward = reward

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        return np.zeros(4, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, Any, bool, bool, dict[str, Any]]:
        return np.zeros(4, np.float32), self.reward, False, False, {}


@pytest.mark.parametrize("reward", [None, "one", float("nan"), float("inf"), np.float32("-inf")])
def test_a_reward_that_is_no_finite_number_is_named(reward: Any) -> None:
    env = CheckedOutput(Paying(reward), "mine:Paying-v0")
    env.reset(seed=0)
    with pytest.raises(EnvOutputError) as raised:
        env.step(0)
    assert str(raised.value) == f"env mine:Paying-v0: step returned a reward of {reward!r}"


@pytest.mark.parametrize("reward", [1, 0.5, np.float32(-2.0), np.array(3.0)])
def test_a_finite_reward_of_any_numeric_type_passes(reward: Any) -> None:
    env = CheckedOutput(Paying(reward), "mine:Paying-v0")
    env.reset(seed=0)
    assert env.step(0)[1] is reward
