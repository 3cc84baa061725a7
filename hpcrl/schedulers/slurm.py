"""Slurm through its own command-line tools: sbatch, squeue, sacct, scancel, scontrol.

The script carries the array range and its concurrency cap (`#SBATCH --array=1-N%cap`, rendered
from slurm.sh.j2), so submitting a stage is one `sbatch --parsable` with at most a dependency:

- eval task i waits for train task i with `aftercorr`, and is submitted with
  `--kill-on-invalid-dep=yes` because a failed train task would otherwise leave its eval task
  PENDING forever (reason DependencyNeverSatisfied) and the aggregate behind it;
- the aggregate waits for every eval array with `afterany`, so it runs whatever their outcome.

`query` asks squeue once for all the jobs (`-t all` includes finished jobs for MinJobAge) and
sacct once for the jobs squeue has forgotten; without accounting sacct fails and those jobs are
left to the markers on disk, which status treats as the truth anyway.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from hpcrl.config.experiment import Experiment
from hpcrl.schedulers.base import CANCELLED, DONE, FAILED, PENDING, RUNNING, UNKNOWN, NodeRequest, Scheduler, SchedulerError, compress_ranges, expand_ranges
from hpcrl.store.expdir import Dependency

DEFAULT_MAX_ARRAY_SIZE = 1001
"""Slurm's own default for MaxArraySize, used when `scontrol show config` does not list it."""

_STATES = {
    **dict.fromkeys(("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT"), PENDING),
    **dict.fromkeys(("RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING", "SUSPENDED", "STOPPED"), RUNNING),
    "COMPLETED": DONE,
    **dict.fromkeys(("CANCELLED", "REVOKED"), CANCELLED),
    **dict.fromkeys(("FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"), FAILED),
}


def state_of(text: str) -> str:
    """hpcrl's state for a Slurm state name; sacct appends detail (`CANCELLED by 0`)."""
    words = text.split()
    return _STATES.get(words[0], UNKNOWN) if words else UNKNOWN


def expand_indices(text: str) -> list[int]:
    """Array task ids from Slurm's compact forms: `4`, `5-9%2` (squeue's %K), `[1,3,5-9:2%4]` (sacct)."""
    return expand_ranges(text.strip().removeprefix("[").removesuffix("]").split("%")[0])


