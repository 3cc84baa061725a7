"""Atomic, weights-only checkpoints that a preempted job resumes from.

A checkpoint is a dict of tensors and plain Python values (never arbitrary objects), loaded with
`torch.load(weights_only=True)` so that a file from disk can never run code.

Files are named `step-<step>-<sequence>.pt`. The sequence counts writes, so "newest" means the last
one written, never the highest step: a run that had to fall back to an older checkpoint (its newest
files unreadable) writes lower steps than the files it skipped, and pruning or resuming by step
would delete each new checkpoint as soon as it was written and restart from scratch every lifetime.
The newest readable file is resumed from; when files exist but none reads, the run fails with the
reason instead of silently training again from step 0 (and pruning away what might still be
rescued).

`best.pt` beside them holds the policy that scored highest in the evaluations during training
(`eval.every_steps`). Its name is outside the step-file pattern on purpose: resuming, pruning and
"newest" never see it, so a run never resumes from its best policy and `keep` never deletes it.

`ladder/step-<step>.pt` holds the policy of a two-player agent at each evaluation during training
(`snapshot`): the eval stage plays them against each other for the Elo ladder (hpcrl.rl.strength).
Pruning keeps only the last two checkpoints, so the ladder's players need files of their own.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from hpcrl.io import atomic_open
from hpcrl.store.rundir import RunError, remove_stale_temp

_NAME = re.compile(r"^step-(\d+)(?:-(\d+))?\.pt$")
"""`step-000000004096-000007.pt`; files from before the sequence (`step-N.pt`) count as sequence 0."""


class UnreadableCheckpoints(RunError):
    """A run has checkpoints but can read none of them."""


def _order(path: Path) -> tuple[int, int]:
    """(write sequence, step): the sequence decides; the step only orders files from before it."""
    m = _NAME.match(path.name)
    assert m is not None
    return int(m.group(2) or 0), int(m.group(1))


def checkpoint_files(directory: Path) -> list[Path]:
    """Checkpoints in a directory, newest (last written) first."""
    if not directory.is_dir():
        return []
    return sorted((p for p in directory.iterdir() if _NAME.match(p.name)), key=_order, reverse=True)


BEST = "best.pt"


def save_best(directory: Path, state: dict[str, Any]) -> Path:
    """Write `best.pt` atomically: `{"agent": {"policy": weights}, "step": ..., "mean_return": ...}`,
    the shape the eval stage reads a policy from."""
    path = directory / BEST
    _write(path, state)
    return path


def load_best(directory: Path, device: str | torch.device = "cpu") -> dict[str, Any] | None:
    """The best policy's checkpoint, or None when the run has none."""
    path = directory / BEST
    return load(path, device) if path.exists() else None


LADDER = "ladder"
_SNAPSHOT = re.compile(r"^step-(\d+)\.pt$")


def snapshot(directory: Path, step: int, weights: dict[str, Any]) -> Path:
    """Write `ladder/step-<step>.pt` atomically: the policy at this step, as `best.pt` holds one."""
    (directory / LADDER).mkdir(parents=True, exist_ok=True)
    path = directory / LADDER / f"step-{step:012d}.pt"
    _write(path, {"agent": {"policy": weights}, "step": step})
    return path


def snapshots(directory: Path) -> list[tuple[int, Path]]:
    """(step, file) of each ladder snapshot, by step."""
    ladder = directory / LADDER
    if not ladder.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in ladder.iterdir() if (m := _SNAPSHOT.match(p.name)))


def drop_snapshots_after(directory: Path, step: int) -> None:
    """A resumed run redoes the steps after its checkpoint: their snapshots go (they are written
    again), and so do the temporary files of a snapshot write that was killed (the trainer holds
    the run lock)."""
    remove_stale_temp(directory / LADDER)
    for at, path in snapshots(directory):
        if at > step:
            path.unlink(missing_ok=True)


def _write(path: Path, state: dict[str, Any]) -> None:
    """A failed write (full disk, quota) raises the OSError that caused it, with this file's name,
    instead of the message torch wraps it in; what was there before is untouched."""
    try:
        with atomic_open(path, "wb") as f:
            _save_to(_plain_scalars(state), f)
    except OSError as exc:  # closing a file on a full disk fails again, without a name: name it
        if exc.filename or exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from None


def _plain_scalars(tree: Any) -> Any:
    """`tree` with numpy scalars (a counter that met a numpy array: `np.float64`) as Python numbers:
    torch.save pickles them, and `load`'s weights_only unpickler refuses them, so a checkpoint that
    held one was written fine and could not be read back (a decoupled AlphaZero trainer's game count,
    after the budget cut a game)."""
    if isinstance(tree, np.generic):
        return tree.item()
    if isinstance(tree, dict):
        return {k: _plain_scalars(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_plain_scalars(v) for v in tree)
    return tree


def save(directory: Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write a checkpoint atomically (see `_write`), then prune all but the `keep` last written
    (never this one)."""
    existing = checkpoint_files(directory)
    sequence = _order(existing[0])[0] + 1 if existing else 1
    path = directory / f"step-{step:012d}-{sequence:06d}.pt"
    _write(path, state)
    for old in checkpoint_files(directory)[max(1, keep):]:
        if old != path:
            old.unlink(missing_ok=True)
    return path


class _WriteRecorder:
    """A file that remembers the OSError its write raised: torch.save turns it into a RuntimeError
    ("unexpected pos 704 vs 598") that no longer says the disk is full."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.error = f, None

    def write(self, data: bytes) -> int:
        try:
            return self.f.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.f.flush()


def _save_to(state: dict[str, Any], f: IO[bytes]) -> None:
    recorder = _WriteRecorder(f)
    try:
        torch.save(state, recorder)
    except RuntimeError:
        if recorder.error is None:
            raise
        raise recorder.error from None


def load(path: Path, device: str | torch.device = "cpu") -> dict[str, Any]:
    return torch.load(path, map_location=device, weights_only=True)


def unreadable(path: Path, exc: BaseException) -> str:
    """The one line that names a checkpoint file that does not read (truncated, foreign, not this
    run's network) and why: torch's own message names no file and may run over many lines."""
    return f"{path.name}: unreadable ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]})"


def load_latest(directory: Path, device: str | torch.device = "cpu") -> tuple[dict[str, Any] | None, list[str]]:
    """The newest readable checkpoint (None when there is none) and a note for every unreadable one
    skipped on the way. UnreadableCheckpoints when there are checkpoints and none of them reads."""
    problems = []
    for path in checkpoint_files(directory):
        try:
            return load(path, device), problems
        except Exception as exc:  # a truncated or foreign file: report it, try the previous one
            problems.append(unreadable(path, exc))
    if problems:
        raise UnreadableCheckpoints(
            f"none of the {len(problems)} checkpoints in {directory} is readable ({'; '.join(problems)}); "
            "move them aside to train this run again from step 0"
        )
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

