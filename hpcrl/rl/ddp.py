"""The ranks of one run (DD-PPO, Wijmans et al. 2020): who this process is, how the ranks meet, and
the few collectives an on-policy update needs.

Every rank steps its own envs and computes the loss of its own rollout; `average_` all-reduces the
flat gradient buffer of `hpcrl/rl/optim.py` (one collective per optimiser step, whatever the
network), so every rank applies the same step to the same parameters and they never drift apart.
Advantage statistics and observation-normalisation moments are reduced too, so 2 ranks x 4 envs
take the step 1 rank x 8 envs takes on the same batch.

Who is who comes from the launcher's environment, never from the config:

- torchrun, or `hpcrl launch` (the local executor and Grid Engine): RANK, WORLD_SIZE, LOCAL_RANK,
  MASTER_ADDR and MASTER_PORT of a store the launcher already holds (`init_method="env://"`);
- Slurm's srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, with MASTER_ADDR the allocation's head
  node (the job script sets it from SLURM_JOB_NODELIST). Rank 0 opens the store on a port the
  kernel picks and publishes it in the run directory under the job's launch id, so two runs on one
  node never ask for the same port and a stale file of an earlier attempt is never read.

A single process is `Ranks.single()`, where every collective is the identity: the algorithms call
the same methods either way.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from hpcrl.io import atomic_write_text
from hpcrl.netaddr import advertised_address, interface_of
from hpcrl.runtime.guard import ignore_warnings
from hpcrl.runtime.launch import LAUNCH_ID
from hpcrl.store.rundir import RunError

RENDEZVOUS = ".rendezvous-{}.json"
CURRENT_START = ".ranks-start"
"""The launch id (HPCRL_LAUNCH_ID) of the run's current multi-rank start, written by its rank 0."""


class RankError(RunError):
    """The ranks could not meet, or a rank left: the run fails with this one line."""


