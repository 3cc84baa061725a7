"""The board: what learner and actors tell each other through Redis, besides the queue itself.

Keys, all under the run's prefix `hpcrl:<run_id>:` (so runs can share an external Redis):

    status          "running" | "stopping" (checkpointed, asking for a requeue) | "done" | "failed"
    params:version  integer, the version of the newest parameters
    params:blob     the parameters, one wire.PARAMS message (raw float buffers, never pickle)
    actors          set of the actor indices that ever registered
    actor:<i>       the actor's heartbeat: small JSON stats, written with an expiry (`dead_after_s`),
                    so an actor that is killed simply disappears; no wall-clock strings to compare
    queue           list of wire.BATCH messages (see queue.py)

Version and blob are written in one MULTI/EXEC, so a reader that sees a new version finds a blob at
least that new. Actors read only the version on each round trip (it rides in the same pipeline as
their push) and fetch the blob only when it changed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from hpcrl.distributed import wire

RUNNING, STOPPING, DONE, FAILED = "running", "stopping", "done", "failed"


class Keys:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.status = prefix + "status"
        self.version = prefix + "params:version"
        self.params = prefix + "params:blob"
        self.actors = prefix + "actors"
        self.queue = prefix + "queue"

    def actor(self, index: int) -> str:
        return f"{self.prefix}actor:{index}"


def connect(host: str, port: int, password: str | None, **kwargs: Any) -> redis.Redis:
    """A client that fails fast. redis-py retries a failed command up to 10 times with backoff (about
    4 s) by default, which hid a lost learner from its actors; the actor's own reconnect loop (backoff,
    `learner_timeout_s`) is the retry policy here."""
    return redis.Redis(host=host, port=port, password=password or None, retry=Retry(NoBackoff(), 0), **kwargs)


def run_prefix(run_id: str) -> str:
    return f"hpcrl:{run_id}:"


class Board:
    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.keys = Keys(prefix)

    # ------------------------------------------------------------------ learner side
    def set_status(self, status: str) -> None:
        self.client.set(self.keys.status, status)

    def publish(self, version: int, params: Mapping[str, np.ndarray]) -> None:
        blob = wire.encode(wire.PARAMS, version, 0, 0, params)
        pipe = self.client.pipeline(transaction=True)
        pipe.set(self.keys.params, blob)
        pipe.set(self.keys.version, version)
        pipe.execute()

    def retire(self, ttl_s: int = 86400) -> None:
        """After the run: drop the queue and parameters, let the rest expire. Why: on an external Redis
        shared by many runs, finished runs would otherwise keep their blobs forever; the status stays a
        day so that a late actor still reads `done` and exits 0."""
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(self.keys.queue, self.keys.params)
        for key in (self.keys.status, self.keys.version, self.keys.actors):
            pipe.expire(key, ttl_s)
        pipe.execute()

    def heartbeats(self) -> dict[int, dict[str, Any] | None]:
        """Every registered actor -> its latest stats, or None when its heartbeat has expired (dead)."""
        members = sorted(int(m) for m in self.client.smembers(self.keys.actors) if m.isdigit())
        if not members:
            return {}
        values = self.client.mget([self.keys.actor(i) for i in members])
        return {i: parse_heartbeat(v) if v is not None else None for i, v in zip(members, values)}

    def queue_depth(self) -> int:
        return int(self.client.llen(self.keys.queue))

    # ------------------------------------------------------------------ actor side
    def register(self, actor: int, stats: Mapping[str, Any], ttl: float) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.sadd(self.keys.actors, actor)
        self.heartbeat(pipe, actor, stats, ttl)
        pipe.execute()

    def heartbeat(self, pipe: redis.client.Pipeline, actor: int, stats: Mapping[str, Any], ttl: float) -> None:
        pipe.set(self.keys.actor(actor), json.dumps(stats, separators=(",", ":")), px=max(1, int(ttl * 1000)))

    def watch(self, pipe: redis.client.Pipeline) -> None:
        """Queue the two reads every actor round trip carries: parameter version, run status."""
        pipe.get(self.keys.version)
        pipe.get(self.keys.status)

    def leave(self, actor: int) -> None:
        """An actor that exits on purpose removes its heartbeat, so it is not reported alive for `ttl` more seconds."""
        self.client.delete(self.keys.actor(actor))

    def fetch_params(self) -> wire.Message | None:
        blob = self.client.get(self.keys.params)
        if blob is None:
            return None
        message = wire.decode(blob)
        if message.kind != wire.PARAMS:
            raise wire.MalformedMessage(f"parameter blob has message kind {message.kind}")
        return message


def parse_heartbeat(raw: bytes) -> dict[str, Any]:
    """An actor's stats; a value that is not a JSON object still means the actor is alive."""
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def parse_version(raw: bytes | None) -> int | None:
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def parse_status(raw: bytes | None) -> str | None:
    return raw.decode(errors="replace") if raw is not None else None
