"""The update that yields the cores to the rollout on a CPU (hpcrl/rl/rollout.py): it runs at
Linux's background priority, takes a core only where nothing else wants it, changes no number the
run learns, and is used only where measuring says it is the faster way."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Generator
from typing import Any

import pytest
import torch
from test_algorithms import PPO_CARTPOLE, make_agent

from hpcrl.config.experiment import EnvConfig
from hpcrl.rl.rollout import UPDATE_THREAD_NAME, FasterOfTwo, YieldingUpdate

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")


def _where() -> tuple[int, str, int]:
    return os.sched_getscheduler(0), threading.current_thread().name, torch.get_num_threads()


def _steps(steps: int, work: Callable[[], Any] = lambda: None, log: list[tuple[str, bool]] | None = None, until: threading.Event | None = None) -> Generator[None, None, tuple[int, str, int]]:
    """An update's stand-in: `steps` gradient steps of `work` each, logging which thread ran each and
    whether `until` was set when it began; returns where it ended."""
    for _ in range(steps):
        if log is not None:
            log.append((threading.current_thread().name, until is not None and until.is_set()))
        work()
        yield
    return _where()


def _failing() -> Generator[None, None, None]:
    yield
    raise FloatingPointError("non-finite loss")


def test_updates_run_in_one_background_priority_thread_and_their_errors_reach_the_caller() -> None:
    torch.set_num_threads(1)
    runner = YieldingUpdate.start()
    assert runner is not None
    never = threading.Event()
    try:
        # The caller's torch threads too: two intra-op threads beside the env workers cost 2-8x.
        assert runner(_steps(3), never) == (os.SCHED_IDLE, UPDATE_THREAD_NAME, 1)
        assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller keeps its own priority
        with pytest.raises(FloatingPointError, match="non-finite"):
            runner(_failing(), never)
        assert runner(_steps(0), never) == (os.SCHED_IDLE, UPDATE_THREAD_NAME, 1)  # still serving after an error
    finally:
        runner.close()
    assert not [t for t in threading.enumerate() if t.name == UPDATE_THREAD_NAME]


def test_an_update_whose_rollout_is_done_runs_in_the_caller_and_its_errors_too() -> None:
    runner = YieldingUpdate.start()
    assert runner is not None
    done = threading.Event()
    done.set()
    log: list[tuple[str, bool]] = []
    try:
        where = runner(_steps(3, log=log, until=done), done)
        assert where == (os.SCHED_OTHER, "MainThread", torch.get_num_threads())
        assert log == [("MainThread", True)] * 3
        with pytest.raises(FloatingPointError, match="non-finite"):
            runner(_failing(), done)
    finally:
        runner.close()


def _spin(seconds: float, stop: Any) -> tuple[int, float]:
    """Loops counted on this thread's core, and the seconds they took: for `seconds` of wall time or until
    `stop` (a shared flag) is set, whichever comes first. Every loop reads the flag, so that counts from
    different loops are comparable."""
    count, began = 0, time.perf_counter()
    end = began + seconds
    while time.perf_counter() < end and not stop.value:
        count += 1
    return count, time.perf_counter() - began


def _pinned_spin(core: int, seconds: float, stop: Any) -> Generator[None, None, tuple[int, float]]:
    """One step that counts loops for `seconds` on `core`."""
    os.sched_setaffinity(0, {core})
    counted = _spin(seconds, stop)
    yield
    return counted


def _count(core: int, loops: int) -> None:
    os.sched_setaffinity(0, {core})  # 0: the thread that runs this step
    for _ in range(loops):
        pass


def _hog(core: int, seconds: float, spinning: multiprocessing.synchronize.Event, stop: Any, count: Any, took: Any) -> None:
    """A process of normal priority that never sleeps, on `core`, for `seconds` or until `stop`."""
    os.sched_setaffinity(0, {core})
    spinning.set()
    count.value, took.value = _spin(seconds, stop)


def test_the_background_thread_gets_a_busy_core_only_where_its_owner_leaves_it() -> None:
    """Pinned to one core beside a process of normal priority that never sleeps (an env worker's game
    stepping), the update thread makes almost no progress while that process runs: both count loops on the
    same core at the same time (other load on the core slows the process, and leaves the thread nothing)."""
    core = min(os.sched_getaffinity(0))
    ctx = multiprocessing.get_context("fork")
    spinning, stop, never = ctx.Event(), ctx.Value("b", 0, lock=False), ctx.Value("b", 0, lock=False)
    count, took = ctx.Value("q", 0, lock=False), ctx.Value("d", 0.0, lock=False)
    hog = ctx.Process(target=_hog, args=(core, 60.0, spinning, stop, count, took), daemon=True)
    runner = YieldingUpdate.start()
    assert runner is not None
    try:
        hog.start()
        assert spinning.wait(10)
        beside, spun = runner(_pinned_spin(core, 0.3, never), threading.Event())
        stop.value = 1  # the process runs for the whole of the thread's step, however late that step began
        hog.join(10)
    finally:
        hog.kill()
        hog.join()
        runner.close()
    assert count.value > 0 and took.value >= spun, (count.value, took.value, spun)
    # At equal priority the thread would count at about the process's rate (each half the core while both run).
    assert beside / spun < 0.2 * count.value / took.value, (beside, spun, count.value, took.value)


def test_an_update_beside_other_load_finishes_at_normal_priority_once_its_rollout_is_done() -> None:
    """Other work of normal priority on the cores (another job on a shared node, a user's process, the
    test suite's other worker) leaves a background thread almost nothing: an update of 0.5 s would take
    minutes, as a ViZDoom PPO run in CI did until its 600 s timeout. The update advances in the
    background only while its rollout runs; the steps after the rollout is done run in the caller's
    thread at normal priority, on a core it shares fairly."""
    core, mine = min(os.sched_getaffinity(0)), os.sched_getaffinity(0)
    loops = 100_000
    began = time.perf_counter()
    _count(core, loops)
    step = time.perf_counter() - began  # a step alone (pinned, before the busy process starts)
    os.sched_setaffinity(0, mine)
    steps = max(10, int(0.5 / step))
    ctx = multiprocessing.get_context("fork")
    spinning, stop = ctx.Event(), ctx.Value("b", 0, lock=False)
    hog = ctx.Process(target=_hog, args=(core, 120.0, spinning, stop, ctx.Value("q", 0, lock=False), ctx.Value("d", 0.0, lock=False)), daemon=True)
    runner = YieldingUpdate.start()
    assert runner is not None
    done, log = threading.Event(), []
    rollout = threading.Timer(0.1, done.set)  # the rollout beside the update, done after 0.1 s
    try:
        hog.start()
        assert spinning.wait(10)
        began = time.perf_counter()
        rollout.start()
        runner(_steps(steps, lambda: _count(core, loops), log, done), done)
        took = time.perf_counter() - began
    finally:
        os.sched_setaffinity(0, mine)
        rollout.cancel()
        hog.kill()
        hog.join()
        runner.close()
    assert len(log) == steps
    assert len([name for name, late in log if late and name == UPDATE_THREAD_NAME]) <= 1  # the step under way when the rollout ended
    assert ("MainThread", True) in log
    # Half the core for about steps x step of work: ~1 s (2.1 s measured, with the hand-over); all in the
    # background ~300x the work (a thread that ignored `until`: the test timed out).
    print(f"{steps} steps of {step * 1e3:.1f} ms alone: {took:.2f} s beside a busy process")
    assert took < 0.1 + 20 * steps * step, (took, steps, step)


def _paced(pace: FasterOfTwo, times: dict[bool, float], tails: dict[bool, float], turns: int) -> list[bool]:
    """`turns` choices of `pace`, each way taking `times[way]`, its update running on for `tails[way]` of that
    after the rollout: the ways chosen."""
    chosen = []
    for _ in range(turns):
        way = pace.choose()
        chosen.append(way)
        pace.record(times[way], tails[way] * times[way])
    return chosen


SHORT, LONG = {False: 0.0, True: 0.2}, {False: 0.0, True: 0.3}
"""Tails of the background way under and over FasterOfTwo.TAIL_SHARE of a turn (the other way has none)."""


def test_faster_of_two_keeps_the_background_way_without_timing_the_other_while_its_update_s_tails_are_short() -> None:
    """An update at background priority that ends before its rollout, or soon after, cost the iteration (next to)
    nothing: timing the other way would only spend turns on it (20 s of PPO on ViZDoom: 2,118 / 2,176 env steps/s
    timing both ways twice, against 2,278 / 2,297)."""
    pace = FasterOfTwo(every=12, block=2)
    assert FasterOfTwo.TAIL_SHARE == 0.25
    assert _paced(pace, {False: 1.0, True: 2.0}, SHORT, 40) == [True] * 40
    assert pace.timings == 0
    # One long tail now and then is not a pattern: a timing needs `block` of them.
    assert _paced(pace, {False: 1.0, True: 2.0}, LONG, 1) + _paced(pace, {False: 1.0, True: 2.0}, SHORT, 30) == [True] * 31
    assert pace.timings == 0


def test_faster_of_two_times_both_in_blocks_once_the_update_s_tails_are_long_and_keeps_the_shorter_median() -> None:
    pace = FasterOfTwo(every=12, block=2)
    timing = [False, False, True, True] * 2  # two blocks of each way, in turns
    # Long tails at background priority, and normal priority is faster: timed at once, kept.
    chosen = _paced(pace, {False: 1.0, True: 2.0}, LONG, 2 + 8 + 2)
    assert chosen == [True, True] + timing + [False] * 2 and (pace.timings, pace.best) == (1, False)
    # The kept way is the other one: timed again once `every` choices have passed since the last timing began.
    chosen = _paced(pace, {False: 2.0, True: 1.0}, LONG, 2 + 8 + 1)
    assert chosen == [False] * 2 + timing + [True] and (pace.timings, pace.best) == (2, True)
    # The background way kept and its tails long: timed again after `every`, though `block` long tails came sooner.
    chosen = _paced(pace, {False: 2.0, True: 1.0}, LONG, 3 + 8)
    assert chosen == [True] * 3 + timing and (pace.timings, pace.best) == (3, True)
    # Kept and its tails short now: not timed after `every`.
    assert _paced(pace, {False: 2.0, True: 1.0}, SHORT, 30) == [True] * 30 and pace.timings == 3
    # restart (the background way changed): the background way, timed only once its tails are long.
    pace.restart()
    assert _paced(pace, {False: 1.0, True: 2.0}, SHORT, 20) == [True] * 20 and pace.timings == 0
    for every, block in ((7, 2), (100, 1), (100, 0)):
        with pytest.raises(ValueError, match="block"):
            FasterOfTwo(every, block)


def test_faster_of_two_leaves_a_starved_background_way_at_once_and_times_it_less_and_less_often() -> None:
    """Beside other work of normal priority on every core the background way's turn is its rollout and a wait for a
    starved step: async PPO on CartPole beside four busy loops on 2 cores, 6-7 s a turn against 0.1 s, and 16 of
    120 iterations in 60 s were such turns (4 long tails before the first timing, 4 in each timing, a timing every
    100). One starved turn begins a timing, its first starved turn ends it, and the next timing comes twice as late."""
    pace = FasterOfTwo(every=12, block=2)
    starved, tails = {False: 0.1, True: 20.0}, {False: 0.0, True: 0.995}  # the rollout 0.1 s of the 20
    assert _paced(pace, starved, tails, 4) == [True, False, False, True] and (pace.timings, pace.best) == (1, False)
    assert _paced(pace, starved, tails, 24) == [False] * 23 + [True] and pace.timings == 2  # 2 x every after it began
    assert _paced(pace, starved, tails, 48) == [False] * 47 + [True] and pace.timings == 3
    # The load gone, the next timing runs to its end and keeps the faster way, timed again after `every` as before.
    timing = [False, False, True, True] * 2
    chosen = _paced(pace, {False: 1.0, True: 0.5}, LONG, 96 + 5)
    assert chosen[-8:] == timing and (pace.timings, pace.best) == (4, True)
    assert _paced(pace, {False: 1.0, True: 0.5}, LONG, 12) == [True] * 4 + timing and pace.timings == 5


def test_faster_of_two_does_not_count_the_turn_after_the_other_ways() -> None:
    """A way whose first turn after the other way's is slow (that turn pays for the switch) but which is
    faster for as long as it is kept is the one kept."""
    pace = FasterOfTwo(every=12, block=3)
    last = None
    for _ in range(3 + 12):
        way = pace.choose()
        seconds = (1.0 if way else 2.0) + (5.0 if way and last is False else 0.0)
        pace.record(seconds, 0.5 * seconds if way else 0.0)
        last = way
    assert pace.best is True and pace.timings == 1
    assert pace.times == {False: [2.0] * 4, True: [1.0] * 4}


def _trained(yields: bool | None) -> tuple[list[dict[str, float]], dict[str, torch.Tensor], set[str], list[bool]]:
    """Six iterations of async PPO on CartPole, the update always (True), never (False) or as measured (None, by a
    chooser timing both ways from the first choice: in CI, one of the first four tails was short, no timing began in
    six iterations, and no update ran at normal priority).
    Each rollout after the first starts once the update beside it has begun its first gradient step, so that the
    update's thread makes that step: under a load of 9 (a fresh suite), a rollout ended before the update began, and
    every step ran in the main thread. That thread keeps normal priority here (a thread's priority changes when it
    runs, not what it computes): at background priority, 8 busy processes starved it, and the gated rollout with it.
    (metrics, weights, the threads that made gradient steps, the ways the measured chooser chose.)"""
    agent = make_agent("ppo", EnvConfig(id="CartPole-v1", num_envs=2, vectorization="async"), total_steps=10_000, async_rollout=True, **PPO_CARTPOLE)
    assert PPO_CARTPOLE["update_epochs"] * PPO_CARTPOLE["num_minibatches"] == 20
    threads: set[str] = set()
    began = threading.Event()
    collect, step, rollouts, steps = agent._collect, agent.step_with_entropy, itertools.count(), itertools.count()

    def gated(buf: Any, *args: Any) -> None:
        if next(rollouts) > 0:  # the first rollout has no update beside it
            assert began.wait(60)
            began.clear()
        collect(buf, *args)

    def stepped(loss: torch.Tensor, params: Any) -> torch.Tensor:
        threads.add(threading.current_thread().name)  # each gradient step's thread
        if next(steps) % 20 == 0:  # an update's first
            began.set()
        return step(loss, params)

    agent._collect, agent.step_with_entropy = gated, stepped
    ways: list[bool] = []
    if yields is not None:
        agent._pace.choose = lambda: yields
    else:  # long tails already seen, so the first choices time both ways (whether this run's tails are long depends on the load)
        _paced(agent._pace, {False: 1.0, True: 1.0}, LONG, agent._pace.block)
        choose = agent._pace.choose

        def chosen() -> bool:
            ways.append(choose())
            return ways[-1]

        agent._pace.choose = chosen
    try:
        metrics = [agent.train_iteration() for _ in range(6)]
        return metrics, {k: v.clone() for k, v in agent.policy.state_dict().items()}, threads, ways
    finally:
        agent.close()
        agent.envs.close()


def _gated_agent() -> tuple[Any, threading.Event]:
    """Async PPO on CartPole, its update at background priority, each rollout after the first started only once
    the returned event is set (by the update beside it, which the caller's gradient steps set it from): without
    the gate a short rollout may end before the update begins, which then runs whole in the main thread."""
    agent = make_agent("ppo", EnvConfig(id="CartPole-v1", num_envs=2, vectorization="async"), total_steps=10_000, async_rollout=True, **PPO_CARTPOLE)
    agent._pace.choose = lambda: True
    began = threading.Event()
    collect, rollouts = agent._collect, itertools.count()

    def gated(buf: Any, *args: Any) -> None:
        if next(rollouts) > 0:  # the first rollout has no update beside it
            assert began.wait(60)
            began.clear()
        collect(buf, *args)

    agent._collect = gated
    return agent, began


def _iterate(agent: Any, step: Callable[[torch.Tensor, Any], None], iterations: int) -> None:
    """`iterations` of the agent with `step` as its gradient step, then the agent closed."""
    agent.step_with_entropy = step
    try:
        for _ in range(iterations):
            agent.train_iteration()
    finally:
        agent.close()
        agent.envs.close()


def test_an_agent_s_update_goes_to_the_main_thread_once_the_rollout_beside_it_is_done() -> None:
    """Each rollout after the first starts once the update beside it has begun, and each gradient step waits
    until that rollout is done: the update at background priority makes its first step in its thread, then
    hands the other 19 of its 20 to the main thread, every iteration (had it kept them, a busy node would
    starve it). Without the gate a short rollout may end before the update begins, which then runs whole in
    the main thread."""
    agent, began = _gated_agent()
    threads: list[str] = []
    step = agent.step_with_entropy

    def after_the_rollout(loss: torch.Tensor, params: Any) -> None:
        if len(threads) % 20 == 0:
            began.set()
        assert agent._thread.finished.wait(60)
        threads.append(threading.current_thread().name)
        step(loss, params)

    _iterate(agent, after_the_rollout, 4)
    assert PPO_CARTPOLE["update_epochs"] == 20 and PPO_CARTPOLE["num_minibatches"] == 1
    assert threads == ([UPDATE_THREAD_NAME] + ["MainThread"] * 19) * 4


def test_a_background_step_that_ends_late_counts_in_the_tail_the_chooser_weighs() -> None:
    """Beside other work of normal priority a gradient step at background priority can take minutes (115 s
    for a CNN's, beside four busy loops on 2 cores), and the caller waits for the one under way when the
    rollout ends. That wait is the update running on after the rollout, so it is in the tail `FasterOfTwo`
    weighs, and long ones make it time the way at normal priority. Here the background thread's step ends
    0.5 s after the rollout; the main thread's 19 steps take milliseconds (before, the tail was theirs alone,
    and the chooser kept the background way whatever the wait)."""
    agent, began = _gated_agent()
    recorded: list[tuple[float, float]] = []
    agent._pace.record = lambda seconds, tail: recorded.append((seconds, tail))
    step = agent.step_with_entropy

    def late_in_the_background(loss: torch.Tensor, params: Any) -> None:
        if threading.current_thread().name == UPDATE_THREAD_NAME:
            began.set()
            assert agent._thread.finished.wait(60)
            time.sleep(0.5)  # a starved step, ending well after the rollout
        step(loss, params)

    _iterate(agent, late_in_the_background, 4)
    assert len(recorded) == 3  # an update is recorded once the next rollout is waited for: the fourth, in a fifth iteration
    assert all(tail >= 0.5 and tail <= seconds for seconds, tail in recorded), recorded
    assert all(tail > FasterOfTwo.TAIL_SHARE * seconds for seconds, tail in recorded), recorded  # each counts as a long tail


def test_an_update_at_background_priority_learns_the_same_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which thread runs the update changes no draw and no weight: the run is the same either way."""
    monkeypatch.setattr(os, "sched_setscheduler", lambda *args: None)  # see _trained
    normal, normal_weights, normal_threads, _ = _trained(False)
    yielding, yielding_weights, yielding_threads, _ = _trained(True)
    measured, measured_weights, measured_threads, ways = _trained(None)
    assert UPDATE_THREAD_NAME in yielding_threads and normal_threads == {"MainThread"}  # the main thread takes over where the rollout ends first
    assert measured_threads == {UPDATE_THREAD_NAME, "MainThread"} and set(ways) == {False, True}  # both ways timed
    assert normal == yielding == measured
    for k, v in normal_weights.items():
        assert torch.equal(v, yielding_weights[k]) and torch.equal(v, measured_weights[k]), k
