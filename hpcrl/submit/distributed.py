"""What `hpcrl sweep` renders for a distributed experiment, per submission and chunk of runs:

    learner-A-C.sh   array, one task per run (manifest A-C.tasks), the GPUs of `resources`, requeued
    actors-A-C.sh    array, runs x actors tasks (manifest A-C.actors.tasks), CPU only, requeued
    eval-A-C.sh      eval task i after learner task i, as for `train`
    aggregate-A.sh   after every eval array, whatever its outcome (added by pipeline.plan_scripts)

The actors' manifest repeats each run index once per actor, run by run, so the k-th line that
names run r is actor k of run r: the file alone maps a task to (run, actor), and every reader of
manifests (status, retries) still sees one run index per line.

A learner without its actors only waits, so a run's learner and actors must be able to run at
the same time. Chunks are therefore sized to what can: `distributed.parallel_runs`, and on the
local executor its pool (`Scheduler.task_slots`) divided by 1 + actors. Chunk c's learner
and actors start after chunk c-1's learner array has ended (dependency `all`), so the runs go
through the machine a gang at a time instead of deadlocking a full pool with learners.
"""

from __future__ import annotations

from pathlib import Path

from hpcrl.config.experiment import Experiment
from hpcrl.config.schema import ConfigError
from hpcrl.netaddr import is_wildcard, loopback_problem
from hpcrl.schedulers.base import Scheduler
from hpcrl.submit.jobplan import PlannedJob, chunks, plan_eval, plan_stage, stage_resources


def runs_per_chunk(exp: Experiment, scheduler: Scheduler) -> int:
    d = exp.distributed
    assert d is not None
    size = max(1, scheduler.max_array_size() // d.actors)
    if d.parallel_runs:
        size = min(size, d.parallel_runs)
    learner = stage_resources(exp, "learner")
    pool = scheduler.task_slots(learner.max_concurrent, learner.cpus)
    if pool is not None:
        if pool < 1 + d.actors:
            raise ConfigError(
                f"distributed.actors: a run needs its learner and {d.actors} actors running at once, but the local executor "
                f"runs at most {pool} tasks; set resources.max_concurrent to at least {d.actors + 1}"
            )
        size = min(size, pool // (1 + d.actors))
    return size


def loopback_refusal(exp: Experiment, scheduler: Scheduler) -> str | None:
    """Why the actors could not reach their board, where the scheduler may start them on other nodes than the
    learner: an address of the config that is loopback (127.x, or a name that resolves to one). On a cluster it
    was found only as actors waiting out learner_timeout_s; on this machine alone (local, debug) it is fine."""
    d = exp.distributed
    if d is None or scheduler.runs_here:
        return None
    if d.redis.address:
        key, host = "distributed.redis.address", d.redis.address.rpartition(":")[0]
        fix = "give the Redis host's network address"
    elif d.redis.bind != "auto" and not is_wildcard(d.redis.bind):
        key, host = "distributed.redis.bind", d.redis.bind
        fix = "use auto (the default: the learner node's network address) or 0.0.0.0"
    else:
        return None
    problem = loopback_problem(host)
    if problem is None:
        return None
    return f"{key}: {problem}, and {scheduler.name} may start the learner and its actors on different nodes; {fix}"


def plan_distributed(exp: Experiment, scheduler: Scheduler, todo: list[int], attempt: int, cwd: Path | None = None) -> tuple[list[PlannedJob], list[str]]:
    """The learner, actors and eval jobs of one submission (see the module docstring), and the eval scripts."""
    d = exp.distributed
    assert d is not None
    refusal = loopback_refusal(exp, scheduler)
    if refusal:
        raise ConfigError(refusal)
    root = exp.dir.resolve()
    out: list[PlannedJob] = []
    previous_learner: str | None = None
    evals: list[str] = []
    for c, part in enumerate(chunks(todo, runs_per_chunk(exp, scheduler))):
        manifest, actors_manifest = f"jobs/{attempt}-{c}.tasks", f"jobs/{attempt}-{c}.actors.tasks"
        learner_script = f"jobs/learner-{attempt}-{c}.sh"
        gate = [(previous_learner, "all")] if previous_learner else []
        argv = ["learner", str(root), "--manifest", manifest]
        out.append(plan_stage(exp, scheduler, "learner", learner_script, manifest, part, argv, cwd, requeue=True, after=gate))
        actor_runs = [run for run in part for _ in range(d.actors)]
        argv = ["actor", str(root), "--manifest", actors_manifest]
        out.append(plan_stage(exp, scheduler, "actors", f"jobs/actors-{attempt}-{c}.sh", actors_manifest, actor_runs, argv, cwd, requeue=True, after=gate))
        evals.append(f"jobs/eval-{attempt}-{c}.sh")
        out.append(plan_eval(exp, scheduler, evals[-1], manifest, part, learner_script, cwd))
        previous_learner = learner_script
    return out, evals
