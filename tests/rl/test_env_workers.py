"""No wait on an env worker process is unbounded: a worker that hangs or dies in its start, a reset,
a step or its close fails the run in one line naming the env, the worker and what it was doing,
within `env.worker_timeout_s`, and no worker (or what it started) outlives it. The misbehaving env
is a user's gymnasium env (`tests/standins/failing_env.py`, registered as `failing_env:FailingEnv-v0`)."""

from __future__ import annotations

import contextlib
import glob
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from factories import alive, own_shm, simulators, write_config

from hpcrl.config.experiment import EnvConfig
from hpcrl.rl import env_workers
from hpcrl.rl import envs as envs_module
from hpcrl.rl.env_deadline import DEADLINE_SIGNAL, EnvTimeout
from hpcrl.rl.env_output import EnvOutputError
from hpcrl.rl.env_workers import EnvWorkerError
from hpcrl.rl.envs import make_env_here, make_vec_env
from hpcrl.rl.rollout import THREAD_NAME

STANDINS = Path(__file__).resolve().parents[1] / "standins"
ENV_ID = "failing_env:FailingEnv-v0"



def worker_pids(pid_dir: Path) -> list[int]:
    return [int(p.name) for p in pid_dir.iterdir()]


def drive(spec: EnvConfig, pipelined: bool = False) -> None:
    """Make the envs, reset them and take 5 steps, closing them whatever happens."""
    envs = make_vec_env(spec, pipelined=pipelined)
    try:
        envs.reset(seed=0)
        for _ in range(5):
            envs.step(envs.action_space.sample())
    finally:
        envs.close()


