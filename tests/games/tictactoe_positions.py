"""Tic-tac-toe positions and a blind evaluator, the fixtures of the search's tests (tests/games/test_mcts.py) and of
AlphaZero's (tests/rl/test_alphazero.py): a position is written as the board reads, and the search must find its
moves from the game's ends alone."""

from __future__ import annotations

import numpy as np

from hpcrl.games.tictactoe import TicTacToe


def position(cells: str) -> TicTacToe:
    """A tic-tac-toe position from 9 characters (x: player 0, o: player 1, .: empty), x and o
    moves interleaved from x so that the player to move is right."""
    xs, os_ = [i for i, c in enumerate(cells) if c == "x"], [i for i, c in enumerate(cells) if c == "o"]
    state = TicTacToe()
    for k in range(len(xs) + len(os_)):
        state.apply_action((xs if k % 2 == 0 else os_)[k // 2])
    return state


def blind(states):
    """An evaluator that knows nothing: uniform priors, value 0. MCTS must find the moves from the game's ends."""
    return np.ones((len(states), 9)), np.zeros(len(states))

