"""`hpcrl actor`: one actor job of a distributed run (an Ape-X actor, or an AlphaZero self-play job).

An actor holds no state worth saving: it finds the learner through the rendezvous file, fetches
parameters when their version changes, steps its envs (or plays its games: `acting_half`) and
pushes batches. What it must get right
is the learner's absence:

- at start, and whenever the learner goes away (killed, requeued, node lost), it waits for a
  rendezvous, retrying with backoff up to 5 s and re-reading the file (a requeued learner comes
  back on another node, port and password); a learner that is `stopping` is waited for under a new
  instance token, since the old one will not come back;
- batches built but not queued are kept (queue.Outbox) and sent to the next learner (which drops
  them as stale if they are, and counts them);
- when the learner is gone for longer than `distributed.learner_timeout_s`, or failed, the actor
  exits with ORPHANED_EXIT (75) instead of burning its CPU allocation; when the run is done (board
  status or DONE marker) it exits 0; on the scheduler's warning signal it exits with
  REQUEUE_EXIT like every hpcrl job.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import TextIO

import redis

from hpcrl import games
from hpcrl.config.schema import ConfigError
from hpcrl.distributed import rendezvous, wire
from hpcrl.distributed.apex import ApexActor
from hpcrl.distributed.board import DONE, FAILED, Board, connect, parse_status, parse_version
from hpcrl.distributed.queue import NotRunning, Outbox, Producer
from hpcrl.distributed.selfplay import SelfPlayActor
from hpcrl.rl.envs import make_vec_env
from hpcrl.rl.train import setup_torch
from hpcrl.runtime.guard import StopFlag
from hpcrl.store import rundir
from hpcrl.store.expdir import Run, run_dir
from hpcrl.store.states import REQUEUE_EXIT

ORPHANED_EXIT = 75
"""The learner has been gone longer than the timeout, or failed (EX_TEMPFAIL: submit the run again)."""

_CONNECTION_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


class _Stopped(Exception):
    """The scheduler's warning signal arrived while the actor was blocked."""


def run_actor(experiment_dir: Path, run: Run, actor: int, out: TextIO | None = None) -> int:
    """Act for one run until it is done, the learner is gone for good, or a signal. Returns the exit code."""
    rd = run_dir(experiment_dir, run.run_id)
    d = run.config.distributed
    if d is None:
        raise ConfigError(f"{run.run_id}: the config has no distributed section, so the run has no actors (its train stage learns it alone)")
    if not 0 <= actor < d.actors:
        raise ConfigError(f"actor index {actor} out of range: the run has {d.actors} actors (0..{d.actors - 1})")
    if rundir.is_done(rd):
        print(f"{run.run_id} actor {actor}: run already done", file=out)
        return 0
    stop = StopFlag()
    setup_torch(1)
    policy = acting_half(run, actor)
    try:
        return Actor(rd, run, actor, stop, policy, out).run()
    finally:
        policy.close()


def acting_half(run: Run, actor: int) -> ApexActor | SelfPlayActor:
    """What an actor job runs between round trips: Ape-X's epsilon-greedy envs, or AlphaZero's self-play games."""
    cfg, d = run.config, run.config.distributed
    assert d is not None
    if cfg.algo == "alphazero":
        return SelfPlayActor(cfg.train, d, games.load(cfg.env), actor, run.seed)  # type: ignore[arg-type]  # the run's AlphaZeroConfig
    return ApexActor(cfg.train, d, make_vec_env(cfg.env, d.envs_per_actor), actor, run.seed)  # type: ignore[arg-type]


