"""The experience queue: a Redis list of wire.BATCH messages, bounded, with counted backpressure and lag.

Throughput comes from sending few, large messages in few round trips, not from a faster codec:

- an actor sends each batch of transitions as one message, and coalesces the batches it built since
  its last round trip (`Outbox`: up to `distributed.batches_per_send` of them, none waiting longer
  than `distributed.send_delay_s`) into one push; the same round trip carries its heartbeat and
  reads the parameter version and run status (one pipeline). Each batch stays its own list element,
  with its own sequence number and parameter version, so the bound, the stale drops and the loss
  count mean what they meant with one batch per round trip; only the round trips are fewer (at the
  bundled batch of 64 transitions, a round trip per batch cost more than the batch itself);
- the push is one server-side script (EVALSHA) that appends only if the run's status is
  `running`, and only as many messages as the list has room for below its bound, so the bound is
  exact and costs no extra round trip; a full queue makes the producer keep the rest and poll
  (with backoff) until the learner made room: nothing is dropped, every wait is counted (`blocked`,
  `blocked_s`) and reported in the heartbeat. A learner that is stopping (requeue) or finished
  refuses pushes atomically, so the batches still queued when it stops are exactly the ones it
  counts as lost;
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
local room = tonumber(ARGV[1]) - redis.call('LLEN', KEYS[1])
if room <= 0 then return -2 end
local n = math.min(room, #ARGV - 1)
redis.call('RPUSH', KEYS[1], unpack(ARGV, 2, n + 1))
return n
"""
"""KEYS: queue, status; ARGV: bound, then the messages in order. Returns how many of them (from the
first) were appended, all that fit below the bound; -1: the learner is not running; -2: the queue is full."""

MAX_PER_PUSH = 1024
"""Messages one push carries at most (Lua's unpack has a stack limit; the config bounds the outbox lower)."""


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
        """Messages queued."""
        self.pushes = 0
        """Round trips that queued them (fewer than `sent` when the caller coalesces)."""
        self.blocked = 0
        self.blocked_s = 0.0
        self.blocked_max_s = 0.0
        """The longest single wait for room (the benchmark's "how long did acting wait for learning")."""

    def put(self, blob: bytes, piggyback: Callable[[redis.client.Pipeline], None] | None = None) -> list:
        """Push one message, waiting while the queue is full; return the results of `piggyback`'s commands.

        Raises NotRunning (the message was not queued) when the learner does not take batches.
        """
        return self.put_many([blob], piggyback)

    def put_many(self, blobs: list[bytes], piggyback: Callable[[redis.client.Pipeline], None] | None = None) -> list:
        """Push messages in order, as many per round trip as the bound leaves room for, waiting while the
        queue is full; return the results of `piggyback`'s commands in the last round trip.

        Each message leaves `blobs` once the server has appended it, so what is still in `blobs` after
        an exception (NotRunning, a lost connection) was not queued: the caller keeps it for later. A
        call that had to wait counts once in `blocked`, however many times the queue filled up again.
        """
        if not blobs:
            raise ValueError("nothing to push")
        results: list = []
        waited_since: float | None = None
        try:
            while True:
                pipe = self.client.pipeline(transaction=False)
                pipe.evalsha(self.sha, 2, self.key, self.status_key, self.bound, *blobs[:MAX_PER_PUSH])
                if piggyback is not None:
                    piggyback(pipe)
                code, *results = pipe.execute()
                if code > 0:
                    del blobs[:code]
                    self.sent += code
                    self.pushes += 1
                    if not blobs:
                        return results
                elif code == -1:
                    raise NotRunning(parse_status(self.client.get(self.status_key)))
                if waited_since is None:
                    waited_since = time.monotonic()
                    self.blocked += 1
                self._wait_for_room()
        finally:
            if waited_since is not None:
                waited = time.monotonic() - waited_since
                self.blocked_s += waited
                self.blocked_max_s = max(self.blocked_max_s, waited)

    def _wait_for_room(self) -> None:
        """Poll (with backoff) until the queue is below its bound: the learner is the bottleneck, so acting slows down."""
        delay = 0.0005
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


class Outbox:
    """The batches an actor built and has not queued yet, sent together in one round trip.

    A batch is ready to go (`due`) once `batches` of them wait, or once the oldest has waited
    `max_delay_s`: a slow actor (one batch takes longer than the delay to build) sends each batch as
    soon as it is built, exactly as without an outbox, and a fast one sends `batches` per round trip
    instead of one. The outbox outlives a connection: what a lost learner did not take goes to the
    next one (which drops it as stale if it is, and counts it).
    """

    def __init__(self, batches: int, max_delay_s: float) -> None:
        if not 1 <= batches <= MAX_PER_PUSH:
            raise ValueError(f"batches per send must be in 1..{MAX_PER_PUSH}, got {batches}")
        self.batches, self.max_delay_s = batches, max_delay_s
        self.blobs: list[bytes] = []
        self.since = 0.0
        """time.monotonic() when the oldest waiting batch was added."""

    def __len__(self) -> int:
        return len(self.blobs)

    def add(self, blob: bytes) -> None:
        if not self.blobs:
            self.since = time.monotonic()
        self.blobs.append(blob)

    def due(self) -> bool:
        """Whether the waiting batches should go now: enough of them, or the oldest waited long enough."""
        return bool(self.blobs) and (len(self.blobs) >= self.batches or time.monotonic() - self.since >= self.max_delay_s)

    def send(self, producer: Producer, piggyback: Callable[[redis.client.Pipeline], None] | None = None) -> list:
        """Queue every waiting batch, in order (see Producer.put_many); what an exception leaves unqueued stays."""
        return producer.put_many(self.blobs, piggyback)


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