def parse_squeue(text: str) -> dict[str, dict[int, str]]:
    """Lines of `squeue -h -o %F|%K|%T`: array job id, task ids (`N/A` for a plain job), state."""
    result: dict[str, dict[int, str]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        job_id, tasks, state = line.strip().split("|")
        entry = result.setdefault(job_id, {})
        for task in [0] if tasks == "N/A" else expand_indices(tasks):
            entry[task] = state_of(state)
    return result


def parse_sacct(text: str) -> dict[str, dict[int, str]]:
    """Lines of `sacct -P -n -X -o JobID,State`: `123`, `123_4` or `123_[5-9%2]`, then the state."""
    result: dict[str, dict[int, str]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        job, state = line.strip().split("|", 1)
        job_id, _, tasks = job.partition("_")
        entry = result.setdefault(job_id, {})
        for task in expand_indices(tasks) if tasks else [0]:
            entry[task] = state_of(state)
    return result


def _node_rows(listing: str) -> list[tuple[str, int, int, int]]:
    """sinfo's `%P|%c|%m|%G` lines as (partition, CPUs, memory in MB, GPUs), one per node and partition."""
    rows = [line.strip().split("|") for line in listing.splitlines()]
    return [(p, int(c), int(m), gres_gpus(g)) for p, c, m, g in (r for r in rows if len(r) == 4) if c.isdigit() and m.isdigit()]


def _no_node_holds(ask: NodeRequest, nodes: list[tuple[int, int, int]], partition: str) -> str | None:
    """Why no node of (CPUs, memory in MB, GPUs) holds all of `ask` at once, in one line; None where one
    does or sinfo listed no node. A resource no node has enough of alone is named alone, as before.
    `partition` names it in words (`Slurm partition gpu`, `Slurm's default partition debug`)."""
    if not nodes or any(c >= ask.cpus and m >= ask.mem_mb and g >= ask.gpus for c, m, g in nodes):
        return None
    cpus, mem_mb, gpus = (max(n[i] for n in nodes) for i in range(3))
    where = f"the largest node of {partition} has"
    if ask.cpus > cpus:
        return f"{ask.cpus_key}: {ask.cpus} CPUs per node{ask.cpus_detail}, but {where} {cpus} (sinfo): the job would stay pending for ever"
    if ask.mem_mb > mem_mb:
        return f"{ask.mem_key}: {ask.mem} per node, but {where} {mem_mb}M (sinfo): the job would stay pending for ever"
    if ask.gpus > gpus:
        return f"{ask.gpus_key}: {ask.gpus} GPUs per node, but no node of {partition} has more than {gpus} (sinfo %G): sbatch would refuse the job"
    shown = "; ".join(f"{c} CPUs, {m}M, {g} GPUs" for c, m, g in sorted(set(nodes), reverse=True)[:4])
    keys = f"{ask.cpus_key}, {ask.mem_key}" + (f", {ask.gpus_key}" if ask.gpus else "")
    return (
        f"{keys}: {ask.cpus} CPUs{ask.cpus_detail}, {ask.mem}" + (f" and {ask.gpus} GPUs" if ask.gpus else "")
        + f" on one node, but no node of {partition} holds them together (sinfo: {shown}): the job would stay pending for ever"
    )


def gres_gpus(gres: str) -> int:
    """GPUs in a node's generic resources as sinfo's %G writes them: `gpu:2`, `gpu:a100:4(S:0-1)`,
    `gpu:a100:2,gpu:v100:2,mps:200` (4), `(null)` (0)."""
    return sum(int(n) for n in re.findall(r"(?:^|,)gpu(?::[^:,()]+)?:(\d+)", gres))


def dependency_argv(after: list[Dependency]) -> list[str]:
    """sbatch options for a stage's dependencies (see the module docstring for why these kinds)."""
    each = [d.job_id for d in after if d.kind == "each"]
    whole = [d.job_id for d in after if d.kind == "all"]
    conditions = ([f"aftercorr:{':'.join(each)}"] if each else []) + ([f"afterany:{':'.join(whole)}"] if whole else [])
    argv = [f"--dependency={','.join(conditions)}"] if conditions else []
    return argv + (["--kill-on-invalid-dep=yes"] if each else [])


class SlurmScheduler(Scheduler):
    name = "slurm"
    template = "slurm.sh.j2"
    one_host = None  # srun starts the ranks on every node of the allocation

    def _read_max_array_size(self) -> int:
        """MaxArraySize - 1: Slurm's indices run 0..MaxArraySize-1 and hpcrl's arrays start at 1.

        Without an answer (a dry run on a machine with no Slurm) Slurm's default stands in: a real
        submission that needed less would be refused by sbatch with the cluster's own message.
        """
        return self.config_value(["scontrol", "show", "config"], r"^MaxArraySize\s*=\s*(\d+)", DEFAULT_MAX_ARRAY_SIZE) - 1

    def refuse(self, exp: Experiment, requests: Sequence[NodeRequest] = ()) -> str | None:
        """A job no node of its partition can hold: sbatch takes it, and Slurm keeps it pending for
        ever (reason PartitionConfig; seen with `resources.cpus: 8` on 2-CPU nodes). Each request is
        measured against the partition's nodes one by one as sinfo lists them: ONE node must hold its
        CPUs, memory and GPUs together (a 64-CPU node without GPUs and an 8-CPU node with 4 GPUs do not
        hold 32 CPUs with 4 GPUs). Where sinfo does not answer (a dry run away from the cluster) or knows
        no such partition, sbatch has the last word as before. More GPUs than any node has: sbatch
        refuses them itself, but only when that stage is submitted, after the stages before it
        ("Requested node configuration is not available")."""
        try:
            listing = self.probe(["sinfo", "-h", "-N", "-o", "%P|%c|%m|%G"])
        except SchedulerError:
            return None
        res, rows = exp.resources, _node_rows(listing)
        nodes = [row[1:] for row in rows if row[0].rstrip("*") == res.partition or (res.partition is None and row[0].endswith("*"))]
        default = next((row[0].rstrip("*") for row in rows if row[0].endswith("*")), "")
        where = f"Slurm partition {res.partition}" if res.partition else f"Slurm's default partition {default}".rstrip()  # sinfo marks it with *
        return next((why for ask in requests if (why := _no_node_holds(ask, nodes, where))), None)

    def submit_argv(self, script: Path, after: list[Dependency]) -> list[str]:
        return ["sbatch", "--parsable", *dependency_argv(after), str(script)]

    def submit(self, script: Path, size: int, after: list[Dependency]) -> str:
        out = self.run(self.submit_argv(script, after)).strip()
        job_id = out.split(";")[0]  # `<id>;<cluster>` on multi-cluster setups
        if not job_id.isdigit():
            raise SchedulerError(f"sbatch --parsable {script}: expected a job id, got {out!r}")
        return job_id

    def query(self, job_ids: list[str]) -> dict[str, dict[int, str]]:
        if not job_ids:
            return {}
        try:
            found = parse_squeue(self.run(["squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-o", "%F|%K|%T"]))
        except SchedulerError as exc:
            if "Invalid job id specified" not in str(exc):
                raise
            found = {}  # squeue fails only when it knows none of the ids: all older than MinJobAge
        forgotten = [j for j in job_ids if j not in found]
        if forgotten:
            try:
                found.update(parse_sacct(self.run(["sacct", "-P", "-n", "-X", "-j", ",".join(forgotten), "-o", "JobID,State"])))
            except SchedulerError:
                pass  # no accounting on this cluster: the markers on disk tell what those jobs did
        return {j: found[j] for j in job_ids if j in found}

    def cancel(self, job_ids: list[str]) -> None:
        if job_ids:
            self.run(["scancel", *job_ids])

    def cancel_tasks(self, tasks: dict[str, list[int]]) -> None:
        """One scancel for every job: `123_[1-3,7]` per job (tasks that already ended are no error)."""
        specs = [f"{job}_[{','.join(compress_ranges(ts))}]" for job, ts in tasks.items() if ts]
        if specs:
            self.run(["scancel", *specs])
