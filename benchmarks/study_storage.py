"""What an Optuna study's storage costs per trial: 2 `hpcrl search-worker` processes sharing the
journal file, the ask lock and the run index, with no training at all, against Optuna's in-memory
storage in the same run. Target: at most 50 ms of overhead per trial. A benchmark prints; it does
not assert.

    python benchmarks/study_storage.py                        # 100 trials, 10 reports each, 2 workers
    python benchmarks/study_storage.py --trials 300 --reports 20
    python benchmarks/study_storage.py --dir /nfs/scratch     # the experiment on a shared file system

The experiment is made as a user makes it (a config YAML, `load_experiment`, the study opened and
experiment.yaml / runs.csv written as `hpcrl sweep` does), then each worker process is a real
`study_worker.Worker` that loops over what `Worker.run` / `run_trial` do around the training:

- claim: `Worker.claim()` (the ask lock, the study's trials read, `study.ask()`, the record written);
- suggest: `study_worker.suggest` of each searched key (TPE draws here);
- trial_run: `study_worker.trial_run` (the trial's resolved config and run id);
- user_attr: `trial.set_user_attr("run_id", ...)`;
- add_run: `expdir.add_run` (runs.csv rewritten under its flock, the run's config.yaml written);
- reports: `trial.report` + `trial.should_prune()` at every 100/K percent of the budget, as
  `study_worker.Reporter` does, stopping at the first prune;
- tell: `study.tell` (PRUNED, or COMPLETE with a synthetic value of the params) and the record removed.

Training, evaluation and the run-state checks that read their files are left out: the figure is
what the study and the run index add to every trial. The reference runs the same ask / suggest /
report / should_prune / tell loop, with the same sampler, pruner and synthetic objective, on
`optuna.create_study()` (in memory, one process, no lock, no runs.csv), so the difference is the
journal file, the locks and the run index. Both loops time each trial from before its ask to after
its tell; the journal grows as the study does, so the first and last 10 trials are shown apart.
"""

from __future__ import annotations

import argparse
import io
import math
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _args  # benchmarks/_args.py: the script's own folder is first on sys.path
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hpcrl.config.load import load_experiment  # noqa: E402
from hpcrl.store import expdir
from hpcrl.store.expdir import load_experiment_config  # noqa: E402
from hpcrl.sweep import study  # noqa: E402
from hpcrl.sweep.study_worker import Worker, suggest, trial_run  # noqa: E402

TARGET_MS = 50.0
PHASES = ("claim", "suggest", "trial_run", "user_attr", "add_run", "reports", "tell")
REFERENCE_PHASES = ("claim", "suggest", "reports", "tell")
"""The reference's claim is a bare `study.ask()`."""
Row = tuple[int, bool, list[float]]
"""A trial: its number, whether it was pruned, and the ms of each of its steps."""


def config(trials: int) -> dict[str, Any]:
    return {
        "name": "study_storage",
        "algo": "ppo",
        "env": {"id": "CartPole-v1"},
        "sweep": {
            "seeds": [0],
            "search": {
                "method": "optuna", "n_trials": trials, "sampler": "tpe", "pruner": "median", "metric": "train",
                "space": {
                    "train.lr": {"type": "loguniform", "low": 1.0e-4, "high": 1.0e-2},
                    "train.ent_coef": {"type": "uniform", "low": 0.0, "high": 0.01},
                },
            },
        },
    }


def objective(params: dict[str, Any], percent: int) -> float:
    """A synthetic return: best near lr = 3e-3 and no entropy bonus, growing over the budget."""
    peak = 500.0 * math.exp(-((math.log10(params["train.lr"]) + 2.5) ** 2)) * (1.0 - 20.0 * params["train.ent_coef"])
    return peak * percent / 100.0


def report_all(trial: Any, params: dict[str, Any], reports: int) -> int | None:
    """The K reports of a trial; the percent it was pruned at, or None when it ran to the end."""
    for k in range(1, reports + 1):
        at = k * 100 // reports
        trial.report(objective(params, at), at)
        if trial.should_prune():
            return at
    return None


