"""(Son of) Grid Engine through its own command-line tools: qsub, qstat, qdel, qconf.

The script carries the array range and its concurrency cap (`#$ -t 1-N`, `#$ -tc cap`, rendered
from sge.sh.j2), so submitting a stage is one `qsub -terse` with at most a hold:

- eval task i waits for train task i with `-hold_jid_ad` (both arrays have the same range,
  because every chunk and retry is an array 1..n through its manifest);
- the aggregate waits for every eval array with `-hold_jid`.

Grid Engine releases both holds whatever the predecessor's exit code (only exit 100 would keep
them), which is the "any outcome" the aggregate wants; the eval stage checks the train markers
itself and records a skip. `qstat` forgets a job as soon as it ends, so `query` reports only
pending and running tasks, and status takes the rest from the markers on disk.
"""

from __future__ import annotations

import getpass
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hpcrl.config.experiment import Experiment
from hpcrl.schedulers.base import CANCELLED, FAILED, PENDING, RUNNING, NodeRequest, Scheduler, SchedulerError, compress_ranges, expand_ranges
from hpcrl.store.expdir import Dependency

DEFAULT_MAX_AJ_TASKS = 75000
"""Grid Engine's default for max_aj_tasks, used when `qconf -sconf` does not list it."""


def state_of(code: str) -> str:
    """hpcrl's state for a qstat state code such as `qw`, `hqw`, `Rq`, `r`, `Rr`, `t`, `dr`, `Eqw`."""
    if "E" in code:
        return FAILED  # error state: the task will not run again unless someone clears it
    if "d" in code:
        return CANCELLED  # being deleted
    if "q" in code or "w" in code:
        return PENDING
    return RUNNING  # r, t, R and the suspended forms s, S, T: the task holds a slot


def parse_qstat_xml(text: str) -> dict[str, dict[int, str]]:
    """`qstat -xml -g d`: one job_list per task (per job for a plain job, which has no <tasks>)."""
    result: dict[str, dict[int, str]] = {}
    for job in ET.fromstring(text).iter("job_list"):
        job_id = job.findtext("JB_job_number", "").strip()
        tasks = job.findtext("tasks")
        entry = result.setdefault(job_id, {})
        for task in expand_ranges(tasks.strip()) if tasks else [0]:
            entry[task] = state_of(job.findtext("state", "").strip())
    return result


def qdel_refusals(output: str) -> list[str]:
    """Lines of qdel's output that are real refusals. qdel reports each job on its own line: deleted,
    registered for deletion, or `denied: job "N" does not exist` for one that already ended, which
    is what cancelling wants too, as is `task id range "1-2:1" comprises no tasks` (tasks that ended)."""
    done = ("has deleted", "has registered", "does not exist", "comprises no tasks")
    return [line for line in output.splitlines() if line.strip() and not any(d in line for d in done)]


def host_slots(listing: str) -> dict[str, int]:
    """Slots per host from `qstat -f`'s queue-instance lines (`all.q@node  BIP  0/2/4  ...`): the totals of
    each host's queue instances, added up."""
    slots: dict[str, int] = {}
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) >= 3 and "@" in fields[0] and re.fullmatch(r"(\d+/)+\d+", fields[2]):
            host = fields[0].partition("@")[2]
            slots[host] = slots.get(host, 0) + int(fields[2].rpartition("/")[2])
    return slots


def offered(listing: str, resource: str) -> dict[str, float]:
    """Host -> the most of `resource` one of its queue instances has free now, from `qstat -f -F resource`
    (`\thc:gpu=2` under `all.q@node ...`: a host, queue or global consumable); hosts that show none are left out."""
    free: dict[str, float] = {}
    host = None
    for line in listing.splitlines():
        fields = line.split()
        if fields and "@" in fields[0] and not line[0].isspace():
            host = fields[0].partition("@")[2]
        elif host and (found := re.fullmatch(rf"\s+[hqg][cfl]:{re.escape(resource)}=(\S+)", line)):
            try:
                free[host] = max(free.get(host, 0.0), float(found.group(1)))
            except ValueError:
                continue
    return free


