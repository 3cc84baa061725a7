"""The strength of a two-player agent: games against fixed opponents, both colours.

Opponents (`train.opponents`): `random` (uniform over legal actions), `perfect` (minimax over the
whole game with a memo, a random choice among the best moves; for games small enough to solve,
such as tic-tac-toe: hpcrl.rl.minimax), and `mcts:N` (MCTS with random
rollouts at N simulations: OpenSpiel's MCTSBot for OpenSpiel games, hpcrl.rl.mcts with a rollout
evaluator otherwise).

The agent plays MCTS with its network (train.eval_simulations, else train.simulations; no noise,
the most visited action); its moves in all games of a match are searched together, one batched
forward pass per simulation.
Game k of a match has the agent move first when k is even. Each game's result is a row like an
episode's, the return being +1 / 0 / -1 for the agent (the game's return for its side), so
eval.csv, eval_curve.csv and collect's curves and intervals read it as they read returns; the
counts per opponent go to strength.csv (eval stage) and strength_curve.csv (during training).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from hpcrl.rl import games, mcts
from hpcrl.rl.alphazero import greedy, network_evaluator
from hpcrl.rl.games import Game, GameError, GameSpec
from hpcrl.rl.minimax import PerfectPlayer

ROLLOUT_C_PUCT = 2.0
"""Exploration of hpcrl's own random-rollout MCTS (OpenSpiel's MCTSBot uses UCT with c = 2)."""

Opponent = Callable[[Game], int]
Agent = Callable[[Sequence[Game]], list[int]]
Result = tuple[float, int, dict[str, float]]


def make_opponent(name: str, spec: GameSpec, seed: int) -> Opponent:
    rng = random.Random(seed)
    if name == "random":
        return lambda state: rng.choice(games.legal_actions(state, spec.num_actions))
    if name == "perfect":
        return PerfectPlayer(spec, rng)
    simulations = int(name.split(":")[1])
    if spec.openspiel_game is not None:
        from open_spiel.python.algorithms import mcts as spiel_mcts

        np_rng = np.random.RandomState(seed)
        bot = spiel_mcts.MCTSBot(spec.openspiel_game, 2.0, simulations, spiel_mcts.RandomRolloutEvaluator(1, np_rng), random_state=np_rng, solve=True)
        return lambda state: bot.step(state.state)  # type: ignore[attr-defined]
    evaluate = mcts.rollout_evaluator(spec.num_actions, rng)
    return lambda state: greedy(mcts.search([state], evaluate, spec.num_actions, simulations, ROLLOUT_C_PUCT)[0])


def mcts_agent(net: torch.nn.Module, device: torch.device, spec: GameSpec, simulations: int, c_puct: float) -> Agent:
    """The trained agent: MCTS guided by its network, no root noise, the most visited action."""
    evaluate = network_evaluator(net, device)
    return lambda states: [greedy(c) for c in mcts.search(states, evaluate, spec.num_actions, simulations, c_puct)]


def play_match(spec: GameSpec, agent: Agent, opponent: Opponent, n_games: int) -> list[Result]:
    """`n_games` games, the agent first in the even ones; each with the agent's return and the length."""
    states = [spec.new_initial_state() for _ in range(n_games)]
    sides = [k % 2 for k in range(n_games)]
    lengths = [0] * n_games
    while active := [k for k in range(n_games) if not states[k].is_terminal()]:
        agent_turn = [k for k in active if games.current_player(states[k]) == sides[k]]
        moves = dict(zip(agent_turn, agent([states[k] for k in agent_turn]))) if agent_turn else {}
        for k in active:
            action = moves[k] if k in moves else opponent(states[k])
            if action not in games.legal_actions(states[k], spec.num_actions):
                raise GameError(f"the opponent chose {action}, which is not legal in {spec.name}")
            games.apply(states[k], int(action))
            lengths[k] += 1
    results = []
    for k, state in enumerate(states):
        ret = games.returns(state)[sides[k]]
        results.append((ret, lengths[k], {"win": float(ret > 0), "draw": float(ret == 0), "loss": float(ret < 0), "first": float(sides[k] == 0)}))
    return results


def evaluate_strength(
    spec: GameSpec, net: torch.nn.Module, device: torch.device, cfg: Any, games_each: int, seed: int,
) -> dict[str, list[Result]]:
    """Each of cfg.opponents' results against the agent (cfg: the run's AlphaZeroConfig)."""
    agent = mcts_agent(net, device, spec, cfg.eval_simulations or cfg.simulations, cfg.c_puct)
    return {name: play_match(spec, agent, make_opponent(name, spec, seed + i), games_each) for i, name in enumerate(cfg.opponents)}


def summary(name: str, results: Sequence[Result]) -> list[Any]:
    """A strength row: opponent, games, wins, draws, losses, and the rates."""
    n = len(results)
    wins, draws, losses = (sum(int(m[k]) for *_, m in results) for k in ("win", "draw", "loss"))
    return [name, n, wins, draws, losses, f"{wins / n:.4g}", f"{draws / n:.4g}", f"{losses / n:.4g}"]
