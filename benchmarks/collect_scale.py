"""How long `hpcrl collect` takes over many runs, evaluation excluded.

Writes a synthetic experiment (runs.csv, per-run train.csv with ROWS logged iterations, eval.csv and
markers, as train and eval leave them) and times `collect` on it: reading every CSV, the
summary with bootstrap CIs, the curves, the three plots and the report. Target: 1000 runs in <= 5 s.

    python benchmarks/collect_scale.py [--runs 1000] [--settings 100] [--rows 400]
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np

from hpcrl.collect import collect


def make_experiment(root: Path, runs: int, settings: int, rows: int) -> Path:
    exp = root / "scale"
    (exp / "runs").mkdir(parents=True)
    rng = np.random.default_rng(0)
    lines = ["index,run_id,seed,train.lr"]
    for i in range(runs):
        setting, seed = i % settings, i // settings
        run_id = f"{setting:08x}ab-s{seed}"
        lines.append(f"{i},{run_id},{seed},{10 ** -(2 + setting / settings):.6g}")
        rd = exp / "runs" / run_id
        rd.mkdir()
        steps = np.arange(1, rows + 1) * 256
        returns = np.clip(500 * (1 - np.exp(-steps / 3e4)) + rng.normal(0, 20, rows), 0, 500)
        body = "\n".join(f"{s},{k},{k * 0.1:.1f},2500,1,{r:.2f},{r:.0f},0.01,0.5,0.6,0.001,0.1,0.001" for k, (s, r) in enumerate(zip(steps, returns), 1))
        (rd / "train.csv").write_text("step,iteration,wall_time,sps,episodes,episodic_return,episodic_length,policy_loss,value_loss,entropy,approx_kl,clipfrac,lr\n" + body + "\n")
        (rd / "eval.csv").write_text("episode,return,length\n" + "".join(f"{e},{returns[-1] + e:.1f},500\n" for e in range(10)))
        (rd / "DONE").write_text("done\n")
        (rd / "EVAL_DONE").write_text("done\n")
    (exp / "runs.csv").write_text("\n".join(lines) + "\n")
    return exp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--settings", type=int, default=100)
    parser.add_argument("--rows", type=int, default=400, help="logged iterations per run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        exp = make_experiment(Path(tmp), args.runs, args.settings, args.rows)
        made = time.perf_counter() - t0
        buf = io.StringIO()
        t0 = time.perf_counter()
        with redirect_stdout(buf):
            rc = collect(exp, out=buf)
        took = time.perf_counter() - t0
    print(f"synthetic experiment: {args.runs} runs, {args.settings} settings, {args.rows} rows each (written in {made:.1f} s)")
    print(f"collect (no evaluation): {took:.2f} s  -> {args.runs / took:.0f} runs/s   target: <= 5 s for 1000 runs   exit {rc}")


if __name__ == "__main__":
    main()
