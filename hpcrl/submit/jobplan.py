"""Job planning: what each stage asks the scheduler for, and the scripts of one submission.

Each stage's resources are declared here once (`stage_resources`), written into the job's
template context and recorded per job in jobs/jobs.json, where the local executor reads them.
What each stage inherits from the config's `resources:` section, and why:

- train, learner, study (the workers of an Optuna study): everything, as written. They are what the section describes.
- eval: the train job's partition/queue, account and `extra` lines (a site's policy usually
  applies to every job of a project, and an eval that asks for GPUs needs the GPU partition),
  with `eval.gpus` GPUs and `resources.eval_time`.
- actors: CPU work beside their learner, which must run at the same time: the learner's
  partition/queue, account and `extra` lines, no GPU, `distributed.actor_cpus` / `actor_mem`.
- aggregate: `hpcrl collect` on one CPU with little memory and no GPU. It keeps only the account
  (billing applies to every job); the partition/queue and `extra` lines are written for GPU
  training (`--gres`, `--constraint=a100`, a GPU queue) and would make it wait for a GPU node.
- build-image: the image section's build_time and build_mem and no GPU; the rest as train, since a
  site that confines a project to a partition confines its builds too.

Arrays larger than the cluster allows are split into chunks; each chunk has a manifest (line i is
the run index of array task i), which is also how a retry resubmits any set of runs as one
contiguous array on every scheduler. Nothing here writes files or talks to a scheduler beyond
rendering: pipeline.py does both.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hpcrl
from hpcrl.config import program_spec
from hpcrl.config.container_spec import ImageConfig
from hpcrl.config.directives import own_option_problem
from hpcrl.config.experiment import Experiment
from hpcrl.config.resources_spec import format_time, parse_mem_mb, parse_time_s
from hpcrl.config.schema import ConfigError
from hpcrl.schedulers.base import NodeRequest, Scheduler
from hpcrl.store import expdir
from hpcrl.store.expdir import Run
from hpcrl.store.states import REQUEUE_EXIT

AGGREGATE_MEM = "2G"
"""Memory of the aggregate job: `collect` reads CSVs and draws a few plots."""


@dataclass(frozen=True)
class StageResources:
    """What one stage's job asks for; recorded as a dict in jobs.json (`Job.resources`)."""

    gpus: int
    cpus: int
    mem_mb: int
    time: str
    """hh:mm:ss"""
    soft_time: str
    """When the warning signal is due: `time` less `signal_seconds` (SGE's s_rt)."""
    signal_seconds: int
    max_concurrent: int | None
    partition: str | None = None
    account: str | None = None
    queue: str | None = None
    sge_pe: str = "smp"
    sge_gpu_resource: str = "gpu"
    sge_mem_resource: str | None = "mem_free"
    extra: list[str] = field(default_factory=list)
    ranks: int = 1
    """Processes of one run (train only: DD-PPO); `cpus` is per rank, `gpus` and `mem_mb` per node."""
    nodes: int = 1

    @property
    def ranks_per_node(self) -> int:
        return self.ranks // self.nodes

    def as_dict(self) -> dict[str, Any]:
        """The fields, and ranks_per_node for the templates."""
        return {**dataclasses.asdict(self), "ranks_per_node": self.ranks_per_node}


