"""The results of runs, as a reader gets them: tables, CSVs, plots and the report.

`hpcrl collect` (one experiment) and `hpcrl compare` (several) both end here, so a table or figure
means the same thing in both. Environments are tasks, as in rliable: each setting's final scores
form a runs x tasks matrix; per-task tables use every run, and the aggregate across tasks (IQM,
mean, median, optimality gap, with stratified bootstrap CIs), the performance profile and
P(X > Y) use the seeds a setting has on every task (the matrix must be whole; a run left out for
that is named). Scores are normalised per task when asked, (score - random) / (reference - random),
because raw returns of different environments do not average.

    results/
      summary.csv        per setting and task: n expected, n, mean, median, IQM, std, CIs, missing runs
      aggregate.csv      per setting across tasks (more than one task): IQM, mean, median, optimality gap + CIs
      improvement.csv    P(X > Y) between the settings shown (the best MAX_PLOTTED by the aggregate), with CIs
                         (none, and why in no_ci, where stats.interval_withheld says one would say nothing)
      curves.csv         training curves per setting and task; eval_curves.csv the same for the
                         evaluations during training (eval.every_steps)
      plots/*.png        curves, eval curves, final scores, aggregate metrics, performance profile
      report.md, report.html

A collect or compare removes what an earlier one wrote and it did not write again (`stale_removed`):
a report must not sit beside a figure of data that is gone. It removes these names only (RESULT_FILES,
PLOT_FILES: its own, a two-player agent's strength files and an Optuna study's), never a file of the
user's beside them.
"""

from __future__ import annotations

import functools
import math
import textwrap
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from hpcrl import halves
from hpcrl.config import tasks
from hpcrl.io import atomic_write_csv
from hpcrl.results import plots, report, stats

MAX_PLOTTED = 12
"""Settings drawn in one figure and compared pairwise: past a dozen lines a figure is unreadable,
and a sweep of 1,000 settings would have a million P(X > Y) pairs, which no one reads either."""
CURVES_IN_TWO = 64
"""Settings from which their curves' bootstrap bands are computed in two processes (hpcrl.halves): ~1.7 ms each."""
FIGURES_IN_TWO = 2
"""Figures from which they are drawn in two processes: each is 0.1-0.5 s of matplotlib, whatever the sweep."""
RESULT_FILES = (
    "summary.csv", "aggregate.csv", "improvement.csv", "curves.csv", "eval_curves.csv", "report.md", "report.html",
    "strength.csv", "strength_curves.csv", "elo.csv", "elo_ladder.csv", "trials.csv",
)  # fmt: skip
"""The files a collect writes in results/: write_results', hpcrl.results.strength's and an Optuna study's
(hpcrl.sweep.study_results)."""
PLOT_FILES = (
    "curves.png", "eval_curves.png", "final.png", "final-*.png", "aggregate.png", "profile.png",
    "elo.png", "strength_win_rate.png", "strength_loss_rate.png", "optuna_history.png", "optuna_intermediate.png", "optuna_importances.png",
)  # fmt: skip
"""The figures (glob patterns: `final-<task>.png`) a collect writes in results/plots/, and their narrow
versions in plots/narrow/ (hpcrl.results.plots.narrow_path)."""


@dataclass
class RunResult:
    index: int
    run_id: str
    seed: int
    setting: str
    task: str
    run_dir: Path
    eval_return: float = math.nan
    problem: str = ""
    """Why the run has no final score (it is then left out of the summary)."""
    curve_problem: str = ""
    """Why a run with a score has no training curve (the curves then use fewer seeds)."""
    steps: np.ndarray = field(default_factory=lambda: np.empty(0))
    returns: np.ndarray = field(default_factory=lambda: np.empty(0))
    eval_steps: np.ndarray = field(default_factory=lambda: np.empty(0))
    eval_returns: np.ndarray = field(default_factory=lambda: np.empty(0))
    videos: list[Path] = field(default_factory=list)


