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

import contextlib
import ctypes
import functools
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
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
    """Two-sided percentile interval over axis 0, as arch's ``conf_int(method="percentile")``.

    Exactly ``np.percentile(samples, [alpha, 100 - alpha], axis=0)``; for many columns of many
    resamples (a training curve's band) `_tail_percentiles` finds the same order statistics
    without partitioning every column whole.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    alpha = 100.0 * (1.0 - confidence) / 2.0
    fast = samples.ndim == 2 and samples.shape[0] >= _TAIL_MIN_REPS and samples.shape[1] >= _TAIL_MIN_COLUMNS and samples.dtype == np.float64
    low, high = _tail_percentiles(samples, alpha) if fast else np.percentile(samples, [alpha, 100.0 - alpha], axis=0)
    return _scalar(low), _scalar(high)


# `_tail_percentiles` pays off from a thousand resamples x a few dozen columns; below, np.percentile.
_TAIL_MIN_REPS, _TAIL_MIN_COLUMNS, _TAIL_PROBE, _TAIL_MAX_WIDTH = 1000, 16, 128, 256
_TAIL_CHECKED: dict[tuple[int, float], bool] = {}
"""(resamples, alpha) -> whether `_tail_percentiles` reproduced np.percentile on its first columns."""


def _tail_percentiles(samples: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """``np.percentile(samples, [alpha, 100 - alpha], axis=0)``, the same floats, found faster.

    A percentile interval needs four order statistics of each column: the two around rank
    ``(n - 1) alpha / 100`` and their mirror images. np.percentile partitions every column whole to
    find them, which was most of the time of collecting a 1,000-setting sweep. Here the sorted first
    rows of each column (a probe: resamples are exchangeable) give it a threshold per tail; the
    values beyond it, counted and found to hold both ranks, are the only ones sorted, and numpy's
    linear interpolation (virtual index ``(n - 1) q``, its ``_lerp``) is applied to the values found.
    A column whose count falls short or runs long (the lumpy bootstrap distribution of a few seeds)
    goes to np.percentile; so does everything when a sample is not finite (NaN stays numpy's
    business), or when this numpy interpolates otherwise: the first call for a shape compares its
    first columns with np.percentile and, if they differ, never takes this path again.
    """
    n, p = samples.shape
    q = np.true_divide(np.array([alpha, 100.0 - alpha]), 100)
    virtual = (n - 1) * q
    before = np.floor(virtual)
    gamma = virtual - before
    (lo_prev, hi_prev), (lo_next, hi_next) = before.astype(np.intp), before.astype(np.intp) + 1
    need = max(lo_next + 1, n - hi_prev)  # values at or beyond a tail's threshold that hold its two ranks
    k = math.ceil(2.5 * need * (_TAIL_PROBE + 1) / n) - 1  # the probe's order statistic that leaves ~2.5x that
    key = (n, alpha)
    with np.errstate(over="ignore", invalid="ignore"):  # a sum that overflows only sends this to np.percentile
        finite = math.isfinite(float(samples.sum()))
    if not (finite and _TAIL_CHECKED.get(key, True) and 0 <= lo_prev and hi_next <= n - 1 and k < _TAIL_PROBE // 4):
        low, high = np.percentile(samples, [alpha, 100.0 - alpha], axis=0)
        return low, high
    probe = np.sort(samples[:_TAIL_PROBE].T, axis=1)
    low_prev, low_next, low_ok = _tail_values(samples, samples <= probe[:, k], (lo_prev, lo_next), need)
    high_prev, high_next, high_ok = _tail_values(samples, samples >= probe[:, _TAIL_PROBE - 1 - k], (hi_prev - n, hi_next - n), need)
    with np.errstate(invalid="ignore"):  # columns left to np.percentile below hold inf here
        low, high = _lerp(low_prev, low_next, gamma[0]), _lerp(high_prev, high_next, gamma[1])
    redo = ~(low_ok & high_ok)
    if key not in _TAIL_CHECKED and (check := np.flatnonzero(~redo)[:4]).size:
        exact = np.percentile(samples[:, check], [alpha, 100.0 - alpha], axis=0)
        _TAIL_CHECKED[key] = bool(np.array_equal(exact, np.stack([low[check], high[check]])))
        if not _TAIL_CHECKED[key]:
            redo[:] = True
    if redo.any():
        low[redo], high[redo] = np.percentile(samples[:, redo], [alpha, 100.0 - alpha], axis=0)
    return low, high


def _tail_values(samples: np.ndarray, beyond: np.ndarray, ranks: tuple[int, int], need: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each column's values at two ranks (counted from the bottom, or from the top when negative)
    among the values `beyond` marks, and whether the column had at least `need` of them (then they
    are its ranks in the whole column) and few enough to sort cheaply; other columns get junk."""
    n, p = samples.shape
    flat = np.flatnonzero(beyond)  # row-major: by row, then column
    cols = flat % p
    counts = np.bincount(cols, minlength=p)
    ok = (counts >= need) & (counts <= _TAIL_MAX_WIDTH)
    keep = ok[cols]
    flat, cols = flat[keep], cols[keep]
    by_column = np.argsort(cols.astype(np.uint16) if p <= 1 << 16 else cols, kind="stable")  # radix sort
    flat, cols = flat[by_column], cols[by_column]
    width = max(int(counts[ok].max()) if ok.any() else 0, need)
    starts = np.zeros(p, dtype=np.intp)
    np.cumsum(np.where(ok, counts, 0)[:-1], out=starts[1:])
    bottom = ranks[0] >= 0
    padded = np.full((p, width), np.inf if bottom else -np.inf)  # sorts after the bottom values, before the top ones
    padded.ravel()[cols * width + np.arange(cols.size) - starts[cols]] = samples.ravel()[flat]
    found = np.sort(padded, axis=1)
    at = ranks if bottom else (width + ranks[0], width + ranks[1])
    return found[:, at[0]], found[:, at[1]], ok


