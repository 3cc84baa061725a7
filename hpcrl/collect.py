"""`hpcrl collect`: gather every run, report what is missing or broken, aggregate across seeds.

This is also what the aggregate stage runs. It never crashes on one bad run: a missing run, a
failed one, a corrupt eval.csv are each reported by name, and the rest are aggregated. Seeds that
are missing are never silently dropped from a setting's count: the summary has both the number of
seeds expected and the number that contributed.
"""

from __future__ import annotations

import csv
import io
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hpcrl import markers, plots, stats, sweep
from hpcrl.io import atomic_write_text


@dataclass
class RunResult:
    run: sweep.Run
    eval_return: float = math.nan
    problem: str = ""
    steps: np.ndarray = field(default_factory=lambda: np.empty(0))
    returns: np.ndarray = field(default_factory=lambda: np.empty(0))


def read_curve(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(step, episodic return) rows of a train.csv, streamed, skipping iterations with no finished episode."""
    steps, values = [], []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if row.get("episodic_return"):
                steps.append(float(row["step"]))
                values.append(float(row["episodic_return"]))
    return np.asarray(steps), np.asarray(values)


def read_eval(path: Path) -> float:
    with path.open(newline="") as f:
        returns = [float(row["return"]) for row in csv.DictReader(f)]
    if not returns:
        raise ValueError("no episodes")
    return float(np.mean(returns))


def gather(experiment_dir: Path) -> tuple[list[RunResult], list[str]]:
    """Each run's result or the reason it has none; plus problems with the experiment itself."""
    results, problems = [], []
    for row in sweep.read_runs_csv(experiment_dir):
        try:
            run = sweep.load_run(experiment_dir, int(row["index"]))
        except (OSError, KeyError, ValueError) as exc:
            problems.append(f"run {row['run_id']}: missing or unreadable config ({type(exc).__name__})")
            continue
        rd = sweep.run_dir(experiment_dir, run.run_id)
        result = RunResult(run)
        state = markers.run_state(rd)
        if (rd / "train.csv").exists():
            try:
                result.steps, result.returns = read_curve(rd / "train.csv")
            except (ValueError, KeyError, csv.Error) as exc:
                result.problem = f"corrupt train.csv ({exc})"
        evaluation = markers.eval_state(rd)
        if state == "new":
            result.problem = "missing: never trained"
        elif state == "failed":
            result.problem = "train failed: " + (markers.reason(rd, markers.FAILED).splitlines() or [""])[0][:100]
        elif state == "started":
            result.problem = "train unfinished"
        elif evaluation == "skipped":
            result.problem = "eval skipped: " + markers.reason(rd, markers.EVAL_SKIPPED)
        elif evaluation == "failed":
            result.problem = "eval failed: " + markers.reason(rd, markers.EVAL_FAILED)[:100]
        elif not (rd / "eval.csv").exists():
            result.problem = "not evaluated"
        else:
            try:
                result.eval_return = read_eval(rd / "eval.csv")
            except (ValueError, KeyError, csv.Error) as exc:
                result.problem = f"corrupt eval.csv ({type(exc).__name__}: {exc})"
        results.append(result)
    return results, problems


def _write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def _fmt(x: float) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.6g}"


def collect(experiment_dir: Path, out=sys.stdout, agg: str = "iqm") -> int:
    experiment_dir = Path(experiment_dir)
    if not (experiment_dir / "runs.csv").exists():
        print(f"hpcrl: error: {experiment_dir}: not an experiment directory (no runs.csv)", file=sys.stderr)
        return 2
    results, problems = gather(experiment_dir)
    by_setting: dict[str, list[RunResult]] = {}
    for r in results:
        by_setting.setdefault(r.run.setting_label, []).append(r)

    scores = {label: np.array([[r.eval_return] for r in rs if not math.isnan(r.eval_return)]).reshape(-1, 1) for label, rs in by_setting.items()}
    summary = stats.summarize(scores)
    results_dir = experiment_dir / "results"
    (results_dir / "plots").mkdir(parents=True, exist_ok=True)
    keys = [k for k in summary[0] if k != "setting"] if summary else []
    rows = []
    for item in summary:
        label = item["setting"]
        missing = [r.run.run_id for r in by_setting[label] if math.isnan(r.eval_return)]
        rows.append([label, len(by_setting[label]), *[_fmt(item[k]) if isinstance(item[k], float) else item[k] for k in keys], " ".join(missing)])
    _write_csv(results_dir / "summary.csv", ["setting", "n_expected", *keys, "missing_runs"], rows)

    curves = {}
    curve_rows = []
    for label, rs in by_setting.items():
        usable = [r for r in rs if len(r.steps) >= 2]
        if not usable:
            continue
        grid, center, low, high, n = stats.aggregate_curves([r.steps for r in usable], [r.returns for r in usable], None, agg)
        curves[label] = (grid, center, low, high, n)
        curve_rows += [[label, f"{g:.0f}", _fmt(c), _fmt(lo), _fmt(hi), n] for g, c, lo, hi in zip(grid, center, low, high)]
    _write_csv(results_dir / "curves.csv", ["setting", "step", agg, "ci_low", "ci_high", "n_seeds"], curve_rows)

    exp_name = experiment_dir.name
    made = []
    if curves:
        made.append(plots.plot_curves(curves, results_dir / "plots" / "curves.png", agg, title=f"{exp_name}: training return"))
    if any(len(s) for s in scores.values()):
        made.append(plots.plot_final_intervals(summary, results_dir / "plots" / "final.png", metric=agg))
        made.append(plots.plot_performance_profile({k: v for k, v in scores.items() if len(v)}, results_dir / "plots" / "profile.png"))

    print_table(summary, by_setting, out)
    for problem in problems:
        print(f"problem: {problem}", file=out)
    for r in results:
        if r.problem:
            print(f"run {r.run.run_id} ({r.run.setting_label}, seed {r.run.seed}): {r.problem}", file=out)
    print(f"wrote {results_dir / 'summary.csv'}, {results_dir / 'curves.csv'} and {len(made)} plots in {results_dir / 'plots'}", file=out)
    return 0 if any(not math.isnan(r.eval_return) for r in results) else 1


def print_table(summary: list[dict], by_setting: dict[str, list[RunResult]], out) -> None:
    header = ["setting", "seeds", "mean", "95% CI", "IQM", "std"]
    table = [header]
    for item in summary:
        n_exp = len(by_setting[item["setting"]])
        table.append([
            item["setting"],
            f"{item['n']}/{n_exp}",
            _fmt(item["mean"]),
            f"[{_fmt(item['mean_ci_low'])}, {_fmt(item['mean_ci_high'])}]",
            _fmt(item["iqm"]),
            _fmt(item["std"]),
        ])
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)), file=out)
