"""`hpcrl train`: the train stage's entry point inside a job.

Idempotent by design, because schedulers rerun jobs: a run with DONE exits at once, a run with
checkpoints resumes from the newest (model, optimiser, RNG, counters, algorithm extras), and
train.csv is cut back to the checkpoint's step so the log never holds the same steps twice.
Its rows go through the run's one sink (hpcrl.runtime.runlog): train.csv, the optional trackers,
and with `eval.every_steps` the evaluations on held-out episodes as it trains (periodic_eval.py).
On SIGUSR1/SIGTERM (the scheduler's warning before a time limit or preemption, or Ctrl-C's
cleanup) it checkpoints at the next iteration boundary and exits with REQUEUE_EXIT.

A run of several ranks (`resources.ranks`, DD-PPO) starts this once per rank (hpcrl/rl/ddp.py
says how they meet). Every rank resumes from the same checkpoint and steps its own envs; rank 0
alone holds the run's lock and writes train.csv, checkpoints, evaluations and markers, and every
rank stops at the same iteration when any of them is warned, so rank 0's checkpoint is every
rank's. A rank that leaves makes the others fail within resources.collective_timeout.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from hpcrl import games
from hpcrl.rl import checkpoint, periodic_eval
from hpcrl.rl.algorithms import algorithm_class, pipelines_envs, setup_torch
from hpcrl.rl.alphazero import AlphaZero
from hpcrl.rl.ddp import RankError, Ranks
from hpcrl.rl.envs import make_vec_env
from hpcrl.rl.networks import cpu_precision
from hpcrl.rl.ppo import OnPolicyAgent
from hpcrl.runtime.guard import StopFlag, guarded_run
from hpcrl.runtime.runlog import Callback, open_runlog
from hpcrl.store import expdir, rundir
from hpcrl.store.expdir import Run
from hpcrl.store.states import REQUEUE_EXIT


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train_run(experiment_dir: Path, run: Run, out=None, progress: Callback | None = None) -> int:
    """Train one run to completion (or to the next preemption). Returns the process exit code.

    `progress` (an Optuna trial's reporter) may end the training early: the run is then DONE at
    that step, with a PRUNED marker giving the reason."""
    ranks = Ranks.from_env()
    if ranks.world != run.config.resources.ranks:
        print(f"hpcrl: error: {run.run_id}: started as {ranks.world} rank(s), but resources.ranks is {run.config.resources.ranks}: launch it as the job script does", file=sys.stderr)
        return 2
    body = lambda rd, stop: _train(experiment_dir, rd, run, stop, out, progress, ranks)  # noqa: E731
    if ranks.is_main:
        return guarded_run(experiment_dir, run, body, out)
    return _other_rank(experiment_dir, run, ranks, body)


def _other_rank(experiment_dir: Path, run: Run, ranks: Ranks, body: Callable[[Path, StopFlag], int]) -> int:
    """A rank other than 0: no lock and no markers of its own (rank 0 holds and writes them), but
    a failure it alone saw (a peer that left) is the run's reason, once the ranks had met."""
    rd = expdir.run_dir(experiment_dir, run.run_id)
    if rundir.is_done(rd):
        return 0
    try:
        return body(rd, StopFlag())
    except RankError as exc:
        # Rank 0 may have finished the run before this rank saw its peers leave, or the run may have started
        # again elsewhere while this rank sat cut off from them: then the failure is not the run's.
        if ranks.met and not rundir.is_done(rd) and ranks.current(rd):
            rundir.mark(rd, rundir.FAILED, str(exc))
        print(f"hpcrl: error: {run.run_id}: {rundir.failed_line('train', str(exc))}", file=sys.stderr)
        return 1


def _train(experiment_dir: Path, rd: Path, run: Run, stop: StopFlag, out, progress: Callback | None = None, ranks: Ranks | None = None) -> int:
    cfg = run.config
    tcfg = cfg.train
    ranks = ranks or Ranks.single()
    device = setup_torch(tcfg.torch_threads, tcfg.device, ranks.local_rank)
    ranks.init(rd, device, cfg.resources.collective_timeout)
    if ranks.distributed:  # each rank says where it runs, in one write: the ranks share the job's log
        stream = out if ranks.is_main and out is not None else sys.stdout
        stream.write(f"{run.run_id} ({ranks.label()}): {ranks.where}\n")
        stream.flush()
    try:
        return _train_ranks(experiment_dir, rd, run, stop, out if ranks.is_main else io.StringIO(), progress, ranks, device)  # rank 0 speaks for the run
    finally:
        ranks.close()


def _train_ranks(experiment_dir: Path, rd: Path, run: Run, stop: StopFlag, out, progress: Callback | None, ranks: Ranks, device: torch.device) -> int:
    cfg = run.config
    tcfg = cfg.train
    seed_everything(run.seed)  # the same initial weights on every rank (rank 0's are broadcast anyway)
    ckpt_dir = rd / "checkpoints"
    state, problems = checkpoint.load_latest(ckpt_dir)
    for problem in problems:
        print(f"{run.run_id}: skipped checkpoint {problem}", file=out)
    # A resumed run reseeds its envs differently, so it does not replay the episodes it already saw;
    # rank r steps the envs that 1 rank with `ranks` times the envs would give seeds r*N .. r*N+N-1.
    iteration = int(state["agent"]["iteration"]) if state else 0
    env_seed = run.seed * 1000 + iteration + ranks.rank * cfg.env.num_envs
    envs = games.load(cfg.env) if games.is_game_env(cfg.env) else make_vec_env(cfg.env, pipelined=pipelines_envs(cfg.algo, device))  # AlphaZero's agent takes the game
    agent = None
    try:
        agent = algorithm_class(cfg.algo)(tcfg, envs, device, env_seed, **({"ranks": ranks} if ranks.distributed else {}))
        elapsed = 0.0
        if state:
            agent.load_state_dict(state["agent"])
            checkpoint.set_rng_state(state["rng"])
            elapsed = float(state["wall_time"])
            where = f" ({ranks.label()})" if ranks.distributed else ""
            stream = out if ranks.is_main and out is not None else sys.stdout  # each rank says it, in one write: the ranks share the job's log
            stream.write(f"{run.run_id}{where}: resumed from step {agent.global_step}\n")
            stream.flush()
        if ranks.rank:  # rank 0's RNG streams are in the checkpoint; the others draw their own actions
            seed_everything(int.from_bytes(hashlib.sha256(f"{run.seed}/{ranks.rank}/{iteration}".encode()).digest()[:4], "little"))
        if device.type == "cpu" and (precision := cpu_precision(tcfg.amp)):
            print(f"{run.run_id}: {precision}", file=out)
        if agent.planned_steps != tcfg.total_steps:
            print(f"{run.run_id}: train.total_steps {tcfg.total_steps} rounded up to {agent.planned_steps}, whole iterations of {agent.planned_steps // agent.num_iterations} steps", file=out)
        resume_step = agent.global_step
        main = ranks.is_main  # rank 0 alone writes the run's rows (runtime/runlog.py)
        saved_eval = state.get("periodic_eval") if state else None
        evaluator = lambda: periodic_eval.start(run, rd, agent.policy, device, resume_step, saved_eval, out)  # noqa: E731
        with open_runlog(experiment_dir, run, rd, agent.metric_names, resume_step, out, evaluator=evaluator, callbacks=[progress] if progress else []) if main else contextlib.nullcontext() as runlog:
            start, start_step = time.monotonic(), agent.global_step

            def save() -> None:
                if runlog is None:
                    return
                payload = {"agent": agent.state_dict(), "rng": checkpoint.rng_state(), "wall_time": elapsed + time.monotonic() - start, **runlog.state_dict()}
                checkpoint.save(ckpt_dir, agent.global_step, payload, keep=tcfg.keep_checkpoints)

            if isinstance(agent, AlphaZero):
                agent.stop = lambda: bool(stop)
            while not agent.finished:
                before = agent.global_step
                metrics = agent.train_iteration()
                if agent.global_step <= before and not stop:  # it would never finish: fail, as no requeue could help
                    raise rundir.RunError(f"a training iteration made no progress (still at step {before} of {agent.planned_steps}): the run would never finish")
                now = time.monotonic()
                episodes, agent.episodes = ranks.gather(agent.episodes), []
                warned = ranks.any(stop.signal is not None)  # every rank stops at this iteration
                if runlog is None:  # not rank 0
                    if warned:
                        ranks.leave_for_requeue()
                        return REQUEUE_EXIT
                    continue
                sps = (agent.global_step - start_step) / max(now - start, 1e-9)
                scalars = runlog.row(agent.global_step, agent.iteration, elapsed + now - start, sps, episodes, metrics)
                scalars.update(runlog.evaluate(agent.global_step, agent.finished, lambda: elapsed + time.monotonic() - start))
                if (why := runlog.report(agent.global_step, scalars)) and not agent.finished:
                    save()
                    rundir.mark(rd, rundir.PRUNED, why)
                    break
                if warned:
                    save()
                    ranks.leave_for_requeue()
                    print(f"{run.run_id}: signal {stop.signal or 'on another rank'} at step {agent.global_step}: checkpointed, asking for a requeue", file=out)
                    return REQUEUE_EXIT
                if agent.iteration % tcfg.checkpoint_every == 0:
                    save()
            else:  # not pruned: the final checkpoint
                save()
    finally:
        if isinstance(agent, OnPolicyAgent):  # its background rollout ends before its envs close
            agent.close()
        envs.close()
    if not ranks.is_main:
        return 0
    rundir.mark_done(rd, agent.global_step)
    print(f"{run.run_id}: {rundir.first_line(rd, rundir.PRUNED) or 'done'} at step {agent.global_step}", file=out)
    return 0
