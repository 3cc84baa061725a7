"""Ape-X DQN (Horgan et al. 2018): many epsilon-greedy actors, one learner with a (prioritised) replay.

What is Ape-X here and what is DQN:
- actors: env slot k of K (all actors' envs together) acts with epsilon ** (1 + alpha * k / (K-1))
  (0.4 and 7 in the paper), so a few slots explore hard and most exploit; they send n-step returns
  (`discount` is gamma**k, or 0 after a terminal, so 1-step and n-step share one target);
- learner: the network, optimiser, loss, double-Q, target updates and replay size are train.* (a
  `DQNConfig`); it does `gradient_steps / train_freq` updates per accepted transition once
  `learning_starts` transitions arrived, as single-process DQN does, so sample efficiency is
  comparable and a slow learner slows the actors through the queue's backpressure instead of
  learning from ever staler data; `target_update_freq` (in env steps) becomes the matching number
  of updates (at most one refresh per `gradient_steps` updates, as single-process DQN does). The `start_e`/`end_e` schedule of single-process DQN is not used.
- prioritised replay (optional): proportional priorities |TD| ** alpha in a sum tree, new
  transitions at the highest priority seen, importance weights with beta annealed to 1.

The network is the one single-process DQN builds (`DQN.make_policy`), so the eval stage loads the
learner's checkpoint exactly as it loads a `hpcrl train` checkpoint.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from hpcrl.config.distributed_spec import DistributedConfig
from hpcrl.config.hparams import DQNConfig
from hpcrl.distributed import wire
from hpcrl.rl.algorithms import algorithm_class
from hpcrl.rl.checkpoint import numpy_to_torch, torch_to_numpy
from hpcrl.rl.envs import final_observations, finished_episodes
from hpcrl.rl.optim import Adam, GradientStep

EPISODE_FIELDS = ("ep_return", "ep_length")


def q_network(cfg: DQNConfig, obs_space: gym.Space, action_space: gym.Space) -> nn.Module:
    """The network single-process DQN uses: evaluation rebuilds it from the checkpoint's `policy`."""
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"distributed training sends Box observations; this env has {type(obs_space).__name__}")
    return algorithm_class("dqn").make_policy(cfg, obs_space, action_space)


def transition_schema(obs_space: gym.spaces.Box) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Per-transition fields of a batch (leading dimension: the number of transitions)."""
    obs = (np.dtype(obs_space.dtype), tuple(obs_space.shape))
    return {"obs": obs, "action": (np.dtype(np.int64), ()), "reward": (np.dtype(np.float32), ()), "next_obs": obs, "discount": (np.dtype(np.float32), ())}


def episode_schema() -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Episodes the actor finished since its previous batch (their own leading dimension)."""
    return {"ep_return": (np.dtype(np.float32), ()), "ep_length": (np.dtype(np.int32), ())}


def param_arrays(net: nn.Module) -> dict[str, np.ndarray]:
    return {name: t.detach().cpu().numpy() for name, t in net.state_dict().items()}


def actor_epsilons(dcfg: DistributedConfig, actor: int) -> np.ndarray:
    """Ape-X's fixed exploration per env slot, spread over all actors of the run."""
    total = dcfg.actors * dcfg.envs_per_actor
    k = actor * dcfg.envs_per_actor + np.arange(dcfg.envs_per_actor)
    if total == 1:
        return np.full(1, dcfg.epsilon)
    return dcfg.epsilon ** (1.0 + dcfg.epsilon_alpha * k / (total - 1))


# ============================================================================ actor side


class NStepBuffer:
    """Turns each env's 1-step transitions into n-step ones; an episode end flushes that env."""

    def __init__(self, num_envs: int, n: int, gamma: float) -> None:
        self.n, self.gamma = n, gamma
        self.pending: list[deque] = [deque() for _ in range(num_envs)]
        self.out: list[tuple[np.ndarray, int, float, np.ndarray, float]] = []

    def add(self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, next_obs: np.ndarray, terminated: np.ndarray, done: np.ndarray) -> None:
        for i, q in enumerate(self.pending):
            q.append((obs[i], int(actions[i]), float(rewards[i])))
            if done[i]:
                while q:
                    self._emit(q, next_obs[i], 0.0 if terminated[i] else 1.0)
            elif len(q) == self.n:
                self._emit(q, next_obs[i], 1.0)

    def _emit(self, q: deque, bootstrap_obs: np.ndarray, alive: float) -> None:
        ret, g = 0.0, 1.0
        for _, _, r in q:
            ret += g * r
            g *= self.gamma
        first_obs, action, _ = q.popleft()
        self.out.append((first_obs, action, ret, bootstrap_obs, g * alive))