def stage_resources(exp: Experiment, stage: str) -> StageResources:
    """The resources of `stage` (train, eval, aggregate, learner, actors, build-image): see the module docstring."""
    res = exp.resources
    site = {"sge_pe": res.sge_pe, "sge_gpu_resource": res.sge_gpu_resource, "sge_mem_resource": res.sge_mem_resource, "account": res.account}
    placement = {"partition": res.partition, "queue": res.queue, "extra": list(res.extra)}
    max_concurrent = res.max_concurrent
    ranks = {"ranks": res.ranks, "nodes": res.nodes} if stage == "train" else {}
    if stage in ("train", "study", "learner"):
        gpus, cpus, mem, time = res.gpus, res.cpus, res.mem, res.time
    elif stage == "eval":
        gpus, cpus, mem, time = exp.eval.gpus, res.cpus, res.mem, res.eval_time
    elif stage == "actors":
        d = exp.distributed
        if d is None:
            raise ValueError("the actors stage exists only for a distributed experiment")
        gpus, cpus, mem, time = 0, d.actor_cpus, d.actor_mem, res.time
        # As many actors at once as the learners allowed to run can use.
        max_concurrent = res.max_concurrent * d.actors if res.max_concurrent else None
    elif stage == "aggregate":
        gpus, cpus, mem, time = 0, 1, AGGREGATE_MEM, res.eval_time
        placement = {"partition": None, "queue": None, "extra": []}
    elif stage == "build-image":
        image = exp.image or ImageConfig()  # a Dockerfile import has no image section: its defaults
        gpus, cpus, mem, time = 0, res.cpus, image.build_mem, image.build_time
    else:
        raise ValueError(f"unknown stage {stage!r}")
    _check_counts({"gpus": gpus, "cpus": cpus, "signal_seconds": res.signal_seconds, "max_concurrent": max_concurrent})
    time_s = parse_time_s(time)
    return StageResources(
        gpus=gpus, cpus=cpus, mem_mb=parse_mem_mb(mem), time=format_time(time_s),
        soft_time=format_time(max(1, time_s - res.signal_seconds)), signal_seconds=res.signal_seconds,
        max_concurrent=max_concurrent, **site, **placement, **ranks,
    )


NODE_KEYS = {
    "train": ("resources.cpus", "resources.mem", "resources.gpus"),
    "eval": ("resources.cpus", "resources.mem", "eval.gpus"),
    "actors": ("distributed.actor_cpus", "distributed.actor_mem", None),
}
"""The jobs that ask the most of one node, and the keys that ask: training (the learner and a study
worker ask the same per rank), evaluation (train's CPUs and memory, its own GPUs) and a distributed
run's actors (no GPU)."""


def node_requests(exp: Experiment) -> list[NodeRequest]:
    """What one node must hold for each of NODE_KEYS' jobs, from their stage resources: what a
    cluster's `refuse` compares with its largest node before anything is submitted."""
    requests = []
    for stage, (cpus_key, mem_key, gpus_key) in NODE_KEYS.items():
        if stage == "actors" and exp.distributed is None:
            continue
        res = stage_resources(exp, stage)
        mem = functools.reduce(getattr, mem_key.split("."), exp)  # as the config wrote it, for the message
        detail = f" ({res.ranks_per_node} ranks x {res.cpus})" if res.ranks_per_node > 1 else ""
        requests.append(NodeRequest(cpus_key, res.cpus * res.ranks_per_node, mem_key, mem, res.mem_mb, detail, res.gpus, gpus_key or ""))
    return requests


def _check_counts(counts: dict[str, Any]) -> None:
    """Counts reach directive lines and arithmetic: an Experiment built past config validation (the
    Python API) must not bring a string there. Config validation names the same keys first."""
    for key, value in counts.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"resources.{key}: expected an integer, got {value!r}")


def job_context(
    exp: Experiment,
    stage: str,
    argv: list[str],
    array: int,
    log_dir: Path,
    *,
    requeue: bool = False,
    resources: StageResources | None = None,
    program_tasks: list[list[str]] | None = None,
) -> dict[str, Any]:
    """Everything a job template may use. The templates decide layout; this decides values.

    `program_tasks`: for a user's program, the command line of each array task, in task order."""
    res = resources or stage_resources(exp, stage)
    pythonpath = sweep_pythonpath()
    container = dataclasses.asdict(exp.container)
    container["nv"] = exp.container.nv and res.gpus > 0  # --nv where the stage has a GPU: the aggregate has none
    if exp.container.image:
        container["binds"] = container_binds(exp, pythonpath)
    return {
        "experiment_name": exp.name,
        "hpcrl_version": hpcrl.__version__,
        "stage": stage,
        "job_name": f"{exp.name}-{stage}",
        "log_dir": str(log_dir),
        "array": array,
        "max_concurrent": res.max_concurrent,
        "requeue": requeue,
        "requeue_exit": REQUEUE_EXIT,
        "res": res.as_dict(),
        "cuda": dataclasses.asdict(exp.cuda),
        "container": container,
        "python": exp.python or sys.executable,
        "pythonpath": ":".join(pythonpath),
        "argv": argv,
        "program_tasks": program_tasks,
        "program_in_container": program_in_container(exp),
    }


