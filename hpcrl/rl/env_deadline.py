"""A bound on every call the trainer's own process makes into a user's env: `env.vectorization: sync`
(building the envs, reset, step, close) and the evaluation video's env.

Worker processes bound every wait on an env (hpcrl.rl.env_workers.Workers), but a sync vector env runs its
envs in the trainer's process, where a `step` that never returns froze the run until the time limit.
Sync exists because a cheap env's step costs less than the pipe round trip a worker would add (a
CartPole step is microseconds), so moving those envs into a process would cost what sync saves.
The bound stays in the process instead, as the kernel's interval timer: each call arms
ITIMER_REAL for `env.worker_timeout_s`; if it expires, SIGALRM's handler runs in the main thread at
its next bytecode, or at once where it waits in a system call (a sleep, a socket, a lock: Python lets
the signal interrupt it), and raises EnvTimeout, which fails the run in one line naming the env and
the call, as a worker's timeout does. Disarmed when the call returns: a few system calls per call.

What it cannot bound, and so refuses or leaves to `env.vectorization: async` (whose workers are
processes the trainer kills, whatever they run):
- a call from a thread other than the main one (`train.async_rollout: true` on sync envs): signal
  handlers run in the main thread only, and no thread can stop another. Refused in one line at the
  first such call;
- native code that neither returns to the interpreter nor lets a system call fail when the signal
  comes (a C library that retries its waits by itself): the run then waits for the job's time limit.
gymnasium's own envs (an entry point in `gymnasium.envs`) are not wrapped: their code is known, a
step is a few lines of numpy, and they may be stepped from any thread.

Another SIGALRM user in the process (pytest-timeout, a user's `signal.alarm`) keeps its handler and
its timer: both are put back after each call, and an alarm that is theirs (it comes before our
deadline) is passed on to their handler.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import gymnasium as gym

from hpcrl.store.rundir import RunError


class EnvTimeout(RunError):
    """A call into an env in the trainer's own process did not return within env.worker_timeout_s."""


def known(env_id: str) -> bool:
    """Whether `env_id` is one of gymnasium's own envs (its code is gymnasium's, not a user's)."""
    try:
        entry = gym.spec(env_id).entry_point
    except Exception:  # an id gymnasium cannot look up is not one of its own
        return False
    module = entry if isinstance(entry, str) else getattr(entry, "__module__", "")
    return module.startswith("gymnasium.envs.")


_armed: list[float] = []
"""The deadline (monotonic clock) of the call in progress, if one is."""


class Deadline:
    """`with deadline("step"): ...` bounds one call into `env_id`'s code by `timeout` seconds."""

    def __init__(self, env_id: str, timeout: float) -> None:
        self.env_id, self.timeout = env_id, timeout

    @contextlib.contextmanager
    def __call__(self, doing: str) -> Iterator[None]:
        if _armed:  # a call inside a bounded call (a vector env closing its envs): the outer bound holds
            yield
            return
        if threading.current_thread() is not threading.main_thread():
            raise EnvTimeout(
                f"env {self.env_id}: {doing} was called from thread {threading.current_thread().name!r}, where a call into an env in the "
                "trainer's own process cannot be bounded (train.async_rollout: true with env.vectorization: sync): set env.vectorization: async"
            )
        deadline = time.monotonic() + self.timeout
        theirs_fired = ended = False

        def expired(signum: int, frame: Any) -> None:
            nonlocal theirs_fired
            if time.monotonic() < deadline:  # the alarm of whoever set one before us, and sooner: theirs
                theirs_fired = True
                if not ended:  # Python runs a handler late: once the call has ended, our own timer stays off
                    signal.setitimer(signal.ITIMER_REAL, max(deadline - time.monotonic(), 1e-6))
                if callable(previous):
                    previous(signum, frame)
                return
            _armed.clear()
            raise EnvTimeout(f"env {self.env_id}: {doing} did not return within {self.timeout:g} s (in the trainer's own process: env.vectorization sync)")

        previous = signal.getsignal(signal.SIGALRM)  # bound before `expired` can run (any thread may take the signal)
        # Theirs read and stopped in one system call, before `expired` is in. Read first and replaced after, theirs
        # could come due in between, and its signal and that of ours set for the same moment both reached their handler
        # (61 of 8,000 alarms due among a stream of calls on the 2-core VM; 0 of 8,000 so). A signal of theirs already
        # on its way reaches their handler, or `expired`, which passes it on, once.
        their_delay, their_interval = signal.setitimer(signal.ITIMER_REAL, 0)
        their_due = time.monotonic() + their_delay  # when theirs is due, whatever the calls take (no drift over many)
        signal.signal(signal.SIGALRM, expired)
        _armed.append(deadline)
        at_theirs = bool(their_delay) and their_delay <= self.timeout  # the timer stands at their time, not our deadline
        signal.setitimer(signal.ITIMER_REAL, max(their_due - time.monotonic(), 1e-6) if at_theirs else self.timeout)
        try:
            yield
        finally:
            ended = True
            left, _ = signal.setitimer(signal.ITIMER_REAL, 0)
            _armed.clear()
            signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)
            # Where the timer stood at their time and ran out, their signal has come: to `expired`, or, taken by
            # another thread and not yet handled in this one, on its way to their handler, now back. Armed again,
            # it reached their handler twice.
            delivered = theirs_fired or (at_theirs and left == 0.0)
            if their_delay and not delivered:  # theirs goes on, less the time this call took (at once if it is due)
                signal.setitimer(signal.ITIMER_REAL, max(their_due - time.monotonic(), 1e-6), their_interval)
            elif delivered and their_interval:
                signal.setitimer(signal.ITIMER_REAL, their_interval, their_interval)


class _BoundedCalls:
    """The calls into the envs, each bounded by the deadline: one rule for a vector env and for one env."""

    env: Any
    deadline: Deadline

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        with self.deadline("reset"):
            return self.env.reset(**kwargs)

    def step(self, action: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        with self.deadline("step"):
            return self.env.step(action)

    def close(self, **kwargs: Any) -> None:
        with self.deadline("close"):
            self.env.close(**kwargs)


class BoundedVectorEnv(_BoundedCalls, gym.vector.VectorWrapper):
    """A vector env whose envs run in this process, each reset, step and close bounded (`Deadline`)."""

    def __init__(self, env: gym.vector.VectorEnv, deadline: Deadline) -> None:
        super().__init__(env)
        self.deadline = deadline


class BoundedEnv(_BoundedCalls, gym.Wrapper):
    """One env in this process (the evaluation video's), each reset, step, render and close bounded."""

    def __init__(self, env: gym.Env, deadline: Deadline) -> None:
        super().__init__(env)
        self.deadline = deadline

    def render(self) -> Any:
        with self.deadline("render"):
            return self.env.render()