@dataclass
class Scoring:
    """How final scores are read: their name, and per-task normalisation (None: raw scores)."""

    name: str = "Final evaluation return"
    refs: dict[str, tuple[float, float]] | None = None
    agg: str = "iqm"
    game: bool = False
    """A two-player agent's (AlphaZero): its eval return pools +1 / 0 / -1 over opponents of every
    strength (random, MCTS, perfect play), so it is no score to show, rank, profile or compare: the
    strength sections lead its report instead (hpcrl.results.strength), and its training curve is
    self-play's outcome, which falls toward a draw as both sides improve. summary.csv keeps it."""
    steps: str = "environment steps"
    """What the runs count as steps: the x axis of every curve (AlphaZero: self-play positions)."""

    @property
    def unit(self) -> str:
        if self.refs is not None:
            return "normalised score"
        return "final eval return" if self.name == "Final evaluation return" else "final score (last training episodes)"


SELF_PLAY = "Self-play outcome"
SELF_PLAY_CAPTION = (
    "The first player's mean result in the run's own self-play games (+1 a win, 0 a draw, -1 a loss): it falls toward 0 "
    "as both sides improve and more games are drawn, so it is no measure of strength; the strength against fixed "
    "opponents and the Elo ladder above are."
)
"""A game's training curve, named for what it is: a falling line there is no collapse."""

Groups = dict[str, dict[str, list[RunResult]]]
"""setting -> task -> its runs, in the order they came."""


def _group(results: Sequence[RunResult]) -> tuple[Groups, list[str]]:
    groups: Groups = {}
    for r in results:
        groups.setdefault(r.setting, {}).setdefault(r.task, []).append(r)
    task_names = list(dict.fromkeys(r.task for r in results))
    return groups, task_names


def _scores(runs: Sequence[RunResult]) -> np.ndarray:
    return np.array([r.eval_return for r in runs if not math.isnan(r.eval_return)], dtype=float)


def _fmt(x: object) -> str:
    if isinstance(x, float):
        return "" if math.isnan(x) else f"{x:.6g}"
    return str(x)


def _cell(x: object) -> str:
    """A number as the tables show it: 4 significant digits (the CSVs keep 6), so a row of
    intervals fits a laptop's screen."""
    if isinstance(x, str):
        try:
            x = float(x)
        except ValueError:
            return x
    if isinstance(x, float):
        return "" if math.isnan(x) else f"{x:.4g}"
    return str(x)


def _p_cell(p: str, low: str, high: str, withheld: str = "") -> str:
    """`0.5 [0.25, 0.75]`, or `1 (no CI: 3 vs 2 seeds)` where the interval says nothing (stats.interval_withheld)."""
    return f"{_cell(p)} (no CI: {withheld})" if withheld else f"{_cell(p)} [{_cell(low)}, {_cell(high)}]"


def collect_files(results_dir: Path) -> list[Path]:
    """The files in `results_dir` that a collect or compare writes (RESULT_FILES, PLOT_FILES), as they are now."""
    plots_dir = results_dir / "plots"
    found = [results_dir / name for name in RESULT_FILES]
    found += [path for where in (plots_dir, plots_dir / "narrow") for pattern in PLOT_FILES for path in sorted(where.glob(pattern))]
    return [path for path in found if path.is_file() and not path.is_symlink()]


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns


@contextmanager
def stale_removed(results_dir: Path, out: TextIO | None = None) -> Iterator[None]:
    """Around the writes of a collect (or compare): once they all succeeded, remove each file of an earlier
    one (`collect_files`) that this one did not write again, and name them in one line on `out`. An
    earlier collect's eval_curves.csv and its figures outlived the runs' evaluation curves, and a collect
    of no runs left every figure of the last: a report beside plots of data that is gone.

    What is atomic here is each file, not the set: every file is written whole to a temporary file and
    renamed over the old one (hpcrl.io), so a reader never sees half a file, but may see new files beside
    old ones while a collect runs. The rename is also how a file this collect wrote is told from one it
    left: a file replaced has another inode and mtime than the one there before. The stale files go last,
    after the new report, and only when every write succeeded: a collect that fails midway removes
    nothing (the earlier set stays whole but for the files already replaced), and no report ever links a
    figure that was taken away after it was written."""
    before = {path: _stamp(path) for path in collect_files(results_dir)}
    yield
    stale = [path for path, stamp in before.items() if _stamp(path) == stamp]
    for path in stale:
        path.unlink(missing_ok=True)
    if stale:
        names = ", ".join(str(path.relative_to(results_dir)) for path in stale)
        print(f"removed {len(stale)} files of earlier results that these have no data for: {names}", file=out)


