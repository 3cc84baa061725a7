"""The learner process (hpcrl/rl/learner_process.py): an update's gradient steps made beside the
rollout in a process of their own, the rest by the trainer; the same numbers whichever made which,
and nothing left behind however either ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from factories import alive
from test_algorithms import PPO_CARTPOLE, make_agent

from hpcrl.config.experiment import EnvConfig
from hpcrl.rl.learner_process import LATE_MIN_S, LATE_STEPS
from hpcrl.rl.ppo import LEARNER_PROCESS_ITERATIONS

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="the learner process runs at SCHED_IDLE, Linux's")


class Bars(gym.Env):
    """36x36 grey frames with a bar in one of three columns; reward 1 for naming the column."""

    observation_space = gym.spaces.Box(0, 255, (1, 36, 36), dtype=np.uint8)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return self._frame(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = float(int(action) == self.column)
        return self._frame(), reward, bool(self.np_random.random() < 0.2), False, {}

    def _frame(self) -> np.ndarray:
        self.column = int(self.np_random.integers(3))
        frame = self.np_random.integers(0, 40, (1, 36, 36), dtype=np.uint8)
        frame[:, :, 12 * self.column : 12 * self.column + 12] += 200
        return frame


if "hpcrl-test/Bars-v0" not in gym.registry:
    gym.register("hpcrl-test/Bars-v0", entry_point=Bars)

BARS = EnvConfig(id="hpcrl-test/Bars-v0", num_envs=4, vectorization="async")
CARTPOLE_WORKERS = EnvConfig(id="CartPole-v1", num_envs=4, vectorization="async")
PPO_BARS = dict(lr=5e-4, num_steps=32, num_minibatches=16, update_epochs=3, cnn_channels=[16, 16, 16], hidden_sizes=[64], async_rollout=True, total_steps=100_000)


def _ready(agent: Any) -> None:
    """One iteration (the learner process starts in the first, at SCHED_IDLE; the update runs at normal priority
    until it is ready), then wait until it has its replica.

    These tests check what the process computes and how it ends, not the cores it gets, so it then leaves
    SCHED_IDLE where the test may move it (root; else it stays): beside the suite's other workers and two busy
    loops on 2 cores, five of them waited over 120 s for a process that got no core to start on."""
    agent.train_iteration()
    assert agent._learner is not None, "an image policy's update beside the rollout goes to a learner process"
    pid = agent._learner.process.pid
    assert os.sched_getscheduler(pid) == os.SCHED_IDLE, "the learner process is born at background priority"
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(PermissionError, ProcessLookupError):  # not root; a thread that ended since: the others still move
            os.sched_setscheduler(int(task), os.SCHED_OTHER, os.sched_param(0))
    deadline = time.monotonic() + 120
    while not agent._learner.ready():
        assert time.monotonic() < deadline, "the learner process did not start in 120 s"
        time.sleep(0.05)


def _trained(beside: bool, **train: Any) -> tuple[list[dict[str, float]], dict[str, torch.Tensor], dict[str, torch.Tensor], int, int, list[float]]:
    """Six iterations of async PPO on Bars with the update beside the rollout (in the learner process once
    it is ready) or never. Beside, each rollout ends at once, or after 0.3 s (time for the whole update there),
    or says it has ended once the process has made a step of the update (the trainer then makes the rest). (metrics, weights,
    optimiser state, steps made there, steps made here, the tails `_pace` was told of: how long each update ran on here)."""
    agent = make_agent("ppo", BARS, **{**PPO_BARS, **train})
    agent._pace.choose = lambda: beside
    tails: list[float] = []
    agent._pace.record = lambda seconds, tail: tails.append(tail)
    here = 0
    step = agent.step_with_entropy

    def counted(loss: torch.Tensor, params: Any) -> None:
        nonlocal here
        here += 1
        step(loss, params)

    collect, endings = agent._collect, iter(["at once", "split", "after 0.3 s", "at once", "split", "split"])

    def ended(buf: Any, *args: Any) -> None:
        ending = next(endings, "at once")
        if beside and ending == "split" and agent._learner is not None and agent._learner.ready():
            # Adam's step count: the process's copy has counted past the trainer's once it made a step of this update.
            made, steps = agent._learner.work["step.optimizer.step"], agent.gradient_step.optimizer.state["step"]
            deadline = time.monotonic() + 120
            while made <= steps:
                assert time.monotonic() < deadline, "the learner process made no step in 120 s"
                time.sleep(0)
            agent._thread.mark_finished()  # as if the rollout were done: the process stops after this step or the next
        collect(buf, *args)
        if beside and ending == "after 0.3 s":
            time.sleep(0.3)

    agent._collect = ended
    try:
        if beside:
            _ready(agent)
        else:
            agent.train_iteration()
        agent.step_with_entropy = counted
        tails.clear()  # and the first tail recorded next is still the first iteration's, whose update ran in a thread
        metrics = [agent.train_iteration() for _ in range(5)]
        made = agent._learner.steps_made if agent._learner is not None else 0
        optimizer = {k: v.clone() for k, v in agent.gradient_step.optimizer.state.items()}
        return metrics, {k: v.clone() for k, v in agent.policy.state_dict().items()}, optimizer, made, here, tails
    finally:
        agent.close()
        agent.envs.close()


@pytest.mark.slow  # 7-9 s of CPU on the 2-core VM (three runs, two learner processes that import torch): over --fast's 5
@pytest.mark.parametrize("target_kl", [None, 0.002])
def test_a_run_learns_the_same_numbers_whichever_process_made_each_gradient_step(target_kl: float | None) -> None:
    """The trainer alone, and the trainer with the learner process making what steps it can while the rollout
    is in flight: the same metrics, weights and optimiser state to the bit (same code, thread count, random
    state and memory). With target_kl the epochs stop where the epoch's last step decides, wherever it ran."""
    alone_metrics, alone_weights, alone_optimizer, made, here, tails = _trained(False, target_kl=target_kl)
    assert made == 0 and tails  # the normal way's tails are told too (an update may outlast its rollout), and not weighed
    metrics, weights, optimizer, made, here, tails = _trained(True, target_kl=target_kl)
    assert made > 0 and here > 0, f"the learner process made {made} steps, the trainer {here}: no update was shared"
    # The updates the trainer finished said how long that took (`FasterOfTwo` times both ways on long tails).
    assert any(t > 0 for t in tails[1:]), tails
    assert metrics == alone_metrics
    for name, tensor in alone_weights.items():
        assert torch.equal(weights[name], tensor), name
    for name, tensor in alone_optimizer.items():
        assert torch.equal(optimizer[name], tensor), name


