"""`hpcrl collect`: gather every run, report what is missing or broken, aggregate across seeds.

This is also what the aggregate stage runs. It never crashes on one bad run: a missing run, a
failed one, a corrupt eval.csv are each reported by name, and the rest are aggregated. Seeds that
are missing are never silently dropped from a setting's count: the summary has both the number of
seeds expected and the number that contributed. It reads runs.csv and each run's CSVs line by
line (never the run configs), so 1000 runs aggregate in seconds.
"""

from __future__ import annotations

import csv
import io
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from hpcrl import plots, rundir, stats, sweep
from hpcrl.io import atomic_write_text

MAX_PLOTTED = 12


@dataclass
class RunResult:
    index: int
    run_id: str
    seed: int
    setting: str
    eval_return: float = math.nan
    problem: str = ""
    """Why the run has no final score (it is then left out of the summary)."""
    curve_problem: str = ""
    """Why a run with a score has no training curve (the curves then use fewer seeds)."""
    steps: np.ndarray = field(default_factory=lambda: np.empty(0))
    returns: np.ndarray = field(default_factory=lambda: np.empty(0))
    videos: list[Path] = field(default_factory=list)


def _train_problem(rd: Path) -> str:
    state = rundir.run_state(rd)
    if state == "new":
        return "missing: never trained" if rd.is_dir() else "missing: no run directory"
    if state == "failed":
        return "train failed: " + rundir.first_line(rd, rundir.FAILED)[:100]
    if state == "started":
        return "train unfinished"
    return ""


def _eval_problem(rd: Path) -> str:
    evaluation = rundir.eval_state(rd)
    if evaluation == "skipped":
        return "eval skipped: " + rundir.reason(rd, rundir.EVAL_SKIPPED)
    if evaluation == "failed":
        return "eval failed: " + rundir.reason(rd, rundir.EVAL_FAILED)[:100]
    if not rundir.has_eval(rd):
        return "not evaluated"
    return ""


def gather(experiment_dir: Path) -> list[RunResult]:
    """Each run's curve and final eval return, or the reason it has none."""
    results = []
    for row in sweep.current_rows(experiment_dir):  # never pooled with runs of an earlier config
        r = RunResult(int(row["index"]), row["run_id"], int(row["seed"]), sweep.row_label(row))
        rd = sweep.run_dir(experiment_dir, r.run_id)
        if rundir.has_train_log(rd):
            try:
                r.steps, r.returns = rundir.read_curve(rd)
            except (ValueError, UnicodeDecodeError) as exc:
                r.problem = f"corrupt train.csv ({type(exc).__name__}: {exc})"
        elif rundir.is_done(rd):
            r.curve_problem = "no training curve: train.csv is missing"
        r.problem = r.problem or _train_problem(rd) or _eval_problem(rd)
        if not r.problem:
            try:
                r.eval_return = rundir.read_eval(rd)
            except (ValueError, KeyError, TypeError, csv.Error) as exc:
                r.problem = f"corrupt eval.csv ({type(exc).__name__}: {exc})"
        r.videos = sorted((rd / "videos").glob("*.mp4"))
        results.append(r)
    return results


def evaluate_missing(experiment_dir: Path, out=None, workers: int | None = None) -> None:
    """Evaluate, in parallel local processes, every trained run that has no evaluation yet."""
    todo = []
    for row in sweep.current_rows(experiment_dir):
        rd = sweep.run_dir(experiment_dir, row["run_id"])
        if rundir.run_state(rd) == "done" and rundir.eval_state(rd) == "new":
            todo.append(int(row["index"]))
    if not todo:
        return
    workers = workers or max(1, min(len(todo), os.cpu_count() or 1))
    print(f"evaluating {len(todo)} runs with {workers} processes", file=out)
    root = str(experiment_dir.resolve())

    def one(index: int) -> int:
        argv = [sys.executable, "-m", "hpcrl", "eval", root, "--task", str(index)]
        return subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode

    with ThreadPoolExecutor(workers) as pool:  # threads only wait: each evaluation is its own process
        for done, _ in enumerate(pool.map(one, todo), start=1):
            print(f"\r  {done}/{len(todo)} evaluated", end="", file=out, flush=True)
    print(file=out)