def complex_value(host_config: str, resource: str) -> float | None:
    """`resource`'s value in a host's `complex_values` (`qconf -se host`: `gpu=4,mem_free=64G`), or None."""
    found = re.search(rf"^complex_values\s+(?:\S*,)?{re.escape(resource)}=([0-9.]+)", host_config, re.MULTILINE)
    return float(found.group(1)) if found else None


def pe_refusal(pe: str, listing: str, slots: int, nodes: int) -> str | None:
    """Why the parallel environment `pe` (`qconf -sp` listing) cannot run one run's `slots` slots on
    `nodes` hosts, or None: its allocation_rule must span hosts ($round_robin, $fill_up, or a fixed
    number of slots per host that gives `nodes` hosts) and control_slaves must be TRUE (the ranks on
    the other hosts are started with qrsh -inherit)."""
    fields = dict(line.split(None, 1) for line in listing.splitlines() if len(line.split(None, 1)) == 2)
    rule = fields.get("allocation_rule", "").strip()
    fix = "set resources.sge_pe to one that does (qconf -spl lists them)"
    if rule == "$pe_slots":
        return f"parallel environment {pe!r} puts all of a job's slots on one host (allocation_rule $pe_slots): {fix}"
    if rule.isdigit():
        per_host = int(rule)
        if per_host < 1 or slots % per_host or slots // per_host != nodes:
            return (
                f"parallel environment {pe!r} puts {per_host} slots on each host (allocation_rule {rule}), and a run's {slots} slots "
                f"(resources.ranks x resources.cpus) would not make {nodes} hosts: {fix}, or make the slots per node {per_host}"
            )
    elif rule not in ("$round_robin", "$fill_up"):
        return f"parallel environment {pe!r} has allocation_rule {rule or 'missing'!r}, which hpcrl cannot place ranks by: {fix}"
    if fields.get("control_slaves", "").strip().upper() != "TRUE":
        return f"parallel environment {pe!r} has control_slaves FALSE: the ranks on the other hosts start with qrsh -inherit, which needs TRUE; {fix}"
    return None


SPANS_HOSTS = "# hpcrl: each task of this job spans hosts"
"""The line sge.sh.j2 writes into a job whose tasks start ranks on other hosts (qrsh -inherit)."""