def hpcrl_worker(exp_dir: str, task: int, reports: int, start: Any, results: Any) -> None:
    """One worker process: the real Worker, its claim and run_trial's helpers, no training."""
    worker = Worker(Path(exp_dir), task, io.StringIO())
    State = worker.optuna.trial.TrialState
    search = worker.exp.sweep.search
    assert search is not None
    rows = []
    start.wait()
    began = time.time()
    while True:
        t = [time.perf_counter()]
        trial = worker.claim()
        t.append(time.perf_counter())
        if trial is None:
            break
        params = {key: suggest(trial, key, search.space[key]) for key in sorted(search.space)}
        t.append(time.perf_counter())
        run = trial_run(worker.exp, worker.name, trial.number, params)
        t.append(time.perf_counter())
        trial.set_user_attr("run_id", run.run_id)
        t.append(time.perf_counter())
        expdir.add_run(worker.root, run, worker.generation)
        t.append(time.perf_counter())
        pruned = report_all(trial, params, reports)
        t.append(time.perf_counter())
        if pruned is not None:
            worker.study.tell(trial, state=State.PRUNED)
        else:
            worker.study.tell(trial, objective(params, 100))
        worker.record.unlink(missing_ok=True)
        t.append(time.perf_counter())
        rows.append((trial.number, pruned is not None, [1000 * (b - a) for a, b in zip(t, t[1:])]))
    results.put((task, began, time.time(), rows))


def run_hpcrl(root: Path, trials: int, reports: int, workers: int) -> tuple[Path, list[Row], float, dict[int, int]]:
    """The study made as `hpcrl sweep` makes it, then `workers` processes at once; their rows, the
    wall time from the common start to the last tell, and the trials each worker ran."""
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config(trials), sort_keys=False))
    exp = load_experiment(path, [f"output={root}"])
    study.open_study(exp, exp.dir)  # the study exists before its workers start, as after `hpcrl sweep`
    expdir.write_experiment(exp, [], {"scheduler": "local"})
    ctx = mp.get_context("spawn")
    start, results = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=hpcrl_worker, args=(str(exp.dir), task, reports, start, results)) for task in range(workers)]
    for p in procs:
        p.start()
    got = [results.get() for _ in procs]
    for p in procs:
        p.join()
    rows = sorted((r for _, _, _, rs in got for r in rs), key=lambda r: r[0])
    wall = max(end for _, _, end, _ in got) - min(began for _, began, _, _ in got)
    return exp.dir, rows, wall, {task: len(rs) for task, _, _, rs in got}


def run_reference(root: Path, trials: int, reports: int) -> tuple[list[Row], float]:
    """The same loop on Optuna's in-memory storage, in this process, with the same sampler and pruner."""
    exp = load_experiment(root / "config.yaml", [f"output={root / 'reference'}"])
    optuna = study.require_optuna()
    search = exp.sweep.search
    assert search is not None
    memory = optuna.create_study(sampler=study._sampler(optuna, exp, 0), pruner=study._pruner(optuna, exp), direction=search.direction)
    rows = []
    began = time.perf_counter()
    for _ in range(trials):
        t = [time.perf_counter()]
        trial = memory.ask()
        t.append(time.perf_counter())
        params = {key: suggest(trial, key, search.space[key]) for key in sorted(search.space)}
        t.append(time.perf_counter())
        pruned = report_all(trial, params, reports)
        t.append(time.perf_counter())
        if pruned is not None:
            memory.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            memory.tell(trial, objective(params, 100))
        t.append(time.perf_counter())
        rows.append((trial.number, pruned is not None, [1000 * (b - a) for a, b in zip(t, t[1:])]))
    return rows, time.perf_counter() - began


