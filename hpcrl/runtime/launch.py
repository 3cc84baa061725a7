"""The single-host launcher of a multi-rank run (`hpcrl train ... --ranks N`): what the local
executor and a Grid Engine parallel environment run, where Slurm runs `srun`.

It does what torchrun's agent does for one node, with the two differences a batch job needs:

- it holds the rendezvous store itself, on a port the kernel picks (port 0), and hands the ranks
  torch's own environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, with
  TORCHELASTIC_USE_AGENT_STORE so rank 0 joins the store instead of opening one): two runs on one
  node never race for a port;
- the scheduler's warning signal goes to every rank, and when every rank checkpoints and asks for a
  requeue (REQUEUE_EXIT), so does the launcher: torchrun turns the signal into its own failure.

A rank that dies (a crash, an OOM kill, kill -9) ends the run at once: the other ranks are sent
SIGTERM, then SIGKILL after a grace period, no process is left behind, and the run's FAILED marker
names the rank and how it died. A launcher that dies, however, takes its ranks with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import FrameType
from typing import TextIO

from hpcrl.runtime.lifeline import die_with_parent
from hpcrl.store import rundir
from hpcrl.store.states import REQUEUE_EXIT

LAUNCH_ID = "HPCRL_LAUNCH_ID"
"""Names one start of a multi-rank job (the job id and its requeue count): its rendezvous file."""

GRACE_S = 10.0
"""How long the other ranks get to exit after one died, before SIGKILL."""
FORWARDED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)


def how_it_ended(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def launch(argv: list[str], ranks: int, run_dir: Path | None, out: TextIO | None = None) -> int:
    """Run `argv` as `ranks` processes on this host and wait for all of them; returns the run's exit
    code (REQUEUE_EXIT when every rank asked for a requeue)."""
    from torch.distributed import TCPStore  # deferred: `hpcrl --help` does not pay for torch

    store = TCPStore("127.0.0.1", 0, ranks + 1, is_master=True, wait_for_workers=False)
    base = {
        **os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "WORLD_SIZE": str(ranks),
        "LOCAL_WORLD_SIZE": str(ranks), "TORCHELASTIC_USE_AGENT_STORE": "True", LAUNCH_ID: os.environ.get(LAUNCH_ID) or uuid.uuid4().hex,
    }  # fmt: skip
    # Each rank dies with the launcher, however it dies: without its store a rank would run on alone.
    children = [subprocess.Popen(argv, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}, preexec_fn=die_with_parent) for r in range(ranks)]

    def forward(signum: int, _frame: FrameType | None) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        return _wait(children, run_dir, out)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _stop(children, grace_s=0.0)


def _wait(children: list[subprocess.Popen], run_dir: Path | None, out: TextIO | None) -> int:
    while True:
        codes = [child.poll() for child in children]
        failed = [(r, c) for r, c in enumerate(codes) if c is not None and c not in (0, REQUEUE_EXIT)]
        if failed:
            rank, code = failed[0]
            _stop(children, GRACE_S)
            if code == rundir.LOCKED_EXIT and rank == 0:  # another trainer holds the run: not a failure of it
                return code
            reason = f"rank {rank} of {len(children)} {how_it_ended(code)}; the other ranks were stopped"
            print(f"hpcrl: error: {reason}", file=sys.stderr)
            if run_dir is not None and not rundir.is_done(run_dir):
                rundir.mark(run_dir, rundir.FAILED, reason)
            return 1
        if all(c is not None for c in codes):
            if all(c == REQUEUE_EXIT for c in codes):
                print(f"hpcrl: all {len(children)} ranks checkpointed; asking for a requeue", file=out)
                return REQUEUE_EXIT
            return max(codes)  # type: ignore[type-var]
        time.sleep(0.1)


def _stop(children: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM to the ranks still running, SIGKILL to those still there after `grace_s`."""
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
