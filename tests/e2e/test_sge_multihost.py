"""Grid Engine across execution hosts, and through a host that dies (issue 36).

The cell is tests/clusters/sge.sh's, started with the hosts of tests/clusters/suite.env (2): qmaster and the execd of all.q on this host,
and sge-host1..2, each a real sge_execd in its own network and UTS namespace with its own address on a
private bridge, in queue multi.q. multi.q carries the FORCED complex `multihost`: only a job that asks
`-l multihost=TRUE` runs there (ON_HOSTS), so no other test's job lands on a host these tests kill.
A host "dies" as a host does: its link goes down and every process on it is killed at once
(`sge.sh kill-host`); qmaster marks it unknown once its load reports stop (max_unheard) and reschedules its
rerunnable jobs (reschedule_unknown, as sites set it).

- nodes > 1 over a PE that keeps to one host ($pe_slots) is refused at sweep time, in one line;
- a sweep's array tasks, and its train -> eval -> aggregate, spread over both hosts (qacct's hostname);
- DD-PPO, 2 hosts x 1 rank in the parallel environment `mpi` ($round_robin, control_slaves TRUE): the
  launcher reads $PE_HOSTFILE and starts the other host's rank with `qrsh -inherit`; the ranks ran on two
  hosts, and when rank 1's host is killed the run restarts whole from its checkpoint and runs to its budget;
- a warned 2-host run checkpoints on every rank, is rescheduled and resumes on both;
- a rank killed on the other host fails the run with its reason and leaves no process anywhere;
- a host killed mid-training: its task is rescheduled onto the other host and resumes from its checkpoint;
- partitions: a cut-off host's train task is rescheduled and never trained twice; a DD-PPO run whose other host
  is cut off restarts whole on the host left, and its cut-off rank ends at its collective timeout; a cut-off
  AlphaZero trainer keeps its run alone, its self-play jobs stop with one line, and the run resumes after.

The tests hold one lock for the whole test: one kills a host that another's jobs may use.
"""

from __future__ import annotations

import fcntl
import io
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from cluster_nodes import SGE_HOSTS as HOSTS
from cluster_nodes import assert_resumed_to_its_budget, start_beside_a_killed_node
from factories import simulators, write_config
from test_conformance import SGE, csv_rows, status_text, sweep, wait_finished, wait_until

from hpcrl.cli import main
from hpcrl.status import cancel_experiment
from hpcrl.store import rundir, runlock
from hpcrl.store.expdir import Job, load_runs, read_jobs, run_dir

pytestmark = [pytest.mark.multinode, pytest.mark.sge, pytest.mark.e2e]

SGE_SH = Path(__file__).resolve().parents[1] / "clusters" / "sge.sh"
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
ON_HOSTS = ["resources.extra=['-l multihost=TRUE']"]