def _six_iterations(stall: bool) -> tuple[list[dict[str, float]], dict[str, torch.Tensor], list[float], list[int], int]:
    """Six iterations of async PPO on Bars, each rollout given 0.2 s more (time for the process to make steps beside
    it), the updates beside the rollout (`stall`) or never. With `stall` the learner process is stopped (SIGSTOP)
    before the second iteration and continued before the fourth, once the trainer has given up on it: (metrics,
    weights, each iteration's seconds, updates given up on after each, the process's steps the trainer took after
    it went on)."""
    agent = make_agent("ppo", BARS, **PPO_BARS)
    collect = agent._collect

    def slow(*args: Any) -> None:
        collect(*args)
        time.sleep(0.2)

    agent._collect = slow
    try:
        _ready(agent)
        agent._pace.choose = lambda: stall
        metrics, seconds, given_up, made = [], [], [], 0
        for i in range(6):
            if stall and i == 1:
                agent._learner.process.send_signal(signal.SIGSTOP)
            if stall and i == 3:
                agent._learner.process.send_signal(signal.SIGCONT)
                assert agent._learner._from.poll(60), "the continued process did not answer the update given up on"
                made = agent._learner.steps_made
            began = time.monotonic()
            metrics.append(agent.train_iteration())
            seconds.append(time.monotonic() - began)
            given_up.append(agent._learner.given_up)
        made = agent._learner.steps_made - made
        return metrics, {k: v.clone() for k, v in agent.policy.state_dict().items()}, seconds, given_up, made
    finally:
        with contextlib.suppress(ProcessLookupError):
            agent._learner.process.send_signal(signal.SIGCONT)
        agent.close()
        agent.envs.close()


