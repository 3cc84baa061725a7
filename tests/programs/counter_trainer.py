"""A deterministic toy trainer, run as a user's own program (`algo: program`) by hpcrl's requeue and
resume tests. It does what a real trainer must do under hpcrl, with nothing else in the way:

- each step sleeps `--step-seconds` and "learns": a weight grows by `--lr` per step, and the step's
  episodic return is `seed % 10 + 100 * weight`, so a correct resume gives the same numbers as a run
  that never stopped;
- every `--checkpoint-every` steps it writes `ckpt-<step>.json` atomically (tmp + os.replace);
- it logs each step's episode through `hpcrl.job.log`;
- it also checkpoints at the end;
- on the stop signal it checkpoints and exits with `hpcrl.job.requeue_exit()`;
- `--resume PATH` restarts from that checkpoint, or from the newest one when PATH is a directory;
- `--note-signals` prints `got signal SIG...` for every USR1, USR2, TERM and INT it receives (and
  survives those that are not its stop signal), so a test sees exactly what reached it.

Run it by hand: python tests/programs/counter_trainer.py --total-steps 5 --step-seconds 0 --checkpoint-every 2
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from hpcrl import job


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--total-steps", type=int, required=True)
    p.add_argument("--step-seconds", type=float, default=0.0)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--checkpoint-dir", type=Path, default=None, help="default: hpcrl.job.checkpoint_dir()")
    p.add_argument("--resume", type=Path, default=None, help="a ckpt-<step>.json, or a directory of them")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=None, help="default: hpcrl.job.seed()")
    p.add_argument("--fail-at", type=int, default=None, help="raise an exception at this step")
    p.add_argument("--ignore-signals", action="store_true", help="ignore SIGUSR1 and SIGTERM")
    p.add_argument("--note-signals", action="store_true", help="print each USR1, USR2, TERM and INT received")
    return p.parse_args()


def newest_checkpoint(path: Path) -> Path | None:
    """`path` itself when it is a file; else its ckpt-<step>.json with the highest step."""
    if not path.is_dir():
        return path
    found = [(int(p.stem.split("-", 1)[1]), p) for p in path.glob("ckpt-*.json") if p.stem.split("-", 1)[1].isdigit()]
    return max(found)[1] if found else None


def save(directory: Path, state: dict) -> Path:
    path = directory / f"ckpt-{state['step']}.json"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)
    print(f"checkpoint {path}", flush=True)
    return path


def note_signals() -> None:
    """Print every signal a scheduler or hpcrl could send; pass the stop signal on to hpcrl.job's handler."""
    for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(signum)

        def handler(number: int, frame, previous=previous) -> None:
            print(f"got signal {signal.Signals(number).name}", flush=True)
            if callable(previous):
                previous(number, frame)

        signal.signal(signum, handler)


def main() -> int:
    args = parse_args()
    if args.ignore_signals:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.note_signals:
        note_signals()
    ckpt_dir = args.checkpoint_dir or job.checkpoint_dir()
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    seed = job.seed() if args.seed is None else args.seed
    state = {"step": 0, "weight": 0.0, "seed": seed, "lr": args.lr}
    source = newest_checkpoint(args.resume) if args.resume else None
    if source is not None:
        state = json.loads(source.read_text())
        print(f"resumed from {source} at step {state['step']}", flush=True)
    elif args.resume:
        print(f"no checkpoint in {args.resume}: starting from step 0", flush=True)

    while state["step"] < args.total_steps:
        if job.stop_requested():
            save(ckpt_dir, state)
            print(f"stop requested at step {state['step']}", flush=True)
            return job.requeue_exit()
        step = state["step"] + 1
        if step == args.fail_at:
            raise RuntimeError(f"failing at step {step} as asked (--fail-at)")
        time.sleep(args.step_seconds)
        state = {**state, "step": step, "weight": state["weight"] + state["lr"]}
        job.log(step, episodic_return=state["seed"] % 10 + 100 * state["weight"])
        if step % args.checkpoint_every == 0:
            save(ckpt_dir, state)
    if state["step"] % args.checkpoint_every:
        save(ckpt_dir, state)  # the final model, for the eval command
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