def sweep_pythonpath() -> list[str]:
    """The sweep's PYTHONPATH, each entry made absolute: the jobs import the config's own modules
    (`env.id: mygame:MyGame`) from where the sweep's checks imported them. Grid Engine passes no
    environment to a job, and a relative entry (`PYTHONPATH=.`) would name the job's working directory."""
    entries = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return list(dict.fromkeys(os.path.abspath(entry) for entry in entries))


def container_binds(exp: Experiment, pythonpath: Sequence[str] = ()) -> list[str]:
    """`container.binds`, and what a job in the image must see that they do not already show at the
    same path: the experiment directory (the job writes there), a user's program's working
    directory, the sweep's PYTHONPATH (the config's own modules), and `cuda.lib_path` (read-only),
    which the job puts on LD_LIBRARY_PATH: the image gets the host's LD_LIBRARY_PATH, and a directory
    there that the image lacks is a CUDA library the program cannot load."""
    binds = list(exp.container.binds)
    needed = [str(exp.dir.resolve()), *(entry for entry in pythonpath if os.path.isdir(entry) and not _images_own(entry))]
    if exp.program:
        needed.append(program_spec.fixed_dir(program_spec.anchored_workdir(exp.program.workdir, Path.cwd())))
    for path in needed:
        if path and not _shown(path, binds):
            binds.append(path)
    if (lib := exp.cuda.lib_path) and not _shown(lib, binds):
        binds.append(f"{lib}:{lib}:ro")
    return binds


_IMAGE_TREES = ("/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/opt/hpcrl")
"""Where the image keeps its own system and Python (hpcrl's images: /opt/hpcrl): a host directory bound
there would hide the image's files."""


def _images_own(path: str) -> bool:
    """A PYTHONPATH entry inside one of the image's own trees (a module system's site-packages under /usr):
    the job exports it as the sweep had it, but binding it would shadow the image's own packages."""
    return any(path == tree or path.startswith(tree + "/") for tree in _IMAGE_TREES)


def _shown(path: str, binds: list[str]) -> bool:
    """Whether a bind (`src[:dst[:opts]]`) shows `path` inside the image at the same path: a bind of
    it or of a directory above it, mounted where it is on the host."""
    for bind in binds:
        src, _, rest = bind.partition(":")
        dst = rest.partition(":")[0] or src
        if src == dst and (path == src or path.startswith(src.rstrip("/") + "/")):
            return True
    return False


def program_in_container(exp: Experiment) -> bool:
    """`container.runs: program` with an image: hpcrl runs on the host, each task's command line in the image."""
    return bool(exp.container.image) and exp.container.runs == "program"


def resolve_container_runtime(exp: Experiment) -> None:
    """`container.runs: program`: hpcrl starts the runtime from the job, on the node's PATH, which may lack
    it (Grid Engine's minimal one): the name is resolved here, at sweep time, and the job gets the path;
    a runtime missing here is refused in one line before anything is written."""
    if not program_in_container(exp):
        return
    runtime = exp.container.runtime
    found = executable(runtime, Path("/")) if runtime.startswith("/") else executable(runtime, Path("."))
    if found is None:
        where = "is not an executable file here" if runtime.startswith("/") else "is not on PATH here"
        raise ConfigError(f"container.runtime: {runtime} {where}; container.runs: program starts it from each job (install it, or give its absolute path)")
    exp.container.runtime = found


