"""A bound on every call the trainer's own process makes into a user's env: `env.vectorization: sync`
(building the envs, reset, step, close) and the evaluation video's env.

Worker processes bound every wait on an env (hpcrl.rl.env_workers.Workers), but a sync vector env runs its
envs in the trainer's process, where a `step` that never returns froze the run until the time limit.
Sync exists because a cheap env's step costs less than the pipe round trip a worker would add (a
CartPole step is microseconds), so moving those envs into a process would cost what sync saves.
The bound stays in the process instead, as a kernel timer: each call arms it for `env.worker_timeout_s`;
if it expires, the kernel signals the main thread, whose handler runs at its next bytecode, or at once where
it waits in a system call (a sleep, a socket, a lock: Python lets the signal interrupt it), and raises
EnvTimeout, which fails the run in one line naming the env and the call, as a worker's timeout does.
Disarmed when the call returns: two system calls per call.

The timer is one of the process's own (a POSIX timer on the monotonic clock, made at its first bounded call)
and its signal, DEADLINE_SIGNAL, is a real-time signal that nothing else sends, aimed at the main thread
(taken where it is ignored or blocked, as a launcher may leave it through exec; refused in one line where another
handler holds it).
The process's one ITIMER_REAL and SIGALRM, which pytest-timeout or a user's `signal.alarm` may hold, are
never touched. Shared with them, as the bound first was, another alarm had to be stopped, read and set again
around each call, and could not be kept whole: the kernel reports a timer less than a microsecond from its
time as 0 (setitimer's microseconds are truncated), so the alarm stopped there never came (574 of 20,000
tries aimed at that microsecond; one alarm of 400 in a CI run of tests/rl/test_env_workers.py).

What it cannot bound, and so refuses or leaves to `env.vectorization: async` (whose workers are
processes the trainer kills, whatever they run):
- a call from a thread other than the main one (`train.async_rollout: true` on sync envs): signal
  handlers run in the main thread only, and no thread can stop another. Refused in one line at the
  first such call;
- native code that neither returns to the interpreter nor lets a system call fail when the signal
  comes (a C library that retries its waits by itself): the run then waits for the job's time limit.
gymnasium's own envs (an entry point in `gymnasium.envs`) are not wrapped: their code is known, a
step is a few lines of numpy, and they may be stepped from any thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import gymnasium as gym

from hpcrl.store.rundir import RunError

DEADLINE_SIGNAL = signal.SIGRTMIN + 2
"""What an expired bound sends the main thread: a real-time signal no scheduler, terminal or user sends (hpcrl's
env workers' watchers use SIGRTMIN + 1, hpcrl.runtime.group_watch)."""


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


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class _Sigevent(ctypes.Structure):
    """glibc's struct sigevent, 64 bytes, with the one member of its union that SIGEV_THREAD_ID reads."""

    _fields_ = [("sigev_value", ctypes.c_void_p), ("sigev_signo", ctypes.c_int), ("sigev_notify", ctypes.c_int), ("sigev_notify_thread_id", ctypes.c_int), ("_rest", ctypes.c_int * 11)]


_CLOCK_MONOTONIC = 1  # time.monotonic's clock, so the handler's reading and the timer agree
_SIGEV_THREAD_ID = 4  # Linux: the signal goes to the named thread, not to any thread of the process
_DISARMED = _Itimerspec()


class _Timer:
    """A timer of this process for the bound, on the monotonic clock, whose expiry signals the calling (main) thread."""

    def __init__(self) -> None:
        self._librt = ctypes.CDLL("librt.so.1", use_errno=True)  # timer_* live in libc since glibc 2.34, found through librt on any
        event = _Sigevent(sigev_signo=DEADLINE_SIGNAL, sigev_notify=_SIGEV_THREAD_ID, sigev_notify_thread_id=threading.get_native_id())
        self._id = ctypes.c_void_p()
        if self._librt.timer_create(_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(self._id)):
            raise RunError(f"no timer could be made to bound the calls into the env in this process: {os.strerror(ctypes.get_errno())}")

    def arm(self, seconds: float) -> None:
        whole = int(seconds)
        nanoseconds = max(int((seconds - whole) * 1e9), 0 if whole else 1)  # a value of 0 disarms: under 1 ns is 1 ns
        if self._librt.timer_settime(self._id, 0, ctypes.byref(_Itimerspec(it_value=_Timespec(whole, nanoseconds))), None):
            raise RunError(f"the timer bounding the calls into the env in this process could not be set for {seconds:g} s: {os.strerror(ctypes.get_errno())}")

    def disarm(self) -> None:
        self._librt.timer_settime(self._id, 0, ctypes.byref(_DISARMED), None)


_armed: list[tuple[float, str]] = []
"""The deadline (monotonic clock) of the call in progress, if one is, and what its expiry says."""


def _expired(signum: int, frame: Any) -> None:
    """DEADLINE_SIGNAL's handler. Python runs a handler late, after the call that armed the timer may have returned:
    a signal finding no call past its deadline is that of a call that ended, and changes nothing."""
    if _armed and time.monotonic() >= _armed[0][0]:
        _, says = _armed.pop()
        raise EnvTimeout(says)


def _timer(env_id: str) -> _Timer:
    """This process's timer, with the handler in place; refused in one line where another handler holds the signal."""
    handler = signal.getsignal(DEADLINE_SIGNAL)
    if handler is not _expired:
        if handler not in (signal.SIG_DFL, signal.SIG_IGN):  # ignored is nobody's: a launcher's, inherited through exec
            raise EnvTimeout(f"env {env_id}: signal {int(DEADLINE_SIGNAL)} (SIGRTMIN+2), which bounds the calls into an env in the trainer's own process, has another handler here: set env.vectorization: async")
        signal.signal(DEADLINE_SIGNAL, _expired)
    return _timer_of(os.getpid())


@functools.lru_cache(maxsize=1)
def _timer_of(pid: int) -> _Timer:
    """The timer of process `pid`, made at its first bounded call: a forked child has none of its parent's timers, and
    its first call, under another pid, makes its own."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [DEADLINE_SIGNAL])  # a blocked mask, too, is inherited through exec
    return _Timer()


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
        timer = _timer(self.env_id)
        _armed.append((time.monotonic() + self.timeout, f"env {self.env_id}: {doing} did not return within {self.timeout:g} s (in the trainer's own process: env.vectorization sync)"))
        timer.arm(self.timeout)
        try:
            yield
        finally:
            timer.disarm()
            _armed.clear()


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
