"""The strength of two-player agents (`algo: alphazero`) across seeds, as collect reports it.

Three things per setting, from each run's files (hpcrl.rl.strength writes them; rundir owns them),
in the order a game's report leads with them (before self-play's curve; collect shows no pooled return):
- a table per fixed opponent from strength.csv (the eval stage), the strongest first (perfect play,
  MCTS by simulations, random): win / draw / loss rates, the mean over seeds with a 95% bootstrap
  interval (hpcrl.stats), as returns are reported;
- an Elo ladder from ladder.csv: each run's round robin between `random` and its own policies is
  fitted by maximum likelihood (`fit_elo`, Bradley-Terry on the Elo scale, random = 0), and the
  ratings of the k-th policy of every seed form the ladder's k-th row (mean, interval) and a curve
  of Elo against the step the policy was saved at;
- curves of the win and loss rates against each opponent from strength_curve.csv (the evaluations
  during training), with bootstrap bands over seeds, one panel per opponent, on [0, 1].
Curves are drawn through the evaluations themselves: the k-th of every seed at the median of their
steps (the seeds of a setting evaluate on one schedule), a marker at each, never interpolated
between them onto a finer grid that would suggest measurements no one made.

Files: results/strength.csv, strength_curves.csv, elo.csv (every run's ratings), elo_ladder.csv,
plots/strength_win_rate.png, strength_loss_rate.png, elo.png. A run whose file is missing or
damaged is named in one line and left out; it never stops the rest of the report.

Pure functions of the files: no torch (collect runs on a login node).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from hpcrl.io import atomic_write_csv
from hpcrl.results import plots, report, stats
from hpcrl.results.tables import RunResult
from hpcrl.store import rundir

ANCHOR = rundir.LADDER_ANCHOR
"""The player rated 0: every run's ladder has it, so the ratings of different seeds share a scale."""
PRIOR_DRAWS = 1.0
"""Virtual drawn games added to every pair played: they keep a rating finite when one side won
every game (as BayesElo's prior does), and move a rating from 400 games by less than a point."""
ELO_SCALE = 400 / math.log(10)
RATES = ("win_rate", "draw_rate", "loss_rate")


def fit_elo(pairs: Sequence[tuple[str, str, float, float]], anchor: str = ANCHOR, prior_draws: float = PRIOR_DRAWS) -> dict[str, float]:
    """Maximum-likelihood Elo ratings from (player a, player b, a's score, games) per pair, a's score
    being its wins plus half its draws: P(a beats b) = 1 / (1 + 10^((R_b - R_a) / 400)). Fitted by
    Hunter's (2004) minorisation-maximisation for Bradley-Terry, which converges from any start;
    `anchor` is rated 0 (the mean rating is 0 when it did not play)."""
    names = sorted({p for a, b, _, _ in pairs for p in (a, b)})
    if not names:
        return {}
    index = {n: i for i, n in enumerate(names)}
    games = np.zeros((len(names), len(names)))
    score = np.zeros(len(names))
    for a, b, s, n in pairs:
        i, j = index[a], index[b]
        if n <= 0 or not 0 <= s <= n:
            raise ValueError(f"{a} vs {b}: a score of {s:g} in {n:g} games")
        games[i, j] += n + prior_draws
        games[j, i] += n + prior_draws
        score[i] += s + prior_draws / 2
        score[j] += n - s + prior_draws / 2
    gamma = np.ones(len(names))
    for _ in range(10_000):
        new = score / (games / (gamma[:, None] + gamma[None, :])).sum(axis=1)
        new = np.maximum(new, 1e-300) / math.exp(np.mean(np.log(np.maximum(new, 1e-300))))
        done = np.max(np.abs(np.log(new) - np.log(gamma))) < 1e-10
        gamma = new
        if done:
            break
    elo = ELO_SCALE * np.log(gamma)
    elo -= elo[index[anchor]] if anchor in index else elo.mean()
    return {n: float(elo[index[n]]) for n in names}


def _cell(x: float) -> str:
    return f"{x:.4g}"


def _label(r: RunResult, multi: bool) -> str:
    return f"{r.setting} on {r.task}" if multi else r.setting


