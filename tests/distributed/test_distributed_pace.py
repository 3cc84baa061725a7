"""The learner's pace (hpcrl/distributed/pace.py): the set ratio of updates per unit of data, and the
slack that keeps both sides of a decoupled run busy (issue 28: neither the trainer nor the self-play
waits on the other).

The rules are arithmetic on a learning half's counters, so they are driven here by a stand-in half
(credit, steps, updates, a window) and a queue of batches, tick by tick: data is produced at one
rate, the learner can update at another. The whole loop on real Redis and Slurm is
test_distributed_selfplay.py's; the waits it measures there are benchmarks/alphazero_jobs.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from hpcrl.distributed.pace import Pace

WORTH = 4.0
"""Updates one batch earns at the set ratio."""
BOUND = 8
"""The queue's bound, in batches."""


@dataclass
class Half:
    """A learning half's counters, as pace.py reads them (apex.ApexLearner and selfplay.AlphaZeroLearner keep these)."""

    credit: float = 0.0
    global_step: int = 0
    updates: int = 0
    window: int = 0

    def learnable(self) -> bool:
        return self.window >= 1

    def take(self, batches: int) -> None:
        self.credit += batches * WORTH
        self.global_step += batches
        self.window += batches

    def update(self) -> None:
        self.credit -= 1.0
        self.updates += 1


@dataclass
class Run:
    blocked: int
    """Ticks (after the first tenth) the producer found the queue full: the actors waited."""
    idle: int
    """Ticks (after the first tenth) the learner could have updated and did not: it waited."""
    realised: float
    lowest: float
    highest: float
    """The realised ratio's range over the ticks after the first tenth."""


def simulate(slack: float, learner_speed: float, ticks: int = 4000) -> Run:
    """Each tick one batch is played (pushed if the queue has room) and the learner may do
    `learner_speed` x WORTH updates: 1.0 is a learner exactly as fast as the set ratio needs."""
    pace, half = Pace(slack, per_poll=8), Half()
    queue = blocked = idle = 0
    budget, seen = 0.0, []
    for tick in range(ticks):
        counted = tick >= ticks // 10
        if queue < BOUND:
            queue += 1
        elif counted:
            blocked += 1
        budget += learner_speed * WORTH
        wanted = pace.updates_wanted(half, lambda depth=queue: 2 * depth >= BOUND)
        taken = min(queue, math.ceil(wanted / WORTH)) if wanted > 0 else 0
        queue -= taken
        half.take(taken)
        while budget >= 1 and pace.may_update(half, total_steps=10**9):
            half.update()
            budget -= 1
        if budget >= 1:  # it could have updated: that time is lost
            idle += counted
            budget = 0.0
        if counted:
            seen.append(pace.realised(half))
    return Run(blocked, idle, Pace.realised(half) or 0.0, min(seen), max(seen))


@pytest.mark.parametrize("speed", [0.8, 1.2])
def test_held_to_the_ratio_the_faster_side_waits(speed: float) -> None:
    run = simulate(0.0, speed)
    assert run.realised == pytest.approx(1.0, abs=0.01)
    if speed > 1:
        assert run.idle > 1000 and run.blocked == 0  # the learner waits for data
    else:
        assert run.blocked > 500 and run.idle == 0  # the actors wait on a full queue


@pytest.mark.parametrize("speed", [0.8, 1.2])
def test_with_slack_neither_side_waits_while_the_rates_differ_by_less(speed: float) -> None:
    run = simulate(0.25, speed)
    assert run.blocked == 0 and run.idle == 0
    assert run.realised == pytest.approx(speed, abs=0.03)  # the ratio floats to what the hardware gives
    assert 0.75 <= run.lowest and run.highest <= 1.25


@pytest.mark.parametrize("speed", [0.5, 1.6])
def test_beyond_the_slack_the_ratio_stays_in_its_band_and_the_faster_side_waits(speed: float) -> None:
    run = simulate(0.25, speed)
    assert 0.75 - 0.01 <= run.lowest and run.highest <= 1.25 + 0.01
    if speed > 1:
        assert run.idle > 0 and run.blocked == 0
    else:
        assert run.blocked > 0 and run.idle == 0


def test_no_round_trip_for_the_queue_depth_unless_it_decides() -> None:
    """The depth costs a Redis round trip: asked only when the learner has enough owed to skip taking data."""

    def depth() -> bool:
        raise AssertionError("asked for the queue depth")

    half = Half(credit=3.0, updates=100)
    assert Pace(0.25, per_poll=8).updates_wanted(half, depth) == 5.0  # short of its store: takes data anyway
    half.credit = 20.0
    assert Pace(0.0, per_poll=8).updates_wanted(half, depth) == 0.0  # held to the ratio: leaves the batches queued
    assert Pace(0.25, per_poll=8).updates_wanted(half, lambda: False) == 0.0
    assert Pace(0.25, per_poll=8).updates_wanted(half, lambda: True) == pytest.approx(8 + 0.25 * 120 - 20)


def test_at_the_end_owed_updates_within_the_band_are_forgiven_and_beyond_it_paid() -> None:
    half = Half(credit=10.0, global_step=500, updates=90, window=500)
    assert not Pace(0.0, per_poll=8).finished(half, total_steps=500)  # held to the ratio: pays all 10
    assert Pace(0.25, per_poll=8).finished(half, total_steps=500)  # 10 owed <= the band of 25
    half.credit = 40.0
    assert not Pace(0.25, per_poll=8).finished(half, total_steps=500)  # 40 owed > the band of 32.5
    assert not Pace(0.25, per_poll=8).finished(Half(credit=0.0, global_step=499, updates=90, window=499), total_steps=500)


def test_no_update_ahead_on_an_empty_window_or_after_the_budget() -> None:
    pace = Pace(0.5, per_poll=8)
    assert not pace.may_update(Half(credit=-1.0, updates=100, window=0), total_steps=1000)  # nothing to sample
    assert pace.may_update(Half(credit=-1.0, updates=100, window=10, global_step=10), total_steps=1000)
    assert not pace.may_update(Half(credit=-1.0, updates=100, window=10, global_step=1000), total_steps=1000)
