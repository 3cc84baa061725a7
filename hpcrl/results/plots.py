"""Figures for ``results/plots/``: learning curves with bands, final-score intervals, profiles.

Each figure shows its uncertainty and its sample size (every legend or axis label says how many
seeds stand behind a curve), because a bare mean curve over three seeds is what Agarwal et al.
(2021) found most RL comparisons to be.

Figures are built with `matplotlib.figure.Figure` directly rather than through pyplot: that needs
no display on a compute node, never touches the user's pyplot backend or global figure list (a
notebook that imports hpcrl keeps its inline backend), and frees each figure when it goes out of
scope. PNG files are written atomically (`hpcrl.io.atomic_open`), so a killed aggregate job never
leaves a truncated image behind. The ``*_figure`` functions return the Figure for callers that
want to inspect or compose it; the ``plot_*`` functions write it and return the path.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator
from numpy.typing import ArrayLike

from hpcrl.io import atomic_open
from hpcrl.results import stats

Curve = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]

_DPI = 150
_AGG_LABELS = {"iqm": "IQM", "mean": "Mean"}
# Ten colours, then the same ten dashed, dotted...: a sweep of 30 settings stays distinguishable.
_COLORS = [f"C{i}" for i in range(10)]
_LINESTYLES = ["-", "--", ":", "-."]
# Legend rows per column before it wraps into another column beside the axes.
_LEGEND_ROWS = 20
MARKED_POINTS = 25
"""A curve of at most this many points (evaluations during training, a ladder's policies) gets a
marker at each: the line between two is an interpolation, the markers are what was measured.
Training curves, on collect's grid of 100 points, stay plain lines."""
RATE_LIMITS = (-0.02, 1.02)
"""The y range of a rate (win, draw, loss): [0, 1] whatever the data, with room for a line at 0 or 1.
Left to autoscale, a rate that stayed 0 was drawn on an axis from -0.04 to 0.04."""


def _styles() -> Iterator[tuple[str, str]]:
    for linestyle in itertools.cycle(_LINESTYLES):
        for color in _COLORS:
            yield color, linestyle


def _abbreviate(x: float, _pos: int | None = None) -> str:
    """Tick label 2500000 -> '2.5M': step counts in the millions are unreadable in full."""
    for suffix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:g}{suffix}"
    return f"{x:g}"


def _plural(n: int, word: str) -> str:
    return f"n={n} {word}{'' if n == 1 else 's'}"


def _legend_outside(ax: Axes, count: int) -> None:
    """Legend to the right of the axes, so it can never cover data; wraps into columns."""
    ax.legend(
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        borderaxespad=0.0,
        frameon=False,
        fontsize="small",
        ncol=max(1, math.ceil(count / _LEGEND_ROWS)),
    )