def _read(r: RunResult, name: str, reader: Callable[[Path], list[dict]], problems: list[str], multi: bool) -> list[dict] | None:
    """A run's file through its one validated reader (rundir), or None with the reason in `problems`:
    a damaged file is left out whole, named with the line of the damage."""
    try:
        return reader(r.run_dir / name)
    except FileNotFoundError:
        problems.append(f"run {r.run_id} ({_label(r, multi)}, seed {r.seed}): no {name}")
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        problems.append(f"run {r.run_id} ({_label(r, multi)}, seed {r.seed}): {rundir.damage(name, exc)}")
    return None


def _interval(row: dict) -> str:
    return "-" if row["n"] < 2 else f"[{_cell(row['mean_ci_low'])}, {_cell(row['mean_ci_high'])}]"


def strongest_first(opponent: str) -> tuple[int, int]:
    """Sort key of the fixed opponents: perfect play, then MCTS by its simulations, then random;
    losses to the strongest are what a game's results open with."""
    if opponent == "perfect":
        return (0, 0)
    if opponent.startswith("mcts:"):
        return (1, -int(opponent.split(":")[1]))
    return (2, 0)


def opponent_tables(final: dict[str, list[dict]]) -> tuple[dict[str, report.Table], list[list]]:
    """Per opponent, the strongest first: a table of the settings' rates over seeds; and
    strength.csv's rows. `final`: label -> the strength.csv rows of all its seeds (one row per
    opponent and seed)."""
    by_opponent: dict[str, dict[str, list[dict]]] = {}
    for label, rows in final.items():
        for row in sorted(rows, key=lambda r: strongest_first(r["opponent"])):
            by_opponent.setdefault(row["opponent"], {}).setdefault(label, []).append(row)
    tables, csv_rows = {}, []
    for opponent, by_label in by_opponent.items():
        rates = {rate: stats.summarize({lb: np.array([[r[rate]] for r in rs]) for lb, rs in by_label.items()}) for rate in RATES}
        cells = []
        for k, (label, rs) in enumerate(by_label.items()):
            win, draw, loss = (rates[rate][k] for rate in RATES)
            games = int(sum(r["games"] for r in rs))
            cells.append([label, str(len(rs)), _cell(win["mean"]), _interval(win), _cell(draw["mean"]), _cell(loss["mean"]), _interval(loss), str(games)])
            csv_rows.append([label, opponent, len(rs), games, *[f"{row[key]:.6g}" for row in (win, draw, loss) for key in ("mean", "mean_ci_low", "mean_ci_high")]])
        tables[opponent] = report.Table(["setting", "seeds", "win rate", "95% CI", "draw rate", "loss rate", "95% CI (loss)", "games"], cells)
    return tables, csv_rows


def _curve_rows(label: str, extra: Sequence[str], curve: plots.Curve) -> list[list]:
    grid, center, low, high, n = curve
    return [[label, *extra, f"{g:.0f}", f"{c:.6g}", f"{lo:.6g}", f"{hi:.6g}", n] for g, c, lo, hi in zip(grid, center, low, high)]


def by_evaluation(series: Sequence[Sequence[tuple[float, float]]]) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """Seeds' (step, value) series as `stats.aggregate_curves` takes them on the grid of their
    evaluations: the k-th point of every seed (sorted by step; as many as the shortest seed has)
    at the median of their steps. (steps per seed, values per seed, that grid.)"""
    series = [sorted(s) for s in series if s]
    k = min((len(s) for s in series), default=0)
    grid = np.median(np.array([[x for x, _ in s[:k]] for s in series]), axis=0) if series and k else np.empty(0)
    return [grid] * len(series), [np.array([y for _, y in s[:k]], dtype=float) for s in series], grid


def _many(wanted: Sequence[Sequence[Sequence[tuple[float, float]]]], agg: str) -> list[plots.Curve | ValueError]:
    """Each curve of seeds' evaluation series (`by_evaluation`), aggregated over its seeds."""
    laid = [by_evaluation(series) for series in wanted]
    return stats.aggregate_curves_many([(steps, values) for steps, values, _ in laid], agg=agg, grids=[g for *_, g in laid])  # type: ignore[arg-type]


