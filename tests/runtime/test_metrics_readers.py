"""hpcrl.runtime.metrics: the files real trainers write, read into (step, return) per episode.

The writers are the real ones (SB3's Monitor, torch's SummaryWriter that CleanRL uses), then the
files are damaged the ways a killed job or a typo damages them: every reader answers with the
episodes or one MetricsError naming the file, never a traceback or a silently wrong curve.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from hpcrl.runtime import metrics
from hpcrl.runtime.metrics import MetricsError, read_episodes
from hpcrl.store import rundir


def monitored_episodes(directory: Path, n_envs: int, episodes: int, seed: int = 0) -> list[tuple[float, int]]:
    """Random CartPole episodes through SB3's Monitor, one file per env as SB3's vec envs write them."""
    from stable_baselines3.common.monitor import Monitor

    out = []
    for rank in range(n_envs):
        env = Monitor(gym.make("CartPole-v1"), str(directory / str(rank)))
        env.reset(seed=seed + rank)
        for _ in range(episodes):
            done, ret, length = False, 0.0, 0
            while not done:
                _, r, term, trunc, _ = env.step(env.action_space.sample())
                ret, length, done = ret + r, length + 1, term or trunc
            out.append((ret, length))
            env.reset()
        env.close()
    return out


def test_monitor_files_of_several_envs_merge_into_one_curve(tmp_path: Path) -> None:
    played = monitored_episodes(tmp_path / "zoo", n_envs=3, episodes=4)
    ep = read_episodes(tmp_path, "monitor")
    assert len(ep.files) == 3 and len(ep.returns) == 12
    assert sorted(ep.returns) == sorted(r for r, _ in played)
    assert ep.steps[-1] == sum(n for _, n in played)  # steps: the running sum of every episode's length
    assert np.all(np.diff(ep.steps) > 0)


def test_a_resumed_monitor_appends_after_a_second_header_and_a_torn_line_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "0.monitor.csv"
    path.write_text('#{"t_start": 100.0, "env_id": "X"}\nr,l,t\n10,10,1.0\n20,20,2.0\n#{"t_start": 200.0}\nr,l,t\n30,30,0.5\n40,4')
    ep = read_episodes(tmp_path, "monitor")
    assert list(ep.returns) == [10, 20, 30] and list(ep.steps) == [10, 30, 60]


@pytest.mark.parametrize(
    "text,message",
    [
        ("", "no files match"),  # written as no file at all below
        ("r,l,t\n", "Monitor header"),
        ('#{"t_start": 1}\nreward,len\n1,2\n', "expected a Monitor header with r,l,t"),
        ('#{"t_start": 1}\nr,l,t\n1\n', "damaged row"),
        ('#not json\nr,l,t\n', "not a Monitor header"),
    ],
)
def test_damaged_monitor_files_are_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    if text:
        (tmp_path / "0.monitor.csv").write_text(text if message != "Monitor header" else '#{"t_start": 1}\n' + "oops\n")
    with pytest.raises(MetricsError, match=message) as info:
        read_episodes(tmp_path, "monitor")
    assert "\n" not in str(info.value)


def test_a_header_only_monitor_has_no_episodes(tmp_path: Path) -> None:
    (tmp_path / "0.monitor.csv").write_text('#{"t_start": 1}\nr,l,t\n')
    assert len(read_episodes(tmp_path, "monitor").returns) == 0


def test_monitor_files_merge_by_when_each_episode_ended_not_by_file(tmp_path: Path) -> None:
    """Two envs' files whose order on disk is not the order in time: 0.monitor.csv started later."""
    (tmp_path / "0.monitor.csv").write_text('#{"t_start": 200.0}\nr,l,t\n1,10,5.0\n2,20,30.0\n')  # ended at 205, 230
    (tmp_path / "1.monitor.csv").write_text('#{"t_start": 100.0}\nr,l,t\n3,30,50.0\n4,40,120.0\n')  # ended at 150, 220
    ep = read_episodes(tmp_path, "monitor")
    assert list(ep.returns) == [3, 1, 4, 2] and list(ep.steps) == [30, 40, 80, 100]


def tensorboard_values(log_dir: Path, tag: str = "charts/episodic_return") -> list[tuple[int, float]]:
    """Every value of `tag` under `log_dir`, as TensorBoard itself reads them."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    out = []
    for path in sorted(log_dir.rglob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(path), size_guidance={SCALARS: 0})
        accumulator.Reload()
        out += [(e.step, e.value) for e in accumulator.Scalars(tag)] if tag in accumulator.Tags()["scalars"] else []
    return out


@pytest.mark.e2e
def test_a_vector_trainers_episodes_that_end_in_one_step_are_all_kept(tmp_path: Path) -> None:
    """CleanRL's scripts log every env that finished at the same `global_step` (issue 25: 40 episodes
    logged, 10 kept, and a score 138 off the episodes' mean)."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    argv = [sys.executable, str(repo / "tests" / "programs" / "cleanrl_tb.py"), "--log-dir", str(tmp_path / "tb"), "--total-timesteps", "1024", "--num-envs", "16",
            "--num-steps", "64", "--update-epochs", "1"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    logged = tensorboard_values(tmp_path / "tb")
    steps = [step for step, _ in logged]
    assert len(set(steps)) < len(steps), "no two envs finished in one step: the test shows nothing"
    ep = read_episodes(tmp_path, "tensorboard")
    assert len(ep.returns) == len(logged)
    assert sorted(zip(ep.steps, ep.returns)) == sorted((float(s), float(np.float32(v))) for s, v in logged)


