"""`hpcrl status` and `hpcrl cancel` of big sweeps: 1,000 and 10,000 runs.

Part 1 (no cluster needed): a synthetic experiment as `hpcrl sweep` and its jobs leave it on disk
(experiment.yaml, runs.csv, every run's config.yaml, jobs.json with arrays of 1,000 tasks and their
manifests, the local executor's task states, and per run the markers and train.csv its state
implies: about 70% done, 3% failed, 5% running, 2% cancelled, the rest pending). Each view is timed as the
whole `hpcrl status` process, beside references in the same run: the status of the commit before
issue 17 (one line per run, as it printed then) and `wc -l runs.csv` (a floor: reading the index
only). Lines printed are counted. A lock held on the local runner's lock file stands for a live
runner, so the scheduler's answer has pending and running tasks.

Part 2 (the real Slurm and Grid Engine on loopback, when they are up): a 10,000-run sweep submitted
on hold (nothing runs), then `hpcrl status`, `hpcrl cancel --setting` (a subset: one setting's
tasks in every stage) and `hpcrl cancel` of everything, each with its scheduler calls counted.

    python benchmarks/status_scale.py [--runs 1000 10000] [--settings 100] [--repeat 3] [--schedulers slurm sge]
    python benchmarks/status_scale.py --show --runs 10000   # print the default view of the synthetic experiment

Start the clusters for part 2 first (tests/clusters/slurm.sh start; tests/clusters/sge.sh start;
source tests/clusters/env.sh); a scheduler whose submit command is missing is skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import io
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import _args  # benchmarks/_args.py: the script's own folder is first on sys.path

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "tests" / "data" / "conformance.yaml"
CHUNK = 1000
REASONS = (
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "FileExistsError: [Errno 17] File exists: 'checkpoints'",
    "rank 1 of 2 was killed by SIGKILL",
)


def state_of(i: int) -> str:
    """The synthetic state of run i: about 70% done, 3% failed, 5% running, 2% cancelled, 20% pending,
    drawn per run (the same every time), so settings differ as they would."""
    k = random.Random(i).randrange(100)
    return "done" if k < 70 else "failed" if k < 73 else "running" if k < 78 else "cancelled" if k < 80 else "pending"


def make_experiment(root: Path, runs: int, settings: int) -> Path:
    """Write the synthetic experiment of `runs` runs (`settings` values of train.lr x runs/settings seeds)."""
    sys.path.insert(0, str(REPO))
    from hpcrl.config.load import load_experiment
    from hpcrl.schedulers.local import write_state
    from hpcrl.store import rundir
    from hpcrl.store.expdir import Dependency, Job, run_dir, write_experiment, write_jobs
    from hpcrl.sweep.runs import expand

    seeds = max(1, runs // settings)
    lrs = [round(1e-3 * (1 + k / settings), 8) for k in range(settings)]
    exp = load_experiment(CONFIG, [f"output={root}", "name=scale", f"sweep.seeds={list(range(seeds))}", f"sweep.grid.train.lr={lrs}"])
    all_runs = expand(exp)[:runs]
    write_experiment(exp, all_runs, {"scheduler": "local"})
    jobs: list[Job] = []
    tasks: dict[str, dict[str, dict]] = {}
    train_task = {"done": "done", "failed": "failed", "running": "running", "cancelled": "cancelled", "pending": "pending"}
    eval_task = {"done": "done", "failed": "done", "running": "pending", "cancelled": "cancelled", "pending": "pending"}
    for c, start in enumerate(range(0, len(all_runs), CHUNK)):
        part = [r.index for r in all_runs[start : start + CHUNK]]
        manifest = f"jobs/0-{c}.tasks"
        rundir.write_manifest(exp.dir, manifest, part)
        train, evaluate = f"train-0-{c}", f"eval-0-{c}"
        jobs += [
            Job("train", train, "local", f"jobs/{train}.sh", len(part), manifest, [], 0),
            Job("eval", evaluate, "local", f"jobs/{evaluate}.sh", len(part), manifest, [Dependency(train, "each")], 0),
        ]
        tasks[train] = {str(t): {"state": train_task[state_of(i)], "rc": None, "requeues": 0} for t, i in enumerate(part, 1)}
        tasks[evaluate] = {str(t): {"state": eval_task[state_of(i)], "rc": None, "requeues": 0} for t, i in enumerate(part, 1)}
    jobs.append(Job("aggregate", "aggregate-0", "local", "jobs/aggregate-0.sh", 0, None, [Dependency(j.job_id, "all") for j in jobs if j.stage == "eval"], 0))
    tasks["aggregate-0"] = {"0": {"state": "pending", "rc": None, "requeues": 0}}
    write_jobs(exp.dir, jobs)
    write_state(exp.dir, {"runner_pid": None, "jobs": tasks})
    header = "step,iteration,wall_time,sps,episodes,episodic_return,episodic_length\n"
    for run in all_runs:
        rd, state = run_dir(exp.dir, run.run_id), state_of(run.index)
        if state in ("done", "failed", "running", "cancelled"):
            logged = 2048 if state == "done" else 128 * (1 + run.index % 15)
            (rd / "train.csv").write_text(header + "".join(f"{s},{s // 128},{s / 1e3:.1f},900,1,20.0,20\n" for s in range(128, logged + 1, 128)))
        # The markers' text as rundir.mark writes it (without its fsync: 10,000 of them take a minute here).
        if state == "done":
            (rd / rundir.DONE).write_text("step 2048\n")
            (rd / rundir.EVAL_DONE).write_text("\n")
        elif state == "failed":
            (rd / rundir.FAILED).write_text(REASONS[run.index % len(REASONS)] + "\nTraceback (most recent call last):\n  ...\n")
            (rd / rundir.EVAL_SKIPPED).write_text("training did not finish (FAILED)\n")
    return exp.dir


@contextlib.contextmanager
def live_runner(exp_dir: Path) -> Iterator[None]:
    """Hold the local runner's lock: status then sees a live runner and reports its tasks as recorded."""
    from hpcrl.schedulers.local import lock_path

    with lock_path(exp_dir).open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


