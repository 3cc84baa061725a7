"""Tiny `hpcrl train` runs in this process (importing torch in a fresh one costs seconds), for the
tests of what training writes besides train.csv: trackers and evaluations during training."""

from __future__ import annotations

import csv
import os
import signal
import threading
import time
from pathlib import Path

import yaml
from factories import write_config

from hpcrl.config.load import load_experiment
from hpcrl.rl import checkpoint
from hpcrl.rl.train import train_run
from hpcrl.store.expdir import Run, write_experiment
from hpcrl.sweep.runs import expand

TRAIN = {"total_steps": 1024, "num_steps": 64, "num_minibatches": 2, "update_epochs": 2, "hidden_sizes": [16], "checkpoint_every": 3}
"""PPO/A2C: 8 iterations of 128 steps; checkpoints after iterations 3 and 6 and at the end (768 and 1024 kept)."""
A2C_TRAIN = {"total_steps": 1024, "num_steps": 64, "hidden_sizes": [16], "checkpoint_every": 3}
DQN_TRAIN = {"total_steps": 1024, "learning_starts": 200, "train_freq": 64, "gradient_steps": 4, "buffer_size": 2000, "batch_size": 32, "hidden_sizes": [16], "checkpoint_every": 3}
"""DQN: 16 iterations of 64 steps (2 envs x 32)."""


def make_run(directory: Path, changes: dict | None = None) -> tuple[Path, Run, Path]:
    """An experiment of one run, written as `hpcrl sweep` writes it: (experiment dir, run, run dir)."""
    changes = changes or {}
    directory.mkdir(parents=True, exist_ok=True)
    base_train = {"ppo": TRAIN, "a2c": A2C_TRAIN, "dqn": DQN_TRAIN}[changes.get("algo", "ppo")]
    path = write_config(directory, {**changes, "sweep": {"seeds": [0]}})
    data = yaml.safe_load(path.read_text())
    data["train"] = {**base_train, **changes.get("train", {})}  # the whole section: TINY's is PPO's
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    exp = load_experiment(path)
    (run,) = expand(exp)
    write_experiment(exp, [run], {})
    return exp.dir, run, exp.dir / "runs" / run.run_id


def train(experiment_dir: Path, run: Run) -> int:
    """`hpcrl train` of one run, with pytest's signal handlers put back afterwards."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)}
    try:
        return train_run(experiment_dir, run)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def warn_once_logged(rd: Path, rows: int = 10) -> threading.Thread:
    """Send this process the scheduler's warning (USR1) once the run's train.csv has more than `rows`
    lines, as a scheduler would part-way through a run (the thread is started)."""

    def interrupt() -> None:
        log = rd / "train.csv"
        while not (log.exists() and log.read_text().count("\n") > rows):
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGUSR1)

    thread = threading.Thread(target=interrupt, daemon=True)
    thread.start()
    return thread


def forget_last_checkpoint(rd: Path) -> int:
    """What a node crash after the second-newest checkpoint leaves: the run is not done and resumes
    from the older checkpoint, redoing the steps after it. Returns the step it resumes from."""
    (rd / "DONE").unlink()
    newest, older = checkpoint.checkpoint_files(rd / "checkpoints")[:2]
    newest.unlink()
    return int(checkpoint.load(older)["agent"]["global_step"])


def train_rows(rd: Path) -> list[dict[str, str]]:
    with (rd / "train.csv").open(newline="") as f:
        return list(csv.DictReader(f))
