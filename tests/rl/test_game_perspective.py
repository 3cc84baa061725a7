"""The observation shows the position from the side of the player to move (issue 37 item 18): the network
predicts the mover's value from the observation alone. `check_game` warns in one line where its random
games prove an observation hides whose move it is; where they cannot, it says nothing."""

from __future__ import annotations

import numpy as np
import pytest

from hpcrl import games
from hpcrl.config.experiment import EnvConfig
from hpcrl.rl.envcheck import _check_game_class


class PassLine:
    """Three cells in a row; a move fills an empty cell, or passes (action 3) while a pass is left: the
    empty line then arises with either player to move. Every game is a draw (zero-sum, and enough here)."""

    num_actions = 4
    relative = False

    def __init__(self) -> None:
        self.cells, self.player, self.passes = [0, 0, 0], 0, 1

    def current_player(self) -> int:
        return self.player

    def legal_actions(self) -> list[int]:
        return [i for i, c in enumerate(self.cells) if c == 0] + ([3] if self.passes else [])

    def apply_action(self, action: int) -> None:
        if action == 3:
            self.passes -= 1
        else:
            self.cells[action] = 1 if self.player == 0 else -1
        self.player = 1 - self.player

    def is_terminal(self) -> bool:
        return all(self.cells)

    def returns(self) -> list[float]:
        return [0.0, 0.0]

    def observation(self) -> np.ndarray:
        board = np.array(self.cells, dtype=np.float32)
        return board * (1 if self.player == 0 else -1) if self.relative else board  # absolute: the same for both players

    def clone(self) -> PassLine:
        copy = type(self).__new__(type(self))
        copy.cells, copy.player, copy.passes = list(self.cells), self.player, self.passes
        return copy


class PassLineFromTheMoversSide(PassLine):
    relative = True


def spec(cls: type) -> games.GameSpec:
    return games.GameSpec(cls.__name__, cls, cls.num_actions, (3,))


def test_an_observation_that_hides_whose_move_it_is_is_warned_about_in_one_line() -> None:
    (warning,) = games.check_game(spec(PassLine))
    assert "\n" not in warning and "cannot tell whose move it is" in warning and "side of the player to move" in warning


def test_an_observation_from_the_movers_side_passes_without_a_word() -> None:
    assert games.check_game(spec(PassLineFromTheMoversSide)) == []


@pytest.mark.parametrize("env_id", ["hpcrl.games.tictactoe:TicTacToe", "hpcrl.games.connect_four:ConnectFour"])
def test_the_bundled_games_show_the_movers_side(env_id: str) -> None:
    assert games.check_game(games.load(EnvConfig(id=env_id, backend="game"))) == []


def test_the_sweep_prints_the_warning_once(capsys) -> None:
    _check_game_class(EnvConfig(id=f"{__name__}:PassLine", backend="game"))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"hpcrl: warning: env.id: {__name__}:PassLine: two positions with different players to move")