REFERENCE_COMMIT = "4ee4988"
"""The commit before issue 17's status work (57be1f1): its status printed one line per run."""


def old_status(tmp: Path) -> Path:
    """The `hpcrl` package as it was at REFERENCE_COMMIT, importable from the returned directory: its
    status.py imports modules of that layout (`from hpcrl import rundir`), which the stage-folder move
    renamed, so the whole package is extracted, as collect_scale.py does."""
    target = tmp / "reference"
    target.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", REFERENCE_COMMIT, "hpcrl"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


REFERENCE_DRIVER = """
import io, pathlib, sys, time
from hpcrl.schedulers.base import Scheduler
calls = []
run = Scheduler.run
def counted(self, argv, *args, **kwargs):
    calls.append(argv[0])
    return run(self, argv, *args, **kwargs)
Scheduler.run = counted
from hpcrl.status import print_status
out = io.StringIO()
began = time.perf_counter()
print_status(pathlib.Path(sys.argv[1]), out=out)
took = time.perf_counter() - began
if sys.argv[2:] == ["--print"]:
    sys.stdout.write(out.getvalue())
else:
    print(len(calls), took, out.getvalue().count(chr(10)), ", ".join(f"{n} x{calls.count(n)}" for n in dict.fromkeys(calls)) or "none")
"""
"""Runs the reference's `print_status` in its own process (REFERENCE_COMMIT's package on PYTHONPATH, a
working directory without the current one), counting its scheduler commands; `--print`: its output."""

