"""The rollout's forward pass as one CUDA graph replay (`train.cuda_graph`).

Why: on a GPU node a rollout step is a few dozen small kernels (the CNN, the heads, the sample, the
log-probability) for a batch of 4 to 32 observations, and every launch costs host time. Measured on
an H200 node (ViZDoom basic, 8 envs in two groups, `hpcrl.rl.ppo` collecting alone): 80-130 us of
host time per convolution launch, `_act` 57% of the rollout, the rollout at 0.42x the envs' own
stepping rate. A CUDA graph replays all of them with one launch (PyTorch's `torch.cuda.graphs`).

What a graph may hold: fixed shapes and addresses. So a `GraphedStep` serves one env group (its batch
size), reads the observations from a static buffer the caller's tensor is copied into, and acts on
the policy's parameters where they live (an update and the behaviour policy's refresh write them in
place). The draws stay outside the graph: the action noise is drawn by the rollout's generator, as the
eager step draws it, and copied in, so a run samples the same actions with and without graphs.
Recurrent policies (their state is carried between steps) run eagerly.
"""

from __future__ import annotations

from typing import Any

import torch

from hpcrl.rl.networks import ActorCritic, Obs


def usable(policy: ActorCritic, device: torch.device) -> bool:
    """Graphs apply on CUDA to feed-forward policies."""
    return device.type == "cuda" and policy.gru is None


def _static(obs: Obs) -> Obs:
    return {k: torch.zeros_like(v) for k, v in obs.items()} if isinstance(obs, dict) else torch.zeros_like(obs)


def _copy_into(static: Obs, obs: Obs) -> None:
    if isinstance(static, dict):
        for k, v in static.items():
            v.copy_(obs[k], non_blocking=True)
    else:
        static.copy_(obs, non_blocking=True)


class GraphedStep:
    """`policy.step` for `batch` envs, captured on first use and replayed after.

    Called as `step(obs, noise)`: `noise` is `policy.actor_head.draw(batch, ...)`. Returns (action,
    log-probability, value or None) in the graph's own output tensors, which the next call
    overwrites: the caller copies them out first (the rollout stores them at once).
    """

    def __init__(self, policy: ActorCritic, obs: Obs, with_value: bool, noise: torch.Tensor) -> None:
        self.policy, self.with_value = policy, with_value
        self.obs = _static(obs)
        self.noise = torch.ones_like(noise)  # finite samples in the warm-up (exponential noise is > 0)
        _copy_into(self.obs, obs)
        # Warm-up on a side stream (cuDNN picks its algorithms, the allocator fills), as PyTorch's
        # graph recipe does; then capture. `thread_local`: the update may use the GPU from the
        # main thread while a background rollout captures.
        side = torch.cuda.Stream(noise.device)
        side.wait_stream(torch.cuda.current_stream(noise.device))
        with torch.no_grad():
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._forward()
            torch.cuda.current_stream(noise.device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.out = self._forward()

    def _forward(self) -> tuple[torch.Tensor, torch.Tensor, Any]:
        action, logprob, value, _ = self.policy.step_with_noise(self.obs, self.noise, self.with_value)
        return action, logprob, value

    def __call__(self, obs: Obs, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
        _copy_into(self.obs, obs)
        self.noise.copy_(noise)
        self.graph.replay()
        return self.out
