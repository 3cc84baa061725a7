"""hpcrl.results.stats against rliable's definitions (Agarwal et al. 2021), plus the edge cases a sweep hits.

Reference values below were computed once with rliable 1.2.0 (arch 7.2.0, numpy 2.4.6, pandas 2.x)
in a separate virtualenv, because hpcrl must not depend on rliable:

    import numpy as np
    from rliable import library as rly, metrics
    # X, Y, F, TAUS exactly as defined in this file
    for s in (X, F):
        print([float(f(s)) for f in (metrics.aggregate_mean, metrics.aggregate_median,
                                     metrics.aggregate_iqm)])
    print(metrics.aggregate_optimality_gap(X, 1.0), metrics.aggregate_optimality_gap(F, 500.0))
    print(metrics.probability_of_improvement(X, Y), metrics.probability_of_improvement(Y, X))
    print(rly.score_distributions(X, TAUS))
    np.random.seed(0)  # rliable's StratifiedBootstrap draws from numpy's global RNG
    for s in (X, F):
        for f in (metrics.aggregate_mean, metrics.aggregate_iqm):
            print(rly.get_interval_estimates({"k": s}, lambda x: np.array([f(x)]), reps=50000)[1]["k"])
    print(rly.get_interval_estimates(
        {"k": [X, Y]}, lambda x, y: np.array([metrics.probability_of_improvement(x, y)]),
        reps=20000)[1]["k"])
    print({n: metrics.aggregate_iqm((np.arange(n, dtype=float) ** 2)[:, None]) for n in range(1, 14)})

Point estimates must match to float precision. Bootstrap intervals cannot match digit for digit
(rliable draws from numpy's global RandomState, hpcrl from a seeded Generator), so they are
compared at the same number of repetitions within 1% of the data's range; repeating rliable with
other seeds moved its bounds by at most 0.5% of the range.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest

from hpcrl.results import stats

# Three tasks; ties inside X (0.45, 0.80), between X and Y, and with the thresholds in TAUS.
X = np.array(
    [
        [0.10, 0.80, 1.20],
        [0.45, 0.80, 0.95],
        [0.30, 1.10, 0.40],
        [0.90, 0.25, 1.50],
        [0.45, 0.60, 0.70],
    ]
)
Y = np.array(
    [
        [0.20, 0.80, 1.00],
        [0.30, 0.50, 0.90],
        [0.45, 0.70, 0.40],
        [0.10, 0.90, 1.10],
        [0.60, 0.30, 0.65],
        [0.25, 0.80, 1.20],
    ]
)
# One task, CartPole-like final returns with a ceiling at 500: hpcrl's usual case.
F = np.array([212.0, 487.0, 500.0, 153.0, 500.0, 463.0, 301.0, 500.0, 98.0, 420.0])[:, None]
TAUS = [0.0, 0.3, 0.45, 0.8, 1.0, 1.5]

RLIABLE_POINTS = {
    "X": {"mean": 0.7000000000000001, "median": 0.7100000000000001, "iqm": 0.6722222222222223},
    "F": {"mean": 363.4, "median": 363.4, "iqm": 397.1666666666667},
}
RLIABLE_OPTIMALITY_GAP = {"X": 0.3533333333333334, "F": 136.60000000000002}  # gamma 1.0 and 500.0
RLIABLE_POI = {"XY": 0.5777777777777777, "YX": 0.4222222222222222}
RLIABLE_PROFILE_X = [1.0, 0.8, 0.6, 0.3333333333333333, 0.2, 0.0]
RLIABLE_CI = {  # reps=50000
    ("X", "mean"): (0.54333333, 0.85666667),
    ("X", "iqm"): (0.48888889, 0.86666667),
    ("F", "mean"): (266.5, 451.3),
    ("F", "iqm"): (246.83333333, 487.66666667),
}
RLIABLE_POI_CI = (0.37222222, 0.77777778)  # reps=20000
# IQM of the column 0, 1, 4, ..., (N-1)^2 for N = 1..13 runs.
RLIABLE_IQM_OF_SQUARES = {
    1: 0.0, 2: 0.5, 3: 1.6666666666666667, 4: 2.5, 5: 4.666666666666667, 6: 7.5, 7: 11.0, 8: 13.5,
    9: 18.0, 10: 23.166666666666668, 11: 29.0, 12: 33.166666666666664, 13: 40.0,
}
MATRICES = {"X": X, "F": F}
STATISTICS = {"mean": stats.mean, "median": stats.median, "iqm": stats.iqm}


@pytest.mark.parametrize("name", ["X", "F"])
@pytest.mark.parametrize("statistic", ["mean", "median", "iqm"])
def test_point_estimates_match_rliable(name: str, statistic: str) -> None:
    assert STATISTICS[statistic](MATRICES[name]) == pytest.approx(RLIABLE_POINTS[name][statistic], rel=1e-12)


def test_optimality_gap_matches_rliable() -> None:
    assert stats.optimality_gap(X, 1.0) == pytest.approx(RLIABLE_OPTIMALITY_GAP["X"], rel=1e-12)
    assert stats.optimality_gap(F, 500.0) == pytest.approx(RLIABLE_OPTIMALITY_GAP["F"], rel=1e-12)


def test_probability_of_improvement_matches_rliable() -> None:
    assert stats.probability_of_improvement(X, Y) == pytest.approx(RLIABLE_POI["XY"], rel=1e-12)
    assert stats.probability_of_improvement(Y, X) == pytest.approx(RLIABLE_POI["YX"], rel=1e-12)


def test_performance_profile_matches_rliable_and_is_strict() -> None:
    # TAUS holds 0.45 and 0.8, which X scores exactly: those runs must not count as "above".
    np.testing.assert_allclose(stats.performance_profile(X, TAUS), RLIABLE_PROFILE_X, rtol=1e-12)


@pytest.mark.parametrize(("name", "statistic"), list(RLIABLE_CI))
def test_bootstrap_ci_matches_rliable(name: str, statistic: str) -> None:
    scores = MATRICES[name]
    tol = 0.01 * (scores.max() - scores.min())
    low, high = stats.stratified_bootstrap_ci(scores, STATISTICS[statistic], reps=50000)
    ref_low, ref_high = RLIABLE_CI[(name, statistic)]
    assert low == pytest.approx(ref_low, abs=tol)
    assert high == pytest.approx(ref_high, abs=tol)


def test_probability_of_improvement_ci_matches_rliable() -> None:
    low, high = stats.probability_of_improvement_ci(X, Y, reps=20000)
    assert low == pytest.approx(RLIABLE_POI_CI[0], abs=0.01)
    assert high == pytest.approx(RLIABLE_POI_CI[1], abs=0.01)


@pytest.mark.slow
def test_live_cross_check_with_rliable() -> None:
    """Same definitions on fresh matrices, when rliable happens to be installed (never required)."""
    metrics = pytest.importorskip("rliable.metrics")
    library = pytest.importorskip("rliable.library")
    rng = np.random.default_rng(7)
    for shape in [(1, 1), (2, 1), (7, 1), (10, 3), (13, 4)]:
        a = rng.integers(0, 6, size=shape).astype(float)  # small integers: plenty of ties
        b = rng.integers(0, 6, size=(shape[0] + 2, shape[1])).astype(float)
        assert stats.mean(a) == pytest.approx(metrics.aggregate_mean(a))
        assert stats.median(a) == pytest.approx(metrics.aggregate_median(a))
        assert stats.iqm(a) == pytest.approx(metrics.aggregate_iqm(a))
        assert stats.optimality_gap(a, 3.0) == pytest.approx(metrics.aggregate_optimality_gap(a, 3.0))
        assert stats.probability_of_improvement(a, b) == pytest.approx(metrics.probability_of_improvement(a, b))
        np.testing.assert_allclose(stats.performance_profile(a, [0, 2.5, 3, 5]), library.score_distributions(a, [0, 2.5, 3, 5]))


@pytest.mark.parametrize("n", list(RLIABLE_IQM_OF_SQUARES))
def test_iqm_trims_like_rliable_for_every_run_count(n: int) -> None:
    """rliable (scipy's trim_mean) cuts int(0.25 * N) from each end: check every N mod 4."""
    assert stats.iqm(np.arange(n, dtype=float) ** 2) == pytest.approx(RLIABLE_IQM_OF_SQUARES[n], rel=1e-12)


def test_probability_of_improvement_ties_and_symmetry() -> None:
    assert stats.probability_of_improvement(X, X) == 0.5
    assert stats.probability_of_improvement(np.full(4, 3.0), np.full(2, 3.0)) == 0.5
    assert stats.probability_of_improvement(X, Y) + stats.probability_of_improvement(Y, X) == pytest.approx(1.0)
    assert stats.probability_of_improvement([2.0, 3.0], [1.0]) == 1.0
    with pytest.raises(ValueError, match="tasks"):
        stats.probability_of_improvement(X, Y[:, :2])


def test_statistics_accept_batches_of_matrices() -> None:
    """The bootstrap relies on every statistic reducing only the last two axes."""
    batch = np.stack([X, X[::-1] * 2, X + 1])
    for statistic in (stats.mean, stats.median, stats.iqm, stats.optimality_gap):
        np.testing.assert_allclose(statistic(batch), [statistic(m) for m in batch])
    np.testing.assert_allclose(stats.performance_profile(batch, TAUS), [stats.performance_profile(m, TAUS) for m in batch])
    np.testing.assert_allclose(stats.probability_of_improvement(batch, Y), [stats.probability_of_improvement(m, Y) for m in batch])


def test_one_dimensional_scores_are_one_task() -> None:
    assert stats.iqm(F.ravel()) == stats.iqm(F)
    assert stats.stratified_bootstrap_ci(F.ravel(), stats.mean) == stats.stratified_bootstrap_ci(F, stats.mean)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_scores_are_rejected(bad: float) -> None:
    scores = F.copy()
    scores[3, 0] = bad
    for call in (
        lambda: stats.iqm(scores),
        lambda: stats.stratified_bootstrap_ci(scores, stats.mean),
        lambda: stats.probability_of_improvement(scores, F),
    ):
        with pytest.raises(ValueError, match="NaN or inf"):
            call()
    with pytest.raises(ValueError, match="^lr=0.1: scores contain NaN or inf"):
        stats.summarize({"lr=0.001": F, "lr=0.1": scores})


@pytest.mark.parametrize("name", ["X", "F"])
@pytest.mark.parametrize("statistic", ["mean", "median", "iqm"])
def test_ci_contains_point_estimate(name: str, statistic: str) -> None:
    scores = MATRICES[name]
    low, high = stats.stratified_bootstrap_ci(scores, STATISTICS[statistic])
    assert low <= STATISTICS[statistic](scores) <= high
    assert low < high


def test_bootstrap_is_deterministic_for_a_seed() -> None:
    first = stats.stratified_bootstrap_ci(F, stats.iqm, reps=500, seed=3)
    assert stats.stratified_bootstrap_ci(F, stats.iqm, reps=500, seed=3) == first
    assert stats.stratified_bootstrap_ci(F, stats.iqm, reps=500, seed=4) != first
    assert stats.probability_of_improvement_ci(X, Y, reps=500, seed=3) == stats.probability_of_improvement_ci(X, Y, reps=500, seed=3)


def test_bootstrap_resamples_within_each_task() -> None:
    """Stratified as in rliable: runs are drawn per task, not as whole rows across tasks.

    Both tasks hold the same runs in the same rows, so resampling whole rows would keep every row
    equal across tasks; independent draws per task break that pairing in almost every resample.
    """
    scores = np.column_stack([np.arange(6.0), np.arange(6.0)])
    low, high = stats.stratified_bootstrap_ci(scores, lambda s: (s[..., 0] == s[..., 1]).mean(axis=-1))
    assert high < 1.0


def test_confidence_level_widens_the_interval() -> None:
    low90, high90 = stats.stratified_bootstrap_ci(F, stats.mean, confidence=0.90)
    low99, high99 = stats.stratified_bootstrap_ci(F, stats.mean, confidence=0.99)
    assert low99 < low90 < high90 < high99
    with pytest.raises(ValueError, match="confidence"):
        stats.stratified_bootstrap_ci(F, stats.mean, confidence=95)


def test_bootstrap_is_vectorised_and_fast() -> None:
    scores = np.random.default_rng(0).normal(size=(10, 1))
    best = min(_timed(lambda: stats.stratified_bootstrap_ci(scores, stats.iqm, reps=2000)) for _ in range(3))
    assert best < 0.1


def _timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def test_vector_statistic_gives_vector_bounds() -> None:
    low, high = stats.performance_profile_ci(X, TAUS)
    profile = stats.performance_profile(X, TAUS)
    assert low.shape == high.shape == profile.shape == (len(TAUS),)
    assert np.all(low <= profile) and np.all(profile <= high)
    assert low[0] == high[0] == 1.0 and low[-1] == high[-1] == 0.0  # below / above every score


def test_probability_of_improvement_ci_contains_point_with_unequal_runs() -> None:
    low, high = stats.probability_of_improvement_ci(X, Y[:4])
    assert 0.0 <= low <= stats.probability_of_improvement(X, Y[:4]) <= high <= 1.0


SUMMARY_KEYS = ["setting", "n", "mean", "median", "iqm", "std", "mean_ci_low", "mean_ci_high", "iqm_ci_low", "iqm_ci_high"]


def test_summarize_rows() -> None:
    rows = stats.summarize({"lr=0.001": F, "lr=0.01": F.ravel()[:4] - 100})
    assert [r["setting"] for r in rows] == ["lr=0.001", "lr=0.01"]
    row = rows[0]
    assert list(row) == SUMMARY_KEYS
    assert row["n"] == 10
    assert row["mean"] == pytest.approx(RLIABLE_POINTS["F"]["mean"])
    assert row["iqm"] == pytest.approx(RLIABLE_POINTS["F"]["iqm"])
    assert row["std"] == pytest.approx(np.std(F, ddof=1))
    assert (row["mean_ci_low"], row["mean_ci_high"]) == stats.stratified_bootstrap_ci(F, stats.mean)
    assert (row["iqm_ci_low"], row["iqm_ci_high"]) == stats.stratified_bootstrap_ci(F, stats.iqm)
    assert rows[1]["n"] == 4


def test_summarize_one_run_gives_point_intervals_and_no_std() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (row,) = stats.summarize({"seed 0 only": [321.0]})
    assert row["n"] == 1
    assert row["mean"] == row["median"] == row["iqm"] == 321.0
    assert row["mean_ci_low"] == row["mean_ci_high"] == row["iqm_ci_low"] == row["iqm_ci_high"] == 321.0
    assert np.isnan(row["std"])


def test_summarize_no_runs_is_all_nan_without_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (row,) = stats.summarize({"all crashed": np.empty((0, 1))})
    assert row["n"] == 0
    assert all(np.isnan(row[k]) for k in SUMMARY_KEYS[2:])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isnan(stats.probability_of_improvement_ci(np.empty(0), F)).all()
        assert np.isnan(stats.performance_profile(np.empty(0), TAUS)).all()


# --- aggregate_curves -------------------------------------------------------------------------


def _line(steps: np.ndarray, offset: float) -> np.ndarray:
    return 2.0 * steps + offset


def test_aggregate_curves_stops_at_the_shortest_seed() -> None:
    steps = [np.arange(0, 1001, 50.0), np.arange(0, 601, 30.0), np.arange(10, 801, 70.0)]
    values = [_line(s, k) for k, s in enumerate(steps)]
    grid, center, low, high, n = stats.aggregate_curves(steps, values)
    assert n == 3
    assert grid.size == 100
    assert grid[0] == 10.0  # the latest first step: no seed is extrapolated backwards either
    assert grid[-1] == 600.0  # the shortest seed's last step: its tail is never invented
    # Linear curves interpolate exactly, so the mean of offsets 0, 1, 2 is known everywhere.
    np.testing.assert_allclose(center, 2.0 * grid + 1.0)
    # The band reflects the spread of the seeds (offsets 0..2) and never leaves it.
    assert np.all(2.0 * grid - 1e-9 <= low) and np.all(low < center) and np.all(center < high)
    assert np.all(high <= 2.0 * grid + 2.0 + 1e-9)


def test_aggregate_curves_explicit_grid_outside_coverage_is_nan() -> None:
    steps = [np.arange(0, 101, 10.0), np.arange(0, 81, 20.0)]
    grid, center, low, high, n = stats.aggregate_curves(steps, [_line(s, 0) for s in steps], grid=[0, 40, 80, 100])
    np.testing.assert_array_equal(grid, [0, 40, 80, 100])
    np.testing.assert_allclose(center[:3], [0, 80, 160])
    assert np.isnan(center[3]) and np.isnan(low[3]) and np.isnan(high[3])


def test_aggregate_curves_iqm_center_is_iqm_of_each_grid_point() -> None:
    rng = np.random.default_rng(1)
    steps = [np.sort(rng.uniform(0, 1000, 40)) for _ in range(7)]
    values = [rng.normal(size=40) for _ in range(7)]
    grid, center, _, _, n = stats.aggregate_curves(steps, values, agg="iqm", n_points=25)
    at_grid = np.array([np.interp(grid, s, v) for s, v in zip(steps, values)])
    np.testing.assert_allclose(center, [stats.iqm(at_grid[:, j]) for j in range(grid.size)])


@pytest.mark.parametrize("agg", ["mean", "iqm"])
def test_aggregate_curves_band_is_the_stratified_bootstrap_at_each_point(agg: str) -> None:
    """Same distribution as a per-point bootstrap, checked at a point within Monte Carlo error."""
    seeds = F.ravel()
    steps = [np.array([0.0, 10.0])] * seeds.size
    _, center, low, high, _ = stats.aggregate_curves(steps, [np.array([s, s]) for s in seeds], grid=[5.0], agg=agg, reps=50000)
    ref_low, ref_high = stats.stratified_bootstrap_ci(seeds, STATISTICS[agg], reps=50000, seed=1)
    assert center[0] == pytest.approx(STATISTICS[agg](seeds))
    tol = 0.01 * (seeds.max() - seeds.min())
    assert low[0] == pytest.approx(ref_low, abs=tol)
    assert high[0] == pytest.approx(ref_high, abs=tol)


@pytest.mark.parametrize("trim", [0.0, 0.25])
def test_trimmed_mean_weights_reproduce_each_resample(trim: float) -> None:
    """The matrix-product shortcut equals sorting each resample of positions and trimming it."""
    n, reps = 9, 50
    values = np.sort(np.random.default_rng(5).normal(size=n))
    weights = stats._trimmed_mean_weights(n, reps, trim, np.random.default_rng(11))
    positions = np.random.default_rng(11).integers(0, n, size=(reps, n))
    cut = int(trim * n)
    expected = [np.sort(values[p])[cut : n - cut].mean() for p in positions]
    np.testing.assert_allclose(weights @ values, expected)


def test_aggregate_curves_resumed_logs_and_nan_rows() -> None:
    """A resumed run re-logs steps (the later row wins); rows without a finished episode are NaN."""
    steps = [np.array([0.0, 10, 20, 10, 20, 30, 40]), np.array([0.0, 20, 30, 40])]
    values = [np.array([0.0, 99, 99, 10, 20, np.nan, 40]), np.array([0.0, 20, 30, 40])]
    grid, center, *_ = stats.aggregate_curves(steps, values, grid=[10.0, 20.0, 30.0])
    np.testing.assert_allclose(center, [10.0, 20.0, 30.0])


def test_aggregate_curves_one_seed_has_a_zero_width_band() -> None:
    s = np.arange(0, 100, 10.0)
    grid, center, low, high, n = stats.aggregate_curves([s], [np.sqrt(s)], agg="iqm")
    assert n == 1
    np.testing.assert_array_equal(low, center)
    np.testing.assert_array_equal(high, center)


def test_aggregate_curves_no_seeds_and_empty_seeds() -> None:
    grid, center, low, high, n = stats.aggregate_curves([], [])
    assert n == 0 and grid.size == center.size == low.size == high.size == 0
    steps, values = [np.array([0.0, 1.0]), np.array([])], [np.array([np.nan, np.nan]), np.array([])]
    grid, center, *_, n = stats.aggregate_curves(steps, values, grid=[0.5])
    assert n == 0 and np.isnan(center).all()


def test_aggregate_curves_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="agg"):
        stats.aggregate_curves([np.arange(3.0)], [np.arange(3.0)], agg="max")
    with pytest.raises(ValueError, match="overlap"):
        stats.aggregate_curves([np.arange(3.0), np.arange(5.0, 8.0)], [np.arange(3.0)] * 2)
    with pytest.raises(ValueError, match="steps but"):
        stats.aggregate_curves([np.arange(3.0)], [np.arange(4.0)])