def _lerp(a: np.ndarray, b: np.ndarray, t: float) -> np.ndarray:
    """numpy's linear interpolation between neighbouring order statistics, operation for operation."""
    diff = b - a
    out = a + diff * t
    if t >= 0.5:
        out = b - diff * (1 - t)
    return out


def _stratified_resample(a: np.ndarray, reps: int, rng: np.random.Generator) -> np.ndarray:
    """(reps, n_runs, n_tasks) resamples: runs drawn with replacement independently per task.

    Stratifying by task keeps every task represented in every resample, as rliable's
    ``StratifiedBootstrap`` does; the draw is one index array, not a loop over reps.
    """
    n_runs, n_tasks = a.shape
    idx = rng.integers(0, n_runs, size=(reps, n_runs, n_tasks))
    return a[idx, np.arange(n_tasks)]


def _seeded_resamples(a: np.ndarray, reps: int, seed: int | np.random.Generator | None) -> np.ndarray:
    """`_stratified_resample` from ``default_rng(seed)``, its indices drawn once per shape for an int seed."""
    if isinstance(seed, int):
        return a[_first_resample_indices(a.shape[0], a.shape[1], reps, seed), np.arange(a.shape[1])]
    return _stratified_resample(a, reps, np.random.default_rng(seed))


@functools.lru_cache(maxsize=8)  # a collect meets a few shapes; each entry is reps x runs x tasks int64
def _first_resample_indices(n_runs: int, n_tasks: int, reps: int, seed: int) -> np.ndarray:
    """The indices `_stratified_resample` draws first from ``default_rng(seed)``: every setting of a
    sweep with as many runs draws the same ones, so they are drawn once (read-only)."""
    idx = np.random.default_rng(seed).integers(0, n_runs, size=(reps, n_runs, n_tasks))
    idx.flags.writeable = False
    return idx


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
    samples = np.asarray(statistic(_seeded_resamples(a, reps, seed)), dtype=float)
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


MIN_SEEDS_FOR_INTERVAL = 3
"""Runs each side of P(X > Y) needs before its bootstrap interval is shown: two runs resample to three
distinct sets, and 3 runs against 2 that all lose gave `1 [1, 1]`, a certainty no such count gives."""


