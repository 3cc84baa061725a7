"""AlphaZero (Silver et al. 2018) on a two-player game (hpcrl.games), self-play and training in turn.

One iteration:
1. Self-play: `games_per_iteration` games in lockstep. Every move runs MCTS (hpcrl.games.mcts) from
   each game's position, with Dirichlet noise at the root; the leaves of all games share one
   forward pass of the network. The first `temperature_moves` moves of a game are sampled in
   proportion to the root's visit counts, later ones take the most visited action. Each position
   is recorded as (observation, legal actions, visit distribution, player to move); when the game
   ends, each record gets the outcome z for the player who moved there (with `value_target_q` w,
   (1 - w) z + w q, q the search's value at the root for that player).
2. Training: `train_steps_per_iteration` minibatches from the replay window (the newest
   `replay_window` positions), loss = cross-entropy(visit distribution, policy over the legal
   actions) + (z - v)^2, AdamW with `weight_decay`; where the game declares its mirror image
   (`train.mirror`), half of each minibatch, at random, is mirrored.

The pieces, each used by both modes: `SelfPlay` (games in lockstep, one MCTS move per step),
`Positions` (what self-play produces and the trainer consumes), `ReplayWindow`, and `Training`
(network, optimiser, window, gradient-step count). The simple mode (`AlphaZero`) alternates them
in one process; with a `distributed:` section a trainer job and self-play jobs run them apart,
with the positions on a queue and the weights stamped with versions (hpcrl.distributed.selfplay).

`global_step` counts self-play positions (moves); `episodes` are the self-play games, with player
0's return. Resume: the checkpoint holds the network, the optimiser, the replay window, the
counters; the RNGs (MCTS noise and move sampling draw from numpy's global one) are saved by the trainer.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.fusion import fuse_conv_bn_eval

from hpcrl import games
from hpcrl.config.hparams import AlphaZeroConfig
from hpcrl.games import Game, GameSpec, mcts
from hpcrl.rl.checkpoint import numpy_to_torch, torch_to_numpy
from hpcrl.rl.optim import GradientStep


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))

    def fuse(self) -> None:
        """Fold each BatchNorm into its convolution (eval mode only: the running statistics become weights)."""
        self.conv1, self.bn1 = fuse_conv_bn_eval(self.conv1, self.bn1), nn.Identity()
        self.conv2, self.bn2 = fuse_conv_bn_eval(self.conv2, self.bn2), nn.Identity()


class PolicyValueNet(nn.Module):
    """Observation -> (policy logits over all actions, value in [-1, 1] for the player to move).

    `mlp`: hidden_sizes over the flattened observation. `resnet`: AlphaZero's tower in small, for
    board planes (C, H, W): a 3x3 stem, `blocks` residual blocks of `channels` filters, and the
    two heads (a 1x1 convolution each, then a linear layer; the value head's hidden layer is 64 wide).
    """

    def __init__(self, cfg: AlphaZeroConfig, obs_shape: tuple[int, ...], num_actions: int) -> None:
        super().__init__()
        self.network = cfg.network
        act = nn.ReLU if cfg.activation == "relu" else nn.Tanh
        if cfg.network == "resnet":
            if len(obs_shape) != 3:
                raise ValueError(f"train.network resnet needs board planes (channels, height, width), the game's observation has shape {obs_shape}")
            c, h, w = obs_shape
            self.trunk = nn.Sequential(
                nn.Conv2d(c, cfg.channels, 3, padding=1, bias=False), nn.BatchNorm2d(cfg.channels), nn.ReLU(),
                *(ResidualBlock(cfg.channels) for _ in range(cfg.blocks)),
            )
            self.policy_head = nn.Sequential(nn.Conv2d(cfg.channels, 2, 1), nn.ReLU(), nn.Flatten(), nn.Linear(2 * h * w, num_actions))
            self.value_head = nn.Sequential(nn.Conv2d(cfg.channels, 1, 1), nn.ReLU(), nn.Flatten(), nn.Linear(h * w, 64), nn.ReLU(), nn.Linear(64, 1), nn.Tanh())
        else:
            layers: list[nn.Module] = [nn.Flatten()]
            width = math.prod(obs_shape)
            for size in cfg.hidden_sizes:
                layers += [nn.Linear(width, size), act()]
                width = size
            self.trunk = nn.Sequential(*layers)
            self.policy_head = nn.Linear(width, num_actions)
            self.value_head = nn.Sequential(nn.Linear(width, 1), nn.Tanh())

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.trunk(obs)
        return self.policy_head(x), self.value_head(x).squeeze(-1)

    def for_inference(self) -> PolicyValueNet:
        """A copy for MCTS's leaf evaluations, of the weights as they are now: in eval mode, each
        BatchNorm folded into the convolution before it and, on the CPU, in channels-last layout.
        Same outputs (to float rounding); measured on one core of the 2-core VM, connect four's
        3-block tower at 64 positions a call: 3.9 ms a forward pass before, 2.7 ms after."""
        net = copy.deepcopy(self).eval()
        if self.network == "resnet":
            stem_conv, stem_bn, *rest = net.trunk
            net.trunk = nn.Sequential(fuse_conv_bn_eval(stem_conv, stem_bn), *rest)
            for block in rest:
                if isinstance(block, ResidualBlock):
                    block.fuse()
        return cpu_layout(net)


def cpu_layout(net: PolicyValueNet) -> PolicyValueNet:
    """The network in the memory layout it runs fastest in, one rule for the trainer and the search's
    copy: channels-last for the resnet on the CPU (one core of the 2-core VM, connect four's tower: a
    minibatch of 256 trains in 39 ms instead of 49); as it is otherwise (on a GPU, unmeasured)."""
    if net.network == "resnet" and next(net.parameters()).device.type == "cpu":
        return net.to(memory_format=torch.channels_last)
    return net


def make_network(cfg: AlphaZeroConfig, spec: GameSpec) -> PolicyValueNet:
    """The network evaluation rebuilds from a checkpoint's `policy` weights."""
    return PolicyValueNet(cfg, spec.observation_shape, spec.num_actions)


def network_evaluator(net: PolicyValueNet, device: torch.device) -> mcts.Evaluator:
    """MCTS's leaf evaluation by the network's weights as they are now (`for_inference`: eval mode,
    BatchNorm's running statistics): weights that change later are not seen, so a trainer makes a
    new evaluator after it learns and a self-play job after it loads new weights."""
    net = net.for_inference()

    @torch.no_grad()
    def evaluate(states: Sequence[Game]) -> tuple[np.ndarray, np.ndarray]:
        obs = torch.as_tensor(np.stack([games.observation(s).astype(np.float32, copy=False) for s in states]), device=device)
        logits, values = net(obs)
        return torch.softmax(logits.float(), -1).cpu().numpy(), values.float().cpu().numpy()

    return evaluate


def greedy(counts: np.ndarray) -> int:
    """The most visited action, ties broken at random."""
    return int(np.random.choice(np.flatnonzero(counts == counts.max())))


@dataclass
class Positions:
    """Self-play records: what self-play produces and the trainer consumes."""

    obs: np.ndarray  # [n, *observation shape] float32
    legal: np.ndarray  # [n, num_actions] bool
    policy: np.ndarray  # [n, num_actions] float32: the root's visit distribution
    value: np.ndarray  # [n] float32: the game's outcome for the player to move

    def __len__(self) -> int:
        return len(self.value)


Record = tuple[np.ndarray, np.ndarray, np.ndarray, int, float]
"""One move of a game being played: observation, legal actions, visit distribution, player to move,
the search's value there for that player."""


class SelfPlay:
    """Games in lockstep, one MCTS move in each per `step` (the leaves of all games share each forward pass).

    The simple mode plays a fixed set of games to their ends (`self_play`); a self-play job
    (hpcrl.distributed.selfplay) plays on forever (`continuous`: a finished game's slot starts a new
    one) and takes the finished games from time to time. Either way, the positions of a finished
    game get its outcome z for the player who moved there, and only finished games are taken.
    """

    def __init__(self, spec: GameSpec, cfg: AlphaZeroConfig, n_games: int, continuous: bool) -> None:
        self.spec, self.cfg, self.continuous = spec, cfg, continuous
        self.noise = (cfg.dirichlet_alpha, cfg.dirichlet_fraction) if cfg.dirichlet_fraction > 0 else None
        self.states = [games.first_position(spec) for _ in range(n_games)]
        self.records: list[list[Record]] = [[] for _ in range(n_games)]
        self.finished: list[tuple[int, list[Record], tuple[float, float]]] = []
        """(slot, its records, the game's returns) of each game finished and not taken yet, in the order they ended."""
        self.ready = 0
        """Positions in `finished`."""
        self.moves = 0

    def active(self) -> list[int]:
        return [i for i, state in enumerate(self.states) if not games.is_terminal(state)]

    def step(self, evaluate: mcts.Evaluator) -> int:
        """One move in every game still going; returns how many moves were made."""
        active = self.active()
        if not active:
            return 0
        spec, cfg = self.spec, self.cfg
        counts, values = mcts.search([self.states[i] for i in active], evaluate, spec.num_actions, cfg.simulations, cfg.c_puct, self.noise)
        for i, visits, q in zip(active, counts, values):
            state, record = self.states[i], self.records[i]
            legal = np.zeros(spec.num_actions, dtype=bool)
            legal[games.legal_actions(state, spec.num_actions)] = True
            pi = visits / visits.sum()
            record.append((games.observation(state).astype(np.float32), legal, pi.astype(np.float32), games.current_player(state), float(q)))
            explore = len(record) <= cfg.temperature_moves
            games.apply(state, int(np.random.choice(spec.num_actions, p=pi)) if explore else greedy(visits))
        for i in active:
            if games.is_terminal(self.states[i]):
                self._finish(i)
            elif len(self.records[i]) >= cfg.max_moves:
                raise games.too_long(spec, "a self-play game", cfg.max_moves)
        self.moves += len(active)
        return len(active)

    def _finish(self, i: int) -> None:
        self.finished.append((i, self.records[i], games.returns(self.states[i])))
        self.ready += len(self.records[i])
        self.records[i] = []
        if self.continuous:
            self.states[i] = games.first_position(self.spec)

    def take(self, by_slot: bool = False) -> tuple[Positions, list[tuple[float, int]]]:
        """The finished games' positions (game after game) and each game's (player 0's return, length)."""
        finished, self.finished, self.ready = self.finished, [], 0
        if by_slot:
            finished.sort(key=lambda f: f[0])
        episodes = [(outcome[0], len(game)) for _, game, outcome in finished]
        w = self.cfg.value_target_q
        rows = [(obs, legal, pi, (1 - w) * outcome[player] + w * q) for _, game, outcome in finished for obs, legal, pi, player, q in game]
        spec = self.spec
        if not rows:
            empty = np.zeros((0, spec.num_actions), dtype=np.float32)
            return Positions(np.zeros((0, *spec.observation_shape), np.float32), empty.astype(bool), empty, np.zeros(0, np.float32)), episodes
        obs, legal, pi, z = zip(*rows)
        return Positions(np.stack(obs), np.stack(legal), np.stack(pi), np.array(z, dtype=np.float32)), episodes


def self_play(spec: GameSpec, evaluate: mcts.Evaluator, cfg: AlphaZeroConfig, n_games: int, stop: Callable[[], bool] = lambda: False) -> tuple[Positions, list[tuple[float, int]]]:
    """Play `n_games` games in lockstep to their ends; their positions, and each game's (player 0's return, length).
    `stop` is asked before every move: once it says so, the games not finished are left unplayed
    (a stop warning is acted on within a move, not after games of unknown length)."""
    play = SelfPlay(spec, cfg, n_games, continuous=False)
    while not stop() and play.step(evaluate):
        pass
    return play.take(by_slot=True)


class ReplayWindow:
    """The newest `capacity` positions, in a ring; sampled uniformly with replacement."""

    FIELDS = ("obs", "legal", "policy", "value")

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], num_actions: int) -> None:
        self.capacity = capacity
        self.obs = np.zeros((capacity, *obs_shape), dtype=np.float32)
        self.legal = np.zeros((capacity, num_actions), dtype=bool)
        self.policy = np.zeros((capacity, num_actions), dtype=np.float32)
        self.value = np.zeros(capacity, dtype=np.float32)
        self.pos = 0
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, batch: Positions) -> None:
        n = len(batch)
        if n > self.capacity:  # only the newest fit
            batch = Positions(*(getattr(batch, f)[n - self.capacity :] for f in self.FIELDS))
            n = self.capacity
        idx = np.arange(self.pos, self.pos + n) % self.capacity
        for name in self.FIELDS:
            getattr(self, name)[idx] = getattr(batch, name)
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int, device: torch.device, mirror: Sequence[int] | None = None) -> dict[str, torch.Tensor]:
        """With `mirror` (the game's mirror_actions), each sampled position is replaced by its mirror
        image with probability 1/2: observation reversed on its last axis, actions permuted."""
        idx = np.random.randint(0, self.size, size=batch_size)
        rows = {name: getattr(self, name)[idx] for name in self.FIELDS}  # copies (fancy indexing)
        if mirror is not None:
            flip = np.flatnonzero(np.random.rand(batch_size) < 0.5)
            rows["obs"][flip] = rows["obs"][flip][..., ::-1]
            for name in ("legal", "policy"):
                rows[name][flip] = rows[name][flip][:, list(mirror)]
        return {name: torch.as_tensor(rows[name], device=device) for name in self.FIELDS}

    def state_dict(self) -> dict[str, Any]:
        """The filled part only, oldest first (a resumed window of another capacity keeps the newest)."""
        order = (np.arange(self.size) + (self.pos - self.size)) % self.capacity
        return {**numpy_to_torch({name: getattr(self, name)[order] for name in self.FIELDS}), "size": self.size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pos = self.size = 0
        self.add(Positions(**torch_to_numpy({name: state[name] for name in self.FIELDS})))


class Training:
    """The training half: the network, its optimiser, the replay window, and the count of gradient
    steps so far (`updates`). The simple mode (AlphaZero below) and the trainer job of the decoupled
    mode (hpcrl.distributed.selfplay) both learn through it."""

    def __init__(self, cfg: AlphaZeroConfig, spec: GameSpec, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        self.policy = cpu_layout(make_network(cfg, spec).to(device))
        self.gradient_step = GradientStep(
            self.policy.parameters(), lambda params: torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay), cfg.max_grad_norm, "none", device,
        )
        self.replay = ReplayWindow(cfg.replay_window, spec.observation_shape, spec.num_actions)
        self.mirror = spec.mirror if cfg.mirror else None
        self.updates = 0

    def lr(self, played: int) -> float:
        """The learning rate after `played` of train.total_steps positions (train.anneal_lr: linearly to 0)."""
        cfg = self.cfg
        return cfg.lr * max(0.0, 1.0 - played / cfg.total_steps) if cfg.anneal_lr else cfg.lr

    def learn(self, steps: int, lr: float, step: int) -> dict[str, float]:
        """`steps` minibatch updates on the replay window; the last one's losses. `step` (positions
        played) only names the place in the error a diverging loss raises."""
        cfg = self.cfg
        self.gradient_step.set_lr(lr)
        self.policy.train()
        for _ in range(steps):
            b = self.replay.sample(cfg.batch_size, self.device, self.mirror)
            logits, value = self.policy(b["obs"])
            logp = torch.log_softmax(logits.masked_fill(~b["legal"], -1e9), dim=-1)
            policy_loss = -(b["policy"] * logp).sum(-1).mean()
            value_loss = F.mse_loss(value, b["value"])
            loss = policy_loss + value_loss
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite loss at step {step} (update {self.updates + 1}): lower train.lr")
            self.gradient_step(loss)
            self.updates += 1
        entropy = -(logp.exp() * logp).sum(-1).mean()
        return {"policy_loss": policy_loss.item(), "value_loss": value_loss.item(), "policy_entropy": entropy.item()}

    def state_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.state_dict(), **self.gradient_step.state_dict(), "version": self.updates, "replay": self.replay.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.gradient_step.load_state_dict(state)
        self.updates = int(state["version"])
        self.replay.load_state_dict(state["replay"])


class AlphaZero:
    """The simple mode's agent (hpcrl.rl.train): self-play, then training, in turn. `seed` is not used,
    self-play draws from numpy's global RNG, which the trainer seeds and checkpoints."""

    metric_names = ("policy_loss", "value_loss", "policy_entropy", "positions", "replay", "version", "lr")

    def __init__(self, cfg: AlphaZeroConfig, spec: GameSpec, device: torch.device, seed: int) -> None:
        self.cfg, self.spec, self.device = cfg, spec, device
        self.training = Training(cfg, spec, device)
        self.policy = self.training.policy
        self.replay = self.training.replay
        self.planned_steps = cfg.total_steps
        """Positions to play; the last iteration's games are finished, so a run may play a few more."""
        self.num_iterations = math.ceil(cfg.total_steps / cfg.games_per_iteration)
        self.global_step = 0
        self.iteration = 0
        self.episodes: list[tuple[float, int]] = []
        self.stop: Callable[[], bool] = lambda: False
        """Asked between self-play moves (the trainer gives its stop flag): an iteration of the other
        algorithms is bounded by its settings, one of AlphaZero's plays games of unknown length, and a
        warning waited for their ends (SIGTERM left a trainer in a game that never ends running)."""

    @property
    def version(self) -> int:
        """Gradient steps so far: the stamp of the weights self-play uses."""
        return self.training.updates

    @property
    def finished(self) -> bool:
        return self.global_step >= self.cfg.total_steps

    def train_iteration(self) -> dict[str, float]:
        cfg = self.cfg
        positions, episodes = self_play(self.spec, network_evaluator(self.policy, self.device), cfg, cfg.games_per_iteration, self.stop)
        self.replay.add(positions)
        self.episodes.extend(episodes)
        self.global_step += len(positions)
        lr = self.training.lr(self.global_step)
        metrics = {"positions": float(len(positions)), "replay": float(len(self.replay)), "lr": lr}
        if len(self.replay):
            metrics.update(self.training.learn(cfg.train_steps_per_iteration, lr, self.global_step))
        metrics["version"] = float(self.version)
        self.iteration += 1
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {**self.training.state_dict(), "global_step": self.global_step, "iteration": self.iteration}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.training.load_state_dict(state)
        self.global_step, self.iteration = int(state["global_step"]), int(state["iteration"])
