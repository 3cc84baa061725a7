"""An update's gradient steps in a process of their own, beside the background rollout (CPU, one rank).

`YieldingUpdate` runs the update in a thread of the trainer at background priority, so it takes
only the cores the rollout leaves idle; but that thread shares one GIL with the rollout thread,
which then waits for it between the ops of its forward pass. Measured on ViZDoom basic (8 envs in
4 workers, a 2-core EPYC; a rollout of 512 steps beside a loop of gradient steps of the same CNN
at SCHED_IDLE): alone 1,126 / 1,262 env steps/s; with the loop in a thread 1,012 / 1,115, the
loop making 17-22 steps/s; with the loop in a process 1,101 / 1,253, making 24-33 steps/s.

The learner process holds a replica of the agent's learning parts (`OnPolicyAgent.learner_replica`).
The learning tensors (weights, optimiser state, observation statistics) are in two copies in shared
memory (memory files of no name, `MemoryFiles`), with buffers for the batch, all taken at the start
(where there is no memory for them the run keeps the update in its thread): the trainer works on
one, the process on the other. For each update the trainer copies its batch
into those buffers and sends the iteration, learning rate, torch thread count and random state; the
process (at SCHED_IDLE from its start) copies the trainer's copy into its own, makes gradient steps
on it while the rollout is in flight, and answers with its metrics when it finished the update, or
with the steps it made once the rollout is done. The trainer then works on the process's copy (the
two swap: nothing is copied on the trainer's side) and makes the rest at normal priority
(`update_steps(start=...)`, which skips those steps but draws their minibatches alike). Both run
the same code with the same thread count and random state on the same numbers, so a run learns the
same numbers wherever each step ran (tests/rl/test_learner_process.py).

The trainer waits for that answer a bounded time once the rollout is done (`late_after`): beside
other work of normal priority on every core, a process of the background class gets almost no
CPU (a step under way waited minutes for the load to end), and past the bound the trainer makes
the whole update itself from its own tensors, which the process never writes. The process is told
to drop the update; until it has answered, the trainer's updates are all its own.

The process is a plain `python -m hpcrl.rl.learner_process` (not multiprocessing's spawn, which
re-runs a user's main script in the child), gets SIGKILL when the trainer dies
(`hpcrl.runtime.lifeline`), and ends when its pipe closes.
"""

from __future__ import annotations

import functools
import math
import mmap
import multiprocessing.connection
import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from hpcrl.runtime.guard import leave_stops_to_the_trainer
from hpcrl.runtime.lifeline import dies_with_me

LATE_MIN_S = 0.5
"""The shortest time the trainer waits, once the rollout is done, for the process's answer."""
LATE_STEPS = 10
"""...and in the process's gradient steps of CPU: a step under way when the rollout ended takes one
step's CPU on the cores the rollout has left (ViZDoom's 6-15 ms; tails of 0-0.03 s)."""

Spec = tuple[int, tuple[int, ...], torch.dtype]
"""A shared tensor as the other process maps it: the descriptor of its memory file, shape, dtype."""


