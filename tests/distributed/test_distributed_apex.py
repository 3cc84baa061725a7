"""The Ape-X parts that decide what is learned: n-step targets, per-actor exploration, the replay a requeue keeps."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from hpcrl.config.distributed_spec import DistributedConfig
from hpcrl.distributed.apex import NStepBuffer, Replay, actor_epsilons


def step(buf: NStepBuffer, t: int, terminated: bool = False, truncated: bool = False) -> None:
    obs = np.array([[t]], np.float32)
    buf.add(obs, np.array([t % 2]), np.array([1.0]), obs + 1, np.array([terminated]), np.array([terminated or truncated]))


def test_n_step_returns_bootstrap_unless_the_episode_terminated() -> None:
    buf = NStepBuffer(num_envs=1, n=3, gamma=0.5)
    for t in range(4):
        step(buf, t)
    # two full windows: obs 0 -> return 1 + .5 + .25, bootstrapped from obs 3 with .5 ** 3
    assert [(o[0], r, nxt[0], d) for o, _, r, nxt, d in buf.out] == [(0, 1.75, 3, 0.125), (1, 1.75, 4, 0.125)]
    buf.out.clear()
    step(buf, 4, terminated=True)  # the window flushes: no bootstrap after a true end
    assert [(o[0], r, d) for o, _, r, _, d in buf.out] == [(2, 1.75, 0.0), (3, 1.5, 0.0), (4, 1.0, 0.0)]
    buf.out.clear()
    step(buf, 5)
    step(buf, 6, truncated=True)  # a time limit is not an end: bootstrap from the final observation
    assert [(o[0], r, nxt[0], d) for o, _, r, nxt, d in buf.out] == [(5, 1.5, 7, 0.25), (6, 1.0, 7, 0.5)]


def test_exploration_is_spread_over_every_env_slot_of_every_actor() -> None:
    cfg = DistributedConfig(actors=2, envs_per_actor=4, epsilon=0.4, epsilon_alpha=7.0)
    eps = np.concatenate([actor_epsilons(cfg, 0), actor_epsilons(cfg, 1)])
    np.testing.assert_allclose(eps[[0, -1]], [0.4, 0.4**8])
    assert np.all(np.diff(eps) < 0)


def test_replay_survives_a_requeue_with_its_priorities() -> None:
    space = gym.spaces.Box(-1, 1, (2,), np.float32)
    replay = Replay(8, space, prioritized=True, alpha=0.6)
    fields = {"obs": np.ones((5, 2), np.float32), "action": np.arange(5), "reward": np.arange(5, dtype=np.float32), "next_obs": np.zeros((5, 2), np.float32), "discount": np.ones(5, np.float32)}
    replay.add(fields, reward_scale=1.0)
    replay.update_priorities(np.array([1, 3]), np.array([4.0, 0.5]))
    restored = Replay(8, space, prioritized=True, alpha=0.6)
    restored.load_state_dict(replay.state_dict())
    assert (restored.size, restored.pos, restored.max_priority) == (5, 5, replay.max_priority)
    np.testing.assert_array_equal(restored.data["reward"][:5], fields["reward"])
    np.testing.assert_allclose(restored.tree.leaves()[:5], replay.tree.leaves()[:5])
    assert restored.tree.total == replay.tree.total


def test_learner_rejects_batches_that_would_poison_or_crash_an_update() -> None:
    import pytest
    import torch

    from hpcrl.config.hparams import DQNConfig
    from hpcrl.distributed import wire
    from hpcrl.distributed.apex import ApexLearner

    space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    learner = ApexLearner(DQNConfig(hidden_sizes=[8]), DistributedConfig(), space, gym.spaces.Discrete(2), torch.device("cpu"))

    def batch(**change: np.ndarray) -> wire.Message:
        fields = {
            "obs": np.zeros((3, 4), np.float32), "action": np.array([0, 1, 1]), "reward": np.ones(3, np.float32),
            "next_obs": np.zeros((3, 4), np.float32), "discount": np.ones(3, np.float32),
            "ep_return": np.zeros(1, np.float32), "ep_length": np.ones(1, np.int32), **change,
        }
        return wire.decode(wire.encode(wire.BATCH, 0, 0, 0, fields))

    assert learner.validate(batch()) == 3
    for bad, reason in [
        ({"obs": np.full((3, 4), np.nan, np.float32)}, "non-finite"),
        ({"action": np.array([0, 1, 2])}, "action out of range"),
        ({"reward": np.ones(2, np.float32)}, "disagree"),
        ({"obs": np.zeros((3, 5), np.float32)}, "'obs'"),
        ({"action": np.array([0, 1, 1], np.int32)}, "'action'"),
    ]:
        with pytest.raises(wire.MalformedMessage, match=reason):
            learner.validate(batch(**bad))
