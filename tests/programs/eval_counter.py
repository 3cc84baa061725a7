"""The eval command of counter_trainer.py (`program.eval`): reads the newest checkpoint of
`--checkpoint-dir`, "plays" `--episodes` episodes whose returns follow from the checkpoint alone, and
writes them through `hpcrl.job.log_eval` (the run's eval.csv), or as JSON lines with `--jsonl FILE`.

Run it by hand: python tests/programs/eval_counter.py --checkpoint-dir checkpoints --jsonl eval.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from hpcrl import job


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint-dir", type=Path, default=None, help="default: hpcrl.job.checkpoint_dir()")
    p.add_argument("--episodes", type=int, default=5)
    p.add_argument("--jsonl", type=Path, default=None, help="write JSON lines here instead of the run's eval.csv")
    args = p.parse_args()
    ckpt_dir = args.checkpoint_dir or job.checkpoint_dir()
    found = [(int(c.stem.split("-", 1)[1]), c) for c in ckpt_dir.glob("ckpt-*.json") if c.stem.split("-", 1)[1].isdigit()]
    if not found:
        print(f"eval_counter: no ckpt-<step>.json in {ckpt_dir}", file=sys.stderr)
        return 1
    state = json.loads(max(found)[1].read_text())
    base = state["seed"] % 10 + 100 * state["weight"]
    returns = [base + (i % 3) - 1 for i in range(args.episodes)]
    lengths = [state["step"] + i for i in range(args.episodes)]
    if args.jsonl is None:
        job.log_eval(returns, lengths)
    else:
        tmp = args.jsonl.with_name(f".{args.jsonl.name}.tmp")
        tmp.write_text("".join(json.dumps({"episode": i, "return": r}) + "\n" for i, r in enumerate(returns)))
        os.replace(tmp, args.jsonl)
    print(f"evaluated step {state['step']}: mean return {sum(returns) / len(returns):.6g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
