"""Two-player games for AlphaZero: the protocol a game implements, its checks, and the loaders.

This package is the game side of self-play, which needs no torch: this protocol (OpenSpiel's state API in
small), hpcrl's own games written to it (`tictactoe`, `connect_four`: examples to copy for your own), search
(`mcts`: MCTS with PUCT or random rollouts), perfect play (`minimax`) and OpenSpiel's game parameters
(`openspiel_params`). The learning side (`hpcrl.rl.alphazero`, `hpcrl.rl.strength`) is built on it.

A game is a class whose instances are positions. Constructing it (with `env.kwargs` as keyword
arguments) gives the initial position; the rest is this protocol, OpenSpiel's state API in small:

    class MyGame:
        num_actions: int                      # actions are 0 .. num_actions-1
        def current_player(self) -> int       # 0 or 1 (the player to move; unused once terminal)
        def legal_actions(self) -> list[int]  # non-empty while the game is not over
        def apply_action(self, action: int) -> None
        def is_terminal(self) -> bool
        def returns(self) -> Sequence[float]  # (player 0's, player 1's), in [-1, 1], summing to 0: +1/0/-1 as a rule
        def observation(self) -> np.ndarray   # the same shape in every position, float-like, from the
                                              # side of the player to move (see below)
        def clone(self) -> "MyGame"           # an independent copy
        mirror_actions: Sequence[int]         # optional: see below

The network sees only `observation()` and predicts the value of the position for the player to move,
so the observation must show the position from that player's side (its stones and the opponent's, as
hpcrl's tic-tac-toe and connect four draw them), or say who moves: one board drawn alike for both
players, where a position can arise with either to move, asks one input for two different values and
learns nothing. `check_game` warns (one line) where its random games prove it: two positions with
different players to move show one observation and the same move then leads apart. It cannot prove
more: where the mover follows from the board (the count of stones), nothing is said.

A game whose board looks the same mirrored left to right (connect four, tic-tac-toe) may say so
with `mirror_actions`: the action each action becomes in the mirror image, when the observation
is mirrored on its last axis (columns). AlphaZero then trains on every position and its mirror
image (`train.mirror`), twice the data from the same self-play. `check_game` plays each random
game beside its mirror image and refuses a declaration the game does not keep. OpenSpiel's
connect_four and tic_tac_toe are declared here (`OPENSPIEL_MIRRORS`).

`env.backend: game` with `env.id: mypkg.mygame:MyGame` loads a user's class; hpcrl's own
tic-tac-toe and connect four are `hpcrl.games.tictactoe:TicTacToe` and
`hpcrl.games.connect_four:ConnectFour`. `env.backend: openspiel` with `env.id: connect_four`
loads OpenSpiel's game of that name (`pip install 'hpcrl[openspiel]'`), `env.kwargs` being its
game parameters; only deterministic, sequential, perfect-information, two-player zero-sum games.
Those parameters are checked against the game's declared ones before OpenSpiel sees them, and its
first load is a child process's (`hpcrl.games.openspiel_params`): OpenSpiel's C++ trusts them.

`check_game` plays a few random games at sweep time, so a class that breaks the protocol (a
missing method, a method that raises, returns that do not sum to zero or leave [-1, 1], a wrong
player, a changing observation shape, a first position that is already over, a clone that shares
what it changes with its original) is refused in one line before anything is submitted. Every call
into a game goes through the checked accessors below (`is_terminal`, `observation`, `legal_actions`,
...), at sweep time and during training alike: an exception from the game is one line naming the
method and the game, and an action the game refuses fails the run with one line (`apply`).

No torch here: the checks run on a login node.
"""

from __future__ import annotations

import copy
import importlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from hpcrl.config.hparams import MAX_MOVES
from hpcrl.games.openspiel_params import checked_parameters, probe_load
from hpcrl.store.rundir import RunError

