"""The strength of a two-player agent: games against fixed opponents, both colours.

Opponents (`train.opponents`): `random` (uniform over legal actions), `perfect` (minimax over the
whole game with a memo, a random choice among the best moves; for games small enough to solve,
such as tic-tac-toe: hpcrl.games.minimax), and `mcts:N` (MCTS with random
rollouts at N simulations: OpenSpiel's MCTSBot for OpenSpiel games, hpcrl.games.mcts with a rollout
evaluator otherwise).

The agent plays MCTS with its network (train.eval_simulations, else train.simulations; no noise,
the most visited action); its moves in all games of a match are searched together, one batched
forward pass per simulation.
Game k of a match has the agent move first when k is even. Each game's result is a row like an
episode's, the return being +1 / 0 / -1 for the agent (the game's return for its side), so
eval.csv, eval_curve.csv and collect's curves and intervals read it as they read returns; the
counts per opponent go to strength.csv (eval stage) and strength_curve.csv (during training).

The Elo ladder (`ladder`): the eval stage plays a round robin between `random` and the run's own
policies (the snapshots of the evaluations during training, at most `train.ladder_players` of them,
and the checkpoint it evaluates), `train.ladder_games` games per pair, each colour half of them. Two fixed
networks searched without noise play the same game every time, so each pair of games (one with
each colour) starts from its own LADDER_OPENING random moves. The counts go to ladder.csv; collect
fits the ratings (hpcrl.results.strength).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from hpcrl import games
from hpcrl.games import Game, GameError, GameSpec, mcts
from hpcrl.games.minimax import PerfectPlayer
from hpcrl.rl.alphazero import greedy, network_evaluator

ROLLOUT_C_PUCT = 2.0
"""Exploration of hpcrl's own random-rollout MCTS (OpenSpiel's MCTSBot uses UCT with c = 2)."""

Opponent = Callable[[Game], int]
Agent = Callable[[Sequence[Game]], list[int]]
Result = tuple[float, int, dict[str, float]]
Progress = Callable[[int, int], None]
"""Told after every move of a match: (games finished, moves played), so a long one can say how far it is."""

LADDER_OPENING = 2
"""Random moves that start each pair of ladder games."""


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
    evaluate = mcts.rollout_evaluator(spec, rng)
    return lambda state: greedy(mcts.search([state], evaluate, spec.num_actions, simulations, ROLLOUT_C_PUCT)[0][0])


def mcts_agent(net: torch.nn.Module, device: torch.device, spec: GameSpec, simulations: int, c_puct: float) -> Agent:
    """The trained agent: MCTS guided by its network, no root noise, the most visited action."""
    evaluate = network_evaluator(net, device)
    return lambda states: [greedy(c) for c in mcts.search(states, evaluate, spec.num_actions, simulations, c_puct)[0]]


def random_agent(spec: GameSpec, rng: random.Random) -> Agent:
    return lambda states: [rng.choice(games.legal_actions(s, spec.num_actions)) for s in states]


def play_match(
    spec: GameSpec, agent: Agent, opponent: Opponent | Agent, n_games: int, max_moves: int, batched: bool = False, opening: Sequence[Sequence[int]] = (),
    progress: Progress | None = None,
) -> list[Result]:
    """`n_games` games, the agent first in the even ones; each with the agent's return and the length.
    `batched`: the opponent is an Agent too (all its moves of a turn at once). `opening`: moves
    played first in game k (`opening[k // 2]`, the same for both colours). A game that has not
    ended after `max_moves` moves (train.max_moves) fails the evaluation in one line. `progress`
    is told after every move of all the games (they are played in lockstep)."""
    states = [spec.new_initial_state() for _ in range(n_games)]
    sides = [k % 2 for k in range(n_games)]
    lengths = [0] * n_games
    for k, state in enumerate(states):
        for action in opening[k // 2] if opening else ():
            if games.is_terminal(state):
                break
            games.apply(state, action)
            lengths[k] += 1
    play: Agent = opponent if batched else lambda states: [opponent(s) for s in states]  # type: ignore[assignment,misc,arg-type]
    moves_played = 0
    while active := [k for k in range(n_games) if not games.is_terminal(states[k])]:
        agent_turn = [k for k in active if games.current_player(states[k]) == sides[k]]
        other_turn = [k for k in active if k not in set(agent_turn)]
        moves = dict(zip(agent_turn, agent([states[k] for k in agent_turn]))) if agent_turn else {}
        moves.update(zip(other_turn, play([states[k] for k in other_turn])) if other_turn else {})
        for k in active:
            action = moves[k]
            if k not in agent_turn and action not in games.legal_actions(states[k], spec.num_actions):
                raise GameError(f"the opponent chose {action}, which is not legal in {spec.name}")
            games.apply(states[k], int(action))
            lengths[k] += 1
            if lengths[k] >= max_moves and not games.is_terminal(states[k]):
                raise games.too_long(spec, "an evaluation game", max_moves)
        moves_played += len(active)
        if progress is not None:
            progress(sum(games.is_terminal(state) for state in states), moves_played)
    results = []
    for k, state in enumerate(states):
        ret = games.returns(state)[sides[k]]
        results.append((ret, lengths[k], {"win": float(ret > 0), "draw": float(ret == 0), "loss": float(ret < 0), "first": float(sides[k] == 0)}))
    return results


def evaluate_strength(
    spec: GameSpec, net: torch.nn.Module, device: torch.device, cfg: Any, games_each: int, seed: int,
    progress_of: Callable[[str, int], Progress] | None = None,
) -> dict[str, list[Result]]:
    """Each of cfg.opponents' results against the agent (cfg: the run's AlphaZeroConfig).
    `progress_of(opponent, games)`: what to tell about each match as it is played."""
    agent = mcts_agent(net, device, spec, cfg.eval_simulations or cfg.simulations, cfg.c_puct)
    return {
        name: play_match(spec, agent, make_opponent(name, spec, seed + i), games_each, cfg.max_moves, progress=progress_of(name, games_each) if progress_of else None)
        for i, name in enumerate(cfg.opponents)
    }


def summary(name: str, results: Sequence[Result]) -> list[Any]:
    """A strength row: opponent, games, wins, draws, losses, and the rates."""
    n = len(results)
    wins, draws, losses = (sum(int(m[k]) for *_, m in results) for k in ("win", "draw", "loss"))
    return [name, n, wins, draws, losses, f"{wins / n:.4g}", f"{draws / n:.4g}", f"{losses / n:.4g}"]


def random_openings(spec: GameSpec, n_pairs: int, plies: int, rng: random.Random) -> list[list[int]]:
    """`n_pairs` sequences of up to `plies` uniformly random moves (shorter where a game ends)."""
    openings = []
    for _ in range(n_pairs):
        state, moves = spec.new_initial_state(), []
        while len(moves) < plies and not games.is_terminal(state):
            moves.append(rng.choice(games.legal_actions(state, spec.num_actions)))
            games.apply(state, moves[-1])
        openings.append(moves)
    return openings


def ladder_players(steps: Sequence[int], limit: int) -> list[int]:
    """At most `limit` (train.ladder_players) of the snapshot steps, evenly spaced, the last always
    in and the first too where two fit: a round robin of p players costs p^2 / 2 matches."""
    steps = sorted(set(steps))
    if len(steps) <= limit:
        return steps
    if limit == 1:
        return steps[-1:]
    return sorted({steps[round(i * (len(steps) - 1) / (limit - 1))] for i in range(limit)})


def ladder_pairs(agents: int) -> int:
    """Matches of a round robin between `random` and `agents` policies."""
    return (agents + 1) * agents // 2


def ladder(
    spec: GameSpec, agents: dict[str, Agent], games_per_pair: int, seed: int, max_moves: int, progress_of: Callable[[str, int], Progress] | None = None,
) -> list[list[Any]]:
    """Round robin between `agents` (name -> agent; `random` plays uniformly); a ladder.csv row per
    pair: player_a, player_b, games, a_wins, draws, b_wins (player a first in the even games).
    `progress_of("a vs b", games)`: what to tell about each match as it is played."""
    rng = random.Random(seed)
    players = {"random": random_agent(spec, rng), **agents}
    names = list(players)
    rows = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            opening = random_openings(spec, (games_per_pair + 1) // 2, LADDER_OPENING, rng)
            tell = progress_of(f"{a} vs {b}", games_per_pair) if progress_of else None
            results = play_match(spec, players[a], players[b], games_per_pair, max_moves, batched=True, opening=opening, progress=tell)
            wins, draws, losses = (int(sum(m[k] for *_, m in results)) for k in ("win", "draw", "loss"))
            rows.append([a, b, games_per_pair, wins, draws, losses])
    return rows