def _mapped(fd: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The memory of `fd` as a tensor (which keeps the mapping alive); a failure is an OSError."""
    count = math.prod(shape)
    memory = mmap.mmap(fd, max(1, count) * dtype.itemsize)
    return torch.frombuffer(memory, dtype=dtype, count=max(1, count))[:count].view(shape)


class MemoryFiles:
    """Contiguous tensors mapped from memory files of no name (`memfd_create`): the learner process
    inherits their descriptors and maps the same memory. Nothing has a name in /dev/shm, so nothing
    can be left there whatever ends either process (named files lived until both had mapped them:
    a trainer killed in the process's start left them for good), and a container's small /dev/shm
    (64 MB) does not bound them."""

    def __init__(self) -> None:
        self.fds: list[int] = []

    def put(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Spec]:
        """A mapped copy of `tensor`, and how the other process maps the same memory."""
        fd = os.memfd_create("hpcrl-learner", os.MFD_CLOEXEC)  # the learner process gets them by pass_fds alone
        self.fds.append(fd)
        shape, dtype = tuple(tensor.shape), tensor.dtype
        # Allocated now: a file only truncated to size gets its pages as they are first written, and a write
        # that finds no memory for them is a SIGBUS, not an OSError.
        os.posix_fallocate(fd, 0, max(1, math.prod(shape)) * tensor.element_size())
        mapped = _mapped(fd, shape, dtype)
        mapped.copy_(tensor)
        return mapped, (fd, shape, dtype)

    def close(self) -> None:
        """Close the descriptors (the mappings live on): once the learner process has its own, or on failure."""
        for fd in self.fds:
            os.close(fd)
        self.fds = []


class SharedEvent(threading.Event):
    """A threading.Event whose state the learner process reads from one shared byte: set when
    the rollout is done (`RolloutThread.finished`)."""

    def __init__(self, byte: torch.Tensor) -> None:
        super().__init__()
        self.byte = byte

    def set(self) -> None:
        self.byte.fill_(1)
        super().set()

    def clear(self) -> None:
        self.byte.fill_(0)
        super().clear()


class LearnerProcess:
    """The learner process of one agent, started with it: call it with each update's batch once `ready`."""

    def __init__(self, agent: Any) -> None:
        files = MemoryFiles()
        try:
            # The trainer's own tensors move to shared memory, and a second copy is the process's; the
            # batch's buffers too, now: the rollout's shapes are fixed, so all the shared memory a run needs
            # is taken (or found missing) before the first update, never midway.
            copies = [{name: files.put(tensor) for name, tensor in agent.learner_tensors().items()}]
            copies.append({name: files.put(tensor) for name, (tensor, _) in copies[0].items()})
            self._copies = [{name: m for name, (m, _) in copy.items()} for copy in copies]
            self._bind = agent.bind_learner
            self._bind(self._copies[0])
            self._trainer_copy = 0
            """Which of the two copies the trainer works on."""
            flag, flag_spec = files.put(torch.zeros((), dtype=torch.uint8))
            self.finished = SharedEvent(flag)
            """The rollout thread's `finished`: the process stops making steps once it is set."""
            self._drop, drop_spec = files.put(torch.zeros((), dtype=torch.uint8))
            batch = {k: files.put(v.contiguous()) for k, v in _flat_items(agent.batch(*agent.advantages()))}
            self._batch = {k: m for k, (m, _) in batch.items()}
            specs = {
                "copies": [{name: spec for name, (_, spec) in copy.items()} for copy in copies],
                "batch": {k: spec for k, (_, spec) in batch.items()},
                "flags": {"finished": flag_spec, "drop": drop_spec},
            }
            to_child, self._send_end = os.pipe()
            self._recv_end, from_child = os.pipe()
            try:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", __name__, str(to_child), str(from_child)],
                    pass_fds=(to_child, from_child, *files.fds), preexec_fn=functools.partial(_born_idle, dies_with_me()), stdin=subprocess.DEVNULL,  # noqa: PLW1509 - a syscall and lifeline's prctl, looked up before the fork
                )  # fmt: skip
            finally:
                os.close(to_child)
                os.close(from_child)
                files.close()  # the process has its own now
            self._to = multiprocessing.connection.Connection(self._send_end, readable=False)
            self._from = multiprocessing.connection.Connection(self._recv_end, writable=False)
            self._to.send((type(agent), agent.learner_setup(), specs))
        except BaseException:
            files.close()
            raise
        self._ready = False
        self._sent = 0
        """Updates sent so far: each answer names its own."""
        self._pending: int | None = None
        """An update the trainer stopped waiting for, until the process has answered it."""
        self._step_cpu = 0.0
        """CPU seconds of one of the process's gradient steps, as it last measured them."""
        self.steps_made = 0
        """Gradient steps of this process that the trainer took (the tests read it)."""
        self.given_up = 0
        """Updates the trainer made itself because the process answered late (the tests read it)."""

    def ready(self) -> bool:
        """Whether the process has its replica (it starts in the background: a few seconds)."""
        if not self._ready and self._from.poll():
            self._answer()
            self._ready = True
        return self._ready

    @property
    def work(self) -> dict[str, torch.Tensor]:
        """The copy of the learning tensors the process works on in the next or current update."""
        return self._copies[1 - self._trainer_copy]

    def late_after(self) -> float:
        """Seconds past the rollout's end after which the trainer stops waiting for the process's answer."""
        return max(LATE_MIN_S, LATE_STEPS * self._step_cpu)

    def __call__(self, batch: dict[str, Any], iteration: int, iterations: int, lr: float, since_finished: Callable[[], float]) -> tuple[bool, Any]:
        """Run `batch`'s update there until the rollout is done (`since_finished`: the seconds since, once
        `finished` is set): (True, its metrics, having set
        this process's random state and the agent's learning tensors to where the update left them) or (False,
        (steps made, samples they clipped)), the rest of the update being the caller's: all of it
        where the process answered late, or was still on an update given up on."""
        if self._pending is not None and not self._collect_late():
            return False, (0, 0.0)
        for k, v in _flat_items(batch):
            self._batch[k].copy_(v)
        self._drop.fill_(0)
        self._sent += 1
        self._send(("update", self._sent, self._trainer_copy, iteration, iterations, lr, torch.get_num_threads(), _rng_bytes()))
        answer = self._await(since_finished)
        if answer is None:  # the process got no core in time: the update is the trainer's, on its own tensors
            self._drop.fill_(1)
            self._pending = self._sent
            self.given_up += 1
            return False, (0, 0.0)
        finished, value, steps, rng = answer
        if steps:  # the trainer goes on from the process's copy; the process's next update starts from a copy of it
            self._trainer_copy = 1 - self._trainer_copy
            self._bind(self._copies[self._trainer_copy])
        self.steps_made += steps
        if finished:
            _set_rng(rng)
        return finished, value

    def _await(self, since_finished: Callable[[], float]) -> tuple[bool, Any, int, bytes | None] | None:
        """The process's answer to the update just sent; None once `late_after` has passed since the rollout ended."""
        while True:
            wait = self.late_after() - since_finished() if self.finished.is_set() else 0.05
            if self._from.poll(max(0.0, wait)):
                return self._update_answer()
            if self.finished.is_set() and since_finished() >= self.late_after():
                return None

    def _collect_late(self) -> bool:
        """Whether the process has answered the update given up on (its answer is dropped)."""
        if not self._from.poll():
            return False
        self._update_answer()
        self._pending = None
        return True

    def _update_answer(self) -> tuple[bool, Any, int, bytes | None]:
        sent, answer, step_cpu = self._answer()
        if step_cpu:
            self._step_cpu = step_cpu
        if sent != (self._pending or self._sent):
            raise RuntimeError(f"the learner process answered update {sent}, not {self._pending or self._sent}")
        return answer

    def close(self) -> None:
        """End the process (between updates): at once where it is still on an update given up on."""
        if self._pending is not None:
            self.process.kill()
        try:
            self._to.send(None)
        except OSError:
            pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._to.close()
        self._from.close()

    def _send(self, message: Any) -> None:
        try:
            self._to.send(message)
        except OSError as exc:
            raise RuntimeError(f"the learner process is gone ({self._how_it_ended()})") from exc

    def _answer(self) -> Any:
        """What the process sent (the caller saw the pipe readable), or how it failed."""
        try:
            kind, value = self._from.recv()
        except (EOFError, OSError) as exc:
            raise RuntimeError(f"the learner process died ({self._how_it_ended()})") from exc
        if kind == "error":
            raise RuntimeError(f"the learner process failed:\n{value}")
        return value

    def _how_it_ended(self) -> str:
        try:
            code = self.process.wait(5)
        except subprocess.TimeoutExpired:
            return "still running"
        return f"exit code {code}" if code >= 0 else f"killed by signal {-code}"


PRIVATE = ("step.grad",)
"""Learning tensors not copied from the trainer's copy at an update's start: a gradient step begins by zeroing its gradient."""


def _born_idle(lifeline: Callable[[], None]) -> None:
    """The process's preexec_fn: its lifeline, and SCHED_IDLE from its first instruction, so that even
    its start (importing torch: some 2.7 s of CPU) takes only cores the run leaves idle; deaf to the
    signals the trainer stops on, which end it itself (its pipe, SIGKILL, or its lifeline)."""
    lifeline()
    leave_stops_to_the_trainer()
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _rng_bytes() -> bytes:
    """torch's CPU random state as bytes: a tensor sent down the pipe would go through torch's
    tensor sharing, which needs multiprocessing's own process tree."""
    return torch.get_rng_state().numpy().tobytes()


def _set_rng(state: bytes) -> None:
    torch.set_rng_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))