def check_python(exp: Experiment, scheduler: Scheduler) -> None:
    """At sweep time, `python` where the jobs run on this machine with it (the local executor): an
    interpreter that is not there fails every job at its first line, with no marker to say why. A
    cluster's nodes have files of their own, so a path there is not looked at here (nor when the
    scripts are only rendered); with an image the jobs run the image's Python."""
    if not exp.python or not scheduler.runs_here or scheduler.in_process or (exp.container.image and not program_in_container(exp)):
        return
    if executable(exp.python, Path(".")) is None:
        raise ConfigError(f"python: {exp.python} is not an executable file here, and {scheduler.name} runs every job on this machine with it (left unset, they run {sys.executable})")


def located(exp: Experiment, words: list[str]) -> list[str]:
    """A program's command line as its job script shows it. Without an image the command runs on
    the cluster's own nodes, where a batch job's PATH may lack what the login shell has (Grid Engine
    jobs had no `python`): a bare name is resolved on this machine's PATH now, at sweep time, and
    the script shows the absolute path (a virtualenv's `bin/python` kept as such, not its target).
    Inside an image the name is the image's, and stays as written."""
    if exp.container.image or not words or "/" in words[0]:
        return words  # a path (relative to program.workdir) is found the same way in the job
    found = executable(words[0], Path("."))
    return [found, *words[1:]] if found else words


def executable(word: str, workdir: Path) -> str | None:
    """Where `word` (a program's first word) runs from on this machine: a bare name on the PATH,
    a path relative to the program's working directory; None where it is missing or not executable,
    or where it holds a placeholder (only a run knows it)."""
    if "{" in word:
        return None
    if "/" in word:
        path = workdir / word
        return str(path) if path.is_file() and os.access(path, os.X_OK) else None
    found = shutil.which(word)
    return os.path.abspath(found) if found else None


