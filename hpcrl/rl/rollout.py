"""Rollout storage, observation upload and the background rollout that overlaps learning.

`Rollout` is one rollout's worth of storage (what an update reads), with where the envs stood
after its last step (GAE's bootstrap). A synchronous agent has one; an asynchronous one has two,
a double buffer: `RolloutThread` fills one with a copy of the policy (the behaviour policy) while
the main thread updates from the other, as Sample Factory's APPO and habitat-lab's VER overlap
sampling and learning. The rollout thread runs the policy's forward passes (torch releases the
GIL in its ops) and waits on the env workers' pipes (which releases it too), so on a GPU node the
envs never stop for an update. The policy lag is one iteration: PPO's ratio is taken against the
log-probabilities the behaviour policy stored, which is exactly the correction the clipped
objective already makes for the epochs after the first.

On a CPU the update and the rollout share the cores, and the rollout sets the pace: its forward
pass, the workers' env steps and the next forward pass follow one another, while the update has
slack (ViZDoom basic on 2 cores: 103 ms of CPU an update against ~250 ms a rollout). At equal
priority the scheduler gives the update the cores the env workers are waiting for; `YieldingUpdate`
runs the update in a thread of Linux's background class (SCHED_IDLE) instead, which takes a core
only when the rollout's processes leave it idle, and only until the rollout is done: the update's
remaining gradient steps then run at normal priority, so other load on the node cannot starve it.
That is faster where the update fits in the cores the rollout leaves idle (8 ViZDoom envs on 2
cores: 1,965-2,049 env steps/s against 1,843-1,869), and was slower, before the learner process,
where it does not (twice the epochs: 1,521-1,549 against 1,602-1,638, the update's tail then ran
alone on one core): `FasterOfTwo` keeps the background way, and times both ways where the update
runs on long after the rollout.
Where the update is a CNN's on one rank, `hpcrl.rl.learner_process` makes those background steps in a
process of its own once it has started, so that they no longer share the rollout thread's GIL.

On CUDA the rollout thread works on its own stream: its per-step `.cpu()` of the actions waits for
its own forward pass only, not for the update's kernels queued on the main stream. Events order
the two streams where they share data (the behaviour weights, a filled buffer).
"""

from __future__ import annotations

import contextlib
import os
import queue
import statistics
import threading
import time
from collections.abc import Callable, Generator
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np
import torch

from hpcrl.rl.networks import Obs, obs_to_tensor


def storage(space: gym.Space, steps: int, num_envs: int, device: torch.device) -> Obs:
    """Rollout storage in the observation's own dtype (uint8 pixels stay 1 byte each)."""
    if isinstance(space, gym.spaces.Dict):
        return {k: storage(s, steps, num_envs, device) for k, s in space.spaces.items()}
    dtype = torch.from_numpy(np.zeros(0, dtype=space.dtype)).dtype
    return torch.zeros((steps, num_envs, *space.shape), dtype=dtype, device=device)