@dataclass
class Ranks:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    source: str = "single"
    """`env` (torchrun, hpcrl launch), `slurm` (srun) or `single`."""
    met: bool = False
    """Whether the ranks have met (init returned): a failure after that is the run's, not a start's."""
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    """Where this rank's collectives put their own small tensors: NCCL reduces CUDA tensors only."""
    where: str = ""
    """Once met: this rank's host and the interface its collectives use, for the job log (which node ran what)."""

    @staticmethod
    def single() -> Ranks:
        return Ranks()

    @staticmethod
    def from_env(env: dict[str, str] | None = None) -> Ranks:
        """This process's place among the ranks, from its launcher's environment."""
        env = dict(os.environ) if env is None else env
        try:
            if "WORLD_SIZE" in env and "RANK" in env:
                return Ranks(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", env["RANK"])), "env")
            if int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in env and LAUNCH_ID in env:
                return Ranks(int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", "0")), "slurm")
        except ValueError as exc:
            raise RankError(f"unreadable rank variables in the environment ({exc})") from None
        return Ranks()

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: it writes train.csv, checkpoints and markers, and runs the evaluations."""
        return self.rank == 0

    def label(self) -> str:
        return f"rank {self.rank}/{self.world}"

    # ------------------------------------------------------------------ meeting and leaving
    def init(self, run_dir: Path, device: torch.device, timeout_s: float) -> None:
        """Join the process group: gloo on CPUs, NCCL on GPUs. A rank that does not arrive within
        `timeout_s` fails the others with a RankError, and so does every later collective."""
        if not self.distributed:
            return
        backend = "nccl" if device.type == "cuda" else "gloo"
        self.device = device
        interface = _gloo_interface() if backend == "gloo" else os.environ.get("NCCL_SOCKET_IFNAME", "")
        timeout = datetime.timedelta(seconds=timeout_s)
        try:
            if self.source == "env":
                dist.init_process_group(backend, init_method="env://", rank=self.rank, world_size=self.world, timeout=timeout)
            else:
                store = self._slurm_store(run_dir, timeout_s)
                dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world, timeout=timeout)
            dist.barrier()
            self.met = True
            self.where = f"on {socket.gethostname()}, {backend} over {interface or 'its own choice of interface'}"
        except RankError:
            raise
        except Exception as exc:
            raise RankError(f"{self.label()}: the {self.world} ranks did not meet within {timeout_s:.0f} s ({_short(exc)})") from None
        if self.is_main:  # rank 0 holds the run's lock: its start is the run's current one
            atomic_write_text(run_dir / CURRENT_START, os.environ.get(LAUNCH_ID, ""))
        if self.source == "slurm" and self.is_main:
            (run_dir / RENDEZVOUS.format(os.environ[LAUNCH_ID])).unlink(missing_ok=True)

    def current(self, run_dir: Path) -> bool:
        """Whether this rank's start is still the run's current one. A rank cut off from its peers (a network
        partition) learns that they left only at the next collective's timeout, by which time the scheduler
        may have requeued the run and started it again on other nodes: the run's FAILED marker is then not
        this stale rank's to write (it marked a healthy run failed under its new start)."""
        try:
            return (run_dir / CURRENT_START).read_text() == os.environ.get(LAUNCH_ID, "")
        except OSError:
            return True  # no start recorded one: as before, the failure is the run's

    def _slurm_store(self, run_dir: Path, timeout_s: float) -> dist.TCPStore:
        """Rank 0 opens the store on a free port of the head node and publishes it; the others read it."""
        path = run_dir / RENDEZVOUS.format(os.environ[LAUNCH_ID])
        timeout = datetime.timedelta(seconds=timeout_s)
        if self.is_main:
            host = os.environ.get("MASTER_ADDR") or socket.gethostname()
            store = dist.TCPStore(host, 0, self.world, is_master=True, timeout=timeout, wait_for_workers=False)
            atomic_write_text(path, json.dumps({"host": host, "port": store.port}))
            return store
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if time.monotonic() > deadline:
                raise RankError(f"{self.label()}: rank 0 published no rendezvous in {path.parent} within {timeout_s:.0f} s")
            time.sleep(0.2)
        where = json.loads(path.read_text())
        return dist.TCPStore(where["host"], int(where["port"]), self.world, is_master=False, timeout=timeout)

    def close(self) -> None:
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()

    # ------------------------------------------------------------------ collectives
    def average_(self, tensor: torch.Tensor) -> None:
        """The mean over ranks, in place (the flat gradient buffer: one call per optimiser step)."""
        if self.distributed:
            self._guard(dist.all_reduce, tensor)
            tensor.div_(self.world)

    def mean_std(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and unbiased std of `x` over every rank's values, as torch's of the concatenation."""
        if not self.distributed:
            return x.mean(), x.std()
        flat = x.detach().reshape(-1).double()
        sums = torch.stack([flat.sum(), (flat * flat).sum(), torch.tensor(float(flat.numel()), dtype=torch.float64, device=flat.device)])
        self._guard(dist.all_reduce, sums)
        total, total_sq, n = sums
        mean = total / n
        var = (total_sq - n * mean * mean) / (n - 1).clamp(min=1)
        return mean.to(x.dtype), var.clamp(min=0).sqrt().to(x.dtype)

    def moments(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Per-feature mean, biased variance and count of rows `x` (N, *shape) over every rank."""
        if not self.distributed:
            return x.mean(0), x.var(0, unbiased=False), x.shape[0]
        n = torch.tensor([float(x.shape[0])], dtype=x.dtype, device=x.device)
        stats = torch.cat([n, x.sum(0).reshape(-1), (x * x).sum(0).reshape(-1)])
        self._guard(dist.all_reduce, stats)
        count = stats[0]
        size = x[0].numel()
        mean = (stats[1 : 1 + size] / count).reshape(x.shape[1:])
        var = (stats[1 + size :] / count).reshape(x.shape[1:]) - mean * mean
        return mean, var.clamp(min=0), int(count.item())

    def any(self, flag: bool) -> bool:
        """Whether any rank's flag is set: every rank stops at the same iteration (a warning signal
        reaches the ranks at different moments)."""
        if not self.distributed:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        self._guard(dist.all_reduce, t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def leave_for_requeue(self) -> None:
        """Wait for every rank (rank 0 has written the checkpoint when they meet), then let no
        warning or SIGTERM end this process (hpcrl.runtime.guard.ignore_warnings). srun ends the step at the
        first non-zero exit: when a peer exits REQUEUE_EXIT a moment before this rank, the SIGTERM
        reaches this one while the interpreter shuts down (its own handlers are gone by then), srun
        reports it "Terminated" instead of REQUEUE_EXIT, and the job fails instead of being requeued.
        Past this point a rank only closes what it holds (the checkpoint is on disk); SIGKILL,
        KillWait later, still ends it."""
        if self.distributed:
            self._guard(dist.barrier)
            ignore_warnings()

    def broadcast_(self, tensor: torch.Tensor) -> None:
        """Rank 0's values everywhere (the initial parameters and statistics)."""
        if self.distributed:
            self._guard(dist.broadcast, tensor, 0)

    def gather(self, items: list) -> list:
        """Every rank's list, concatenated on rank 0 (its finished episodes); [] elsewhere."""
        if not self.distributed:
            return items
        out: list = [None] * self.world if self.is_main else []
        self._guard(dist.gather_object, items, out if self.is_main else None, dst=0)
        return [x for part in out for x in part] if self.is_main else []

    def _guard(self, collective: Callable[..., object], *args: object, **kwargs: object) -> None:
        """A collective; a peer that left turns into a RankError naming this rank."""
        try:
            collective(*args, **kwargs)
        except Exception as exc:
            raise RankError(f"{self.label()}: a collective failed, another rank has left the run ({_short(exc)})") from None


def _gloo_interface() -> str:
    """Gloo pairs the ranks on the address this host's name resolves to, which is 127.0.1.1 on a stock Debian
    node: ranks on two nodes each dialled their own loopback and never met ("Gloo connectFullMesh failed ...
    remote=[127.0.1.1]"). Unless the site chose one (GLOO_SOCKET_IFNAME), gloo gets the interface of the
    address other nodes reach this one at (hpcrl.netaddr). A host with no such interface keeps gloo's own choice."""
    if "GLOO_SOCKET_IFNAME" not in os.environ:
        interface = interface_of(advertised_address())
        if interface:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    return os.environ.get("GLOO_SOCKET_IFNAME", "")


def _short(exc: BaseException) -> str:
    """The first line of an error, without the C++ source location gloo and NCCL put first."""
    text = str(exc).strip().splitlines()
    if not text:
        return type(exc).__name__
    return f"{type(exc).__name__}: {_SOURCE_LOCATION.sub('', text[0])[:200]}"


_SOURCE_LOCATION = re.compile(r"^\[[^\]]*\]\s*")