def chunks(items: list[int], size: int) -> list[list[int]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


@dataclass
class PlannedJob:
    stage: str
    script: str
    """Path of the script relative to the experiment directory."""
    manifest: str | None
    runs: list[int]
    """Run indices of the array tasks, in task order (empty for the aggregate)."""
    text: str
    resources: StageResources
    after: list[tuple[str, str]] = field(default_factory=list)
    """Dependencies as (script of an earlier planned job, kind); submission turns scripts into job ids."""
    workers: int = 0
    """Array tasks of a job whose tasks are not runs (an Optuna study's workers)."""

    @property
    def tasks(self) -> int:
        """The array size to submit (0: a single job)."""
        return self.workers or len(self.runs)


def plan_stage(
    exp: Experiment, scheduler: Scheduler, stage: str, script: str, manifest: str | None, runs: list[int], argv: list[str],
    cwd: Path | None, *, requeue: bool = False, after: list[tuple[str, str]] | None = None, array: int | None = None,
    program_tasks: list[list[str]] | None = None,
) -> PlannedJob:
    """One job of a stage: its resources, its rendered script, its dependencies."""
    root = exp.dir.resolve()
    res = stage_resources(exp, stage)
    if res.nodes > 1 and (why := scheduler.refuse_nodes(res)):
        raise ConfigError(f"resources.nodes: {res.nodes} nodes per run, but {scheduler.name} {why}")
    for i, line in enumerate(res.extra):
        if problem := own_option_problem(line, scheduler.template, res.sge_mem_resource):
            raise ConfigError(f"resources.extra[{i}]: {problem}")
    size = len(runs) if array is None else array
    ctx = job_context(exp, stage, argv, size, root / "jobs" / "logs", requeue=requeue, resources=res, program_tasks=program_tasks)
    return PlannedJob(stage, script, manifest, runs, scheduler.render(ctx, cwd), res, after or [], 0 if array is None else array)


def plan_eval(
    exp: Experiment, scheduler: Scheduler, script: str, manifest: str, part: list[int], trainer: str | None, cwd: Path | None,
    runs: dict[int, Run] | None = None,
) -> PlannedJob:
    """Eval task i after task i of the job that trains (train, or a distributed learner); none for eval-only work.
    A program's `program.eval` command is shown per task, as the train job shows the training command."""
    argv = ["eval", str(exp.dir.resolve()), "--manifest", manifest]
    tasks = program_tasks(exp, runs, part, "eval") if exp.program is not None and exp.program.eval is not None else None
    return plan_stage(exp, scheduler, "eval", script, manifest, part, argv, cwd, after=[(trainer, "each")] if trainer else [], program_tasks=tasks)


def program_tasks(exp: Experiment, runs: dict[int, Run] | None, part: list[int], stage: str) -> list[list[str]]:
    """The command line of each task of a program's train or eval job, in task order."""
    if not runs:
        raise ValueError(f"planning a program's {stage} jobs needs its runs")
    root = exp.dir.resolve()
    render = program_spec.argv if stage == "train" else program_spec.eval_argv
    return [located(exp, render(runs[i].config.program, expdir.run_values(root, runs[i].run_id, runs[i].seed))) for i in part]


def plan_aggregate(exp: Experiment, scheduler: Scheduler, attempt: int, evals: list[str], cwd: Path | None) -> PlannedJob:
    """`hpcrl collect` once every eval job has ended, whatever their outcome."""
    argv = ["collect", str(exp.dir.resolve())]
    return plan_stage(exp, scheduler, "aggregate", f"jobs/aggregate-{attempt}.sh", None, [], argv, cwd, after=[(e, "all") for e in evals])


def plan_eval_only(
    exp: Experiment, scheduler: Scheduler, todo: list[int], attempt: int, cwd: Path | None, runs: dict[int, Run] | None = None,
) -> tuple[list[PlannedJob], list[str]]:
    """Eval arrays for runs whose training is done but whose evaluation failed, was cancelled or never ran."""
    out, evals = [], []
    for c, part in enumerate(chunks(todo, scheduler.max_array_size())):
        manifest, script = f"jobs/{attempt}-e{c}.tasks", f"jobs/eval-{attempt}-e{c}.sh"
        out.append(plan_eval(exp, scheduler, script, manifest, part, None, cwd, runs))
        evals.append(script)
    return out, evals


def plan_study(exp: Experiment, scheduler: Scheduler, workers: int, attempt: int, cwd: Path | None = None) -> tuple[list[PlannedJob], list[str]]:
    """The worker array of an Optuna study: each task asks for trials, trains and evaluates them in
    turn (study_worker.py), so the aggregate waits on it directly. `resources.max_concurrent` caps
    the tasks that run at once."""
    script = f"jobs/study-{attempt}.sh"
    argv = ["search-worker", str(exp.dir.resolve())]
    return [plan_stage(exp, scheduler, "study", script, None, [], argv, cwd, requeue=True, array=workers)], [script]


def plan_train(
    exp: Experiment, scheduler: Scheduler, todo: list[int], attempt: int, cwd: Path | None = None, runs: dict[int, Run] | None = None
) -> tuple[list[PlannedJob], list[str]]:
    """Train and eval arrays of one submission, chunk by chunk; returns the jobs and the eval scripts.

    `runs` (by index) is needed for a user's program, whose command line each task shows."""
    root = exp.dir.resolve()
    out, evals = [], []
    for c, part in enumerate(chunks(todo, scheduler.max_array_size())):
        manifest, train = f"jobs/{attempt}-{c}.tasks", f"jobs/train-{attempt}-{c}.sh"
        tasks = program_tasks(exp, runs, part, "train") if exp.program is not None else None
        out.append(plan_stage(exp, scheduler, "train", train, manifest, part, ["train", str(root), "--manifest", manifest], cwd, requeue=True, program_tasks=tasks))
        evals.append(f"jobs/eval-{attempt}-{c}.sh")
        out.append(plan_eval(exp, scheduler, evals[-1], manifest, part, train, cwd, runs))
    return out, evals
