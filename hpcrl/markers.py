"""Markers on disk: the source of truth for whether a run's stages finished.

Schedulers differ in what they remember (Slurm without accounting forgets, SGE's qstat forgets at
once); a file written by the job itself does not. Each marker holds a short reason.
"""

from __future__ import annotations

from pathlib import Path

from hpcrl.io import atomic_write_text

DONE, FAILED = "DONE", "FAILED"
EVAL_DONE, EVAL_FAILED, EVAL_SKIPPED = "EVAL_DONE", "EVAL_FAILED", "EVAL_SKIPPED"


def mark(run_dir: Path, name: str, reason: str = "") -> None:
    """Write one marker and clear the markers it contradicts."""
    opposite = {DONE: FAILED, FAILED: DONE, EVAL_DONE: (EVAL_FAILED, EVAL_SKIPPED), EVAL_FAILED: (EVAL_DONE, EVAL_SKIPPED), EVAL_SKIPPED: (EVAL_DONE, EVAL_FAILED)}[name]
    for other in (opposite,) if isinstance(opposite, str) else opposite:
        (run_dir / other).unlink(missing_ok=True)
    atomic_write_text(run_dir / name, reason.strip() + "\n")


def clear(run_dir: Path, *names: str) -> None:
    for name in names:
        (run_dir / name).unlink(missing_ok=True)


def reason(run_dir: Path, name: str) -> str:
    try:
        return (run_dir / name).read_text().strip()
    except FileNotFoundError:
        return ""


def run_state(run_dir: Path) -> str:
    """Training state from markers: done, failed, started (checkpoints or logs exist) or new."""
    if (run_dir / DONE).exists():
        return "done"
    if (run_dir / FAILED).exists():
        return "failed"
    if (run_dir / "train.csv").exists() or any((run_dir / "checkpoints").glob("*.pt")):
        return "started"
    return "new"


def eval_state(run_dir: Path) -> str:
    for name, state in ((EVAL_DONE, "done"), (EVAL_SKIPPED, "skipped"), (EVAL_FAILED, "failed")):
        if (run_dir / name).exists():
            return state
    return "new"