GAME_BACKENDS = ("openspiel", "game")
METHODS = ("current_player", "legal_actions", "apply_action", "is_terminal", "returns", "observation", "clone")
CHECK_GAMES = 20
"""Random games played by `check_game`."""
MAX_ACTIONS = 100_000
"""Most actions a game may have (OpenSpiel's chess has 4,672): the policy head and every replay
position hold a number per action, and 10**9 of them passed the sweep and failed in torch's
allocator (64 GB)."""
CLONE_CHECKS = 200
"""Moves of each random game at which `check_game` also compares the original's own attributes
before and after a move on its clone (a deep copy of them each time)."""
RETURN_BOUND = 1.0
"""A game's returns, and so every value target AlphaZero learns from them, lie in [-RETURN_BOUND,
RETURN_BOUND]: the value network's tanh predicts there, and a target beyond it could never be learned."""
TOLERANCE = 1e-6
"""Rounding allowed on returns (and on a value target, a float32 mix of them and the search's values)."""


def beyond_returns(values: np.ndarray) -> bool:
    """Whether any of `values` lies outside the returns' range: the one test of the game's
    returns (`returns`) and of the value targets that reach the decoupled trainer."""
    return bool((np.abs(np.asarray(values, dtype=np.float64)) > RETURN_BOUND + TOLERANCE).any())


@runtime_checkable
class Game(Protocol):
    num_actions: int

    def current_player(self) -> int: ...
    def legal_actions(self) -> list[int]: ...
    def apply_action(self, action: int) -> None: ...
    def is_terminal(self) -> bool: ...
    def returns(self) -> Sequence[float]: ...
    def observation(self) -> np.ndarray: ...
    def clone(self) -> Game: ...


class GameError(RunError):
    """A game that broke the protocol during a run: the run fails with this one line."""


@dataclass
class GameSpec:
    """A loaded game: what makes its initial position, and what the network needs to know."""

    name: str
    new_initial_state: Callable[[], Game]
    num_actions: int
    observation_shape: tuple[int, ...]
    openspiel_game: Any = None
    """pyspiel's game object for `env.backend: openspiel` (its MCTS bot plays on it), else None."""
    mirror: tuple[int, ...] | None = None
    """The game's `mirror_actions` (a permutation of the actions), or None: no symmetry declared."""

    def close(self) -> None:
        """Nothing to release; present so the trainer closes a game as it closes vector envs."""


def is_game_env(env: Any) -> bool:
    return env.backend in GAME_BACKENDS


def load(env: Any) -> GameSpec:
    """The game of an `EnvConfig` (backend `openspiel` or `game`). GameError, one line, when it
    cannot be loaded or made."""
    if env.backend == "openspiel":
        return _load_openspiel(env.id, dict(env.kwargs))
    cls = _import_class(env.id)
    kwargs = dict(env.kwargs)
    try:
        first = cls(**kwargs)
    except Exception as exc:
        raise GameError(f"{env.id}({_kwargs_text(kwargs)}) raised {type(exc).__name__}: {exc}".splitlines()[0]) from None
    declared = {name: _attribute(env.id, first, name) for name in (*METHODS, "num_actions")}
    missing = [m for m in METHODS if not callable(declared[m])] + (["num_actions"] if declared["num_actions"] is None else [])
    if missing:
        raise GameError(f"{env.id} does not implement the game protocol (hpcrl.games): missing {', '.join(missing)}")
    num_actions = _num_actions(env.id, declared["num_actions"])
    shape = observation(first).shape
    mirror = _mirror(env.id, _attribute(env.id, first, "mirror_actions"), num_actions)
    return GameSpec(env.id, lambda: cls(**kwargs), num_actions, shape, mirror=mirror)


def _attribute(name: str, state: Any, attribute: str) -> Any:
    """A game's attribute, None where it has none; one raised by a property of the user's is one line."""
    try:
        return getattr(state, attribute, None)
    except Exception as exc:
        raise GameError(f"{name}.{attribute} raised {type(exc).__name__}: {exc}".splitlines()[0]) from None


