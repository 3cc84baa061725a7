"""Every distributed mode across the nodes of a real Slurm cluster, and through node failures (issue 36).

The cluster is tests/clusters/slurm.sh's: slurmctld on this host, and slurm-node1..N in partition `multi` (N: tests/clusters/suite.env),
each a real slurmd in its own network and UTS namespace with its own address on a private bridge. Each node
names itself 127.0.1.1 in its /etc/hosts, as Debian's installer writes it, so `gethostbyname(gethostname())`
is loopback on every node, as on a stock cluster. A node "dies" as a node does: its link goes down and every
process on it is killed at once (`slurm.sh kill-node`); slurmctld then marks it DOWN and ends or requeues
its jobs, which is what hpcrl must survive. A partition cuts the link and leaves the processes running.

What a user relies on, per mode:
- DD-PPO, 2 nodes x 1 rank: the ranks meet across the nodes (over the nodes' network, never 127.0.1.1),
  learn CartPole, and a run that loses one of its nodes restarts whole from its checkpoint on the nodes
  left; `hpcrl status` names the lost node.

The tests hold one lock for the whole test (`nodes`): one kills a node that another's jobs may use.
"""

from __future__ import annotations

import fcntl
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_nodes import SLURM_NODES as NODES
from cluster_nodes import assert_resumed_to_its_budget, start_beside_a_killed_node
from test_conformance import Slurm as SlurmBackend
from test_conformance import active_tasks, csv_rows, status_text, sweep, wait_finished, wait_until
from test_distributed_selfplay import wait_stats

from hpcrl.store import rundir, runlock
from hpcrl.store.expdir import load_runs, read_jobs, run_dir

pytestmark = [pytest.mark.multinode, pytest.mark.slurm, pytest.mark.e2e]

SLURM_SH = Path(__file__).resolve().parents[1] / "clusters" / "slurm.sh"
ON_NODES = ["resources.partition=multi"]


def cluster(*args: str) -> str:
    proc = subprocess.run(["bash", str(SLURM_SH), *args], capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def node_state(name: str) -> str:
    return subprocess.run(["sinfo", "-h", "-n", name, "-o", "%T"], capture_output=True, text=True).stdout.strip()


def wait_node_down(name: str, timeout: float = 90) -> None:
    """Until Slurm marks `name` down (SlurmdTimeout after its slurmd stopped answering); on a timeout the
    failure says what state Slurm had it in and why (a run of the suite at a load of 10 timed out here once,
    and said nothing more)."""
    try:
        wait_until(f"Slurm to mark {name} down", lambda: node_state(name).startswith("down"), timeout)
    except AssertionError as timed_out:
        shown = subprocess.run(["scontrol", "show", "node", name], capture_output=True, text=True).stdout
        said = " ".join(field for field in shown.split() if field.split("=")[0] in ("State", "Reason", "LastBusyTime", "SlurmdStartTime"))
        raise AssertionError(f"{timed_out}; its last state: {node_state(name)!r} ({said})") from None


def job_nodes(job_id: str) -> list[str]:
    """The nodes a running job (or array task, `ID_TASK`) holds, expanded."""
    nodelist = subprocess.run(["squeue", "-h", "-j", job_id, "-t", "running", "-o", "%N"], capture_output=True, text=True).stdout.strip()
    if not nodelist:
        return []
    return subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True).stdout.split()


@pytest.fixture
def nodes(slurm_cluster: None) -> Iterator[None]:
    """Every node up, for this test alone; every node back in service afterwards, whatever the test did."""
    with open("/tmp/hpcrl-tests-multinode.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in NODES:
            cluster("revive-node", name)
        try:
            yield
        finally:
            for name in NODES:
                cluster("revive-node", name)


def logs(exp_dir: Path, stage: str) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((exp_dir / "jobs" / "logs").glob(f"{stage}-*")))


