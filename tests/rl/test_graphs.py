"""The rollout's forward pass as a CUDA graph (`train.cuda_graph`, hpcrl/rl/graphs.py).

What makes a graph safe is checked everywhere: the noise drawn apart gives the same sample as the
eager draw, so graphs change no action. The graph itself needs CUDA (the GPU node's checks,
benchmarks/gpu_node.sh, run these)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from hpcrl.config.load import load_experiment
from hpcrl.rl.envs import make_vec_env
from hpcrl.rl.graphs import GraphedStep
from hpcrl.rl.networks import ActorCritic
from hpcrl.rl.ppo import PPO
from tests.factories import write_config

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (benchmarks/gpu_node.sh)")
PIXELS = gym.spaces.Box(0, 255, (1, 36, 36), dtype=np.uint8)
VECTOR = gym.spaces.Box(-1.0, 1.0, (5,), dtype=np.float32)


def _policies(amp: str = "none") -> list[tuple[str, ActorCritic, gym.Space]]:
    return [
        ("pixels, discrete", ActorCritic(PIXELS, gym.spaces.Discrete(3), [16], "relu", amp=amp), PIXELS),
        ("vector, discrete, separate critic", ActorCritic(VECTOR, gym.spaces.Discrete(4), [16], "tanh", amp=amp), VECTOR),
        ("vector, box", ActorCritic(VECTOR, gym.spaces.Box(-1.0, 1.0, (2,)), [16], "tanh", amp=amp), VECTOR),
    ]


def _obs(space: gym.Space, batch: int, device: str) -> torch.Tensor:
    rng = np.random.default_rng(1)
    array = rng.integers(0, 256, (batch, *space.shape), dtype=np.uint8) if space.dtype == np.uint8 else rng.uniform(-1, 1, (batch, *space.shape)).astype(np.float32)
    return torch.as_tensor(array, device=device)


@pytest.mark.parametrize("which", range(3))
def test_a_step_with_noise_drawn_apart_samples_what_the_eager_step_samples(which: int) -> None:
    """The graph takes the sample's noise as an input; drawn by `actor_head.draw` from the same
    generator state, it must give the very actions (and log-probabilities) the eager step gives."""
    name, policy, space = _policies()[which]
    obs = _obs(space, 6, "cpu")
    eager = policy.step(obs, generator=torch.Generator().manual_seed(5))
    noise = policy.actor_head.draw(6, torch.device("cpu"), torch.Generator().manual_seed(5))
    apart = policy.step_with_noise(obs, noise)
    torch.testing.assert_close(apart[0], eager[0], msg=name)
    torch.testing.assert_close(apart[1], eager[1], msg=name)
    torch.testing.assert_close(apart[2], eager[2], msg=name)


@CUDA
@pytest.mark.parametrize("amp", ["none", "bf16"])
@pytest.mark.parametrize("which", range(3))
def test_a_graph_replays_the_eager_step_and_follows_weights_changed_in_place(which: int, amp: str) -> None:
    _, policy, space = _policies(amp)[which]
    policy = policy.cuda()
    obs = _obs(space, 6, "cuda")
    noise = policy.actor_head.draw(6, torch.device("cuda"), torch.Generator("cuda").manual_seed(3))
    graphed = GraphedStep(policy, obs, True, noise)
    for round_ in range(2):
        with torch.no_grad():
            expected = policy.step_with_noise(obs, noise)
            got = [t.clone() for t in graphed(obs, noise)]
        torch.testing.assert_close(got[0], expected[0])
        torch.testing.assert_close(got[1], expected[1], atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(got[2], expected[2], atol=1e-3, rtol=1e-3)
        with torch.no_grad():  # an update writes the weights in place: the graph must act with the new ones
            for p in policy.parameters():
                p.add_(torch.randn_like(p) * 0.1)
        obs = _obs(space, 6, "cuda").roll(round_ + 1, 0)


@CUDA
def test_a_ppo_rollout_on_cuda_acts_the_same_with_and_without_graphs(tmp_path) -> None:
    """Same seed, same generator: the rollout's actions are identical; only the launches differ."""
    actions = {}
    for graph in (True, False):
        exp = load_experiment(write_config(tmp_path, {"env": {"num_envs": 4}, "train": {"device": "cuda", "num_steps": 16, "cuda_graph": graph}, "resources": {"gpus": 1}}))
        torch.manual_seed(0)
        envs = make_vec_env(exp.env)
        try:
            agent = PPO(exp.train, envs, torch.device("cuda"), 0)
            agent.collect()
            actions[graph] = agent.rollout.actions.cpu()
            assert bool(agent._graphs) is graph
        finally:
            envs.close()
    assert torch.equal(actions[True], actions[False])