def _num_actions(name: str, value: Any) -> int:
    """A game's number of actions, checked: a positive int, at most MAX_ACTIONS."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not 1 <= value <= MAX_ACTIONS:
        raise GameError(f"{name}: num_actions must be an int in 1..{MAX_ACTIONS:,} (the network and every stored position hold a number per action), got {_short(value)}")
    return int(value)


def _mirror(name: str, declared: Any, num_actions: int) -> tuple[int, ...] | None:
    """A declared `mirror_actions`, checked to be a permutation of the actions that undoes itself."""
    if declared is None:
        return None
    try:
        items = list(declared)
    except TypeError:
        items = [None]
    ok = all(isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in items)
    mirror = tuple(int(a) for a in items) if ok else ()
    if not ok or sorted(mirror) != list(range(num_actions)) or any(mirror[mirror[a]] != a for a in range(num_actions)):
        raise GameError(f"{name}: mirror_actions must list each of the actions 0..{num_actions - 1} once, as its mirror image (mirrored twice, an action is itself), got {_short(declared)}")
    return mirror


def _kwargs_text(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def own_module_hint(module: str, exc: ImportError) -> str:
    """What to do where the config's own module (or a package above it) is not found: the `hpcrl` command,
    unlike `python -m`, does not look in the current directory. Nothing where the module was found and
    something it imports was not: that line is the module's own."""
    parts = module.split(".")
    if not isinstance(exc, ModuleNotFoundError) or exc.name not in {".".join(parts[:i]) for i in range(1, len(parts) + 1)}:
        return ""
    return " (a module of your own: put its directory on PYTHONPATH, e.g. PYTHONPATH=$PWD hpcrl sweep ...; the jobs get the same PYTHONPATH)"


def _import_class(target: str) -> type:
    module, _, name = target.partition(":")
    if not module or not name:
        raise GameError(f"expected module:Class (mypkg.mygame:MyGame), got {target!r}")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise GameError(f"cannot import {module!r}: {exc}{own_module_hint(module, exc)}") from None
    cls = getattr(mod, name, None)
    if not isinstance(cls, type):
        raise GameError(f"{module!r} has no class {name!r}")
    return cls


class OpenSpielGame:
    """One position of an OpenSpiel game, through the protocol; `state` is pyspiel's."""

    def __init__(self, game: Any, state: Any = None) -> None:
        self.game = game
        self.state = game.new_initial_state() if state is None else state
        self.num_actions = game.num_distinct_actions()

    def current_player(self) -> int:
        return self.state.current_player()

    def legal_actions(self) -> list[int]:
        return self.state.legal_actions()

    def apply_action(self, action: int) -> None:
        self.state.apply_action(action)

    def is_terminal(self) -> bool:
        return self.state.is_terminal()

    def returns(self) -> list[float]:
        return self.state.returns()

    def observation(self) -> np.ndarray:
        """The current player's observation tensor, in the game's shape (board planes for most)."""
        player = self.state.current_player()
        tensor = self.state.observation_tensor(player if player >= 0 else 0)
        return np.asarray(tensor, dtype=np.float32).reshape(self.game.observation_tensor_shape())

    def clone(self) -> OpenSpielGame:
        return OpenSpielGame(self.game, self.state.clone())


def _load_openspiel(name: str, params: dict[str, Any]) -> GameSpec:
    try:
        import pyspiel
    except ImportError:
        raise GameError("env.backend 'openspiel' needs OpenSpiel: pip install 'hpcrl[openspiel]'") from None
    if name not in pyspiel.registered_names():
        raise GameError(f"{name!r} is not an OpenSpiel game (pyspiel.registered_names())")
    (registered,) = (g for g in pyspiel.registered_games() if g.short_name == name)
    params = checked_parameters(name, registered.parameter_specification, params)
    probe_load(name, params)  # a crash or a hang of OpenSpiel's is the child's, named here
    try:
        game = pyspiel.load_game(name, params)
    except pyspiel.SpielError as exc:
        raise GameError(f"OpenSpiel refuses {name} with {params}: {exc}".splitlines()[0]) from None
    kind = game.get_type()
    wanted = [
        (game.num_players() == 2, f"has {game.num_players()} players"),
        (kind.utility == pyspiel.GameType.Utility.ZERO_SUM, f"is not zero-sum ({kind.utility.name})"),
        (kind.chance_mode == pyspiel.GameType.ChanceMode.DETERMINISTIC, "has chance events"),
        (kind.dynamics == pyspiel.GameType.Dynamics.SEQUENTIAL, "is not sequential"),
        (kind.information == pyspiel.GameType.Information.PERFECT_INFORMATION, "has imperfect information"),
        (kind.provides_observation_tensor, "has no observation tensor"),
    ]
    for ok, why in wanted:
        if not ok:
            raise GameError(f"{name} {why}: AlphaZero here plays deterministic two-player zero-sum games of perfect information")
    mirror = OPENSPIEL_MIRRORS[name](game.get_parameters()) if name in OPENSPIEL_MIRRORS else None
    return GameSpec(name, lambda: OpenSpielGame(game), _num_actions(name, game.num_distinct_actions()), tuple(game.observation_tensor_shape()), game, mirror)