# CartPole PPO that solves it in 100k steps on one rank of 8 envs (RL Zoo's tuned settings), as 2 nodes x 1 rank x 4 envs.
DDPPO = [
    *ON_NODES, "env.num_envs=4", "resources.ranks=2", "resources.nodes=2", "sweep.seeds=[0]", "eval.episodes=10",
    "resources.collective_timeout=30",
    "train={total_steps: 100000, lr: 1.0e-3, num_steps: 32, num_minibatches: 1, update_epochs: 20, gamma: 0.98, gae_lambda: 0.8, "
    "clip_vloss: false, anneal_clip: true, ent_coef: 0.0, hidden_sizes: [64, 64], checkpoint_every: 5}",
]  # fmt: skip


def rank_hosts(log: str) -> list[dict[int, str]]:
    """Per start of the run, in order: rank -> the host it said it ran on (`(rank r/2): on HOST, gloo over IF`)."""
    starts: list[dict[int, str]] = []
    for rank, host in re.findall(r"\(rank (\d)/2\): on (\S+), gloo over (?:eth0|hpcrl-br0)", log):
        if not starts or int(rank) in starts[-1]:
            starts.append({})
        starts[-1][int(rank)] = host.rstrip(",")
    return starts


def test_ddppo_ranks_meet_across_nodes_learn_and_restart_whole_when_a_node_dies(nodes: None, tmp_path: Path) -> None:
    since = time.time()
    exp_dir, _ = sweep(tmp_path, SlurmBackend(), *DDPPO)
    (run,) = load_runs(exp_dir)
    rd = run_dir(exp_dir, run.run_id)
    train = next(j for j in read_jobs(exp_dir) if j.stage == "train")

    # The run trains on two nodes; once it has checkpointed past a quarter of its budget, its first node dies.
    wait_until("a checkpoint past 25k steps", lambda: rundir.last_logged_step(rd) >= 25_000 and any((rd / "checkpoints").glob("*.pt")), 240)
    held = job_nodes(f"{train.job_id}_1")
    assert len(held) == 2 and set(held) <= set(NODES), held
    killed_at = time.monotonic()
    cluster("kill-node", held[0])
    wait_node_down(held[0])
    down_after = time.monotonic() - killed_at

    # Slurm requeues the job; the run restarts whole, from its checkpoint, on the two nodes left.
    wait_until("the run to resume", lambda: "resumed from step" in logs(exp_dir, "train"), 180)
    resumed_after = time.monotonic() - killed_at
    text = status_text(exp_dir)
    assert re.search(rf"lost on {held[0]} \(pid \d+, [\d:]+\): node down or killed", text), text
    wait_finished(exp_dir, SlurmBackend(), since, timeout=300)

    log = logs(exp_dir, "train")
    starts = rank_hosts(log)
    assert len(starts) == 2, log
    first, second = starts
    assert len(set(first.values())) == 2 and held[0] in first.values(), first  # two hosts, one of them the node that died
    assert len(set(second.values())) == 2 and held[0] not in second.values(), second
    resumed = int(re.search(r"resumed from step (\d+)", log).group(1))
    assert 0 < resumed <= 100_352
    assert re.search(rf"the start on {held[0]} \(pid \d+, [\d:]+\) ended without a word: its node was lost", log), log
    assert int(rundir.done_step(rd) or 0) >= 100_000
    (row,) = csv_rows(exp_dir / "results" / "summary.csv")
    assert float(row["mean"]) >= 475, row
    print(
        f"\nDD-PPO 2 nodes x 1 rank: {held[0]} killed at step >= 25k; DOWN after {down_after:.0f} s, resumed from step {resumed} "
        f"{resumed_after:.0f} s after the kill on {sorted(second.values())}; final eval {float(row['mean']):.0f}"
    )