def _legend_below(ax: Axes) -> None:
    """Legend under the axes, one entry a line: the narrow figures' (a phone's screen has no room beside them)."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), borderaxespad=0.0, frameon=False, fontsize="small")


def _band_alpha(count: int) -> float:
    """Fainter bands when many overlap, so lines stay readable through a stack of them."""
    return 0.2 if count <= 6 else 0.08


def _no_data(ax: Axes) -> None:
    ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="0.4")


def _save(fig: Figure, path: str | Path) -> Path:
    """Write a PNG atomically; ``bbox_inches="tight"`` grows the image to fit long labels."""
    path = Path(path)
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=_DPI, bbox_inches="tight")
    return path


def _draw_curves(ax: Axes, curves: Mapping[str, Curve], styles: Mapping[str, tuple[str, str]], band_alpha: float) -> int:
    """Lines with their bands on one axes; returns how many settings had data."""
    drawn = 0
    for setting, (grid, center, low, high, n) in curves.items():
        color, linestyle = styles[setting]
        if n == 0 or np.size(grid) == 0:
            ax.plot([], [], linestyle="none", label=f"{setting} (n=0 seeds, no data)")
            continue
        point = np.size(grid) == 1  # one evaluation (a short budget): a band through it would be invisible
        marker = "o" if np.size(grid) <= MARKED_POINTS else None
        ax.plot(grid, center, color=color, linestyle=linestyle, linewidth=1.6, marker=marker, markersize=4, label=f"{setting} ({_plural(n, 'seed')})")
        if n >= 2 and point:
            ax.vlines(grid, low, high, color=color, linewidth=2.0, alpha=0.6)
        elif n >= 2:
            ax.fill_between(grid, low, high, color=color, alpha=band_alpha, linewidth=0)
        drawn += 1
    if not drawn:
        _no_data(ax)
    ax.xaxis.set_major_formatter(FuncFormatter(_abbreviate))
    ax.xaxis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))  # "1.25k 1.5k 1.75k ..." ran into each other in a narrow panel
    ax.grid(alpha=0.3)
    return drawn


def _style_map(names: Sequence[str]) -> dict[str, tuple[str, str]]:
    """One colour and line style per setting, the same in every panel of a figure."""
    return dict(zip(names, _styles()))


def curves_figure(
    curves: Mapping[str, Curve],
    agg_name: str,
    xlabel: str = "environment steps",
    ylabel: str = "episodic return",
    title: str | None = None,
    confidence: float = 0.95,
    ylim: tuple[float, float] | None = None,
    narrow: bool = False,
) -> Figure:
    """One line per setting from `hpcrl.results.stats.aggregate_curves` output, with its bootstrap band.

    ``agg_name`` ("iqm", "mean") names the aggregate in the title and must be the one the curves
    were computed with; ``confidence`` is likewise the level their bands were computed at. A
    setting with one seed gets a line and no band (a bootstrap of one seed has zero width, and
    drawing one would suggest certainty); a setting with no seeds is listed in the legend as
    having no data, so a missing setting is visible rather than silently absent. ``ylim``: fixed
    limits (`RATE_LIMITS` for rates) instead of the data's. ``narrow``: for a phone's screen
    (`narrow_of`), smaller, with the legend below the axes instead of beside them.
    """
    fig = Figure(figsize=(4.6, 3.4 + 0.2 * len(curves)) if narrow else (7.0, 4.2))
    ax = fig.add_subplot()
    _draw_curves(ax, curves, _style_map(list(curves)), _band_alpha(len(curves)))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.set_title(title if title is not None else f"{_AGG_LABELS.get(agg_name, agg_name)} ± {confidence:.0%} bootstrap CI", wrap=narrow)
    if curves and narrow:
        _legend_below(ax)
    elif curves:
        _legend_outside(ax, len(curves))
    return fig


def curves_by_task_figure(
    curves_by_task: Mapping[str, Mapping[str, Curve]],
    agg_name: str,
    xlabel: str = "environment steps",
    ylabel: str = "episodic return",
    title: str | None = None,
    confidence: float = 0.95,
    ylim: tuple[float, float] | None = None,
    narrow: bool = False,
) -> Figure:
    """One panel per task (environment), each with a line per setting; a setting keeps its colour
    in every panel and the legend is drawn once, beside the last panel of the first row. ``ylim``:
    fixed limits for every panel (`RATE_LIMITS` for rates). ``narrow``: the panels stacked in one
    column with the legend below them, for a phone's screen (report.html shows it there): three
    panels side by side, shrunk to 390 pixels, have text a few pixels high."""
    tasks = list(curves_by_task)
    names = list(dict.fromkeys(s for curves in curves_by_task.values() for s in curves))
    cols = 1 if narrow else min(3, max(1, len(tasks)))
    rows = math.ceil(len(tasks) / cols) if tasks else 1
    fig = Figure(figsize=(4.6, 2.9 * rows + 0.9 + 0.22 * len(names)) if narrow else (3.4 * cols + 2.0, 2.9 * rows + 0.6))
    axes = fig.subplots(rows, cols, squeeze=False)
    styles = _style_map(names)
    for i, ax in enumerate(axes.flat):
        if i >= len(tasks):
            ax.set_visible(False)
            continue
        _draw_curves(ax, curves_by_task[tasks[i]], styles, _band_alpha(len(names)))
        ax.set_title(tasks[i], fontsize="medium")
        if ylim is not None:
            ax.set_ylim(*ylim)
        if not narrow or i == len(tasks) - 1:
            ax.set_xlabel(xlabel)
        if i % cols == 0:
            ax.set_ylabel(ylabel)
    if names:
        # One legend for all panels, each setting with the seeds behind its lines (a range where panels differ).
        handles = [axes.flat[0].plot([], [], color=styles[n][0], linestyle=styles[n][1])[0] for n in names]
        labels = []
        for name in names:
            ns = sorted({curves[name][4] for curves in curves_by_task.values() if name in curves})
            labels.append(f"{name} (n={ns[0] if len(ns) == 1 else f'{ns[0]}-{ns[-1]}'} seeds)")
        if narrow:
            fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), frameon=False, fontsize="small")
        else:
            fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 0.95), frameon=False, fontsize="small")
    fig.suptitle(title if title is not None else f"{_AGG_LABELS.get(agg_name, agg_name)} ± {confidence:.0%} bootstrap CI", wrap=narrow)
    fig.tight_layout()
    return fig


def narrow_path(path: str | Path) -> Path:
    """Where the narrow version of a figure goes: plots/narrow/, beside the figures, so that
    plots/*.png stays one file per figure."""
    path = Path(path)
    return path.parent / "narrow" / path.name


def narrow_of(path: str | Path) -> Path | None:
    """The narrow version of the figure at ``path``, where its kind has one (None otherwise)."""
    narrow = narrow_path(path)
    return narrow if narrow.is_file() else None


def save_with_narrow(figure: Callable[[bool], Figure], path: str | Path) -> Path:
    """Write ``figure(False)`` at ``path`` and ``figure(True)``, its narrow version, at `narrow_path`;
    return ``path``. (The ``plot_*`` functions of figures that have a narrow version end here.)"""
    _save(figure(True), narrow_path(path))
    return _save(figure(False), path)


def plot_curves_by_task(curves_by_task: Mapping[str, Mapping[str, Curve]], path: str | Path, agg_name: str, **kwargs: object) -> Path:
    """Write `curves_by_task_figure` as a PNG at ``path`` (and its narrow version: `narrow_of`) and return the path."""
    return save_with_narrow(lambda narrow: curves_by_task_figure(curves_by_task, agg_name, narrow=narrow, **kwargs), path)  # type: ignore[arg-type]


def plot_curves(
    curves: Mapping[str, Curve],
    path: str | Path,
    agg_name: str,
    xlabel: str = "environment steps",
    ylabel: str = "episodic return",
    title: str | None = None,
    confidence: float = 0.95,
    ylim: tuple[float, float] | None = None,
) -> Path:
    """Write `curves_figure` as a PNG at ``path`` (and its narrow version: `narrow_of`) and return the path."""
    return save_with_narrow(lambda narrow: curves_figure(curves, agg_name, xlabel, ylabel, title, confidence, ylim, narrow), path)


def _draw_intervals(ax: Axes, summary_rows: Sequence[Mapping[str, object]], metric: str, xlabel: str) -> None:
    """A point and interval bar per row, top to bottom in input order; rows without runs stay, marked."""
    labels = []
    for y, (row, (color, _)) in enumerate(zip(summary_rows, _styles())):
        n = int(row["n"])
        labels.append(f"{row['setting']} (n={n}{', no runs' if n == 0 else ''})")
        point, low, high = (float(row[k]) for k in (metric, f"{metric}_ci_low", f"{metric}_ci_high")) if n else (math.nan,) * 3
        if n == 0 or math.isnan(point):
            continue
        ax.barh(y, high - low, left=low, height=0.6, color=color, alpha=0.35, linewidth=0)
        ax.plot([point, point], [y - 0.3, y + 0.3], color=color, linewidth=2.2)
    if not summary_rows:
        _no_data(ax)
    # Bars pin the axis limit to their edges ("sticky edges"); without a margin the widest
    # interval would end exactly on the frame and look cut off.
    ax.use_sticky_edges = False
    ax.margins(x=0.05)
    if labels:
        ax.set_yticks(range(len(labels)), labels)
        ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)


def final_intervals_figure(
    summary_rows: Sequence[Mapping[str, object]],
    metric: str = "iqm",
    xlabel: str = "final eval return",
    title: str | None = None,
    confidence: float = 0.95,
) -> Figure:
    """Point estimate and interval per setting, one row each, like rliable's interval plot.

    ``summary_rows`` are `hpcrl.results.stats.summarize` rows, read through ``metric`` ("iqm" or "mean")
    and ``{metric}_ci_low``/``{metric}_ci_high``. Rows keep their input order top to bottom; each
    label carries n, and a setting without runs keeps its row, marked, with nothing drawn.
    """
    if metric not in _AGG_LABELS:
        raise ValueError(f"metric must be one of {sorted(_AGG_LABELS)} (those summarize gives intervals for), got {metric!r}")
    fig = Figure(figsize=(7.0, 1.2 + 0.45 * max(1, len(summary_rows))))
    ax = fig.add_subplot()
    _draw_intervals(ax, summary_rows, metric, xlabel)
    ax.set_title(title if title is not None else f"{_AGG_LABELS[metric]} with {confidence:.0%} bootstrap CI")
    return fig


def aggregate_intervals_figure(
    rows: Sequence[Mapping[str, object]],
    metrics: Mapping[str, str],
    xlabel: str,
    title: str | None = None,
    confidence: float = 0.95,
    narrow: bool = False,
) -> Figure:
    """rliable's aggregate-metrics figure: one panel per metric (``{key: panel title}``, e.g. IQM,
    mean, optimality gap), a row per setting with its point estimate and bootstrap interval.
    ``narrow``: the panels stacked in one column, for a phone's screen."""
    height = 1.4 + 0.45 * max(1, len(rows))
    fig = Figure(figsize=(5.0, (height - 0.6) * len(metrics) + 0.6) if narrow else (3.2 * len(metrics) + 2.5, height))
    axes = fig.subplots(len(metrics), 1, squeeze=False)[:, 0] if narrow else fig.subplots(1, len(metrics), squeeze=False, sharey=True)[0]
    for i, (ax, (key, name)) in enumerate(zip(axes, metrics.items())):
        _draw_intervals(ax, rows, key, xlabel)
        ax.set_title(name, fontsize="medium")
        if i and not narrow:
            ax.tick_params(labelleft=False)
    fig.suptitle(title if title is not None else f"Aggregate metrics with {confidence:.0%} stratified bootstrap CIs", wrap=narrow)
    fig.tight_layout()
    return fig


def plot_aggregate_intervals(rows: Sequence[Mapping[str, object]], path: str | Path, metrics: Mapping[str, str], xlabel: str, title: str | None = None) -> Path:
    """Write `aggregate_intervals_figure` as a PNG at ``path`` (and its narrow version: `narrow_of`) and return the path."""
    return save_with_narrow(lambda narrow: aggregate_intervals_figure(rows, metrics, xlabel, title, narrow=narrow), path)


def plot_final_intervals(
    summary_rows: Sequence[Mapping[str, object]],
    path: str | Path,
    metric: str = "iqm",
    xlabel: str = "final eval return",
    title: str | None = None,
    confidence: float = 0.95,
) -> Path:
    """Write `final_intervals_figure` as a PNG at ``path`` and return the path."""
    return _save(final_intervals_figure(summary_rows, metric, xlabel, title, confidence), path)


def _default_taus(scores_by_setting: Mapping[str, ArrayLike], points: int = 201) -> np.ndarray:
    """Thresholds spanning all scores plus a margin, so every profile visibly starts at 1 and ends at 0."""
    pooled = np.concatenate([np.asarray(s, dtype=float).ravel() for s in scores_by_setting.values()] or [np.empty(0)])
    if pooled.size == 0:
        return np.linspace(0.0, 1.0, points)
    lo, hi = float(pooled.min()), float(pooled.max())
    margin = 0.05 * (hi - lo) if hi > lo else max(1.0, 0.05 * abs(hi))
    return np.linspace(lo - margin, hi + margin, points)


def performance_profile_figure(
    scores_by_setting: Mapping[str, ArrayLike],
    taus: ArrayLike | None = None,
    xlabel: str = "final eval return threshold τ",
    title: str | None = None,
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Figure:
    """Fraction of runs scoring above each threshold, per setting, with a bootstrap band.

    The whole distribution of final scores, not one summary number: one setting may win on
    average by a few lucky seeds while another is reliably good, and this is where that shows.
    Bands are drawn for settings with at least two runs (see `curves_figure` for why not one).
    """
    t = _default_taus(scores_by_setting) if taus is None else np.atleast_1d(np.asarray(taus, dtype=float))
    fig = Figure(figsize=(7.0, 4.2))
    ax = fig.add_subplot()
    drawn = 0
    for (setting, scores), (color, linestyle) in zip(scores_by_setting.items(), _styles()):
        a = np.atleast_1d(np.asarray(scores, dtype=float))
        n = a.shape[0]
        if n == 0:
            ax.plot([], [], linestyle="none", label=f"{setting} (n=0 runs, no data)")
            continue
        label = f"{setting} ({_plural(n, 'run')}" + (f" x {a.shape[1]} tasks)" if a.ndim == 2 and a.shape[1] > 1 else ")")
        ax.plot(t, stats.performance_profile(a, t), color=color, linestyle=linestyle, linewidth=1.6, label=label)
        if n >= 2:
            low, high = stats.performance_profile_ci(a, t, reps, confidence, seed)
            ax.fill_between(t, low, high, color=color, alpha=_band_alpha(len(scores_by_setting)), linewidth=0)
        drawn += 1
    if not drawn:
        _no_data(ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of runs with score > τ")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title if title is not None else f"Performance profile ± {confidence:.0%} bootstrap CI")
    ax.grid(alpha=0.3)
    if scores_by_setting:
        _legend_outside(ax, len(scores_by_setting))
    return fig


def plot_performance_profile(
    scores_by_setting: Mapping[str, ArrayLike],
    path: str | Path,
    taus: ArrayLike | None = None,
    xlabel: str = "final eval return threshold τ",
    title: str | None = None,
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Path:
    """Write `performance_profile_figure` as a PNG at ``path`` and return the path."""
    return _save(performance_profile_figure(scores_by_setting, taus, xlabel, title, reps, confidence, seed), path)
