"""`hpcrl learner`: the learner job of a distributed run (Ape-X's learner, or AlphaZero's trainer).

It owns the run: starts the Redis (or uses the external one), publishes the rendezvous and the
parameters, learns from what the actors send, and is the only writer of the run's checkpoints,
train.csv, stats file and markers. Like `hpcrl train` it is idempotent under requeue: a run with
DONE exits at once; otherwise it resumes from the newest checkpoint (network, target, optimiser,
replay, counters, parameter version, RNG states). On the scheduler's warning signal it stops
taking batches, counts the ones still queued as lost, checkpoints and exits with REQUEUE_EXIT;
its actors keep running and reconnect to the next start, which writes a new rendezvous.
Its train.csv rows go through the run's one sink (hpcrl.runtime.runlog), to the optional trackers too,
and with `eval.every_steps` it evaluates its network as `hpcrl train` does (periodic_eval.py): it is
the one that has it.

What is learned is the algorithm's half (`learning_half`): apex.ApexLearner for DQN,
selfplay.AlphaZeroLearner for AlphaZero; this module is the job around it, and pace.py decides when
it updates and when it takes data (the set ratio, with `distributed.ratio_slack`). Its stats file also
says how busy it was: time in updates (`busy_s`) since its first update (`learning_s`), and the
stretches it waited for data after that (`wait_s`, the longest `wait_max_s`), and the update ratio
it realised (`pace`, 1.0: the set one).
"""

from __future__ import annotations

import math
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any, TextIO

import redis
import torch

from hpcrl import games
from hpcrl.distributed import rendezvous, runstats
from hpcrl.distributed.apex import ApexLearner
from hpcrl.distributed.board import DONE, FAILED, RUNNING, STOPPING, Board, run_prefix
from hpcrl.distributed.pace import Pace
from hpcrl.distributed.queue import Consumer
from hpcrl.distributed.redis_server import RedisServer
from hpcrl.distributed.selfplay import AlphaZeroLearner
from hpcrl.rl import checkpoint, periodic_eval
from hpcrl.rl.envs import make_vec_env
from hpcrl.rl.train import seed_everything, setup_torch
from hpcrl.runtime.guard import StopFlag, guarded_run
from hpcrl.runtime.launch import how_it_ended
from hpcrl.runtime.runlog import open_runlog
from hpcrl.store import rundir
from hpcrl.store.expdir import Run
from hpcrl.store.states import REQUEUE_EXIT

UPDATES_PER_POLL = 8
"""Updates between two looks at the queue: the queue is drained often, yet a poll costs little."""
DIST_COLUMNS = ("actors_alive", "queue_depth", "lag_mean", "dropped_stale", "malformed", "backpressure_waits")
COUNT_COLUMNS = frozenset(DIST_COLUMNS) - {"lag_mean"}
"""Integers written to train.csv as they are (the other cells have 6 significant digits)."""
COUNTERS = ("dropped_stale", "dropped_stale_transitions", "malformed", "lost")
"""Counters carried across learner restarts in the checkpoint (the consumer's restart at zero)."""


def run_learner(experiment_dir: Path, run: Run, out: TextIO | None = None) -> int:
    """Learn one run to completion (or to the next preemption). Returns the process exit code."""
    return guarded_run(experiment_dir, run, lambda rd, stop: Learner(experiment_dir, rd, run, stop, out).run(), out)


def learning_half(run: Run, device: torch.device) -> ApexLearner | AlphaZeroLearner:
    """What the learner learns with: Ape-X's DQN on the env's spaces, or AlphaZero's trainer on the game."""
    cfg, d = run.config, run.config.distributed
    assert d is not None
    if cfg.algo == "alphazero":
        return AlphaZeroLearner(cfg.train, d, games.load(cfg.env), device)  # type: ignore[arg-type]  # the run's AlphaZeroConfig
    probe = make_vec_env(cfg.env, 1)
    try:
        obs_space, action_space = probe.single_observation_space, probe.single_action_space
    finally:
        probe.close()
    return ApexLearner(cfg.train, d, obs_space, action_space, device)  # type: ignore[arg-type]  # the run's DQNConfig


REDIS_GONE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
"""What redis-py raises when the server is gone or does not answer (it retries once before)."""


class RedisGone(rundir.RunError):
    """The run's Redis stopped answering: the run fails with one line that names it."""


def redis_gone_how(exc: BaseException, server: RedisServer | None) -> str:
    """How the Redis went away: the learner's own server's end when it ended, else redis-py's words."""
    code = server.proc.poll() if server is not None and server.proc is not None else None
    if code is not None:
        return f"its redis-server {how_it_ended(code)}"
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def connect_external(address: str, password_env: str) -> redis.Redis:
    host, _, port = address.rpartition(":")
    return redis.Redis(host=host, port=int(port), password=os.environ.get(password_env) or None, socket_timeout=30, socket_connect_timeout=10)