def interval_withheld(n_x: int, n_y: int, low: float, high: float) -> str:
    """Why a P(X > Y) interval says nothing and is not shown (empty when it is shown): a side with
    fewer than MIN_SEEDS_FOR_INTERVAL runs, or an interval of zero width, which every resample gave
    (each run of one side beat each of the other, or all tied): the bootstrap cannot see past the
    runs it has, and `[1, 1]` would read as certainty."""
    if min(n_x, n_y) < MIN_SEEDS_FOR_INTERVAL:
        return f"{n_x} vs {n_y} seed{'s' if n_y != 1 else ''}"
    if low == high:
        return "no spread"
    return ""


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
    pending: list[tuple[dict, np.ndarray, np.ndarray]] = []  # rows whose intervals come from one batch below
    for setting, scores in scores_by_setting.items():
        try:
            a = _matrix(scores)
        except ValueError as error:
            raise ValueError(f"{setting}: {error}") from None
        if a.ndim != 2:
            raise ValueError(f"{setting}: scores must be (n_runs, n_tasks), got shape {a.shape}")
        n = a.shape[0]
        row: dict = {"setting": setting, "n": n, "mean": mean(a), "median": median(a), "iqm": iqm(a), "std": float(a.mean(axis=1).std(ddof=1)) if n >= 2 else math.nan}
        row.update(mean_ci_low=math.nan, mean_ci_high=math.nan, iqm_ci_low=math.nan, iqm_ci_high=math.nan)
        if reps >= 1 and n and a.shape[1] and isinstance(seed, int):
            if not 0.0 < confidence < 1.0:
                raise ValueError(f"confidence must be in (0, 1), got {confidence}")
            # What stratified_bootstrap_ci(a, mean / iqm) computes, up to the percentiles, which are
            # taken for every setting at once: the same resamples (drawn once per shape), the same
            # statistics, and percentiles that are column by column what they are for each alone.
            resamples = _seeded_resamples(a, reps, seed)
            pending.append((row, np.asarray(mean(resamples), dtype=float), np.asarray(iqm(resamples), dtype=float)))
        else:
            row["mean_ci_low"], row["mean_ci_high"] = stratified_bootstrap_ci(a, mean, reps, confidence, seed)
            row["iqm_ci_low"], row["iqm_ci_high"] = stratified_bootstrap_ci(a, iqm, reps, confidence, seed)
        rows.append(row)
    for key, column in (("mean", 1), ("iqm", 2)):
        if pending:
            low, high = _percentile_interval(np.stack([item[column] for item in pending], axis=1), confidence)
            for (row, *_), lo, hi in zip(pending, np.atleast_1d(low).tolist(), np.atleast_1d(high).tolist()):
                row[f"{key}_ci_low"], row[f"{key}_ci_high"] = lo, hi
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
    if not keep.all():
        s, v = s[keep], v[keep]
    if s.size < 2 or (s[1:] > s[:-1]).all():  # already sorted and unique, as a log that never resumed
        return s, v
    unique_steps, first_in_reversed = np.unique(s[::-1], return_index=True)
    return unique_steps, v[::-1][first_in_reversed]


# Fraction of the sorted seeds cut from each end by each curve aggregate (rliable's IQM cuts 25%).
_CURVE_TRIM = {"mean": 0.0, "iqm": 0.25}


@functools.lru_cache(maxsize=64)
def _cached_weights(n: int, reps: int, trim: float, seed: int) -> np.ndarray:
    """`_trimmed_mean_weights` from ``default_rng(seed)``: the same for every setting with n seeds,
    so drawn once per n (read-only)."""
    weights = _trimmed_mean_weights(n, reps, trim, np.random.default_rng(seed))
    weights.flags.writeable = False
    return weights


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
    curve, ys, covered = _curve_points(steps_per_seed, values_per_seed, grid, agg, reps, n_points)
    if ys is not None:
        _, _, low, high, n = curve
        low[covered], high[covered] = _percentile_interval(_curve_weights(n, reps, agg, seed) @ ys, confidence)
    return curve


