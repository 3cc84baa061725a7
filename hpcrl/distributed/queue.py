"""The experience queue: a Redis list of wire.BATCH messages, bounded, with counted backpressure and lag.

Throughput comes from sending few, large messages in few round trips, not from a faster codec:

- an actor sends a whole batch of transitions as one message, and the same round trip carries its
  heartbeat and reads the parameter version and run status (one pipeline);
- the push is one server-side script (EVALSHA) that appends only if the run's status is
  `running` and the list is below its bound, so the bound is exact and costs no extra round trip;
  a full queue makes the producer keep its batch and poll (with backoff) until the learner made
  room: nothing is dropped, every wait is counted (`blocked`, `blocked_s`) and reported in the
  heartbeat. A learner that is stopping (requeue) or finished refuses pushes atomically, so the
  batches still queued when it stops are exactly the ones it counts as lost;
- the learner pops up to `max_batches` messages with one LPOP (COUNT), and blocks in BLPOP only
  when it has nothing else to do.

On the learner side every message is decoded and checked (format, then the algorithm's schema);
a malformed one is logged and counted, never raised. A batch produced with parameters more than
`max_lag` versions old (or newer than the learner's, i.e. from before a restart) is dropped and
counted with its transitions. Sequence numbers per actor reveal batches lost in between, which
are counted too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

import redis

from hpcrl.distributed import wire
from hpcrl.distributed.board import RUNNING, parse_status

PUSH_SCRIPT = f"""
if redis.call('GET', KEYS[2]) ~= '{RUNNING}' then return -1 end
if redis.call('LLEN', KEYS[1]) >= tonumber(ARGV[2]) then return -2 end
return redis.call('RPUSH', KEYS[1], ARGV[1])
"""
"""KEYS: queue, status; ARGV: message, bound. -1: the learner is not running; -2: the queue is full."""


class NotRunning(Exception):
    """The learner refuses batches: it is stopping, finished or failed (or its board is gone)."""

    def __init__(self, status: str | None) -> None:
        super().__init__(f"learner status is {status!r}")
        self.status = status


class Producer:
    def __init__(self, client: redis.Redis, queue_key: str, status_key: str, bound: int, on_wait: Callable[[], None] | None = None) -> None:
        self.client, self.key, self.status_key, self.bound = client, queue_key, status_key, bound
        self.sha = client.script_load(PUSH_SCRIPT)
        self.on_wait = on_wait
        """Called while blocked (the actor's heartbeat); may raise to abandon the wait."""
        self.sent = 0
        self.blocked = 0
        self.blocked_s = 0.0

    def put(self, blob: bytes, piggyback: Callable[[redis.client.Pipeline], None] | None = None) -> list:
        """Push one message, waiting while the queue is full; return the results of `piggyback`'s commands.

        Raises NotRunning (the message was not queued) when the learner does not take batches.
        """
        while True:
            pipe = self.client.pipeline(transaction=False)
            pipe.evalsha(self.sha, 2, self.key, self.status_key, blob, self.bound)
            if piggyback is not None:
                piggyback(pipe)
            code, *rest = pipe.execute()
            if code >= 0:
                self.sent += 1
                return rest
            if code == -1:
                raise NotRunning(parse_status(self.client.get(self.status_key)))
            self.wait_for_room()

    def wait_for_room(self) -> None:
        """Block until the queue is below its bound: the learner is the bottleneck, so acting slows down."""
        self.blocked += 1
        start = time.monotonic()
        delay = 0.0005
        try:
            while True:
                pipe = self.client.pipeline(transaction=False)
                pipe.llen(self.key)
                pipe.get(self.status_key)
                length, status = pipe.execute()
                if parse_status(status) != RUNNING:
                    raise NotRunning(parse_status(status))
                if int(length) < self.bound:
                    return
                if self.on_wait is not None:
                    self.on_wait()
                time.sleep(delay)
                delay = min(0.05, delay * 2)
        finally:
            self.blocked_s += time.monotonic() - start


class Consumer:
    def __init__(self, client: redis.Redis, key: str, validate: Callable[[wire.Message], int], max_lag: int, log: TextIO | None = None) -> None:
        self.client, self.key = client, key
        self.validate = validate
        """The algorithm's schema check: raises MalformedMessage, returns the number of transitions."""
        self.max_lag = max_lag
        self.log = log
        self.batches = 0
        self.transitions = 0
        self.malformed = 0
        self.dropped = 0
        self.dropped_transitions = 0
        self.lost = 0
        self.lag_sum = 0
        self.lag_max = 0
        self.lag_count = 0
        self._last_seq: dict[int, int] = {}

    def pop(self, current_version: int, max_batches: int = 64, timeout: float = 0.0) -> list[tuple[wire.Message, int]]:
        """Accepted batches with their transition counts; waits up to `timeout` s when the queue is empty."""
        raw = self.client.lpop(self.key, max_batches) or []
        if not raw and timeout > 0:
            first = self.client.blpop([self.key], timeout=timeout)
            if first is not None:
                raw = [first[1], *(self.client.lpop(self.key, max_batches - 1) or [])] if max_batches > 1 else [first[1]]
        accepted = []
        for data in raw:
            try:
                message = wire.decode(data)
                if message.kind != wire.BATCH:
                    raise wire.MalformedMessage(f"message kind {message.kind} on the experience queue")
                n = self.validate(message)
            except wire.MalformedMessage as exc:
                self.malformed += 1
                if self.log is not None and (self.malformed <= 10 or self.malformed % 1000 == 0):
                    print(f"learner: rejected malformed message #{self.malformed} ({len(data)} bytes): {exc}", file=self.log, flush=True)
                continue
            self._track_sequence(message)
            lag = current_version - message.version
            if not 0 <= lag <= self.max_lag:
                self.dropped += 1
                self.dropped_transitions += n
                continue
            self.batches += 1
            self.transitions += n
            self.lag_sum += lag
            self.lag_count += 1
            self.lag_max = max(self.lag_max, lag)
            accepted.append((message, n))
        return accepted

    def _track_sequence(self, message: wire.Message) -> None:
        last = self._last_seq.get(message.sender)
        if last is not None and message.seq > last + 1:
            self.lost += message.seq - last - 1
        self._last_seq[message.sender] = message.seq  # a lower number: the actor restarted and counts anew

    def take_lag_window(self) -> tuple[float | None, int]:
        """Mean and max lag of the batches accepted since the last call (for the stats line)."""
        mean = self.lag_sum / self.lag_count if self.lag_count else None
        peak = self.lag_max
        self.lag_sum = self.lag_count = self.lag_max = 0
        return mean, peak