REFERENCE_PRUNE = """
import pathlib, re, sys, yaml
from hpcrl.config import experiment_from_dict
from hpcrl.schema import ConfigError
Loader, Dumper = getattr(yaml, "CSafeLoader", yaml.SafeLoader), getattr(yaml, "CSafeDumper", yaml.SafeDumper)
configs = sorted(pathlib.Path(sys.argv[1]).glob("runs/*/config.yaml"))
data = yaml.load(configs[0].read_text(), Loader=Loader)["config"]
gone = []
while True:
    try:
        experiment_from_dict(data)
        break
    except ConfigError as exc:
        found = re.search(r"([A-Za-z_][\\w.]*): unknown key", str(exc))
        if found is None or len(gone) > 200:
            raise
        *parents, key = found.group(1).split(".")
        section = data
        for name in parents:
            section = section[name]
        del section[key]
        gone.append((parents, key))
for path in configs:
    data = yaml.load(path.read_text(), Loader=Loader)
    for parents, key in gone:
        section = data["config"]
        for name in parents:
            section = section.get(name, {})
        section.pop(key, None)
    path.write_text(yaml.dump(data, Dumper=Dumper, sort_keys=False))
print(len(gone), "keys the reference does not know left out of", len(configs), "run configs")
"""
"""Leaves out of every run's config.yaml the keys REFERENCE_COMMIT's schema does not know (settings added
since, written at their defaults), so that its status reads the synthetic experiment as the current one does."""


def timed(argv: list[str], repeat: int, env: dict[str, str] | None = None, cwd: Path = REPO) -> tuple[float, int, int]:
    """Best wall time of `repeat` runs of a whole process, the lines and bytes it printed."""
    best, lines, size = float("inf"), 0, 0
    for _ in range(repeat):
        began = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, env=env, cwd=cwd)
        took = time.perf_counter() - began
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode()[-2000:]}")
        best, lines, size = min(best, took), proc.stdout.count(b"\n"), len(proc.stdout)
    return best, lines, size


def bench_views(runs_list: list[int], settings: int, repeat: int) -> None:
    py = sys.executable
    print(f"hpcrl status over a synthetic experiment ({settings} settings; best of {repeat}; whole process, output to a pipe)")
    print(f"{'runs':>6}  {'what':44} {'wall s':>7} {'lines':>7} {'bytes':>9}")
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp_:
        tmp = Path(tmp_)
        before = old_status(tmp)
        envs = {"reference": dict(os.environ, PYTHONPATH=str(before)), "current": dict(os.environ, PYTHONPATH=str(REPO))}
        for runs in runs_list:
            root = tmp / f"r{runs}"
            began = time.perf_counter()
            exp = make_experiment(root, runs, settings)
            subprocess.run([py, "-c", REFERENCE_PRUNE, str(exp)], env=envs["reference"], cwd=tmp, check=True, stdout=subprocess.DEVNULL)
            made = time.perf_counter() - began
            rows = [
                ("reference: wc -l runs.csv", ["wc", "-l", str(exp / "runs.csv")]),
                ("reference: status before issue 17 (per run)", [py, "-c", REFERENCE_DRIVER, str(exp), "--print"]),
                ("hpcrl status (default view)", [py, "-m", "hpcrl", "status", str(exp)]),
                ("hpcrl status --runs", [py, "-m", "hpcrl", "status", str(exp), "--runs"]),
                ("hpcrl status --runs --state failed", [py, "-m", "hpcrl", "status", str(exp), "--runs", "--state", "failed"]),
                ("hpcrl status --json", [py, "-m", "hpcrl", "status", str(exp), "--json"]),
            ]
            with live_runner(exp):
                for what, argv in rows:
                    side = "reference" if what.startswith("reference: status") else "current"
                    took, lines, size = timed(argv, repeat, envs[side], tmp if side == "reference" else REPO)
                    print(f"{runs:>6}  {what:44} {took:>7.2f} {lines:>7} {size:>9}", flush=True)
            print(f"{'':6}  (experiment written in {made:.1f} s)")


# ------------------------------------------------------------------------------------ real clusters


