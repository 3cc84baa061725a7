"""PPO, A2C and DQN: what a user relies on, each checked where a broken algorithm would fail.

- learning: each algorithm reaches a CartPole return far above random (about 20) in a few
  thousand steps, judged by greedy evaluation on unseen seeds, not by training returns;
- toy MDPs with known answers: time limits are bootstrapped and terminations are not (the
  value of a never-ending constant reward is 1 / (1 - gamma), not the sum of the steps before
  the cut); Box actions are learned by PPO and A2C; the GRU core solves a memory task that a
  feed-forward policy cannot;
- gymnasium 1.x autoreset: DQN's replay holds every transition's true next observation, never
  a reset observation, and the done flag is termination alone;
- resume: a restored agent holds exactly the saved weights, optimiser, counters, RNG states and
  (DQN) replay buffer, and `hpcrl train` interrupted by the scheduler's signal finishes the run
  from its checkpoint with one log row per step.

Budgets are tiny so the file runs in about a minute on 2 cores.
"""

from __future__ import annotations

import csv
import os
import random
import signal
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from trainruns import warn_once_logged

from hpcrl.config.experiment import EnvConfig
from hpcrl.config.hparams import ALGORITHMS
from hpcrl.config.load import experiment_from_dict
from hpcrl.rl import checkpoint
from hpcrl.rl.dqn import ReplayBuffer
from hpcrl.rl.envs import make_vec_env
from hpcrl.rl.networks import obs_to_tensor
from hpcrl.rl.ppo import gae
from hpcrl.rl.train import algorithm_class, seed_everything, setup_torch, train_run
from hpcrl.store.states import REQUEUE_EXIT
from hpcrl.sweep.runs import expand

CPU = torch.device("cpu")


