"""Learner and actor processes against a real redis-server: kills, requeues, garbage, a whole local sweep.

Each test drives `hpcrl learner` / `hpcrl actor` as the job scripts do and watches what a user
watches: the learner's stats file (what `hpcrl status` prints), exit codes, logs, checkpoints.
"""

from __future__ import annotations

import csv
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import redis
import yaml

from hpcrl.distributed import rendezvous, runstats

pytestmark = pytest.mark.redis
PY = sys.executable

CONFIG: dict[str, Any] = {
    "name": "apex",
    "algo": "dqn",
    "env": {"id": "CartPole-v1"},
    "train": {
        "total_steps": 10_000_000, "hidden_sizes": [32], "buffer_size": 10_000, "batch_size": 32, "learning_starts": 200,
        "train_freq": 4, "gradient_steps": 1, "target_update_freq": 100, "checkpoint_every": 50,
    },
    "distributed": {
        "actors": 2, "envs_per_actor": 2, "batch_transitions": 16, "queue_bound": 4, "publish_every": 50, "max_lag": 100,
        "heartbeat_s": 0.2, "dead_after_s": 1.0, "learner_timeout_s": 30.0, "redis": {"bind": "127.0.0.1"},
    },
    "sweep": {"seeds": [0]},
    "resources": {"max_concurrent": 3},
    "eval": {"episodes": 2},
}


def make_experiment(tmp_path: Path, changes: dict | None = None) -> tuple[Path, Path]:
    """Write the experiment (without submitting it); return (experiment dir, run dir)."""
    from factories import deep_update

    from hpcrl.config.load import load_experiment
    from hpcrl.store.expdir import write_experiment
    from hpcrl.sweep.runs import expand

    path = tmp_path / "apex.yaml"
    path.write_text(yaml.safe_dump(deep_update({**CONFIG, "output": str(tmp_path / "logs")}, changes or {})))
    exp = load_experiment(path)
    runs = expand(exp)
    root = write_experiment(exp, runs, {})
    return root.resolve(), (root / "runs" / runs[0].run_id).resolve()