def rate_curves(curves_of: dict[str, list[list[dict]]], agg: str) -> tuple[dict[str, dict[str, dict[str, plots.Curve]]], list[list], list[str]]:
    """rate -> opponent (the strongest first) -> label -> curve over seeds, from each seed's
    strength_curve.csv rows; the CSV rows; a line per curve that could not be drawn."""
    wanted = []  # (rate, opponent, label, each seed's (step, rate) series)
    for label, seeds in curves_of.items():
        for opponent in sorted(dict.fromkeys(row["opponent"] for rows in seeds for row in rows), key=strongest_first):
            for rate in ("win_rate", "loss_rate"):
                series = [[(row["step"], row[rate]) for row in rows if row["opponent"] == opponent] for rows in seeds]
                wanted.append((rate, opponent, label, [s for s in series if s]))
    answers = _many([series for *_, series in wanted], agg)
    out: dict[str, dict[str, dict[str, plots.Curve]]] = {}
    rows, notes = [], []
    for (rate, opponent, label, *_), curve in zip(wanted, answers):
        if isinstance(curve, ValueError):
            notes.append(f"{label}: no {rate.replace('_', ' ')} curve against {opponent} ({curve})")
            continue
        out.setdefault(rate, {}).setdefault(opponent, {})[label] = curve
        rows += _curve_rows(label, [opponent, rate], curve)
    return out, rows, notes


def rate_figure(curves: Mapping[str, Mapping[str, plots.Curve]], rate: str, agg: str, steps: str, narrow: bool = False) -> Figure:
    """A rate's curves (`rate_curves`), a panel per opponent, on the rates' fixed [0, 1]
    (plots.RATE_LIMITS: a rate that stayed 0 is a line on the floor, not one in the middle of an
    axis from -0.04 to 0.04); `steps` names the x axis (Scoring.steps)."""
    words = rate.replace("_", " ")
    title = f"{words.capitalize()} against each opponent during training: {agg.upper()} ± 95% bootstrap CI"
    return plots.curves_by_task_figure(curves, agg, xlabel=steps, ylabel=words, title=title, ylim=plots.RATE_LIMITS, narrow=narrow)


def ladder_rows(ratings_of: dict[str, list[dict[str, float]]]) -> tuple[report.Table, list[list]]:
    """The Elo ladder across seeds: `random` (0), then each seed's k-th policy by step as row k (its
    step the median over seeds), the mean rating with a 95% bootstrap interval."""
    cells, csv_rows = [], []
    for label, seeds in ratings_of.items():
        ranked = [sorted((int(p), e) for p, e in ratings.items() if p != ANCHOR) for ratings in seeds]
        cells.append([label, ANCHOR, "-", str(len(seeds)), "0", "-"])
        csv_rows.append([label, ANCHOR, "", len(seeds), "0", "", ""])
        for k in range(max((len(r) for r in ranked), default=0)):
            at = [r[k] for r in ranked if len(r) > k]
            (row,) = stats.summarize({label: np.array([[e] for _, e in at])})
            step = int(np.median([s for s, _ in at]))
            cells.append([label, f"policy {k + 1}", str(step), str(len(at)), f"{row['mean']:.0f}", "-" if len(at) < 2 else f"[{row['mean_ci_low']:.0f}, {row['mean_ci_high']:.0f}]"])
            csv_rows.append([label, f"policy {k + 1}", step, len(at), f"{row['mean']:.6g}", f"{row['mean_ci_low']:.6g}", f"{row['mean_ci_high']:.6g}"])
    return report.Table(["setting", "player", "step", "seeds", "Elo", "95% CI"], cells), csv_rows