@pytest.mark.slow  # 6.5 s of CPU: two runs, two learner processes that import torch
def test_a_learner_process_that_gets_no_core_holds_up_no_update() -> None:
    """Beside other work of normal priority on every core a process of the background class gets almost no CPU: the
    trainer waited for its step under way until the load ended (minutes), and failed the run after 600 s. Stopped
    (SIGSTOP: no CPU at all), the trainer waits for it a bounded time once the rollout is done (`late_after`), makes
    that update itself, and its next ones too until the process has answered; continued, the process makes steps
    again. The run learns the numbers of a run that never used the process."""
    alone_metrics, alone_weights, _, _, _ = _six_iterations(stall=False)
    metrics, weights, seconds, given_up, made = _six_iterations(stall=True)
    # Given up on in the second iteration; in the third, the process still on that update, not waited for at all.
    assert given_up[:3] == [0, 1, 1], given_up
    assert max(seconds[1:3]) < 0.2 + LATE_MIN_S + 15, seconds  # the rollout, the bound, and a loaded CI machine's update
    assert made > 0, "the process made no step once it went on"
    assert metrics == alone_metrics
    for name, tensor in alone_weights.items():
        assert torch.equal(weights[name], tensor), name


@pytest.mark.slow  # 6 s of CPU: gradient steps of 1,024 frames
def test_the_wait_for_the_learner_process_grows_with_its_gradient_steps_cpu() -> None:
    """The trainer gives the process half a second after the rollout, or ten of its gradient steps of CPU where a
    step is longer (a large network on a CPU): its step under way when the rollout ended takes that much. Here a step
    of about 85 ms: the bound is what the process's CPU, read from /proc, says, not the half second."""
    agent = make_agent("ppo", BARS, **{**PPO_BARS, "num_steps": 256, "num_minibatches": 1, "update_epochs": 2, "hidden_sizes": [2048], "cnn_channels": [32, 64, 64]})
    collect = agent._collect

    def slow(*args: Any) -> None:
        collect(*args)
        time.sleep(0.5)  # time for the whole update in the process

    agent._collect = slow
    try:
        _ready(agent)
        agent._pace.choose = lambda: True
        stat = Path(f"/proc/{agent._learner.process.pid}/stat")
        cpu = lambda: sum(int(x) for x in stat.read_text().rsplit(")", 1)[1].split()[11:13]) / os.sysconf("SC_CLK_TCK")  # noqa: E731
        before, made = cpu(), agent._learner.steps_made
        agent.train_iteration()
        per_step = (cpu() - before) / (agent._learner.steps_made - made)
        assert LATE_STEPS * per_step > LATE_MIN_S, f"a step of {per_step * 1e3:.0f} ms of CPU: too short for this test"
        assert 0.7 < agent._learner.late_after() / (LATE_STEPS * per_step) < 1.4, (agent._learner.late_after(), per_step)
    finally:
        agent.close()
        agent.envs.close()