class Actor:
    def __init__(self, rd: Path, run: Run, actor: int, stop: StopFlag, policy: ApexActor | SelfPlayActor, out: TextIO | None) -> None:
        self.rd, self.run_id, self.actor, self.stop, self.out = rd, run.run_id, actor, stop, out
        assert run.config.distributed is not None
        self.d = run.config.distributed
        self.policy = policy
        self.instance: str | None = None
        self.version = -1
        self.batch_version: int | None = None
        """The parameter version the batch being built was first acted with: its stamp. The actor may step
        on while its outbox waits, and a round trip may bring new parameters before the batch is done;
        the batch then carries its oldest version, so the learner's lag and max_lag see its oldest step."""
        self.seq = 0
        self.outbox = Outbox(self.d.batches_per_send, self.d.send_delay_s)
        """Batches built but not queued yet, sent together: they survive a lost learner and go to the next one."""
        self.sent = 0
        self.param_fetches = 0
        """Parameter blobs downloaded: one per new version, never one per batch."""
        self.blocked = 0
        self.blocked_s = 0.0
        self.blocked_max_s = 0.0
        self.producer: Producer | None = None
        self.connected_once = False
        self.last_heartbeat = 0.0
        self.last_steps, self.last_time = 0, time.monotonic()

    def log(self, text: str) -> None:
        print(f"{self.run_id} actor {self.actor}: {text}", file=self.out, flush=True)

    def _run_over(self) -> bool:
        return rundir.is_done(self.rd) or rundir.is_failed(self.rd)

    # ------------------------------------------------------------------ connection management
    def run(self) -> int:
        away_since = time.monotonic()
        skip_instance: str | None = None
        delay = 0.1
        while True:
            # Checked here, not only inside wait(): a learner killed with SIGKILL leaves its rendezvous
            # file behind, which wait() returns at once however long the learner has been gone.
            remaining = self.d.learner_timeout_s - (time.monotonic() - away_since)
            info = None
            if remaining > 0:
                info = rendezvous.wait(self.rd, remaining, lambda: bool(self.stop) or self._run_over(), not_instance=skip_instance)
            if self.stop:
                return REQUEUE_EXIT
            if rundir.is_done(self.rd):
                self.log("run done")
                return 0
            if rundir.is_failed(self.rd):
                self.log(f"learner failed ({rundir.first_line(self.rd, rundir.FAILED) or 'no reason'}); exiting with {ORPHANED_EXIT}")
                return ORPHANED_EXIT
            if info is None:
                self.log(f"no learner for {self.d.learner_timeout_s:g} s; exiting with {ORPHANED_EXIT}")
                return ORPHANED_EXIT
            try:
                code, skip_instance = self._session(info), None
            except _Stopped:
                return REQUEUE_EXIT
            except NotRunning as exc:
                code = self._code_for(exc.status)
                skip_instance = info.instance  # stopping for a requeue: wait for the next start
            except _CONNECTION_ERRORS as exc:
                code = None
                if self.connected_once:  # once per loss, not once per retry
                    self.log(f"lost the learner at {info.host}:{info.port} ({type(exc).__name__}: {str(exc)[:120]}); reconnecting")
            if code is not None:
                return code
            if self.connected_once:
                away_since, delay, self.connected_once = time.monotonic(), 0.1, False
            time.sleep(min(delay, max(0.0, self.d.learner_timeout_s - (time.monotonic() - away_since))))
            delay = min(5.0, delay * 2)

    def _code_for(self, status: str | None) -> int | None:
        """Exit code for a learner that refuses batches, or None to wait for the next learner start."""
        if status == DONE:
            self.log("run done")
            return 0
        if status == FAILED:
            self.log(f"learner failed; exiting with {ORPHANED_EXIT}")
            return ORPHANED_EXIT
        self.log(f"learner is {status or 'gone'}; waiting for it to come back")
        return None

    # ------------------------------------------------------------------ one connection
    def _session(self, info: rendezvous.Rendezvous) -> int | None:
        client = connect(info.host, info.port, info.password, socket_timeout=10, socket_connect_timeout=5)
        try:
            board = Board(client, info.prefix)
            producer = self.producer = Producer(client, board.keys.queue, board.keys.status, self.d.queue_bound, on_wait=lambda: self._while_blocked(board))
            if info.instance != self.instance:
                self.instance, self.version = info.instance, -1  # a new learner: fetch its parameters
            board.register(self.actor, self._stats(), self.d.dead_after_s)
            self.connected_once = True
            self.log(f"connected to learner {info.instance} at {info.host}:{info.port}")
            try:
                return self._act(board, producer)
            finally:
                self.sent += producer.sent
                self.blocked += producer.blocked
                self.blocked_s += producer.blocked_s
                self.blocked_max_s = max(self.blocked_max_s, producer.blocked_max_s)
                self.producer = None
        finally:
            client.close()

    def _act(self, board: Board, producer: Producer) -> int | None:
        while True:
            if self.stop:
                self._leave(board)
                raise _Stopped
            if self._send_due():
                version, status = self._exchange(board, producer)
            elif self.version < 0:
                self._load_params(board, None)
                continue
            else:
                self._fill()
                if self.policy.ready() >= self.d.batch_transitions:
                    version = self.version if self.batch_version is None else self.batch_version
                    self.outbox.add(wire.encode(wire.BATCH, version, self.actor, self.seq, self.policy.take_batch()))
                    self.seq, self.batch_version = self.seq + 1, None
                    continue
                if self.outbox:  # its delay ran out or a heartbeat fell due: it goes on the next turn
                    continue
                version, status = self._exchange(board, None)  # a heartbeat fell due, nothing to send
            if status in (DONE, FAILED):
                self._leave(board)
                return self._code_for(status)
            if version is not None and version != self.version:
                self._load_params(board, version)

    def _send_due(self) -> bool:
        """Whether the outbox goes now: it is full or its oldest batch waited send_delay_s, a heartbeat is
        due (it rides along), or this is a new learner (acting on with the old one's parameters is moot)."""
        return bool(self.outbox) and (self.outbox.due() or self.version < 0 or self._heartbeat_due())

    def _heartbeat_due(self) -> bool:
        return time.monotonic() - self.last_heartbeat >= self.d.heartbeat_s

    def _fill(self) -> None:
        """Step the envs until a batch is ready, a heartbeat is due or the outbox must go."""
        while self.policy.ready() < self.d.batch_transitions and not self.stop:
            if self.batch_version is None:
                self.batch_version = self.version
            self.policy.step()
            if self._heartbeat_due() or self.outbox.due():
                return

    def _exchange(self, board: Board, producer: Producer | None) -> tuple[int | None, str | None]:
        """One round trip (more while the queue is full): the outbox (if a producer is given), heartbeat
        if due, version and status."""
        heartbeat = self._heartbeat_due()

        def piggyback(pipe: redis.client.Pipeline) -> None:
            if heartbeat:
                board.heartbeat(pipe, self.actor, self._stats(), self.d.dead_after_s)
            board.watch(pipe)

        if producer is not None:
            results = self.outbox.send(producer, piggyback)
        else:
            pipe = board.client.pipeline(transaction=False)
            piggyback(pipe)
            results = pipe.execute()
        if heartbeat:
            self.last_heartbeat = time.monotonic()
            results = results[1:]
        return parse_version(results[0]), parse_status(results[1])

    def _while_blocked(self, board: Board) -> None:
        if self.stop:
            self._leave(board)
            raise _Stopped
        if self._heartbeat_due():
            pipe = board.client.pipeline(transaction=False)
            board.heartbeat(pipe, self.actor, self._stats(), self.d.dead_after_s)
            pipe.execute()
            self.last_heartbeat = time.monotonic()

    def _load_params(self, board: Board, version: int | None) -> None:
        try:
            message = board.fetch_params()
            if message is None:
                time.sleep(0.05)  # the learner publishes before it writes the rendezvous; a moment more
                return
            self.param_fetches += 1
            self.policy.load_params(message.fields)
            self.version = message.version
        except wire.MalformedMessage as exc:
            self.log(f"ignored parameter blob (version {version}): {exc}")
            if self.version < 0:
                time.sleep(0.5)

    def _leave(self, board: Board) -> None:
        try:
            board.leave(self.actor)
        except _CONNECTION_ERRORS:
            pass

    def _stats(self) -> dict:
        now = time.monotonic()
        sps = (self.policy.steps - self.last_steps) / max(now - self.last_time, 1e-9)
        self.last_steps, self.last_time = self.policy.steps, now
        p = self.producer
        return {
            "pid": os.getpid(), "host": socket.gethostname(), "steps": self.policy.steps, "sps": round(sps, 1), "version": self.version,
            "param_fetches": self.param_fetches, "batches": self.sent + (p.sent if p else 0), "blocked": self.blocked + (p.blocked if p else 0),
            "blocked_s": round(self.blocked_s + (p.blocked_s if p else 0.0), 3),
            "blocked_max_s": round(max(self.blocked_max_s, p.blocked_max_s if p else 0.0), 3),
        }
