"""Which class implements an algorithm, which device it runs on, and the process-wide torch settings.

Apart from train.py because evaluation needs them all and train.py runs evaluations during training
(periodic_eval.py -> evaluate.py): kept in train.py, they would make an import cycle.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import torch

from hpcrl.cores import usable_cores
from hpcrl.store import rundir

ALGORITHM_CLASSES = {"ppo": "hpcrl.rl.ppo:PPO", "a2c": "hpcrl.rl.a2c:A2C", "dqn": "hpcrl.rl.dqn:DQN", "alphazero": "hpcrl.rl.alphazero:AlphaZero"}


def algorithm_class(algo: str) -> Any:
    module, name = ALGORITHM_CLASSES[algo].split(":")
    return getattr(importlib.import_module(module), name)


def pipelines_envs(algo: str, device: torch.device) -> bool:
    """Whether `algo` on `device` steps its env workers in pipelined groups (`make_vec_env`'s
    `pipelined`): an on-policy rollout (hpcrl.rl.ppo.OnPolicyAgent: PPO, A2C) whose forward pass runs
    on a GPU, one group's while the other group's workers step. On a CPU that pass takes a core the
    workers would step on: one batched pass over every env measured faster in each layout tried on 2
    cores (ViZDoom basic, async PPO: 8 envs in 2 workers of 4, 1,505-1,608 env steps/s against
    1,394-1,481 pipelined; 4 envs in 4 workers of 1, 1,119 against 1,049), and a second group would
    only cost its own messages and bookkeeping at every step."""
    from hpcrl.rl.ppo import OnPolicyAgent  # here: evaluation imports this module without the trainers

    return device.type == "cuda" and issubclass(algorithm_class(algo), OnPolicyAgent)


def pick_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


def setup_torch(threads: int, device_spec: str = "cpu", local_rank: int = 0) -> torch.device:
    """Process-wide torch settings for a training or evaluation process; returns its device.

    Denormal floats are flushed to zero (as TensorFlow does by default, and as GPU kernels do):
    Adam's second-moment estimates of rarely-active units decay through the denormal range, where
    x86 arithmetic is up to 100 times slower, and late in a DQN run on a CPU that made the fused
    Adam step 10x and the backward matmuls 4x slower (1.65 -> 1.16 ms per update on CartPole).
    Called before the first parallel op, so the intra-op threads inherit the mode.

    `threads` intra-op threads, but not more than the cores this process may use: more threads than
    cores wait on each other at every op (their barriers spin), and oneDNN's bfloat16 kernels worst of all:
    DQN's update on configs/vizdoom_dqn.yaml (amp bf16, torch_threads 4) on a 2-core AMD EPYC took
    96 ms of CPU a forward and backward of 32 frames with 4 threads against 4.9 with 2, and float32 8 ms.
    """
    torch.set_flush_denormal(True)
    torch.set_num_threads(max(1, min(threads, usable_cores())))
    device = pick_device(device_spec)
    if device.type == "cuda" and device.index is None:  # one GPU per rank of a node (rank 0 of one: cuda:0)
        device = torch.device("cuda", local_rank)
    if device.type == "cuda":
        if device.index >= torch.cuda.device_count():  # CUDA_VISIBLE_DEVICES leaves this task fewer GPUs
            raise rundir.RunError(f"train.device {device_spec!r}: this task sees {torch.cuda.device_count()} GPU(s) and needs GPU {device.index} (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    return device