def test_until_the_learner_process_has_started_the_update_runs_at_normal_priority() -> None:
    """The process starts at background priority (importing torch: seconds); until it is ready the updates run in
    the trainer at normal priority, not in the background thread, whose step under way held the trainer up until
    other work on every core ended, and which would take the idle cores the process starts on."""
    agent = make_agent("ppo", BARS, **PPO_BARS)
    agent._pace.choose = lambda: True
    try:
        agent.train_iteration()  # the process starts
        agent._learner.process.send_signal(signal.SIGSTOP)  # and gets no core from here on
        assert not agent._learner.ready(), "the process started within one iteration: nothing left to check"
        assert agent._yielding is not None, "a background thread can be had here"
        threaded, runner = [], agent._yielding

        class Counted:
            def __call__(self, steps: Any, until: Any) -> Any:
                threaded.append(steps)
                return runner(steps, until)

            def close(self) -> None:
                runner.close()

        agent._yielding = Counted()
        for _ in range(3):
            agent.train_iteration()
        assert threaded == [], "an update went to the background thread while the learner process started"
    finally:
        with contextlib.suppress(ProcessLookupError):
            agent._learner.process.send_signal(signal.SIGCONT)
        agent.close()
        agent.envs.close()


@pytest.mark.parametrize("iterations", [LEARNER_PROCESS_ITERATIONS - 1, LEARNER_PROCESS_ITERATIONS])
def test_a_long_run_of_vector_observations_gives_its_update_to_a_learner_process(iterations: int) -> None:
    """Not only a CNN's update: async PPO on CartPole made 4,181 steps/s with its update in a learner process,
    against 3,636-3,686 at normal priority and 3,089-3,149 in the background thread. A short run keeps the thread:
    the process's start (seconds) would be much of it."""
    per = CARTPOLE_WORKERS.num_envs * PPO_CARTPOLE["num_steps"]
    agent = make_agent("ppo", CARTPOLE_WORKERS, **{**PPO_CARTPOLE, "async_rollout": True, "total_steps": iterations * per})
    try:
        assert agent.num_iterations == iterations
        agent.train_iteration()
        assert (agent._learner is not None) == (iterations >= LEARNER_PROCESS_ITERATIONS)
    finally:
        agent.close()
        agent.envs.close()


def test_a_learner_process_that_dies_fails_the_run_with_how_it_ended() -> None:
    agent = make_agent("ppo", BARS, **PPO_BARS)
    agent._pace.choose = lambda: True
    try:
        _ready(agent)
        agent._learner.process.kill()
        agent._learner.process.wait(10)
        with pytest.raises(RuntimeError, match=r"learner process (died|is gone) \(killed by signal 9\)"):
            agent.train_iteration()
    finally:
        agent.close()
        agent.envs.close()


def test_a_warning_or_ctrl_c_that_reaches_the_learner_process_leaves_it_working() -> None:
    """Grid Engine sends its warnings (USR1, USR2) to every process of a job, Slurm's cancel TERM to every
    process of a step, a terminal SIGINT to its foreground group: the trainer checkpoints on them, and the
    learner process, which would have died (a run failed with "learner process died"), goes on."""
    agent = make_agent("ppo", BARS, **PPO_BARS)
    agent._pace.choose = lambda: True
    try:
        _ready(agent)
        for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
            agent._learner.process.send_signal(sig)
        made = agent._learner.steps_made
        # On a node kept busy by others (the suite's other workers) a rollout may end before the process made
        # a step, so each rollout leaves it 0.3 s and the test goes on until it has made one (a dead or deaf
        # process never does).
        collect = agent._collect

        def slow(*args: Any) -> None:
            collect(*args)
            time.sleep(0.3)

        agent._collect = slow
        deadline = time.monotonic() + 120
        while agent._learner.steps_made == made:
            assert time.monotonic() < deadline, "the learner process made no step in 120 s after the signals"
            agent.train_iteration()
            assert agent._learner.process.poll() is None, "the learner process died of a signal it should ignore"
    finally:
        agent.close()
        agent.envs.close()


TRAINER = textwrap.dedent(
    """
    import sys, time
    sys.path[:0] = [sys.argv[1], sys.argv[2]]
    from test_learner_process import BARS, PPO_BARS, _ready
    from test_algorithms import PPO_CARTPOLE, make_agent
    agent = make_agent("ppo", BARS, **PPO_BARS)
    agent._pace.choose = lambda: True
    if sys.argv[3] == "ready":
        _ready(agent)
    else:  # killed in the process's start: its first iteration starts it, which takes seconds
        agent.train_iteration()
    print(agent._learner.process.pid, flush=True)
    while True:
        agent.train_iteration()
    """
)