# Ape-X on CartPole (configs/cartpole_apex.yaml's learning settings, 50k steps): a run of a few minutes, long enough
# to lose two nodes (Slurm marks a node DOWN 10-25 s after it dies, and starts a requeued job ~20 s later). The
# learning rate is annealed to 0, as the config has it: at a constant rate (until 2026-12-04) the Q-values diverged
# in the last 7k steps of one suite's run (mean Q 45-60 -> 486, loss 3 -> 30) and the final greedy policy scored 72,
# the late degradation the config's comment shows. Annealed, alone: 500 / 500; with prioritised replay too (the
# config's) it learned slower in 50k steps: 204 / 500.
APEX = {
    "name": "apex", "algo": "dqn", "env": {"id": "CartPole-v1"},
    "train": {
        "total_steps": 50_000, "lr": 1.0e-3, "anneal_lr": True, "hidden_sizes": [256, 256], "buffer_size": 50_000, "batch_size": 64,
        "learning_starts": 1000, "train_freq": 256, "gradient_steps": 128, "target_update_freq": 10, "n_step": 5, "double_dqn": True,
        "loss": "huber", "max_grad_norm": 10.0, "checkpoint_every": 500,
    },
    "distributed": {
        "actors": 2, "envs_per_actor": 4, "batch_transitions": 64, "queue_bound": 8, "publish_every": 16, "max_lag": 1000,
        "heartbeat_s": 0.5, "dead_after_s": 3.0, "learner_timeout_s": 240,
    },
    "sweep": {"seeds": [0]},
    "resources": {"partition": "multi", "time": "00:20:00"},
    "eval": {"episodes": 10, "deterministic": True},
}  # fmt: skip


def submit_config(tmp_path: Path, config: dict) -> Path:
    import io

    import yaml

    from hpcrl.config.load import load_experiment
    from hpcrl.submit.pipeline import submit_experiment

    path = tmp_path / f"{config['name']}.yaml"
    path.write_text(yaml.safe_dump({**config, "output": str(tmp_path / "logs")}))
    exp = load_experiment(path)
    out = io.StringIO()
    assert submit_experiment(exp, "slurm", detach=True, out=out) == 0, out.getvalue()
    return exp.dir


LEARNED = 100
"""The return the multi-node Ape-X run's evaluations must reach: ten times the untrained policy's."""


