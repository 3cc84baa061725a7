"""AlphaZero decoupled (issue 28, item 3): self-play jobs and a trainer job over Ape-X's board and queue.

The halves in one process first (what crosses the wire, what the trainer refuses, what a requeued
trainer keeps), then whole runs on the real Slurm (Grid Engine's: tests/e2e/test_sge_multihost.py): two self-play jobs and a trainer,
one self-play job killed with SIGKILL and the trainer requeued mid-run; the run must finish, be
evaluated, and its strength curve must have no gap.
"""

from __future__ import annotations

import io
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from factories import HEAD_ADDRESS, deep_update
from test_config_hostile import assert_refused, sweep
from test_conformance import BACKENDS, Backend, active_tasks, csv_rows, status_text, wait_until

from hpcrl import games
from hpcrl.config.distributed_spec import DistributedConfig
from hpcrl.config.experiment import EnvConfig
from hpcrl.config.hparams import AlphaZeroConfig
from hpcrl.config.load import load_experiment
from hpcrl.distributed import runstats, wire
from hpcrl.distributed.pace import Pace
from hpcrl.distributed.selfplay import AlphaZeroLearner, SelfPlayActor
from hpcrl.rl import checkpoint
from hpcrl.rl.alphazero import network_evaluator
from hpcrl.store.expdir import load_runs, read_jobs, run_dir
from hpcrl.submit.pipeline import submit_experiment

TTT = EnvConfig(id="hpcrl.games.tictactoe:TicTacToe", backend="game")
CPU = torch.device("cpu")

CONFIG: dict[str, Any] = {
    "name": "selfplay",
    "algo": "alphazero",
    "env": {"backend": "game", "id": "hpcrl.games.tictactoe:TicTacToe", "num_envs": 1},
    "train": {
        "total_steps": 8000, "simulations": 16, "games_per_iteration": 16, "train_steps_per_iteration": 16, "batch_size": 64,
        "replay_window": 4000, "hidden_sizes": [32], "checkpoint_every": 20, "opponents": ["random", "perfect"],
    },
    "distributed": {
        "actors": 2, "envs_per_actor": 8, "batch_transitions": 32, "queue_bound": 4, "publish_every": 10, "max_lag": 50, "ratio_slack": 0.25,
        "heartbeat_s": 0.5, "dead_after_s": 2.0, "learner_timeout_s": 180.0, "redis": {"bind": "127.0.0.1"},
    },
    "sweep": {"seeds": [0]},
    "resources": {"cpus": 1, "mem": "1G", "time": "00:10:00", "signal_seconds": 60},
    "eval": {"episodes": 6, "every_steps": 1600, "periodic_episodes": 4},
}


def halves(**train: Any) -> tuple[AlphaZeroConfig, DistributedConfig, games.GameSpec]:
    cfg = AlphaZeroConfig(**{"total_steps": 10_000, "simulations": 4, "games_per_iteration": 4, "train_steps_per_iteration": 6, "batch_size": 16, "hidden_sizes": [16], **train})
    return cfg, DistributedConfig(actors=1, envs_per_actor=4, batch_transitions=16), games.load(TTT)


def played_batch(actor: SelfPlayActor, positions: int) -> wire.Message:
    while actor.ready() < positions:
        actor.step()
    return wire.decode(wire.encode(wire.BATCH, 0, 0, 0, actor.take_batch()))


# ---------------------------------------------------------------------------- the halves


def test_self_play_sends_whole_games_and_the_trainer_learns_at_the_simple_modes_ratio() -> None:
    cfg, d, spec = halves()
    actor = SelfPlayActor(cfg, d, spec, 0, seed=0)
    learner = AlphaZeroLearner(cfg, d, spec, CPU)
    actor.load_params(wire.decode(wire.encode(wire.PARAMS, 0, 0, 0, learner.params())).fields)
    message = played_batch(actor, 16)
    n = learner.validate(message)
    lengths = message.fields["ep_length"]
    assert n == lengths.sum() >= 16 and len(lengths) >= 2  # whole games, several of them
    # Each position's target is the outcome for the player who moved there: in tic-tac-toe the mover alternates.
    ends = np.cumsum(lengths)
    last = message.fields["value"][ends - 1]
    np.testing.assert_array_equal(np.abs(last), np.abs(message.fields["ep_return"]))
    learner.ingest(message.fields, n)
    assert learner.credit == pytest.approx(len(lengths) * 6 / 4)  # train_steps_per_iteration / games_per_iteration per game
    fixed = Pace(0.0, per_poll=8)
    assert fixed.may_update(learner, cfg.total_steps) and len(learner.replay) == n
    before = {k: v.clone() for k, v in learner.policy.state_dict().items()}
    while fixed.may_update(learner, cfg.total_steps):
        metrics = learner.update(cfg.total_steps)
    assert learner.updates == int(len(lengths) * 6 / 4) and np.isfinite(metrics["policy_loss"])
    assert any(not torch.equal(before[k], v) for k, v in learner.policy.state_dict().items())


