"""`hpcrl collect`: gather every run, report what is missing or broken, aggregate across seeds.

This is also what the aggregate stage runs. It never crashes on one bad run: a missing run, a
failed one, a corrupt or unreadable eval.csv are each reported by name, and the rest are aggregated; a
training log that is missing or damaged costs its run the curve, named, not its final score. Seeds that
are missing are never silently dropped from a setting's count: the summary has both the number of
seeds expected and the number that contributed. It reads runs.csv, lists each run directory once
and reads each run's CSVs (never the run configs), the training logs of many runs parsed together,
so that 10,000 runs x 1,000 settings aggregate in about 5 s on 2 cores (benchmarks/collect_scale.py).
"""

from __future__ import annotations

import csv
import math
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hpcrl import halves
from hpcrl.config import tasks
from hpcrl.config.schema import ConfigError
from hpcrl.cores import usable_cores
from hpcrl.results.strength import write_strength
from hpcrl.results.tables import RunResult, Scoring, stale_removed, write_results
from hpcrl.runtime.lifeline import dies_with_me
from hpcrl.store import expdir, rundir
from hpcrl.store.expdir import read_meta
from hpcrl.store.states import State
from hpcrl.sweep import modes

LOGS_IN_TWO = 1000
"""Training logs from which gather parses them in two processes (hpcrl.halves): 10,000 took ~1.2 s in one.
(Only the logs: the runs' whole results took as long to send back, pickled, as to read here.)"""


def _train_problem(rd: Path, names: frozenset[str] | None = None) -> str:
    state = rundir.run_state(rd, names)
    if state == State.NEW:
        return "missing: never trained" if rd.is_dir() else rundir.NO_DIRECTORY
    if state == State.FAILED:
        return rundir.failure(rd, "train")[:120]
    if state == State.STARTED:
        return "train unfinished"
    return ""


def _eval_problem(rd: Path, names: frozenset[str] | None = None) -> str:
    evaluation = rundir.eval_state(rd, names)
    if evaluation == State.SKIPPED:
        return "eval skipped: " + rundir.first_line(rd, rundir.EVAL_SKIPPED)[:120]
    if evaluation == State.FAILED:
        return rundir.failure(rd, "eval")[:120]
    if not rundir.has_eval(rd, names):
        return "not evaluated"
    return ""


def _headless(rd: Path) -> list[str]:
    """A finished run's train.csv without one complete line (its header cut: a disk that filled as the run began, a
    file a crash left zeroed), named: it read as a curve with no rows, and the curves counted the seed out without
    saying which. (A log with its header and no return, an AlphaZero run's, is whole.)"""
    try:
        return [] if rundir.train_columns(rd) is not None else [f"no training curve: {rundir.TRAIN_LOG} has no complete line"]
    except OSError as exc:
        return [f"no training curve: {rundir.unreadable(exc)}"]


