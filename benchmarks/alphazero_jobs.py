"""AlphaZero decoupled on real Slurm: configs/tictactoe_alphazero_jobs.yaml (2 self-play jobs, 1 trainer)
submitted with `hpcrl sweep`, then from the trainer's stats file and train.csv:

- the trainer's busy fraction: time in updates / wall time since its first update (what is not busy
  is waiting for games, publishing, reporting, or sharing the CPU with the self-play jobs);
- games/s and positions/s over the run (from the trainer's first train.csv row to its last);
- the realised updates per game over the set ratio (distributed.ratio_slack lets it float);
- how long each side waited on the other, in batches: the trainer's longest stretch without data
  (once it had begun to learn) over the mean interval between two batches arriving, and each
  self-play job's longest block on a full queue over its own time to play one batch. Issue 28's
  target: neither waits for more than one batch.

Figures (2026-12-02, the 2-core VM, nothing else running; seed 0, 10,000 positions, Slurm's node
oversubscribed 2 jobs per core, so trainer and self-play share 2 cores; the config's recipe is the simple
mode's since that day: 25 simulations a self-play move, half noise, 3.125 updates per game), `--actors N --slack S`:

| self-play jobs | ratio_slack | trainer busy | realised ratio | trainer's longest wait | self-play's longest block | losses to perfect play |
| --- | --- | --- | --- | --- | --- | --- |
| 1 | 0 | 0.67 | 1.00x | 1.87 batches (2.1 s in all) | none | 0 of 100 |
| 1 | 0.25 | 0.86 | 1.19x | 0.83 batch | none | 0 of 100 |
| 1 | 0.5 | 0.92 | 1.49x (the edge) | 1.63 batches (0.15 s in all) | none | 0 of 100 |
| 2 | 0 | 0.94 | 1.00x | 0.31 batch | 1.67 / 1.58 batches | 3 of 100 |
| 2 | 0.25 | 0.93 | 0.75x (the edge) | none | 0.52 / 0.43 batch | 0 of 100 |
| 2 | 0.5 | 0.89 | 0.63x | none | none | 0 of 100 |

Each run trained in 5-10 s (190-290 games/s). Held to the set ratio (slack 0) the faster side waits: the
trainer with one self-play job, the self-play jobs with two. With the config's slack of 0.5 and its two
self-play jobs neither waits; with one, the trainer is faster than the band allows (1.49x) and waits at its
edge. The realised ratio says which side is faster (above 1: the trainer; below: the self-play). With the
earlier recipe (40 simulations, a quarter noise, 6.25 updates per game; 2026-11-26) three of these six runs
lost 2 of 100; the 3 of this one (two jobs held to the ratio) are 10,000 positions' worth: the multi-node
test trains that setting for 24,000 and loses none.

The Slurm cluster of the tests must run (`bash tests/clusters/slurm.sh start`, then
`source tests/clusters/env.sh`). A benchmark prints; it does not assert.

    PYTHONPATH=. python benchmarks/alphazero_jobs.py [--actors 2] [--slack 0.5] [--total-steps 10000] [--output /tmp/azjobs]
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
import tempfile
import time
from pathlib import Path

import _args  # benchmarks/_args.py: the script's own folder is first on sys.path

from hpcrl.config.load import load_experiment
from hpcrl.distributed import runstats
from hpcrl.store.expdir import load_runs, run_dir
from hpcrl.submit.pipeline import submit_experiment

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "tictactoe_alphazero_jobs.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--actors", type=_args.positive_integer, default=2)
    parser.add_argument("--total-steps", type=_args.positive_integer, default=10_000)
    parser.add_argument("--seed", type=_args.seed, default=0)
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--timeout", type=_args.positive_number, default=900)
    parser.add_argument("--slack", metavar="SLACK", default=None, help="distributed.ratio_slack (default: the config's), which the config checks")
    args = parser.parse_args()
    overrides = [
        f"sweep.seeds=[{args.seed}]", f"distributed.actors={args.actors}", f"train.total_steps={args.total_steps}",
        "eval.every_steps=null", "tracking.tensorboard=false",  # no evaluations in the trainer: they would count as neither busy nor waiting
        *([f"distributed.ratio_slack={args.slack}"] if args.slack is not None else []),
    ]
    # --slack nan, -1, ...: the config's own one-line refusal, before the default output folder is made
    _args.experiment(parser, args.config, [*([f"output={args.output}"] if args.output else []), *overrides])
    root = args.output or Path(tempfile.mkdtemp(prefix="azjobs-"))
    exp = load_experiment(args.config, [f"output={root}", *overrides])
    out = io.StringIO()
    if submit_experiment(exp, "slurm", detach=True, out=out) != 0:
        sys.exit(f"hpcrl sweep failed:\n{out.getvalue()}")
    (run,) = load_runs(exp.dir)
    rd = run_dir(exp.dir, run.run_id)
    deadline = time.monotonic() + args.timeout
    while not (rd / "DONE").exists():
        if (rd / "FAILED").exists() or time.monotonic() > deadline:
            sys.exit(f"the run did not finish: {(rd / 'FAILED').read_text() if (rd / 'FAILED').exists() else 'timeout'}; see {exp.dir}/jobs/logs")
        time.sleep(1)
    stats = runstats.read(rd)
    assert stats is not None
    rows = list(csv.DictReader((rd / "train.csv").open()))
    first, last = rows[0], rows[-1]
    span = float(last["wall_time"]) - float(first["wall_time"])
    games = sum(int(r["episodes"]) for r in rows[1:])
    positions = int(last["step"]) - int(first["step"])
    busy, learning = float(stats["busy_s"]), max(float(stats["learning_s"]), 1e-9)  # a tiny run may learn for no measurable time
    batch_interval = learning / max(1, int(stats["batches"]))
    trainer_wait = float(stats["wait_max_s"]) / batch_interval
    actor_waits = []
    for i, a in sorted(stats["actors"].items()):
        own_batch = learning / max(1, int(a["batches"]))
        actor_waits.append(f"self-play job {i}: longest block {a['blocked_max_s']:.3f} s = {a['blocked_max_s'] / own_batch:.2f} batches "
                           f"({a['blocked']} blocks, {a['blocked_s']:.2f} s in all)")
    print(f"{exp.name}, {args.actors} self-play jobs + 1 trainer on Slurm, {args.total_steps} positions, seed {args.seed}:")
    print(f"  trainer busy {busy:.1f} s of {learning:.1f} s since its first update = {busy / learning:.2f}; {stats['updates']} updates, "
          + (f"{stats['pace']:.2f}x the set updates per game" if stats["pace"] is not None else "the pace not measured (no update earned yet)")
          + f" (distributed.ratio_slack {stats['ratio_slack']:g})")
    if span > 0:
        print(f"  {games / span:.1f} games/s, {positions / span:.0f} positions/s (train.csv, {span:.1f} s)")
    else:  # a tiny run (the suite's) may log one row: no span to divide by
        print(f"  games/s: not measured (train.csv logged {len(rows)} row{'s' if len(rows) != 1 else ''} over {span:.1f} s: too short a run)")
    print(f"  trainer: longest wait for data {stats['wait_max_s']:.3f} s = {trainer_wait:.2f} batches (a batch every {batch_interval * 1000:.0f} ms; "
          f"{stats['wait_s']:.2f} s waiting in all)")
    for line in actor_waits:
        print("  " + line)
    print(f"  dropped {stats['dropped_stale']} stale batches, {stats['malformed']} malformed, {stats['lost']} lost; output {exp.dir}")
    while not (rd / "EVAL_DONE").exists():  # the eval stage: the final network against the config's opponents
        if (rd / "EVAL_FAILED").exists() or time.monotonic() > deadline:
            sys.exit(f"the evaluation did not finish; see {exp.dir}/jobs/logs")
        time.sleep(1)
    for row in csv.DictReader((rd / "strength.csv").open()):
        print(f"  final network against {row['opponent']}: {row['wins']} won, {row['draws']} drawn, {row['losses']} lost of {row['games']}")


if __name__ == "__main__":
    main()