OPENSPIEL_MIRRORS: dict[str, Callable[[dict[str, Any]], tuple[int, ...]]] = {
    "connect_four": lambda params: tuple(reversed(range(params["columns"]))),
    "tic_tac_toe": lambda params: (2, 1, 0, 5, 4, 3, 8, 7, 6),
}
"""OpenSpiel games whose observation planes (player, row, column) mirror left to right, with the
action each action becomes in the mirror image (`mirror_actions`); check_game verifies them."""


def _call(state: Game, method: str) -> Any:
    """`state.<method>()`: whatever the game raises is one line naming the method and the game
    (a traceback at sweep time before, rc 1)."""
    try:
        return getattr(state, method)()
    except Exception as exc:
        raise GameError(f"{type(state).__name__}.{method}() raised {type(exc).__name__}: {exc}".splitlines()[0]) from None


def is_terminal(state: Game) -> bool:
    return bool(_call(state, "is_terminal"))


def observation(state: Game) -> np.ndarray:
    return np.asarray(_call(state, "observation"))


def clone(state: Game) -> Game:
    return _call(state, "clone")


def first_position(spec: GameSpec) -> Game:
    """A new game's first position, which must not be over: a game with no move gives self-play no
    position to learn from, and a trainer fed none would loop at step 0 for ever (OpenSpiel's
    checkers on a 6x6 board: no piece can move)."""
    state = spec.new_initial_state()
    if is_terminal(state):
        raise GameError(f"{spec.name}: the game is over before its first move (is_terminal() is true in the first position): there is nothing to play or learn")
    return state


def too_long(spec: GameSpec, what: str, limit: int, key: str | None = "train.max_moves") -> GameError:
    """The one line of a game that has not ended within its move limit: every loop that plays a game
    to its end (self-play, evaluation games, rollouts, the sweep's random games) is bounded by one,
    so none can loop for ever; `key`, the setting of the limit, if there is one."""
    setting = f" ({key}: raise it if the game's games are that long)" if key else ""
    return GameError(f"{spec.name}: {what} did not end within {limit:,} moves{setting}; a game that never ends under search (a move that passes for ever?) must not be played to its end")


def legal_actions(state: Game, num_actions: int) -> list[int]:
    """The position's legal actions, checked: ints in range, without repeats, at least one."""
    actions = _call(state, "legal_actions")
    try:
        ok = len(actions) > 0 and all(isinstance(a, (int, np.integer)) and 0 <= a < num_actions for a in actions) and len(set(actions)) == len(actions)
    except TypeError:
        ok = False
    if not ok:
        raise GameError(f"{type(state).__name__}.legal_actions() returned {_short(actions)} in a position that is not terminal: expected distinct ints in 0..{num_actions - 1}, at least one")
    return [int(a) for a in actions]


def current_player(state: Game) -> int:
    player = _call(state, "current_player")
    if player not in (0, 1):
        raise GameError(f"{type(state).__name__}.current_player() returned {player!r}: expected 0 or 1 (chance and simultaneous moves are not supported)")
    return int(player)


def apply(state: Game, action: int) -> None:
    """Play a legal action; a game that refuses one it listed fails the run in one line."""
    try:
        state.apply_action(action)
    except Exception as exc:
        raise GameError(f"{type(state).__name__}.apply_action({action}) raised {type(exc).__name__}: {exc} (the action was in legal_actions())".splitlines()[0]) from None