def test_a_self_play_job_searches_with_the_weights_it_loaded_last() -> None:
    """The actor's evaluator is a copy of the weights (network_evaluator); loading new ones makes a new one."""
    cfg, d, spec = halves()
    actor = SelfPlayActor(cfg, d, spec, 0, seed=0)
    learner = AlphaZeroLearner(cfg, d, spec, CPU)
    with torch.no_grad():
        for p in learner.policy.parameters():
            p.add_(0.5)
    states = [spec.new_initial_state() for _ in range(3)]
    trained = network_evaluator(learner.policy, CPU)(states)[1]
    assert not np.allclose(actor.evaluate(states)[1], trained)
    actor.load_params(wire.decode(wire.encode(wire.PARAMS, 0, 0, 0, learner.params())).fields)
    np.testing.assert_allclose(actor.evaluate(states)[1], trained, atol=1e-6)


def test_the_budget_cuts_the_last_batch_and_counts_the_part_of_a_game_that_came_in() -> None:
    cfg, d, spec = halves(total_steps=20)
    learner = AlphaZeroLearner(cfg, d, spec, CPU)
    fields = played_batch(SelfPlayActor(cfg, d, spec, 0, seed=1), 16).fields
    first = int(fields["ep_length"][0])
    learner.ingest(fields, first + 2)
    assert learner.global_step == len(learner.replay) == first + 2
    assert learner.games == pytest.approx(1 + 2 / fields["ep_length"][1])


def test_the_trainer_refuses_batches_that_would_poison_training() -> None:
    cfg, d, spec = halves()
    learner = AlphaZeroLearner(cfg, d, spec, CPU)
    good = played_batch(SelfPlayActor(cfg, d, spec, 0, seed=2), 8).fields
    n = len(good["value"])

    def changed(**change: np.ndarray) -> wire.Message:
        return wire.decode(wire.encode(wire.BATCH, 0, 0, 0, {**good, **change}))

    illegal = np.array(good["policy"])
    row = int(np.flatnonzero((~good["legal"]).any(-1))[0])  # a position after the first move: some moves are taken
    illegal[row] = np.where(good["legal"][row], 0.0, 1.0 / (~good["legal"][row]).sum())  # a distribution, but over taken squares
    nan_obs = np.array(good["obs"])
    nan_obs[1, 0] = np.nan
    for bad, reason in [
        ({"policy": illegal}, "not a distribution over the legal moves"),
        ({"obs": nan_obs}, "non-finite"),
        ({"value": np.full(n, 1e6, np.float32)}, "'value' of 1e\\+06 outside \\[-1, 1\\]"),  # issue 37 item 13: value_loss 1.56e+10 before
        ({"value": np.where(np.arange(n) == n - 1, -1.5, good["value"]).astype(np.float32)}, "'value' of -1.5 outside"),
        ({"ep_return": np.full(len(good["ep_return"]), 2.0, np.float32)}, "'ep_return' of 2 outside"),
        ({"ep_length": good["ep_length"] + 1}, "whole games"),
        ({"ep_length": np.maximum(good["ep_length"] - 1, 1)}, "whole games"),  # fewer positions than the batch claims
        ({"value": np.zeros(n - 1, np.float32)}, "disagree"),
        ({"obs": np.zeros((n, 3), np.float32)}, "'obs'"),
        ({"legal": np.ones((n, 9), np.uint8)}, "'legal'"),
    ]:
        with pytest.raises(wire.MalformedMessage, match=reason):
            learner.validate(changed(**bad))
    assert learner.validate(changed()) == n


def test_a_requeued_trainer_resumes_weights_optimizer_window_version_and_credit(tmp_path: Path) -> None:
    cfg, d, spec = halves()
    fields = played_batch(SelfPlayActor(cfg, d, spec, 0, seed=3), 32).fields
    n = len(fields["value"])

    def fresh() -> AlphaZeroLearner:
        torch.manual_seed(0)
        return AlphaZeroLearner(cfg, d, spec, CPU)

    first = fresh()
    first.ingest(fields, n)
    for _ in range(3):
        first.update(cfg.total_steps)
    first.version = 2
    np.random.seed(7)
    path = checkpoint.save(tmp_path, first.global_step, {"agent": first.state_dict(), "rng": checkpoint.rng_state()})
    after_first = first.update(cfg.total_steps)

    np.random.seed(99)  # what a new process would have
    resumed = fresh()
    for p in resumed.policy.parameters():
        torch.nn.init.zeros_(p)
    state = checkpoint.load(path)
    resumed.load_state_dict(state["agent"])
    checkpoint.set_rng_state(state["rng"])
    assert (resumed.updates, resumed.version, resumed.global_step, len(resumed.replay)) == (3, 2, n, n)
    assert resumed.credit == pytest.approx(first.credit + 1)
    after_resumed = resumed.update(cfg.total_steps)  # the same minibatch, weights and optimiser moments: the same step
    assert after_resumed == pytest.approx(after_first)
    for a, b in zip(resumed.policy.state_dict().values(), first.policy.state_dict().values()):
        assert torch.equal(a, b)
    # The eval stage reads a trainer's checkpoint as it reads the simple mode's: the network under `policy`.
    assert set(state["agent"]["policy"]) == set(first.policy.state_dict())


