"""Submitting and watching a 1000-run sweep on the real local Slurm and Grid Engine.

For each scheduler, in one run on the same cluster:

- hpcrl: `hpcrl sweep` of 1000 runs (render every script and manifest, write the experiment,
  submit train, eval and aggregate as array jobs): scheduler calls and wall time;
- the loop users write by hand: the same scripts rendered and submitted one job at a time (per
  run a train job and an eval job that waits for it, then the aggregate after every eval; one
  sbatch/qsub each): scheduler calls and wall time;
- `hpcrl status` over the 1000 runs: scheduler calls and wall time.

Every job is submitted on hold (`--hold` / `-h`) so that nothing runs and the two submissions
compete on equal terms; everything is cancelled at the end. Start the clusters first:

    bash tests/clusters/slurm.sh start; bash tests/clusters/sge.sh start; source tests/clusters/env.sh
    python benchmarks/submit_scale.py [--runs 1000 10000] [--loop-max 1000] [--schedulers slurm sge]
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import tempfile
import time
from pathlib import Path

import _args  # benchmarks/_args.py: the script's own folder is first on sys.path

from hpcrl.config.load import load_experiment
from hpcrl.schedulers import get_scheduler
from hpcrl.schedulers.base import Scheduler
from hpcrl.status import experiment_status
from hpcrl.store.expdir import Dependency, read_jobs
from hpcrl.submit.jobplan import job_context
from hpcrl.submit.pipeline import submit_experiment
from hpcrl.sweep.runs import expand

CONFIG = Path(__file__).resolve().parent.parent / "tests" / "data" / "conformance.yaml"
HOLD = {"slurm": "--hold", "sge": "-h"}
SUBMIT = {"slurm": "sbatch", "sge": "qsub"}


class CallCounter:
    """Counts every scheduler command any Scheduler instance runs (status makes its own instances)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.seconds = 0.0
        """Wall time spent inside the scheduler's commands."""
        self._run = Scheduler.run

    def __enter__(self) -> CallCounter:
        original, counter = self._run, self

        def run(scheduler: Scheduler, argv: list[str], input: str | None = None, **kwargs: float) -> str:
            counter.calls.append(argv[0])
            began = time.perf_counter()
            try:
                return original(scheduler, argv, input, **kwargs)
            finally:
                counter.seconds += time.perf_counter() - began

        Scheduler.run = run  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        Scheduler.run = self._run  # type: ignore[method-assign]

    def summary(self) -> str:
        calls = ", ".join(f"{name} x{self.calls.count(name)}" for name in dict.fromkeys(self.calls)) or "none"
        return f"{calls} ({self.seconds:.2f} s in them)"


def hpcrl_sweep(name: str, root: Path, runs: int) -> tuple[Path, float, CallCounter]:
    exp = load_experiment(CONFIG, [f"output={root}", f"sweep.seeds={list(range(runs))}", f'resources.extra=["{HOLD[name]}"]'])
    with CallCounter() as counter:
        began = time.perf_counter()
        rc = submit_experiment(exp, name, out=io.StringIO())
        took = time.perf_counter() - began
    assert rc == 0
    return exp.dir, took, counter


def one_at_a_time(name: str, root: Path, runs: int) -> tuple[float, CallCounter, list[str]]:
    """The hand-written loop: per run, a train job and an eval job that waits for it; then the aggregate."""
    exp = load_experiment(CONFIG, [f"output={root}", f"sweep.seeds={list(range(runs))}", f'resources.extra=["{HOLD[name]}"]', "name=loop"])
    scheduler = get_scheduler(name, exp.dir)
    scripts = exp.dir / "jobs"
    scripts.mkdir(parents=True)

    def submit(stage: str, argv: list[str], after: list[Dependency]) -> str:
        script = scripts / f"{stage}-{len(ids)}.sh"
        script.write_text(scheduler.render(job_context(exp, stage, argv, 0, scripts, requeue=stage == "train")))
        return scheduler.submit(script, 0, after)

    ids: list[str] = []
    with CallCounter() as counter:
        began = time.perf_counter()
        evals = []
        for run in expand(exp):
            ids.append(submit("train", ["train", str(exp.dir), "--task", str(run.index)], []))
            evals.append(submit("eval", ["eval", str(exp.dir), "--task", str(run.index)], [Dependency(ids[-1], "all")]))
            ids.append(evals[-1])
        ids.append(submit("aggregate", ["collect", str(exp.dir)], [Dependency(j, "all") for j in evals]))
        took = time.perf_counter() - began
    return took, counter, ids