def _flat_items(batch: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """The batch's tensors by one flat name each (an observation dict's keys as `obs.key`)."""
    items: list[tuple[str, torch.Tensor]] = []
    for key, value in batch.items():
        if isinstance(value, dict):
            items += [(f"{key}.{k}", v) for k, v in value.items()]
        else:
            items.append((key, value))
    return items


def _nested(flat: dict[str, torch.Tensor]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, tensor in flat.items():
        key, _, sub = name.partition(".")
        if sub:
            out.setdefault(key, {})[sub] = tensor
        else:
            out[key] = tensor
    return out


def _map_all(specs: dict[str, Spec]) -> dict[str, torch.Tensor]:
    return {k: _mapped(fd, shape, dtype) for k, (fd, shape, dtype) in specs.items()}


def _serve(to_trainer: multiprocessing.connection.Connection, requests: multiprocessing.connection.Connection) -> None:
    agent_class, setup, specs = requests.recv()
    try:
        copies = [_map_all(copy) for copy in specs["copies"]]
        agent = agent_class.learner_replica(setup, copies[1])
        flags = _map_all(specs["flags"])
        batch = _nested(_map_all(specs["batch"]))
        for group in (*specs["copies"], specs["flags"], specs["batch"]):
            for fd, _, _ in group.values():
                os.close(fd)  # mapped: the mappings keep the memory
    except BaseException:  # noqa: BLE001 - the trainer raises it
        to_trainer.send(("error", traceback.format_exc()))
        return
    to_trainer.send(("ready", None))
    while (request := requests.recv()) is not None:
        _, sent, trainers, iteration, iterations, lr, threads, rng = request
        try:
            cpu = time.process_time()
            work = copies[1 - trainers]
            for name, tensor in copies[trainers].items():
                if name not in PRIVATE:
                    work[name].copy_(tensor)
            agent.bind_learner(work)
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            _set_rng(rng)
            agent.iteration, agent.num_iterations = iteration, iterations
            agent.gradient_step.set_lr(lr)
            steps = agent.update_steps(batch)
            done, clipped = 0, 0.0
            try:
                # Stops once the rollout is done, or the trainer has stopped waiting (it then makes the update itself).
                while not (bool(flags["finished"]) or bool(flags["drop"])):
                    done, count = next(steps)
                    clipped = float(count)
                answer = (False, (done, clipped), done, None)
            except StopIteration as stop:  # its last step came after the last yield
                done += 1
                answer = (True, stop.value, done, _rng_bytes())
            step_cpu = (time.process_time() - cpu) / done if done else 0.0
        except BaseException:  # noqa: BLE001 - the trainer raises it
            to_trainer.send(("error", traceback.format_exc()))
            return
        to_trainer.send(("done", (sent, answer, step_cpu)))


def main(argv: list[str]) -> None:
    """`python -m hpcrl.rl.learner_process TO_CHILD FROM_CHILD`, the pipes' descriptors (what `LearnerProcess`
    starts, its lifeline and priority set before the exec)."""
    to_child, from_child = (int(a) for a in argv)
    requests = multiprocessing.connection.Connection(to_child, writable=False)
    to_trainer = multiprocessing.connection.Connection(from_child, readable=False)
    try:
        _serve(to_trainer, requests)
    except EOFError:  # the trainer closed its end: nothing more to do
        pass


if __name__ == "__main__":
    main(sys.argv[1:])
