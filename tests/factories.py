"""Small configs for tests: tiny budgets so that whole pipelines run in seconds on 2 cores."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from hpcrl.leftovers import process_stat

TINY: dict[str, Any] = {
    "name": "tiny",
    "algo": "ppo",
    "env": {"id": "CartPole-v1", "num_envs": 2},
    "train": {"total_steps": 1024, "num_steps": 64, "num_minibatches": 2, "update_epochs": 2, "hidden_sizes": [16], "checkpoint_every": 2},
    "sweep": {"seeds": [0, 1]},
    "resources": {"max_concurrent": 2},
    "eval": {"episodes": 2},
}


def deep_update(base: dict, changes: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_update(out[key], value)
        else:
            out[key] = value
    return out


def write_config(directory: Path, changes: dict | None = None, name: str = "config.yaml") -> Path:
    """A tiny experiment config whose output root is inside `directory`."""
    data = deep_update(TINY, {"output": str(directory / "logs"), **(changes or {})})
    path = directory / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def validate_x(message: Any) -> int:
    """The learner's `validate` for the test batches of the queue tests: one float32 field `x` of
    rows of 2; its number of rows."""
    from hpcrl.distributed import wire

    wire.check_fields(message.fields, {"x": (np.dtype(np.float32), (2,))}, leading=True)
    return len(message.fields["x"])


HEAD_ADDRESS = "10.251.0.1"
"""This host's address on the test clusters' private bridge (tests/clusters/nodes.sh, NODES_HEAD_IP): a board the
tests' cluster jobs may dial that is neither loopback nor an address of the machine's own network."""


def alive(pid: int) -> bool:
    """Whether `pid` runs or can: a killed process not yet reaped (a zombie) does not, and init on these VMs
    reaps orphans only every ~2 s."""
    return (stat := process_stat(pid)) is not None and stat.live


def own_shm(shm: Path) -> list[str] | None:
    """The start of a command line that runs a command (as the same pid) with `shm`, made here, as its /dev/shm: a
    mount namespace of its own, so that whatever it leaves there, or finds there, is its own however many tests run
    beside it (a trainer's end removes the ViZDoom files nobody holds, another test's too). None where that needs
    what this user lacks (root, unshare(1))."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return None
    shm.mkdir()
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount --bind "$0" /dev/shm && exec "$@"', str(shm)]


SIMULATOR_ENV = '''
import os, subprocess, sys
import gymnasium
from gymnasium.envs.classic_control import CartPoleEnv


class WithSimulator(CartPoleEnv):
    """CartPole that starts a process of its own, as ViZDoom starts its game engine: a child of the trainer; and
    that holds a file in /dev/shm named as ViZDoom names its message queues, alone, as a game's controller does
    before its engine opens them. Given `held`, the simulator holds that file open, as an engine its screen."""

    def __init__(self, pid_file, queue, held=None, **kwargs):
        super().__init__(**kwargs)
        self.queue = os.open(queue, os.O_RDWR | os.O_CREAT, 0o600)
        hold = f"import os; os.open({held!r}, os.O_RDWR | os.O_CREAT, 0o600); " if held else ""
        self.simulator = subprocess.Popen([sys.executable, "-c", hold + "import time; time.sleep(600)"])
        with open(pid_file, "a") as f:
            f.write(f"{self.simulator.pid}\\n")


gymnasium.register("WithSimulator-v0", entry_point=WithSimulator, max_episode_steps=500)
'''
"""A user's env module (registers `WithSimulator-v0`): a process of its own and files in /dev/shm, as ViZDoom's game."""


@dataclasses.dataclass
class Simulators:
    """The simulators of a test's run whose env is SIMULATOR_ENV's (`simulators`): the files they hold, and what is
    left of them once the run has ended."""

    overrides: list[str]
    """The config's overrides that give the run that env."""
    held: Path
    """In /dev/shm, held by every simulator (not a ViZDoom name: no other test's end removes it)."""
    queue: Path
    """In /dev/shm, named as a ViZDoom game's message queue, held by the trainer alone."""
    pid_file: Path

    def pids(self) -> list[int]:
        """Every simulator started so far."""
        return [int(line) for line in self.pid_file.read_text().split()] if self.pid_file.exists() else []

    def alive(self) -> list[int]:
        """The simulators still running (not zombies)."""
        return [pid for pid in self.pids() if alive(pid)]

    def left(self) -> list[str]:
        """The files still in /dev/shm."""
        return [path.name for path in (self.held, self.queue) if path.exists()]


@contextlib.contextmanager
def simulators(tmp_path: Path, monkeypatch: Any, module: str) -> Iterator[Simulators]:
    """A run's env whose every copy starts a simulator (SIMULATOR_ENV, importable as `module` from the test's
    directory, where the test then runs). On the way out, what the run failed to end is killed and removed,
    after the test has looked."""
    own = tmp_path / "own"
    own.mkdir(exist_ok=True)
    (own / f"{module}.py").write_text(SIMULATOR_ENV)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "own")
    tag = uuid.uuid4().hex[:12]
    held, queue, pid_file = Path(f"/dev/shm/hpcrl-test-held-{tag}"), Path(f"/dev/shm/ViZDoomMQCtr-hpcrl-test-{tag}"), tmp_path / "simulators.txt"
    overrides = [f"env.id={module}:WithSimulator-v0", f"env.kwargs.pid_file={pid_file}", f"env.kwargs.queue={queue}", f"env.kwargs.held={held}"]
    found = Simulators(overrides, held, queue, pid_file)
    try:
        yield found
    finally:
        for pid in found.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        held.unlink(missing_ok=True)
        queue.unlink(missing_ok=True)


def trainers(exp: Path) -> list[int]:
    """Pids of `python -m hpcrl train <exp> ...` processes now alive."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and argv[1:4] == ["-m", "hpcrl", "train"] and str(exp) in argv:
            found.append(int(entry.name))
    return found