def bench_cluster(name: str, runs: int, settings: int) -> None:
    from submit_scale import CallCounter  # benchmarks/ is this script's directory, first on sys.path

    from hpcrl.config.load import load_experiment
    from hpcrl.schedulers import get_scheduler
    from hpcrl.status import cancel_experiment, experiment_status, print_status
    from hpcrl.store.expdir import load_runs, read_jobs
    from hpcrl.submit.pipeline import submit_experiment

    tool = {"slurm": "sbatch", "sge": "qsub"}[name]
    if shutil.which(tool) is None:
        print(f"\n{name}: {tool} not on PATH; start it with tests/clusters/{name}.sh start")
        return
    hold = {"slurm": "--hold", "sge": "-h"}[name]
    seeds = max(1, runs // settings)
    lrs = [round(1e-3 * (1 + k / settings), 8) for k in range(settings)]
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        before = old_status(Path(tmp))
        exp = load_experiment(CONFIG, [f"output={tmp}", f"sweep.seeds={list(range(seeds))}", f"sweep.grid.train.lr={lrs}", f'resources.extra=["{hold}"]'])
        began = time.perf_counter()
        with CallCounter() as c_sweep:
            assert submit_experiment(exp, name, out=io.StringIO()) == 0
        t_sweep = time.perf_counter() - began
        env = dict(os.environ, PYTHONPATH=str(before))
        subprocess.run([sys.executable, "-c", REFERENCE_PRUNE, str(exp.dir)], env=env, cwd=tmp, check=True, stdout=subprocess.DEVNULL)
        jobs = read_jobs(exp.dir)
        try:
            n_runs = len(load_runs(exp.dir))
            print(f"\n{name}: {n_runs} runs on hold, {len(jobs)} array jobs ({sum(j.stage == 'train' for j in jobs)} train chunks)")
            print(f"  {'':44} {'calls':>6} {'wall s':>7}")
            print(f"  {'hpcrl sweep':44} {len(c_sweep.calls):>6} {t_sweep:>7.2f}   {c_sweep.summary()}")
            answer = subprocess.run([sys.executable, "-c", REFERENCE_DRIVER, str(exp.dir)], capture_output=True, text=True, env=env, cwd=tmp, check=True).stdout.split(maxsplit=3)
            print(f"  {'reference: status before issue 17':44} {answer[0]:>6} {float(answer[1]):>7.2f}   {answer[3].strip()}; {answer[2]} lines")
            out = io.StringIO()
            began = time.perf_counter()
            with CallCounter() as c:
                print_status(exp.dir, out=out)
            took = time.perf_counter() - began
            print(f"  {'hpcrl status (default view)':44} {len(c.calls):>6} {took:>7.2f}   {c.summary()}; {out.getvalue().count(chr(10))} lines")
            label = load_runs(exp.dir)[0].setting_label
            began = time.perf_counter()
            with CallCounter() as c:
                rc = cancel_experiment(exp.dir, out=io.StringIO(), settings=[label])
            took = time.perf_counter() - began
            rows, _, _ = experiment_status(exp.dir)
            cancelled = sum(r.train == "cancelled" for r in rows)
            print(f"  {'hpcrl cancel --setting ' + label:44} {len(c.calls):>6} {took:>7.2f}   {c.summary()}; exit {rc}, {cancelled} runs cancelled")
            began = time.perf_counter()
            with CallCounter() as c:
                rc = cancel_experiment(exp.dir, out=io.StringIO())
            took = time.perf_counter() - began
            print(f"  {'hpcrl cancel (everything)':44} {len(c.calls):>6} {took:>7.2f}   {c.summary()}; exit {rc}")
        finally:
            get_scheduler(name, exp.dir).cancel([j.job_id for j in jobs])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=_args.runs, nargs="+", default=[1000, 10000])
    parser.add_argument("--settings", type=_args.positive_integer, default=100)
    parser.add_argument("--repeat", type=_args.positive_integer, default=3)
    parser.add_argument("--schedulers", nargs="*", default=["slurm", "sge"], choices=["slurm", "sge"])
    parser.add_argument("--show", action="store_true", help="print `hpcrl status` of the synthetic experiment of --runs[0] runs (the capture in docs/how-to/status-at-scale.md) and stop")
    args = parser.parse_args()
    if args.show:
        with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
            exp = make_experiment(Path(tmp) / "logs", args.runs[0], args.settings)
            with live_runner(exp):
                subprocess.run([sys.executable, "-m", "hpcrl", "status", "logs/scale"], cwd=Path(tmp), check=True)
        return
    bench_views(args.runs, args.settings, args.repeat)
    for name in args.schedulers:
        bench_cluster(name, max(args.runs), args.settings)


if __name__ == "__main__":
    main()