def score_matrices(groups: Groups, task_names: list[str], refs: dict[str, tuple[float, float]] | None) -> tuple[dict[str, np.ndarray], list[str]]:
    """Each setting's (seeds x tasks) matrix over the seeds it scored on every task, normalised when
    `refs` is given; and a line for each setting that lost runs to that (or has a task without any)."""
    matrices: dict[str, np.ndarray] = {}
    notes = []
    for setting, by_task in groups.items():
        scored = {t: {r.seed: r.eval_return for r in by_task.get(t, []) if not math.isnan(r.eval_return)} for t in task_names}
        common = sorted(set.intersection(*(set(s) for s in scored.values()))) if scored else []
        left_out = sorted(r.run_id for t in task_names for r in by_task.get(t, []) if not math.isnan(r.eval_return) and r.seed not in common)
        if not common:
            empty = [t for t in task_names if not scored[t]]
            notes.append(f"{setting}: left out of the aggregate across tasks: " + (f"no score on {', '.join(empty)}" if empty else "no seed scored on every task"))
            continue
        m = np.array([[scored[t][seed] for t in task_names] for seed in common])
        if refs is not None:
            m = np.stack([tasks.normalize(m[:, j], refs[t]) for j, t in enumerate(task_names)], axis=1)
        matrices[setting] = m
        if left_out:
            notes.append(f"{setting}: {len(left_out)} runs left out of the aggregate across tasks (their seed has no score on another task): {' '.join(left_out)}")
    return matrices, notes


def aggregate_rows(matrices: dict[str, np.ndarray], normalized: bool, reps: int = 2000) -> list[dict]:
    """Per setting across tasks: rliable's IQM, mean and median (and optimality gap below 1 when
    normalised) with stratified percentile bootstrap CIs."""
    metrics: dict[str, Callable] = {"iqm": stats.iqm, "mean": stats.mean, "median": stats.median}
    if normalized:
        metrics["optimality_gap"] = stats.optimality_gap
    rows = []
    for setting, m in matrices.items():
        row: dict = {"setting": setting, "n": m.shape[0], "tasks": m.shape[1]}
        for key, fn in metrics.items():
            row[key] = float(fn(m))
            row[f"{key}_ci_low"], row[f"{key}_ci_high"] = (float(x) for x in stats.stratified_bootstrap_ci(m, fn, reps))
        rows.append(row)
    return rows


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """Columns padded to their widest cell, for the terminal."""
    table = [header, *rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in table)


def _interval(item: dict, stat: str) -> str:
    """A setting's interval as a table shows it; none for one seed, whose bootstrap has no spread (`[41, 41]` read
    as certainty), as its std is none."""
    low, high = _cell(item[f"{stat}_ci_low"]) or "-", _cell(item[f"{stat}_ci_high"]) or "-"
    return "-" if (low == high == "-" or item.get("n", 2) < 2) else f"[{low}, {high}]"


def summary_table(summary: list[dict], n_expected: dict[str, int]) -> tuple[list[str], list[list[str]]]:
    header = ["setting", "seeds", "mean", "95% CI", "IQM", "95% CI (IQM)", "std"]
    rows = [
        [item["setting"], f"{item['n']}/{n_expected[item['setting']]}", _cell(item["mean"]) or "-", _interval(item, "mean"),
         _cell(item["iqm"]) or "-", _interval(item, "iqm"), _cell(item["std"]) or "-"]
        for item in summary
    ]  # fmt: skip
    return header, rows


