"""Which class implements an algorithm, and which device it runs on.

Apart from train.py because evaluation needs both and train.py runs evaluations during training
(periodic_eval.py -> evaluate.py): kept in train.py, they would make an import cycle.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

ALGORITHM_CLASSES = {"ppo": "hpcrl.rl.ppo:PPO", "a2c": "hpcrl.rl.a2c:A2C", "dqn": "hpcrl.rl.dqn:DQN", "alphazero": "hpcrl.rl.alphazero:AlphaZero"}


def algorithm_class(algo: str) -> Any:
    module, name = ALGORITHM_CLASSES[algo].split(":")
    return getattr(importlib.import_module(module), name)


def pick_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)