def test_apex_actors_dial_the_learner_node_and_the_run_survives_losing_the_learner_node_and_an_actor_node(nodes: None, tmp_path: Path) -> None:
    from hpcrl.distributed import rendezvous

    since = time.time()
    # The eval stage plays the best of the learner's evaluations during training, as configs/cartpole_dqn.yaml
    # does: DQN's last policy on CartPole can lose its balance late in a run, whatever the nodes did (two of
    # eight suites' runs: the final greedy policy 72, and 36 after its training return reached 500 at 26k steps,
    # its mean Q drifting from ~60 to 701), and the best carried across the learner's loss is part of what it tests.
    # LEARNED is a sanity bar (the run ends with a policy that learned: the untrained greedy policy scores ~10,
    # random actions ~22), not a measure of how well DQN does in 50k steps: runs' bests scored 148 (a slow run,
    # its evaluations 58 -> 178), 157, 426 and 472 on the eval stage's seeds.
    exp_dir = submit_config(tmp_path, {**APEX, "eval": {**APEX["eval"], "every_steps": 5000, "periodic_episodes": 5, "checkpoint": "best"}})
    (run,) = load_runs(exp_dir)
    rd = run_dir(exp_dir, run.run_id)
    jobs = {j.stage: j for j in read_jobs(exp_dir)}

    # Placed across nodes: the learner on one, each actor on another, dialling the learner node's own address
    # (never the 127.0.1.1 its name resolves to on its own node).
    before = wait_stats(rd, lambda s: s["actors_alive"] == 2 and s["env_steps"] >= 10_000 and any((rd / "checkpoints").glob("*.pt")), 240, "two actors feeding the learner")
    assert before["env_steps"] < APEX["train"]["total_steps"] / 3, "the run went too fast to lose nodes mid-run: raise train.total_steps"
    learner_node = job_nodes(f"{jobs['learner'].job_id}_1")
    actor_nodes = {t: job_nodes(f"{jobs['actors'].job_id}_{t}") for t in (1, 2)}
    assert len({*learner_node, *actor_nodes[1], *actor_nodes[2]}) == 3, (learner_node, actor_nodes)
    info = rendezvous.read(rd)
    assert info is not None and info.learner_host == learner_node[0] and info.host.startswith("10.251.0."), info

    # A rack fails: the learner's node and an actor's node, processes and links, at once. Slurm requeues both
    # jobs; the learner resumes from its checkpoint on another node, and both actors (the survivor, still
    # waiting, and the requeued one) find its new address in the run directory.
    lost, victim = learner_node[0], actor_nodes[1][0]
    killed = time.monotonic()
    cluster("kill-node", lost)
    cluster("kill-node", victim)
    for name in (lost, victim):
        wait_node_down(name)
    down_after = time.monotonic() - killed
    # The actor's node is repaired, so the 4-node partition has room again for both requeued jobs; the learner's
    # stays down until the learner has resumed (repaired at once, Slurm gave it back its old node, the lowest free).
    cluster("revive-node", victim)
    wait_until("the learner to resume on another node", lambda: (i := rendezvous.read(rd)) is not None and i.instance != info.instance, 240)
    resumed_after = time.monotonic() - killed
    moved = rendezvous.read(rd)
    assert moved is not None and moved.learner_host != lost and moved.host.startswith("10.251.0.") and moved.host != info.host, moved
    cluster("revive-node", lost)
    text = status_text(exp_dir)
    assert re.search(rf"lost on {lost} \(pid \d+, [\d:]+\): node down or killed", text), text
    after = wait_stats(rd, lambda s: s["instance"] == moved.instance and s["actors_alive"] == 2, 240, "both actors feeding the resumed learner")
    rejoined_after = time.monotonic() - killed
    wait_finished(exp_dir, SlurmBackend(), since, timeout=400)

    learner_log, actors_log = logs(exp_dir, "learner"), logs(exp_dir, "actors")
    resumed = re.search(r"resumed from step (\d+) ", learner_log)
    assert resumed and 0 < int(resumed.group(1)) <= after["env_steps"], learner_log
    assert re.search(rf"the start on {lost} \(pid \d+, [\d:]+\) ended without a word", learner_log), learner_log
    assert actors_log.count(f"at {moved.host}:{moved.port}") == 2 and f"at {info.host}:{info.port}" in actors_log, actors_log
    assert int(rundir.done_step(rd) or 0) == APEX["train"]["total_steps"]  # every step once: none lost, none counted twice
    steps, means = rundir.read_eval_curve(rd)
    best = int(steps[int(means.argmax())])
    assert int(steps[-1]) == APEX["train"]["total_steps"] and means[steps > int(resumed.group(1))].max() >= LEARNED, (steps, means)  # the resumed learner's own
    (row,) = csv_rows(exp_dir / "results" / "summary.csv")
    print(
        f"\nApe-X: learner on {lost}, actors on {sorted(n for v in actor_nodes.values() for n in v)}; {lost} and {victim} killed at step "
        f"{before['env_steps']}, DOWN after {down_after:.0f} s; learner resumed from step {resumed.group(1)} on {moved.learner_host} {resumed_after:.0f} s later, both actors "
        f"back {rejoined_after:.0f} s after the kill; evaluations {dict(zip(steps.astype(int).tolist(), means.round(1).tolist()))}, the best's (step {best}) eval {float(row['mean']):.0f}"
    )
    assert float(row["mean"]) >= LEARNED, row


CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_decoupled_alphazero_trains_across_nodes_loses_a_self_play_node_and_at_most_draws_perfect_play_bar_a_rare_opening(nodes: None, tmp_path: Path) -> None:
    """The bundled decoupled tic-tac-toe config, seed 0: trainer and two self-play jobs on three nodes, 24,000
    positions instead of its 10,000 (a lost node costs the run one self-play job for the ~50 s until Slurm has it
    DOWN and the requeued job runs), with the config's replay window of the whole budget kept (24,000, not its
    10,000), and `distributed.ratio_slack: 0`: with the config's 0.5 the trainer's updates per game float with how
    the CPU is shared (under the whole suite's load that run lost 7 of 100 games to perfect play).

    At most 5 losses in 100 games against perfect play; the untrained network under the same 400-simulation search
    loses 27, 37 and 42 (seeds 0-2), so the bar shows the run learned, with room for what a loaded host does to a
    decoupled run: 3 losses in a fresh-clone suite of 2026-12-04 (the host's cores shared with an xz compression). Why the window and why not 0 (2026-12-03):
    with the window left at 10,000 this test lost 1 in a whole-suite CI run, and the same recipe on one host
    (hpcrl.rl.alphazero in one process, 24,000 positions) lost to perfect play in 2 of 12 seeds (2 and 4 games, all
    as the second player); with the window of the whole budget, 0 in all 12. This test with that window: 0, 0
    quiet, and 0, 1, 0, 0, 0 beside two CPU burners (the bar was 2 then). The decoupled run is not deterministic (which games reach
    the trainer, with which weights), so a rare opening may still go unlearnt, and the fault-tolerance this test
    is for must not fail on that."""
    import io

    from hpcrl.config.load import load_experiment
    from hpcrl.distributed import rendezvous, runstats
    from hpcrl.submit.pipeline import submit_experiment

    since = time.time()
    exp = load_experiment(CONFIGS / "tictactoe_alphazero_jobs.yaml", [f"output={tmp_path}", "sweep.seeds=[0]", "train.total_steps=24000", "train.replay_window=24000", "distributed.ratio_slack=0", *ON_NODES])
    out = io.StringIO()
    assert submit_experiment(exp, "slurm", detach=True, out=out) == 0, out.getvalue()
    exp_dir = exp.dir
    (run,) = load_runs(exp_dir)
    rd = run_dir(exp_dir, run.run_id)
    jobs = {j.stage: j for j in read_jobs(exp_dir)}
    total = run.config.train.total_steps

    def stats() -> dict:
        return runstats.read(rd) or {}

    wait_until("both self-play jobs feeding the trainer", lambda: stats().get("actors_alive") == 2 and stats().get("updates", 0) > 0, 240)
    trainer = job_nodes(f"{jobs['learner'].job_id}_1")
    players = {t: job_nodes(f"{jobs['actors'].job_id}_{t}") for t in (1, 2)}
    assert len({*trainer, *players[1], *players[2]}) == 3, (trainer, players)
    info = rendezvous.read(rd)
    assert info is not None and info.learner_host == trainer[0] and info.host.startswith("10.251.0."), info

    # A self-play job's node dies: the trainer goes on with the other; Slurm requeues the lost job elsewhere.
    at = stats()["env_steps"]
    assert at < total / 2, "the run went too fast to lose a node mid-run: raise train.total_steps"
    victim = players[2][0]
    cluster("kill-node", victim)
    wait_until("the lost self-play job reported dead", lambda: bool(stats().get("actors_dead")), 60)
    text = status_text(exp_dir)
    assert re.search(rf"actors 1/2 alive \(dead: \d on {victim}\), \S+ games/s", text), text
    going = stats()
    wait_until("the trainer learning on", lambda: stats().get("updates", 0) > going["updates"] + 20, 60)
    wait_node_down(victim)
    wait_finished(exp_dir, SlurmBackend(), since, timeout=600)

    assert int(rundir.done_step(rd) or 0) == total
    (perfect,) = [r for r in csv_rows(rd / "strength.csv") if r["opponent"] == "perfect"]
    assert int(perfect["games"]) == 100 and int(perfect["losses"]) <= 5, (perfect, runstats.read(rd))
    log = logs(exp_dir, "actors")
    print(f"\ndecoupled AlphaZero: trainer on {trainer[0]}, self-play on {players[1][0]} and {victim}; {victim} killed at {at} positions; "
          f"perfect play: {perfect}; {log.count('connected to learner')} connections; trainer stats {runstats.read(rd)}")