@pytest.mark.parametrize("when", ["ready", "in-its-start"])
def test_the_learner_process_and_its_shared_memory_go_with_a_killed_trainer(when: str, tmp_path: Path) -> None:
    """Killed with SIGKILL, the trainer can end nothing: the learner process goes by its lifeline, and the memory
    they share, in files of no name, with the last of them. Named files in /dev/shm, unlinked once the process had
    mapped them, stayed there for good when the trainer was killed in the process's start."""
    # TMPDIR: the env workers' scratch directories, which no one is left to remove after a SIGKILL (a job's
    # scheduler removes its TMPDIR), go with the test's own.
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    before = {n for n in os.listdir("/dev/shm") if n.startswith("hpcrl-")}
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(Path(__file__).parent), str(Path(__file__).parents[1]), when], stdout=subprocess.PIPE, text=True, start_new_session=True, env=env)
    try:
        pid = int(trainer.stdout.readline())
        if when == "ready":
            time.sleep(1.0)  # updates under way
        os.kill(trainer.pid, signal.SIGKILL)  # the trainer alone: what it started must go by itself
        trainer.wait(10)
        deadline = time.monotonic() + 10
        while alive(pid):
            assert time.monotonic() < deadline, "the learner process outlived its trainer"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait()
    assert {n for n in os.listdir("/dev/shm") if n.startswith("hpcrl-")} <= before, "the trainer and its process left shared memory behind"


SMALL = textwrap.dedent(
    """
    import os, resource, sys
    sys.path[:0] = [sys.argv[1], sys.argv[2]]
    from test_learner_process import BARS, PPO_BARS, _ready
    from test_algorithms import PPO_CARTPOLE, make_agent
    agent = make_agent("ppo", BARS, **PPO_BARS)
    if sys.argv[3] == "few-descriptors":  # room for a few memory files, not for all
        # The update at normal priority: at background priority, on a busy machine, a step in the thread waited minutes.
        agent._pace.choose = lambda: False
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 6, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        for _ in range(3):
            agent.train_iteration()
    else:
        _ready(agent)
        for _ in range(3):
            agent.train_iteration()
    print(agent._learner is None, agent.global_step, flush=True)
    agent.close()
    agent.envs.close()
    """
)


def _can_mount_tmpfs() -> bool:
    if os.geteuid() != 0:
        return False
    try:
        return subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /dev/shm"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs root and `unshare -m` to give a trainer a /dev/shm of its own size")
def test_a_small_dev_shm_does_not_keep_the_learner_process_from_a_run() -> None:
    """A container's /dev/shm is 64 MB, too small for a large network's two copies and batch: in named files
    there the run went without its learner process (and a file only truncated to size had the trainer die of
    SIGBUS at its first write). The memory files of no name are not in it: with a /dev/shm of 8 kB (160 kB of
    weights here) the process runs."""
    argv = ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=8k tmpfs /dev/shm && exec "$0" "$@"', sys.executable, "-c", SMALL, *_paths(), "small-dev-shm"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.split() == ["False", str(4 * 32 * 4)], "the run went without its learner process, or not every iteration ran"


def test_a_trainer_with_no_room_for_the_shared_memory_leaves_the_update_to_the_thread() -> None:
    """Where the memory files cannot all be had (here the process's last file descriptors), the run goes on with
    the update in its thread, having closed what it had made."""
    done = subprocess.run([sys.executable, "-c", SMALL, *_paths(), "few-descriptors"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.split() == ["True", str(3 * 32 * 4)], "the run kept a learner process with no room for it, or not every iteration ran"


def _paths() -> list[str]:
    """The test scripts' sys.path: this folder and tests/."""
    return [str(Path(__file__).parent), str(Path(__file__).parents[1])]
