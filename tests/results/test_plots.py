"""hpcrl.results.plots: the PNGs exist, are real images with content, and say what they show (n, CI)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib._pylab_helpers import Gcf
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.image import imread

from hpcrl.results import plots, stats

LONG = "lr=0.0001,ent_coef=0.01,num_envs=16,clip_range=0.2,gae_lambda=0.95 (a long setting label)"


def _curves(seeds_by_setting: dict[str, int]) -> dict[str, plots.Curve]:
    rng = np.random.default_rng(0)
    out = {}
    for k, (setting, n) in enumerate(seeds_by_setting.items()):
        steps = [np.sort(rng.uniform(0, 5e5, 60)) for _ in range(n)]
        values = [100 * (k + 1) * (1 - np.exp(-s / 1e5)) + rng.normal(0, 10, s.size) for s in steps]
        out[setting] = stats.aggregate_curves(steps, values, agg="iqm", reps=200, n_points=50)
    return out


def _finals(seeds_by_setting: dict[str, int]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {setting: rng.normal(100 * (k + 1), 30, n) for k, (setting, n) in enumerate(seeds_by_setting.items())}


SETTINGS = {"lr=0.001": 3, "lr=0.0003": 5, LONG: 4, "lr=0.01": 1}


def _assert_png(path: Path, min_width: int = 600, min_height: int = 300) -> np.ndarray:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = imread(path)
    height, width = image.shape[:2]
    assert width >= min_width and height >= min_height
    rgb = image[..., :3]
    assert rgb.std() > 0.05  # lines, text and bands, not a blank canvas
    assert (rgb < 0.5).mean() > 0.001  # some dark ink: axes, labels
    return image


def _legend_texts(fig: Figure) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def _bands(fig: Figure) -> int:
    return sum(isinstance(c, PolyCollection) for c in fig.axes[0].collections)


def _no_temp_files_left(directory: Path) -> bool:
    return all(not p.name.endswith(".tmp") for p in directory.iterdir())


def test_plot_curves_writes_a_png(tmp_path: Path) -> None:
    path = plots.plot_curves(_curves(SETTINGS), tmp_path / "plots" / "curves.png", "iqm")
    assert path == tmp_path / "plots" / "curves.png"
    image = _assert_png(path)
    assert _no_temp_files_left(path.parent)
    # The image grows to hold the legend with its long label instead of cropping it.
    assert image.shape[1] > 7.0 * 150


def test_curves_figure_lines_bands_labels() -> None:
    fig = plots.curves_figure(_curves(SETTINGS), "iqm")
    ax = fig.axes[0]
    assert len(ax.lines) == len(SETTINGS)
    assert _bands(fig) == 3  # the one-seed setting gets no band
    assert _legend_texts(fig) == ["lr=0.001 (n=3 seeds)", "lr=0.0003 (n=5 seeds)", f"{LONG} (n=4 seeds)", "lr=0.01 (n=1 seed)"]
    assert ax.get_title() == "IQM ± 95% bootstrap CI"
    assert ax.get_xlabel() == "environment steps" and ax.get_ylabel() == "episodic return"
    assert ax.xaxis.get_major_formatter()(2_500_000, 0) == "2.5M"


def test_legend_never_covers_the_data() -> None:
    fig = plots.curves_figure(_curves(SETTINGS), "mean")
    renderer = FigureCanvasAgg(fig).get_renderer()
    legend_box = fig.axes[0].get_legend().get_window_extent(renderer)
    assert legend_box.x0 >= fig.axes[0].get_window_extent(renderer).x1
    assert fig.get_tightbbox(renderer).x1 * fig.dpi >= legend_box.x1  # what bbox_inches="tight" keeps


def test_curves_single_setting_single_seed_and_missing_setting(tmp_path: Path) -> None:
    curves = _curves({"only seed": 1})
    curves["crashed"] = stats.aggregate_curves([], [])
    fig = plots.curves_figure(curves, "mean", title="custom title")
    assert _bands(fig) == 0
    assert _legend_texts(fig) == ["only seed (n=1 seed)", "crashed (n=0 seeds, no data)"]
    assert fig.axes[0].get_title() == "custom title"
    _assert_png(plots.plot_curves(curves, tmp_path / "one.png", "mean"))


def test_plot_final_intervals(tmp_path: Path) -> None:
    finals = _finals(SETTINGS) | {"crashed": np.empty(0)}
    rows = stats.summarize(finals, reps=200)
    fig = plots.final_intervals_figure(rows)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [f"{s} (n={n})" for s, n in SETTINGS.items()] + ["crashed (n=0, no runs)"]
    assert len(ax.patches) == len(SETTINGS)  # one interval bar per setting with runs
    assert len(ax.lines) == len(SETTINGS)  # one point marker each
    for line, row in zip(ax.lines, rows):
        assert line.get_xdata()[0] == pytest.approx(row["iqm"])
    lows, highs = [r["iqm_ci_low"] for r in rows[:-1]], [r["iqm_ci_high"] for r in rows[:-1]]
    assert ax.get_xlim()[0] < min(lows) and ax.get_xlim()[1] > max(highs)  # no bar ends on the frame
    assert ax.get_xlabel() == "final eval return"
    assert ax.get_title() == "IQM with 95% bootstrap CI"
    _assert_png(plots.plot_final_intervals(rows, tmp_path / "final.png"), min_height=200)
    with pytest.raises(ValueError, match="metric"):
        plots.final_intervals_figure(rows, metric="median")


def test_final_intervals_single_row_and_mean_metric() -> None:
    rows = stats.summarize({"lr=0.001": [200.0]}, reps=200)
    fig = plots.final_intervals_figure(rows, metric="mean")
    ax = fig.axes[0]
    assert ax.get_title() == "Mean with 95% bootstrap CI"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["lr=0.001 (n=1)"]
    assert ax.patches[0].get_width() == 0.0 and ax.lines[0].get_xdata()[0] == 200.0


def test_plot_performance_profile(tmp_path: Path) -> None:
    finals = _finals(SETTINGS) | {"crashed": np.empty(0)}
    fig = plots.performance_profile_figure(finals, reps=200)
    ax = fig.axes[0]
    drawn = [line for line in ax.lines if line.get_xdata().size]
    assert len(drawn) == len(SETTINGS)
    for line in drawn:  # default thresholds span every score: each profile runs from 1 down to 0
        assert line.get_ydata()[0] == 1.0 and line.get_ydata()[-1] == 0.0
    assert _bands(fig) == 3
    assert _legend_texts(fig)[-2:] == ["lr=0.01 (n=1 run)", "crashed (n=0 runs, no data)"]
    assert ax.get_ylabel() == "fraction of runs with score > τ"
    _assert_png(plots.plot_performance_profile(finals, tmp_path / "profile.png", reps=200))


def test_performance_profile_explicit_taus() -> None:
    fig = plots.performance_profile_figure({"a": [1.0, 2.0, 3.0, 4.0]}, taus=[0, 2, 5], reps=100)
    np.testing.assert_allclose(fig.axes[0].lines[0].get_ydata(), [1.0, 0.5, 0.0])


def test_nothing_to_plot_still_draws_a_labelled_figure() -> None:
    for fig in (plots.curves_figure({}, "mean"), plots.final_intervals_figure([]), plots.performance_profile_figure({})):
        FigureCanvasAgg(fig).draw()
        assert [t.get_text() for t in fig.axes[0].texts] == ["no data"]
        assert fig.axes[0].get_xlabel()


def test_failed_save_leaves_the_old_file_and_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "final.png"
    path.write_bytes(b"the previous complete image")

    def broken_savefig(self: Figure, f, **kwargs) -> None:
        f.write(b"\x89PNG half an image")
        raise OSError("disk full")

    monkeypatch.setattr(Figure, "savefig", broken_savefig)
    with pytest.raises(OSError, match="disk full"):
        plots.plot_final_intervals(stats.summarize({"b": [3.0]}, reps=50), path)
    assert path.read_bytes() == b"the previous complete image"
    assert _no_temp_files_left(tmp_path)


def test_plots_leave_pyplot_alone(tmp_path: Path) -> None:
    """Figures are never registered with pyplot: nothing leaks, and a notebook's figures are untouched."""
    before = Gcf.get_num_fig_managers()
    plots.plot_final_intervals(stats.summarize({"a": [1.0, 2.0]}, reps=50), tmp_path / "x.png")
    assert Gcf.get_num_fig_managers() == before