def gather(experiment_dir: Path, default_task: str | None) -> list[RunResult]:
    """Each run's curves and final eval return, or the reason it has none; its task is its swept
    `env.id`, else `default_task` (see hpcrl.config.tasks). Each run directory is listed once, and the
    training logs are read together (rundir.read_curves), from LOGS_IN_TWO of them half in a second
    process (hpcrl.halves; its answers are arrays, quick to send back): 10,000 runs gather in about a second."""
    results = []
    rows = expdir.current_rows(experiment_dir)  # never pooled with runs of an earlier config
    dirs = [expdir.run_dir(experiment_dir, row["run_id"]) for row in rows]
    listings = [rundir.listing(rd) for rd in dirs]
    logged = [rundir.has_train_log(rd, names) for rd, names in zip(dirs, listings)]
    curves = iter(halves.map_in_halves(rundir.read_curves, [rd for rd, has in zip(dirs, logged) if has], LOGS_IN_TWO))  # read_curve of each
    for row, rd, names, has_log in zip(rows, dirs, listings, logged):
        task, swept = tasks.split_row(expdir.swept_values(row), default_task)
        r = RunResult(int(row["index"]), row["run_id"], int(row["seed"]), expdir.setting_label(swept), task or "?", rd)
        # A curve's file that is damaged or unreadable costs the run its curve, named, as a missing one does; the
        # final evaluation, a file of its own, still counts.
        damaged = []
        if has_log:
            curve = next(curves)
            if isinstance(curve, Exception):
                damaged.append(f"no training curve: {rundir.damage('train.csv', curve)}")
            else:
                r.steps, r.returns = curve
                if not len(r.steps) and rundir.is_done(rd):
                    damaged += _headless(rd)
            try:
                r.eval_steps, r.eval_returns = rundir.read_eval_curve(rd, names)
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                damaged.append(f"no evaluation curve: {rundir.damage('eval_curve.csv', exc)}")
        elif rundir.is_done(rd):
            damaged.append("no training curve: train.csv is missing")
        train_problem = _train_problem(rd, names)
        r.curve_problem = "" if train_problem else "; ".join(damaged)  # a run that did not train says that instead
        r.problem = train_problem or _eval_problem(rd, names)
        if not r.problem:
            try:
                r.eval_return = rundir.read_eval(rd)
            except (OSError, ValueError, KeyError, TypeError, csv.Error) as exc:
                r.problem = rundir.damage("eval.csv", exc)
            if not math.isfinite(r.eval_return):  # a NaN or inf return would poison every aggregate it enters
                r.problem = r.problem or f"corrupt eval.csv (a return of {r.eval_return})"
                r.eval_return = math.nan
        r.videos = sorted((rd / "videos").glob("*.mp4")) if "videos" in names else []
        results.append(r)
    return results


def evaluate_missing(experiment_dir: Path, out=None, workers: int | None = None) -> None:
    """Evaluate, in parallel local processes, every trained run that has no evaluation yet."""
    todo = []
    for row in expdir.current_rows(experiment_dir):
        rd = expdir.run_dir(experiment_dir, row["run_id"])
        if rundir.run_state(rd) == State.DONE and rundir.eval_state(rd) == State.NEW:
            todo.append(int(row["index"]))
    if not todo:
        return
    workers = workers or max(1, min(len(todo), usable_cores()))
    print(f"evaluating {len(todo)} runs with {workers} processes", file=out)
    root = str(experiment_dir.resolve())

    def one(index: int) -> int:
        argv = [sys.executable, "-m", "hpcrl", "eval", root, "--task", str(index)]
        # Each dies with the thread that waits for it, which lives as long as collect: a collect killed with -9
        # left them running to their end, unseen (and their env workers' games with them).
        return subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=dies_with_me()).returncode

    with ThreadPoolExecutor(workers) as pool:  # threads only wait: each evaluation is its own process
        for done, _ in enumerate(pool.map(one, todo), start=1):
            print(f"\r  {done}/{len(todo)} evaluated", end="", file=out, flush=True)
    print(file=out)


def score_name(config: dict) -> str:
    """What a run's final score is: an evaluation, or (a user's program without `program.eval`) the
    mean of its last training episodes, which the table and report must not call an evaluation."""
    program = config.get("program") if config.get("algo") == "program" else None
    if isinstance(program, dict) and not program.get("eval"):
        n = (program.get("metrics") or {}).get("last_episodes", "N")
        return f"Final score (mean of the last {n} training episodes)"
    return "Final evaluation return"


def scoring_of(config: dict, agg: str, normalize: bool | None, task_names: list[str]) -> Scoring:
    """The experiment's scoring: its score's name, and normalisation when asked (by `--normalize` or
    `results.normalize`), with the references of its tasks or one ConfigError naming those without;
    a two-player agent's (AlphaZero) is read as a game's, its steps as self-play positions."""
    if normalize is None:
        normalize = bool((config.get("results") or {}).get("normalize"))
    refs = tasks.normalizer(task_names, tasks.references(config)) if normalize else None
    game = config.get("algo") == "alphazero"
    return Scoring(score_name(config), refs, agg, game=game, steps="self-play positions" if game else "environment steps")