def test_an_optuna_study_runs_its_workers_on_several_nodes_over_one_journal_and_survives_losing_one(nodes: None, tmp_path: Path) -> None:
    """Three study workers on three nodes, one journal on the shared filesystem. A worker's node dies in the
    middle of its trial: Slurm requeues the task (same task id) onto another node, where the worker finds its
    record of the trial and resumes the trial's run from its checkpoint. Every trial is asked once and told
    once, and `hpcrl status` names the node the trial's first start was lost with."""
    pytest.importorskip("optuna", reason="Optuna studies need the optional extra: pip install 'hpcrl[optuna]'")
    from test_study import assert_every_trial_once, search, study_sweep, worker_log

    since = time.time()
    exp_dir, _ = study_sweep(
        tmp_path, "slurm", search(6), "resources.max_concurrent=3", "train.total_steps=24576", "train.checkpoint_every=2", *ON_NODES,
    )  # fmt: skip
    (job,) = [j for j in read_jobs(exp_dir) if j.stage == "study"]

    def training() -> tuple[Path, runlock.Holder] | None:
        """A trial's run with a checkpoint, well short of its end, and the live worker that trains it."""
        for rd in sorted((exp_dir / "runs").glob("*")):
            holder = runlock.lock_holder(rd)
            if holder and holder.host in NODES and any((rd / "checkpoints").glob("*.pt")) and rundir.last_logged_step(rd) < 12_000:
                return rd, holder
        return None

    wait_until("a trial half-way with a checkpoint", lambda: training() is not None, 240)
    found = training()
    assert found is not None, "the trial ended between two looks: raise train.total_steps"
    rd, holder = found
    killed_at = time.monotonic()
    cluster("kill-node", holder.host)
    seen: list[runlock.Holder] = []

    def resumed_elsewhere() -> bool:
        """The lost trial's run held by a worker on another node, or resumed there already: a trial the
        pruner stops at its first report after the resume ends between two looks (seen once, at step 2,816)."""
        h = runlock.lock_holder(rd)
        if h is not None and h.host != holder.host:
            seen.append(h)
            return True
        return f"{rd.name}: resumed from step" in worker_log(exp_dir)

    wait_until("the lost trial to resume elsewhere", resumed_elsewhere, 180)
    resumed_after = time.monotonic() - killed_at
    wait_node_down(holder.host)
    text = status_text(exp_dir)
    assert re.search(rf"lost on {holder.host} \(pid {holder.pid}, [\d:]+\): node down or killed", text), text
    wait_finished(exp_dir, SlurmBackend(), since, timeout=500)

    found_trials = assert_every_trial_once(exp_dir, 6)  # each trial asked once and told once, whichever node asked
    assert runlock.lost_starts(rd) == [holder]
    log = worker_log(exp_dir)
    resumed = re.search(rf"{rd.name}: resumed from step ([1-9]\d*)\b", log)
    assert resumed, log
    steps = [int(r["step"]) for r in csv_rows(rd / rundir.TRAIN_LOG)]
    assert steps == sorted(set(steps)), "a step of the lost trial was logged twice"
    # --duplicates: every start of a task, the lost one too (without it a requeued task shows only its last node).
    listing = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-j", job.job_id, "-o", "JobID,NodeList,State"], capture_output=True, text=True).stdout
    hosts = {line.split("|")[1] for line in listing.split() if line}
    assert holder.host in hosts and len(hosts) >= 3 and all(h.startswith("slurm-node") for h in hosts), listing  # three workers on three nodes, one journal file
    print(
        f"\nOptuna: 6 trials by 3 workers on {sorted(hosts)}; {holder.host} killed mid-trial, the trial resumed from step "
        f"{resumed.group(1)} on {seen[0].host if seen else 'another node'} {resumed_after:.0f} s later; "
        f"best value {max(t.value for t in found_trials if t.value is not None):.0f}"
    )