# ---------------------------------------------------------------- toy environments
class ConstantReward(gym.Env):
    """Reward 1 at every step from one unchanging observation; ends by termination after
    `terminate_after` steps, or never (then only a time limit cuts it)."""

    observation_space = gym.spaces.Box(0.0, 1.0, (1,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, terminate_after: int | None = None) -> None:
        self.terminate_after = terminate_after

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.ones(1, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return np.ones(1, np.float32), 1.0, self.t == self.terminate_after, False, {}


class Counter(gym.Env):
    """The observation is the step count, so every transition's next observation is known: obs + 1.
    Episodes end by termination at 7 steps unless a time limit (5) cuts them first."""

    observation_space = gym.spaces.Box(0.0, 100.0, (1,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, terminate_after: int = 7) -> None:
        self.terminate_after = terminate_after

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return np.full(1, self.t, np.float32), 0.0, self.t >= self.terminate_after, False, {}


class MatchTarget(gym.Env):
    """One-step continuous bandit: reward -(action - target)^2 for a target shown in the observation."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), dtype=np.float32)
    action_space = gym.spaces.Box(-2.0, 2.0, (1,), dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.target = self.np_random.uniform(-1, 1, 1).astype(np.float32)
        return self.target.copy(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        return self.target.copy(), -float(((action - self.target) ** 2).sum()), True, False, {}


class RecallCue(gym.Env):
    """A cue (+1 or -1) is shown at the first step only, then blanks; at the third step the action
    must name it (+1 if right, -1 if wrong). Without memory the best expected return is 0."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.cue, self.t = int(self.np_random.integers(2)), 0
        return np.array([2 * self.cue - 1, 1], np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        if self.t < 3:
            return np.zeros(2, np.float32), 0.0, False, False, {}
        return np.zeros(2, np.float32), 1.0 if int(action) == self.cue else -1.0, True, False, {}


class NaNReward(gym.Env):
    """CartPole-shaped observations whose rewards turn NaN after 40 steps (a broken simulator)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)
    steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        NaNReward.steps += 1
        reward = float("nan") if NaNReward.steps > 40 else 1.0
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), reward, bool(self.np_random.random() < 0.1), False, {}


for _name, _cls in (("ConstantReward", ConstantReward), ("Counter", Counter), ("MatchTarget", MatchTarget), ("RecallCue", RecallCue), ("NaNReward", NaNReward)):
    if f"hpcrl-test/{_name}-v0" not in gym.registry:
        gym.register(f"hpcrl-test/{_name}-v0", entry_point=_cls)


# ---------------------------------------------------------------- helpers
def make_agent(algo: str, env: EnvConfig, seed: int = 0, **train: Any) -> Any:
    seed_everything(seed)
    torch.set_num_threads(1)
    return algorithm_class(algo)(ALGORITHMS[algo](**train), make_vec_env(env), CPU, seed)


def train(agent: Any) -> Any:
    try:
        while not agent.finished:
            agent.train_iteration()
    finally:
        agent.envs.close()
    return agent


def greedy_return(policy: torch.nn.Module, env: EnvConfig, episodes: int = 8, seed: int = 10_000) -> float:
    envs = make_vec_env(env, min(episodes, 8))
    obs, _ = envs.reset(seed=seed)
    returns: list[float] = []
    try:
        while len(returns) < episodes:
            obs, _, terminated, truncated, info = envs.step(policy.act(obs_to_tensor(obs, CPU), True).numpy())
            policy.reset_memory(terminated | truncated)
            if "_episode" in info:
                returns += info["episode"]["r"][info["_episode"]].tolist()
    finally:
        envs.close()
    return float(np.mean(returns))


CARTPOLE = EnvConfig(id="CartPole-v1", num_envs=8)
# RL Zoo's tuned CartPole sets (configs/cartpole_*.yaml) with tiny budgets.
PPO_CARTPOLE = dict(lr=1e-3, num_steps=32, num_minibatches=1, update_epochs=20, gamma=0.98, gae_lambda=0.8, anneal_clip=True, ent_coef=0.0, clip_vloss=False)
DQN_CARTPOLE = dict(lr=2.3e-3, buffer_size=20_000, batch_size=64, learning_starts=1000, train_freq=256, gradient_steps=64,
                    target_update_freq=10, end_e=0.04, exploration_fraction=0.16, loss="huber", hidden_sizes=[64, 64])  # fmt: skip


# ---------------------------------------------------------------- learning on CartPole
@pytest.mark.slow
def test_ppo_learns_cartpole() -> None:
    agent = train(make_agent("ppo", CARTPOLE, total_steps=10_000, **PPO_CARTPOLE))
    assert greedy_return(agent.policy, CARTPOLE) > 100  # random: ~20; seeds 0-5 gave 128-467 (seed 0: 169)


@pytest.mark.slow
def test_a2c_learns_cartpole() -> None:
    agent = train(make_agent("a2c", CARTPOLE, total_steps=15_000))
    assert greedy_return(agent.policy, CARTPOLE) > 200  # seeds 0-2 gave 367-499


@pytest.mark.slow
def test_dqn_learns_cartpole() -> None:
    agent = train(make_agent("dqn", EnvConfig(id="CartPole-v1", num_envs=1), total_steps=10_000, **DQN_CARTPOLE))
    assert greedy_return(agent.policy, CARTPOLE) > 100  # seeds 0-2 gave 165-306


@pytest.mark.parametrize("normalize_obs", [False, True])
def test_rollout_values_from_one_batched_pass_equal_per_step_values(normalize_obs: bool) -> None:
    """A separate critic values the rollout after it; the stored values are what the critic
    gives each observation, so GAE and PPO's value clipping see the same numbers as per step."""
    agent = make_agent("ppo", CARTPOLE, total_steps=1024, num_steps=16, normalize_obs=normalize_obs)
    try:
        assert agent.values_after_rollout
        agent.train_iteration()  # moves the weights and, with normalize_obs, the statistics
        agent.collect()
        with torch.no_grad():
            per_step = torch.stack([agent.policy.value(agent.obs[t]) for t in range(16)])
        torch.testing.assert_close(agent.values, per_step)
        assert agent.values.abs().sum() > 0
    finally:
        agent.envs.close()


# ---------------------------------------------------------------- toy MDPs with known answers
GAMMA = 0.9
NEVER_ENDING = EnvConfig(id="hpcrl-test/ConstantReward-v0", num_envs=4, max_episode_steps=5)
ENDS_AT_5 = EnvConfig(id="hpcrl-test/ConstantReward-v0", num_envs=4, kwargs={"terminate_after": 5})
# Reward 1 forever: V = 1 / (1 - 0.9) = 10. Terminating after 5 steps, with one observation for
# all 5 states: the Monte Carlo average of (1 - 0.9^k) / 0.1 over k = 1..5 is 2.63 (on-policy,
# lambda 1), and the one-step TD fixed point Q = 1 + 0.9 * 4/5 * Q gives 3.57 (DQN; n_step_td_value).
TRUE_VALUE = 1 / (1 - GAMMA)
FIVE_STEP_VALUE = float(np.mean([(1 - GAMMA**k) / (1 - GAMMA) for k in range(1, 6)]))


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_on_policy_bootstraps_time_limits_but_not_terminations(algo: str) -> None:
    settings = dict(total_steps=4000, gamma=GAMMA, lr=1e-2, anneal_lr=False, hidden_sizes=[8], num_steps=5, gae_lambda=1.0)
    if algo == "ppo":
        settings["num_minibatches"] = 1
    obs = torch.ones(1, 1)
    cut = train(make_agent(algo, NEVER_ENDING, **settings)).policy.value(obs).item()
    ended = train(make_agent(algo, ENDS_AT_5, **settings)).policy.value(obs).item()
    assert cut == pytest.approx(TRUE_VALUE, abs=1.5)
    assert ended == pytest.approx(FIVE_STEP_VALUE, abs=1.0)


def n_step_td_value(n: int) -> float:
    """ENDS_AT_5's TD fixed point with n-step targets: from m = 1..5 steps before the end (equally
    often), the target is the m-step return if m <= n, else the n-step return plus gamma^n Q."""
    partial = [sum(GAMMA**k for k in range(min(m, n))) for m in range(1, 6)]
    bootstrapped = sum(m > n for m in range(1, 6)) / 5
    return float(np.mean(partial)) / (1 - GAMMA**n * bootstrapped)


@pytest.mark.parametrize("n_step", [1, 3])
def test_dqn_bootstraps_time_limits_but_not_terminations(n_step: int) -> None:
    settings = dict(total_steps=3000, gamma=GAMMA, lr=3e-3, buffer_size=3000, batch_size=64, learning_starts=200,
                    train_freq=4, gradient_steps=2, target_update_freq=50, hidden_sizes=[16], n_step=n_step)  # fmt: skip
    obs = torch.ones(1, 1)
    cut = train(make_agent("dqn", NEVER_ENDING, **settings)).policy(obs).max().item()
    ended = train(make_agent("dqn", ENDS_AT_5, **settings)).policy(obs).max().item()
    assert cut == pytest.approx(TRUE_VALUE, abs=1.5)
    assert ended == pytest.approx(n_step_td_value(n_step), abs=0.4)  # n = 1: 3.57, n = 3: 3.11; seeds 0-3 gave +0.0 to +0.29


def test_dqn_replay_holds_true_next_observations_across_autoresets() -> None:
    """With 3 envs, time limit 5 and termination at 7: every stored next_obs is obs + 1 (a reset
    observation, 0, would break that), and no transition is marked terminated, since all are cut."""
    env = EnvConfig(id="hpcrl-test/Counter-v0", num_envs=3, max_episode_steps=5)
    agent = train(make_agent("dqn", env, total_steps=60, buffer_size=100, batch_size=8, learning_starts=1000, train_freq=3))
    b, n = agent.buffer, len(agent.buffer)
    assert n == 60
    np.testing.assert_array_equal(b.next_obs[:n], b.obs[:n] + 1)
    assert b.obs[:n].max() == 4 and not b.terminated[:n].any()
    np.testing.assert_array_equal(b.done[:n], b.next_obs[:n, 0] == 5)  # a cut still ends an n-step return
    assert len(agent.episodes) == 12 and {length for _, length in agent.episodes} == {5}

    agent = train(make_agent("dqn", EnvConfig(id="hpcrl-test/Counter-v0", num_envs=2), total_steps=28, buffer_size=100, batch_size=8, learning_starts=1000))
    b, n = agent.buffer, len(agent.buffer)
    np.testing.assert_array_equal(b.next_obs[:n], b.obs[:n] + 1)
    np.testing.assert_array_equal(b.terminated[:n], (b.next_obs[:n, 0] == 7).astype(np.float32))
    assert b.terminated[:n].sum() == 4


def test_dqn_n_step_targets_match_each_envs_own_episode() -> None:
    """Two envs interleaved in a small ring that wraps: every sampled n-step transition equals the
    return walked along that env's own stream: it stops at a termination (no bootstrap), at a
    truncation (bootstrap from the true last observation) and at the newest stored transition."""
    gamma, n, num_envs, capacity = 0.5, 3, 2, 16
    space = gym.spaces.Box(0.0, 1e6, (1,), dtype=np.float32)
    buffer = ReplayBuffer(capacity, space, num_envs, n, gamma)
    rng = np.random.default_rng(0)
    streams: list[list[tuple[float, float, float, bool, bool]]] = [[], []]  # (id, reward, next_id, terminated, done)
    for t in range(23):  # 46 transitions through 16 slots
        ids = np.array([2 * t, 2 * t + 1], np.float32)
        rewards = rng.integers(1, 9, 2).astype(np.float32)
        terminated, truncated = rng.random(2) < 0.15, rng.random(2) < 0.15
        buffer.add(ids[:, None], ids[:, None] + 1000, np.zeros(2), rewards, terminated.astype(np.float32), terminated | truncated)
        for e in range(num_envs):
            streams[e].append((ids[e], rewards[e], ids[e] + 1000, bool(terminated[e]), bool(terminated[e] or truncated[e])))
    stored = {ident for stream in streams for ident, *_ in stream[-capacity // num_envs :]}
    expected = {}
    for stream in streams:
        for i, (ident, *_) in enumerate(stream):
            ret, discount, next_id = 0.0, 0.0, 0.0
            for k, (_, reward, next_ident, term, done) in enumerate(stream[i : i + n]):
                ret, discount, next_id = ret + gamma**k * reward, gamma ** (k + 1) * (not term), next_ident
                if done:
                    break
            expected[ident] = (ret, discount, next_id)
    np.random.seed(0)
    batch = buffer.sample(4096, CPU)
    seen = {int(i) for i in batch["obs"][:, 0].tolist()}
    assert seen == stored
    for ident, ret, discount, next_id in zip(batch["obs"][:, 0].tolist(), batch["rewards"].tolist(), batch["discount"].tolist(), batch["next_obs"][:, 0].tolist()):
        assert (ret, discount, next_id) == pytest.approx(expected[ident]), ident


def test_dqn_epsilon_schedule_and_double_dqn_option() -> None:
    agent = make_agent("dqn", EnvConfig(id="CartPole-v1", num_envs=1), total_steps=1000, start_e=1.0, end_e=0.1, exploration_fraction=0.5)
    agent.envs.close()
    for step, epsilon in ((0, 1.0), (250, 0.55), (500, 0.1), (900, 0.1)):
        agent.global_step = step
        assert agent.epsilon() == pytest.approx(epsilon)
    for double in (False, True):  # both target rules learn the toy MDP's value
        settings = dict(total_steps=2000, gamma=GAMMA, lr=3e-3, buffer_size=2000, batch_size=64, learning_starts=200,
                        train_freq=4, gradient_steps=2, target_update_freq=50, hidden_sizes=[16], double_dqn=double, loss="mse")  # fmt: skip
        q = train(make_agent("dqn", ENDS_AT_5, **settings)).policy(torch.ones(1, 1)).max().item()
        assert q == pytest.approx(n_step_td_value(1), abs=0.75)


def crafted_q_network(agent: Any, online: list[float], target: list[float]) -> None:
    """Q-values that ignore the observation: the output bias alone (every weight zero)."""
    for net, bias in ((agent.policy, online), (agent.target, target)):
        with torch.no_grad():
            for param in net.parameters():
                param.zero_()
            net.head.bias.copy_(torch.tensor(bias))


# Online argmax is action 0 (Q 1), the target's max is action 1 (Q 10), the target values action 0 at 5.
ONLINE, TARGET = [1.0, 0.0], [5.0, 10.0]


@pytest.mark.parametrize("double", [False, True])
def test_dqn_target_rule_on_a_crafted_q_network(double: bool) -> None:
    """Double DQN values the ONLINE network's argmax with the target network (5 here); plain DQN
    takes the target's own max (10). The TD loss of a transition with action 0, reward 0 and
    discount 0.5 tells which: (1 - 0.5 * 5)^2 or (1 - 0.5 * 10)^2."""
    agent = make_agent("dqn", EnvConfig(id="CartPole-v1", num_envs=1), total_steps=100, buffer_size=8, batch_size=4, gamma=0.5, double_dqn=double, lr=1e-9)
    agent.envs.close()
    crafted_q_network(agent, ONLINE, TARGET)
    obs = np.zeros((4, 4), np.float32)
    agent.buffer.add(obs, obs, np.zeros(4, np.int64), np.zeros(4, np.float32), np.zeros(4, np.float32), np.zeros(4, bool))
    loss, q = agent.td_step()
    assert q.item() == 1.0
    assert loss.item() == pytest.approx((1 - 0.5 * (5.0 if double else 10.0)) ** 2)


@pytest.mark.parametrize("double", [False, True])
def test_apex_learner_target_rule_on_a_crafted_q_network(double: bool) -> None:
    from hpcrl.config.distributed_spec import DistributedConfig
    from hpcrl.config.hparams import DQNConfig
    from hpcrl.distributed.apex import ApexLearner

    cfg = DQNConfig(buffer_size=8, batch_size=4, learning_starts=0, train_freq=1, double_dqn=double, lr=1e-9)
    learner = ApexLearner(cfg, DistributedConfig(), gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2), CPU)
    crafted_q_network(learner, ONLINE, TARGET)
    obs = np.zeros((4, 4), np.float32)
    learner.ingest({"obs": obs, "action": np.zeros(4, np.int64), "reward": np.zeros(4, np.float32), "next_obs": obs, "discount": np.full(4, 0.5, np.float32)}, 4)
    metrics = learner.update(total_steps=100)
    assert metrics["q_mean"] == 1.0
    assert metrics["loss"] == pytest.approx((1 - 0.5 * (5.0 if double else 10.0)) ** 2)


def test_apex_learner_stops_at_a_non_finite_loss() -> None:
    from hpcrl.config.distributed_spec import DistributedConfig
    from hpcrl.config.hparams import DQNConfig
    from hpcrl.distributed.apex import ApexLearner

    cfg = DQNConfig(buffer_size=64, batch_size=16, learning_starts=0, train_freq=1, hidden_sizes=[8], lr=1e30)
    learner = ApexLearner(cfg, DistributedConfig(), gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2), CPU)
    rng = np.random.default_rng(0)
    obs = rng.uniform(-1, 1, (64, 4)).astype(np.float32)
    learner.ingest({"obs": obs, "action": rng.integers(2, size=64), "reward": np.ones(64, np.float32), "next_obs": obs[::-1].copy(), "discount": np.full(64, 0.9, np.float32)}, 64)
    with pytest.raises(FloatingPointError, match=r"non-finite loss at step 64 \(update \d+\)"):
        for _ in range(20):
            learner.update(total_steps=1000)


# ---------------------------------------------------------------- budgets and divergence
@pytest.mark.parametrize(("algo", "total", "per_iteration"), [("ppo", 500, 128), ("a2c", 203, 10), ("dqn", 203, 12)])
def test_the_budget_is_trained_in_full_to_whole_iterations(algo: str, total: int, per_iteration: int) -> None:
    """total_steps is rounded UP to whole iterations: never fewer steps than asked (PPO trained
    384 of 500 here and called it done), at most one iteration more, and the agent says how many."""
    extra = dict(num_steps=64) if algo == "ppo" else dict(train_freq=12, learning_starts=10_000) if algo == "dqn" else {}
    agent = train(make_agent(algo, EnvConfig(id="CartPole-v1", num_envs=2), total_steps=total, hidden_sizes=[8], **extra))
    assert agent.global_step == agent.planned_steps
    assert total <= agent.planned_steps < total + per_iteration


def diverging_run(tmp_path: Path, changes: dict) -> tuple[Path, Any]:
    from factories import deep_update

    from hpcrl.store.expdir import write_experiment

    base = {"name": "nan", "algo": "ppo", "output": str(tmp_path), "env": {"id": "CartPole-v1", "num_envs": 2},
            "train": {"total_steps": 2048, "hidden_sizes": [8]}}  # fmt: skip
    if changes.get("algo", "ppo") == "ppo":
        base["train"]["num_steps"] = 32
    exp = experiment_from_dict(deep_update(base, changes))
    (run,) = expand(exp)
    write_experiment(exp, [run], {})
    return exp.dir, run


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"train": {"lr": 1e30}}, "non-finite loss at step "),
        ({"env": {"id": "hpcrl-test/NaNReward-v0"}}, "env hpcrl-test/NaNReward-v0: step returned a reward of nan"),
        ({"algo": "dqn", "train": {"lr": 1e30, "learning_starts": 64, "train_freq": 8, "batch_size": 16, "buffer_size": 500}}, "non-finite loss at step "),
    ],
    ids=["ppo-lr-1e30", "ppo-nan-reward", "dqn-lr-1e30"],
)
def test_a_run_whose_loss_turns_non_finite_fails_with_that_reason(tmp_path: Path, changes: dict, says: str) -> None:
    """Not "done" with garbage weights and empty loss cells: FAILED, and `hpcrl status` says why.
    A NaN reward is the env's own output, named where the env returns it (not a loss blamed on train.lr)."""
    import io

    from hpcrl.status import print_status

    NaNReward.steps = 0
    root, run = diverging_run(tmp_path, changes)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)}
    try:
        assert train_run(root, run) == 1  # one line on stderr, no traceback
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    rd = root / "runs" / run.run_id
    assert not (rd / "DONE").exists()
    reason = (rd / "FAILED").read_text().splitlines()[0]
    assert reason.startswith(says)
    if says.startswith("non-finite loss"):
        step = int(reason.split("step ")[1].split()[0])
        assert 0 < step < 2048
    out = io.StringIO()
    print_status(root, out)
    assert "failed" in out.getvalue() and says in out.getvalue()