def _few_points(n_points: int) -> dict[str, plots.Curve]:
    rng = np.random.default_rng(2)
    grid = np.linspace(1000, 4000, n_points)
    steps = [grid] * 3
    return {"a": stats.aggregate_curves(steps, [rng.uniform(0, 1, n_points) for _ in steps], grid=grid, reps=100)}


def test_a_curve_through_few_evaluations_has_a_marker_at_each() -> None:
    """Issue 38 item 2: curves through 4 evaluations were drawn as bare lines; collect's 100-point training curves stay lines."""
    for n_points, marker in ((4, "o"), (plots.MARKED_POINTS, "o"), (100, "None")):
        fig = plots.curves_figure(_few_points(n_points), "iqm")
        (line,) = [line for line in fig.axes[0].lines if len(line.get_xdata())]
        assert line.get_marker() == marker and len(line.get_xdata()) == n_points


def test_the_narrow_version_of_a_figure_stacks_its_panels_with_the_legend_below(tmp_path: Path) -> None:
    """Issue 38 item 7: three panels side by side, shrunk to a phone's 390 pixels, had text a few pixels high.
    The narrow version has one panel a row and its legend under them; plot_* writes it beside the figure."""
    by_task = {task: _curves({"lr=0.001": 3, "lr=0.01": 2}) for task in ("CartPole-v1", "Acrobot-v1", "Pendulum-v1")}
    wide = plots.curves_by_task_figure(by_task, "iqm")
    assert len({round(ax.get_position().x0, 3) for ax in wide.axes if ax.get_visible()}) == 3
    fig = plots.curves_by_task_figure(by_task, "iqm", narrow=True)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 3 and len({round(ax.get_position().x0, 3) for ax in panels}) == 1
    renderer = FigureCanvasAgg(fig).get_renderer()
    assert fig.legends[0].get_window_extent(renderer).y1 <= min(ax.get_window_extent(renderer).y0 for ax in panels)
    path = plots.plot_curves_by_task(by_task, tmp_path / "curves.png", "iqm")
    narrow = plots.narrow_of(path)
    assert narrow == tmp_path / "narrow" / "curves.png"
    assert imread(narrow).shape[1] < imread(path).shape[1] / 1.8 and imread(narrow).shape[0] > imread(path).shape[0]
    one = plots.curves_figure(_curves(SETTINGS), "iqm", narrow=True)
    renderer = FigureCanvasAgg(one).get_renderer()
    assert one.axes[0].get_legend().get_window_extent(renderer).y1 < one.axes[0].get_window_extent(renderer).y0  # below the axes, not beside
    assert plots.narrow_of(plots.plot_final_intervals([], tmp_path / "final.png")) is None  # a figure without a narrow version
