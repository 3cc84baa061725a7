"""How many worker groups an async vector env pipelines: two, so that one group steps while the policy
runs on the other's frames, unless the workers are more than twice the cores, where half of them alone
keep every core busy and a second group only costs a forward pass and pipe round trips per step (the
ViZDoom PPO learner's CPU per step on 2 cores: benchmarks/vizdoom_speed.py)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch

from hpcrl.config.experiment import EnvConfig
from hpcrl.rl.envs import GroupedVectorEnv, final_observations, finished_episodes, make_vec_env, pipeline_groups


@pytest.mark.parametrize(("envs", "cores", "groups"), [(1, 2, 1), (3, 2, 2), (4, 2, 2), (5, 2, 1), (8, 2, 1), (8, 16, 2), (32, 16, 2), (64, 16, 1)])
def test_the_groups_follow_the_workers_per_core(envs: int, cores: int, groups: int) -> None:
    assert pipeline_groups(envs, cores) == groups


def test_workers_on_one_core_step_as_one_group() -> None:
    """3 workers of one env where this process may use one core: one group of 3, stepping as the vector env it is."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        envs = make_vec_env(EnvConfig(id="CartPole-v1", num_envs=3, envs_per_worker=1, vectorization="async", worker_timeout_s=30.0), pipelined=True)
    finally:
        os.sched_setaffinity(0, before)
    try:
        assert isinstance(envs.unwrapped, GroupedVectorEnv) and [g.num_envs for g in envs.unwrapped.groups] == [3]
        obs, _ = envs.reset(seed=0)
        obs, reward, *_ = envs.step(envs.action_space.sample())
        assert obs.shape == (3, 4) and list(reward) == [1.0, 1.0, 1.0]
    finally:
        envs.close()


@pytest.mark.parametrize(("algo", "device", "groups"), [("ppo", "cpu", [2]), ("ppo", "cuda", [1, 1]), ("a2c", "cuda", [1, 1]), ("dqn", "cuda", [2])])
def test_only_a_rollout_that_pipelines_gets_groups(monkeypatch: pytest.MonkeyPatch, algo: str, device: str, groups: list[int]) -> None:
    """Two workers on two cores: two groups only for an on-policy rollout on a GPU, which steps one
    while the policy acts on the other; on a CPU, or for DQN, one group, stepped as one vector env."""
    from hpcrl.rl import envs as envs_module
    from hpcrl.rl.algorithms import pipelines_envs

    monkeypatch.setattr(envs_module, "usable_cores", lambda: 2)
    spec = EnvConfig(id="CartPole-v1", num_envs=2, envs_per_worker=1, vectorization="async", worker_timeout_s=30.0)
    envs = make_vec_env(spec, pipelined=pipelines_envs(algo, torch.device(device)))
    try:
        assert [g.num_envs for g in envs.unwrapped.groups] == groups
        obs, _ = envs.reset(seed=0)
        obs, reward, *_ = envs.step(envs.action_space.sample())
        assert obs.shape == (2, 4) and list(reward) == [1.0, 1.0]
    finally:
        envs.close()


def run(envs, steps: int) -> list:
    """What `steps` steps of fixed pseudo-random actions give: every array a rollout reads."""
    actions = np.random.default_rng(7).integers(0, 2, size=(steps, envs.num_envs))
    seen = [envs.reset(seed=11)[0]]
    try:
        for a in actions:
            obs, reward, terminated, truncated, info = envs.step(a)
            seen += [obs, reward, terminated, truncated, final_observations(obs, info), *finished_episodes(info)]
    finally:
        envs.close()
    return seen


@pytest.mark.parametrize("per_worker", [1, 2, 3, 5])
def test_workers_hosting_several_envs_step_each_env_as_its_own_worker_would(per_worker: int) -> None:
    """5 CartPoles in workers of 1, 2 (2+2+1), 3 (3+2) or all 5 envs, over 300 steps with the same
    actions: every observation, reward, end of episode, final observation and episode statistic is
    what the envs give stepped in this process (env i seeded 11 + i, autoreset in the same step).
    An env given another env's seed, actions or rows, or a worker's final observation put in the
    wrong row, breaks it."""
    spec = EnvConfig(id="CartPole-v1", num_envs=5, vectorization="sync", worker_timeout_s=30.0)
    expected = run(make_vec_env(spec), 300)
    got = run(make_vec_env(dataclasses.replace(spec, vectorization="async", envs_per_worker=per_worker)), 300)
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected)):
        np.testing.assert_array_equal(a, b, err_msg=f"item {i}")
    assert sum(len(x) for x in expected[6::7]) > 10  # episodes did end, in several envs