def check(exp_dir: Path, rows: list[Row], trials: int) -> list[str]:
    """What is wrong with the study and the run index after the workers: nothing when all is well."""
    exp, _ = load_experiment_config(exp_dir)
    optuna = study.require_optuna()
    finished = study.open_study(exp, exp_dir).get_trials(deepcopy=False)
    problems = []
    numbers = sorted(t.number for t in finished)
    if numbers != list(range(trials)):
        problems.append(f"study trial numbers are not 0..{trials - 1} once each: {len(numbers)} trials, {len(set(numbers))} distinct")
    timed = sorted(r[0] for r in rows)
    if timed != list(range(trials)):
        problems.append(f"the workers ran {len(timed)} trials, {len(set(timed))} distinct, not 0..{trials - 1} once each")
    done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    if bad := [f"{t.number}:{t.state.name}" for t in finished if t.state not in done]:
        problems.append(f"trials neither COMPLETE nor PRUNED: {', '.join(bad)}")
    listed = [row["run_id"] for row in expdir.read_runs_csv(exp_dir)]
    told = {t.user_attrs.get("run_id") for t in finished}
    if len(listed) != trials or set(listed) != told:
        problems.append(f"runs.csv has {len(listed)} rows ({len(set(listed))} distinct, {len(set(listed) & told)} of the trials' runs), not {trials}")
    if held := study.held_trials(exp_dir):
        problems.append(f"worker records left behind: {held}")
    return problems


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def pooled(runs: list[list[Row]], which: slice, phase: int | None = None) -> list[float]:
    """Each repeat's trials in `which` (by trial number), the whole trial's ms or one step's."""
    return [sum(r[2]) if phase is None else r[2][phase] for rows in runs for r in rows[which]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=_args.positive_integer, default=100, help="n_trials of the study")
    parser.add_argument("--reports", type=_args.positive_integer, default=10, help="trial.report + should_prune per trial (eval every 100/K %% of the budget)")
    parser.add_argument("--workers", type=_args.positive_integer, default=2, help="worker processes sharing the study")
    parser.add_argument("--repeats", type=_args.positive_integer, default=3, help="fresh studies, their trials pooled (the tail is noisy)")
    parser.add_argument("--dir", type=Path, default=None, help="where the experiment goes (default: the system's temp dir)")
    args = parser.parse_args()
    runs: list[list[Row]] = []
    refs: list[list[Row]] = []
    wall = ref_wall = 0.0
    per_worker: list[str] = []
    problems: list[str] = []
    journal_kb = 0.0
    for repeat in range(args.repeats):  # interleaved, so a busy machine slows both alike
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            root = Path(tmp)
            exp_dir, rows, seconds, tasks = run_hpcrl(root, args.trials, args.reports, args.workers)
            ref_rows, ref_seconds = run_reference(root, args.trials, args.reports)
            problems += [f"repeat {repeat}: {p}" for p in check(exp_dir, rows, args.trials)]
            journal_kb = (exp_dir / study.STUDY_DIR / study.JOURNAL).stat().st_size / 1024
        runs.append(rows)
        refs.append(ref_rows)
        wall, ref_wall = wall + seconds, ref_wall + ref_seconds
        per_worker.append("/".join(str(tasks[t]) for t in sorted(tasks)))

    hpcrl_label = f"journal + hpcrl, {args.workers} workers"
    first, last = slice(0, 10), slice(-10, None)
    where = args.dir or Path(tempfile.gettempdir())
    print(
        f"Optuna study, TPE + median pruner, {args.trials} trials x {args.repeats} fresh studies, {args.reports} reports "
        f"per trial (fewer when pruned), no training; experiment in {where}"
    )
    print(f"{'per-trial overhead (ms)':38}{'median':>9}{'p90':>9}{'max':>9}{'first 10':>10}{'last 10':>9}{'trials/s':>10}")
    for label, rs, seconds in ((hpcrl_label, runs, wall), ("in-memory optuna, 1 process (ref.)", refs, ref_wall)):
        totals = pooled(rs, slice(None))
        print(
            f"{label:38}{statistics.median(totals):>9.1f}{quantile(totals, 0.9):>9.1f}{max(totals):>9.1f}"
            f"{statistics.median(pooled(rs, first)):>10.1f}{statistics.median(pooled(rs, last)):>9.1f}{len(totals) / seconds:>10.1f}"
        )
    print(f"target: <= {TARGET_MS:.0f} ms per trial")
    print()
    print(f"{hpcrl_label}, by step (ms; the in-memory reference's median beside it)")
    print(f"{'':22}{'median':>9}{'p90':>9}{'max':>9}{'first 10':>10}{'last 10':>9}{'ref.':>8}")
    for i, name in enumerate(PHASES):
        values = pooled(runs, slice(None), i)
        ref = f"{statistics.median(pooled(refs, slice(None), REFERENCE_PHASES.index(name))):>8.1f}" if name in REFERENCE_PHASES else f"{'-':>8}"
        print(
            f"  {name:20}{statistics.median(values):>9.1f}{quantile(values, 0.9):>9.1f}{max(values):>9.1f}"
            f"{statistics.median(pooled(runs, first, i)):>10.1f}{statistics.median(pooled(runs, last, i)):>9.1f}{ref}"
        )
    for label, rs in ((hpcrl_label, runs), ("in-memory optuna (ref.)", refs)):
        complete = [sum(r[2]) for rows in rs for r in rows if not r[1]]
        n = sum(map(len, rs))
        median = f"{statistics.median(complete):.1f} ms median" if complete else "none"
        print(f"{label}: {n - len(complete)} of {n} pruned; those that made all {args.reports} reports: {median}")
    print(f"trials per worker in each study: {', '.join(per_worker)}; journal of a study: {journal_kb:.0f} KiB")
    print(f"no trial lost or duplicated: {'no' if problems else 'yes'}")
    for problem in problems:
        print(f"  {problem}")


if __name__ == "__main__":
    main()