class ApexActor:
    """Acts in a vector env with a local copy of the learner's network; builds batches to send."""

    def __init__(self, cfg: DQNConfig, dcfg: DistributedConfig, envs: gym.vector.VectorEnv, actor: int, seed: int) -> None:
        self.envs = envs
        self.net = q_network(cfg, envs.single_observation_space, envs.single_action_space)
        self.net.eval()
        self.epsilons = actor_epsilons(dcfg, actor)
        self.rng = np.random.default_rng([seed, actor])
        self.n_actions = int(envs.single_action_space.n)
        self.nstep = NStepBuffer(envs.num_envs, cfg.n_step, cfg.gamma)
        self.episodes: list[tuple[float, int]] = []
        self.param_schema = {k: (v.dtype, v.shape) for k, v in param_arrays(self.net).items()}
        self.obs_dtype = np.dtype(envs.single_observation_space.dtype)
        self.obs, _ = envs.reset(seed=int(self.rng.integers(2**31)))
        self.steps = 0

    def load_params(self, fields: Mapping[str, np.ndarray]) -> None:
        """Load a published parameter set, after checking it is this network's (else MalformedMessage)."""
        wire.check_fields(fields, self.param_schema, leading=False)
        self.net.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in fields.items()})

    @torch.no_grad()
    def step(self) -> None:
        q = self.net(torch.as_tensor(self.obs))
        actions = q.argmax(-1).numpy()
        explore = self.rng.random(len(actions)) < self.epsilons
        if explore.any():
            actions = np.where(explore, self.rng.integers(self.n_actions, size=len(actions)), actions)
        obs, rewards, terminated, truncated, info = self.envs.step(actions)
        self.nstep.add(self.obs, actions, rewards, final_observations(obs, info), terminated, terminated | truncated)
        returns, lengths = finished_episodes(info)
        self.episodes.extend(zip(returns.tolist(), lengths.tolist()))
        self.obs = obs
        self.steps += len(actions)

    def ready(self) -> int:
        return len(self.nstep.out)

    def close(self) -> None:
        self.envs.close()

    def take_batch(self) -> dict[str, np.ndarray]:
        """Everything built so far as the fields of one wire.BATCH message."""
        out, self.nstep.out = self.nstep.out, []
        episodes, self.episodes = self.episodes, []
        return {
            "obs": np.stack([t[0] for t in out]).astype(self.obs_dtype, copy=False),
            "action": np.fromiter((t[1] for t in out), np.int64, len(out)),
            "reward": np.fromiter((t[2] for t in out), np.float32, len(out)),
            "next_obs": np.stack([t[3] for t in out]).astype(self.obs_dtype, copy=False),
            "discount": np.fromiter((t[4] for t in out), np.float32, len(out)),
            "ep_return": np.array([e[0] for e in episodes], np.float32),
            "ep_length": np.array([e[1] for e in episodes], np.int32),
        }


# ============================================================================ learner side