def test_status_line_shows_games_and_positions_per_second(tmp_path: Path) -> None:
    runstats.write(tmp_path, {
        "time": time.time(), "status": "running", "actors_alive": 1, "actors_expected": 2, "actors_dead": [1], "units": ["positions", "games"],
        "episodes_per_s": 12.0, "env_sps": 1500.0, "queue_depth": 3, "queue_bound": 4, "lag_mean": 1.5, "lag_max": 3,
        "busy_s": 24.0, "learning_s": 25.0, "wait_s": 0.4, "pace": 1.0416, "ratio_slack": 0.25,
    })  # fmt: skip
    line = runstats.status_line(tmp_path)
    assert line is not None and line.startswith("running: actors 1/2 alive (dead: 1), 12 games/s, 1.5k positions/s, queue 3/4, lag 1.5 (max 3)"), line
    assert line.endswith("learner busy 96%, waited 0.4 s, updates 1.04x the set ratio (slack 0.25)"), line
    # Where the dead one last reported from: a node that died takes all its actors with it.
    runstats.write(tmp_path, {**runstats.read(tmp_path), "actors": {"0": {"host": "node3"}, "1": {"host": "node7"}}})
    assert "actors 1/2 alive (dead: 1 on node7), " in (runstats.status_line(tmp_path) or ""), runstats.status_line(tmp_path)


# ---------------------------------------------------------------------------- bad input at sweep time


def write(tmp_path: Path, changes: dict, train: dict | None = None) -> Path:
    """The decoupled config with `changes`; `train` replaces the train section whole."""
    data = deep_update({**CONFIG, "output": str(tmp_path / "logs")}, changes)
    if train is not None:
        data["train"] = train
    path = tmp_path / "selfplay.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(("changes", "train", "key"), [
    ({"algo": "ppo", "env": {"backend": "gymnasium", "id": "CartPole-v1"}}, {"total_steps": 1000}, "distributed"),
    ({"distributed": {"actors": 0}}, None, "distributed.actors"),
    ({"distributed": {"envs_per_actor": 0}}, None, "distributed.envs_per_actor"),
    ({"distributed": {"prioritized": True}}, None, "distributed.prioritized"),
    ({"distributed": {"dead_after_s": 0.5}}, None, "distributed.dead_after_s"),
    ({"distributed": {"ratio_slack": 1.5}}, None, "distributed.ratio_slack"),
    ({"distributed": {"ratio_slack": -0.1}}, None, "distributed.ratio_slack"),
    ({"distributed": {"ratio_slack": float("nan")}}, None, "distributed.ratio_slack"),
    ({"distributed": {"ratio_slack": "a lot"}}, None, "distributed.ratio_slack"),
    ({"train": {"simulations": 0}}, None, "train.simulations"),
])  # fmt: skip
def test_bad_decoupled_settings_are_refused_in_one_line(tmp_path: Path, changes: dict, train: dict | None, key: str) -> None:
    code, err = sweep(write(tmp_path, changes, train))
    assert_refused(tmp_path, code, err, key)


# ---------------------------------------------------------------------------- real Slurm and Grid Engine


@pytest.fixture(params=[pytest.param("slurm", marks=[pytest.mark.slurm, pytest.mark.redis])])
def cluster(request: pytest.FixtureRequest) -> Backend:
    """Slurm. Grid Engine runs the decoupled jobs in tests/e2e/test_sge_multihost.py (trainer and self-play on
    its hosts, the trainer cut off, rescheduled and resumed); its warning-and-requeue of a task is the conformance
    tests'. What this test adds (the killed self-play job in `hpcrl status`, the strength curve without a gap
    across the requeue) is the same whatever the scheduler; run on both, it was ~90 s of a worker each."""
    request.getfixturevalue(f"{request.param}_cluster")
    return BACKENDS[request.param]()


def wait_stats(rd: Path, ok, timeout: float, what: str) -> dict:
    found: dict = {}

    def check() -> bool:
        stats = runstats.read(rd)
        if stats is not None and ok(stats):
            found.update(stats)
            return True
        return False

    try:
        wait_until(what, check, timeout)
    except AssertionError:
        raise AssertionError(f"{what}: not within {timeout:g} s; last stats: {runstats.read(rd)}") from None
    return found


