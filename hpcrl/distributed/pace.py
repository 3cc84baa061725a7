"""When a learner job updates and when it takes data: the set ratio, and the slack that keeps both sides busy.

A learning half (apex.ApexLearner, selfplay.AlphaZeroLearner) earns `credit` with the data it takes
(DQN: gradient_steps per train_freq transitions; AlphaZero: train_steps_per_iteration per
games_per_iteration games) and spends one per update. Held to that ratio exactly, the faster side
of the run waits whenever the rates differ: the learner for data, or the actors on a full queue.
`distributed.ratio_slack` lets the realised ratio float in a band around the set one, which is
what the decoupled AlphaZero of the seed relies on (neither the trainer nor the self-play waits):

- **ahead**: with no data to take, the learner may update on its window anyway, down to `-band`
  credit (more updates per unit of data than set);
- **behind**: with the queue at least half full and credit to spare, the learner takes batches
  anyway, up to `band` credit above its usual working store of `per_poll` updates (fewer updates
  per unit of data than set, for a while);
- at the end of the budget, owed updates within the band are forgiven instead of paid out while the
  actors idle, so the run's realised ratio ends within `1 +- ratio_slack` times the set one.

`band = ratio_slack x updates earned so far`: the cumulative ratio is what bounds, so a side faster by
less than the slack never waits once the run is under way, and a faster one waits at the band's
edge as it would with no slack. With `ratio_slack: 0` every rule reduces to the fixed ratio.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class LearningHalf(Protocol):
    """What pacing reads of a learning half."""

    credit: float
    global_step: int
    updates: int

    def learnable(self) -> bool:
        """Whether the window (replay) holds enough to draw a minibatch."""
        ...


class Pace:
    def __init__(self, slack: float, per_poll: int) -> None:
        self.slack, self.per_poll = slack, per_poll

    def band(self, algo: LearningHalf) -> float:
        """Updates the learner may be ahead of, or behind, the ones its data earned."""
        return self.slack * max(0.0, algo.updates + algo.credit)

    def may_update(self, algo: LearningHalf, total_steps: int) -> bool:
        """An owed update, or (before the budget is in) one ahead within the band."""
        if not algo.learnable():
            return False
        return algo.credit >= 1.0 or (algo.global_step < total_steps and algo.credit - 1.0 >= -self.band(algo))

    def updates_wanted(self, algo: LearningHalf, queue_half_full: Callable[[], bool]) -> float:
        """Updates' worth of data to take now (0: leave the batches queued, so a fast actor waits).
        `queue_half_full` is asked only when the answer depends on it (a round trip to Redis)."""
        if algo.credit < self.per_poll:
            return self.per_poll - algo.credit
        room = self.per_poll + self.band(algo) - algo.credit
        return room if room > 0 and queue_half_full() else 0.0

    def finished(self, algo: LearningHalf, total_steps: int) -> bool:
        """The budget is in and no update is owed beyond the band (within it, owed updates are forgiven)."""
        return algo.global_step >= total_steps and not (algo.learnable() and algo.credit - self.band(algo) >= 1.0)

    @staticmethod
    def realised(algo: LearningHalf) -> float | None:
        """Updates done over updates earned (1.0: the set ratio); None before any was earned."""
        earned = algo.updates + algo.credit
        return algo.updates / earned if earned > 0 else None