def test_dqn_refuses_box_actions() -> None:
    with pytest.raises(ValueError, match="DQN needs Discrete actions"):
        make_agent("dqn", EnvConfig(id="hpcrl-test/MatchTarget-v0", num_envs=1))


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_on_policy_learns_box_actions(algo: str) -> None:
    env = EnvConfig(id="hpcrl-test/MatchTarget-v0", num_envs=8)
    settings = dict(total_steps=6000, lr=3e-3, anneal_lr=False, hidden_sizes=[32], num_steps=16, ent_coef=0.0)
    if algo == "a2c":
        settings["norm_adv"] = True
    agent = train(make_agent(algo, env, **settings))
    assert greedy_return(agent.policy, env, episodes=64) > -0.05  # an untrained policy (mean 0): -0.33


@pytest.mark.slow
def test_gru_core_remembers_what_feed_forward_cannot() -> None:
    env = EnvConfig(id="hpcrl-test/RecallCue-v0", num_envs=8)
    settings = dict(total_steps=6000, lr=3e-3, anneal_lr=False, hidden_sizes=[16], num_steps=12, num_minibatches=2, gamma=0.99)
    recurrent = train(make_agent("ppo", env, recurrent_size=16, **settings))
    feed_forward = train(make_agent("ppo", env, **settings))
    assert greedy_return(recurrent.policy, env, episodes=64) > 0.9
    assert greedy_return(feed_forward.policy, env, episodes=64) < 0.5


