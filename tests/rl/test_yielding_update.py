"""The update that yields the cores to the rollout on a CPU (hpcrl/rl/rollout.py): it runs at
Linux's background priority, takes a core only where nothing else wants it, changes no number the
run learns, and is used only where measuring says it is the faster way."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

import pytest
import torch
from test_algorithms import PPO_CARTPOLE, make_agent

from hpcrl.config.experiment import EnvConfig
from hpcrl.rl.rollout import UPDATE_THREAD_NAME, FasterOfTwo, YieldingUpdate

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")


def _where() -> tuple[int, str, int]:
    return os.sched_getscheduler(0), threading.current_thread().name, torch.get_num_threads()


def test_calls_run_in_one_background_priority_thread_and_their_errors_reach_the_caller() -> None:
    torch.set_num_threads(1)
    runner = YieldingUpdate.start()
    assert runner is not None
    try:
        # The caller's torch threads too: two intra-op threads beside the env workers cost 2-8x.
        assert runner(_where) == (os.SCHED_IDLE, UPDATE_THREAD_NAME, 1)
        assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller keeps its own priority
        with pytest.raises(FloatingPointError, match="non-finite"):
            runner(lambda: (_ for _ in ()).throw(FloatingPointError("non-finite loss")))
        assert runner(lambda a, b: a + b, 2, 3) == 5  # still serving after an error
    finally:
        runner.close()
    assert not [t for t in threading.enumerate() if t.name == UPDATE_THREAD_NAME]


def _spin(seconds: float) -> int:
    """Loops counted in `seconds` of wall time on this thread's core."""
    count, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        count += 1
    return count


def _pinned_spin(core: int, seconds: float) -> int:
    os.sched_setaffinity(0, {core})
    return _spin(seconds)


def _hog(core: int, seconds: float, spinning: multiprocessing.synchronize.Event, count: multiprocessing.sharedctypes.Synchronized) -> None:
    os.sched_setaffinity(0, {core})
    spinning.set()
    count.value = _spin(seconds)


def test_the_background_thread_gets_a_busy_core_only_where_its_owner_leaves_it() -> None:
    """Pinned to one core beside a process of normal priority that never sleeps (an env worker's game
    stepping), the update thread makes almost no progress while that process runs: both count loops on the
    same core at the same time (other load on the core slows the process, and leaves the thread nothing)."""
    core = min(os.sched_getaffinity(0))
    ctx = multiprocessing.get_context("fork")
    spinning, count = ctx.Event(), ctx.Value("q", 0)
    hog = ctx.Process(target=_hog, args=(core, 0.6, spinning, count), daemon=True)
    runner = YieldingUpdate.start()
    assert runner is not None
    try:
        hog.start()
        assert spinning.wait(10)
        beside = runner(_pinned_spin, core, 0.3)
        hog.join(10)
    finally:
        hog.kill()
        hog.join()
        runner.close()
    assert count.value > 0
    # At equal priority the thread would count about 0.67x the process's rate (half the core for its 0.3 s).
    assert beside / 0.3 < 0.2 * count.value / 0.6, (beside, count.value)


def test_faster_of_two_measures_both_then_keeps_the_shorter_median_each_period() -> None:
    pace = FasterOfTwo(every=10, trials=2)
    times = {False: 2.0, True: 1.0}
    chosen = []
    for iteration in range(30):
        if iteration == 20:
            times = {False: 1.0, True: 2.0}  # the run's pace moved: the next period measures again
        way = pace.choose()
        chosen.append(way)
        pace.record(times[way])
    assert chosen[:4] == [False, True, False, True]  # turns while measuring
    assert chosen[4:10] == [True] * 6  # the faster
    assert chosen[10:14] == [False, True, False, True] and chosen[14:20] == [True] * 6
    assert chosen[20:24] == [False, True, False, True] and chosen[24:30] == [False] * 6
    for every, trials in ((4, 3), (10, 0), (10, -1)):
        with pytest.raises(ValueError, match="trials"):
            FasterOfTwo(every, trials)


def _trained(yields: bool | None) -> tuple[list[dict[str, float]], dict[str, torch.Tensor], set[str]]:
    """Six iterations of async PPO on CartPole, the update always (True), never (False) or as measured (None)."""
    agent = make_agent("ppo", EnvConfig(id="CartPole-v1", num_envs=2, vectorization="async"), total_steps=10_000, async_rollout=True, **PPO_CARTPOLE)
    threads: set[str] = set()
    update = agent.update
    agent.update = lambda batch: (threads.add(threading.current_thread().name), update(batch))[1]
    if yields is not None:
        agent._pace.choose = lambda: yields
    try:
        metrics = [agent.train_iteration() for _ in range(6)]
        return metrics, {k: v.clone() for k, v in agent.policy.state_dict().items()}, threads
    finally:
        agent.close()
        agent.envs.close()


def test_an_update_at_background_priority_learns_the_same_numbers() -> None:
    """Which thread runs the update changes no draw and no weight: the run is the same either way."""
    normal, normal_weights, normal_threads = _trained(False)
    yielding, yielding_weights, yielding_threads = _trained(True)
    measured, measured_weights, measured_threads = _trained(None)
    assert yielding_threads == {UPDATE_THREAD_NAME} and normal_threads == {"MainThread"}
    assert measured_threads == {UPDATE_THREAD_NAME, "MainThread"}  # both ways timed in the first iterations
    assert normal == yielding == measured
    for k, v in normal_weights.items():
        assert torch.equal(v, yielding_weights[k]) and torch.equal(v, measured_weights[k]), k
