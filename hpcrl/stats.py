"""Aggregate statistics with bootstrap confidence intervals, after Agarwal et al. (2021).

"Deep RL at the Edge of the Statistical Precipice" showed that a mean over three seeds with no
interval is how unreliable RL claims get made. This module follows the definitions of their
`rliable` library so that numbers produced here can be compared with papers that use it, but it
needs numpy only: a cluster job that aggregates results should not pull in pandas, statsmodels and
arch.

Conventions shared by every function:

- A score matrix is shaped ``(n_runs, n_tasks)`` as in rliable; one environment means
  ``n_tasks == 1``, and a 1-D array is read as that single column. The point statistics also
  accept leading batch axes, ``(..., n_runs, n_tasks)``, and reduce the last two: that is how the
  bootstrap evaluates thousands of resamples in one vectorised call instead of a Python loop.
- NaN policy: scores must be finite. A NaN final score means a run failed or was read wrongly, and
  both silently dropping it (changes n) and propagating it (NaN intervals) hide that, so matrices
  with NaN or inf raise ``ValueError``. Training curves are different: a NaN there is a log row
  with no finished episode, so `aggregate_curves` drops those points before interpolating.
- No runs gives NaN, never a warning; one run gives an interval equal to the point estimate,
  which is the honest answer a bootstrap can give about one sample.
- Intervals are percentile bootstrap intervals (rliable's default method) over runs resampled with
  replacement independently within each task (stratified), from ``numpy.random.default_rng(seed)``
  so that the same inputs and seed always give the same interval.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

Statistic = Callable[[np.ndarray], "np.ndarray | float"]

# Pairs compared per chunk when probability-of-improvement compares every pair of runs of every
# resample: two boolean arrays of this size (~32 MB) at most, whatever the runs and repetitions.
_PAIRS_PER_CHUNK = 1 << 24


def _matrix(scores: ArrayLike) -> np.ndarray:
    """Float array of shape (..., n_runs, n_tasks); reject non-finite values (see NaN policy)."""
    a = np.asarray(scores, dtype=float)
    if a.ndim == 0:
        raise ValueError("scores must be an array of runs, got a scalar")
    if a.ndim == 1:
        a = a[:, None]
    if not np.isfinite(a).all():
        raise ValueError(
            "scores contain NaN or inf: drop failed or missing runs before aggregating, "
            "so that n reports the runs that actually count"
        )
    return a


def _empty_result(a: np.ndarray) -> np.ndarray | float:
    """NaN shaped like a reduction over the last two axes, for matrices with no runs or tasks."""
    out = np.full(a.shape[:-2], np.nan)
    return float(out) if out.ndim == 0 else out


def _scalar(x: np.ndarray) -> np.ndarray | float:
    return float(x) if np.ndim(x) == 0 else x


def mean(scores: ArrayLike) -> np.ndarray | float:
    """Mean over tasks of the per-task mean over runs (rliable's ``aggregate_mean``)."""
    a = _matrix(scores)
    if a.shape[-2] == 0 or a.shape[-1] == 0:
        return _empty_result(a)
    return _scalar(a.mean(axis=-2).mean(axis=-1))


def median(scores: ArrayLike) -> np.ndarray | float:
    """Median over tasks of the per-task mean over runs (rliable's ``aggregate_median``).

    With one task this is the mean over runs, not the median run: that is rliable's definition,
    kept so that the numbers match papers using it.
    """
    a = _matrix(scores)
    if a.shape[-2] == 0 or a.shape[-1] == 0:
        return _empty_result(a)
    return _scalar(np.median(a.mean(axis=-2), axis=-1))


def iqm(scores: ArrayLike) -> np.ndarray | float:
    """Interquartile mean of all run x task scores (rliable's ``aggregate_iqm``).

    The 25% trimmed mean is robust to an outlier seed yet, unlike the median, uses half the runs,
    so its interval is much tighter. Trimming follows ``scipy.stats.trim_mean(x, 0.25,
    axis=None)`` exactly: ``int(0.25 * N)`` values are cut from each end of the N sorted scores.
    """
    a = _matrix(scores)
    flat = a.reshape(*a.shape[:-2], -1)
    n = flat.shape[-1]
    if n == 0:
        return _empty_result(a)
    cut = int(0.25 * n)
    return _scalar(np.sort(flat, axis=-1)[..., cut : n - cut].mean(axis=-1))


def optimality_gap(scores: ArrayLike, gamma: float = 1.0) -> np.ndarray | float:
    """How far runs fall short of a target score ``gamma`` (rliable's ``aggregate_optimality_gap``).

    Scores above ``gamma`` are clipped to it, so exceeding the target on one run cannot make up
    for missing it on another. Lower is better.
    """
    a = _matrix(scores)
    if a.shape[-2] == 0 or a.shape[-1] == 0:
        return _empty_result(a)
    return _scalar(gamma - np.minimum(a, gamma).mean(axis=(-2, -1)))


def performance_profile(scores: ArrayLike, taus: ArrayLike) -> np.ndarray:
    """Fraction of all run x task scores strictly above each threshold in ``taus``.

    This is rliable's score distribution (``run_score_deviation``): it shows the whole spread of
    outcomes rather than one summary number. Returns shape (..., len(taus)).
    """
    a = _matrix(scores)
    t = np.atleast_1d(np.asarray(taus, dtype=float))
    if a.shape[-2] == 0 or a.shape[-1] == 0:
        return np.full((*a.shape[:-2], t.size), np.nan)
    flat = a.reshape(*a.shape[:-2], -1)
    return (flat[..., :, None] > t).mean(axis=-2)


def probability_of_improvement(x: ArrayLike, y: ArrayLike) -> np.ndarray | float:
    """P(X > Y): chance that a run of X beats a run of Y on the same task, averaged over tasks.

    rliable computes it per task as the Mann-Whitney U statistic over ``n_x * n_y``; that equals
    the fraction of (x run, y run) pairs where x wins, with ties counting one half, which is what
    is computed here directly (no scipy needed). 0.5 means no evidence either way.
    """
    a, b = _matrix(x), _matrix(y)
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(f"x has {a.shape[-1]} tasks but y has {b.shape[-1]}: compare the same tasks")
    if a.shape[-2] == 0 or b.shape[-2] == 0 or a.shape[-1] == 0:
        return _empty_result(a if a.ndim >= b.ndim else b)
    xs, ys = a[..., :, None, :], b[..., None, :, :]
    wins = (xs > ys).mean(axis=(-3, -2)) + 0.5 * (xs == ys).mean(axis=(-3, -2))
    return _scalar(wins.mean(axis=-1))


def _percentile_interval(samples: np.ndarray, confidence: float) -> tuple[np.ndarray | float, np.ndarray | float]:
    """Two-sided percentile interval over axis 0, as arch's ``conf_int(method="percentile")``."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    alpha = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(samples, [alpha, 100.0 - alpha], axis=0)
    return _scalar(low), _scalar(high)


def _stratified_resample(a: np.ndarray, reps: int, rng: np.random.Generator) -> np.ndarray:
    """(reps, n_runs, n_tasks) resamples: runs drawn with replacement independently per task.

    Stratifying by task keeps every task represented in every resample, as rliable's
    ``StratifiedBootstrap`` does; the draw is one index array, not a loop over reps.
    """
    n_runs, n_tasks = a.shape
    idx = rng.integers(0, n_runs, size=(reps, n_runs, n_tasks))
    return a[idx, np.arange(n_tasks)]


def stratified_bootstrap_ci(
    scores: ArrayLike,
    statistic: Statistic,
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[np.ndarray | float, np.ndarray | float]:
    """Percentile bootstrap interval ``(low, high)`` for ``statistic`` of a score matrix.

    ``statistic`` must reduce the last two axes of a ``(..., n_runs, n_tasks)`` array, as every
    point statistic in this module does; it is called once on all ``reps`` resamples stacked
    together. A statistic returning a vector (e.g. a performance profile) gives vector bounds.
    No runs gives NaN bounds; one run gives bounds equal to the point estimate.
    """
    a = _matrix(scores)
    if a.ndim != 2:
        raise ValueError(f"scores must be (n_runs, n_tasks), got shape {a.shape}")
    if reps < 1:
        raise ValueError(f"reps must be at least 1, got {reps}")
    if a.shape[0] == 0 or a.shape[1] == 0:
        nan = _scalar(np.full(np.shape(statistic(a)), np.nan))
        return nan, nan
    samples = np.asarray(statistic(_stratified_resample(a, reps, np.random.default_rng(seed))), dtype=float)
    return _percentile_interval(samples, confidence)


def performance_profile_ci(
    scores: ArrayLike,
    taus: ArrayLike,
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Pointwise bootstrap band ``(low, high)`` around `performance_profile` at each tau."""
    t = np.atleast_1d(np.asarray(taus, dtype=float))
    low, high = stratified_bootstrap_ci(scores, lambda s: performance_profile(s, t), reps, confidence, seed)
    return np.atleast_1d(low), np.atleast_1d(high)


def probability_of_improvement_ci(
    x: ArrayLike,
    y: ArrayLike,
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Bootstrap interval for `probability_of_improvement`.

    X and Y come from independent experiments, so their runs are resampled independently (each
    stratified by task), as rliable's ``StratifiedIndependentBootstrap`` does; they may have
    different numbers of runs. Resamples are processed in chunks so that comparing every pair of
    runs stays within a fixed memory bound.
    """
    a, b = _matrix(x), _matrix(y)
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"x and y must be (n_runs, n_tasks), got shapes {a.shape} and {b.shape}")
    if reps < 1:
        raise ValueError(f"reps must be at least 1, got {reps}")
    if math.isnan(probability_of_improvement(a, b)):
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    chunk = max(1, _PAIRS_PER_CHUNK // (a.shape[0] * b.shape[0] * a.shape[1]))
    samples = np.concatenate(
        [
            probability_of_improvement(_stratified_resample(a, m, rng), _stratified_resample(b, m, rng))
            for m in (min(chunk, reps - start) for start in range(0, reps, chunk))
        ]
    )
    low, high = _percentile_interval(samples, confidence)
    return float(low), float(high)


def summarize(
    scores_by_setting: Mapping[str, ArrayLike],
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> list[dict[str, str | int | float]]:
    """One row per setting, in input order, ready for ``results/summary.csv``.

    Fields: ``setting``, ``n`` (runs), ``mean``, ``median``, ``iqm``, ``std`` (sample standard
    deviation, ddof=1, of each run's score averaged over tasks; NaN for fewer than two runs, where
    it is undefined rather than zero), and ``mean_ci_low``, ``mean_ci_high``, ``iqm_ci_low``,
    ``iqm_ci_high`` (stratified percentile bootstrap at ``confidence``). Every setting uses the
    same seed, so rerunning the aggregation reproduces the file exactly.
    """
    rows: list[dict[str, str | int | float]] = []
    for setting, scores in scores_by_setting.items():
        try:
            a = _matrix(scores)
        except ValueError as error:
            raise ValueError(f"{setting}: {error}") from None
        if a.ndim != 2:
            raise ValueError(f"{setting}: scores must be (n_runs, n_tasks), got shape {a.shape}")
        n = a.shape[0]
        mean_low, mean_high = stratified_bootstrap_ci(a, mean, reps, confidence, seed)
        iqm_low, iqm_high = stratified_bootstrap_ci(a, iqm, reps, confidence, seed)
        rows.append(
            {
                "setting": setting,
                "n": n,
                "mean": mean(a),
                "median": median(a),
                "iqm": iqm(a),
                "std": float(a.mean(axis=1).std(ddof=1)) if n >= 2 else math.nan,
                "mean_ci_low": mean_low,
                "mean_ci_high": mean_high,
                "iqm_ci_low": iqm_low,
                "iqm_ci_high": iqm_high,
            }
        )
    return rows


def _clean_curve(steps: ArrayLike, values: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Finite points sorted by step; of repeated steps the last logged one wins.

    Resumed jobs append to their logs, so a step can appear twice (once before the preemption,
    once after resuming from an older checkpoint); the later row is the one the run continued from.
    """
    s = np.asarray(steps, dtype=float).ravel()
    v = np.asarray(values, dtype=float).ravel()
    if s.shape != v.shape:
        raise ValueError(f"a seed has {s.size} steps but {v.size} values")
    keep = np.isfinite(s) & np.isfinite(v)
    s, v = s[keep], v[keep]
    unique_steps, first_in_reversed = np.unique(s[::-1], return_index=True)
    return unique_steps, v[::-1][first_in_reversed]


# Fraction of the sorted seeds cut from each end by each curve aggregate (rliable's IQM cuts 25%).
_CURVE_TRIM = {"mean": 0.0, "iqm": 0.25}


def _trimmed_mean_weights(n: int, reps: int, trim: float, rng: np.random.Generator) -> np.ndarray:
    """(reps, n) weights such that ``weights @ v`` is the trimmed mean of each resample of sorted v.

    Resampling n seeds uniformly with replacement draws the same multiset of values as resampling
    n positions of the values sorted at that grid point, so a resample is a sorted multiset of
    positions, and its trimmed mean a fixed weighting of the sorted values. That turns the
    bootstrap of every grid point into one matrix product instead of sorting
    reps x n_points small arrays, which was 80% of the time of a 1000-run aggregation.
    """
    cut = int(trim * n)
    kept = np.sort(rng.integers(0, n, size=(reps, n)), axis=1)[:, cut : n - cut]
    flat = (np.arange(reps)[:, None] * n + kept).ravel()
    return np.bincount(flat, minlength=reps * n).reshape(reps, n) / kept.shape[1]


def aggregate_curves(
    steps_per_seed: Sequence[ArrayLike],
    values_per_seed: Sequence[ArrayLike],
    grid: ArrayLike | None = None,
    agg: Literal["mean", "iqm"] = "mean",
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    n_points: int = 100,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Learning curves of several seeds on one step grid: ``(grid, center, low, high, n)``.

    Seeds log at different steps, so each curve is linearly interpolated onto a common grid. The
    default grid has ``n_points`` points from the latest first step to the earliest last step of
    any seed: an aggregate is only drawn where every seed has data, so a seed that stopped early
    never has its tail invented. Points of an explicit ``grid`` outside that range are NaN for the
    same reason. NaN log rows are dropped; seeds with no finite point are left out, and ``n``
    counts the seeds that remain.

    ``center`` is `mean` or `iqm` of the seeds at each grid point (one task per point); ``low`` and
    ``high`` are the pointwise percentile bootstrap band over seeds, with the same distribution at
    each point as `stratified_bootstrap_ci` of that point's scores (see `_trimmed_mean_weights`
    for how it is computed fast).
    """
    if len(steps_per_seed) != len(values_per_seed):
        raise ValueError(f"{len(steps_per_seed)} step arrays but {len(values_per_seed)} value arrays")
    if agg not in _CURVE_TRIM:
        raise ValueError(f"agg must be one of {sorted(_CURVE_TRIM)}, got {agg!r}")
    if reps < 1:
        raise ValueError(f"reps must be at least 1, got {reps}")
    curves = [c for c in map(_clean_curve, steps_per_seed, values_per_seed) if c[0].size]
    n = len(curves)
    if n:
        start, stop = max(s[0] for s, _ in curves), min(s[-1] for s, _ in curves)
        if start > stop:
            raise ValueError(f"the seeds' logged steps do not overlap (latest first step {start:g} > earliest last step {stop:g})")
    if grid is not None:
        g = np.asarray(grid, dtype=float).ravel()
    elif n == 0:
        g = np.empty(0)
    else:
        g = np.unique(np.linspace(start, stop, n_points))
    center, low, high = (np.full(g.shape, np.nan) for _ in range(3))
    if n == 0 or g.size == 0:
        return g, center, low, high, n

    covered = (g >= start) & (g <= stop)
    ys = np.sort(np.stack([np.interp(g[covered], s, v) for s, v in curves]), axis=0)  # (n_seeds, n_covered)
    cut = int(_CURVE_TRIM[agg] * n)
    center[covered] = ys[cut : n - cut].mean(axis=0)
    samples = _trimmed_mean_weights(n, reps, _CURVE_TRIM[agg], np.random.default_rng(seed)) @ ys
    low[covered], high[covered] = _percentile_interval(samples, confidence)
    return g, center, low, high, n
