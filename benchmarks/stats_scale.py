"""Time the statistics of `hpcrl collect` at the scale issue 6 targets: 1000 runs in <= 5 s.

The aggregate stage runs once per experiment on one node after the evaluation array; if it took
minutes for a large sweep, people would skip it and go back to eyeballing single seeds. This
times only `summarize` and `aggregate_curves` (reading CSVs and evaluating checkpoints excluded)
on synthetic data shaped like a real sweep: settings x seeds, every seed logging its training
curve at its own steps and stopping at its own last step, as preempted and resumed jobs do.

    PYTHONPATH=. python benchmarks/stats_scale.py [--settings 100] [--seeds 10] [--points 200] [--agg iqm]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from hpcrl.stats import aggregate_curves, summarize

TARGET_S = 5.0


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
    parser.add_argument("--settings", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--points", type=int, default=200, help="logged points per training curve")
    parser.add_argument("--agg", choices=("mean", "iqm"), default="iqm")
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions; the best is reported")
    args = parser.parse_args()

    finals, curves = synthetic_sweep(args.settings, args.seeds, args.points, np.random.default_rng(0))
    timings = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        summarize(finals)
        t1 = time.perf_counter()
        for steps, values in curves.values():
            aggregate_curves(steps, values, agg=args.agg)
        t2 = time.perf_counter()
        timings.append((t2 - t0, t1 - t0, t2 - t1))
    total, t_summary, t_curves = min(timings)
    runs = args.settings * args.seeds
    shape = f"{args.settings} settings x {args.seeds} seeds, {args.points}-point curves, agg={args.agg}"
    print(f"{runs} runs ({shape}, 2000 bootstrap reps)")
    print(f"  summarize        {t_summary:7.3f} s")
    print(f"  aggregate_curves {t_curves:7.3f} s")
    verdict = "met" if total <= TARGET_S else "MISSED"
    print(f"  total            {total:7.3f} s   (target <= {TARGET_S:.0f} s: {verdict}; best of {args.repeats})")


if __name__ == "__main__":
    main()