class SumTree:
    """Proportional priorities: O(log n) vectorised sampling and updates over a power-of-two tree."""

    def __init__(self, capacity: int) -> None:
        self.size = 1 << max(0, (capacity - 1).bit_length())
        self.depth = self.size.bit_length() - 1
        self.tree = np.zeros(2 * self.size)

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def set(self, index: np.ndarray, priority: np.ndarray) -> None:
        node = np.asarray(index) + self.size
        self.tree[node] = priority
        for _ in range(self.depth):
            node = np.unique(node // 2)
            self.tree[node] = self.tree[2 * node] + self.tree[2 * node + 1]

    def leaves(self) -> np.ndarray:
        return self.tree[self.size :]

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Stratified: one draw in each of n equal slices of the total mass."""
        target = (np.arange(n) + rng.random(n)) * (self.total / n)
        node = np.ones(n, dtype=np.int64)
        for _ in range(self.depth):
            left = 2 * node
            right = target > self.tree[left]
            target = np.where(right, target - self.tree[left], target)
            node = left + right
        return node - self.size


class Replay:
    """A ring buffer of n-step transitions, optionally prioritised."""

    def __init__(self, capacity: int, obs_space: gym.spaces.Box, prioritized: bool, alpha: float) -> None:
        self.capacity = capacity
        shape, dtype = obs_space.shape, obs_space.dtype
        self.data = {
            "obs": np.zeros((capacity, *shape), dtype),
            "action": np.zeros(capacity, np.int64),
            "reward": np.zeros(capacity, np.float32),
            "next_obs": np.zeros((capacity, *shape), dtype),
            "discount": np.zeros(capacity, np.float32),
        }
        self.pos = self.size = 0
        self.alpha = alpha
        self.tree = SumTree(capacity) if prioritized else None
        self.max_priority = 1.0

    def add(self, fields: Mapping[str, np.ndarray], reward_scale: float) -> None:
        n = len(fields["action"])
        if n > self.capacity:  # only the newest fit
            fields = {k: v[-self.capacity :] for k, v in fields.items()}
            n = self.capacity
        index = (self.pos + np.arange(n)) % self.capacity
        for key, store in self.data.items():
            store[index] = fields[key] * reward_scale if key == "reward" else fields[key]
        if self.tree is not None:
            self.tree.set(index, np.full(n, self.max_priority**self.alpha))
        self.pos = int((self.pos + n) % self.capacity)
        self.size = min(self.capacity, self.size + n)

    def sample(self, n: int, rng: np.random.Generator, beta: float) -> tuple[np.ndarray, np.ndarray | None]:
        """Indices and, when prioritised, importance weights normalised by their maximum."""
        if self.tree is None:
            return rng.integers(self.size, size=n), None
        index = np.minimum(self.tree.sample(n, rng), self.size - 1)
        probs = self.tree.leaves()[index] / self.tree.total
        weights = (self.size * np.maximum(probs, 1e-12)) ** -beta
        return index, weights / weights.max()

    def update_priorities(self, index: np.ndarray, td: np.ndarray) -> None:
        assert self.tree is not None
        priority = np.abs(td) + 1e-6
        self.max_priority = max(self.max_priority, float(priority.max()))
        self.tree.set(index, priority**self.alpha)

    def state_dict(self) -> dict[str, Any]:
        """The filled part only (it is a prefix: the ring wraps only once full)."""
        n = self.size
        state: dict[str, Any] = {"data": numpy_to_torch({k: v[:n] for k, v in self.data.items()}), "pos": self.pos, "size": n, "max_priority": self.max_priority}
        if self.tree is not None:
            state["leaves"] = torch.from_numpy(self.tree.leaves()[:n].copy())
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for key, value in torch_to_numpy(state["data"]).items():
            self.data[key][: len(value)] = value
        self.pos, self.size, self.max_priority = int(state["pos"]), int(state["size"]), float(state["max_priority"])
        if self.tree is not None and "leaves" in state:
            self.tree.set(np.arange(self.size), state["leaves"].numpy())


class ApexLearner:
    """The learning half: ingest accepted batches, decide when to update, update, export parameters."""

    metric_names = ("loss", "q_mean", "replay_size", "param_version", "lr")
    units = ("env steps", "episodes")

    def __init__(self, cfg: DQNConfig, dcfg: DistributedConfig, obs_space: gym.Space, action_space: gym.Space, device: torch.device) -> None:
        self.cfg, self.dcfg, self.device = cfg, dcfg, device
        self.policy = q_network(cfg, obs_space, action_space).to(device)
        self.target = copy.deepcopy(self.policy)
        self.target.requires_grad_(False)
        self.gradient_step = GradientStep(self.policy.parameters(), lambda params: Adam(params, lr=cfg.lr, eps=1e-8), cfg.max_grad_norm, cfg.amp, device)
        self.replay = Replay(cfg.buffer_size, obs_space, dcfg.prioritized, dcfg.priority_alpha)
        self.schema = transition_schema(obs_space)
        self.episode_schema = episode_schema()
        self._checked_layout: object = None
        """The field table whose names, dtypes and shapes `validate` last accepted."""
        self._finite = ["reward", "discount"] + (["obs", "next_obs"] if self.schema["obs"][0].kind == "f" else [])
        self.rng = np.random.default_rng()
        self.ratio = cfg.gradient_steps / cfg.train_freq
        self.target_every = max(1, round(cfg.gradient_steps * max(1.0, cfg.target_update_freq / cfg.train_freq)))
        """Updates between target refreshes. Single-process DQN refreshes between training phases, never
        inside one (SB3's rule): every target_update_freq env steps, but at most once per phase of
        gradient_steps updates."""
        self.global_step = 0
        """Environment steps that reached the learner (accepted or dropped as stale)."""
        self.accepted = 0
        self.updates = 0
        self.version = 0
        self.starts_at = cfg.learning_starts
        """Accepted transitions before the first update (a resume without its buffer refills first)."""
        self.credit = 0.0
        """Updates the replay ratio allows and that have not been done yet."""
        self.lr = cfg.lr

    # ------------------------------------------------------------------ data
    def validate(self, message: wire.Message) -> int:
        """Schema check of a batch (raises wire.MalformedMessage); returns its number of transitions.

        Names, dtypes and shapes depend on the message's field table only, so they are checked once per
        table (`Message.layout`, cached by wire.decode) and the values (finite, actions in range) for
        every message: at 64 transitions a batch, the checks were most of the learner's cost per batch.
        """
        fields = message.fields
        if message.layout is None or message.layout is not self._checked_layout:
            transitions = {k: v for k, v in fields.items() if k not in self.episode_schema}
            episodes = {k: v for k, v in fields.items() if k in self.episode_schema}
            wire.check_fields(transitions, self.schema, leading=True)
            wire.check_fields(episodes, self.episode_schema, leading=True)
            n = len(transitions["action"])
            if n == 0 or any(len(v) != n for v in transitions.values()) or len(episodes["ep_return"]) != len(episodes["ep_length"]):
                raise wire.MalformedMessage("fields of one batch disagree on their number of rows")
            self._checked_layout = message.layout
        for k in self._finite:
            if not np.isfinite(fields[k]).all():
                raise wire.MalformedMessage(f"non-finite values in {', '.join(self._finite)}: one NaN would spread through every later update")
        action = fields["action"]
        if action.view(np.uint64).max() >= self.policy.n_actions:  # int64 (checked above): a negative one is huge here
            raise wire.MalformedMessage("action out of range")
        return len(action)

    def ingest(self, fields: Mapping[str, np.ndarray], n: int) -> None:
        """Add the first `n` transitions of a batch (the learner cuts the batch that crosses total_steps)."""
        self.replay.add({k: fields[k][:n] for k in self.schema}, self.cfg.reward_scale)
        self.credit += max(0, min(n, self.accepted + n - self.starts_at)) * self.ratio
        self.accepted += n
        self.global_step += n

    def learnable(self) -> bool:
        """Whether the replay holds a minibatch (the learner's pace.py decides whether to update)."""
        return self.replay.size >= self.cfg.batch_size

    # ------------------------------------------------------------------ learning
    def update(self, total_steps: int) -> dict[str, float]:
        cfg = self.cfg
        frac = min(1.0, self.global_step / total_steps)
        if cfg.anneal_lr:
            self.lr = cfg.lr * max(1.0 - frac, 0.0)
            self.gradient_step.set_lr(self.lr)
        beta = self.dcfg.priority_beta + (1.0 - self.dcfg.priority_beta) * frac
        index, weights = self.replay.sample(cfg.batch_size, self.rng, beta)
        batch = {k: torch.as_tensor(v[index], device=self.device) for k, v in self.replay.data.items()}
        q_all = self.policy(batch["obs"])
        q = q_all.gather(1, batch["action"].unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            next_target = self.target(batch["next_obs"])
            if cfg.double_dqn:
                best = self.policy(batch["next_obs"]).argmax(1, keepdim=True)
                next_q = next_target.gather(1, best).squeeze(1)
            else:
                next_q = next_target.max(1).values
            y = batch["reward"] + batch["discount"] * next_q
        td = y - q
        per_item = nn.functional.smooth_l1_loss(q, y, reduction="none") if cfg.loss == "huber" else td.pow(2)
        if weights is not None:
            loss = (torch.as_tensor(weights, dtype=per_item.dtype, device=self.device) * per_item).mean()
        else:
            loss = per_item.mean()
        value = float(loss.item())  # read for the log at every update anyway: checking it costs nothing
        if not math.isfinite(value):
            raise FloatingPointError(f"non-finite loss at step {self.global_step} (update {self.updates + 1}): lower train.lr")
        self.gradient_step(loss)
        if weights is not None:
            self.replay.update_priorities(index, td.detach().cpu().numpy())
        self.updates += 1
        self.credit -= 1.0
        if self.updates % self.target_every == 0:
            with torch.no_grad():
                for t, p in zip(self.target.state_dict().values(), self.policy.state_dict().values()):
                    t.lerp_(p, cfg.tau) if t.is_floating_point() else t.copy_(p)
        return {"loss": value, "q_mean": float(q.mean().item())}

    def params(self) -> dict[str, np.ndarray]:
        return param_arrays(self.policy)

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        state = {
            "policy": self.policy.state_dict(), "target": self.target.state_dict(), "optimizer": self.gradient_step.state_dict(),
            "global_step": self.global_step, "accepted": self.accepted, "iteration": self.updates, "version": self.version,
            "credit": self.credit, "rng": self.rng.bit_generator.state,
        }
        if self.cfg.save_replay:
            state["replay"] = self.replay.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.target.load_state_dict(state["target"])
        self.gradient_step.load_state_dict(state["optimizer"])
        self.global_step, self.accepted = int(state["global_step"]), int(state["accepted"])
        self.updates, self.version, self.credit = int(state["iteration"]), int(state["version"]), float(state["credit"])
        self.rng.bit_generator.state = state["rng"]
        if "replay" in state:
            self.replay.load_state_dict(state["replay"])
        else:  # no buffer saved: refill before learning again, as single-process DQN does
            self.starts_at = self.accepted + min(self.cfg.learning_starts, self.cfg.buffer_size)
            self.credit = 0.0