def returns(state: Game) -> tuple[float, float]:
    """A terminal position's returns, checked: two finite numbers in [-1, 1] summing to zero (the
    value network's tanh predicts in [-1, 1]: a target beyond it could never be learned)."""
    values = _call(state, "returns")
    try:
        r0, r1 = (float(v) for v in values)
    except (TypeError, ValueError):
        raise GameError(f"{type(state).__name__}.returns() returned {_short(values)}: expected two numbers, one per player") from None
    if not (np.isfinite(r0) and np.isfinite(r1)) or abs(r0 + r1) > TOLERANCE:
        raise GameError(f"{type(state).__name__}.returns() returned ({r0:g}, {r1:g}): a two-player zero-sum game's returns sum to 0")
    if beyond_returns(np.array([r0])):
        raise GameError(f"{type(state).__name__}.returns() returned ({r0:g}, {r1:g}): expected returns in [-1, 1] (+1 / 0 / -1 as a rule), which the value network predicts; scale them")
    return r0, r1


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_game(spec: GameSpec, games: int = CHECK_GAMES, seed: int = 0) -> list[str]:
    """Play `games` random games through the checked accessors above; GameError on the first
    break of the protocol (or a game that does not end within MAX_MOVES moves, the most of any game).
    Returns warnings (one line each) for what the random games show but cannot prove fatal: see
    `_Perspective`."""
    rng = random.Random(seed)
    perspective = _Perspective(spec)
    for _ in range(games):
        state = first_position(spec)
        mirrored = spec.new_initial_state() if spec.mirror else None
        for move in range(MAX_MOVES):
            if mirrored is not None:
                _check_mirror(state, mirrored, spec)
            if is_terminal(state):
                returns(state)
                break
            _check_observation(state, spec.observation_shape)
            perspective.see(state)  # `state` is never changed after this move: the walk goes on in its clone
            actions = legal_actions(state, spec.num_actions)
            before = _position(state, spec.num_actions)
            fields = _deep_fields(state) if move < CLONE_CHECKS else None
            copy_ = clone(state)
            action = rng.choice(actions)
            apply(copy_, action)
            changed = _changed(state, fields) if _position(state, spec.num_actions) == before else "what it shows"
            if changed is not None:
                raise GameError(f"{type(state).__name__}.clone(): playing on the copy changed the original ({changed}): a copy must share nothing it changes with its original, or every search changes the game it searches")
            state = copy_
            if mirrored is not None:
                apply(mirrored, spec.mirror[action])
        else:
            raise too_long(spec, "a random game", MAX_MOVES, None)
    return [perspective.warning] if perspective.warning else []


class _Perspective:
    """Whether the observation shows whose move it is, as far as random games can tell honestly.

    The network sees only the observation and predicts the value for the player to move: two positions
    with different players to move and one observation must be worth the same to their movers. An
    observation from the mover's side gives that (a position and its colours swapped show alike, and the
    same move keeps them alike); a board drawn the same for both players does not, where one position
    arises with either player to move (a pass). So when two positions of the random games show one
    observation with different players to move, the same move is played in both: observations that
    then differ (or returns that differ for the movers) prove the two were not alike, and the one line
    says so. Where no such pair arises (a mover told by the count of stones, as OpenSpiel's tic-tac-toe)
    nothing can be proved, and nothing is said."""

    def __init__(self, spec: GameSpec) -> None:
        self.spec = spec
        self.seen: dict[bytes, Game] = {}
        self.warning: str | None = None

    def see(self, state: Game) -> None:
        if self.warning is not None:
            return
        key = observation(state).tobytes()
        other = self.seen.setdefault(key, state)
        if other is not state and current_player(other) != current_player(state) and self._diverge(other, state):
            self.warning = (
                f"{self.spec.name}: two positions with different players to move show the same observation, and the same move then "
                "leads to different ones: the network cannot tell whose move it is (observation() must show the position from the "
                "side of the player to move, or say who moves)"
            )

    def _diverge(self, a: Game, b: Game) -> bool:
        """After one move legal in both, the two no longer look alike to their movers."""
        common = sorted(set(legal_actions(a, self.spec.num_actions)) & set(legal_actions(b, self.spec.num_actions)))
        if not common:
            return False
        movers = current_player(a), current_player(b)
        after = []
        for state in (a, b):
            state = clone(state)
            apply(state, common[0])
            after.append(state)
        ends = is_terminal(after[0]), is_terminal(after[1])
        if ends[0] != ends[1]:
            return True
        if ends[0]:
            return returns(after[0])[movers[0]] != returns(after[1])[movers[1]]
        return not np.array_equal(observation(after[0]), observation(after[1]))


