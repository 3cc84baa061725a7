"""`hpcrl compare` says what makes a join unequal (issue 38, point 6): different training budgets and
different numbers of seeds are one line each; a P(X > Y) interval from too few seeds, or one every
resample gives, is not shown as certainty; a curve of one point is visible."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from test_comparisons import run_cli, single_experiment

from hpcrl.results import plots, stats


def test_compare_names_different_budgets_and_seeds_in_one_line_each(tmp_path: Path) -> None:
    """100k steps and 3 seeds against 20k steps and 2 seeds: before, the tables pooled them without a word,
    and P(X > Y) read `1 [1, 1]`."""
    long = single_experiment(tmp_path, "long", "ppo", ["CartPole-v1"], {"sweep": {"seeds": [0, 1, 2], "grid": {"train.total_steps": [100_000]}}})
    short = single_experiment(tmp_path, "short", "a2c", ["CartPole-v1"], {"sweep": {"seeds": [0, 1], "grid": {"train.total_steps": [20_000]}}})
    code, out, err = run_cli("compare", str(long), str(short), "-o", str(tmp_path / "cmp"))
    assert code == 0, err
    lines = out.splitlines()
    assert lines.count("different training budgets (long: 100,000 steps; short: 20,000 steps): each score is taken at the end of its own budget") == 1, out
    assert lines.count("different numbers of seeds (long: 3; short: 2): intervals and P(X > Y) rest on 2 seeds where one has fewer") == 1, out
    html = (tmp_path / "cmp" / "report.html").read_text()
    assert "different training budgets" in html and "different numbers of seeds" in html
    # 3 seeds that all lose to 2: the bootstrap's `0 [0, 0]` claimed a certainty 3 vs 2 seeds cannot give
    assert "1 [1, 1]" not in out and "0 [0, 0]" not in out
    assert "1 (no CI: 2 vs 3 seeds)" in out and "0 (no CI: 3 vs 2 seeds)" in out, out
    rows = {(r["setting_x"], r["setting_y"]): r for r in csv.DictReader((tmp_path / "cmp" / "improvement.csv").open())}
    assert rows["short", "long"] == {"setting_x": "short", "setting_y": "long", "p_x_better": "1", "ci_low": "", "ci_high": "", "no_ci": "2 vs 3 seeds"}
    assert "1 (no CI: 2 vs 3 seeds)" in html and "No CI where a side has fewer than 3 seeds, or where every bootstrap resample gives the same value" in html


def test_compare_of_equal_experiments_says_nothing_of_the_kind(tmp_path: Path) -> None:
    ours = single_experiment(tmp_path, "ours", "ppo", ["CartPole-v1"])
    again = single_experiment(tmp_path, "again", "ppo", ["CartPole-v1"])
    code, out, err = run_cli("compare", str(ours), str(again), "-o", str(tmp_path / "cmp"))
    assert code == 0, err
    assert "different training budgets" not in out and "different numbers of seeds" not in out


def test_an_interval_is_withheld_only_where_it_says_nothing() -> None:
    assert stats.interval_withheld(3, 2, 1.0, 1.0) == "3 vs 2 seeds"
    assert stats.interval_withheld(5, 5, 1.0, 1.0) == "no spread" and stats.interval_withheld(4, 1, 1.0, 1.0) == "4 vs 1 seed"
    assert stats.interval_withheld(5, 5, 0.4, 0.9) == "" and stats.interval_withheld(3, 3, 0.2, 0.7) == ""


def test_a_curve_of_one_point_is_drawn_as_a_marker() -> None:
    """An experiment with one evaluation: the line through one point was drawn, and invisible."""
    one = (np.array([1000.0]), np.array([5.0]), np.array([4.0]), np.array([6.0]), 2)
    many = (np.linspace(0, 1000, 100), np.ones(100), np.zeros(100), np.full(100, 2.0), 2)
    fig = plots.curves_figure({"short": one, "long": many}, "iqm")
    lines = {line.get_label().split(" (")[0]: line for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")}
    assert lines["short"].get_marker() == "o" and lines["long"].get_marker() in ("None", None, "")
    assert len(fig.axes[0].collections) == 2  # the one point's interval (a bar) and the long curve's band