def test_gae_matches_a_hand_computation() -> None:
    """One env, 3 steps, an episode boundary before step 2; lambda 1 gives discounted returns minus values."""
    rewards = np.array([[1.0], [2.0], [3.0]], np.float32)
    values = np.array([[0.5], [0.25], [1.0]], np.float32)
    firsts = np.array([[1.0], [0.0], [1.0]], np.float32)
    adv = gae(rewards, values, firsts, next_value=np.array([4.0], np.float32), next_first=np.zeros(1, np.float32), gamma=0.5, lam=1.0)
    returns = [1 + 0.5 * 2, 2.0, 3 + 0.5 * 4]
    np.testing.assert_allclose(adv[:, 0], np.array(returns) - values[:, 0])
    adv0 = gae(rewards, values, firsts, np.array([4.0], np.float32), np.zeros(1, np.float32), gamma=0.5, lam=0.0)
    np.testing.assert_allclose(adv0[:, 0], [1 + 0.5 * 0.25 - 0.5, 2 - 0.25, 3 + 0.5 * 4 - 1])


# ---------------------------------------------------------------- resume
def _draws() -> tuple[float, list[float], list[float]]:
    """The next numbers of every RNG a run draws from (exploration, minibatches, sampling)."""
    return random.random(), np.random.random(3).tolist(), torch.rand(3).tolist()