class Learner:
    def __init__(self, experiment_dir: Path, rd: Path, run: Run, stop: StopFlag, out: TextIO | None) -> None:
        self.experiment_dir, self.rd, self.run_, self.stop, self.out = experiment_dir, rd, run, stop, out
        self.cfg = run.config
        assert self.cfg.distributed is not None
        self.d = self.cfg.distributed
        self.total_steps = self.cfg.train.total_steps
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.actor_stats: dict[int, dict[str, Any]] = {}
        self.dead: set[int] = set()
        self.episodes: list[tuple[float, int]] = []
        self.metrics: dict[str, float] = {}
        self.pace = Pace(self.d.ratio_slack, UPDATES_PER_POLL)
        self.busy_s = self.wait_s = self.wait_max_s = 0.0
        self.first_update: float | None = None
        """time.monotonic() of this lifetime's first update."""
        self.waiting_since: float | None = None

    def log(self, text: str) -> None:
        print(f"{self.run_.run_id}: {text}", file=self.out, flush=True)

    # ------------------------------------------------------------------ setup
    def run(self) -> int:
        tcfg = self.cfg.train
        device = setup_torch(tcfg.torch_threads, tcfg.device)
        seed_everything(self.run_.seed)
        state, problems = checkpoint.load_latest(self.rd / "checkpoints")
        for problem in problems:
            self.log(f"skipped checkpoint {problem}")
        self.algo = learning_half(self.run_, device)
        self.device = device
        self.saved_eval = state.get("periodic_eval") if state else None
        self.elapsed = 0.0
        if state:
            self.algo.load_state_dict(state["agent"])
            checkpoint.set_rng_state(state["rng"])
            self.elapsed = float(state["wall_time"])
            self.counters.update({k: int(v) for k, v in state["counters"].items()})
            self.log(f"resumed from step {self.algo.global_step} (update {self.algo.updates}, parameter version {self.algo.version})")
        server = None
        if self.d.redis.address:
            client = connect_external(self.d.redis.address, self.d.redis.password_env)
            host, port = self.d.redis.address.rpartition(":")[::2]
            password = os.environ.get(self.d.redis.password_env, "")
        else:
            server = RedisServer(self.d.redis.bind, self.d.redis.executable, log_path=self.rd / "redis.log").start()
            client = server.client(socket_timeout=30, socket_connect_timeout=10)
            host, port, password = server.host, str(server.port), server.password
        self.instance = secrets.token_hex(8)
        try:
            self.board = Board(client, run_prefix(self.run_.run_id))
            self.board.publish(self.algo.version, self.algo.params())
            self.board.set_status(RUNNING)
            rendezvous.write(self.rd, rendezvous.Rendezvous(host, int(port), password, self.board.keys.prefix, self.instance, socket.gethostname(), os.getpid()))
            self.log(f"learner {self.instance} serving on {host}:{port}; waiting for {self.d.actors} actors")
            transit = self.d.queue_bound * self.d.batch_transitions * self.algo.ratio / self.d.publish_every
            if transit > self.d.max_lag:
                self.log(
                    f"warning: a full queue holds about {transit:.0f} parameter versions of data, more than max_lag {self.d.max_lag}: "
                    "expect stale drops; lower distributed.queue_bound or raise max_lag or publish_every"
                )
            self.consumer = Consumer(client, self.board.keys.queue, self.algo.validate, self.d.max_lag, log=self.out)
            return self._loop()
        except REDIS_GONE as exc:
            self._set_status_quietly(FAILED)
            raise RedisGone(f"Redis at {host}:{port} went away ({redis_gone_how(exc, server)}): the run's board and queue went with it") from None
        except BaseException:
            self._set_status_quietly(FAILED)
            raise
        finally:
            rendezvous.remove(self.rd, self.instance)
            client.close()
            if server is not None:
                server.stop()

    def _set_status_quietly(self, status: str) -> None:
        try:
            self.board.set_status(status)
        except (AttributeError, redis.exceptions.RedisError):
            pass

    # ------------------------------------------------------------------ main loop
    def _loop(self) -> int:
        algo, d = self.algo, self.d
        resume_step = algo.global_step
        evaluator = lambda: periodic_eval.start(self.run_, self.rd, algo.policy, self.device, resume_step, self.saved_eval, self.out)  # noqa: E731
        with open_runlog(self.experiment_dir, self.run_, self.rd, algo.metric_names + DIST_COLUMNS, resume_step, self.out, counts=COUNT_COLUMNS, evaluator=evaluator) as self.runlog:
            self.start, self.start_step = time.monotonic(), algo.global_step
            self.last_report, self.last_report_step = self.start, algo.global_step
            next_checkpoint = algo.updates + self.cfg.train.checkpoint_every
            while not self.pace.finished(algo, self.total_steps):
                self._check_actors_came()
                ready, polled = self.pace.may_update(algo, self.total_steps), time.monotonic()
                self._poll()
                self._note_wait(polled, ready)
                for _ in range(UPDATES_PER_POLL):
                    if not self.pace.may_update(algo, self.total_steps):
                        break
                    began = time.monotonic()
                    self.metrics = algo.update(self.total_steps)
                    if algo.updates % d.publish_every == 0:
                        algo.version += 1
                        self.board.publish(algo.version, algo.params())
                    self.busy_s += time.monotonic() - began
                if time.monotonic() - self.last_report >= d.heartbeat_s:
                    self._report(RUNNING)
                self._maybe_evaluate(final=False)
                if self.stop:
                    self.board.set_status(STOPPING)
                    self.counters["lost"] += self.board.queue_depth()  # pushes are refused from now on
                    self._save()
                    self._report(STOPPING)
                    self.log(f"signal {self.stop.signal} at step {algo.global_step}: checkpointed, asking for a requeue")
                    return REQUEUE_EXIT
                if algo.updates >= next_checkpoint:
                    self._save()
                    next_checkpoint = algo.updates + self.cfg.train.checkpoint_every
            self._maybe_evaluate(final=True)
            self._save()
            rundir.mark_done(self.rd, algo.global_step)
            self.board.set_status(DONE)
            self._report(DONE)
        self._wait_for_actors_to_leave()
        self.board.retire()
        self.log(f"done at step {algo.global_step} after {algo.updates} updates ({_pace_words(self.pace.realised(algo))})")
        return 0

    def _note_wait(self, polled: float, ready: bool) -> None:
        """Time the learner could not update for want of data, once it had begun to learn (the fill
        before the first update, and the end of the budget, are not waits). A wait starts when a poll
        began with nothing to update (`ready` false: the poll blocks for a batch), so the time spent
        blocked in a poll that then brought data counts too."""
        if not ready and self.first_update is not None and self.waiting_since is None and self.algo.global_step < self.total_steps:
            self.waiting_since = polled
        now = time.monotonic()
        if self.pace.may_update(self.algo, self.total_steps):
            if self.first_update is None:
                self.first_update = now
            if self.waiting_since is not None:
                waited = now - self.waiting_since
                self.wait_s += waited
                self.wait_max_s = max(self.wait_max_s, waited)
                self.waiting_since = None

    def _maybe_evaluate(self, final: bool) -> None:
        """An evaluation during training when one is due (eval.every_steps); the actors keep playing meanwhile."""
        self.runlog.evaluate(self.algo.global_step, final, lambda: self.elapsed + time.monotonic() - self.start)

    def _check_actors_came(self) -> None:
        """Fail when no actor has shown up for learner_timeout_s in this lifetime (a heartbeat or a
        batch): actor jobs that are never scheduled must not hold the learner's GPU forever."""
        if self.actor_stats or self.consumer.batches or self.consumer.dropped:
            return
        if time.monotonic() - self.start > self.d.learner_timeout_s:
            raise rundir.RunError(f"no actor connected in {self.d.learner_timeout_s:g} s (distributed.learner_timeout_s): were the actor jobs scheduled?")

    def _poll(self) -> None:
        """Take batches from the queue: many while filling the replay, as many as updates are wanted
        once they gate the pace (pace.py: none while enough is owed, unless the slack lets the learner
        relieve a filling queue), none once total_steps transitions came in. The batch that crosses the
        budget is cut, so the run learns from exactly total_steps env steps (stale drops count too:
        they were env steps)."""
        algo = self.algo
        remaining = self.total_steps - algo.global_step
        if remaining <= 0:
            return
        if algo.accepted < algo.starts_at:
            wanted = 64
        else:
            updates = self.pace.updates_wanted(algo, lambda: 2 * self.board.queue_depth() >= self.d.queue_bound)
            if updates <= 0:
                return  # enough to learn from: leave the batches queued, so a fast actor blocks instead of racing ahead
            wanted = int(min(64, max(1, math.ceil(updates / algo.ratio / self.d.batch_transitions))))
        wanted = min(wanted, math.ceil(remaining / self.d.batch_transitions))
        dropped_before = self.consumer.dropped_transitions
        batches = self.consumer.pop(algo.version, wanted, timeout=0.0 if self.pace.may_update(algo, self.total_steps) else 0.05)
        algo.global_step += self.consumer.dropped_transitions - dropped_before
        for message, n in batches:
            take = min(n, self.total_steps - algo.global_step)
            if take > 0:
                algo.ingest(message.fields, take)
            self.episodes.extend(zip(message.fields["ep_return"].tolist(), message.fields["ep_length"].tolist()))

    def _save(self) -> None:
        payload = {
            "agent": self.algo.state_dict(), "rng": checkpoint.rng_state(), "counters": self._counters(),
            "wall_time": self.elapsed + time.monotonic() - self.start, **self.runlog.state_dict(),
        }
        checkpoint.save(self.rd / "checkpoints", self.algo.global_step, payload, keep=self.cfg.train.keep_checkpoints)

    def _counters(self) -> dict[str, int]:
        c = self.consumer
        return {
            "dropped_stale": self.counters["dropped_stale"] + c.dropped, "dropped_stale_transitions": self.counters["dropped_stale_transitions"] + c.dropped_transitions,
            "malformed": self.counters["malformed"] + c.malformed, "lost": self.counters["lost"] + c.lost,
        }

    # ------------------------------------------------------------------ reporting
    def _report(self, status: str) -> None:
        """Actors' liveness from their expiring heartbeats, the stats file, and a train.csv row."""
        algo, now = self.algo, time.monotonic()
        heartbeats = self.board.heartbeats()
        for i, stats in heartbeats.items():
            if stats is not None:
                self.actor_stats[i] = stats
                if i in self.dead:
                    self.dead.discard(i)
                    self.log(f"actor {i} is back")
            elif i not in self.dead:
                self.dead.add(i)
                self.log(f"actor {i}: no heartbeat for {self.d.dead_after_s:g} s, counted dead; learning goes on")
        alive = sorted(i for i, s in heartbeats.items() if s is not None)
        sps = (algo.global_step - self.last_report_step) / max(now - self.last_report, 1e-9)
        report_start = self.last_report
        self.last_report, self.last_report_step = now, algo.global_step
        lag_mean, lag_max = self.consumer.take_lag_window()
        counters = self._counters()
        depth = self.board.queue_depth() if status == RUNNING else 0
        episodes, self.episodes = self.episodes, []
        stats = {
            "time": time.time(), "status": status, "instance": self.instance, "learner_host": socket.gethostname(),
            "env_steps": algo.global_step, "total_steps": self.total_steps, "env_sps": sps, "updates": algo.updates,
            "units": list(algo.units), "episodes_per_s": len(episodes) / max(now - report_start, 1e-9), "batches": self.consumer.batches,
            "busy_s": self.busy_s, "learning_s": now - self.first_update if self.first_update is not None else 0.0,
            "pace": self.pace.realised(algo), "ratio_slack": self.d.ratio_slack,
            "wait_s": self.wait_s, "wait_max_s": self.wait_max_s,
            "param_version": algo.version, "replay_size": algo.replay.size, "queue_depth": depth, "queue_bound": self.d.queue_bound,
            "actors_expected": self.d.actors, "actors_alive": len(alive), "actors_dead": sorted(self.dead),
            "actors": {str(i): {"alive": i in alive, **s} for i, s in sorted(self.actor_stats.items())},
            "lag_mean": lag_mean, "lag_max": lag_max,
            "backpressure_waits": sum(int(s.get("blocked", 0)) for s in self.actor_stats.values()),
            "backpressure_s": sum(float(s.get("blocked_s", 0.0)) for s in self.actor_stats.values()),
            **counters,
        }
        runstats.write(self.rd, stats)
        metrics = {**self.metrics, "replay_size": algo.replay.size, "param_version": algo.version, "lr": algo.lr,
            "actors_alive": len(alive), "queue_depth": depth, "lag_mean": lag_mean, "dropped_stale": counters["dropped_stale"],
            "malformed": counters["malformed"], "backpressure_waits": stats["backpressure_waits"],
        }  # fmt: skip
        self.runlog.row(algo.global_step, algo.updates, self.elapsed + now - self.start, sps, episodes, metrics)

    def _wait_for_actors_to_leave(self) -> None:
        """Give actors a moment to read `done` from the board (they exit 0 then) before Redis goes away."""
        deadline = time.monotonic() + self.d.dead_after_s + self.d.heartbeat_s
        while time.monotonic() < deadline:
            if not any(s is not None for s in self.board.heartbeats().values()):
                return
            time.sleep(0.1)


def _pace_words(pace: float | None) -> str:
    return "no update earned" if pace is None else f"{pace:.3f}x the set updates per unit of data"
