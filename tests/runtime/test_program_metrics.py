"""What hpcrl hands a user's program and reads back from it, driven as its job does (`hpcrl train` and
`hpcrl eval` on one run): the newest checkpoint in `resume_args`, the configured TensorBoard tag, and
the episodes of a vectorised program requeued once.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from factories import deep_update

from hpcrl.cli import main
from hpcrl.config.load import experiment_from_dict
from hpcrl.store import rundir
from hpcrl.store.expdir import run_dir, write_experiment
from hpcrl.sweep.runs import expand

ARGV = "import sys, pathlib; pathlib.Path(sys.argv[1]).write_text(' '.join(sys.argv[2:]))"


def experiment(tmp_path: Path, **program: object) -> tuple[Path, Path]:
    """A one-run program experiment and its run directory."""
    data = {
        "name": "p", "algo": "program", "output": str(tmp_path / "logs"), "sweep": {"seeds": [3]},
        "program": deep_update({"command": [sys.executable, "-c", ARGV, str(tmp_path / "argv")], "workdir": str(tmp_path)}, program),
    }  # fmt: skip
    exp = experiment_from_dict(data)
    runs = expand(exp)
    write_experiment(exp, runs, {})
    return exp.dir, run_dir(exp.dir, runs[0].run_id)


def test_a_resumed_program_gets_the_newest_checkpoint_not_the_first_by_name_or_age(tmp_path: Path) -> None:
    root, rd = experiment(tmp_path, resume_args=["--resume", "{latest_checkpoint}"])
    rundir.begin_lifetime(rd)  # an earlier start, preempted after writing these
    ckpt = rd / "checkpoints"
    (ckpt / "old").mkdir(parents=True)
    now = time.time()
    for name, age in (("a.pt", 300), ("old/z.pt", 200), ("b.pt", 10), ("c.pt", 100)):  # newest: b.pt, neither first nor last by name
        (ckpt / name).write_text(name)
        os.utime(ckpt / name, (now - age, now - age))
    assert main(["train", str(root), "--task", "0"]) == 0
    assert (tmp_path / "argv").read_text() == f"--resume {ckpt / 'b.pt'}"


def test_the_configured_tensorboard_tag_is_the_one_scored(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    root, rd = experiment(tmp_path, metrics={"source": "tensorboard", "tag": "rollout/ep_rew", "last_episodes": 2})
    writer = SummaryWriter(str(rd / "tb"))
    for step in (10, 20, 30):
        writer.add_scalar("charts/episodic_return", 1.0, step)  # the default tag, here not the return
        writer.add_scalar("rollout/ep_rew", step / 10, step)
    writer.close()
    rundir.mark_done(rd, 30)
    assert main(["eval", str(root), "--task", "0"]) == 0
    assert rundir.first_line(rd, rundir.EVAL_DONE) == "mean of the last 2 training episodes: 2.5"


TWO_LIFETIMES = """
import os, sys, time
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter  # what torch's SummaryWriter writes through
lifetime = int(os.environ["HPCRL_LIFETIME"])
writer = EventFileWriter(os.path.join(os.environ["HPCRL_RUN_DIR"], "runs", "start%d" % lifetime))
if lifetime == 1:  # 4 envs; checkpointed at step 16, then preempted at 24
    episodes, code = [(8, 1.0), (8, 2.0), (16, 3.0), (24, 4.0), (24, 5.0)], int(os.environ["HPCRL_REQUEUE_EXIT"])
else:
    assert sys.argv[-1] == "--resume", sys.argv
    episodes, code = [(24, 40.0), (24, 50.0), (32, 60.0)], 0
for step, value in episodes:
    writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=[Summary.Value(tag="charts/episodic_return", simple_value=value)])))
writer.close()
sys.exit(code)
"""


def test_a_requeued_vector_program_is_scored_on_every_episode_once(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    (tmp_path / "vector.py").write_text(TWO_LIFETIMES)
    root, rd = experiment(tmp_path, command=[sys.executable, str(tmp_path / "vector.py")], resume_args=["--resume"],
                          metrics={"source": "tensorboard", "last_episodes": 5})  # fmt: skip
    assert main(["train", str(root), "--task", "0"]) == 99  # the requeue
    assert main(["train", str(root), "--task", "0"]) == 0
    assert main(["eval", str(root), "--task", "0"]) == 0
    # Kept: 1, 2 (step 8), 3 (16) from the first start; 40, 50 (24), 60 (32) from the second.
    assert rundir.first_line(rd, rundir.EVAL_DONE) == "mean of the last 5 training episodes: 31"
    curve = (rd / rundir.TRAIN_LOG).read_text().splitlines()
    assert [line.split(",")[0] for line in curve[1:]] == ["8", "8", "16", "24", "24", "32"]