def aggregate_curves_many(
    seeds_of_curves: Sequence[tuple[Sequence[ArrayLike], Sequence[ArrayLike]]],
    agg: Literal["mean", "iqm"] = "mean",
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    n_points: int = 100,
    grids: Sequence[ArrayLike | None] | None = None,
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int] | ValueError]:
    """`aggregate_curves` of many ``(steps_per_seed, values_per_seed)`` on their default grids (or
    ``grids``, one per curve, None for the default): each one's answer, or the ValueError it
    raises, float for float the same.

    The difference is BLAS's threads: each curve's bootstrap is one small matmul (reps x seeds by
    seeds x points), and on a machine whose cores are busy, every such call made with a pool of
    threads waits for the other thread to be scheduled, milliseconds apiece: 1,000 curves took 7 to
    10 s on 2 busy cores, and 0.5 s in one thread. So they run in one BLAS thread (`_one_blas_thread`).
    That changes no number: for products of this shape OpenBLAS gives the same bits whatever its
    threads (1, 2, 4, 8 and 32 threads agreed on every product of 1,000 to 5,000 reps, 1 to 300
    seeds and 1 to 100 points; tests/results/test_stats.py holds this function to `aggregate_curves`).
    Wider products, which collect does not make (its grids have 100 points), can differ in the
    last bit between thread counts, as they did in the code before, from one machine to another.
    """
    grids = list(grids) if grids is not None else [None] * len(seeds_of_curves)
    if len(grids) != len(seeds_of_curves):
        raise ValueError(f"{len(grids)} grids for {len(seeds_of_curves)} curves")
    with _one_blas_thread():
        return [_answer(lambda s=s, v=v, g=g: aggregate_curves(s, v, g, agg, reps, confidence, seed, n_points)) for (s, v), g in zip(seeds_of_curves, grids)]


@contextlib.contextmanager
def _one_blas_thread() -> Iterator[None]:
    """Numpy's OpenBLAS limited to one thread while the block runs (as threadpoolctl would; a no-op
    where numpy's BLAS is not an OpenBLAS found loaded in this process)."""
    api = _openblas_threads()
    before = api[0]() if api else 1
    if before == 1:
        yield
        return
    api[1](1)
    try:
        yield
    finally:
        api[1](before)


@functools.lru_cache(maxsize=1)
def _openblas_threads() -> tuple[Callable[[], int], Callable[[int], None]] | None:
    """(get, set) of the thread count of the OpenBLAS loaded in this process (numpy's), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = list(dict.fromkeys(line.split()[-1] for line in maps if "openblas" in line.rsplit("/", 1)[-1].lower()))
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)  # only a library already loaded
        except OSError:
            continue
        for prefix, suffix in (("scipy_openblas", "64_"), ("scipy_openblas", ""), ("openblas", "64_"), ("openblas", "")):
            get, set_ = getattr(lib, f"{prefix}_get_num_threads{suffix}", None), getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            if get is not None and set_ is not None:
                get.restype, get.argtypes, set_.restype, set_.argtypes = ctypes.c_int, [], None, [ctypes.c_int]
                return get, set_
    return None


def _answer(compute: Callable[[], tuple]) -> tuple | ValueError:
    try:
        return compute()
    except ValueError as exc:
        return exc


def _curve_weights(n: int, reps: int, agg: str, seed: int) -> np.ndarray:
    trim = _CURVE_TRIM[agg]
    return _cached_weights(n, reps, trim, seed) if isinstance(seed, int) else _trimmed_mean_weights(n, reps, trim, np.random.default_rng(seed))


def _curve_points(
    steps_per_seed: Sequence[ArrayLike], values_per_seed: Sequence[ArrayLike], grid: ArrayLike | None, agg: str, reps: int, n_points: int
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int], np.ndarray | None, np.ndarray | None]:
    """`aggregate_curves` up to its band: the curve with the band still NaN, the seeds' values at
    the covered grid points sorted per point (None when there is nothing to bootstrap), and which
    grid points those are."""
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
        return (g, center, low, high, n), None, None

    covered = (g >= start) & (g <= stop)
    ys = np.sort(np.stack([np.interp(g[covered], s, v) for s, v in curves]), axis=0)  # (n_seeds, n_covered)
    cut = int(_CURVE_TRIM[agg] * n)
    center[covered] = ys[cut : n - cut].mean(axis=0)
    return (g, center, low, high, n), ys, covered