class Rollout:
    """`steps` vector steps of `num_envs` envs: observations, actions, log-probabilities and values
    on the device (the update reads them there), rewards and episode starts in host memory (GAE
    runs in numpy), and the envs' position after the last step."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, steps: int, num_envs: int, device: torch.device) -> None:
        self.obs = storage(obs_space, steps, num_envs, device)
        action_dtype = torch.long if isinstance(action_space, gym.spaces.Discrete) else torch.float32
        self.actions = torch.zeros((steps, num_envs, *action_space.shape), dtype=action_dtype, device=device)
        self.logprobs = torch.zeros((steps, num_envs), device=device)
        self.values = torch.zeros((steps, num_envs), device=device)
        self.rewards = np.zeros((steps, num_envs), dtype=np.float32)
        self.firsts = np.zeros((steps, num_envs), dtype=np.float32)
        self.start_state: torch.Tensor | None = None
        """The GRU state before the first step (the update replays each env's sequence from it)."""
        self.next_value = np.zeros(num_envs, dtype=np.float32)
        """The acting policy's value of the observations after the last step (GAE's bootstrap)."""
        self.next_first = np.ones(num_envs, dtype=np.float32)
        self.episodes: list[tuple[float, int]] = []
        """(return, length) of the episodes that ended during this rollout."""


class Uploader:
    """Env arrays -> device tensors. On CUDA through a pinned staging buffer with a non-blocking
    copy: one host-to-device transfer per env and step, as uint8 for pixels, that does not stall
    the host. A staging row is rewritten only after the forward pass that read its upload has
    been waited for (the actions' `.cpu()`), so the copy has finished by then."""

    def __init__(self, space: gym.Space, num_envs: int, device: torch.device) -> None:
        self.device = device
        self.pinned: Any = None
        if device.type == "cuda":
            self.pinned = storage(space, 1, num_envs, torch.device("cpu"))
            self.pinned = {k: v[0].pin_memory() for k, v in self.pinned.items()} if isinstance(self.pinned, dict) else self.pinned[0].pin_memory()

    def __call__(self, obs: np.ndarray | dict[str, np.ndarray], rows: slice = slice(None)) -> Obs:
        """`obs` of the envs `rows` on the device."""
        if self.pinned is None:
            return obs_to_tensor(obs, self.device)
        if isinstance(obs, dict):
            return {k: self._upload(self.pinned[k][rows], v) for k, v in obs.items()}
        return self._upload(self.pinned[rows], obs)

    def _upload(self, staging: torch.Tensor, array: np.ndarray) -> torch.Tensor:
        staging.copy_(torch.from_numpy(np.ascontiguousarray(array)))
        return staging.to(self.device, non_blocking=True)


T = TypeVar("T")

THREAD_NAME = "hpcrl-rollout"
"""The background rollout's thread name (profilers and benchmarks/vizdoom_speed.py tell its CPU time apart by it)."""
UPDATE_THREAD_NAME = "hpcrl-update"
"""The thread of the update at background priority (`YieldingUpdate`)."""


class RolloutThread:
    """Collects rollouts in a background thread, one per `start`, each returned by `wait`.

    `collect(rollout)` is the agent's rollout with its behaviour policy. An exception in the rollout (an env
    worker that failed) is raised again in the caller of `wait`.
    """

    def __init__(self, collect: Callable[[Rollout], None], device: torch.device, finished: threading.Event | None = None) -> None:
        self._collect = collect
        self.device = device
        self._requests: queue.Queue[tuple[Rollout, Any] | None] = queue.Queue()
        self._results: queue.Queue[tuple[Rollout, Any] | BaseException] = queue.Queue()
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.in_flight: Rollout | None = None
        self.finished = finished or threading.Event()
        """Set when the rollout `start` began is full (or failed): an update beside it stops yielding the
        cores. A learner process's event where there is one (`hpcrl.rl.learner_process.SharedEvent`)."""
        self._finished_at: float | None = None
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def start(self, rollout: Rollout) -> None:
        """Begin filling `rollout`. The behaviour policy's weights must be in place: on CUDA, what
        the main stream queued before this call is done before the rollout's first forward pass."""
        ready = None
        if self.stream is not None:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device))
        self.in_flight = rollout
        self._finished_at = None
        self.finished.clear()
        self._requests.put((rollout, ready))

    def mark_finished(self) -> None:
        """The rollout in flight is done (or failed): the time is noted, and an update beside it told to stop
        yielding the cores."""
        self._finished_at = time.perf_counter()
        self.finished.set()

    def since_finished(self) -> float:
        """Seconds since the rollout `start` began was done; 0 while it is in flight. What an update beside it
        took after it (its tail) is this once the update ends: the caller's steps, and its wait for a step under
        way in the background when the rollout ended, which beside other work of normal priority can be most of
        the turn (`FasterOfTwo` must see it)."""
        done = self._finished_at
        return 0.0 if done is None else max(0.0, time.perf_counter() - done)

    def wait(self) -> Rollout:
        """The rollout `start` began, once it is full (the main stream then reads it safely)."""
        result = self._results.get()
        self.in_flight = None
        if isinstance(result, BaseException):
            raise result
        rollout, done = result
        if done is not None:
            torch.cuda.current_stream(self.device).wait_event(done)
        return rollout

    def close(self) -> None:
        """Let a rollout in flight finish (its env steps are bounded), then end the thread. The
        rollout is discarded: the envs may be closed after this returns."""
        if self._thread.is_alive():
            self._requests.put(None)
            self._thread.join()
        self.in_flight = None

    def _run(self) -> None:
        while (request := self._requests.get()) is not None:
            rollout, ready = request
            result: tuple[Rollout, Any] | BaseException
            try:
                with torch.no_grad(), (torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()):
                    if ready is not None:
                        self.stream.wait_event(ready)
                    self._collect(rollout)
                    done = None
                    if self.stream is not None:
                        done = torch.cuda.Event()
                        done.record(self.stream)
                result = (rollout, done)
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which raises it
                result = exc
            self.mark_finished()  # before the result: the caller clears it only for a rollout it starts after reading this one
            self._results.put(result)
            if isinstance(result, BaseException):
                return


