"""Monte Carlo tree search with PUCT (Silver et al. 2017/2018), run on many games in lockstep.

`search` runs one tree per root position. Each simulation descends every tree to a leaf by
PUCT, Q(s,a) + c_puct * P(s,a) * sqrt(N(s)) / (1 + N(s,a)), then evaluates the leaves of all
trees in one call of `evaluate` (one batched forward pass of the network: that is where batching
pays, a 9-move position costs about the same as 64 of them), expands them and backs the value up.
A terminal leaf is scored by the game's returns, without the network.

Values: `evaluate` gives each leaf's value for the player to move there; an edge's statistics are
kept for the player who chooses it (the node's `player`), so a game need not alternate players
strictly. Priors are masked to the legal actions and renormalised. Unvisited edges count Q = 0.
With `noise` (self-play), the roots' priors are mixed with Dirichlet noise:
(1 - fraction) * P + fraction * Dir(alpha).

The same search with uniform priors and random-rollout values is the `mcts:N` opponent of
hpcrl.rl.strength for games OpenSpiel does not have (`rollout_evaluator`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import numpy as np

from hpcrl import games
from hpcrl.games import Game, GameSpec

Evaluator = Callable[[Sequence[Game]], tuple[np.ndarray, np.ndarray]]
"""Positions (none terminal) -> (priors over all actions [B, num_actions], values for the player to move [B])."""


class Node:
    """A position in a tree, with the statistics of its edges (one per legal action)."""

    __slots__ = ("state", "player", "actions", "prior", "visits", "value_sum", "q", "total", "children", "terminal")

    def __init__(self, state: Game, num_actions: int) -> None:
        self.state = state
        self.terminal = games.returns(state) if games.is_terminal(state) else None
        """The returns of a finished game; None while it goes on."""
        self.player = -1 if self.terminal else games.current_player(state)
        self.actions: list[int] = games.legal_actions(state, num_actions) if self.terminal is None else []
        self.prior = np.zeros(0)
        self.visits = np.zeros(len(self.actions))
        self.value_sum = np.zeros(len(self.actions))
        self.q = np.zeros(len(self.actions))
        """value_sum / visits, 0 where unvisited; kept up to date by `backup` (select runs far more often)."""
        self.total = 0
        self.children: dict[int, Node] = {}
        """Edge index -> child, made when the edge is first followed."""

    @property
    def expanded(self) -> bool:
        return len(self.prior) > 0

    def expand(self, priors: np.ndarray) -> None:
        """Keep the priors of the legal actions, renormalised (uniform where the network put none)."""
        p = np.maximum(priors[self.actions].astype(np.float64), 0.0)
        total = p.sum()
        self.prior = p / total if total > 0 and np.isfinite(total) else np.full(len(self.actions), 1.0 / len(self.actions))

    def select(self, c_puct: float) -> int:
        """The edge index with the highest PUCT score (the first on ties)."""
        return int((self.q + (c_puct * math.sqrt(self.total + 1e-8)) * self.prior / (1.0 + self.visits)).argmax())

    def backup(self, edge: int, value: float) -> None:
        """One more visit of `edge`, worth `value` to this node's player."""
        self.visits[edge] += 1
        self.value_sum[edge] += value
        self.q[edge] = self.value_sum[edge] / self.visits[edge]
        self.total += 1


def search(
    roots: Sequence[Game], evaluate: Evaluator, num_actions: int, simulations: int, c_puct: float,
    noise: tuple[float, float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Visit counts over all actions [len(roots), num_actions] after `simulations` simulations per
    root, and each root's value for its player to move [len(roots)]: the mean of the values its
    simulations backed up (self-play's `train.value_target_q` mixes it into the value target).

    No root may be terminal. `noise` is (Dirichlet alpha, fraction) for the roots' priors, drawn
    from numpy's global RNG (which a checkpoint saves).
    """
    trees = [Node(games.clone(state), num_actions) for state in roots]
    priors, _ = evaluate([t.state for t in trees])
    for tree, p in zip(trees, priors):
        tree.expand(p)
        if noise is not None:
            alpha, fraction = noise
            tree.prior = (1 - fraction) * tree.prior + fraction * np.random.dirichlet([alpha] * len(tree.actions))
    for _ in range(simulations):
        paths, leaves = [], []
        for tree in trees:
            node, path = tree, []
            while node.expanded:
                edge = node.select(c_puct)
                path.append((node, edge))
                child = node.children.get(edge)
                if child is None:
                    state = games.clone(node.state)
                    games.apply(state, node.actions[edge])
                    child = node.children[edge] = Node(state, num_actions)
                node = child
                if node.terminal is not None:
                    break
            paths.append(path)
            leaves.append(node)
        waiting = [i for i, leaf in enumerate(leaves) if leaf.terminal is None]
        values = np.zeros(len(leaves))
        if waiting:
            leaf_priors, leaf_values = evaluate([leaves[i].state for i in waiting])
            for j, i in enumerate(waiting):
                leaves[i].expand(leaf_priors[j])
                values[i] = leaf_values[j]
        for path, leaf, value in zip(paths, leaves, values):
            outcome = leaf.terminal if leaf.terminal is not None else _returns_of(leaf.player, float(value))
            for node, edge in path:
                node.backup(edge, outcome[node.player])
    counts = np.zeros((len(trees), num_actions))
    values = np.zeros(len(trees))
    for i, tree in enumerate(trees):
        counts[i, tree.actions] = tree.visits
        values[i] = tree.value_sum.sum() / max(tree.total, 1)
    return counts, values


def _returns_of(player: int, value: float) -> tuple[float, float]:
    """Both players' values of a position worth `value` to `player` (zero-sum)."""
    return (value, -value) if player == 0 else (-value, value)


def rollout_evaluator(spec: GameSpec, rng: random.Random) -> Evaluator:
    """Uniform priors, and the value of one random playout to the end: pure MCTS with random rollouts.
    A playout is bounded as the sweep's random games are (games.MAX_MOVES)."""
    num_actions = spec.num_actions

    def evaluate(states: Sequence[Game]) -> tuple[np.ndarray, np.ndarray]:
        values = np.zeros(len(states))
        for i, state in enumerate(states):
            player, game = games.current_player(state), games.clone(state)
            for _ in range(games.MAX_MOVES):
                if games.is_terminal(game):
                    break
                games.apply(game, rng.choice(games.legal_actions(game, num_actions)))
            else:
                if not games.is_terminal(game):
                    raise games.too_long(spec, "a random playout", games.MAX_MOVES, None)
            values[i] = games.returns(game)[player]
        return np.ones((len(states), num_actions)), values

    return evaluate
