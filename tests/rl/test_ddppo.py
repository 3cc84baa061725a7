"""DD-PPO (issue 16): one run as several ranks over torch.distributed.

What a user relies on:
- 2 ranks x 4 envs take the same optimiser step as 1 rank x 8 envs on the same batch (gloo, CPU),
  from the same gradient (before the clip): the gradient, advantage normalisation and observation statistics are averaged over the ranks,
  so the policy learns as one big batch would, and the ranks never drift apart;
- a 2-rank CartPole PPO run learns (final eval >= 475): learning is the algorithm's, which the same-step test
  pins rank for rank; the learning runs are the multi-node tests' (tests/e2e/test_multinode_slurm.py and
  test_sge_multihost.py: 2 ranks on two Slurm nodes and on two Grid Engine hosts, each through a lost node),
  so the suite pays for no third one here; that real Slurm (srun, 2 tasks) and real Grid Engine (a PE with 2
  slots on one host) start both ranks as one group is the warned and killed runs' part, on every backend;
- a warned 2-rank run checkpoints once (rank 0, at the iteration every rank stops at), is requeued,
  and both ranks resume from that checkpoint: no step twice, none lost;
- kill -9 of one rank fails the run within the collective timeout with the reason, and no process
  of the run is left, nor what its env started (a simulator and its file in /dev/shm);
- the ranks are torch's own environment, so `torchrun --standalone` starts a run as well.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch
from factories import simulators
from test_conformance import Backend, Local, backend, csv_rows, processes_of, status_text, sweep, wait_finished, wait_until  # noqa: F401 (backend: a fixture)

from hpcrl.config.hparams import A2CConfig, PPOConfig
from hpcrl.rl.a2c import A2C
from hpcrl.rl.ddp import Ranks
from hpcrl.rl.ppo import PPO
from hpcrl.store import rundir
from hpcrl.store.expdir import load_runs, read_jobs, run_dir

REPO = Path(__file__).resolve().parents[2]
ALGOS = {"ppo": (PPO, PPOConfig), "a2c": (A2C, A2CConfig)}
SETTINGS = {
    "ppo": {"num_steps": 16, "num_minibatches": 1, "update_epochs": 4, "norm_adv": True, "clip_vloss": True, "normalize_obs": True, "hidden_sizes": [16]},
    "a2c": {"num_steps": 5, "norm_adv": True, "normalize_obs": True, "hidden_sizes": [16]},
}


# ------------------------------------------------------------------------------ the same gradient step


def _agent(algo: str, num_envs: int, ranks: Ranks | None = None) -> Any:
    cls, config = ALGOS[algo]
    torch.manual_seed(0)
    envs = gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync")
    return cls(config(**SETTINGS[algo]), envs, torch.device("cpu"), 0, ranks)


def _batch(rollout: dict[str, torch.Tensor], cols: slice) -> dict[str, Any]:
    """The update's batch of the envs `cols` of a (T, N, ...) rollout, flattened time-major as OnPolicyAgent.batch does."""
    return {k: v[:, cols].reshape(-1, *v.shape[2:]) for k, v in rollout.items()}


def _record_gradients(agent: Any) -> list[torch.Tensor]:
    """The gradient of each optimiser step as it reaches the clip (after the all-reduce, if any).
    The weights alone cannot show a gradient summed over ranks instead of averaged: the clip (every
    update here) and Adam's and RMSprop's scale-free steps take the same step from either."""
    seen: list[torch.Tensor] = []
    reduce = agent.gradient_step.reduce

    def record(grad: torch.Tensor) -> None:
        if reduce is not None:
            reduce(grad)
        seen.append(grad.clone())

    agent.gradient_step.reduce = record
    return seen