@pytest.mark.parametrize("pipelined", [True, False])
@pytest.mark.parametrize(("per_worker", "worker"), [(1, "worker 3"), (2, "worker 1 (envs 2-3)")])
@pytest.mark.parametrize(
    ("fail_in", "how", "line"),
    [
        ("start", "hang", "{first} did not answer start within 1 s"),
        ("reset", "hang", "{worker} did not answer reset within 1 s"),
        ("step", "hang", "{worker} did not answer step within 1 s"),
        ("close", "hang", "{worker} did not answer close within 1 s"),
        ("step", "exit", "{worker} exited with code 3 during step"),
    ],
)
def test_a_worker_that_hangs_or_dies_is_named_and_killed(pipelined: bool, per_worker: int, worker: str, fail_in: str, how: str, line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """4 envs, one or two per worker, the workers in one group or in two (a GPU rollout's grouping
    of two cores); env 3 (seed 3) or, at start, every worker fails: the line names the worker and,
    where it hosts several, its envs."""
    monkeypatch.syspath_prepend(str(STANDINS))
    monkeypatch.setattr(envs_module, "usable_cores", lambda: 2)
    spec = EnvConfig(id=ENV_ID, num_envs=4, envs_per_worker=per_worker, vectorization="async", worker_timeout_s=1.0, kwargs={"fail_in": fail_in, "how": how, "seed": 3, "pid_dir": str(tmp_path)})
    began = time.monotonic()
    with pytest.raises(EnvWorkerError) as raised:
        drive(spec, pipelined)
    first = "worker 0" if per_worker == 1 else "worker 0 (envs 0-1)"
    assert str(raised.value) == f"env {ENV_ID}: " + line.format(worker=worker, first=first)
    assert time.monotonic() - began < 20  # the 1 s bound and the workers' start, not a hang
    workers = 4 // per_worker
    pids = worker_pids(tmp_path)
    assert len(pids) == 1 + (workers // 2 if fail_in == "start" and pipelined else workers)  # the spaces probe, then workers; at start, a second group is never made
    assert not [pid for pid in pids if alive(pid)]


@pytest.mark.parametrize("fail_in", ["start", "close"])
def test_an_env_that_hangs_in_any_process_never_freezes_the_trainer(fail_in: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gymnasium's AsyncVectorEnv builds and closes one env in the calling process to read the
    spaces: an env whose constructor or close hangs there froze the trainer outside every bound.
    The spaces come from worker 0's env in a probe process, bounded like any worker. (SIGALRM ends
    the test, red, where the trainer's own process is stuck.)"""
    monkeypatch.syspath_prepend(str(STANDINS))
    spec = EnvConfig(id=ENV_ID, num_envs=4, vectorization="async", worker_timeout_s=1.0, kwargs={"fail_in": fail_in, "everywhere": True, "pid_dir": str(tmp_path)})

    def stuck(signum: int, frame: object) -> None:
        raise TimeoutError("the trainer's own process was stuck in the env for 10 s")

    previous = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(10)
    try:
        with pytest.raises(EnvWorkerError) as raised:
            make_vec_env(spec).close()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert str(raised.value) == f"env {ENV_ID}: worker 0's spaces probe did not answer {fail_in} within 1 s"
    (probe,) = worker_pids(tmp_path)  # no worker started
    assert not alive(probe)


@contextlib.contextmanager
def stuck_after(seconds: int):
    """Ends the test, red, where the trainer's own process is stuck for `seconds` (SIGALRM, as pytest-timeout would)."""
    def stuck(signum: int, frame: object) -> None:
        raise TimeoutError(f"the trainer's own process was stuck in the env for {seconds} s")

    previous = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("fail_in", ["start", "reset", "step", "close"])
def test_a_sync_env_that_hangs_in_the_trainers_own_process_fails_within_its_bound(fail_in: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`env.vectorization: sync` runs a user's envs in the trainer's process: env 3 of 4 that sleeps for ever
    in its constructor, a reset, a step or its close froze the run until the time limit. Now one line
    naming the env and the call, within env.worker_timeout_s."""
    monkeypatch.syspath_prepend(str(STANDINS))
    spec = EnvConfig(id=ENV_ID, num_envs=4, vectorization="sync", worker_timeout_s=1.0, kwargs={"fail_in": fail_in, "seed": 3, "everywhere": True})
    began = time.monotonic()
    with stuck_after(10), pytest.raises(EnvTimeout) as raised:
        drive(spec)
    assert str(raised.value) == f"env {ENV_ID}: {'start' if fail_in == 'start' else fail_in} did not return within 1 s (in the trainer's own process: env.vectorization sync)"
    assert time.monotonic() - began < 5


def test_a_bound_under_a_nanosecond_still_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """env.worker_timeout_s takes any positive number: one under a nanosecond, set as 0 ns, would disarm the timer
    and leave a hanging step unbounded. Each call fails at once instead, as the setting asks."""
    monkeypatch.syspath_prepend(str(STANDINS))
    spec = EnvConfig(id=ENV_ID, num_envs=2, vectorization="sync", worker_timeout_s=1e-10, kwargs={"fail_in": "step", "seed": 1, "everywhere": True})
    with stuck_after(10), pytest.raises(EnvTimeout, match=r"did not return within 1e-10 s"):
        drive(spec)


HANGING_STEPS = """
import os, time
from hpcrl.config.experiment import EnvConfig
from hpcrl.rl.env_deadline import EnvTimeout
from hpcrl.rl.envs import make_vec_env
SPEC = dict(id="failing_env:FailingEnv-v0", num_envs=2, vectorization="sync", worker_timeout_s=1.0)

def hang(said):
    envs = make_vec_env(EnvConfig(**SPEC, kwargs={"fail_in": "step", "seed": 1, "everywhere": True}))
    envs.reset(seed=0)
    began = time.monotonic()
    try:
        for _ in range(5):
            envs.step(envs.action_space.sample())
    except EnvTimeout as exc:
        print(f"{said}{exc} after {time.monotonic() - began:.0f} s", flush=True)
"""


def run_script(text: str) -> subprocess.CompletedProcess[str]:
    """`text` run by Python in a process of its own, with the stand-in envs importable."""
    path = os.pathsep.join([str(STANDINS), str(Path(__file__).resolve().parents[2])])
    return subprocess.run([sys.executable, "-c", text], env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, timeout=30)


def test_a_sync_env_is_bounded_in_a_process_where_no_other_alarm_is_set() -> None:
    """A trainer's process has no other timer (pytest-timeout's, under which the tests above run, is one):
    the bound is the only alarm there, and still fires."""
    done = run_script(HANGING_STEPS + "hang('')\n")
    assert done.stdout == f"env {ENV_ID}: step did not return within 1 s (in the trainer's own process: env.vectorization sync) after 1 s\n", done.stdout + done.stderr


def test_the_video_env_in_the_trainers_own_process_is_bounded_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(STANDINS))
    env = make_env_here(EnvConfig(id=ENV_ID, worker_timeout_s=1.0, kwargs={"fail_in": "step", "seed": 3, "everywhere": True}))
    env.reset(seed=3)
    with stuck_after(10), pytest.raises(EnvTimeout, match=f"^env {ENV_ID}: step did not return within 1 s"):
        for _ in range(5):
            env.step(0)


def test_a_bounded_call_keeps_another_alarm_of_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest-timeout, or a user's own signal.alarm, keeps its handler and its timer across the bounded
    calls: an alarm due during one reaches its handler, once, and nothing of ours fires later."""
    monkeypatch.syspath_prepend(str(STANDINS))
    envs = make_vec_env(EnvConfig(id=ENV_ID, num_envs=2, vectorization="sync", worker_timeout_s=5.0))
    envs.reset(seed=0)
    rang: list[float] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: rang.append(time.monotonic()))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        began = time.monotonic()
        while time.monotonic() - began < 0.8:
            envs.step(envs.action_space.sample())
        assert len(rang) == 1 and 0.25 < rang[0] - began < 0.6, rang
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        envs.close()


def test_each_alarm_of_the_process_due_during_calls_reaches_its_handler_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """400 alarms, each due among a stream of bounded calls, with threads beside the main one that the kernel may give
    the signal to: each reaches its handler exactly once, and the bound's own timer leaves theirs as it was. On one
    timer shared with them, an alarm due while it was read and replaced reached its handler twice (61 of 8,000 on the
    2-core VM), and one less than a microsecond from its time, read as 0, never (once in 400 in CI)."""
    monkeypatch.syspath_prepend(str(STANDINS))
    envs = make_vec_env(EnvConfig(id=ENV_ID, num_envs=2, vectorization="sync", worker_timeout_s=5.0))
    envs.reset(seed=0)
    idle = threading.Event()
    for _ in range(3):
        threading.Thread(target=idle.wait, daemon=True).start()
    counts: list[int] = []
    try:
        for _ in range(400):
            rang: list[float] = []
            previous = signal.signal(signal.SIGALRM, lambda signum, frame, rang=rang: rang.append(time.monotonic()))
            signal.setitimer(signal.ITIMER_REAL, 0.002, 3600.0)
            began = time.monotonic()
            while time.monotonic() - began < 0.004:
                envs.step(envs.action_space.sample())
            assert signal.getitimer(signal.ITIMER_REAL)[1] == 3600.0  # theirs, reloaded by the kernel, not stopped by us
            time.sleep(0.001)
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            counts.append(len(rang))
        assert counts == [1] * 400, {n: counts.count(n) for n in set(counts)}
    finally:
        idle.set()
        envs.close()


FORKED_CHILD = HANGING_STEPS + """
envs = make_vec_env(EnvConfig(**SPEC))
envs.reset(seed=0)
envs.step(envs.action_space.sample())  # the parent's timer made
pid = os.fork()
if pid == 0:
    hang("child: ")
    os._exit(0)
_, status = os.waitpid(pid, 0)
envs.step(envs.action_space.sample())
print(f"parent: child ended with {status}, a step after it")
"""


def test_a_forked_child_s_calls_are_bounded_by_a_timer_of_its_own() -> None:
    """A forked child has none of its parent's timers: its bound, armed on the parent's, never fired, and its hang
    ran on unbounded. It makes its own at its first call, and the parent's still bounds the parent."""
    done = run_script(FORKED_CHILD)
    assert done.stdout == (
        f"child: env {ENV_ID}: step did not return within 1 s (in the trainer's own process: env.vectorization sync) after 1 s\n"
        "parent: child ended with 0, a step after it\n"
    ), done.stdout + done.stderr


IGNORED_AND_BLOCKED = HANGING_STEPS + """
import signal
from hpcrl.rl.env_deadline import DEADLINE_SIGNAL
signal.signal(DEADLINE_SIGNAL, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_BLOCK, [DEADLINE_SIGNAL])
hang('')
"""


def test_a_process_started_with_the_bound_s_signal_ignored_and_blocked_is_bounded() -> None:
    """An ignored signal and a blocked mask are inherited through exec (a launcher may set both): nobody here handles
    the signal, so the bound takes it and lets it in, where refusing would fail a run its user did nothing to, and a
    blocked signal would leave the hang unbounded."""
    done = run_script(IGNORED_AND_BLOCKED)
    assert done.stdout == f"env {ENV_ID}: step did not return within 1 s (in the trainer's own process: env.vectorization sync) after 1 s\n", done.stdout + done.stderr


def test_a_process_where_the_bound_s_signal_has_another_handler_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound's signal taken over by someone else's handler would make each expiry theirs, and the hang unbounded:
    the first call says so, and nothing of theirs is replaced."""
    monkeypatch.syspath_prepend(str(STANDINS))
    envs = make_vec_env(EnvConfig(id=ENV_ID, num_envs=2, vectorization="sync", worker_timeout_s=5.0))
    envs.reset(seed=0)

    def theirs(signum: int, frame: object) -> None:
        pass

    previous = signal.signal(DEADLINE_SIGNAL, theirs)
    try:
        with pytest.raises(EnvTimeout) as raised:
            envs.step(envs.action_space.sample())
        assert signal.getsignal(DEADLINE_SIGNAL) is theirs
    finally:
        signal.signal(DEADLINE_SIGNAL, previous)
        envs.close()
    assert str(raised.value) == (
        f"env {ENV_ID}: signal {int(DEADLINE_SIGNAL)} (SIGRTMIN+2), which bounds the calls into an env in the trainer's own process, "
        "has another handler here: set env.vectorization: async"
    )


def test_a_sync_env_stepped_from_a_background_thread_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Signal handlers run in the main thread only: a user's sync env stepped elsewhere (train.async_rollout:
    true) could not be bounded, and is refused at its first call instead of running unbounded."""
    monkeypatch.syspath_prepend(str(STANDINS))
    envs = make_vec_env(EnvConfig(id=ENV_ID, num_envs=2, vectorization="sync", worker_timeout_s=5.0))
    raised: list[BaseException] = []

    def rollout() -> None:
        try:
            envs.reset(seed=0)
        except EnvTimeout as exc:
            raised.append(exc)

    thread = threading.Thread(target=rollout, name=THREAD_NAME)
    thread.start()
    thread.join(10)
    envs.close()
    assert len(raised) == 1 and str(raised[0]).startswith(f"env {ENV_ID}: reset was called from thread 'hpcrl-rollout'")
    assert str(raised[0]).endswith("set env.vectorization: async")


@pytest.mark.parametrize("vectorization", ["sync", "async"])
@pytest.mark.parametrize(
    ("lie", "what"),
    [("shape", "an observation of shape (5,), not its observation space's (4,)"), ("nan", "an observation holding nan at index (1,)")],
)
def test_an_env_that_returns_what_its_space_cannot_hold_is_named(vectorization: str, lie: str, what: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Env 3 of 4 returns, at its third step, an observation of another shape or with a NaN: one
    line naming the env and what it returned (and, in workers, the worker), not numpy's "all input
    arrays must have the same shape" nor, later, a non-finite loss blamed on train.lr."""
    monkeypatch.syspath_prepend(str(STANDINS))
    envs = make_vec_env(EnvConfig(id=ENV_ID, num_envs=4, envs_per_worker=2, vectorization=vectorization, worker_timeout_s=5.0, kwargs={"lie": lie, "seed": 3}))
    try:
        envs.reset(seed=0)
        with pytest.raises(EnvOutputError) as raised:
            for _ in range(5):
                envs.step(envs.action_space.sample())
    finally:
        envs.close()
    assert str(raised.value) == f"env {ENV_ID}: step returned {what}" + (" (worker 1, envs 2-3)" if vectorization == "async" else "")


def test_workers_whose_envs_have_other_spaces_than_the_probe_read_fail_their_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An env whose observation space in the workers is not the one the spaces probe read (Box(5) against
    Box(4)): one line at the start naming the worker and both spaces, not a shape error at the first step;
    no worker left."""
    monkeypatch.syspath_prepend(str(STANDINS))
    spec = EnvConfig(id=ENV_ID, num_envs=4, envs_per_worker=2, vectorization="async", worker_timeout_s=5.0, kwargs={"lie": "space", "pid_dir": str(tmp_path)})
    with pytest.raises(EnvWorkerError) as raised:
        drive(spec)
    assert str(raised.value).startswith(f"env {ENV_ID}: worker 0 (envs 0-1) built envs with observation space Box(-1.0, 1.0, (5,), float32) and action space Discrete(2), where the spaces probe's had Box(-1.0, 1.0, (4,), float32)")
    assert not [pid for pid in worker_pids(tmp_path) if alive(pid)]


def test_a_well_behaved_env_closes_its_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(STANDINS))
    envs = make_vec_env(EnvConfig(id=ENV_ID, num_envs=4, envs_per_worker=2, vectorization="async", worker_timeout_s=5.0, kwargs={"pid_dir": str(tmp_path)}))
    envs.reset(seed=0)
    for _ in range(30):  # past the 20-step episodes: autoreset inside the workers
        envs.step(envs.action_space.sample())
    envs.close()
    assert len(worker_pids(tmp_path)) == 1 + 2 and not [pid for pid in worker_pids(tmp_path) if alive(pid)]


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux's scheduling classes")
def test_env_workers_and_what_their_envs_start_never_preempt_the_trainer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers, and the processes their envs start (a ViZDoom game's engine), run in Linux's batch class, so that
    a worker woken by its actions does not take the core from the rollout thread before it has sent the other
    workers theirs (env_workers._never_preempting); the trainer keeps its own class."""
    with simulators(tmp_path, monkeypatch, "batch_env") as found:
        monkeypatch.syspath_prepend(str(tmp_path / "own"))
        kwargs = {"pid_file": str(found.pid_file), "queue": str(found.queue), "held": str(found.held)}
        envs = make_vec_env(EnvConfig(id="batch_env:WithSimulator-v0", num_envs=4, envs_per_worker=2, vectorization="async", worker_timeout_s=30.0, kwargs=kwargs))
        try:
            envs.reset(seed=0)
            envs.step(envs.action_space.sample())
            workers = [p.pid for p in multiprocessing.active_children() if p.name.startswith("EnvWorker-")]
            started = found.alive()
            assert len(workers) == 2 and len(started) == 4, (workers, started)
            assert {pid: os.sched_getscheduler(pid) for pid in workers + started} == dict.fromkeys(workers + started, os.SCHED_BATCH)
            assert os.sched_getscheduler(0) == os.SCHED_OTHER
        finally:
            envs.close()


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's scheduling classes")
def test_a_worker_of_a_run_started_in_another_class_keeps_that_class() -> None:
    """A run started at background priority (`chrt --idle`, to leave a shared node to others) keeps its workers
    there: only the normal class is left for the batch class. The check runs in a thread, whose class is its own."""
    seen = []

    def worker_start() -> None:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: this thread, started as the run was
        env_workers._never_preempting()
        seen.append(os.sched_getscheduler(0))

    thread = threading.Thread(target=worker_start)
    thread.start()
    thread.join(60)
    assert seen == [os.SCHED_IDLE]


@pytest.mark.e2e
def test_sweep_with_a_worker_hanging_in_step_ends_failed_with_one_line(tmp_path: Path) -> None:
    """`hpcrl sweep --scheduler local` of a user's env whose worker 3 sleeps for ever in `step`:
    the run ends FAILED with that one line a few seconds after the 3 s bound, no worker left
    (before worker waits were bounded, the run stayed "running" until killed)."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    env = {"id": ENV_ID, "num_envs": 4, "envs_per_worker": 1, "vectorization": "async", "worker_timeout_s": 3, "kwargs": {"fail_in": "step", "seed": 3, "pid_dir": str(pid_dir)}}
    config = write_config(tmp_path, {"env": env, "sweep": {"seeds": [0]}})
    path = os.pathsep.join([str(STANDINS), *filter(None, [os.environ.get("PYTHONPATH")])])
    # A /dev/shm of its own where it can: the job's end removes the ViZDoom files nobody holds, and in the fresh suite
    # at f34adad it found another test's (`simulators`: a queue its killed trainer had held), one more line in the log.
    prefix = own_shm(tmp_path / "shm") or []
    proc = subprocess.Popen([*prefix, sys.executable, "-m", "hpcrl", "sweep", str(config), "--scheduler", "local"], cwd=tmp_path, env={**os.environ, "PYTHONPATH": path}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    began = time.monotonic()
    try:
        output, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # the local executor stops its jobs, the hung one included
        try:
            output, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        pytest.fail(f"the sweep still ran after 120 s:\n{output}")
    took = time.monotonic() - began
    line = f"env {ENV_ID}: worker 3 did not answer step within 3 s"
    exp = tmp_path / "logs" / "tiny"
    (run_dir,) = (exp / "runs").iterdir()
    assert (run_dir / "FAILED").read_text() == line + "\n", output
    (log,) = (exp / "jobs" / "logs").glob("train-*.out")
    assert log.read_text() == f"hpcrl: error: {run_dir.name}: train failed: {line}\n"  # the job's whole output: no traceback
    assert took < 90, output
    assert len(worker_pids(pid_dir)) == 1 + 4 and not [pid for pid in worker_pids(pid_dir) if alive(pid)]  # the spaces probe and the workers


TRAINER = """
import sys
sys.path.insert(0, sys.argv[1])
from hpcrl.config.experiment import EnvConfig
from hpcrl.rl.envs import make_vec_env
envs = make_vec_env(EnvConfig(id="failing_env:FailingEnv-v0", num_envs=4, envs_per_worker=int(sys.argv[3]), vectorization="async", worker_timeout_s=600, kwargs={"fail_in": "step", "seed": 3, "pid_dir": sys.argv[2]}))
envs.reset(seed=0)
print("stepping", flush=True)
for _ in range(5):
    envs.step(envs.action_space.sample())
"""


@pytest.mark.e2e
@pytest.mark.parametrize("per_worker", [1, 2])
def test_env_workers_die_with_a_trainer_killed_while_one_hangs(per_worker: int, tmp_path: Path) -> None:
    """A trainer SIGKILLed (an OOM kill) while the worker of env 3 hangs in its step, inside its 600 s bound: every
    worker (of one env or of two) is gone within seconds. The idle ones saw their pipe close; the hung one never reads it,
    and lived on for ever before."""
    path = os.pathsep.join([str(Path(__file__).resolve().parents[2]), *filter(None, [os.environ.get("PYTHONPATH")])])
    scratch = tmp_path.with_name(tmp_path.name + "-tmp")  # the killed trainer's workers' directory stays there (kill -9 runs no cleanup)
    scratch.mkdir()
    env = {**os.environ, "PYTHONPATH": path, "TMPDIR": str(scratch)}
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(STANDINS), str(tmp_path), str(per_worker)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert trainer.stdout is not None and trainer.stdout.readline() == "stepping\n"
        time.sleep(1.0)  # worker 3 is in its endless step by now
        assert trainer.poll() is None
        trainer.kill()
        trainer.wait(10)
        deadline = time.monotonic() + 5
        while [pid for pid in worker_pids(tmp_path) if alive(pid)] and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [pid for pid in worker_pids(tmp_path) if alive(pid)]
    finally:
        for pid in worker_pids(tmp_path):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert len(worker_pids(tmp_path)) == 1 + 4 // per_worker and not left


ENGINE_ENV = '''
import os, subprocess, sys, shutil, tempfile
import gymnasium
from gymnasium.envs.classic_control import CartPoleEnv


class WithEngine(CartPoleEnv):
    """CartPole with what a ViZDoom game has: an engine process of its own, a temporary directory, and a file in
    /dev/shm named as ViZDoom names its message queues, held open by this process alone (as a game's controller
    holds its queues before its engine opens them), all ended by `close` (and by nothing else)."""

    def __init__(self, record, tag, **kwargs):
        super().__init__(**kwargs)
        self.directory = tempfile.mkdtemp(prefix="engine-")
        self.queue = f"/dev/shm/ViZDoomMQCtr{tag}-{os.path.basename(self.directory)}"
        self.held = os.open(self.queue, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self.engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(record, "a") as f:
            f.write(f"{self.engine.pid} {os.getpid()} {self.directory}\\n")

    def close(self):
        self.engine.kill()
        self.engine.wait()
        shutil.rmtree(self.directory)
        os.close(self.held)
        os.unlink(self.queue)


gymnasium.register("WithEngine-v0", entry_point=WithEngine, max_episode_steps=500)
'''

ENDING = """
import os, signal, sys
from hpcrl.config.experiment import EnvConfig
from hpcrl.rl.env_workers import EnvWorkerError
from hpcrl.rl.envs import make_vec_env
envs = make_vec_env(EnvConfig(id="engine_env:WithEngine-v0", num_envs=4, envs_per_worker=2, vectorization="async", kwargs={"record": sys.argv[2], "tag": sys.argv[3]}))
envs.reset(seed=0)
envs.step(envs.action_space.sample())
if sys.argv[1] == "raise":
    raise RuntimeError("the user's script fails")
if sys.argv[1] == "close-fails":  # the exit's own close raises (seen with /dev/shm full): the exit must not hang
    from hpcrl.rl.env_workers import Workers
    def fails(self, *args, **kwargs):
        raise OSError("no room")
    Workers.close_extras = fails
if sys.argv[1] == "kill-worker":
    os.kill(int(open(sys.argv[2]).read().splitlines()[-1].split()[1]), signal.SIGKILL)  # a worker's (the first line is the probe's)
    try:
        envs.step(envs.action_space.sample())
    except EnvWorkerError as exc:
        print(exc)
        envs.close()
"""


@pytest.mark.e2e
@pytest.mark.parametrize("ending", ["exit", "raise", "kill-worker", "close-fails"])
def test_a_program_ending_without_closing_its_workers_leaves_no_engine_and_no_file(ending: str, tmp_path: Path) -> None:
    """A script that builds envs in workers and ends without closing them (it returns, or raises): no env's
    engine process lives on, and no temporary file stays. Before, multiprocessing's exit hook SIGTERMed the
    workers alone, and every ViZDoom engine lived on as an orphan, its directory in /tmp. A worker killed from
    outside (an OOM kill): its envs' engines and files go with the workers' close. Its engines, orphaned before the
    trainer heard of it, lived on (outside a job's keeper) for ever, and the shared memory it alone held stayed in
    /dev/shm. A close at the exit that raises: the workers are killed, and the exit does not wait for ever on them
    (they ignore the SIGTERM that multiprocessing's exit hook sends before it joins them without a bound)."""
    (tmp_path / "engine_env.py").write_text(ENGINE_ENV)
    (tmp_path / "tmp").mkdir()
    record = tmp_path / "engines.txt"
    path = os.pathsep.join([str(tmp_path), str(Path(__file__).resolve().parents[2]), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path, "TMPDIR": str(tmp_path / "tmp")}
    tag = f"-hpcrl-test-{uuid.uuid4().hex[:12]}"
    done = subprocess.run([sys.executable, "-c", ENDING, ending, str(record), tag], env=env, capture_output=True, text=True, timeout=120)
    engines = [int(line.split()[0]) for line in record.read_text().splitlines()]
    try:
        assert done.returncode == (1 if ending == "raise" else 0), done.stderr[-2000:]
        if ending == "kill-worker":
            assert re.search(r"worker \d \(envs \d-\d\) was killed by SIGKILL during step", done.stdout), done.stdout
        assert len(engines) == 5  # the probe's own env and the four in workers
        assert not list((tmp_path / "tmp").iterdir())
        deadline = time.monotonic() + 5
        while [pid for pid in engines if alive(pid)] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in engines if alive(pid)]
        assert not glob.glob(f"/dev/shm/*{tag}*")
    finally:
        for pid in engines:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        for path in glob.glob(f"/dev/shm/*{tag}*"):
            os.unlink(path)
