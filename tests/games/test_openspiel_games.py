"""OpenSpiel's games through the protocol (backend: openspiel): loaded by name, refused where they cannot be played
(chance, more than two players, not zero-sum, over before a move), and their parameters checked in one line
(hpcrl.games.openspiel_params) before OpenSpiel's C++ sees them, in a child process where it could crash."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from factories import write_config

from hpcrl import games
from hpcrl.config.experiment import EnvConfig
from hpcrl.rl.strength import make_opponent, play_match


def test_openspiel_games_by_name():
    pytest.importorskip("pyspiel")
    spec = games.load(EnvConfig(id="tic_tac_toe", backend="openspiel"))
    games.check_game(spec)
    assert spec.num_actions == 9 and spec.observation_shape == (3, 3, 3)
    bot = make_opponent("mcts:30", spec, 0)  # OpenSpiel's own MCTSBot
    rng = random.Random(0)
    results = play_match(spec, lambda states: [rng.choice(s.legal_actions()) for s in states], bot, 6, 1000)
    assert sum(r < 0 for r, *_ in results) >= 4
    four = games.load(EnvConfig(id="connect_four", backend="openspiel", kwargs={"rows": 4, "columns": 5}))
    assert four.num_actions == 5 and four.mirror == (4, 3, 2, 1, 0) and spec.mirror == (2, 1, 0, 5, 4, 3, 8, 7, 6)
    games.check_game(four)  # the declared mirrors (OPENSPIEL_MIRRORS) hold for OpenSpiel's observation planes
    for name, params, words in [("kuhn_poker", {}, "has chance events"), ("matrix_pd", {}, "is not zero-sum"), ("kuhn_poker", {"players": 3}, "has 3 players")]:
        with pytest.raises(games.GameError, match=words):
            games.load(EnvConfig(id=name, backend="openspiel", kwargs=params))
    with pytest.raises(games.GameError, match="is not an OpenSpiel game"):
        games.load(EnvConfig(id="tic_tac_toes", backend="openspiel"))
    checkers = games.load(EnvConfig(id="checkers", backend="openspiel", kwargs={"rows": 6, "columns": 6}))  # issue 37 item 1: no piece can move
    with pytest.raises(games.GameError, match=r"^checkers: the game is over before its first move"):
        games.check_game(checkers)


@pytest.mark.parametrize(
    ("kwargs", "line"),
    [
        ({"rows": 0}, "env.kwargs.rows: connect_four's rows is a board size: expected a positive int, got 0"),  # a segmentation fault of the sweep before
        ({"rows": -1}, "env.kwargs.rows: connect_four's rows is a board size: expected a positive int, got -1"),
        ({"columns": 0}, "env.kwargs.columns: connect_four's columns is a board size: expected a positive int, got 0"),
        ({"rows": "6"}, "env.kwargs.rows: connect_four's rows is an int (default 6), got '6'"),
        ({"rows": True}, "env.kwargs.rows: connect_four's rows is an int (default 6), got True"),
        ({"depth": 3}, "env.kwargs.depth: connect_four has no parameter 'depth' (its parameters: columns, egocentric_obs_tensor, rows, x_in_row)"),
        ({"id": "go", "board_size": 30}, "env.kwargs: OpenSpiel refuses go with {'board_size': 30}: The current Go implementation supports board size up to 19"),
        ({"id": "clobber", "rows": 1}, "env.kwargs: OpenSpiel refuses clobber with {'rows': 1}: "),
    ],
)
def test_openspiel_parameters_are_checked_in_one_line_before_openspiel_sees_them(tmp_path, kwargs, line):
    """`hpcrl sweep` (its own process: OpenSpiel's C++ could crash it) exits 2 with one line that
    names the key, and nothing of OpenSpiel's own on stderr."""
    pytest.importorskip("pyspiel")
    kwargs = dict(kwargs)
    config = write_config(tmp_path, {"algo": "alphazero", "env": {"backend": "openspiel", "id": kwargs.pop("id", "connect_four"), "num_envs": 1, "kwargs": kwargs}})
    data = yaml.safe_load(config.read_text())
    data["train"] = {}  # AlphaZero's defaults (the factory's are PPO's)
    config.write_text(yaml.safe_dump(data))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(games.__file__).parents[2]), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-m", "hpcrl", "sweep", str(config), "--scheduler", "local", "--dry-run"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and line in done.stderr, (done.returncode, done.stderr)


def test_openspiel_parameters_of_the_declared_types_load():
    """A float parameter given as an int (YAML's `komi: 7`) is OpenSpiel's float; the game loads."""
    pytest.importorskip("pyspiel")
    spec = games.load(EnvConfig(id="connect_four", backend="openspiel", kwargs={"rows": 5, "columns": 6, "x_in_row": 4}))
    assert spec.num_actions == 6
    from hpcrl.games.openspiel_params import checked_parameters

    assert checked_parameters("go", {"komi": 7.5, "board_size": 19}, {"komi": 7, "board_size": 9}) == {"komi": 7.0, "board_size": 9}


def test_a_crash_of_openspiel_is_its_child_process_s():
    """What the checks above do not foresee cannot take hpcrl down: the first load is a child's."""
    pytest.importorskip("pyspiel")
    from hpcrl.games.openspiel_params import GameParameterError, probe_load

    with pytest.raises(GameParameterError, match=r"^env.kwargs: OpenSpiel crashed loading connect_four with \{'rows': 0\} \(killed by SIGSEGV\)$"):
        probe_load("connect_four", {"rows": 0})
