"""Tic-tac-toe, a complete example of the game protocol (hpcrl.games) in plain Python.

Use it with `env.backend: game` and `env.id: hpcrl.games.tictactoe:TicTacToe`; a game of your own
is a class like this one in an importable module (`env.id: mypkg.mygame:MyGame`).
"""

from __future__ import annotations

import numpy as np

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
LINES_THROUGH = [[line for line in LINES if cell in line] for cell in range(9)]


class TicTacToe:
    """A position: cells 0..8 row by row, each empty (-1) or the player (0, 1) who took it."""

    num_actions = 9
    mirror_actions = (2, 1, 0, 5, 4, 3, 8, 7, 6)
    """Optional in the protocol: cell (row, column) mirrored left to right is (row, 2 - column), and
    the observation's planes mirror on their last axis; AlphaZero trains on both images."""

    def __init__(self) -> None:
        self.board = [-1] * 9
        self.player = 0
        self.winner: int | None = None
        self.moves = 0

    def current_player(self) -> int:
        return self.player

    def legal_actions(self) -> list[int]:
        return [i for i, cell in enumerate(self.board) if cell < 0]

    def apply_action(self, action: int) -> None:
        if self.board[action] >= 0 or self.is_terminal():
            raise ValueError(f"cell {action} is taken or the game is over")
        self.board[action] = self.player
        self.moves += 1
        b, me = self.board, self.player
        if any(b[i] == me and b[j] == me and b[k] == me for i, j, k in LINES_THROUGH[action]):
            self.winner = self.player
        self.player = 1 - self.player

    def is_terminal(self) -> bool:
        return self.winner is not None or self.moves == 9

    def returns(self) -> tuple[float, float]:
        if self.winner is None:
            return (0.0, 0.0)
        return (1.0, -1.0) if self.winner == 0 else (-1.0, 1.0)

    def observation(self) -> np.ndarray:
        """Two 3x3 planes from the mover's side: its stones, the opponent's (so one network plays both colours)."""
        board = np.array(self.board).reshape(3, 3)
        return np.stack([board == self.player, board == 1 - self.player]).astype(np.float32)

    def clone(self) -> TicTacToe:
        copy = TicTacToe.__new__(TicTacToe)
        copy.board, copy.player, copy.winner, copy.moves = list(self.board), self.player, self.winner, self.moves
        return copy

    def __str__(self) -> str:
        marks = {-1: ".", 0: "x", 1: "o"}
        return "\n".join("".join(marks[c] for c in self.board[r * 3 : r * 3 + 3]) for r in range(3))
