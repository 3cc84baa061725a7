"""The background rollout (`train.async_rollout`): the envs collect the next rollout with a copy of
the policy while the update of the last one runs."""

from __future__ import annotations

import csv
import signal
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from test_algorithms import CARTPOLE, PPO_CARTPOLE, greedy_return, make_agent, train
from trainruns import warn_once_logged

from hpcrl.config.experiment import EnvConfig
from hpcrl.config.load import experiment_from_dict
from hpcrl.rl import checkpoint
from hpcrl.rl.ppo import PPO
from hpcrl.rl.rollout import THREAD_NAME
from hpcrl.rl.train import train_run
from hpcrl.store.states import REQUEUE_EXIT
from hpcrl.sweep.runs import expand


def _rollout_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


def test_async_rollout_holds_what_the_envs_produced_with_the_behaviour_policys_logprobs() -> None:
    """Each rollout an update reads holds exactly the envs' own observations and rewards for the
    actions stored beside them (replayed on fresh envs from the same seed: the rollouts follow
    each other without a gap), and log-probabilities of those actions under the behaviour policy:
    the policy before the previous update (one iteration of lag), not the learner's."""
    agent = make_agent("ppo", EnvConfig(id="CartPole-v1", num_envs=3), total_steps=10_000, num_steps=20, async_rollout=True, **{k: v for k, v in PPO_CARTPOLE.items() if k != "num_steps"})
    assert agent.async_rollout
    weights, rollouts = [], []
    try:
        for _ in range(4):
            weights.append({k: v.clone() for k, v in agent.policy.state_dict().items()})
            agent.train_iteration()
            r = agent.rollout
            rollouts.append((r.obs.clone(), r.actions.clone(), r.logprobs.clone(), r.rewards.copy(), r.firsts.copy()))
        learner = {k: v.clone() for k, v in agent.policy.state_dict().items()}
    finally:
        agent.close()
        agent.envs.close()
    assert agent.global_step == 4 * 60  # rollouts updated from; the one in flight is not counted

    behaviour = PPO.make_policy(agent.cfg, agent.envs.single_observation_space, agent.envs.single_action_space)
    for k, (obs, actions, logprobs, _, _) in enumerate(rollouts):
        behaviour.load_state_dict(weights[max(k - 1, 0)])
        with torch.no_grad():
            expected, _, _ = behaviour.evaluate_params(obs.flatten(0, 1), actions.flatten(0, 1))
        torch.testing.assert_close(logprobs.flatten(), expected, rtol=0, atol=1e-6)
    behaviour.load_state_dict(learner)
    with torch.no_grad():
        theirs, _, _ = behaviour.evaluate_params(rollouts[-1][0].flatten(0, 1), rollouts[-1][1].flatten(0, 1))
    assert (theirs - rollouts[-1][2].flatten()).abs().max() > 1e-4, "the learner's own log-probs: no lag to correct"

    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(3)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    obs, _ = envs.reset(seed=0)
    first = np.ones(3, dtype=np.float32)
    for stored_obs, actions, _, rewards, firsts in rollouts:
        for t in range(20):
            np.testing.assert_array_equal(stored_obs[t].numpy(), obs)
            np.testing.assert_array_equal(firsts[t], first)
            obs, reward, terminated, truncated, _ = envs.step(actions[t].numpy())
            np.testing.assert_array_equal(rewards[t], reward.astype(np.float32))
            first = (terminated | truncated).astype(np.float32)
    envs.close()
    assert not _rollout_threads()


def test_auto_overlaps_for_worker_processes_only() -> None:
    grouped = make_agent("ppo", EnvConfig(id="CartPole-v1", num_envs=2, vectorization="async"), total_steps=64, num_steps=8)
    inline = make_agent("ppo", EnvConfig(id="CartPole-v1", num_envs=2), total_steps=64, num_steps=8)
    try:
        assert grouped.async_rollout and not inline.async_rollout
        train(grouped)
    finally:
        grouped.close()
        grouped.envs.close()
        inline.envs.close()
    assert grouped.global_step == 64 and not _rollout_threads()


def test_an_env_failure_in_the_background_rollout_fails_the_iteration() -> None:
    agent = make_agent("ppo", EnvConfig(id="CartPole-v1", num_envs=2), total_steps=1000, num_steps=8, async_rollout=True)

    def broken(actions: np.ndarray) -> None:
        raise RuntimeError("worker 1 died")

    agent.envs.step = broken
    try:
        with pytest.raises(RuntimeError, match="worker 1 died"):
            agent.train_iteration()
    finally:
        agent.close()
        agent.envs.close()
    assert not _rollout_threads()