def start(*args: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([PY, "-m", "hpcrl", *args], stdout=log.open("a"), stderr=subprocess.STDOUT)


def wait_stats(rd: Path, ok: Callable[[dict], bool], timeout: float, what: str) -> dict:
    """The learner's stats file once `ok` holds for it."""
    deadline = time.monotonic() + timeout
    stats = None
    while time.monotonic() < deadline:
        stats = runstats.read(rd)
        if stats is not None and ok(stats):
            return stats
        time.sleep(0.05)
    pytest.fail(f"{what}: not within {timeout:g} s; last stats: {json.dumps(stats)[:1500]}")


def stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_killed_actor_is_seen_dead_while_learning_goes_on_garbage_is_rejected_and_orphans_exit_75(tmp_path: Path) -> None:
    # learner_timeout_s (30 s) is also how long the learner waits for its first actor: on a loaded
    # machine two actor processes can take 15 s to import torch and connect.
    exp, rd = make_experiment(tmp_path)
    log = tmp_path / "out.log"
    learner = start("learner", str(exp), "--task", "0", log=log)
    actors: list[subprocess.Popen] = []
    try:
        # The actors' 30 s learner timeout is for the end of this test; on a loaded machine the learner's own
        # start (imports, redis-server) can take longer than that, so they start once it is serving.
        assert rendezvous.wait(rd, 60) is not None, log.read_text()
        actors += [start("actor", str(exp), "--task", "0", "--actor", str(i), log=log) for i in (0, 1)]
        wait_stats(rd, lambda s: s["actors_alive"] == 2 and s["updates"] > 0, 90, "two actors feeding a learning learner")

        # Garbage straight onto the queue (a pickle among it): rejected and counted, never unpickled or fatal.
        info = rendezvous.read(rd)
        assert info is not None and info.host == "127.0.0.1"
        client = redis.Redis(host=info.host, port=info.port, password=info.password)
        client.rpush(info.prefix + "queue", b"not a message", pickle.dumps({"obs": [1, 2]}))
        client.close()

        actors[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        stats = wait_stats(rd, lambda s: s["actors_dead"] == [1], 10, "the killed actor reported dead")
        latency = time.monotonic() - killed
        print(f"actor kill detected after {latency:.2f} s (dead_after_s 1.0, heartbeat 0.2 s)")
        assert stats["actors_alive"] == 1
        after = wait_stats(rd, lambda s: s["updates"] > stats["updates"] + 50 and s["malformed"] >= 2, 30, "learning after the kill")
        assert learner.poll() is None and after["actors_dead"] == [1]

        # Actor 0 fetched parameters once per new version, not once per batch.
        a0 = after["actors"]["0"]
        assert 1 <= a0["param_fetches"] <= a0["version"] + 1 < a0["batches"]

        status = subprocess.run([PY, "-m", "hpcrl", "status", str(exp)], capture_output=True, text=True, timeout=60)
        assert f"actors 1/2 alive (dead: 1 on {socket.gethostname()})" in status.stdout, status.stdout + status.stderr
        assert "env steps/s" in status.stdout and "malformed" in status.stdout and "lag" in status.stdout

        learner.send_signal(signal.SIGKILL)  # gone for good, without a word: its redis-server dies with it
        killed = time.monotonic()
        assert actors[0].wait(timeout=60) == 75
        gone = time.monotonic() - killed
        print(f"orphaned actor exited after {gone:.1f} s (learner_timeout_s 30)")
        assert gone < 30 + 10  # the timeout, plus slack for a loaded machine; not redis-py's hidden retries
    finally:
        stop_all([learner, *actors])
    text = log.read_text()
    assert "rejected malformed message" in text and "no learner for 30 s; exiting with 75" in text


def test_requeued_learner_resumes_and_its_actor_reconnects(tmp_path: Path) -> None:
    exp, rd = make_experiment(tmp_path, {"distributed": {"actors": 1, "learner_timeout_s": 120}})
    log = tmp_path / "out.log"
    learner = start("learner", str(exp), "--task", "0", log=log)
    actor = start("actor", str(exp), "--task", "0", "--actor", "0", log=log)
    procs = [learner, actor]
    try:
        wait_stats(rd, lambda s: s["updates"] >= 120 and s["param_version"] >= 2, 90, "a learner with a checkpoint")
        learner.send_signal(signal.SIGUSR1)  # the scheduler's warning, as the job script forwards it
        assert learner.wait(timeout=30) == 99
        before = runstats.read(rd)
        assert before["status"] == "stopping" and not rendezvous.path(rd).exists()
        assert list((rd / "checkpoints").glob("*.pt"))
        time.sleep(1.0)
        assert actor.poll() is None  # waits for the next learner start instead of exiting

        learner = start("learner", str(exp), "--task", "0", log=log)
        procs.append(learner)
        after = wait_stats(
            rd, lambda s: s["instance"] != before["instance"] and s["actors_alive"] == 1 and s["env_steps"] > before["env_steps"] + 500,
            60, "the requeued learner fed by the reconnected actor",
        )
        assert after["param_version"] >= before["param_version"] and after["updates"] > before["updates"]
        text = log.read_text()
        assert f"resumed from step {before['env_steps']} " in text
        assert text.count("actor 0: connected to learner") == 2
        steps = [int(r["step"]) for r in csv.DictReader((rd / "train.csv").open())]
        assert steps == sorted(steps)  # the log continues where the checkpoint was, without going back
    finally:
        stop_all(procs)


def test_local_sweep_runs_learner_and_actors_then_eval(tmp_path: Path) -> None:
    """`hpcrl sweep --scheduler local` with a tiny budget: learner and actors finish cleanly, eval and aggregate follow."""
    config = tmp_path / "apex.yaml"
    exp, rd = make_experiment(tmp_path, {"train": {"total_steps": 1500}})
    proc = subprocess.run([PY, "-m", "hpcrl", "sweep", str(config), "--scheduler", "local"], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state = json.loads((exp / "jobs" / "local-state.json").read_text())["jobs"]
    assert {k: [t["rc"] for t in v.values()] for k, v in state.items()} == {
        "learner-0-0": [0], "actors-0-0": [0, 0], "eval-0-0": [0], "aggregate-0": [0],
    }
    assert (rd / "DONE").exists() and (rd / "EVAL_DONE").exists() and (exp / "results" / "summary.csv").exists()
    assert (rd / "DONE").read_text().strip() == "step 1500"  # exactly the budget: the last batch is cut
    assert [int(r["step"]) for r in csv.DictReader((rd / "train.csv").open())][-1] == 1500
    assert not rendezvous.path(rd).exists()
    assert runstats.read(rd)["status"] == "done"


def test_runs_share_an_external_redis_under_their_own_prefix(tmp_path: Path, redis_server, redis_client: redis.Redis) -> None:
    """distributed.redis.address: no server of its own; the password comes from the environment, never the config."""
    address = f"{redis_server.host}:{redis_server.port}"
    exp, rd = make_experiment(tmp_path, {"train": {"total_steps": 1200}, "distributed": {"actors": 1, "learner_timeout_s": 120, "redis": {"address": address}}})
    assert redis_server.password not in (rd / "config.yaml").read_text()
    env = dict(os.environ, HPCRL_REDIS_PASSWORD=redis_server.password)
    log = tmp_path / "out.log"
    learner = subprocess.Popen([PY, "-m", "hpcrl", "learner", str(exp), "--task", "0"], stdout=log.open("a"), stderr=subprocess.STDOUT, env=env)
    actor = start("actor", str(exp), "--task", "0", "--actor", "0", log=log)  # learns the password from the rendezvous file only
    try:
        assert learner.wait(timeout=120) == 0, log.read_text()
        assert actor.wait(timeout=30) == 0, log.read_text()
    finally:
        stop_all([learner, actor])
    assert (rd / "DONE").exists() and not (rd / "redis.log").exists()
    keys = {k.decode() for k in redis_client.keys("*")}
    prefix = f"hpcrl:{rd.name}:"
    assert keys and all(k.startswith(prefix) for k in keys)
    assert prefix + "params:blob" not in keys and prefix + "queue" not in keys  # retired: no blobs left behind
    assert redis_client.get(prefix + "status") == b"done" and 0 < redis_client.ttl(prefix + "status") <= 86400


def test_learner_gives_up_when_no_actor_ever_comes(tmp_path: Path) -> None:
    """Actor jobs that are never scheduled: the learner fails after learner_timeout_s with that reason
    (in FAILED, which `hpcrl status` shows) instead of holding its GPU forever."""
    exp, rd = make_experiment(tmp_path, {"distributed": {"learner_timeout_s": 3.0}})
    log = tmp_path / "out.log"
    learner = start("learner", str(exp), "--task", "0", log=log)
    try:
        assert learner.wait(timeout=90) not in (0, 99), log.read_text()
    finally:
        stop_all([learner])
    reason = (rd / "FAILED").read_text().splitlines()[0]
    assert reason == "no actor connected in 3 s (distributed.learner_timeout_s): were the actor jobs scheduled?"
    assert not (rd / "DONE").exists() and not rendezvous.path(rd).exists()
    assert "Traceback" not in log.read_text()  # one line says it all


@pytest.mark.slow
def test_apex_learns_cartpole_beyond_its_untrained_start(tmp_path: Path) -> None:
    """A real learner and two actors over a real redis-server, for a budget of about half a minute:
    the greedy policy it ends with must beat the network it started from by a wide margin, and the
    learner must have learned from exactly total_steps env steps."""
    import numpy as np
    import torch

    from hpcrl.distributed.apex import q_network
    from hpcrl.rl import checkpoint
    from hpcrl.rl.evaluate import play
    from hpcrl.rl.train import seed_everything
    from hpcrl.store.expdir import load_runs

    total = 8_000
    exp, rd = make_experiment(
        tmp_path,
        {
            "train": {"total_steps": total, "lr": 2.3e-3, "hidden_sizes": [64, 64], "buffer_size": 20_000, "batch_size": 64, "learning_starts": 500,
                      "train_freq": 256, "gradient_steps": 64, "target_update_freq": 10, "loss": "huber", "checkpoint_every": 1000},
            "distributed": {"envs_per_actor": 4, "batch_transitions": 64, "queue_bound": 8, "publish_every": 16, "max_lag": 1000,
                            "learner_timeout_s": 120},
        },
    )  # fmt: skip
    log = tmp_path / "out.log"
    began = time.monotonic()
    procs = [start("learner", str(exp), "--task", "0", log=log)]
    procs += [start("actor", str(exp), "--task", "0", "--actor", str(i), log=log) for i in (0, 1)]
    try:
        assert procs[0].wait(timeout=240) == 0, log.read_text()
        took = time.monotonic() - began
    finally:
        stop_all(procs)
    assert (rd / "DONE").read_text().strip() == f"step {total}"
    (run,) = load_runs(exp)
    probe = gym.make("CartPole-v1")
    seed_everything(run.seed)  # the learner's own start: its network as first built
    untrained = q_network(run.config.train, probe.observation_space, probe.action_space)
    trained = q_network(run.config.train, probe.observation_space, probe.action_space)
    state, _ = checkpoint.load_latest(rd / "checkpoints")
    trained.load_state_dict(state["agent"]["policy"])
    cpu = torch.device("cpu")
    before = float(np.mean([r for r, *_ in play(untrained, run, 16, True, cpu)]))
    after = float(np.mean([r for r, *_ in play(trained, run, 16, True, cpu)]))
    print(f"Ape-X CartPole, {total} env steps in {took:.0f} s: greedy return {before:.1f} untrained -> {after:.1f}")
    assert after > max(3 * before, before + 60)


def _children(pid: int, name: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            comm = (entry / "comm").read_text().strip()
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and comm.startswith(name):
            found.append(int(entry.name))
    return found


def test_a_redis_that_dies_fails_the_run_in_one_line_naming_it_and_status_shows_no_live_report(tmp_path: Path) -> None:
    """The learner's redis-server is killed mid-run: FAILED says Redis at that address went away (a
    raw ConnectionError traceback before), and `hpcrl status` no longer shows the last "actors 1/1
    alive" report of the failed run as if it were live."""
    exp, rd = make_experiment(tmp_path, {"distributed": {"actors": 1}})
    log = tmp_path / "out.log"
    learner = start("learner", str(exp), "--task", "0", log=log)
    actors: list[subprocess.Popen] = []
    try:
        info = rendezvous.wait(rd, 60)
        assert info is not None, log.read_text()
        actors.append(start("actor", str(exp), "--task", "0", "--actor", "0", log=log))
        wait_stats(rd, lambda s: s["actors_alive"] == 1 and s["updates"] > 0, 90, "an actor feeding a learning learner")
        (server,) = _children(learner.pid, "redis-server")
        os.kill(server, signal.SIGKILL)
        assert learner.wait(timeout=60) == 1, log.read_text()
    finally:
        stop_all([learner, *actors])
    reason = (rd / "FAILED").read_text().splitlines()[0]
    assert reason.startswith(f"Redis at {info.host}:{info.port} went away"), reason
    assert "Traceback" not in log.read_text()
    status = subprocess.run([PY, "-m", "hpcrl", "status", str(exp)], capture_output=True, text=True, timeout=60)
    assert "failed" in status.stdout and "alive" not in status.stdout, status.stdout + status.stderr
