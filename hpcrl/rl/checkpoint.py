"""Atomic, weights-only checkpoints that a preempted job resumes from.

A checkpoint is a dict of tensors and plain Python values (never arbitrary objects), loaded with
`torch.load(weights_only=True)` so that a file from disk can never run code. Files are
step-numbered; the newest one that loads is resumed from, and a corrupt newest file (a node died
mid-write on a filesystem without atomic rename) falls back to the one before it.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpcrl.io import atomic_open

_NAME = re.compile(r"^step-(\d+)\.pt$")


def checkpoint_files(directory: Path) -> list[Path]:
    """Checkpoints in a directory, newest (highest step) first."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def save(directory: Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    path = directory / f"step-{step:012d}.pt"
    with atomic_open(path, "wb") as f:
        torch.save(state, f)
    for old in checkpoint_files(directory)[keep:]:
        old.unlink(missing_ok=True)
    return path


def load(path: Path, device: str | torch.device = "cpu") -> dict[str, Any]:
    return torch.load(path, map_location=device, weights_only=True)


def load_latest(directory: Path, device: str | torch.device = "cpu") -> tuple[dict[str, Any] | None, list[str]]:
    """The newest readable checkpoint and a note for every unreadable one skipped on the way."""
    problems = []
    for path in checkpoint_files(directory):
        try:
            return load(path, device), problems
        except Exception as exc:  # a truncated or foreign file: report it, try the previous one
            problems.append(f"{path.name}: unreadable ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
    return None, problems


def rng_state() -> dict[str, Any]:
    """Every RNG a run draws from, in weights-only-loadable types."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(tuple(state["python"][:1]) + (tuple(state["python"][1]),) + tuple(state["python"][2:]))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def numpy_to_torch(tree: Any) -> Any:
    """Replay buffers and normalisers hold numpy arrays; weights-only files hold tensors."""
    if isinstance(tree, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(tree))
    if isinstance(tree, dict):
        return {k: numpy_to_torch(v) for k, v in tree.items()}
    return tree


def torch_to_numpy(tree: Any) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.cpu().numpy()
    if isinstance(tree, dict):
        return {k: torch_to_numpy(v) for k, v in tree.items()}
    return tree