def _assert_same(a: Any, b: Any, path: str = "") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            _assert_same(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    else:
        assert a == b, path


@pytest.mark.parametrize("algo", ["ppo", "a2c", "dqn"])
def test_checkpoint_restores_everything_a_run_continues_from(algo: str, tmp_path: Path) -> None:
    extra = dict(learning_starts=100, train_freq=16, gradient_steps=4, buffer_size=500, batch_size=32) if algo == "dqn" else dict(num_steps=16)
    env = EnvConfig(id="CartPole-v1", num_envs=2)
    agent = make_agent(algo, env, total_steps=2000, **extra)
    for _ in range(20):
        agent.train_iteration()
    agent.envs.close()
    saved = checkpoint.save(tmp_path, agent.global_step, {"agent": agent.state_dict(), "rng": checkpoint.rng_state()})
    expected_draws = _draws()
    resumed = make_agent(algo, env, seed=99, total_steps=2000, **extra)  # another seed: everything must come from the file
    state = checkpoint.load(saved)
    resumed.load_state_dict(state["agent"])
    checkpoint.set_rng_state(state["rng"])
    assert _draws() == expected_draws
    _assert_same(resumed.state_dict(), agent.state_dict())
    assert (resumed.global_step, resumed.iteration) == (agent.global_step, agent.iteration) and resumed.global_step > 0
    if algo == "dqn":
        assert len(resumed.buffer) == len(agent.buffer) == agent.global_step
        np.testing.assert_array_equal(resumed.buffer.obs[: len(agent.buffer)], agent.buffer.obs[: len(agent.buffer)])
        assert resumed.buffer.pos == agent.buffer.pos
    resumed.train_iteration()  # and it trains on from there
    assert resumed.global_step > agent.global_step
    resumed.envs.close()


def test_dqn_without_saved_replay_waits_to_refill_before_training() -> None:
    """save_replay: false is the documented choice for big image buffers: the resumed run must not
    train on a nearly empty buffer, so it collects learning_starts transitions first."""
    env = EnvConfig(id="CartPole-v1", num_envs=1)
    settings = dict(total_steps=2000, learning_starts=200, train_freq=10, buffer_size=1000, batch_size=32, save_replay=False)
    agent = make_agent("dqn", env, **settings)
    while agent.global_step < 400:
        agent.train_iteration()
    agent.envs.close()
    state = agent.state_dict()
    assert state["replay"] is None
    resumed = make_agent("dqn", env, **settings)
    resumed.load_state_dict(state)
    metrics = [resumed.train_iteration() for _ in range(25)]
    resumed.envs.close()
    assert all("td_loss" not in m for m in metrics[:19]) and "td_loss" in metrics[-1]


def test_interrupted_dqn_run_resumes_with_its_replay_and_logs_each_step_once(tmp_path: Path) -> None:
    """`hpcrl train` gets the scheduler's warning signal mid-run: it checkpoints (replay included)
    and asks for a requeue; the rerun continues from that step to the end."""
    exp = experiment_from_dict(
        {
            "name": "resume", "algo": "dqn", "output": str(tmp_path),
            "env": {"id": "CartPole-v1", "num_envs": 1},
            "train": {"total_steps": 6000, "learning_starts": 500, "train_freq": 50, "gradient_steps": 10, "buffer_size": 10_000,
                      "batch_size": 32, "checkpoint_every": 1000, "hidden_sizes": [32]},
        }  # fmt: skip
    )
    (run,) = expand(exp)
    rd = tmp_path / "resume" / "runs" / run.run_id

    warn_once_logged(rd)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)}
    try:
        assert train_run(tmp_path / "resume", run) == REQUEUE_EXIT
        (saved,) = checkpoint.checkpoint_files(rd / "checkpoints")
        state = checkpoint.load(saved)["agent"]
        stopped = state["global_step"]
        assert 0 < stopped < 6000 and int(state["replay"]["size"]) == stopped
        assert train_run(tmp_path / "resume", run) == 0
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    steps = [int(r["step"]) for r in csv.DictReader((rd / "train.csv").open())]
    assert steps == sorted(set(steps)) and steps[-1] == 6000 and stopped in steps
    assert (rd / "DONE").exists()