def test_decoupled_run_survives_a_killed_self_play_job_and_a_requeued_trainer(cluster: Backend, tmp_path: Path) -> None:
    # The head's address on the test clusters' bridge: a cluster may place the jobs on different hosts, so a
    # loopback board is refused at sweep time (tests/test_netaddr.py); these jobs all run on the head.
    exp = load_experiment(write(tmp_path, {"distributed": {"redis": {"bind": HEAD_ADDRESS}}}))
    out = io.StringIO()
    since = time.time()
    assert submit_experiment(exp, cluster.name, detach=True, out=out) == 0, out.getvalue()
    jobs = read_jobs(exp.dir)
    assert [(j.stage, j.size) for j in jobs] == [("learner", 1), ("actors", 2), ("eval", 1), ("aggregate", 0)]
    (run,) = load_runs(exp.dir)
    rd = run_dir(exp.dir, run.run_id)
    cfg = run.config
    total, every = cfg.train.total_steps, cfg.eval.every_steps

    # Self-play feeds a learning trainer; a self-play job dies without a word. Either job may be the one:
    # on a cluster busy with other work the second may start only later, and then joins the run.
    stats = wait_stats(rd, lambda s: s["actors_alive"] >= 1 and s["updates"] > 0, 240, "self-play feeding the trainer")
    assert stats["env_steps"] < total / 2, "the run went too fast to be interrupted mid-run: raise train.total_steps"
    killed = max(int(i) for i, a in stats["actors"].items() if a["alive"])
    survivor = 1 - killed
    os.kill(int(stats["actors"][str(killed)]["pid"]), signal.SIGKILL)
    wait_stats(rd, lambda s: s["actors_dead"] == [killed], 30, "the killed self-play job reported dead")
    text = status_text(exp.dir)
    assert re.search(rf"actors [01]/2 alive \(dead: {killed} on \S+\), \S+ games/s, \S+ positions/s, queue \d+/4, lag", text), text
    assert re.search(r"learner busy \d+%, waited [\d.]+ s, updates [\d.]+x the set ratio \(slack 0.25\)", text), text

    # The trainer is warned (time limit, preemption) after its first evaluation, and requeued.
    curve = rd / "strength_curve.csv"
    wait_until("the first evaluation during training", lambda: curve.exists() and len(csv_rows(curve)) >= 2, 240)
    learner = next(j for j in jobs if j.stage == "learner")
    cluster.warn(exp.dir, learner, 1)
    summary = exp.dir / "results" / "summary.csv"
    wait_until(
        f"the run to finish on {cluster.name}", lambda: summary.exists() and summary.stat().st_mtime >= since and not active_tasks(exp.dir, cluster), 300,
    )

    log = "".join(p.read_text() for p in sorted((exp.dir / "jobs" / "logs").glob("learner-*")))
    signalled = re.search(r"signal \d+ at step (\d+): checkpointed", log)
    resumed = re.search(r"resumed from step (\d+) ", log)
    assert signalled and resumed and signalled.group(1) == resumed.group(1), log
    assert 0 < int(resumed.group(1)) < total
    assert (rd / "DONE").read_text().strip() == f"step {total}"
    eval_log = "".join(p.read_text() for p in (exp.dir / "jobs" / "logs").glob("eval-*"))
    assert (rd / "EVAL_DONE").exists(), eval_log + "".join(p.read_text() for p in rd.glob("EVAL_*"))
    assert {r["opponent"] for r in csv_rows(rd / "strength.csv")} == {"random", "perfect"}
    actors_log = "".join(p.read_text() for p in (exp.dir / "jobs" / "logs").glob("actors-*"))
    final = runstats.read(rd)
    assert final is not None and f"actor {survivor}: connected to learner {final['instance']}" in actors_log, actors_log  # it played for the requeued trainer
    assert f"actor {killed}: connected to learner" in actors_log and f"actor {killed}: run done" not in actors_log  # killed: no word after that

    # The strength curve has no gap: per opponent, one evaluation at the first step at or after every
    # multiple of eval.every_steps, and one at the end; none twice, none lost to the requeue.
    rows = csv_rows(curve)
    for opponent in ("random", "perfect"):
        steps = [int(r["step"]) for r in rows if r["opponent"] == opponent]
        assert steps == sorted(set(steps)) and steps[-1] == total, steps
        assert [s // every for s in steps[:-1]] == list(range(1, total // every + (total % every > 0))), steps
    print(f"\n{cluster.name}: self-play job {killed} killed at step {stats['env_steps']} ({stats['actors_alive']} of 2 alive), trainer warned at step "
          f"{signalled.group(1)}, strength curve at steps {sorted({int(r['step']) for r in rows})}")