def write_lifetime(run_dir: Path, name: str, episodes: list[tuple[int, float]]) -> None:
    """One writer of a CleanRL-style program: each (step, return) an episode at that global_step."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(run_dir / "tb" / name))
    writer.add_scalar("hparams/lr", 0.1)  # a scalar without a step: at 0 in every lifetime
    for step, value in episodes:
        writer.add_scalar("charts/episodic_return", value, step)
    writer.close()


def test_a_resumed_program_replaces_what_it_logs_again_and_keeps_every_episode_of_a_step(tmp_path: Path) -> None:
    """Two lifetimes as hpcrl records them: the second resumed from a checkpoint at step 16 and logs
    from there again, from two writers (two ranks) whose steps interleave."""
    assert rundir.begin_lifetime(tmp_path) == 1
    write_lifetime(tmp_path, "first", [(8, 1.0), (8, 2.0), (16, 3.0), (24, 4.0), (24, 5.0), (32, 6.0)])
    time.sleep(0.01)  # a requeue takes longer: `lifetimes` records each start to the millisecond
    assert rundir.begin_lifetime(tmp_path) == 2
    write_lifetime(tmp_path, "second-rank0", [(24, 40.0), (24, 50.0), (40, 70.0)])
    write_lifetime(tmp_path, "second-rank1", [(20, 30.0), (48, 80.0)])
    ep = read_episodes(tmp_path, "tensorboard")
    assert len(ep.files) == 3
    assert list(zip(ep.steps, ep.returns)) == [(8, 1), (8, 2), (16, 3), (20, 30), (24, 40), (24, 50), (40, 70), (48, 80)]


def test_lifetime_starts_read_both_formats_and_skip_what_they_cannot(tmp_path: Path) -> None:
    (tmp_path / rundir.LIFETIMES).write_text("1 2026-11-20T10:00:00+0000 n1 7\n2\n3 2026-11-20T10:00:01.250+00:00 n2 8\n4 2026-11-2")
    assert rundir.lifetime_starts(tmp_path) == [1795168800.0, 1795168801.25]  # the torn last line is not a start yet
    assert rundir.lifetime_starts(tmp_path / "nowhere") == []


def test_tensorboard_is_read_with_its_own_reader_and_a_resumed_step_keeps_its_later_value(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    first = SummaryWriter(str(tmp_path / "runs" / "a"))
    for step, value in ((100, 1.0), (200, 2.0), (300, 3.0)):
        first.add_scalar("charts/episodic_return", value, step)
    first.add_scalar("losses/value_loss", 9.0, 100)
    first.close()
    second = SummaryWriter(str(tmp_path / "runs" / "a"), filename_suffix=".2")  # a second lifetime, resumed at 200
    for step, value in ((300, 30.0), (400, 4.0)):
        second.add_scalar("charts/episodic_return", value, step)
    second.close()
    ep = read_episodes(tmp_path, "tensorboard")
    assert len(ep.files) == 2
    assert list(ep.steps) == [100, 200, 300, 400] and list(ep.returns) == [1.0, 2.0, 30.0, 4.0]
    with pytest.raises(MetricsError, match=r"no scalar 'charts/episode_return'.*charts/episodic_return, losses/value_loss"):
        read_episodes(tmp_path, "tensorboard", tag="charts/episode_return")


def test_csv_and_jsonl_columns(tmp_path: Path) -> None:
    (tmp_path / "log.csv").write_text("global_step,ret,loss\n10,1.5,0.1\n20,,0.2\n30,nan,0.3\n40,2.5,0.4\n50,9")
    ep = read_episodes(tmp_path, "csv", "log.csv", step="global_step", value="ret")
    assert list(ep.steps) == [10, 40] and list(ep.returns) == [1.5, 2.5]
    with pytest.raises(MetricsError, match="no column 'return' \\(columns: global_step,ret,loss\\)"):
        read_episodes(tmp_path, "csv", "log.csv", step="global_step", value="return")
    lines = [{"step": 5, "r": 1}, {"loss": 3}, {"step": 9, "r": 2}]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 12, "r"')
    ep = read_episodes(tmp_path, "jsonl", "log.jsonl", value="r")
    assert list(ep.steps) == [5, 9] and list(ep.returns) == [1, 2]
    (tmp_path / "bad.jsonl").write_text('{"step": 1, "r": 1}\n{oops}\n{"step": 2, "r": 2}\n')
    with pytest.raises(MetricsError, match="bad.jsonl, line 2: not JSON"):
        read_episodes(tmp_path, "jsonl", "bad.jsonl", value="r")


def test_a_row_shorter_than_its_header_is_skipped_not_a_traceback(tmp_path: Path) -> None:
    """A program that prints a line of its own into its CSV (a step without its return, a note) or
    a row a crash left short: that row has no episode; the others are read."""
    (tmp_path / "log.csv").write_text("global_step,ret\n10,1.5\n15\n20,2.5\n")
    ep = read_episodes(tmp_path, "csv", "log.csv", step="global_step", value="ret")
    assert list(ep.steps) == [10, 20] and list(ep.returns) == [1.5, 2.5]


def test_an_unknown_source_is_refused_not_read_as_another_format(tmp_path: Path) -> None:
    """The config's schema refuses an unknown `program.metrics.source`; a direct caller of
    read_episodes gets a ValueError, never a CSV read of a file meant for another reader."""
    (tmp_path / "log.csv").write_text("step,episodic_return\n10,1.5\n")
    with pytest.raises(ValueError, match="unknown metrics source 'Monitor'"):
        read_episodes(tmp_path, "Monitor", "log.csv")


def test_hostile_files(tmp_path: Path) -> None:
    (tmp_path / "nul.csv").write_bytes(b"step,episodic_return\n1,\xff\xfe\n")
    with pytest.raises(MetricsError, match="not UTF-8"):
        read_episodes(tmp_path, "csv", "nul.csv")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(MetricsError, match="empty"):
        read_episodes(tmp_path, "csv", "empty.csv")
    (tmp_path / "dir.monitor.csv").mkdir()  # a directory named like the pattern is not a file
    with pytest.raises(MetricsError, match="no files match"):
        read_episodes(tmp_path, "monitor", "*.monitor.csv")
    with pytest.raises(MetricsError, match="needs a path"):
        read_episodes(tmp_path, "jsonl")


def test_hpcrl_source_and_the_round_trip_through_train_csv(tmp_path: Path) -> None:
    with rundir.TrainLog(tmp_path, ["step", "episodic_return"], 0) as log:
        for step, ret in ((8, 1.0), (16, math.nan), (24, 3.0)):
            log.write([step, "" if math.isnan(ret) else ret])
    ep = read_episodes(tmp_path, "hpcrl")
    assert list(ep.steps) == [8, 24] and list(ep.returns) == [1.0, 3.0]
    out = tmp_path / "converted"
    out.mkdir()
    monitored_episodes(tmp_path / "m", n_envs=2, episodes=3)
    ep = read_episodes(tmp_path / "m", "monitor")
    rundir.write_curve(out, ep.steps, ep.returns)
    steps, returns = rundir.read_curve(out)
    assert np.array_equal(steps, ep.steps) and np.allclose(returns, ep.returns)
    assert rundir.last_logged_step(out) == int(ep.steps[-1])


def test_a_long_monitor_file_is_read_whole(tmp_path: Path) -> None:
    """A long run's Monitor file (200k episodes) comes back whole."""
    rows = "".join(f"{i % 500}.0,{i % 500},{i * 0.01:.2f}\n" for i in range(200_000))
    (tmp_path / "0.monitor.csv").write_text('#{"t_start": 0}\nr,l,t\n' + rows)
    ep = metrics.read_episodes(tmp_path, "monitor")
    assert len(ep.returns) == 200_000


