"""A user's trainer that knows nothing of hpcrl's helper: no signal handler (the stop signal's default
action kills it), a checkpoint after every step, `--resume DIR` to go on from the newest one. It writes
its episodes to `<run dir>/metrics.csv` (step,return) and `step N` lines to its output.

Run it by hand: python tests/programs/plain_counter.py --total-steps 5 --checkpoint-dir /tmp/c --metrics /tmp/m.csv
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--total-steps", type=int, required=True)
    p.add_argument("--step-seconds", type=float, default=0.0)
    p.add_argument("--checkpoint-dir", type=Path, required=True)
    p.add_argument("--metrics", type=Path, required=True)
    p.add_argument("--resume", type=Path, default=None)
    args = p.parse_args()
    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    step = 0
    if args.resume is not None and (args.resume / "step").exists():
        step = int((args.resume / "step").read_text())
        print(f"resumed at step {step}", flush=True)
    if not args.metrics.exists():
        args.metrics.write_text("step,return\n")
    while step < args.total_steps:
        time.sleep(args.step_seconds)
        step += 1
        with args.metrics.open("a") as f:
            f.write(f"{step},{float(step)}\n")
        tmp = args.checkpoint_dir / ".step.tmp"
        tmp.write_text(str(step))
        os.replace(tmp, args.checkpoint_dir / "step")
        print(f"step {step}", flush=True)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
