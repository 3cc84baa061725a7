"""Time the statistics of `hpcrl collect` at the scale issue 6 targets: 1000 runs in <= 5 s.

The aggregate stage runs once per experiment on one node after the evaluation array; if it took
minutes for a large sweep, people would skip it and go back to eyeballing single seeds. This
times only `summarize` and `aggregate_curves` (reading CSVs and evaluating checkpoints excluded)
on synthetic data shaped like a real sweep: settings x seeds, every seed logging its training
curve at its own steps and stopping at its own last step, as preempted and resumed jobs do.
Beside it, in the same run, the reference: hpcrl/stats.py of the commit before issue 17
(REFERENCE_COMMIT), whose every number the current module must reproduce (checked here too).

    PYTHONPATH=. python benchmarks/stats_scale.py [--settings 100] [--seeds 10] [--points 200] [--agg iqm]
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _args  # benchmarks/_args.py: the script's own folder is first on sys.path
import numpy as np

from hpcrl.results import stats

TARGET_S = 5.0
REFERENCE_COMMIT = "eefd824"
"""The last commit before issue 17 (collect over 10,000 runs)."""


def reference_stats():
    """hpcrl/stats.py of REFERENCE_COMMIT, imported as a module of its own."""
    text = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent.parent), "show", f"{REFERENCE_COMMIT}:hpcrl/stats.py"], capture_output=True, text=True, check=True).stdout
    with tempfile.TemporaryDirectory() as folder:  # the file is read once, as the module is made
        path = Path(folder) / "stats_before.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location("stats_before", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["stats_before"] = module
        spec.loader.exec_module(module)
    return module


def timed(module, finals, curves, agg: str, repeats: int) -> tuple[float, float, float, list, list]:
    """(total, summarize, curves) seconds, best of `repeats`, and the last results."""
    timings = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        summary = module.summarize(finals)
        t1 = time.perf_counter()
        bands = [module.aggregate_curves(steps, values, agg=agg) for steps, values in curves.values()]
        t2 = time.perf_counter()
        timings.append((t2 - t0, t1 - t0, t2 - t1))
    return (*min(timings), summary, bands)


def synthetic_sweep(settings: int, seeds: int, points: int, rng: np.random.Generator):
    """Final scores and training curves for every (setting, seed), with uneven logging steps."""
    finals: dict[str, np.ndarray] = {}
    curves: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
    for k in range(settings):
        name = f"#{k} lr={10 ** -rng.uniform(2, 5):.2e},ent_coef={rng.uniform(0, 0.05):.3f}"
        skill = rng.uniform(100, 500)
        finals[name] = rng.normal(skill, 50, size=(seeds, 1))
        steps = [np.sort(rng.uniform(0, rng.uniform(0.9e6, 1e6), size=points)) for _ in range(seeds)]
        curves[name] = (steps, [skill * (1 - np.exp(-s / 2e5)) + rng.normal(0, 20, s.size) for s in steps])
    return finals, curves


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", type=_args.positive_integer, default=100)
    parser.add_argument("--seeds", type=_args.positive_integer, default=10)
    parser.add_argument("--points", type=_args.positive_integer, default=200, help="logged points per training curve")
    parser.add_argument("--agg", choices=("mean", "iqm"), default="iqm")
    parser.add_argument("--repeats", type=_args.positive_integer, default=3, help="timed repetitions; the best is reported")
    args = parser.parse_args()

    finals, curves = synthetic_sweep(args.settings, args.seeds, args.points, np.random.default_rng(0))
    runs = args.settings * args.seeds
    shape = f"{args.settings} settings x {args.seeds} seeds, {args.points}-point curves, agg={args.agg}"
    print(f"{runs} runs ({shape}, 2000 bootstrap reps; best of {args.repeats})")
    print(f"  {'':36} {'summarize':>10} {'curves':>8} {'total':>8}")
    results = {}
    for what, module in ((f"reference: stats.py at {REFERENCE_COMMIT}", reference_stats()), ("hpcrl.results.stats", stats)):
        total, t_summary, t_curves, summary, bands = timed(module, finals, curves, args.agg, args.repeats)
        results[what] = (summary, bands)
        print(f"  {what:36} {t_summary:>9.3f}s {t_curves:>7.3f}s {total:>7.3f}s")
    (ref_summary, ref_bands), (summary, bands) = results.values()
    same = summary == ref_summary and all(all(np.array_equal(a, b, equal_nan=True) for a, b in zip(x, y)) for x, y in zip(bands, ref_bands))
    verdict = "met" if total <= TARGET_S else "MISSED"
    print(f"  numbers: {'identical to the reference' if same else 'DIFFERENT from the reference'}; target <= {TARGET_S:.0f} s: {verdict}")


if __name__ == "__main__":
    main()