# ------------------------------------------------------------------------------------------------
# Issue 17: the fast paths of a 1,000-setting collect give numpy's numbers, float for float.


def _percentile_cases() -> list[tuple[np.ndarray, float]]:
    rng = np.random.default_rng(17)
    cases = []
    for i in range(60):
        n, p = int(rng.choice([1000, 1999, 2000, 4000])), int(rng.choice([16, 40, 100, 300]))
        kind = i % 6
        if kind == 0:
            s = rng.normal(size=(n, p))
        elif kind == 1:
            s = np.round(rng.normal(size=(n, p)), 1)  # many ties
        elif kind == 2:
            s = rng.integers(0, 3, size=(n, p)).astype(float)  # lumpy: the bootstrap of two seeds
        elif kind == 3:
            s = rng.exponential(size=(n, p)) * 1e6  # skewed
        elif kind == 4:
            s = rng.normal(size=(n, p))
            s[rng.integers(0, n), rng.integers(0, p)] = [np.nan, np.inf, -np.inf][i % 3]
        else:  # what aggregate_curves computes: trimmed-mean weights of few seeds x sorted curves
            seeds = int(rng.integers(1, 12))
            s = stats._trimmed_mean_weights(seeds, n, 0.25, np.random.default_rng(0)) @ np.sort(rng.normal(size=(seeds, p)), axis=0)
        cases.append((s, float(rng.choice([0.95, 0.9, 0.99, 0.5, 0.999]))))
    return cases


