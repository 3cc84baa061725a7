"""The games protocol (hpcrl.games): the range a game's returns must keep, the bundled games keeping the
protocol, and perfect play (hpcrl.games.minimax) solving the games small enough to solve."""

from __future__ import annotations

import random

import numpy as np

from hpcrl import games
from hpcrl.config.experiment import EnvConfig
from hpcrl.games.minimax import PerfectPlayer
from hpcrl.games.tictactoe import TicTacToe
from hpcrl.rl.strength import play_match

TTT = EnvConfig(id="hpcrl.games.tictactoe:TicTacToe", backend="game")



def test_the_returns_range_includes_its_bound_and_its_rounding_and_nothing_beyond():
    """games.beyond_returns, the one range test of a game's returns and of the value targets the decoupled
    trainer takes: +-1 and float32 rounding of it pass, anything past the tolerance does not."""
    bound = games.RETURN_BOUND + games.TOLERANCE
    assert not games.beyond_returns(np.array([-1.0, 1.0, np.float32(1.0000001), bound, -bound]))
    assert games.beyond_returns(np.array([0.0, np.nextafter(bound, 2.0)])) and games.beyond_returns(np.array([-np.nextafter(bound, 2.0)]))


def test_bundled_games_keep_the_protocol():
    for env_id in ("hpcrl.games.tictactoe:TicTacToe", "hpcrl.games.connect_four:ConnectFour"):
        spec = games.load(EnvConfig(id=env_id, backend="game"))
        assert spec.mirror is not None  # and check_game plays every game beside its mirror image
        games.check_game(spec)



def test_perfect_player_solves_tic_tac_toe_and_nim():
    spec = games.load(TTT)
    perfect = PerfectPlayer(spec, random.Random(0))
    assert perfect.value(TicTacToe()) == 0
    assert len(perfect.memo) < 6000  # 5,478 positions
    nim = games.load(EnvConfig(id="user_games:Nim", backend="game", kwargs={"pile": 7}))
    solver = PerfectPlayer(nim, random.Random(0))
    assert solver.value(nim.new_initial_state()) == 1.0  # 7 is not a multiple of 3: the mover wins
    rng = random.Random(0)
    results = play_match(spec, lambda states: [rng.choice(s.legal_actions()) for s in states], perfect, 20, 1000)
    assert all(r <= 0 for r, *_ in results)  # a random player never beats perfect play
    assert [m["first"] for *_, m in results[:2]] == [1.0, 0.0]
