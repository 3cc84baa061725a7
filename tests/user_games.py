"""Users' game classes for the games and AlphaZero tests (tests/games/, tests/rl/test_alphazero.py): a working one,
and ones that break the protocol."""

from __future__ import annotations

from hpcrl.games.tictactoe import TicTacToe


class Nim:
    """Take 1 or 2 from a pile of `pile`; whoever takes the last one wins. Solved: the mover wins
    unless the pile is a multiple of 3."""

    num_actions = 2

    def __init__(self, pile: int = 5) -> None:
        self.pile, self.player, self.last = pile, 0, -1

    def current_player(self) -> int:
        return self.player

    def legal_actions(self) -> list[int]:
        return [a for a in (0, 1) if a + 1 <= self.pile]

    def apply_action(self, action: int) -> None:
        self.pile -= action + 1
        self.last, self.player = self.player, 1 - self.player

    def is_terminal(self) -> bool:
        return self.pile == 0

    def returns(self) -> tuple[float, float]:
        return (1.0, -1.0) if self.last == 0 else (-1.0, 1.0)

    def observation(self) -> list[float]:
        return [float(self.pile == n) for n in range(16)]

    def clone(self) -> Nim:
        copy = type(self)(self.pile)
        copy.player, copy.last = self.player, self.last
        return copy


class NoClone:
    """Everything but `clone`."""

    num_actions = 2

    def __init__(self) -> None:
        pass

    def current_player(self) -> int:
        return 0

    def legal_actions(self) -> list[int]:
        return [0]

    def apply_action(self, action: int) -> None:
        pass

    def is_terminal(self) -> bool:
        return True

    def returns(self) -> tuple[float, float]:
        return (0.0, 0.0)

    def observation(self) -> list[float]:
        return [0.0]


class BothWin(Nim):
    """Both players get +1: not zero-sum."""

    def returns(self) -> tuple[float, float]:
        return (1.0, 1.0)


class ByTwo(Nim):
    """Zero-sum, but the winner gets 2: beyond what the value network predicts."""

    def returns(self) -> tuple[float, float]:
        return (2.0, -2.0) if self.last == 0 else (-2.0, 2.0)


class Refuses(Nim):
    """Lists taking two but refuses it once the pile is below 4: an illegal move from the game."""

    def apply_action(self, action: int) -> None:
        if action == 1 and self.pile < 4:
            raise ValueError("cannot take two now")
        super().apply_action(action)


class SometimesBad(Nim):
    """Lists an action out of range when the pile is 9 (a game the sweep-time check would refuse
    with a pile of 9 or more; a run built without that check meets it during play)."""

    def legal_actions(self) -> list[int]:
        return [0, 1, 7] if self.pile == 9 else super().legal_actions()


class OverAtStart(Nim):
    """An empty pile: the game is over before anyone moves (as OpenSpiel's checkers on 6x6)."""

    def __init__(self, pile: int = 0) -> None:
        super().__init__(pile)


class TerminalRaises(Nim):
    """is_terminal() raises once a stone is taken."""

    def is_terminal(self) -> bool:
        if self.pile < 5:
            raise RuntimeError("lost count")
        return super().is_terminal()


class ObservationRaises(Nim):
    """observation() raises with three stones left."""

    def observation(self) -> list[float]:
        if self.pile == 3:
            raise KeyError(3)
        return super().observation()


class Huge(Nim):
    """A billion actions, two of them legal: its network and replay window would not fit."""

    num_actions = 10**9


class ActionsRaise(Nim):
    @property
    def num_actions(self) -> int:
        raise ValueError("not decided yet")


class SharedCounter(Nim):
    """Ends in a draw after 50 moves, counted in a list its clones share: the observation never
    shows the count, but every search on a clone advances the real game's (so under MCTS each
    self-play game lasts one move)."""

    def __init__(self, pile: int = 5) -> None:
        super().__init__(pile)
        self.moves = [0]

    def apply_action(self, action: int) -> None:
        super().apply_action(action)
        self.moves[0] += 1

    def is_terminal(self) -> bool:
        return super().is_terminal() or self.moves[0] >= 50

    def returns(self) -> tuple[float, float]:
        return (0.0, 0.0) if self.pile else super().returns()

    def clone(self) -> SharedCounter:
        copy = type(self)(self.pile)
        copy.player, copy.last, copy.moves = self.player, self.last, self.moves
        return copy


class PassOrLose:
    """Action 0 passes, action 1 resigns: random play ends a game in two moves on average, and a
    search never resigns, so under it a game never ends."""

    num_actions = 2

    def __init__(self) -> None:
        self.player, self.loser = 0, -1

    def current_player(self) -> int:
        return self.player

    def legal_actions(self) -> list[int]:
        return [0, 1]

    def apply_action(self, action: int) -> None:
        if action == 1:
            self.loser = self.player
        self.player = 1 - self.player

    def is_terminal(self) -> bool:
        return self.loser >= 0

    def returns(self) -> tuple[float, float]:
        return (-1.0, 1.0) if self.loser == 0 else (1.0, -1.0)

    def observation(self) -> list[float]:
        return [1.0]

    def clone(self) -> PassOrLose:
        copy = PassOrLose()
        copy.player, copy.loser = self.player, self.loser
        return copy


class TurnedNotMirrored(TicTacToe):
    """Declares the board turned half round (cell i -> 8 - i, a permutation that undoes itself) as
    its mirror image: the observation mirrored left to right is not that position."""

    mirror_actions = (8, 7, 6, 5, 4, 3, 2, 1, 0)


class MirrorNotAPermutation(TicTacToe):
    mirror_actions = (2, 1, 0, 5, 4, 3, 8, 7, 7)


class MirrorRaises(TicTacToe):
    @property
    def mirror_actions(self) -> tuple[int, ...]:
        raise RuntimeError("not today")


__all__ = ["Nim", "NoClone", "BothWin", "Refuses", "SometimesBad", "OverAtStart", "TerminalRaises", "ObservationRaises", "Huge", "ActionsRaise", "SharedCounter", "PassOrLose", "TicTacToe", "TurnedNotMirrored", "MirrorNotAPermutation", "MirrorRaises"]