def hold_argv(after: list[Dependency], spanning: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """qsub options for a stage's dependencies (see the module docstring for why these kinds).

    A task-by-task hold on a job whose tasks spanned hosts is a hold on the whole job instead: Grid
    Engine 8.1.9's qmaster dies ("JB_ja_tasks not found in element", a CRITICAL in its messages) when an
    array task that ran parallel tasks under `qrsh -inherit` ends while a `-hold_jid_ad` successor
    waits on it; `-hold_jid` on the same job does not. Eval task i still starts after train task i."""
    each = [d.job_id for d in after if d.kind == "each" and d.job_id not in spanning]
    whole = [d.job_id for d in after if d.kind == "all" or (d.kind == "each" and d.job_id in spanning)]
    return (["-hold_jid_ad", ",".join(each)] if each else []) + (["-hold_jid", ",".join(whole)] if whole else [])


class _Hosts:
    """The hosts of one `refuse`: slots and free GPUs from `qstat -f`, what a host holds from `qconf -se`
    (read once, only when a request exceeds what is free now)."""

    def __init__(self, slots: dict[str, int], free: dict[str, float], gpu: str, where: str) -> None:
        self.slots, self.free, self.gpu, self.where = slots, free, gpu, where
        self._held: dict[str, float | None] | None = None

    def refuse(self, ask: NodeRequest, run: Callable[[list[str]], str]) -> str | None:
        """Why no host holds all of `ask` (its slots and its GPUs together), in one line; None where one
        does or Grid Engine cannot say (a queue or global consumable, a host qconf does not answer for)."""
        most = max(self.slots.values())
        if ask.cpus > most:
            return f"{ask.cpus_key}: {ask.cpus} slots on one host{ask.cpus_detail}, but the largest host of {self.where} has {most} (qstat -f): the task would wait for ever"
        if ask.gpus <= 0:
            return None
        if not self.free:
            return (
                f"{ask.gpus_key}: {ask.gpus} GPUs as Grid Engine's consumable {self.gpu!r}, but no host of {self.where} offers it (qstat -f -F {self.gpu}): "
                "the task would never start; resources.sge_gpu_resource names the site's GPU complex (qconf -sc lists them)"
            )
        roomy = [h for h in self.free if self.slots.get(h, 0) >= ask.cpus]
        if any(self.free[h] >= ask.gpus for h in roomy):
            return None
        held = self._read_held(run)
        if held is None or any((held.get(h) or 0) >= ask.gpus for h in roomy):
            return None
        if ask.gpus > max(v or 0 for v in held.values()):
            return f"{ask.gpus_key}: {ask.gpus} GPUs on one host, but no host of {self.where} holds more than {max(v or 0 for v in held.values()):g} {self.gpu!r} (qconf -se): the task would wait for ever"
        shown = "; ".join(f"{h}: {self.slots.get(h, 0)} slots, {held[h]:g} {self.gpu}" for h in sorted(held))
        return (
            f"{ask.cpus_key}, {ask.gpus_key}: {ask.cpus} slots{ask.cpus_detail} and {ask.gpus} GPUs on one host, but no host of {self.where} "
            f"holds them together (qstat -f, qconf -se: {shown}): the task would wait for ever"
        )

    def _read_held(self, run: Callable[[list[str]], str]) -> dict[str, float | None] | None:
        """Host -> its `complex_values` amount of the GPU consumable; None where a host's answer is missing or
        the consumable is a queue or global one (its total is not the host's to say). A host whose name this
        machine cannot resolve (qconf: "can't resolve hostname"; the test cell's namespace hosts, seen from
        the head) is left out: the others decide."""
        if self._held is None:
            held: dict[str, float | None] = {}
            for host in self.free:
                try:
                    held[host] = complex_value(run(["qconf", "-se", host]), self.gpu)
                except SchedulerError as exc:
                    if "can't resolve hostname" in str(exc):
                        continue
                    return None
            self._held = held
        if not self._held:
            return None
        return None if None in self._held.values() else self._held


class SGEScheduler(Scheduler):
    name = "sge"
    template = "sge.sh.j2"
    one_host = None  # several hosts where the parallel environment spans them: refuse_nodes asks the cell

    def __init__(self) -> None:
        super().__init__()
        self._pe_refusals: dict[tuple[str, int, int], str | None] = {}
        self._spanning: set[str] = set()
        """Jobs submitted here whose tasks span hosts (hold_argv)."""

    def refuse_nodes(self, res: Any) -> str | None:
        """A run over several hosts needs a parallel environment that spans hosts and lets the job start
        its tasks there (`qrsh -inherit`, hpcrl.runtime.launch): asked of the cell once per PE
        (`qconf -sp`); where no cell answers, refused too, since Grid Engine would keep every rank on
        one host or never start the job."""
        key = (res.sge_pe, res.ranks * res.cpus, res.nodes)
        if key not in self._pe_refusals:
            try:
                listing = self.run(["qconf", "-sp", res.sge_pe])
            except SchedulerError as exc:
                self._pe_refusals[key] = f"cannot read parallel environment {res.sge_pe!r} to see whether it spans hosts ({str(exc).splitlines()[0]})"
            else:
                self._pe_refusals[key] = pe_refusal(res.sge_pe, listing, res.ranks * res.cpus, res.nodes)
        return self._pe_refusals[key]

    def _read_max_array_size(self) -> int:
        """The cell's max_aj_tasks (0 means no limit); SGE's task ids start at 1 like hpcrl's.

        With no cell in reach (a dry run) the default stands in: qsub would name a smaller limit itself.
        """
        return self.config_value(["qconf", "-sconf"], r"^max_aj_tasks\s+(\d+)", DEFAULT_MAX_AJ_TASKS) or super()._read_max_array_size()

    def refuse(self, exp: Experiment, requests: Sequence[NodeRequest] = ()) -> str | None:
        """A task asking more slots than any host offers: qsub takes it, and Grid Engine keeps it waiting
        for ever ("cannot run in PE "smp" because it only offers 0 slots"; hpcrl's PE puts all of a
        task's slots on one host). Measured against the host with the most slots in the queue instances
        `qstat -f` lists (of `resources.queue` where set); where qstat does not answer (a dry run away
        from the cluster) or lists none, qsub decides as before. Memory is left to qsub: how a site
        counts it (per slot, which complex) varies.

        A task asking GPUs needs the consumable `resources.sge_gpu_resource` on some host of the queue:
        where no instance shows it (`qstat -f -F gpu`; the complex is unknown, or no host has it),
        qsub refuses the job or Grid Engine never starts it, and a site that names its GPUs otherwise
        (`gpus`, `cuda`, ...) is told which key to set; more GPUs than any host holds wait for ever too
        ("cannot run at host because it offers only hc:gpu=2"). Each request must fit ONE host whole:
        the host with the most slots may hold no GPU."""
        queue, gpu = exp.resources.queue, exp.resources.sge_gpu_resource
        gpu_asks = [ask for ask in requests if ask.gpus > 0]
        try:
            listing = self.probe(["qstat", "-f", *(["-F", gpu] if gpu_asks else []), *(["-q", queue] if queue else [])])
        except SchedulerError:
            return None
        slots = host_slots(listing)
        if not slots:
            return None
        hosts = _Hosts(slots, offered(listing, gpu) if gpu_asks else {}, gpu, f"queue {queue}" if queue else "any queue")
        return next((why for ask in requests if (why := hosts.refuse(ask, self.probe))), None)

    def submit_argv(self, script: Path, after: list[Dependency]) -> list[str]:
        return ["qsub", "-terse", *hold_argv(after, self._spanning), str(script)]

    def submit(self, script: Path, size: int, after: list[Dependency]) -> str:
        out = self.run(self.submit_argv(script, after)).strip()
        # `<id>` for a plain job, `<id>.1-N:1` for an array.
        job_id = out.splitlines()[-1].split(".")[0] if out else ""
        if not job_id.isdigit():
            raise SchedulerError(f"qsub -terse {script}: expected a job id, got {out!r}")
        try:
            self.submitted(job_id, script.read_text(errors="replace"))
        except OSError:
            pass
        return job_id

    def submitted(self, job_id: str, text: str) -> None:
        """A job whose tasks span hosts is held on as a whole by the jobs after it (hold_argv)."""
        if SPANS_HOSTS in text:
            self._spanning.add(job_id)

    def query(self, job_ids: list[str]) -> dict[str, dict[int, str]]:
        if not job_ids:
            return {}
        # One listing of this user's jobs, each array task on its own line (-g d); ended jobs are absent.
        found = parse_qstat_xml(self.run(["qstat", "-xml", "-g", "d", "-u", getpass.getuser()]))
        return {j: found[j] for j in job_ids if j in found}

    def cancel(self, job_ids: list[str]) -> None:
        if not job_ids:
            return
        try:
            self.run(["qdel", *job_ids])
        except SchedulerError as exc:
            # qdel deletes the jobs it knows and exits 1 if any id is unknown: jobs that already ended.
            if qdel_refusals(str(exc).split(": ", 1)[-1]):
                raise

    def cancel_tasks(self, tasks: dict[str, list[int]]) -> None:
        """One qdel for every job: `123.1-3 123.7` per contiguous range of tasks."""
        specs = [f"{job}.{span}" for job, ts in tasks.items() for span in compress_ranges(ts)]
        if specs:
            self.cancel(specs)