class YieldingUpdate:
    """Advances updates (generators of gradient steps) in a thread of background CPU priority.

    Linux's SCHED_IDLE lets a thread run on a core nothing else wants, and any other thread that
    wakes takes the core back at once: the env workers and the rollout thread never wait for the
    update. But beside any other work of normal priority on every core (another job on a shared
    node, a user's own processes) the thread gets almost nothing (the kernel weighs it 3 to their
    1,024): an async PPO iteration on CartPole beside one busy process a core took 15 s, at
    normal priority 0.18 s. So the
    thread advances an update only while the rollout beside it is in flight (`until` unset) and
    hands the rest back to the caller, which finishes it at normal priority (an unprivileged
    thread cannot leave SCHED_IDLE): once the rollout is done the update is the run's critical
    path. At most one gradient step runs in the background after the rollout ends; the caller's wait
    for it counts in the update's tail (`RolloutThread.since_finished`), so where other work starves
    that step, `FasterOfTwo` times the normal way and takes it. Starved while it holds the GIL, the
    thread holds up the trainer's other threads too: a SCHED_IDLE thread running Python made the
    main thread's 50 sleeps of 1 ms take 25.6 s beside four busy loops on 2 cores (0.31 s without
    them). So a thread cannot be given up on as the learner process can (`late_after`).
    `YieldingUpdate.start()` is None where the class cannot be set (not Linux, or a kernel or
    sandbox that refuses it).
    """

    def __init__(self) -> None:
        self._requests: queue.Queue[tuple[Generator[Any, None, Any], threading.Event] | None] = queue.Queue()
        self._results: queue.Queue[tuple[bool, Any] | BaseException] = queue.Queue()
        """(whether the generator finished, what it returned), or the exception it raised."""
        self._thread = threading.Thread(target=self._run, name=UPDATE_THREAD_NAME, daemon=True)

    @classmethod
    def start(cls) -> YieldingUpdate | None:
        """A started thread of background priority, or None where there can be none."""
        if not hasattr(os, "SCHED_IDLE"):
            return None
        runner = cls()
        runner._thread.start()
        if isinstance(runner._results.get(), BaseException):  # the thread says at once whether its priority was set
            runner._thread.join()
            return None
        return runner

    def __call__(self, steps: Generator[Any, None, T], until: threading.Event) -> T:
        """The value `steps` returns: advanced in the background thread while `until` is unset, then
        here; an exception it raises is raised here."""
        self._requests.put((steps, until))
        result = self._results.get()
        if isinstance(result, BaseException):
            raise result
        finished, value = result
        return value if finished else run_to_end(steps)

    def close(self) -> None:
        """End the thread (between calls: the agent calls one at a time and waits for it)."""
        if self._thread.is_alive():
            self._requests.put(None)
            self._thread.join()

    def _run(self) -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: this thread (Linux)
        except OSError as exc:
            self._results.put(exc)
            return
        self._results.put((False, None))
        while (request := self._requests.get()) is not None:
            steps, until = request
            try:
                while not until.is_set():
                    next(steps)
                self._results.put((False, None))  # the rest is the caller's
            except StopIteration as stop:
                self._results.put((True, stop.value))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, which raises it
                self._results.put(exc)


def run_to_end(steps: Generator[Any, None, T]) -> T:
    """What a generator returns, once it has run to its end in this thread."""
    try:
        while True:
            next(steps)
    except StopIteration as stop:
        return stop.value