def write_strength(results: Sequence[RunResult], results_dir: Path, agg: str, steps: str) -> tuple[list[report.Section], list[str]]:
    """Every strength file and figure of an experiment; the report's sections (their tables are
    printed on the terminal too) and a line per run whose strength could not be read. `steps`:
    what the runs count (the x axis: hpcrl.results.tables.Scoring.steps)."""
    multi = len({r.task for r in results}) > 1
    problems: list[str] = []
    final: dict[str, list[dict]] = {}
    curves_of: dict[str, list[list[dict]]] = {}
    ratings_of: dict[str, list[dict[str, float]]] = {}
    elo_rows: list[list] = []
    has_ladder = any((r.run_dir / rundir.LADDER).is_file() for r in results)
    for r in results:
        label = _label(r, multi)
        if (r.run_dir / rundir.STRENGTH_CURVE).is_file():
            rows = _read(r, rundir.STRENGTH_CURVE, lambda path: rundir.read_strength(path, curve=True), problems, multi)
            if rows:
                curves_of.setdefault(label, []).append(rows)
        if r.problem:
            continue  # reported already, as every run without a score is
        rows = _read(r, rundir.STRENGTH, rundir.read_strength, problems, multi)
        if rows:
            final.setdefault(label, []).extend(rows)
        if has_ladder:
            pairs = _read(r, rundir.LADDER, rundir.read_ladder, problems, multi)
            if pairs:
                ratings = fit_elo([(p["player_a"], p["player_b"], p["a_wins"] + p["draws"] / 2, p["games"]) for p in pairs])
                ratings_of.setdefault(label, []).append(ratings)
                elo_rows += [[r.setting, r.task, r.run_id, r.seed, p, "" if p == ANCHOR else p, f"{e:.6g}"] for p, e in ratings.items()]

    plots_dir = results_dir / "plots"
    plots_dir.mkdir(parents=True, exist_ok=True)
    sections: list[report.Section] = []
    tables, csv_rows = opponent_tables(final)
    if tables:
        stat_cols = [f"{rate}_{k}" for rate in ("win", "draw", "loss") for k in ("mean", "ci_low", "ci_high")]
        atomic_write_csv(results_dir / "strength.csv", ["setting", "opponent", "seeds", "games", *stat_cols], csv_rows)
        sections.append(report.Section("Strength against fixed opponents", [
            "Win / draw / loss rates of the final policy (eval stage), the strongest opponent first, each colour half the "
            "games; the mean over seeds with a 95% bootstrap interval (strength.csv).",
            *[report.Section(f"Against {opponent}", [table]) for opponent, table in tables.items()],
        ]))  # fmt: skip
    if ratings_of:
        table, ladder_csv = ladder_rows(ratings_of)
        atomic_write_csv(results_dir / "elo.csv", ["setting", "task", "run_id", "seed", "player", "step", "elo"], elo_rows)
        atomic_write_csv(results_dir / "elo_ladder.csv", ["setting", "player", "step", "seeds", "elo", "ci_low", "ci_high"], ladder_csv)
        series = {label: [[(int(p), e) for p, e in ratings.items() if p != ANCHOR] for ratings in seeds] for label, seeds in ratings_of.items()}
        elo_curves = {label: c for label, c in zip(series, _many(list(series.values()), agg)) if not isinstance(c, ValueError)}
        blocks: list = [
            "Each run's round robin between `random` and its own policies (saved at each evaluation during training, and the "
            "evaluated one) fitted by maximum likelihood (Bradley-Terry on the Elo scale, random = 0); policy k of every seed "
            "forms row k, the mean over seeds with a 95% bootstrap interval (elo.csv, elo_ladder.csv).",
            table,
        ]  # fmt: skip
        if elo_curves:
            path = plots.plot_curves(elo_curves, plots_dir / "elo.png", agg, xlabel=steps, ylabel="Elo (random = 0)",
                                     title=f"Elo of the run's own policies: {agg.upper()} ± 95% bootstrap CI")  # fmt: skip
            blocks.append(report.Image("Elo of the run's own policies", path, narrow=plots.narrow_of(path)))
        sections.append(report.Section("Elo ladder of the run's policies", blocks))
    curves, curve_rows, notes = rate_curves(curves_of, agg)
    problems += notes
    if curve_rows:
        atomic_write_csv(results_dir / "strength_curves.csv", ["setting", "opponent", "rate", "step", agg, "ci_low", "ci_high", "n_seeds"], curve_rows)
        blocks = []
        for rate in ("win_rate", "loss_rate"):
            if rate in curves:
                path = plots.save_with_narrow(lambda narrow, rate=rate: rate_figure(curves[rate], rate, agg, steps, narrow), plots_dir / f"strength_{rate}.png")  # type: ignore[misc]
                blocks.append(report.Image(f"{rate.replace('_', ' ').capitalize()} during training", path, narrow=plots.narrow_of(path)))
        sections.append(report.Section("Strength during training", blocks))
    return sections, problems