@pytest.mark.parametrize("asked", [1, 2, 64])
def test_torch_never_runs_more_intra_op_threads_than_the_cores_it_may_use(asked: int) -> None:
    """train.torch_threads above the job's cores (configs/vizdoom_dqn.yaml asks 4, a 2-core job
    has 2) oversubscribes them: oneDNN's bfloat16 backward then took 96 ms a step against 4.9."""
    threads = torch.get_num_threads()
    try:
        setup_torch(asked, "cpu")
        assert torch.get_num_threads() == min(asked, len(os.sched_getaffinity(0)))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("amp", ["bf16", "fp16", "none"])
@pytest.mark.parametrize("native", [True, False])
def test_the_run_log_says_whether_its_amp_runs_on_this_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, amp: str, native: bool) -> None:
    """Whether bfloat16 runs depends on the node's CPU (networks.bf16_pays): a setting's runs on two
    kinds of node, or a run requeued onto another kind, differ in their arithmetic, so each start of
    a CPU run with `train.amp` says in its log what ran; a run without amp says nothing of it."""
    import io

    from hpcrl.rl import networks

    monkeypatch.setattr(networks, "CPU_BF16", native)
    root, run = diverging_run(tmp_path, {"train": {"amp": amp, "total_steps": 64}})
    out = io.StringIO()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)}
    try:
        assert train_run(root, run, out) == 0
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    said = [line for line in out.getvalue().splitlines() if "train.amp" in line]
    if amp == "none":
        assert said == []
    elif amp == "bf16" and native:
        assert said == [f"{run.run_id}: train.amp bf16: the encoder runs in bfloat16 on this CPU"]
    else:
        assert len(said) == 1 and said[0].startswith(f"{run.run_id}: train.amp {amp} is ignored on this CPU, which runs float32 ({amp} runs on ")


