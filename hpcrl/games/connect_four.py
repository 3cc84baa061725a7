"""Connect four in plain Python, to the game protocol (hpcrl.games); `rows`, `columns` and
`connect` are its parameters (`env.kwargs`). OpenSpiel's C++ `connect_four` is much faster."""

from __future__ import annotations

import numpy as np


class ConnectFour:
    """A position: `grid[row][column]` is -1 (empty) or the player (0, 1); row 0 is the bottom."""

    def __init__(self, rows: int = 6, columns: int = 7, connect: int = 4) -> None:
        if not (1 <= connect <= max(rows, columns) and rows >= 1 and columns >= 1):
            raise ValueError(f"cannot connect {connect} on {rows}x{columns}")
        self.rows, self.columns, self.connect = rows, columns, connect
        self.num_actions = columns
        self.mirror_actions = tuple(reversed(range(columns)))
        """Column c of the board mirrored left to right is column columns-1-c."""
        self.grid = [[-1] * columns for _ in range(rows)]
        self.heights = [0] * columns
        self.player = 0
        self.winner: int | None = None
        self.moves = 0

    def current_player(self) -> int:
        return self.player

    def legal_actions(self) -> list[int]:
        return [c for c in range(self.columns) if self.heights[c] < self.rows]

    def apply_action(self, action: int) -> None:
        if self.heights[action] >= self.rows or self.is_terminal():
            raise ValueError(f"column {action} is full or the game is over")
        row = self.heights[action]
        self.grid[row][action] = self.player
        self.heights[action] += 1
        self.moves += 1
        if self._wins(row, action):
            self.winner = self.player
        self.player = 1 - self.player

    def _wins(self, row: int, col: int) -> bool:
        me = self.grid[row][col]
        for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
            count = 1
            for sign in (1, -1):
                r, c = row + sign * dr, col + sign * dc
                while 0 <= r < self.rows and 0 <= c < self.columns and self.grid[r][c] == me:
                    count += 1
                    r, c = r + sign * dr, c + sign * dc
            if count >= self.connect:
                return True
        return False

    def is_terminal(self) -> bool:
        return self.winner is not None or self.moves == self.rows * self.columns

    def returns(self) -> tuple[float, float]:
        if self.winner is None:
            return (0.0, 0.0)
        return (1.0, -1.0) if self.winner == 0 else (-1.0, 1.0)

    def observation(self) -> np.ndarray:
        """Two planes (rows x columns) from the mover's side: its discs, the opponent's."""
        grid = np.array(self.grid)
        return np.stack([grid == self.player, grid == 1 - self.player]).astype(np.float32)

    def clone(self) -> ConnectFour:
        copy = ConnectFour.__new__(ConnectFour)
        copy.__dict__.update(self.__dict__)
        copy.grid = [list(row) for row in self.grid]
        copy.heights = list(self.heights)
        return copy
