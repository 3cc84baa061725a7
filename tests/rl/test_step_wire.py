"""A vector step between the trainer and an env worker as raw bytes (hpcrl.rl.step_wire): what crosses
arrives as it left, bit for bit and writable, and what does not fit the spaces goes pickled, whole."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from hpcrl.config.experiment import EnvConfig
from hpcrl.rl.envs import make_vec_env
from hpcrl.rl.step_wire import StepWire, is_raw

SCREEN = gym.spaces.Box(0, 255, (1, 60, 80), np.uint8)
ACTIONS = gym.spaces.Discrete(3)


def result(n: int = 2, info: dict[str, Any] | None = None) -> tuple[Any, ...]:
    rng = np.random.default_rng(0)
    return (rng.integers(0, 256, (n, 1, 60, 80), dtype=np.uint8), rng.normal(size=n), np.array([True, False][:n]), np.array([False, True][:n]), info or {})


def assert_same(got: tuple[Any, ...], sent: tuple[Any, ...]) -> None:
    for a, b in zip(got[:4], sent[:4]):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
        assert a.flags.writeable  # as an unpickled array: torch.from_numpy warns of a read-only one
        assert not np.shares_memory(a, b)
    assert got[4].keys() == sent[4].keys()


def test_a_step_crosses_raw_and_arrives_as_it_left() -> None:
    """Two envs' actions one way, their screens, rewards and ends the other, with an info where an
    episode ended (SAME_STEP autoreset's final observation): the same dtypes, shapes and bytes."""
    wire = StepWire(SCREEN, ACTIONS, 2)
    actions = np.array([2, 0])
    message = wire.actions_message(actions)
    assert message is not None and is_raw(message)
    got = wire.actions_of(message)
    assert got.dtype == actions.dtype and got.tolist() == [2, 0] and got.flags.writeable
    for info in ({}, {"final_obs": np.array([np.ones((1, 60, 80), np.uint8), None], dtype=object), "_final_obs": np.array([True, False])}):
        sent = result(info=info)
        message = wire.result_message(sent)
        assert message is not None and is_raw(message)
        arrived = wire.result_of(message)
        assert_same(arrived, sent)
        if info:
            np.testing.assert_array_equal(arrived[4]["final_obs"][0], info["final_obs"][0])
            assert arrived[4]["final_obs"][1] is None and arrived[4]["_final_obs"].tolist() == [True, False]


def test_rewards_that_are_no_finite_numbers_cross_bit_for_bit() -> None:
    """The wire carries what the env gave; judging it is env_output's (a NaN reward is named there)."""
    wire = StepWire(gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Box(-1.0, 1.0, (2,), np.float32), 4)
    obs = np.array([[np.nan, np.inf, -0.0]] * 4, np.float32)
    sent = (obs, np.array([np.nan, np.inf, -np.inf, -0.0]), np.zeros(4, bool), np.ones(4, bool), {})
    message = wire.result_message(sent)
    assert message is not None
    assert_same(wire.result_of(message), sent)
    actions = np.array([[0.5, -1.0]] * 4, np.float32)
    assert wire.actions_of(wire.actions_message(actions) or b"").tobytes() == actions.tobytes()


@pytest.mark.parametrize(
    ("what", "obs_space", "change"),
    [
        ("a Dict observation space", gym.spaces.Dict({"screen": SCREEN}), {}),
        ("an observation of another dtype than its space's (a lying env)", SCREEN, {0: np.zeros((2, 1, 60, 80), np.float64)}),
        ("an observation of another shape", SCREEN, {0: np.zeros((2, 1, 60, 81), np.uint8)}),
        ("rewards that are not float64", SCREEN, {1: np.zeros(2, np.float32)}),
        ("ends that are not booleans", SCREEN, {2: np.zeros(2, np.int64)}),
        ("one env's rewards too few", SCREEN, {1: np.zeros(1)}),
    ],
)
def test_a_result_that_does_not_fit_goes_pickled(what: str, obs_space: gym.Space, change: dict[int, Any]) -> None:
    sent = list(result())
    for i, value in change.items():
        sent[i] = value
    assert StepWire(obs_space, ACTIONS, 2).result_message(tuple(sent)) is None, what


@pytest.mark.parametrize(
    ("what", "space", "actions"),
    [
        ("float actions for a Discrete space", ACTIONS, np.array([1.0, 2.0])),
        ("a list", ACTIONS, [1, 2]),
        ("too many rows", ACTIONS, np.array([1, 2, 0])),
        ("a Tuple space", gym.spaces.Tuple((ACTIONS, ACTIONS)), (np.array([1, 2]), np.array([0, 0]))),
    ],
)
def test_actions_that_do_not_fit_go_pickled(what: str, space: gym.Space, actions: Any) -> None:
    assert StepWire(SCREEN, space, 2).actions_message(actions) is None, what


def test_env_workers_step_raw_where_the_step_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    """CartPole in 2 workers of 2: every step's answers arrive raw (one decoded per worker and step),
    and the envs step as when pickled (tests/rl/test_env_groups.py compares them with stepping here)."""
    decoded: list[int] = []
    result_of = StepWire.result_of
    monkeypatch.setattr(StepWire, "result_of", lambda self, message: decoded.append(self.num_envs) or result_of(self, message))
    spec = EnvConfig(id="CartPole-v1", num_envs=4, vectorization="async", envs_per_worker=2, worker_timeout_s=30.0)
    envs = make_vec_env(spec)
    try:
        envs.reset(seed=0)
        for _ in range(30):
            obs, *_ = envs.step(np.zeros(4, np.int64))
            assert obs.shape == (4, 4) and obs.dtype == np.float32
    finally:
        envs.close()
    assert decoded == [2] * 60