def _curves(groups: Groups, task_names: list[str], agg: str, which: str) -> tuple[dict[str, dict], list[list], list[str]]:
    """(task -> setting -> aggregate curve, curves.csv rows, lines for settings drawn from fewer seeds)."""
    by_task: dict[str, dict] = {}
    rows, partial = [], []
    for task in task_names:
        todo = []  # (setting, usable seeds' curves, the note on seeds without one)
        for setting, by in groups.items():
            rs = by.get(task, [])
            series = [(r.steps, r.returns) if which == "train" else (r.eval_steps, r.eval_returns) for r in rs]
            usable = [s for s in series if len(s[0]) >= (2 if which == "train" else 1)]
            note = None
            if which == "train" and len(usable) < len(rs):
                where = f"{setting}" + (f" on {task}" if len(task_names) > 1 else "")
                note = f"{where}: training curve from {len(usable)} of {len(rs)} seeds"
            todo.append((setting, usable, note))
        seeds = [([s for s, _ in u], [v for _, v in u]) for _, u, _ in todo if u]
        curves = iter(halves.map_in_halves(lambda part: stats.aggregate_curves_many(part, agg=agg), seeds, CURVES_IN_TWO))
        for setting, usable, note in todo:
            if note:
                partial.append(note)
            if not usable:
                continue
            curve = next(curves)
            if isinstance(curve, ValueError):  # seeds whose logs do not overlap: say so, draw the rest
                partial.append(f"{setting} on {task}: no {which} curve ({curve})")
                continue
            by_task.setdefault(task, {})[setting] = curve
            grid, center, low, high, n = curve
            cells = [["" if x != x else f"{x:.6g}" for x in column.tolist()] for column in (center, low, high)]  # _fmt, inlined: 100 points a curve
            rows += [[setting, task, f"{g:.0f}", c, lo, hi, n] for g, c, lo, hi in zip(grid.tolist(), *cells)]
    return by_task, rows, partial