def test_percentile_interval_is_numpys_percentile_float_for_float(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tail selection finds the same order statistics and interpolates as numpy does, NaN and
    inf left to numpy; and it is really the path taken (numpy sees few columns of a plain matrix)."""
    percentile = np.percentile
    seen = []
    monkeypatch.setattr(stats.np, "percentile", lambda a, *args, **kw: seen.append(np.shape(a)) or percentile(a, *args, **kw))
    for s, confidence in _percentile_cases():
        alpha = 100.0 * (1.0 - confidence) / 2.0
        with np.errstate(invalid="ignore"):
            want = percentile(s, [alpha, 100.0 - alpha], axis=0)
        low, high = stats._percentile_interval(s, confidence)
        assert np.array_equal(low, want[0], equal_nan=True) and np.array_equal(high, want[1], equal_nan=True)
    seen.clear()
    s = np.random.default_rng(1).normal(size=(2000, 100))
    stats._percentile_interval(s, 0.95)
    assert sum(shape[1] for shape in seen if len(shape) == 2) <= 10, seen


def test_summarize_gives_each_setting_its_own_stratified_bootstrap() -> None:
    """summarize takes the percentiles of all settings at once; each row is still exactly what
    stratified_bootstrap_ci gives that setting alone (seeds, shapes and ties vary)."""
    rng = np.random.default_rng(3)
    scores = {f"s{i}": np.round(rng.normal(100, 30, size=(int(rng.integers(0, 12)), int(rng.choice([1, 1, 3])))), i % 3) for i in range(40)}
    for row in stats.summarize(scores):
        a = np.asarray(scores[row["setting"]], dtype=float)
        for name, fn in (("mean", stats.mean), ("iqm", stats.iqm)):
            low, high = stats.stratified_bootstrap_ci(a, fn)
            assert np.array_equal([row[f"{name}_ci_low"], row[f"{name}_ci_high"]], [low, high], equal_nan=True)
            assert type(row[f"{name}_ci_low"]) is float


def test_cached_draws_are_the_fresh_ones_and_read_only() -> None:
    weights = stats._cached_weights(7, 500, 0.25, 0)
    assert np.array_equal(weights, stats._trimmed_mean_weights(7, 500, 0.25, np.random.default_rng(0)))
    idx = stats._first_resample_indices(5, 2, 300, 0)
    assert np.array_equal(idx, np.random.default_rng(0).integers(0, 5, size=(300, 5, 2)))
    with pytest.raises(ValueError):
        weights[0, 0] = 1.0
    with pytest.raises(ValueError):
        idx[0, 0, 0] = 1


def test_clean_curve_shortcut_for_sorted_logs_is_the_unique_path() -> None:
    rng = np.random.default_rng(5)
    steps = np.cumsum(rng.integers(1, 5, size=50)).astype(float)
    values = rng.normal(size=50)
    s, v = stats._clean_curve(steps, values)
    unique, first = np.unique(steps[::-1], return_index=True)
    assert np.array_equal(s, unique) and np.array_equal(v, values[::-1][first])
    signed_zero = np.array([-0.0, 0.0, 1.0])  # equal steps: not strictly increasing, so the last one wins
    s, v = stats._clean_curve(signed_zero, np.array([1.0, 2.0, 3.0]))
    assert list(v) == [2.0, 3.0]


def test_aggregate_curves_many_is_aggregate_curves_of_each() -> None:
    """Stacking the matmuls of many curves (more than one stack of a shape, several shapes, one
    seed, seeds that do not overlap, an empty setting) changes no float and no error."""
    rng = np.random.default_rng(9)
    items = []
    for i in range(80):
        seeds = [1, 2, 3, 10, 10, 10][i % 6]
        steps = [np.sort(rng.uniform(0, 1e5, size=int(rng.integers(20, 60)))) + (5e5 if i % 23 == 0 and k == 0 else 0) for k in range(seeds)]
        items.append((steps, [rng.normal(size=s.size) * 100 for s in steps]))
    items.append(([], []))
    for agg in ("mean", "iqm"):
        many = stats.aggregate_curves_many(items, agg=agg)
        for (steps, values), got in zip(items, many):
            try:
                want = stats.aggregate_curves(steps, values, agg=agg)
            except ValueError as exc:
                assert isinstance(got, ValueError) and str(got) == str(exc)
                continue
            assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(got[:4], want[:4])) and got[4] == want[4]