@pytest.mark.slow
def test_async_ppo_learns_cartpole() -> None:
    agent = make_agent("ppo", CARTPOLE, total_steps=10_000, async_rollout=True, **PPO_CARTPOLE)
    try:
        train(agent)
    finally:
        agent.close()
    assert greedy_return(agent.policy, CARTPOLE) > 100  # random: ~20; seeds 0-2 gave 150-500 (as the synchronous path)


def test_interrupted_async_run_resumes_from_an_iteration_boundary_and_logs_each_step_once(tmp_path: Path) -> None:
    """`hpcrl train` warned mid-run with a rollout in flight: the checkpoint is the state at an
    iteration boundary (the in-flight rollout is discarded and not counted), the rollout thread
    ends, and the rerun continues from that step to the end."""
    exp = experiment_from_dict(
        {
            "name": "resume", "algo": "ppo", "output": str(tmp_path),
            "env": {"id": "CartPole-v1", "num_envs": 2},
            "train": {"total_steps": 4000, "num_steps": 16, "checkpoint_every": 1000, "hidden_sizes": [16], "async_rollout": True},
        }  # fmt: skip
    )
    (run,) = expand(exp)
    rd = tmp_path / "resume" / "runs" / run.run_id

    warn_once_logged(rd)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)}
    try:
        assert train_run(tmp_path / "resume", run) == REQUEUE_EXIT
        assert not _rollout_threads()
        (saved,) = checkpoint.checkpoint_files(rd / "checkpoints")
        state = checkpoint.load(saved)["agent"]
        stopped = state["global_step"]
        assert 0 < stopped < 4000 and stopped == state["iteration"] * 32
        assert train_run(tmp_path / "resume", run) == 0
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    steps = [int(r["step"]) for r in csv.DictReader((rd / "train.csv").open())]
    assert steps == sorted(set(steps)) and steps[-1] == 4000 and stopped in steps
    assert steps == list(range(32, 4001, 32))
    assert (rd / "DONE").exists() and not _rollout_threads()


def test_async_rollout_is_learned_when_written_and_ids_stay_when_auto() -> None:
    """Runs with and without the overlap learn differently, so they are not pooled; left at
    `auto` (hpcrl's choice per env kind) the ids of existing experiments stay what they were."""
    base = {"name": "ids", "algo": "ppo", "env": {"id": "CartPole-v1"}, "train": {"total_steps": 10_000, "lr": 0.001}, "sweep": {"seeds": [0]}}
    ids = {v: expand(experiment_from_dict({**base, "train": {**base["train"], "async_rollout": v}}))[0].run_id for v in ("auto", True, False)}
    assert ids["auto"] == expand(experiment_from_dict(base))[0].run_id == "2edf0fed8c-s0"  # tests/sweep/test_run_identity.py's golden id
    assert len(set(ids.values())) == 3


@pytest.mark.e2e
def test_warned_two_rank_async_run_resumes_on_both_ranks(tmp_path: Path) -> None:
    """DD-PPO with the overlap: each rank's rollout thread collects while the ranks' update
    averages gradients; warned, both ranks stop at the same iteration, rank 0's checkpoint is
    every rank's, and both resume from it to the end with no step twice."""
    import re

    from test_conformance import Local, csv_rows, sweep, wait_finished, wait_until

    from hpcrl.store.expdir import load_runs, read_jobs, run_dir

    since = time.time()
    backend = Local()
    exp_dir, _ = sweep(tmp_path, backend, "sweep.seeds=[0]", "resources.ranks=2", "train.total_steps=20480", "train.checkpoint_every=5", "train.async_rollout=true")
    train_job = read_jobs(exp_dir)[0]
    (run,) = load_runs(exp_dir)
    rd = run_dir(exp_dir, run.run_id)
    wait_until("the first checkpoint", lambda: any((rd / "checkpoints").glob("*.pt")), 180)
    backend.warn(exp_dir, train_job, 1)
    wait_finished(exp_dir, backend, since)
    log = "".join(p.read_text() for p in sorted((exp_dir / "jobs" / "logs").glob("train-*")))
    signalled = re.findall(r"signal \S+ at step (\d+): checkpointed", log)
    resumed = dict(re.findall(r"\(rank (\d)/2\): resumed from step (\d+)", log))
    assert len(signalled) == 1 and resumed == {"0": signalled[0], "1": signalled[0]}, log
    steps = [int(r["step"]) for r in csv_rows(rd / "train.csv")]
    assert steps == sorted(set(steps)) and steps[-1] == 20480, steps
    assert (rd / "DONE").exists()
