"""AlphaZero decoupled: self-play jobs and a trainer job, the two halves of hpcrl.rl.alphazero apart.

The job machinery is Ape-X's (learner.py, actor.py, board, queue, wire, jobs): `hpcrl learner` is
the trainer, `hpcrl actor` a self-play job, `distributed.actors` their number per run. What differs
is only what flows and what is learned from it, and that is this module:

- a self-play job (`SelfPlayActor`) plays `distributed.envs_per_actor` games in lockstep with MCTS
  guided by its copy of the network (alphazero.SelfPlay, continuous: a finished game's slot starts
  the next), and sends whole finished games as one wire.BATCH of positions (observation, legal
  actions, visit distribution, outcome for the player to move) with each game's (player 0's return,
  length), stamped with the parameter version the batch was first played with;
- the trainer (`AlphaZeroLearner`) checks each batch (shapes, finite numbers, a distribution over
  the legal moves, whole games), adds its positions to the replay window, and does
  `train_steps_per_iteration / games_per_iteration` updates per game that came in, the simple
  mode's ratio: the same sample reuse, so what a setting learns carries over between the modes.
  Held to it exactly, a slower trainer slows self-play through the queue's bound and a faster one
  waits for games; `distributed.ratio_slack` lets the ratio float so neither waits (pace.py). Every
  `distributed.publish_every` updates it publishes the weights as a new version; batches more than
  `distributed.max_lag` versions old are dropped (and counted).

`train.total_steps` counts positions as in the simple mode; the batch that crosses it is cut there.
A requeued trainer resumes from its checkpoint: network, optimiser, replay window, update count,
parameter version, credit of updates owed, counters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from hpcrl import games
from hpcrl.config.distributed_spec import DistributedConfig
from hpcrl.config.hparams import AlphaZeroConfig
from hpcrl.distributed import wire
from hpcrl.distributed.apex import episode_schema, param_arrays
from hpcrl.games import GameSpec
from hpcrl.rl.alphazero import Positions, SelfPlay, Training, make_network, network_evaluator


def position_schema(spec: GameSpec) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Per-position fields of a batch (leading dimension: the number of positions)."""
    a = spec.num_actions
    return {
        "obs": (np.dtype(np.float32), tuple(spec.observation_shape)), "legal": (np.dtype(bool), (a,)),
        "policy": (np.dtype(np.float32), (a,)), "value": (np.dtype(np.float32), ()),
    }


class SelfPlayActor:
    """A self-play job's player: the actor.Actor loop calls `step` until `ready()` positions make a batch."""

    units = ("positions", "games")

    def __init__(self, cfg: AlphaZeroConfig, dcfg: DistributedConfig, spec: GameSpec, actor: int, seed: int) -> None:
        self.spec = spec
        self.net = make_network(cfg, spec)
        self.evaluate = network_evaluator(self.net, torch.device("cpu"))
        self.param_schema = {k: (v.dtype, v.shape) for k, v in param_arrays(self.net).items()}
        np.random.seed(np.random.SeedSequence([seed, actor]).generate_state(1)[0])  # MCTS noise and move sampling draw from it
        self.play = SelfPlay(spec, cfg, dcfg.envs_per_actor, continuous=True)
        self.steps = 0
        """Positions played (moves), for the heartbeat's rate."""

    def load_params(self, fields: Mapping[str, np.ndarray]) -> None:
        """Load a published parameter set, after checking it is this network's (else MalformedMessage)."""
        wire.check_fields(fields, self.param_schema, leading=False)
        self.net.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in fields.items()})
        self.evaluate = network_evaluator(self.net, torch.device("cpu"))

    def step(self) -> None:
        self.steps += self.play.step(self.evaluate)

    def ready(self) -> int:
        return self.play.ready

    def take_batch(self) -> dict[str, np.ndarray]:
        """The finished games as the fields of one wire.BATCH message, game after game."""
        positions, episodes = self.play.take()
        return {
            "obs": positions.obs, "legal": positions.legal, "policy": positions.policy, "value": positions.value,
            "ep_return": np.array([e[0] for e in episodes], np.float32), "ep_length": np.array([e[1] for e in episodes], np.int32),
        }

    def close(self) -> None:
        """Nothing to release (a game is plain Python); present as for the Ape-X actor's envs."""