def write_results(
    results_dir: Path,
    title: str,
    facts: list[tuple[str, str]],
    results: list[RunResult],
    scoring: Scoring,
    notes: Sequence[str] = (),
    out: TextIO | None = None,
    extra_plots: dict[str, Path] | None = None,
    sections: Sequence[report.Section] = (),
) -> int:
    """Every results file, the report, and the tables on `out`. 0 when any run had a score, else 1.
    `extra_plots` (title -> PNG, an Optuna study's) join the report after hpcrl's own. `sections`
    (a two-player agent's strength: hpcrl.results.strength) lead the report and the terminal when
    `scoring.game`, else follow the summary. The plots counted on the last line are the report's
    figures: every plot a collect writes is shown there, and only there are they all in one place."""
    agg, game = scoring.agg, scoring.game
    groups, task_names = _group(results)
    multi = len(task_names) > 1
    plots_dir = results_dir / "plots"
    plots_dir.mkdir(parents=True, exist_ok=True)
    n_expected = {(s, t): len(rs) for s, by in groups.items() for t, rs in by.items()}

    # Per task: every run that has a score.
    per_task: dict[str, list[dict]] = {}
    summary_rows = []
    for task in task_names:
        scores = {s: _scores(by.get(task, [])) for s, by in groups.items() if task in by}
        per_task[task] = stats.summarize(scores)
        keys = [k for k in per_task[task][0] if k != "setting"] if per_task[task] else []
        for item in per_task[task]:
            missing = [r.run_id for r in groups[item["setting"]][task] if math.isnan(r.eval_return)]
            summary_rows.append([item["setting"], task, n_expected[item["setting"], task], *[_fmt(item[k]) for k in keys], " ".join(missing)])
    keys = [k for k in next(iter(per_task.values()))[0] if k != "setting"] if results else []
    atomic_write_csv(results_dir / "summary.csv", ["setting", "task", "n_expected", *keys, "missing_runs"], summary_rows)

    # Across tasks: whole matrices; ranked by the aggregate (or the one task's summary).
    matrices, matrix_notes = score_matrices(groups, task_names, scoring.refs)
    aggregate = aggregate_rows(matrices, scoring.refs is not None) if (multi or scoring.refs is not None) and not game else []
    if aggregate:  # none: an earlier collect's (more tasks) goes with the other stale files (stale_removed)
        cols = [k for k in aggregate[0] if k not in ("setting",)]
        atomic_write_csv(results_dir / "aggregate.csv", ["setting", *cols], [[row["setting"], *[_fmt(row[k]) for k in cols]] for row in aggregate])
    ranking = aggregate if aggregate else per_task.get(task_names[0], []) if task_names else []
    ranked = [row["setting"] for row in sorted((r for r in ranking if r["n"]), key=lambda r: -r[agg])]
    shown = ranked[:MAX_PLOTTED]
    n_settings = len(groups)
    cut_note = f" (best {MAX_PLOTTED} of {n_settings} settings by {agg})" if n_settings > MAX_PLOTTED else ""
    in_plot = set(shown) if n_settings > MAX_PLOTTED else set(groups)

    improvement = []
    for x in shown if not game else ():
        for y in shown:
            if x != y:
                low, high = stats.probability_of_improvement_ci(matrices[x], matrices[y])
                withheld = stats.interval_withheld(len(matrices[x]), len(matrices[y]), low, high)
                p = _fmt(float(stats.probability_of_improvement(matrices[x], matrices[y])))
                improvement.append([x, y, p, *(["", ""] if withheld else [_fmt(low), _fmt(high)]), withheld])
    if not game:
        atomic_write_csv(results_dir / "improvement.csv", ["setting_x", "setting_y", "p_x_better", "ci_low", "ci_high", "no_ci"], improvement)

    # Curves and figures.
    made: dict[str, Path] = {}
    train_curves, curve_rows, partial = _curves(groups, task_names, agg, "train")
    atomic_write_csv(results_dir / "curves.csv", ["setting", "task", "step", agg, "ci_low", "ci_high", "n_seeds"], curve_rows)
    eval_curves, eval_rows, eval_partial = _curves(groups, task_names, agg, "eval") if not game else ({}, [], [])  # a game's: strength curves
    if eval_rows:
        atomic_write_csv(results_dir / "eval_curves.csv", ["setting", "task", "step", agg, "ci_low", "ci_high", "n_seeds"], eval_rows)
    figures: list[tuple[str, Callable[[], Path]]] = []  # (title, draw): drawn together below, half in a second process

    def figure(heading: str, plot: Callable[..., Path], /, *args: object, **kwargs: object) -> None:
        figures.append((heading, functools.partial(plot, *args, **kwargs)))

    band = f"{agg.upper()} ± 95% bootstrap CI{cut_note}"
    train_name, train_label = (SELF_PLAY, "first player's outcome in self-play") if game else ("Training curves", "episodic return (training)")
    for name, curves, key, ylabel in ((train_name, train_curves, "curves", train_label), ("Evaluation during training", eval_curves, "eval_curves", "mean eval return")):
        kept = {t: {s: c for s, c in cs.items() if s in in_plot} for t, cs in curves.items()}
        if not kept:
            continue
        if multi:
            figure(name, plots.plot_curves_by_task, kept, plots_dir / f"{key}.png", agg, xlabel=scoring.steps, ylabel=ylabel, title=f"{name}: {band}")
        else:
            figure(name, plots.plot_curves, next(iter(kept.values())), plots_dir / f"{key}.png", agg, xlabel=scoring.steps, ylabel=ylabel, title=f"{name}: {band}")
    if not game and any(len(s) for s in (_scores(rs) for by in groups.values() for rs in by.values())):
        for task in task_names:
            rows_shown = [s for s in per_task[task] if s["n"] and s["setting"] in in_plot]
            suffix = f"-{_file_part(task)}" if multi else ""
            figure(
                f"{scoring.name}{' on ' + task if multi else ''}: {agg.upper()} intervals", plots.plot_final_intervals,
                rows_shown, plots_dir / f"final{suffix}.png", metric=agg, xlabel=scoring.unit if scoring.refs is None else "final eval return",
                title=f"{task}: {agg.upper()} with 95% bootstrap CI" if multi else None,
            )
        if aggregate:
            metric_names = {"median": "Median", "iqm": "IQM", "mean": "Mean", **({"optimality_gap": "Optimality gap"} if scoring.refs is not None else {})}
            figure(
                "Aggregate across tasks", plots.plot_aggregate_intervals,
                [r for r in aggregate if r["setting"] in in_plot], plots_dir / "aggregate.png", metric_names, scoring.unit,
                title=f"Across {len(task_names)} tasks, 95% stratified bootstrap CIs",
            )
        if not multi or scoring.refs is not None:
            figure(
                "Performance profile", plots.plot_performance_profile,
                {k: v for k, v in matrices.items() if k in in_plot}, plots_dir / "profile.png",
                xlabel=f"{scoring.unit} threshold τ", title="Performance profile ± 95% bootstrap CI" + (f" over {len(task_names)} tasks" if multi else ""),
            )

    drawn = halves.map_in_halves(lambda part: [draw() for _, draw in part], figures, FIGURES_IN_TWO)
    made.update(zip((title for title, _ in figures), drawn))
    made.update(extra_plots or {})

    # The terminal.
    problems = [(r, p) for r in results for p in (r.problem, r.curve_problem) if p]
    for task in task_names if not game else ():
        print(f"{scoring.name}" + (f", {task}:" if multi else ":"), file=out)
        print(text_table(*summary_table(per_task[task], {s: n_expected[s, task] for s, by in groups.items() if task in by})), file=out)
    for i, section in enumerate(sections):
        _print_section(section, out, first=game and i == 0)
    if aggregate:
        print(f"\nAcross {len(task_names)} tasks ({_scale_note(scoring)}):", file=out)
        print(text_table(*_aggregate_cells(aggregate)), file=out)
    pairs = _improvement_table(improvement, shown)
    if pairs and len(shown) <= 6:
        print("\nP(row > column), 95% CI:", file=out)
        print(pairs, file=out)
    lines = [*partial, *eval_partial, *(matrix_notes if aggregate else []), *notes]
    for line in lines:
        print(line, file=out)
    for r, problem in problems:
        print(f"run {r.run_id} ({r.setting}{', ' + r.task if multi else ''}, seed {r.seed}): {problem}", file=out)

    doc = _document(title, facts, results_dir, scoring, task_names, per_task, n_expected, groups, aggregate, improvement, shown, made, lines, problems, results)
    at = 0 if game else next((i for i, sec in enumerate(doc.sections) if not sec.title.startswith(scoring.name)), len(doc.sections))
    doc.sections[at:at] = list(sections)
    report.write(doc, results_dir)
    written = ["summary.csv", *(["aggregate.csv"] if aggregate else []), "curves.csv", *([] if game else ["improvement.csv"]), "report.md"]
    print(f"wrote {results_dir}/{', '.join(written)}, report.html and {len(doc.images())} plots in {results_dir}/plots", file=out)
    return 0 if matrices or any(len(_scores(rs)) for by in groups.values() for rs in by.values()) else 1


