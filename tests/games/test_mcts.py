"""Monte Carlo tree search (hpcrl.games.mcts): the moves it finds from a game's ends alone, whose values it
backs up, how it batches many games, and what train.c_puct and the root's exploration noise do."""

from __future__ import annotations

import numpy as np
from tictactoe_positions import blind, position

from hpcrl.games import mcts
from hpcrl.games.tictactoe import TicTacToe


def mcts_move(state: TicTacToe, simulations: int = 300) -> int:
    counts = mcts.search([state], blind, 9, simulations, c_puct=1.5)[0][0]
    return int(counts.argmax())





def test_mcts_takes_the_winning_move_for_either_player():
    assert mcts_move(position("xx.oo....")) == 2  # x to move wins at 2
    state = position("xx.oo.x..")  # o to move: o wins at 5 (and must, or x wins at 2)
    assert state.current_player() == 1
    assert mcts_move(state) == 5


def test_mcts_blocks_the_only_threat():
    state = position("oo..x...x")  # x to move; o threatens 2; x has no win
    assert state.current_player() == 0
    assert mcts_move(state) == 2


def spied_nodes(monkeypatch) -> list:
    """Every mcts.Node the search makes, in the order made (the root first)."""
    trees = []

    class Spy(mcts.Node):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            trees.append(self)

    monkeypatch.setattr(mcts, "Node", Spy)
    return trees


def test_mcts_batches_many_games_and_masks_illegal_moves():
    """One evaluator call per simulation for all trees (plus the roots'); visits only on legal moves."""
    calls = []

    def counting(states):
        calls.append(len(states))
        return np.full((len(states), 9), 1 / 9), np.zeros(len(states))

    roots = [position("xx.oo...."), position("oo..x...x"), TicTacToe()]
    counts, _ = mcts.search(roots, counting, 9, 20, 1.5)
    assert len(calls) <= 21 and calls[0] == 3
    for root, row in zip(roots, counts):
        assert row.sum() == 20
        illegal = [a for a in range(9) if a not in root.legal_actions()]
        assert (row[illegal] == 0).all()


def test_mcts_backs_values_up_for_the_player_who_moves(monkeypatch):
    """A leaf's value is for the player to move there, an edge's Q for the player who chooses it:
    with every position worth +1 to x, x's root edges (o to move below, worth -1 to o) have Q = +1."""
    def x_wins(states):
        return np.ones((len(states), 9)), np.array([1.0 if s.current_player() == 0 else -1.0 for s in states])

    trees = spied_nodes(monkeypatch)
    mcts.search([TicTacToe()], x_wins, 9, 30, 1.5)
    root = trees[0]
    assert root.visits.sum() == 30 and (root.q[root.visits > 0] == 1.0).all()
    child = next(node for node in root.children.values() if node.visits.sum() > 0)  # o to move: its edges lead to x, +1 for x = -1 for o
    assert (child.q[child.visits > 0] == -1.0).all()


def test_mcts_gives_each_root_its_value_for_the_player_to_move():
    """The root's value (what train.value_target_q mixes into the target) is for the player to move there."""
    def x_wins(states):
        return np.ones((len(states), 9)), np.array([1.0 if s.current_player() == 0 else -1.0 for s in states])

    _, values = mcts.search([TicTacToe(), position("x........")], x_wins, 9, 30, 1.5)
    assert values.tolist() == [1.0, -1.0]
    _, (x_to_win, o_lost) = mcts.search([position("xx.oo...."), position("xx.oo.x..")], blind, 9, 300, 1.5)
    assert x_to_win > 0.5  # x finds its win at 2 and spends most simulations there
    assert o_lost > 0.5  # o to move wins at 5 (its value, not x's)


def test_c_puct_weighs_exploration_against_the_values_found():
    """train.c_puct reaches every selection: x wins at once at 2, and a low c_puct spends nearly all
    simulations there, a high one spreads them over the moves the values speak against (each legal
    move visited). A search that selected with a fixed constant gave both the same counts."""
    win = position("xx.oo....")
    greedy_counts = mcts.search([win], blind, 9, 200, c_puct=0.5)[0][0]
    exploring = mcts.search([win], blind, 9, 200, c_puct=50.0)[0][0]
    assert greedy_counts[2] >= 190
    assert exploring[2] < 100 and (exploring[win.legal_actions()] > 0).all()


def test_dirichlet_noise_is_mixed_into_the_roots_priors_only(monkeypatch):
    """AlphaZero's exploration noise is for the root (the move self-play makes); a node below it keeps
    the network's priors, or every simulation would be steered by noise at every depth."""
    trees = spied_nodes(monkeypatch)
    np.random.seed(0)
    mcts.search([TicTacToe(), position("x........")], blind, 9, 40, 1.5, noise=(0.3, 0.5))
    roots, below = trees[:2], [node for node in trees[2:] if node.expanded]
    for root in roots:
        assert not np.allclose(root.prior, 1 / len(root.actions))  # the blind evaluator's uniform priors, noised
    assert len(below) > 10
    for node in below:
        np.testing.assert_array_equal(node.prior, np.full(len(node.actions), 1 / len(node.actions)))
