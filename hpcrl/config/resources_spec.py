"""The `resources:` section, what each array task asks its scheduler for, and the memory and time
spellings both schedulers read the same way (`4G`, `D-HH:MM:SS`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from hpcrl.config.schema import setting

_MEM = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT])(?:i?B)?$", re.IGNORECASE)


_BARE = re.compile(r"^\d+(?:\.\d+)?$")


_TIME = re.compile(r"^(?:(\d+)-)?(\d+):(\d{1,2}):(\d{1,2})$")


def parse_mem_mb(text: str) -> int:
    """'4G' -> 4096. Slurm's and SGE's own suffixes (K, M, G, T; `GB` and `GiB` read as G), so a
    value reads the same in both templates. The unit is required: Slurm reads a bare `--mem=32` as
    32 MB while most who write `mem: 32` mean 32 GB, and a job that gets 32 MB dies at its first
    import; one rule that cannot surprise is to take no number without its unit."""
    m = _MEM.match(text.strip())
    if _BARE.match(number := text.strip()):
        raise ValueError(f"{number} has no unit (Slurm would read {number} MB): write {number}G for gigabytes or {number}M for megabytes")
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"expected a memory size such as 4G or 500M, got {text!r}")
    factor = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2).upper()]
    return max(1, int(float(m.group(1)) * factor))


def parse_time_s(text: str) -> int:
    """'1-02:00:00' or '02:00:00' -> seconds."""
    m = _TIME.match(text.strip())
    if not m:
        raise ValueError(f"expected a time limit as HH:MM:SS or D-HH:MM:SS, got {text!r}")
    days, hours, minutes, seconds = (int(g or 0) for g in m.groups())
    if minutes >= 60 or seconds >= 60:
        raise ValueError(f"expected minutes and seconds below 60, got {text!r}")
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def format_time(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def mem_problem(text: str) -> str | None:
    try:
        parse_mem_mb(text)
    except ValueError as exc:
        return str(exc)
    return None


def time_problem(text: str) -> str | None:
    try:
        if parse_time_s(text) <= 0:
            return "expected a positive time limit"
    except ValueError as exc:
        return str(exc)
    return None


@dataclass
class Resources:
    """What each array task asks its scheduler for. Words and lines that reach `#SBATCH` / `#$`
    directives are checked with `hpcrl.config.directives`, the rule the job templates apply again."""

    gpus: int = setting(0, ge=0)
    """GPUs per task (per node for a run of several ranks)."""
    cpus: int = setting(1, ge=1)
    """CPUs per task (per rank); also the job's OMP_NUM_THREADS for a user's program."""
    mem: str = setting("4G", valid=mem_problem)
    """Memory per task (per node), with a unit: `4G`, `500M`, `1.5T`. A sweep refuses a network whose hidden
    layers alone hold more weights than it has room for in float32 (train.hidden_sizes, train.recurrent_size)."""
    time: str = setting("01:00:00", valid=time_problem)
    """Time limit of a train task, `HH:MM:SS` or `D-HH:MM:SS`; the warning signal comes signal_seconds before it."""
    queue: Optional[str] = setting(None, directive="word")
    """SGE queue (`-q`)."""
    partition: Optional[str] = setting(None, directive="word")
    """Slurm partition (`--partition`)."""
    account: Optional[str] = setting(None, directive="word")
    """Slurm account to charge (`--account`)."""
    max_concurrent: Optional[int] = setting(None, ge=1)
    """Cap on array tasks running at once (`%N` / `-tc N`); also the local pool size."""
    extra: list[str] = setting(factory=list, directive="line")
    """Raw directive lines appended as written, e.g. `--constraint=a100` or `-l h=node01`: options only (hpcrl writes
    the `#SBATCH` or `#$`), and none that hpcrl writes itself (the array, logs, name, time, memory, cores, partition,
    account or queue: their keys here set them), since the scheduler would take the last of two."""
    signal_seconds: int = setting(120, ge=0)
    """Seconds before the time limit at which the job is told to checkpoint and requeue."""
    max_stalled_requeues: int = setting(3, ge=1, le=1000)
    """Requeues in a row a run may ask for without progress (no new checkpoint, step or metric file in
    its directory) before it is FAILED instead: a program that exits 99 whatever happens."""
    sge_pe: str = setting("smp", directive="word")
    """Grid Engine parallel environment that holds a task's CPUs (`-pe smp N`)."""
    sge_gpu_resource: str = setting("gpu", directive="word")
    """Grid Engine complex that counts GPUs; it should be consumable per JOB, not per slot."""
    sge_mem_resource: Optional[str] = setting("mem_free", directive="word")
    """Grid Engine memory request; h_vmem caps virtual memory, which CUDA processes exceed at once."""
    eval_time: str = setting("00:30:00", valid=time_problem)
    """Time limit of an eval task, `HH:MM:SS` or `D-HH:MM:SS`."""
    ranks: int = setting(1, ge=1, le=4096)
    """Processes of one run (DD-PPO: each steps its own envs, gradients are all-reduced); one per
    GPU when `gpus` > 0. `cpus` is per rank, `gpus` and `mem` per node."""
    nodes: int = setting(1, ge=1, le=1024)
    """Nodes one run spans; `ranks` must be a multiple of it (ranks per node = ranks / nodes)."""
    collective_timeout: int = setting(300, ge=10, le=86400)
    """Seconds a rank waits in a collective (the rendezvous, an all-reduce) before the run fails:
    a rank that died never leaves the others hanging longer than this."""
    max_gpus_per_node: int = setting(16, ge=0)
    """The most GPUs a task may ask for: a larger request is a typo, refused at sweep time."""
    max_cpus_per_node: int = setting(1024, ge=1)
    """The most CPUs a task may ask for (cpus x ranks per node): a larger request is refused at sweep time."""

    def check(self) -> list[tuple[str, str]]:
        errors = []
        if self.gpus > self.max_gpus_per_node:
            errors.append(("gpus", f"expected 0..{self.max_gpus_per_node} GPUs per task, got {self.gpus}"))
        if self.cpus > self.max_cpus_per_node:
            errors.append(("cpus", f"expected 1..{self.max_cpus_per_node} CPUs per task, got {self.cpus}"))
        if self.signal_seconds >= parse_time_s(self.time):
            errors.append(("signal_seconds", f"must be shorter than the time limit {self.time}"))
        if self.nodes > self.ranks:
            errors.append(("nodes", f"at most one node per rank: {self.nodes} nodes for {self.ranks} rank{'s' if self.ranks > 1 else ''}"))
        elif self.ranks % self.nodes:
            errors.append(("ranks", f"expected a multiple of resources.nodes ({self.nodes}), so every node runs as many ranks, got {self.ranks}"))
        elif self.gpus and self.ranks > 1 and self.gpus != self.ranks_per_node:
            errors.append(("gpus", f"one rank per GPU: {self.ranks_per_node} ranks per node need gpus: {self.ranks_per_node}, got {self.gpus}"))
        elif self.cpus * self.ranks_per_node > self.max_cpus_per_node:
            errors.append(("cpus", f"{self.ranks_per_node} ranks per node x {self.cpus} cpus is more than {self.max_cpus_per_node} CPUs per node"))
        return errors

    @property
    def ranks_per_node(self) -> int:
        return self.ranks // self.nodes