def facts_of(experiment_dir: Path, meta: dict) -> list[tuple[str, str]]:
    """The report's provenance lines: what ran, from which code, where and when."""
    prov, config = meta.get("provenance", {}), meta.get("config", {})
    if config.get("algo") == "program":
        program = config.get("program") or {}
        facts = [("program", " ".join(map(str, program.get("command", [])))), ("metrics", str((program.get("metrics") or {}).get("source", "?")))]
    else:
        sweep_ = config.get("sweep") or {}
        grid, rules = sweep_.get("grid") or {}, sweep_.get("when") or []
        set_steps = any("train.total_steps" in r.get("set", {}) or "total_steps" in (r.get("set", {}).get("train") or {}) for r in rules)
        facts = [
            ("algorithm", ", ".join(map(str, grid["algo"])) + " (swept)" if "algo" in grid else str(config.get("algo", "?"))),
            ("env", ", ".join(map(str, grid["env.id"])) + " (swept)" if "env.id" in grid else str((config.get("env") or {}).get("id", "?"))),
            ("steps per run", "per grid point (sweep.when)" if set_steps or "train.total_steps" in grid else str((config.get("train") or {}).get("total_steps", "?"))),
        ]
    facts += [(key.replace("_", " "), str(prov[key])) for key in ("hpcrl_version", "git_commit", "config_file", "submitted_at", "host", "scheduler", "image", "image_sha256") if prov.get(key)]
    facts.append(("collected", time.strftime("%Y-%m-%dT%H:%M:%S%z")))
    return facts


def collect(experiment_dir: Path, out=None, agg: str = "iqm", evaluate: bool = False, normalize: bool | None = None) -> int:
    """`hpcrl collect`: 0 when any run has a score, 1 when none has (each run without one named, or a line
    that there is no run), 2 for a directory or a request that cannot be served (normalisation without
    reference scores, a damaged run index), before anything is written."""
    experiment_dir = Path(experiment_dir)
    if not expdir.is_experiment(experiment_dir):
        print(f"hpcrl: error: {experiment_dir}: not an experiment directory (no runs.csv)", file=sys.stderr)
        return 2
    meta = read_meta(experiment_dir)
    config = meta.get("config") or {}
    results = gather(experiment_dir, tasks.experiment_task(config))
    task_names = list(dict.fromkeys(r.task for r in results))
    try:
        scoring = scoring_of(config, agg, normalize, task_names)
    except ConfigError as exc:
        print(f"hpcrl: error: {experiment_dir}: {exc}", file=sys.stderr)
        return 2
    if evaluate:
        evaluate_missing(experiment_dir, out)
        results = gather(experiment_dir, tasks.experiment_task(config))
    notes = [note] if (note := expdir.left_out_note(experiment_dir)) else []
    results_dir = experiment_dir / "results"
    with stale_removed(results_dir, out):
        mode_notes, extra_plots = modes.of_config(config).collect(experiment_dir, results_dir)
        notes += mode_notes
        sections = []
        if scoring.game:  # a two-player agent's strength: tables per opponent, the Elo ladder, curves
            sections, strength_notes = write_strength(results, results_dir, agg, scoring.steps)
            notes += strength_notes
        code = write_results(results_dir, experiment_dir.name, facts_of(experiment_dir, meta), results, scoring, notes, out, extra_plots, sections)
    if not results:  # the exit 1 of no score is said by the lines of the runs without one: here there are none
        print(f"{experiment_dir}: no run to collect: runs.csv lists none yet (an Optuna study lists each trial's run as it starts)", file=out)
    return code
