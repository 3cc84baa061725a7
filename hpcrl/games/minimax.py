"""Perfect play by minimax over a whole (small) game: the `perfect` opponent of hpcrl.rl.strength.

Apart from strength.py because it needs no torch: `hpcrl sweep` solves the game once on the login
node, so a `perfect` opponent for a game too large to solve is refused there, not after training.
"""

from __future__ import annotations

import random

from hpcrl import games
from hpcrl.games import Game, GameError, GameSpec

PERFECT_LIMIT = 1_000_000
"""Positions the perfect player may memoise; a game with more is too large to solve here (tic-tac-toe has 5,478)."""


class PerfectPlayer:
    """Minimax over the whole game tree, memoised by (player to move, observation): the observation
    must tell positions apart, as a board game's does."""

    def __init__(self, spec: GameSpec, rng: random.Random, limit: int = PERFECT_LIMIT) -> None:
        self.spec, self.rng, self.limit = spec, rng, limit
        self.memo: dict[tuple[int, bytes], float] = {}

    def value(self, state: Game) -> float:
        """The game's value for the player to move (perfect play on both sides)."""
        player = games.current_player(state)
        key = (player, games.observation(state).tobytes())
        if key not in self.memo:
            if len(self.memo) >= self.limit:
                raise GameError(f"{self.spec.name} has more than {self.limit:,} positions: the 'perfect' opponent is for games small enough to solve (tic-tac-toe)")
            self.memo[key] = max(self._action_values(state, player).values())
        return self.memo[key]

    def _action_values(self, state: Game, player: int) -> dict[int, float]:
        values = {}
        for action in games.legal_actions(state, self.spec.num_actions):
            child = games.clone(state)
            games.apply(child, action)
            if games.is_terminal(child):
                values[action] = games.returns(child)[player]
            else:
                values[action] = self.value(child) if games.current_player(child) == player else -self.value(child)
        return values

    def __call__(self, state: Game) -> int:
        values = self._action_values(state, games.current_player(state))
        best = max(values.values())
        return self.rng.choice([a for a, v in values.items() if v >= best - 1e-9])