def _position(state: Game, num_actions: int) -> tuple[Any, ...]:
    """What a position shows through the protocol: the player to move, the legal actions, the observation."""
    return current_player(state), legal_actions(state, num_actions), observation(state).tobytes()


def _fields(obj: Any) -> dict[str, Any] | None:
    """An object's own attributes (its __dict__ or __slots__), or None for one without either."""
    if hasattr(obj, "__dict__"):
        return dict(vars(obj))
    slots = [name for klass in type(obj).__mro__ for name in getattr(klass, "__slots__", ())]
    return {name: getattr(obj, name, None) for name in slots} if slots else None


def _deep_fields(state: Game) -> dict[str, Any] | None:
    """A deep copy of a user's position's attributes, to compare after a move on its clone; None
    for OpenSpiel's (its clone is OpenSpiel's) or where the attributes do not copy."""
    if isinstance(state, OpenSpielGame):
        return None
    try:
        return copy.deepcopy(_fields(state))
    except Exception:  # an attribute that refuses to be copied: only what the position shows is compared
        return None


def _changed(state: Game, before: dict[str, Any] | None) -> str | None:
    """The first attribute of `state` that differs from `before` (its deep copy), named; None if none.
    What the position shows may not tell: a move counter shared by every clone (a game that ends
    after N moves) showed nothing in the observation, and every self-play game lasted one move."""
    if before is None:
        return None
    now = _fields(state) or {}
    for name in now.keys() | before.keys():
        if name not in now or name not in before or not _same(now[name], before[name]):
            return f"its attribute {name!r}"
    return None


def _same(a: Any, b: Any, depth: int = 0) -> bool:
    """Structural equality of an attribute and its earlier deep copy (objects without __eq__ by their
    own attributes); unknown kinds count as the same, so a game is never refused for what cannot be told."""
    if type(a) is not type(b):
        return False
    if depth > 32:
        return True
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], depth + 1) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y, depth + 1) for x, y in zip(a, b))
    if type(a).__eq__ is not object.__eq__:
        try:
            return bool(a == b) or a != a  # NaN is itself
        except Exception:
            return True
    fields = _fields(a)
    return fields is None or _same(fields, _fields(b), depth + 1)


def _check_mirror(state: Game, mirrored: Game, spec: GameSpec) -> None:
    """A position and the one reached by the mirrored moves agree: mirrored observation and legal
    actions, the same player to move, the same end and returns."""
    assert spec.mirror is not None
    same = is_terminal(state) == is_terminal(mirrored)
    if same and is_terminal(state):
        same = returns(state) == returns(mirrored)
    elif same:
        same = (
            current_player(state) == current_player(mirrored)
            and sorted(spec.mirror[a] for a in legal_actions(state, spec.num_actions)) == sorted(legal_actions(mirrored, spec.num_actions))
            and np.array_equal(observation(state)[..., ::-1], observation(mirrored))
        )
    if not same:
        raise GameError(f"{spec.name}: the mirror image of a position (mirror_actions {_short(spec.mirror)}, the observation mirrored on its last axis) is not the position the mirrored moves reach")


def _check_observation(state: Game, shape: tuple[int, ...]) -> None:
    obs = observation(state)
    if obs.shape != shape or not np.issubdtype(obs.dtype, np.number) or not np.isfinite(obs).all():
        raise GameError(f"{type(state).__name__}.observation(): expected finite numbers of shape {shape} in every position, got {obs.dtype} {obs.shape}")