def test_a_cut_off_learner_keeps_its_run_alone_its_actors_stop_with_one_line_and_the_run_resumes_after(nodes: None, tmp_path: Path) -> None:
    """A partition: the learner's node lives on, unreachable. Slurm declares it DOWN and requeues the learner,
    but the cut-off learner still holds the run (its lock is on the shared filesystem): the second start on
    another node must not train it. The actors, which can reach neither, stop with one line each. Once the
    node is back (here rebooted: Slurm 22.05 leaves a requeued job's stale processes running on a node that
    returns, so its owner reboots it), `hpcrl sweep` again resumes the run from its checkpoint."""
    from hpcrl.distributed import runstats

    # A quarter of the learning run's gradient steps on a smaller network: this run's point is the partition.
    train = {**APEX["train"], "total_steps": 30_000, "hidden_sizes": [64, 64], "gradient_steps": 32}
    config = {**APEX, "train": train, "distributed": {**APEX["distributed"], "learner_timeout_s": 30}}
    exp_dir = submit_config(tmp_path, config)
    (run,) = load_runs(exp_dir)
    rd = run_dir(exp_dir, run.run_id)
    jobs = {j.stage: j for j in read_jobs(exp_dir)}
    wait_until(
        "a learner fed by two actors, with a checkpoint",
        lambda: (s := runstats.read(rd)) is not None and s["actors_alive"] == 2 and s["env_steps"] >= 4000 and any((rd / "checkpoints").glob("*.pt")),
        240,
    )
    (cut,) = job_nodes(f"{jobs['learner'].job_id}_1")
    holder = runlock.lock_holder(rd)
    assert holder is not None and holder.host == cut
    cluster("cut-node", cut)
    cut_at = time.monotonic()
    try:
        # The actors give up on the unreachable learner after learner_timeout_s, each in one line, and exit 75.
        wait_until("both actors to stop", lambda: logs(exp_dir, "actors").count("no learner for 30 s; exiting with 75") == 2, 120)
        stopped_after = time.monotonic() - cut_at
        # Slurm requeues the learner; its second start, elsewhere, finds the run held and does not train it.
        wait_until("the requeued learner to find the run held", lambda: "not starting a second trainer" in logs(exp_dir, "learner"), 180)
        refused_after = time.monotonic() - cut_at
        log = logs(exp_dir, "learner")
        assert f"is being trained by pid {holder.pid} on {cut}" in log, log
        assert runlock.lock_holder(rd) == holder  # still the cut-off learner's, and only its
        assert runlock.lost_starts(rd) == []  # no learner took the run from the cut-off one, none was lost
    finally:
        cluster("heal-node", cut)
    cluster("kill-node", cut)  # the node's owner reboots it: the stale learner goes with it
    cluster("revive-node", cut)
    wait_until("the old learner's lock to go", lambda: runlock.lock_holder(rd) is None, 60)
    assert runlock.lost_starts(rd) == [holder], runlock.lost_starts(rd)  # the one start that trained it, gone with the reboot
    wait_until("every task of the run to end", lambda: not active_tasks(exp_dir, SlurmBackend()), 120)

    import io

    from hpcrl.config.load import load_experiment
    from hpcrl.submit.pipeline import submit_experiment

    again, resubmitted = io.StringIO(), time.time()
    assert submit_experiment(load_experiment(tmp_path / "apex.yaml"), "slurm", detach=True, out=again) == 0, again.getvalue()
    assert "submitted 1 of 1 runs" in again.getvalue(), again.getvalue() + status_text(exp_dir)
    wait_finished(exp_dir, SlurmBackend(), resubmitted, timeout=400)
    assert_resumed_to_its_budget(rd, logs(exp_dir, "learner"), 30_000)
    print(f"\npartition: learner on {cut} cut off; actors stopped {stopped_after:.0f} s later, the requeued learner refused the held run "
          f"{refused_after:.0f} s after the cut; after a reboot of {cut}, `hpcrl sweep` resumed the run to step 30000")


def test_the_bridge_benchmark_runs_at_a_tiny_size(nodes: None, redis_installed: None) -> None:
    """benchmarks/distributed.py bridge (the pipe and DD-PPO's all-reduce across the bridge beside loopback)."""
    import os
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(repo / "benchmarks" / "distributed.py"), "bridge", "--actors", "1", "--seconds", "0.3"], capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert re.search(r"^\s+1\s+[\d.]+\s+[\d.]+\s+[\d.]+$", proc.stdout, re.M) and re.search(r"^\s+1000000\s+[\d.]+\s+[\d.]+\s+[\d.]+$", proc.stdout, re.M), proc.stdout