@pytest.mark.parametrize("minibatches", [1, 4])
def test_each_ppo_epoch_trains_on_every_sample_of_the_rollout_once(minibatches: int) -> None:
    """An update's epochs each pass every transition of the rollout to the loss once, in `num_minibatches`
    minibatches of equal size (each row tagged by its index in its observation): a minibatch that drops or repeats
    rows still learns CartPole, so no learning test sees it."""
    agent = make_agent("ppo", CARTPOLE, num_steps=16, num_minibatches=minibatches, update_epochs=3)
    try:
        agent.collect()
        batch = agent.batch(*agent.advantages())
        n = agent.batch_size
        batch["obs"] = torch.arange(n, dtype=torch.float32)[:, None].repeat(1, 4)  # row i holds i
        seen: list[list[int]] = []
        real = agent.policy.evaluate_params

        def record(obs: torch.Tensor, *args: Any) -> Any:
            seen.append(obs[:, 0].long().tolist())
            return real(obs, *args)

        agent.policy.evaluate_params = record
        agent.update(batch)
    finally:
        agent.envs.close()
    assert [len(rows) for rows in seen] == [n // minibatches] * (3 * minibatches)
    for epoch in range(3):
        rows = [r for mb in seen[epoch * minibatches : (epoch + 1) * minibatches] for r in mb]
        assert sorted(rows) == list(range(n)), f"epoch {epoch}"