def status_of(exp_dir: Path) -> tuple[float, CallCounter, int]:
    with CallCounter() as counter:
        began = time.perf_counter()
        rows, _, problem = experiment_status(exp_dir)
        took = time.perf_counter() - began
    assert problem is None, problem
    return took, counter, sum(1 for r in rows if r.train == "pending")


def file_cost(root: Path, n: int = 1000) -> float:
    """Seconds to make one run directory and create one file in it on this file system, measured
    beside the sweep (a sweep makes one of each per run; on this VM's disk it varies 5x in a day)."""
    base = root / "fs-probe"
    base.mkdir()
    began = time.perf_counter()
    for i in range(n):
        os.mkdir(base / str(i))
        os.close(os.open(base / str(i) / "config.yaml", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    took = (time.perf_counter() - began) / n
    shutil.rmtree(base)
    return took


def bench(name: str, runs: int, loop_max: int) -> None:
    if shutil.which(SUBMIT[name]) is None:
        print(f"{name}: {SUBMIT[name]} not on PATH; start it with tests/clusters/{name}.sh start")
        return
    # ignore_cleanup_errors: Grid Engine may still write a cancelled job's files while the directory goes
    with tempfile.TemporaryDirectory(dir="/tmp", ignore_cleanup_errors=True) as tmp:
        root = Path(tmp)
        scheduler = get_scheduler(name, root)
        per_run = file_cost(root)
        exp_dir, t_hpcrl, c_hpcrl = hpcrl_sweep(name, root, runs)
        loop = runs <= loop_max
        t_loop, c_loop, loop_ids = one_at_a_time(name, root, runs) if loop else (0.0, None, [])
        t_status, c_status, pending = status_of(exp_dir)
        try:
            print(f"\n{name}: {runs} runs, every job held; cluster limit {scheduler.max_array_size()} tasks per array")
            print(f"  {'':34} {'calls':>6} {'wall s':>8}")
            jobs = read_jobs(exp_dir)
            print(f"  {'hpcrl sweep (' + str(len(jobs)) + ' array jobs)':34} {len(c_hpcrl.calls):>6} {t_hpcrl:>8.2f}   {c_hpcrl.summary()}")
            print(f"  {'':34} {'':>6} {per_run * runs:>8.2f}   beside it, a bare loop making a directory and a file per run ({per_run * 1e6:.0f} µs each on this disk)")
            if c_loop is not None:
                print(f"  {'one job per run and stage':34} {len(c_loop.calls):>6} {t_loop:>8.2f}   {c_loop.summary()}")
            print(f"  {'hpcrl status':34} {len(c_status.calls):>6} {t_status:>8.2f}   {c_status.summary()}; {pending} runs pending")
            if c_loop is not None:
                print(f"  speed-up of hpcrl sweep over the loop: {t_loop / t_hpcrl:.0f}x wall, {len(c_loop.calls) / len(c_hpcrl.calls):.0f}x fewer calls")
            else:
                print(f"  (the loop is not run past --loop-max {loop_max} runs: {2 * runs + 1} submissions; the smaller sizes give its rate)")
        finally:
            scheduler.cancel([j.job_id for j in read_jobs(exp_dir)])
            for start in range(0, len(loop_ids), 200):
                scheduler.cancel(loop_ids[start : start + 200])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=_args.runs, nargs="+", default=[1000], help="sweep sizes, each measured on every scheduler")
    parser.add_argument("--loop-max", type=_args.integer(0, _args.MAX_RUNS, "a number of runs"), default=1000, help="largest size the one-job-at-a-time reference is run for")
    parser.add_argument("--schedulers", nargs="+", default=["slurm", "sge"], choices=["slurm", "sge"])
    args = parser.parse_args()
    for name in args.schedulers:
        for runs in args.runs:
            bench(name, runs, args.loop_max)


if __name__ == "__main__":
    main()