def stale_ranks(node: str, exp_dir: Path) -> list[int]:
    """Pids of the run's trainer processes still alive on a namespace node."""
    pids = subprocess.run(["ip", "netns", "pids", node], capture_output=True, text=True).stdout.split()
    found = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(exp_dir) in cmd and " train " in cmd and "srun" not in cmd:
            found.append(int(pid))
    return found


def test_a_ddppo_run_whose_node_is_cut_off_ends_its_start_within_the_collective_timeout_and_resumes(nodes: None, tmp_path: Path) -> None:
    """A partition under DD-PPO: the rank on the cut node and its peer each wait at most collective_timeout for
    the other (no hang), Slurm requeues the job, and the run resumes whole from its checkpoint on nodes that
    answer; the cut-off rank never writes the run after its start ended (one writer: train.csv stays ordered)."""
    since = time.time()
    # The ranks wait longer for each other than Slurm takes to declare the cut node DOWN (25-30 s): the start
    # ends as the node's (NODE_FAIL, requeued), not as the run's own failure.
    # 40k steps, not DDPPO's 100k: this test is about the partition (learning across nodes is the node-kill test's).
    exp_dir, _ = sweep(tmp_path, SlurmBackend(), *DDPPO, "resources.collective_timeout=90", "train.total_steps=40000")
    (run,) = load_runs(exp_dir)
    rd = run_dir(exp_dir, run.run_id)
    train = next(j for j in read_jobs(exp_dir) if j.stage == "train")
    wait_until("a checkpoint past 25k steps", lambda: rundir.last_logged_step(rd) >= 25_000 and any((rd / "checkpoints").glob("*.pt")), 240)
    held = job_nodes(f"{train.job_id}_1")
    assert len(held) == 2, held
    cut = held[1]  # rank 1's: it outlives its start, cut off, until its collective times out under the new start
    cluster("cut-node", cut)
    cut_at = time.monotonic()
    try:
        wait_until("the run to resume", lambda: "resumed from step" in logs(exp_dir, "train"), 240)
        resumed_after = time.monotonic() - cut_at
        # The cut-off rank times out only now, under the new start (its words reach no log: its srun died with
        # the other node's job): it must not mark the run failed.
        assert stale_ranks(cut, exp_dir), "rank 1 did not outlive its start on the cut node"
        wait_until("the cut-off rank to time out and exit", lambda: not stale_ranks(cut, exp_dir), 150)
        assert not rundir.is_failed(rd), rundir.reason(rd, rundir.FAILED)
    finally:
        cluster("heal-node", cut)
    wait_finished(exp_dir, SlurmBackend(), since, timeout=300)
    log = logs(exp_dir, "train")
    steps = [int(r["step"]) for r in csv_rows(rd / rundir.TRAIN_LOG)]
    assert steps == sorted(steps), "two writers' rows interleaved in train.csv"
    assert int(rundir.done_step(rd) or 0) >= 40_000
    (row,) = csv_rows(exp_dir / "results" / "summary.csv")
    print(f"\nDD-PPO partition: {cut} cut at >= 25k steps; the run resumed {resumed_after:.0f} s later on {rank_hosts(log)[-1]}; final eval {float(row['mean']):.0f}")
    # The resumed run kept what it had learned. 475 (solved) was the 100k-step budget's bar, kept when this test went
    # to 40k: these settings in one process of 8 envs, 10 episodes, reach 446 / 500 / 500 at 40k steps (seeds 0-2) and
    # 142 / 164 / 458 at 15k, what seed 0 would score had the resume at >= 25k started it again; the run here scored 466.
    assert float(row["mean"]) >= 400, row


def test_the_suite_s_start_beside_a_test_leaves_a_killed_node_down_and_a_racing_revive_brings_it_back(nodes: None) -> None:
    start_beside_a_killed_node(SLURM_SH, NODES[1], kill="kill-node", revive="revive-node", start=["--nodes", str(len(NODES))])
    assert node_state(NODES[1]) == "idle"