def _rank(rank: int, port: int, algo: str, rollout: dict[str, torch.Tensor], start: torch.Tensor, results: Any, run_dir: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True")
    torch.set_num_threads(1)
    ranks = Ranks(rank, 2, rank, "env")
    ranks.init(run_dir, torch.device("cpu"), 60)
    agent = _agent(algo, 4, ranks)
    assert torch.equal(agent.gradient_step.flat.detach(), start), "rank 0's initial weights were not broadcast"
    cols = slice(4 * rank, 4 * rank + 4)
    gradients = _record_gradients(agent)
    agent.update(_batch(rollout, cols))
    agent.policy.obs_norm.update(rollout["obs"][:, cols], ranks.moments)
    norm = agent.policy.obs_norm
    # numpy, pickled by value: a torch tensor crosses a Queue as a shared handle that dies with this process
    results.put((rank, agent.gradient_step.flat.detach().numpy().copy(), gradients[0].numpy().copy(), norm.mean.numpy().copy(), norm.var.numpy().copy(),
                 float(norm.count)))  # fmt: skip
    ranks.close()


@pytest.mark.e2e
@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_two_ranks_of_4_envs_take_the_step_of_one_rank_of_8(algo: str, tmp_path: Path) -> None:
    from torch.distributed import TCPStore

    one = _agent(algo, 8)
    one.collect()
    adv, returns = one.advantages()
    rollout = {"obs": one.obs, "actions": one.actions, "logprobs": one.logprobs, "values": one.values, "adv": adv, "returns": returns,
               "firsts": torch.as_tensor(one.firsts)}  # fmt: skip
    start = one.gradient_step.flat.detach().clone()
    gradients = _record_gradients(one)
    one.update(one.batch(adv, returns))
    one.policy.obs_norm.update(one.obs)
    expected = one.gradient_step.flat.detach()
    assert (expected - start).abs().max() > 1e-4, "the reference update did not move the weights"

    store = TCPStore("127.0.0.1", 0, 3, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, store.port, algo, rollout, start, results, tmp_path)) for r in range(2)]
    for p in procs:
        p.start()
    got = sorted((results.get(timeout=120) for _ in procs), key=lambda r: r[0])
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    (_, w0, g0, m0, v0, c0), (_, w1, g1, m1, v1, c1) = [(r, *map(torch.from_numpy, arrays), c) for r, *arrays, c in got]
    assert torch.equal(w0, w1), "the ranks' weights drifted apart"
    torch.testing.assert_close(w0, expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(g0, g1)
    torch.testing.assert_close(g0, gradients[0], rtol=1e-5, atol=1e-7)  # the mean of the ranks' gradients, not their sum
    norm = one.policy.obs_norm
    assert c0 == c1 == float(norm.count) and torch.equal(m0, m1) and torch.equal(v0, v1)
    torch.testing.assert_close(m0, norm.mean, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(v0, norm.var, rtol=1e-7, atol=1e-9)

    # The test can fail: one rank's half of the batch alone takes a visibly different step.
    half = _agent(algo, 4)
    half.update(_batch(rollout, slice(0, 4)))
    assert (half.gradient_step.flat.detach() - expected).abs().max() > 1e-4


def _collectives(rank: int, port: int, results: Any, run_dir: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True")
    ranks = Ranks(rank, 2, rank, "env")
    ranks.init(run_dir, torch.device("cpu"), 60)
    results.put((rank, ranks.any(False), ranks.any(rank == 1), ranks.gather([f"episode {rank}.0", f"episode {rank}.1"])))
    ranks.close()


@pytest.mark.e2e  # two rank processes over gloo: 4-5 CPU-seconds, at --fast's 5 CPU-second line (failed it 2 times in 4 this stop)
def test_a_warning_on_one_rank_stops_every_rank_and_rank_0_gathers_every_ranks_episodes(tmp_path: Path) -> None:
    """The ranks stop at the same iteration: a warning one rank saw stops all, no warning stops none;
    rank 0 logs the episodes of every rank. One rank (no process group) answers alone."""
    from torch.distributed import TCPStore

    single = Ranks.single()
    assert single.any(True) is True and single.any(False) is False and single.gather([1, 2]) == [1, 2]
    store = TCPStore("127.0.0.1", 0, 3, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_collectives, args=(r, store.port, results, tmp_path)) for r in range(2)]
    for p in procs:
        p.start()
    got = sorted((results.get(timeout=120) for _ in procs), key=lambda r: r[0])
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert got == [(0, False, True, ["episode 0.0", "episode 0.1", "episode 1.0", "episode 1.1"]), (1, False, True, [])]


# ------------------------------------------------------------------------------ runs on every backend


SINGLE_HOST = pytest.mark.parametrize("backend", ["local", pytest.param("slurm", marks=pytest.mark.slurm)], indirect=True)
"""Local and Slurm. Grid Engine's is its two-host run (tests/e2e/test_sge_multihost.py), which covers more: the
warning reaches the job on its first host only and the launcher carries it to the rank started there with
`qrsh -inherit`; a rank killed on the other host. The same on one host was a third of the suite's time of each."""


@pytest.mark.e2e
@SINGLE_HOST
def test_warned_two_rank_run_resumes_on_both_ranks(backend: Backend, tmp_path: Path) -> None:  # noqa: F811 (the fixture)
    since = time.time()
    exp_dir, _ = sweep(tmp_path, backend, "sweep.seeds=[0]", "resources.ranks=2", "train.total_steps=20480", "train.checkpoint_every=5")
    train = read_jobs(exp_dir)[0]
    (run,) = load_runs(exp_dir)
    rd = run_dir(exp_dir, run.run_id)
    wait_until("the first checkpoint", lambda: any((rd / "checkpoints").glob("*.pt")), 180)
    backend.warn(exp_dir, train, 1)
    wait_finished(exp_dir, backend, since)

    log = "".join(p.read_text() for p in sorted((exp_dir / "jobs" / "logs").glob("train-*")))
    signalled = re.findall(r"signal \S+ at step (\d+): checkpointed", log)
    resumed = dict(re.findall(r"\(rank (\d)/2\): resumed from step (\d+)", log))
    assert len(signalled) == 1 and resumed == {"0": signalled[0], "1": signalled[0]}, log  # one checkpoint, by rank 0; both ranks resumed from it
    resumed = [signalled[0]]
    assert 0 < int(resumed[0]) < 20480
    steps = [int(r["step"]) for r in csv_rows(rd / "train.csv")]
    assert steps == sorted(set(steps)) and steps[-1] == 20480, steps  # no step twice, none lost
    assert (rd / "DONE").exists() and (rd / "EVAL_DONE").exists()
    print(f"\n{backend.name}: 2-rank run warned at step {signalled[0]}, resumed on both ranks from step {resumed[0]}")


# Two ranks that leave for a requeue, the way `hpcrl train` does; rank 0's interpreter takes 3 s to shut
# down after its own signal handlers are gone (a stand-in for torch's teardown at exit, which under load
# takes long enough), so rank 1's exit comes first and srun ends the step while rank 0 is still there.
LEAVE_FOR_REQUEUE = """
import sys, time
from pathlib import Path
import torch
from hpcrl.runtime.guard import StopFlag
from hpcrl.rl.ddp import Ranks
stop = StopFlag()
ranks = Ranks.from_env()
ranks.init(Path(sys.argv[1]), torch.device("cpu"), 60)
if ranks.is_main:
    class SlowTeardown:
        def __del__(self, sleep=time.sleep):
            sleep(3)
    slow = SlowTeardown()
ranks.leave_for_requeue()
sys.exit(99)
"""


@pytest.mark.slurm
def test_a_rank_leaving_for_a_requeue_after_its_peer_still_asks_for_the_requeue(slurm_cluster: None, tmp_path: Path) -> None:
    """srun ends the step at the first non-zero exit: the rank still shutting down must exit 99 all the
    same, or srun reports it "Terminated" and the job fails instead of being requeued (seen in CI)."""
    script = tmp_path / "leave.py"
    script.write_text(LEAVE_FOR_REQUEUE)
    env = {**os.environ, "HPCRL_LAUNCH_ID": f"leave.{os.getpid()}", "MASTER_ADDR": "127.0.0.1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        ["srun", "--kill-on-bad-exit=1", "--nodes=1", "--ntasks=2", "--cpus-per-task=1", "--time=2", sys.executable, str(script), str(tmp_path)],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert "Terminated" not in proc.stderr and proc.returncode == 99, proc.stderr


def _rank_pids(exp_dir: Path) -> dict[int, int]:
    """Rank -> pid of the run's rank processes (`hpcrl train` with RANK in its environment)."""
    found = {}
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            cmd = (environ.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = dict(kv.split("=", 1) for kv in environ.read_bytes().decode(errors="replace").split("\0") if "=" in kv)
        except OSError:
            continue
        rank = env.get("RANK", env.get("SLURM_PROCID"))
        if str(exp_dir) in cmd and " train " in cmd and "python" in cmd and rank is not None and "srun" not in cmd:
            found[int(rank)] = int(environ.parent.name)
    return found


@pytest.mark.e2e
@pytest.mark.parametrize("backend", ["local", pytest.param("slurm", marks=pytest.mark.slurm), pytest.param("sge", marks=pytest.mark.sge)], indirect=True)
def test_a_rank_killed_fails_the_run_with_its_reason_and_leaves_no_process(backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811 (the fixture)
    """Each rank's env (CartPole) starts a process of its own that holds a file in /dev/shm, as ViZDoom's engine
    does (tests/factories.py). The killed rank's is orphaned: Slurm's proctrack/linuxproc (the test cluster's) loses
    it, and the job ends it on every node in a step after the ranks' (HPCRL_STEP_MARK); Grid Engine ends it with the
    job but leaves its file, and hpcrl's launcher, once it has stopped the ranks, ends both.
    Grid Engine's run here is a few seconds; its rank killed on another host is test_sge_multihost.py's."""
    since = time.time()
    with simulators(tmp_path, monkeypatch, f"simenvs_ranks_{backend.name}") as sims:
        exp_dir, _ = sweep(
            tmp_path, backend, "sweep.seeds=[0]", "resources.ranks=2", "resources.collective_timeout=30", "train.total_steps=10000000",
            "env.num_envs=1", *sims.overrides,
        )  # fmt: skip
        (run,) = load_runs(exp_dir)
        rd = run_dir(exp_dir, run.run_id)
        wait_until("the first checkpoint", lambda: any((rd / "checkpoints").glob("*.pt")), 180)
        pids = _rank_pids(exp_dir)
        assert sorted(pids) == [0, 1], pids
        assert len(sims.pids()) == 2 and sims.held.exists(), sims.pids()
        killed = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        wait_until("the run to fail", lambda: rundir.is_failed(rd), 30)
        # The run's ranks end within the launcher's grace (under srun, the collective timeout's). The job shell
        # follows when its step has ended: under srun, once no process holds the step's output, the orphaned
        # simulator too, which Slurm ends after its KillWait. The evaluation and aggregate tasks that follow a
        # failed training are the experiment's next stages, not leftovers of the run.
        wait_until("every rank of the run to exit", lambda: not _rank_pids(exp_dir), 60)
        took = time.monotonic() - killed
        wait_until("every training process of the run to exit", lambda: not _training_processes(exp_dir), 120)
        reason = rundir.reason(rd, rundir.FAILED)
        wait_finished(exp_dir, backend, since, timeout=120)
        wait_until("every process of the experiment to exit", lambda: not processes_of(exp_dir), 60)
        alive, left = sims.alive(), sims.left()
    # hpcrl's launcher saw the rank die; under srun, the rank that was left saw its peer leave.
    expected = "a collective failed, another rank has left the run" if backend.name == "slurm" else "rank 1 of 2 was killed by SIGKILL"
    assert expected in reason, reason
    log = "".join(p.read_text() for p in (exp_dir / "jobs" / "logs").glob("train-*"))
    assert not alive, f"the killed rank's simulator(s) {alive} outlived its job:\n{log[-2000:]}"
    assert not left, f"left in /dev/shm: {left}\n{log[-2000:]}"
    # The killed rank's simulator, and the other rank's where the end of the ranks came before its env's close: under
    # srun, named by the step after the ranks' on each node; under hpcrl's launcher, by the launcher.
    who = r"the job's ranks \(srun, exit 137\)" if backend.name == "slurm" else r"the run's ranks \(exit 1\)"
    assert re.search(rf"hpcrl: {who} left [12] process\(es\) running: pid \d+ \(.*time\.sleep\(600\)", log), log[-2000:]
    assert f"removed the shared memory they left: {sims.held}" in log, log[-2000:]
    print(
        f"\n{backend.name}: kill -9 of rank 1: the run failed and its ranks were gone {took:.1f} s later, the evaluation and "
        f"aggregate after it {time.monotonic() - killed:.1f} s: {reason.strip()}"
    )
    assert took < 30


def _training_processes(exp_dir: Path) -> list[str]:
    """Command lines of the experiment's training: its train job shells, launchers and ranks."""
    return [c for c in processes_of(exp_dir) if " train " in c or "/jobs/train-" in c]


@pytest.mark.e2e
def test_torchrun_starts_a_run_as_well(tmp_path: Path) -> None:
    """The ranks read torch's own environment: a user's `torchrun --standalone` works too."""
    exp_dir, _ = sweep(tmp_path, Local(), "sweep.seeds=[0]", "resources.ranks=2", "train.total_steps=4096", "resources.max_concurrent=1")
    wait_finished(exp_dir, Local(), time.time() - 600, timeout=180)
    (run,) = load_runs(exp_dir)
    rd = run_dir(exp_dir, run.run_id)
    for name in ("DONE", "train.csv"):
        (rd / name).unlink()
    for ckpt in (rd / "checkpoints").glob("*.pt"):  # trained again from the start, by torchrun's ranks
        ckpt.unlink()
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "hpcrl", "train", str(exp_dir), "--task", "0"],
        capture_output=True, text=True, timeout=180, cwd=REPO, env={**os.environ, "TMPDIR": str(tmp_path)},  # torchrun's log folder (torchelastic_*) stays
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (rd / "DONE").exists() and csv_rows(rd / "train.csv")[-1]["step"] == "4096"