def cluster(*args: str) -> str:
    proc = subprocess.run(["bash", str(SGE_SH), *args], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture
def hosts(sge_cluster: None) -> Iterator[None]:
    """The cell with its two execution hosts (started here when the session's cell has none), every host up
    for this test alone, and back in service afterwards whatever the test did."""
    cluster("start", "--hosts", str(len(HOSTS)))  # sge.sh takes its own turn
    with open("/tmp/hpcrl-tests-sge-multihost.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in HOSTS:
            cluster("revive-host", name)
        try:
            yield
        finally:
            for name in HOSTS:
                cluster("revive-host", name)


def qacct_hosts(job_id: str) -> list[tuple[int, str]]:
    """(task, hostname) of every accounting record of a job: one per array task, per parallel task (qrsh
    -inherit) and per rescheduled run. qacct can miss a job for a second or two after it ends."""
    records: list[tuple[int, str]] = []
    for _ in range(40):
        out = subprocess.run(["qacct", "-j", job_id], capture_output=True, text=True).stdout
        records = []
        for block in out.split("=" * 62)[1:]:
            fields = dict(line.split(None, 1) for line in block.strip().splitlines() if len(line.split(None, 1)) == 2)
            task = fields.get("taskid", "undefined").strip()
            records.append((0 if task == "undefined" else int(task), fields["hostname"].strip()))
        if records:
            break
        time.sleep(0.5)
    return records


def logs(exp_dir: Path, stage: str) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((exp_dir / "jobs" / "logs").glob(f"{stage}-*")))


def qmod(*args: str) -> None:
    proc = subprocess.run(["qmod", *args], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def running_host(job_id: str, task: int) -> str | None:
    """The host of a running array task, from `qstat` (`multi.q@sge-host1` in its queue column)."""
    out = subprocess.run(["qstat", "-u", "*", "-s", "r", "-g", "d"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        fields = line.split()
        if fields and fields[0] == job_id and fields[-1] == str(task) and "@" in line:
            return next(f.partition("@")[2] for f in fields if "@" in f)
    return None


def test_nodes_over_a_parallel_environment_that_keeps_to_one_host_are_refused_at_sweep_time(hosts: None, tmp_path: Path) -> None:
    # The cell's own PEs, read with qconf -sp: smp ($pe_slots) is refused in one line before anything is
    # written; mpi ($round_robin, control_slaves TRUE) is taken.
    for pe, refused in (("smp", True), ("mpi", False)):
        (tmp_path / pe).mkdir()
        config = write_config(tmp_path / pe, {"resources": {"ranks": 2, "nodes": 2, "sge_pe": pe}})
        err, out = io.StringIO(), io.StringIO()
        with redirect_stderr(err), redirect_stdout(out):
            code = main(["sweep", str(config), "--scheduler", "sge", "--dry-run"])
        if refused:
            assert code == 2 and err.getvalue().count("\n") == 1, err.getvalue()
            assert "resources.nodes: 2 nodes per run, but sge parallel environment 'smp' puts all of a job's slots on one host" in err.getvalue()
            assert not (tmp_path / pe / "logs").exists()
        else:
            assert code == 0, err.getvalue()
            assert "#$ -pe mpi 2" in out.getvalue() and "spans hosts" in out.getvalue(), out.getvalue()


def test_array_tasks_and_train_eval_aggregate_spread_over_two_hosts(hosts: None, tmp_path: Path) -> None:
    # 3 CPUs a task on hosts of 4 slots: one task per host at a time, so the two that run at once hold
    # both hosts (with equal loads, Grid Engine would otherwise fill sge-host1 first).
    since = time.time()
    exp_dir, _ = sweep(tmp_path, SGE(), *ON_HOSTS, "sweep.seeds=[0, 1, 2, 3]", "resources.cpus=3", "resources.max_concurrent=4")
    wait_finished(exp_dir, SGE(), since, timeout=240)
    assert not list(exp_dir.glob("runs/*/FAILED")), status_text(exp_dir)
    placed: dict[str, set[str]] = {}
    for job in read_jobs(exp_dir):
        records = qacct_hosts(job.job_id)
        assert len(records) == (job.size or 1), (job, records)
        placed.setdefault(job.stage, set()).update(host for _, host in records)
    print(f"\nsge multi-host sweep: train on {sorted(placed['train'])}, eval on {sorted(placed['eval'])}, aggregate on {sorted(placed['aggregate'])}")
    assert placed["train"] == set(HOSTS), placed
    assert placed["eval"] == set(HOSTS), placed
    assert placed["aggregate"] and not placed["aggregate"] & set(HOSTS), placed  # no multihost request: all.q on the head
    assert len(csv_rows(exp_dir / "results" / "summary.csv")) == 1


# DD-PPO on CartPole as 2 hosts x 1 rank x 4 envs, an update (and a gradient all-reduce) every 256 steps as in
# Slurm's multi-node test, but 2 epochs of a 16-unit network instead of its 20 of 64x64: these tests are about
# placement, warnings, lost and cut-off hosts, not learning (that the ranks learn together across nodes is
# Slurm's test: the same gloo ranks and gradients; only the launcher differs), so each sets its own budget and
# computes a tenth of what learning takes.
DDPPO = [
    *ON_HOSTS, "resources.sge_pe=mpi", "env.num_envs=4", "resources.ranks=2", "resources.nodes=2", "sweep.seeds=[0]", "eval.episodes=10",
    "resources.collective_timeout=60",
    # Each host names itself 127.0.1.1 (Debian's way): hpcrl gives gloo the interface other hosts reach (hpcrl.rl.ddp).
    "train={total_steps: 100000, num_steps: 32, num_minibatches: 1, update_epochs: 2, hidden_sizes: [16], checkpoint_every: 20}",
]  # fmt: skip


def test_ddppo_ranks_meet_over_two_hosts_and_restart_whole_when_the_other_host_dies(hosts: None, tmp_path: Path) -> None:
    since = time.time()
    exp_dir, _ = sweep(tmp_path, SGE(), *DDPPO, "train.total_steps=40000")
    script = (exp_dir / "jobs" / "train-0-0.sh").read_text()
    assert "#$ -pe mpi 2" in script, script
    (run,) = load_runs(exp_dir)
    rd = run_dir(exp_dir, run.run_id)
    train = next(j for j in read_jobs(exp_dir) if j.stage == "train")

    # The ranks meet across the two hosts; once the run has checkpointed, the host of rank 1 dies.
    wait_until("a checkpoint past 10k steps", lambda: rundir.last_logged_step(rd) >= 10_000 and any((rd / "checkpoints").glob("*.pt")), 180)
    log = logs(exp_dir, "train")
    placed = re.search(r"2 ranks on 2 hosts: 1 on (\S+), 1 on (\S+) \(MASTER_ADDR (\S+)\)", log)
    assert placed, log
    master, other = placed.group(1).rstrip(","), placed.group(2)
    assert {master, other} == set(HOSTS) and placed.group(3) == master, log
    assert re.search(rf"ranks 1-1 started on {other}\b", log), log  # the qrsh -inherit group, on the other host
    killed_at = time.monotonic()
    cluster("kill-host", other)

    # The launcher sees the host gone, ends this start and asks for a requeue; Grid Engine reschedules the task
    # onto the host left, and the run restarts whole from its checkpoint there.
    wait_until("the run to resume", lambda: "resumed from step" in logs(exp_dir, "train"), 180)
    resumed_after = time.monotonic() - killed_at
    wait_finished(exp_dir, SGE(), since, timeout=420)
    log = logs(exp_dir, "train")
    assert not list(exp_dir.glob("runs/*/FAILED")), status_text(exp_dir) + log
    assert re.search(rf"{other} lost \(qmaster: unknown; its execd does not answer\): the run restarts whole", log), log
    resumed = dict(re.findall(r"\(rank (\d)/2\): resumed from step (\d+)", log))
    assert set(resumed) == {"0", "1"} and len(set(resumed.values())) == 1 and int(resumed["0"]) > 0, log  # both ranks, one checkpoint
    assert int(rundir.done_step(rd) or 0) >= 40_000
    # Accounting: the first start and the restart, both on the host left; the parallel task on the killed host
    # left no record (its execd died with it).
    records = qacct_hosts(train.job_id)
    assert [host for _, host in records] == [master, master], records
    steps = [int(row["step"]) for row in csv_rows(rd / "train.csv")]
    assert steps == sorted(set(steps)), "a step was logged twice: the restart did not resume where the checkpoint stopped"
    (row,) = csv_rows(exp_dir / "results" / "summary.csv")
    print(
        f"\nsge DD-PPO 2 hosts x 1 rank: rank 0 on {master}, rank 1 on {other} (qrsh -inherit); {other} killed, the run restarted "
        f"whole from step {resumed['0']} {resumed_after:.0f} s after the kill; final eval {float(row['mean']):.0f} (40k steps)"
    )
    assert subprocess.run(["qstat"], capture_output=True, timeout=30).returncode == 0  # qmaster lived (hold_argv: no -hold_jid_ad on this job)


LONG_RUN = (*ON_HOSTS, "sweep.seeds=[0]", "train.total_steps=100000000", "train.checkpoint_every=2")
"""A sweep of one run that would train for hours, checkpointing often."""


@contextmanager
def a_run_training_on_a_host(tmp_path: Path) -> Iterator[tuple[Path, Path, Job, str]]:
    """LONG_RUN swept and checkpointed once: (experiment, run directory, train job, the host it trains on);
    cancelled afterwards, whatever the test did."""
    exp_dir, _ = sweep(tmp_path, SGE(), *LONG_RUN)
    (run,) = load_runs(exp_dir)
    rd = run_dir(exp_dir, run.run_id)
    train = next(j for j in read_jobs(exp_dir) if j.stage == "train")
    try:
        wait_until("a checkpoint", lambda: rundir.last_logged_step(rd) >= 1000 and any((rd / "checkpoints").glob("*.pt")), 120)
        host = running_host(train.job_id, 1)
        assert host in HOSTS, host
        yield exp_dir, rd, train, host
    finally:
        cancel_experiment(exp_dir, out=io.StringIO())


def test_a_killed_host_s_task_is_rescheduled_onto_the_other_host_and_resumes(hosts: None, tmp_path: Path) -> None:
    with a_run_training_on_a_host(tmp_path) as (exp_dir, rd, train, first):
        killed_at = time.monotonic()
        cluster("kill-host", first)
        wait_until(f"qmaster to mark {first} unknown", lambda: f"multi.q@{first}" in subprocess.run(["qstat", "-f", "-qs", "u"], capture_output=True, text=True).stdout, 90)
        unknown_after = time.monotonic() - killed_at
        wait_until("the task to resume", lambda: "resumed from step" in logs(exp_dir, "train"), 120)
        resumed_after = time.monotonic() - killed_at
        second = running_host(train.job_id, 1)
        assert second in HOSTS and second != first, (first, second)
        log = logs(exp_dir, "train")
        resumed = int(re.search(r"resumed from step (\d+)", log).group(1))
        assert resumed > 0, log
        wait_until("a step past the resume", lambda: rundir.last_logged_step(rd) > resumed, 60)
        text = status_text(exp_dir)  # the user's first look: which host the run lost, and that it goes on
        assert re.search(rf"lost on {first} \(pid \d+, [\d:]+\): node down or killed", text), text
    steps = [int(row["step"]) for row in csv_rows(rd / "train.csv")]
    assert steps == sorted(set(steps)), "a step was logged twice: the second lifetime did not resume where the first stopped"
    print(
        f"\nsge host killed: {first} unknown {unknown_after:.0f} s after the kill; task resumed from step {resumed} on {second} "
        f"{resumed_after:.0f} s after the kill"
    )


def trainer_pids(host: str, exp_dir: Path) -> list[int]:
    """Pids of processes on a namespace host that work on this experiment."""
    found = []
    for pid in subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True).stdout.split():
        try:
            if str(exp_dir) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                found.append(int(pid))
        except OSError:
            continue
    return found


def refused_while_held(exp_dir: Path, stage: str, rd: Path, holder: runlock.Holder, cut_at: float, timeout: float) -> float:
    """Seconds from the cut until the rescheduled start of `stage` refused the run that the cut-off one still
    holds (its lock is on the shared filesystem), which must then still be the holder's alone."""
    wait_until("the rescheduled start to refuse the held run", lambda: "not starting a second trainer" in logs(exp_dir, stage), timeout)
    refused_after = time.monotonic() - cut_at
    assert f"is being trained by pid {holder.pid} on {holder.host}" in logs(exp_dir, stage)
    assert runlock.lock_holder(rd) == holder  # the cut-off trainer's, and only its
    return refused_after


def test_a_cut_off_host_keeps_its_run_alone_and_the_run_resumes_after(hosts: None, tmp_path: Path) -> None:
    """A partition under a sweep's train task: qmaster has the cut host unknown and reschedules the task onto the
    other host, whose start refuses the run the cut-off trainer still holds (its lock is on the shared
    filesystem): never two writers. When the link comes back, the host's execd ends the old job (its notice is a
    warning signal: the trainer checkpoints), no process of it is left, the run says why it stopped, and the
    next `hpcrl sweep` resumes it from its checkpoint."""
    with a_run_training_on_a_host(tmp_path) as (exp_dir, rd, train, first):
        holder = runlock.lock_holder(rd)
        assert holder is not None and holder.host == first, holder
        cut_at = time.monotonic()
        cluster("cut-host", first)
        try:
            refused_after = refused_while_held(exp_dir, "train", rd, holder, cut_at, 150)
        finally:
            cluster("heal-host", first)
        # The old job's end: its trainer checkpoints at the execd's notice and asks for a requeue that no job grants
        # (the task was rescheduled): `hpcrl status` says so, rather than showing a run that is still training.
        wait_until("status to say why the run stopped", lambda: "asked for a requeue" in status_text(exp_dir), 150)
        wait_until(f"no process of the run left on {first}", lambda: not trainer_pids(first, exp_dir), 60)
        steps = [int(row["step"]) for row in csv_rows(rd / "train.csv")]
        assert steps == sorted(set(steps)), "two writers' rows interleaved in train.csv"
        checkpointed = int(re.search(r"at step (\d+): checkpointed", logs(exp_dir, "train")).group(1))
        # Until qmaster has let the old jobs go (the eval and aggregate behind the train task too), a sweep sees the
        # run in flight and leaves it be.
        ids = [j.job_id for j in read_jobs(exp_dir)]
        wait_until("qmaster to let the old jobs go", lambda: all(subprocess.run(["qstat", "-j", i], capture_output=True).returncode != 0 for i in ids), 120)
        _, printed = sweep(tmp_path, SGE(), *LONG_RUN)
        assert "submitted 1 of 1 runs" in printed, printed
        wait_until("the run to resume", lambda: f"resumed from step {checkpointed}" in logs(exp_dir, "train"), 120)
    print(f"\nsge host cut: {first}; the rescheduled start refused the held run {refused_after:.0f} s after the cut; after the heal "
          f"the old trainer checkpointed at step {checkpointed} and the next sweep resumed from it")


def test_a_warned_two_host_run_checkpoints_on_every_rank_and_resumes_on_both(hosts: None, tmp_path: Path) -> None:
    # Grid Engine's warning (qmod -sj with -notify: SIGUSR1) reaches the job on its first host only; the rank
    # there stops the others at the same iteration (Ranks.any), every rank exits 99, the other host's group
    # passes that back through qrsh, and the task is rescheduled and resumes on both ranks.
    since = time.time()
    exp_dir, _ = sweep(tmp_path, SGE(), *DDPPO, "train.total_steps=40960", "train.checkpoint_every=5")
    train = next(j for j in read_jobs(exp_dir) if j.stage == "train")
    (run,) = load_runs(exp_dir)
    rd = run_dir(exp_dir, run.run_id)
    wait_until("the first checkpoint", lambda: any((rd / "checkpoints").glob("*.pt")), 180)
    SGE().warn(exp_dir, train, 1)
    wait_finished(exp_dir, SGE(), since, timeout=300)
    log = logs(exp_dir, "train")
    assert not list(exp_dir.glob("runs/*/FAILED")), status_text(exp_dir) + log
    signalled = re.findall(r"signal \S+ at step (\d+): checkpointed", log)
    resumed = dict(re.findall(r"\(rank (\d)/2\): resumed from step (\d+)", log))
    assert len(signalled) == 1 and resumed == {"0": signalled[0], "1": signalled[0]}, log  # one checkpoint, by rank 0; both ranks resumed from it
    # The first lifetime spanned both hosts. The second goes where $round_robin deals its slots: a host
    # whose last run is still being cleaned up takes none, and then both ranks run on the other (the
    # launcher on one host, as $PE_HOSTFILE then lists one).
    assert log.index("2 ranks on 2 hosts") < log.index("checkpointed, asking for a requeue"), log
    steps = [int(r["step"]) for r in csv_rows(rd / "train.csv")]
    assert steps == sorted(set(steps)) and steps[-1] == 40960, steps  # no step twice, none lost
    print(f"\nsge DD-PPO 2 hosts: warned at step {signalled[0]}, resumed on both ranks from it")


def _processes_on(host: str, needle: str) -> list[tuple[int, str]]:
    """(pid, environment's RANK) of the processes on `host` (its namespace) whose command line holds `needle`."""
    found = []
    for pid in subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True).stdout.split():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in cmdline:
            rank = next((e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"RANK=")), "")
            found.append((int(pid), rank))
    return found


def test_a_rank_killed_on_the_other_host_fails_the_run_with_its_reason_and_leaves_no_process(hosts: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rank's env starts a simulator holding a file in /dev/shm (tests/factories.py): the killed rank's, orphaned
    on the other host, is ended there by its group launcher, which names it in the job log, and its file goes."""
    with simulators(tmp_path, monkeypatch, "simenvs_hosts") as sims:
        exp_dir, _ = sweep(tmp_path, SGE(), *DDPPO, "train.total_steps=10000000", "train.checkpoint_every=5", *sims.overrides)
        (run,) = load_runs(exp_dir)
        rd = run_dir(exp_dir, run.run_id)
        try:
            wait_until("a checkpoint", lambda: any((rd / "checkpoints").glob("*.pt")), 180)
            other = re.search(r"ranks 1-1 started on (\S+)", logs(exp_dir, "train")).group(1)
            (pid,) = [p for p, rank in _processes_on(other, str(exp_dir)) if rank == "1" and p]
            os.kill(pid, signal.SIGKILL)
            wait_until("the run to fail", lambda: (rd / "FAILED").exists() and not active_train(exp_dir), 120)
            alive, left, reason = sims.alive(), sims.left(), (rd / "FAILED").read_text()
        finally:
            cancel_experiment(exp_dir, out=io.StringIO())
    assert not alive and not left, (alive, left, logs(exp_dir, "train")[-2000:])
    # The group launcher ends what its killed rank left before it exits, which is how the launcher learns of it. Had
    # rank 0's collective failed first, the launcher's own end may come first: the test's hosts share one /proc.
    group_first = reason.startswith("ranks 1-1 ")
    who = rf"the ranks 1-1 on {other}" if group_first else rf"(the ranks 1-1 on {other}|the run's ranks)"
    assert re.search(rf"hpcrl: {who} \(exit 1\) left \d+ process\(es\) running: pid \d+ \(.*time\.sleep\(600\)", logs(exp_dir, "train"))
    # The launcher's line: the other host's group that lost its rank (or rank 0, had its collective failed first);
    # the group's own line in the job log names the rank and how it died.
    assert re.fullmatch(rf"(ranks 1-1 of 2 on {other}|rank 0 of 2) exited with code 1; the other ranks were stopped\s*", reason), reason
    assert f"hpcrl: error: rank 1 on {other} was killed by SIGKILL; the other ranks were stopped" in logs(exp_dir, "train")
    wait_until("no process of the run on any host", lambda: not any(_processes_on(h, str(exp_dir)) for h in HOSTS), 30)


def test_a_ddppo_run_whose_other_host_is_cut_off_restarts_whole_on_the_host_left(hosts: None, tmp_path: Path) -> None:
    """A partition under a 2-host DD-PPO run: rank 1's host lives on, unreachable. The launcher sees it unknown to
    qmaster with its execd silent (as for a dead host), ends this start and asks for a requeue; Grid Engine
    reschedules the task onto the host left, and the run restarts whole from its checkpoint there. The cut-off
    rank, whose peers are gone, ends at its collective (`resources.collective_timeout`) without a word to the run
    (no FAILED), so nothing of the run is left on the host even before the link comes back."""
    since = time.time()
    exp_dir, _ = sweep(tmp_path, SGE(), *DDPPO, "train.total_steps=40000")
    (run,) = load_runs(exp_dir)
    rd = run_dir(exp_dir, run.run_id)
    wait_until("a checkpoint past 10k steps", lambda: rundir.last_logged_step(rd) >= 10_000 and any((rd / "checkpoints").glob("*.pt")), 180)
    other = re.search(r"ranks 1-1 started on (\S+)", logs(exp_dir, "train")).group(1)
    assert other in HOSTS and [r for _, r in _processes_on(other, str(exp_dir))].count("1") == 1
    cut_at = time.monotonic()
    cluster("cut-host", other)
    try:
        wait_until("the run to resume", lambda: "resumed from step" in logs(exp_dir, "train"), 180)
        resumed_after = time.monotonic() - cut_at
        wait_until(f"the cut-off rank to end on {other}", lambda: not _processes_on(other, str(exp_dir)), 120)
        ended_after = time.monotonic() - cut_at
    finally:
        cluster("heal-host", other)
    wait_finished(exp_dir, SGE(), since, timeout=300)
    log = logs(exp_dir, "train")
    assert not list(exp_dir.glob("runs/*/FAILED")), status_text(exp_dir) + log
    assert re.search(rf"{other} lost \(qmaster: unknown; its execd does not answer\): the run restarts whole", log), log
    resumed = dict(re.findall(r"\(rank (\d)/2\): resumed from step (\d+)", log))
    assert set(resumed) == {"0", "1"} and len(set(resumed.values())) == 1 and int(resumed["0"]) >= 10_000, log
    steps = [int(row["step"]) for row in csv_rows(rd / "train.csv")]
    assert steps == sorted(set(steps)) and steps[-1] >= 40_000, "two writers, or a step logged twice"
    print(
        f"\nsge DD-PPO partition: {other} (rank 1) cut past 10k steps; the run restarted whole from step {resumed['0']} on the host left "
        f"{resumed_after:.0f} s after the cut; the cut-off rank ended {ended_after:.0f} s after it"
    )


def test_a_cut_off_alphazero_trainer_keeps_its_run_alone_its_self_play_stops_with_one_line_and_the_run_resumes_after(hosts: None, tmp_path: Path) -> None:
    """A partition under the decoupled AlphaZero: the trainer's host lives on, unreachable. The self-play jobs,
    which can reach neither the trainer nor its Redis, stop with one line each; qmaster reschedules the trainer,
    whose second start refuses the run the cut-off trainer still holds: never two trainers. When the link comes
    back the host's execd ends the old trainer (which checkpoints at its notice), nothing of it is left, and the
    next sweep resumes the run from that checkpoint to its budget."""
    from hpcrl.config.load import load_experiment
    from hpcrl.distributed import runstats
    from hpcrl.submit.pipeline import submit_experiment

    # 16,000 positions: the cut comes after the trainer's first checkpoint and after any self-play task on its host
    # was moved, 3,118-4,196 positions in with the config's recipe of 2026-12-02 (714 with the slower earlier one).
    overrides = [f"output={tmp_path}", "sweep.seeds=[0]", "train.total_steps=16000", "train.checkpoint_every=100",
                 "distributed.learner_timeout_s=30", "distributed.ratio_slack=0", "eval.episodes=20", *ON_HOSTS]  # fmt: skip

    def submit() -> tuple[Path, str]:
        exp, out = load_experiment(CONFIGS / "tictactoe_alphazero_jobs.yaml", overrides), io.StringIO()
        assert submit_experiment(exp, "sge", detach=True, out=out) == 0, out.getvalue()
        return exp.dir, out.getvalue()

    since = time.time()
    exp_dir, _ = submit()
    (run,) = load_runs(exp_dir)
    rd = run_dir(exp_dir, run.run_id)
    jobs = {j.stage: j for j in read_jobs(exp_dir)}
    wait_until(
        "a trainer fed by two self-play jobs, with a checkpoint",
        lambda: (st := runstats.read(rd)) is not None and st["actors_alive"] == 2 and any((rd / "checkpoints").glob("*.pt")),
        240,
    )
    holder = runlock.lock_holder(rd)
    cut = running_host(jobs["learner"].job_id, 1)
    assert holder is not None and cut in HOSTS and holder.host == cut, (holder, cut)
    # Grid Engine places the jobs as it likes: a self-play task on the trainer's own host is cut off from
    # nothing. So no new job goes there, and such a task is moved as an admin moves one (`qmod -rj`: killed
    # and rescheduled, a -r y job), which the run absorbs (the self-play job starts again and reconnects).
    qmod("-d", f"multi.q@{cut}")
    try:
        actors = jobs["actors"].job_id
        moved = [task for task in (1, 2) if running_host(actors, task) == cut]
        for task in moved:
            qmod("-rj", f"{actors}.{task}")
        wait_until(
            "both self-play tasks connected from the other host",
            lambda: all(running_host(actors, task) not in (None, cut) for task in (1, 2))
            and logs(exp_dir, "actors").count("connected to learner") >= 2 + len(moved),
            180,
        )
        cut_at = time.monotonic()
        cluster("cut-host", cut)
        try:
            wait_until("both self-play jobs to stop", lambda: logs(exp_dir, "actors").count("no learner for 30 s; exiting with 75") >= 2, 150)
            stopped_after = time.monotonic() - cut_at
            refused_after = refused_while_held(exp_dir, "learner", rd, holder, cut_at, 180)
        finally:
            cluster("heal-host", cut)
    finally:
        qmod("-e", f"multi.q@{cut}")
    wait_until(f"no process of the run left on {cut}", lambda: not _processes_on(cut, str(exp_dir)), 150)
    ids = [j.job_id for j in read_jobs(exp_dir)]
    wait_until("qmaster to let the old jobs go", lambda: all(subprocess.run(["qstat", "-j", i], capture_output=True).returncode != 0 for i in ids), 150)
    checkpointed = rundir.last_logged_step(rd)
    resubmitted = time.time()
    assert "submitted 1 of 1 runs" in submit()[1]
    # What is left of the budget after the checkpoint: on a slower host the cut comes sooner (a 2-core AMD EPYC under
    # the whole suite, 2026-12-03: at 898 positions), and training the 15,100 left, evaluating and aggregating took
    # 315 s there, past the 300 s this wait had; 600 s still ends a hung run in bounded time.
    wait_finished(exp_dir, SGE(), resubmitted, timeout=600)
    assert_resumed_to_its_budget(rd, logs(exp_dir, "learner"), 16000)
    print(
        f"\nsge AlphaZero partition ({len(moved)} self-play task(s) moved off the trainer's host): trainer on {cut} cut off ({time.time() - since:.0f} s into the run, {checkpointed} positions logged); "
        f"self-play stopped {stopped_after:.0f} s later, the rescheduled trainer refused the held run {refused_after:.0f} s after the cut; "
        f"the next sweep resumed it to 16,000 positions"
    )


def active_train(exp_dir: Path) -> bool:
    train = next(j for j in read_jobs(exp_dir) if j.stage == "train")
    return bool(running_host(train.job_id, 1)) or train.job_id in subprocess.run(["qstat", "-u", "*"], capture_output=True, text=True).stdout.split()


def test_the_suite_s_start_beside_a_test_leaves_a_killed_host_down_and_a_racing_revive_brings_it_back(hosts: None) -> None:
    start_beside_a_killed_node(SGE_SH, HOSTS[1], kill="kill-host", revive="revive-host", start=["--hosts", str(len(HOSTS))])
    assert re.search(rf"{HOSTS[1]} \S+ execd running link up", cluster("status"))
