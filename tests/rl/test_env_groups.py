"""How many worker groups an async vector env pipelines: two, so that one group steps while the policy
runs on the other's frames, unless the workers are more than twice the cores, where half of them alone
keep every core busy and a second group only costs a forward pass and pipe round trips per step (the
ViZDoom PPO learner's CPU per step on 2 cores: benchmarks/vizdoom_speed.py)."""

from __future__ import annotations

import os

import pytest

from hpcrl.config.experiment import EnvConfig
from hpcrl.rl.envs import GroupedVectorEnv, make_vec_env, pipeline_groups


@pytest.mark.parametrize(("envs", "cores", "groups"), [(1, 2, 1), (3, 2, 2), (4, 2, 2), (5, 2, 1), (8, 2, 1), (8, 16, 2), (32, 16, 2), (64, 16, 1)])
def test_the_groups_follow_the_workers_per_core(envs: int, cores: int, groups: int) -> None:
    assert pipeline_groups(envs, cores) == groups


def test_workers_on_one_core_step_as_one_group() -> None:
    """3 workers where this process may use one core: one group of 3, stepping as the vector env it is."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        envs = make_vec_env(EnvConfig(id="CartPole-v1", num_envs=3, vectorization="async", worker_timeout_s=30.0))
    finally:
        os.sched_setaffinity(0, before)
    try:
        assert isinstance(envs.unwrapped, GroupedVectorEnv) and [g.num_envs for g in envs.unwrapped.groups] == [3]
        obs, _ = envs.reset(seed=0)
        obs, reward, *_ = envs.step(envs.action_space.sample())
        assert obs.shape == (3, 4) and list(reward) == [1.0, 1.0, 1.0]
    finally:
        envs.close()