def _print_section(section: report.Section, out: TextIO | None, first: bool = False) -> None:
    """A report section's tables on the terminal, under their (sub)section's heading; a `first`
    section (what leads a game's results) opens with its title and first paragraph, which say what
    its tables hold."""
    if first:
        intro = next((b for b in section.blocks if isinstance(b, str)), "")
        print(textwrap.fill(f"{section.title}: {intro}".replace("`", ""), 100), file=out)
    for block in section.blocks:
        if isinstance(block, report.Table):
            print(f"\n{section.title}:", file=out)
            print(text_table(block.header, block.rows), file=out)
        elif isinstance(block, report.Section):
            _print_section(block, out)


def _file_part(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def _scale_note(scoring: Scoring) -> str:
    if scoring.refs is None:
        return "raw scores; normalise with results.normalize or --normalize to make tasks comparable"
    return "normalised: (score - random) / (reference - random)"


def _aggregate_cells(aggregate: list[dict]) -> tuple[list[str], list[list[str]]]:
    metrics = [m for m in ("iqm", "mean", "median", "optimality_gap") if m in aggregate[0]]
    names = {"iqm": "IQM", "mean": "mean", "median": "median", "optimality_gap": "optimality gap"}
    header = ["setting", "seeds x tasks"] + [h for m in metrics for h in (names[m], "95% CI")]
    rows = [[row["setting"], f"{row['n']} x {row['tasks']}"] + [c for m in metrics for c in (_cell(row[m]), _interval(row, m))] for row in aggregate]
    return header, rows


def _improvement_table(improvement: list[list], shown: list[str]) -> str:
    if not improvement:
        return ""
    cell = {(x, y): _p_cell(p, lo, hi, why) for x, y, p, lo, hi, why in improvement}
    return text_table(["P(X > Y)", *shown], [[x, *[cell.get((x, y), "-") for y in shown]] for x in shown])


def _document(
    title: str, facts: list[tuple[str, str]], results_dir: Path, scoring: Scoring, task_names: list[str], per_task: dict[str, list[dict]],
    n_expected: dict, groups: Groups, aggregate: list[dict], improvement: list[list], shown: list[str], made: dict[str, Path],
    lines: list[str], problems: list[tuple[RunResult, str]], results: list[RunResult],
) -> report.Document:
    """The report's content; hpcrl.results.report renders it as Markdown and self-contained HTML."""
    multi = len(task_names) > 1
    sections = []
    for task in task_names if not scoring.game else ():
        header, rows = summary_table(per_task[task], {s: n_expected[s, task] for s, by in groups.items() if task in by})
        sections.append(report.Section(f"{scoring.name}" + (f": {task}" if multi else ""), [report.Table(header, rows)]))
    if aggregate:
        header, rows = _aggregate_cells(aggregate)
        sections.append(report.Section(f"Across {len(task_names)} tasks", [_scale_note(scoring).capitalize() + ".", report.Table(header, rows)]))
    if improvement:
        cell = {(x, y): _p_cell(p, lo, hi, why) for x, y, p, lo, hi, why in improvement}
        table = report.Table(["P(row > column)", *shown], [[x, *[cell.get((x, y), "-") for y in shown]] for x in shown])
        sections.append(report.Section("Probability of improvement", [
            "P(X > Y): the chance that a run of X beats a run of Y on the same task, averaged over tasks, with 95% bootstrap CIs "
            f"(also in improvement.csv). No CI where a side has fewer than {stats.MIN_SEEDS_FOR_INTERVAL} seeds, or where every "
            "bootstrap resample gives the same value (no spread: each run of one side beat each of the other): "
            "a bootstrap cannot see past the runs it has.", table]))  # fmt: skip
    for name, path in made.items():
        sections.append(report.Section(name, [report.Image(name, path, SELF_PLAY_CAPTION if name == SELF_PLAY else "", plots.narrow_of(path))]))
    if lines:
        sections.append(report.Section("Notes", list(lines)))
    if problems:
        sections.append(report.Section("Runs without a result", [f"`{r.run_id}` ({r.setting}{', ' + r.task if multi else ''}, seed {r.seed}): {p}" for r, p in problems]))
    links = [(f"{r.run_id} ({r.setting}, {r.task}, seed {r.seed})" if multi else f"{r.run_id} ({r.setting}, seed {r.seed})", str(r.run_dir)) for r in results]
    sections.append(report.Section("Runs", [report.Links(links)]))
    videos = [(f"{r.run_id} ({r.setting}, seed {r.seed}): {v.name}", str(v)) for r in results for v in r.videos]
    if videos:
        sections.append(report.Section("Videos", [report.Links(videos)]))
    return report.Document(title, facts, sections)