def _write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def _fmt(x: object) -> str:
    if isinstance(x, float):
        return "" if math.isnan(x) else f"{x:.6g}"
    return str(x)


def _read_meta(experiment_dir: Path) -> dict:
    try:
        meta = yaml.safe_load((experiment_dir / "experiment.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        meta = {}
    return meta if isinstance(meta, dict) else {}


def score_name(config: dict) -> str:
    """What a run's final score is: an evaluation, or (a user's program without `program.eval`) the
    mean of its last training episodes, which the table and report must not call an evaluation."""
    program = config.get("program") if config.get("algo") == "program" else None
    if isinstance(program, dict) and not program.get("eval"):
        n = (program.get("metrics") or {}).get("last_episodes", "N")
        return f"Final score (mean of the last {n} training episodes)"
    return "Final evaluation return"


def collect(experiment_dir: Path, out=None, agg: str = "iqm", evaluate: bool = False) -> int:
    experiment_dir = Path(experiment_dir)
    if not (experiment_dir / "runs.csv").exists():
        print(f"hpcrl: error: {experiment_dir}: not an experiment directory (no runs.csv)", file=sys.stderr)
        return 2
    meta = _read_meta(experiment_dir)
    score = score_name(meta.get("config") or {})
    if evaluate:
        evaluate_missing(experiment_dir, out)
    results = gather(experiment_dir)
    by_setting: dict[str, list[RunResult]] = {}
    for r in results:
        by_setting.setdefault(r.setting, []).append(r)

    scores = {label: np.array([r.eval_return for r in rs if not math.isnan(r.eval_return)]).reshape(-1, 1) for label, rs in by_setting.items()}
    summary = stats.summarize(scores)
    results_dir = experiment_dir / "results"
    (results_dir / "plots").mkdir(parents=True, exist_ok=True)
    keys = [k for k in summary[0] if k != "setting"] if summary else []
    rows = []
    for item in summary:
        label = item["setting"]
        missing = [r.run_id for r in by_setting[label] if math.isnan(r.eval_return)]
        rows.append([label, len(by_setting[label]), *[_fmt(item[k]) for k in keys], " ".join(missing)])
    _write_csv(results_dir / "summary.csv", ["setting", "n_expected", *keys, "missing_runs"], rows)

    curves = {}
    curve_rows = []
    partial_curves = []
    for label, rs in by_setting.items():
        usable = [r for r in rs if len(r.steps) >= 2]
        if len(usable) < len(rs):
            partial_curves.append(f"{label}: training curve from {len(usable)} of {len(rs)} seeds")
        if usable:
            grid, center, low, high, n = stats.aggregate_curves([r.steps for r in usable], [r.returns for r in usable], None, agg)
            curves[label] = (grid, center, low, high, n)
            curve_rows += [[label, f"{g:.0f}", _fmt(c), _fmt(lo), _fmt(hi), n] for g, c, lo, hi in zip(grid, center, low, high)]
    _write_csv(results_dir / "curves.csv", ["setting", "step", agg, "ci_low", "ci_high", "n_seeds"], curve_rows)

    # Past a dozen lines a figure is unreadable: plot the best settings and say so in the title.
    ranked = [s["setting"] for s in sorted((s for s in summary if s["n"]), key=lambda s: -s[agg])]
    best = set(ranked[:MAX_PLOTTED]) if len(summary) > MAX_PLOTTED else {s["setting"] for s in summary}
    note = f" (best {MAX_PLOTTED} of {len(summary)} settings by final {agg})" if len(summary) > MAX_PLOTTED else ""
    made: dict[str, Path] = {}
    if curves:
        shown = {k: v for k, v in curves.items() if k in best}
        made["Training curves"] = plots.plot_curves(shown, results_dir / "plots" / "curves.png", agg, title=f"{agg.upper()} ± 95% bootstrap CI{note}")
    scored = {k: v for k, v in scores.items() if len(v)}
    if scored:
        rows_shown = [s for s in summary if s["n"] and s["setting"] in best]
        xlabel = "final eval return" if score == "Final evaluation return" else "final score (last training episodes)"
        made[score] = plots.plot_final_intervals(rows_shown, results_dir / "plots" / "final.png", metric=agg, xlabel=xlabel)
        made["Performance profile"] = plots.plot_performance_profile({k: v for k, v in scored.items() if k in best}, results_dir / "plots" / "profile.png")

    improvement = []
    for x in ranked[:MAX_PLOTTED]:
        for y in ranked[:MAX_PLOTTED]:
            if x != y:
                low, high = stats.probability_of_improvement_ci(scores[x], scores[y])
                improvement.append([x, y, _fmt(float(stats.probability_of_improvement(scores[x], scores[y]))), _fmt(low), _fmt(high)])
    _write_csv(results_dir / "improvement.csv", ["setting_x", "setting_y", "p_x_better", "ci_low", "ci_high"], improvement)

    table = summary_table(summary, by_setting)
    write_report(experiment_dir, meta, score, table, made, results, partial_curves)
    print(f"{score}:", file=out)
    print(table, file=out)
    for line in partial_curves:
        print(line, file=out)
    for r in results:
        for problem in filter(None, (r.problem, r.curve_problem)):
            print(f"run {r.run_id} ({r.setting}, seed {r.seed}): {problem}", file=out)
    note = sweep.left_out_note(experiment_dir)
    if note:
        print(note, file=out)
    print(f"wrote {results_dir}/summary.csv, curves.csv, improvement.csv, report.md and {len(made)} plots in {results_dir}/plots", file=out)
    return 0 if scored else 1


def summary_table(summary: list[dict], by_setting: dict[str, list[RunResult]]) -> str:
    header = ["setting", "seeds", "mean", "95% CI", "IQM", "95% CI (IQM)", "std"]
    table = [header]

    def value(key: str) -> str:
        return _fmt(item[key]) or "-"

    def interval(stat: str) -> str:
        low, high = value(f"{stat}_ci_low"), value(f"{stat}_ci_high")
        return "-" if low == high == "-" else f"[{low}, {high}]"

    for item in summary:
        table.append([
            item["setting"],
            f"{item['n']}/{len(by_setting[item['setting']])}",
            value("mean"),
            interval("mean"),
            value("iqm"),
            interval("iqm"),
            value("std"),
        ])
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in table)


def write_report(
    experiment_dir: Path, meta: dict, score: str, table: str, plots_made: dict[str, Path], results: list[RunResult], partial_curves: list[str]
) -> Path:
    """results/report.md: the directory explains itself hours later (provenance, tables, plots, videos)."""
    results_dir = experiment_dir / "results"
    prov, config = meta.get("provenance", {}), meta.get("config", {})
    lines = [f"# {experiment_dir.name}", ""]
    if config.get("algo") == "program":
        program = config.get("program") or {}
        lines += [f"- program: `{' '.join(map(str, program.get('command', [])))}`, metrics from {(program.get('metrics') or {}).get('source', '?')}"]
    else:
        lines += [f"- algorithm: {config.get('algo', '?')}, env: {config.get('env', {}).get('id', '?')}, "
                  f"steps per run: {config.get('train', {}).get('total_steps', '?')}"]
    for key in ("hpcrl_version", "git_commit", "config_file", "submitted_at", "host", "scheduler", "image", "image_sha256"):
        if prov.get(key):
            lines.append(f"- {key.replace('_', ' ')}: `{prov[key]}`")
    lines.append(f"- collected: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}")
    lines += ["", f"## {score}", "", "```", table, "```", ""]
    lines += ["Pairwise probability of improvement P(X > Y) with 95% bootstrap CIs: [improvement.csv](improvement.csv).", ""]
    for title, path in plots_made.items():
        lines += [f"## {title}", "", f"![{title}]({path.relative_to(results_dir)})", ""]
        if title == "Training curves" and partial_curves:
            lines += [f"- {line}" for line in partial_curves] + [""]
    problems = [(r, p) for r in results for p in (r.problem, r.curve_problem) if p]
    if problems:
        lines += ["## Runs without a result", ""] + [f"- `{r.run_id}` ({r.setting}, seed {r.seed}): {p}" for r, p in problems] + [""]
    videos = [(r, v) for r in results for v in r.videos]
    if videos:
        lines += ["## Videos", ""] + [f"- `{r.run_id}` ({r.setting}, seed {r.seed}): [{v.name}]({os.path.relpath(v, results_dir)})" for r, v in videos] + [""]
    path = results_dir / "report.md"
    atomic_write_text(path, "\n".join(lines))
    return path