@pytest.mark.parametrize("source", ["csv", "jsonl"])
def test_a_file_appended_by_several_lifetimes_keeps_the_latest_from_where_it_logged_again(tmp_path: Path, source: str) -> None:
    """Issue 37 item 16: a retry that started afresh appended its rows after the first lifetime's (81 rows
    for 60 steps), and the curve averaged an abandoned lifetime. The rule TensorBoard's reader applies holds
    for every source: a lifetime starts where the step goes down, and replaces what came at and after it."""
    first = [(step, 1.0) for step in range(10, 220, 10)]  # 21 rows, then killed
    afresh = [(step, 2.0) for step in range(10, 610, 10)]  # 60 rows from the start
    resumed = [(500, 3.0), (500, 3.5), (600, 4.0), (610, 5.0)]  # from a checkpoint at 500; two episodes at 500
    rows = first + afresh + resumed
    if source == "csv":
        (tmp_path / "m.csv").write_text("step,return\n" + "".join(f"{s},{r}\n" for s, r in rows))
    else:
        (tmp_path / "m.jsonl").write_text("".join(json.dumps({"step": s, "return": r}) + "\n" for s, r in rows))
    ep = read_episodes(tmp_path, source, f"m.{source}", step="step", value="return")
    expected = [p for p in afresh if p[0] < 500] + resumed
    assert list(zip(ep.steps.tolist(), ep.returns.tolist())) == [(float(s), r) for s, r in expected]