class AlphaZeroLearner:
    """The trainer's half for learner.Learner: check and ingest batches, decide when to update, update, export weights."""

    metric_names = ("policy_loss", "value_loss", "policy_entropy", "replay_size", "param_version", "lr")
    units = ("positions", "games")

    def __init__(self, cfg: AlphaZeroConfig, dcfg: DistributedConfig, spec: GameSpec, device: torch.device) -> None:
        self.cfg, self.dcfg, self.spec, self.device = cfg, dcfg, spec, device
        self.training = Training(cfg, spec, device)
        self.policy = self.training.policy
        self.replay = self.training.replay
        self.schema = position_schema(spec)
        self.episode_schema = episode_schema()
        self._checked_layout: object = None
        self.per_game = cfg.train_steps_per_iteration / cfg.games_per_iteration
        """Updates per game that comes in: the simple mode's sample reuse."""
        self.starts_at = min(cfg.batch_size, cfg.replay_window)
        """Positions in the window before the first update."""
        self.global_step = 0
        """Positions that reached the trainer (accepted or dropped as stale)."""
        self.accepted = 0
        self.games = 0.0
        """Games accepted (a game cut by the budget counts in part)."""
        self.version = 0
        """Parameter version: publications so far (learner.py publishes every distributed.publish_every updates)."""
        self.credit = 0.0
        self.lr = cfg.lr

    @property
    def updates(self) -> int:
        return self.training.updates

    @property
    def ratio(self) -> float:
        """Updates per position, from the mean game length so far (the learner sizes its pops with it)."""
        length = self.accepted / self.games if self.games else float(self.spec.num_actions)
        return self.per_game / max(length, 1.0)

    # ------------------------------------------------------------------ data
    def validate(self, message: wire.Message) -> int:
        """Check a batch (raises wire.MalformedMessage); returns its number of positions. A policy
        target off the legal moves, a NaN, a value beyond a game's returns, or games that do not add
        up would poison every update."""
        fields = message.fields
        if message.layout is None or message.layout is not self._checked_layout:
            positions = {k: v for k, v in fields.items() if k not in self.episode_schema}
            wire.check_fields(positions, self.schema, leading=True)
            wire.check_fields({k: v for k, v in fields.items() if k in self.episode_schema}, self.episode_schema, leading=True)
            self._checked_layout = message.layout
        n = len(fields["value"])
        if n == 0 or any(len(fields[k]) != n for k in self.schema) or len(fields["ep_return"]) != len(fields["ep_length"]):
            raise wire.MalformedMessage("fields of one batch disagree on their number of rows")
        if int(fields["ep_length"].astype(np.int64).sum()) != n or (fields["ep_length"] < 1).any():
            raise wire.MalformedMessage(f"the games' lengths do not add up to the batch's {n} positions (whole games only)")
        for k in ("obs", "policy", "value", "ep_return"):
            if not np.isfinite(fields[k]).all():
                raise wire.MalformedMessage(f"non-finite values in {k!r}: one NaN would spread through every later update")
        for k in ("value", "ep_return"):  # a game's outcome, and each value target mixed from outcomes and search values
            if games.beyond_returns(fields[k]):
                worst = float(fields[k][np.argmax(np.abs(fields[k]))])
                raise wire.MalformedMessage(f"{k!r} of {worst:g} outside [-1, 1], the range of a game's returns: the value network's tanh could never learn it, and its squared error would swamp every update")
        policy, legal = fields["policy"], fields["legal"]
        if (policy < 0).any() or (policy[~legal] != 0).any() or not legal.any(-1).all() or not np.allclose(policy.sum(-1), 1.0, atol=1e-3):
            raise wire.MalformedMessage("a visit distribution is not a distribution over the legal moves")
        return n

    def ingest(self, fields: Mapping[str, np.ndarray], n: int) -> None:
        """Add the first `n` positions (the learner cuts the batch that crosses total_steps) and their games' updates."""
        self.replay.add(Positions(*(np.asarray(fields[k][:n]) for k in ("obs", "legal", "policy", "value"))))
        ends = np.cumsum(fields["ep_length"])
        whole = int(np.searchsorted(ends, n, side="right"))
        games = float(whole)
        if whole < len(ends):  # a game cut by the budget: the part that came in
            games += float(n - (ends[whole - 1] if whole else 0)) / float(fields["ep_length"][whole])
        self.credit += games * self.per_game
        self.games += games
        self.accepted += n
        self.global_step += n

    def learnable(self) -> bool:
        """Whether the window holds a minibatch (the learner's pace.py decides whether to update)."""
        return len(self.replay) >= self.starts_at

    # ------------------------------------------------------------------ learning
    def update(self, total_steps: int) -> dict[str, float]:
        self.lr = self.training.lr(self.global_step)
        metrics = self.training.learn(1, self.lr, self.global_step)
        self.credit -= 1.0
        return metrics

    def params(self) -> dict[str, np.ndarray]:
        return param_arrays(self.policy)

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """The simple mode's layout (network under `policy`, so the eval stage reads either) plus the trainer's counters."""
        return {
            **self.training.state_dict(), "global_step": self.global_step, "accepted": self.accepted, "games": self.games,
            "param_version": self.version, "credit": self.credit,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.training.load_state_dict(dict(state))
        self.global_step, self.accepted, self.games = int(state["global_step"]), int(state["accepted"]), float(state["games"])
        self.version, self.credit = int(state["param_version"]), float(state["credit"])