class FasterOfTwo:
    """Chooses between the two ways of running an update beside a background rollout on a CPU: at
    background priority (True, `YieldingUpdate`) or at normal priority (False).

    The background way costs the rollout nothing: where the update ends beside the rollout, the
    iteration takes the rollout's time, the shortest it can take. Where the update runs on after the
    rollout is done (its tail, at normal priority), the other way can save at most that tail, and
    costs the rollout what the update takes from it from the start: about a fifth of it on ViZDoom
    (2 cores, 0.243-0.255 s an iteration at normal priority against 0.197-0.214 s in the
    background). So the background way is kept until, in `block` of its turns, the update's tail
    was over `TAIL_SHARE` of the turn; then both ways are timed and the faster kept, for at least
    `every` choices, after which they are timed again if the kept way is the other one or the
    tails came back. Timing costs the slower way's turns: in 20 s of async PPO on ViZDoom (2
    cores), whose tails are at most a fifth of a turn (0.02-0.06 s of 0.2-0.3 s in the first
    iterations, none once the learner process runs), timing both ways twice, as this class did at
    every start, made 2,118 / 2,176 env steps/s against 2,278 / 2,297 never timing. With twice the
    epochs (tails 0.07-0.17 s of 0.3-0.44 s) the two ways were timed and measured alike (0.38-0.40 s
    an iteration at normal priority against 0.35-0.38 s).

    A timing is two blocks of `block` turns of each way, in turns (False first), each way's median
    time deciding, the first turn of each block not counted. Why blocks: one way's turn changes the
    next turn's time. Timed in single turns, in alternation, async PPO on ViZDoom (2 cores) took 250
    ms an iteration with the update beside the rollout and 290 ms without; kept for a whole run,
    276-317 and 328-333 (1,614-1,829 env steps/s against 1,494-1,535). So the two looked close, and
    7 of 33 runs of the benchmark chose the slower way and kept it; in blocks, 11 of 11 chose the
    faster.

    Beside other work of normal priority on every core (another job on a shared node) the background
    way's turn is its rollout and then a wait for a starved step (async PPO on CartPole beside four
    busy loops on 2 cores: 6-7 s a turn against 0.1 s at normal priority; 120 iterations in 60 s, 16
    of them turns of the background way in timings). A turn whose tail is over `STARVED` times its
    rollout begins a timing at once, and a timing's background turn over `STARVED` times the slowest
    of its normal ones ends it there, keeping normal priority for twice as many choices as the last
    time this happened (up to `MAX_EVERY`) before timing again.
    """

    TAIL_SHARE = 0.25
    """The share of a turn above which the update's tail counts against the background way."""
    STARVED = 4.0
    """How many times the rest of its turn (or the other way's turns) a background turn's tail (or time)
    must be for the background way to count as starved: a legitimate long tail (twice the epochs on
    ViZDoom) was 0.6 times its rollout, and the first turn after the other way's cost 20% more."""
    MAX_EVERY = 6400
    """The most choices between two timings after starved ones."""

    def __init__(self, every: int = 100, block: int = 4) -> None:
        if not (block >= 2 and 4 * block <= every):
            raise ValueError(f"FasterOfTwo: block ({block}) must be at least 2, and 4 blocks ({4 * block}) at most every ({every})")
        self.every, self.block = every, block
        self.times: dict[bool, list[float]] = {False: [], True: []}
        self.restart()

    def restart(self) -> None:
        """Begin again as at the first choice (one of the ways has changed): the background way,
        timed against the other once its tails are long."""
        self.best = True
        self._every = self.every
        """Choices between two timings: `every`, doubled after each timing that found the background way starved."""
        self.timings = 0
        """How many timings of both ways this chooser began (the tests read it)."""
        self._timing: int | None = None
        """Turns of the timing in progress recorded so far; None when not timing."""
        self._since = 0
        """Choices since the last timing began."""
        self._long_tails = 0
        """Turns of the kept background way whose tail was over TAIL_SHARE, since the last timing began."""
        self._starved = False
        """Whether a turn of the kept background way was starved since the last timing began."""
        self._last: tuple[int | None, bool] | None = None

    def choose(self) -> bool:
        """The way for this time: the kept way, or the next turn of a timing."""
        if self._timing is None and self._time_again():
            self._timing, self._since, self._long_tails, self._starved = 0, 0, 0, False
            self.times = {False: [], True: []}
            self.timings += 1
        self._since += 1
        phase = self._timing
        self._last = (phase, self.best if phase is None else bool(phase // self.block % 2))
        return self._last[1]

    def _time_again(self) -> bool:
        long = self._long_tails >= self.block
        if self.timings == 0 or self._starved:
            return long or self._starved
        return self._since >= self._every and (long or not self.best)

    def record(self, seconds: float, tail: float) -> None:
        """How long the way chosen last took, and for how long of that its update ran on after the rollout beside it."""
        if self._last is None:
            return
        (phase, choice), self._last = self._last, None
        if phase is None:
            if choice and tail > self.TAIL_SHARE * seconds:
                self._long_tails += 1
            self._starved |= choice and tail > self.STARVED * (seconds - tail)
            return
        if phase % self.block:  # not the first turn after the other way's
            self.times[choice].append(seconds)
        self._timing = phase + 1
        if choice and self.times[False] and seconds > self.STARVED * max(self.times[False]):  # starved: no need for more
            self._timing, self.best = None, False
            self._every = min(2 * self._every, self.MAX_EVERY)
        elif self._timing == 4 * self.block:
            self._timing = None
            self.best = statistics.median(self.times[True]) <= statistics.median(self.times[False])
            self._every = self.every
