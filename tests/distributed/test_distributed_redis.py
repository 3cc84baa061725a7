"""Board, queue and the learner's private redis-server, against a real redis-server on loopback."""

from __future__ import annotations

import io
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import redis
from factories import validate_x

from hpcrl.distributed import wire
from hpcrl.distributed.board import DONE, RUNNING, STOPPING, Board
from hpcrl.distributed.queue import Consumer, NotRunning, Producer
from hpcrl.distributed.redis_server import RedisServer

pytestmark = pytest.mark.redis
PREFIX = "hpcrl:test:"


def message(seq: int, version: int = 0, n: int = 4, sender: int = 0) -> bytes:
    return wire.encode(wire.BATCH, version, sender, seq, {"x": np.full((n, 2), seq, np.float32)})


def test_private_server_needs_its_password_and_hides_it_from_ps(redis_server) -> None:
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(host=redis_server.host, port=redis_server.port).ping()
    assert redis_server.client().ping()
    cmdline = open(f"/proc/{redis_server.proc.pid}/cmdline", "rb").read()
    assert redis_server.password.encode() not in cmdline
    assert redis_server.client().config_get("save")["save"] == ""  # nothing snapshotted to disk


def test_server_dies_with_a_learner_killed_by_sigkill(redis_server, tmp_path) -> None:
    """PR_SET_PDEATHSIG: a learner that cannot clean up (SIGKILL, OOM) leaves no server listening."""
    code = (
        "import sys, time\n"
        "from hpcrl.distributed.redis_server import RedisServer\n"
        "s = RedisServer('127.0.0.1').start()\n"
        "print(s.port, s.password, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    port, password = parent.stdout.readline().split()
    client = redis.Redis(port=int(port), password=password, socket_timeout=1)
    assert client.ping()
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            client.ping()
        except redis.exceptions.ConnectionError:
            return
        time.sleep(0.05)
    pytest.fail("redis-server still answers 5 s after its learner was killed")


def test_stop_ends_the_server() -> None:
    server = RedisServer("127.0.0.1").start()
    pid = server.proc.pid
    server.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_server_outlives_the_schedulers_warning_signals() -> None:
    """Grid Engine sends USR1/USR2 to every process of a job; the learner's board must survive the
    warning that makes the learner checkpoint (it writes `stopping` and counts the queue after it)."""
    server = RedisServer("127.0.0.1").start()
    try:
        assert server.proc is not None
        for sig in (signal.SIGUSR1, signal.SIGUSR2):
            server.proc.send_signal(sig)
        time.sleep(0.5)
        assert server.proc.poll() is None and server.client().ping()
    finally:
        server.stop()


def test_heartbeats_expire_so_a_silent_actor_is_dead(board: Board) -> None:
    board.register(0, {"steps": 10}, ttl=0.3)
    board.register(1, {"steps": 20}, ttl=30)
    assert board.heartbeats() == {0: {"steps": 10}, 1: {"steps": 20}}
    time.sleep(0.45)
    assert board.heartbeats() == {0: None, 1: {"steps": 20}}
    board.leave(1)  # an actor that exits on purpose is not reported alive any longer
    assert board.heartbeats() == {0: None, 1: None}


def test_parameters_are_published_with_their_version(board: Board) -> None:
    params = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(3, np.float32)}
    board.publish(5, params)
    pipe = board.client.pipeline()
    board.watch(pipe)
    version, status = pipe.execute()
    assert int(version) == 5 and status.decode() == RUNNING
    got = board.fetch_params()
    assert got.version == 5 and got.kind == wire.PARAMS
    np.testing.assert_array_equal(got.fields["w"], params["w"])
    board.client.set(board.keys.params, pickle.dumps(params))
    with pytest.raises(wire.MalformedMessage):
        board.fetch_params()


def test_full_queue_blocks_the_producer_counts_it_and_loses_nothing(board: Board) -> None:
    bound, total = 3, 40
    producer = Producer(board.client, board.keys.queue, board.keys.status, bound)
    consumer = Consumer(board.client, board.keys.queue, validate_x, max_lag=0)
    lengths = []

    def produce() -> None:
        for seq in range(total):
            producer.put(message(seq))
            lengths.append(board.queue_depth())

    thread = threading.Thread(target=produce)
    thread.start()
    got = []
    while len(got) < total:
        time.sleep(0.01)  # a slow learner
        got += [m.seq for m, _ in consumer.pop(0, max_batches=1)]
    thread.join()
    assert got == list(range(total))
    assert max(lengths) <= bound
    assert producer.blocked > 0 and producer.blocked_s > 0
    assert consumer.transitions == 4 * total and consumer.lost == 0 and consumer.dropped == 0


def test_stale_batches_are_dropped_and_counted(board: Board) -> None:
    producer = Producer(board.client, board.keys.queue, board.keys.status, 100)
    for seq, version in enumerate([10, 7, 6, 11]):  # at learner version 10 with lag limit 3
        producer.put(message(seq, version, n=5))
    consumer = Consumer(board.client, board.keys.queue, validate_x, max_lag=3)
    accepted = consumer.pop(current_version=10)
    assert [m.version for m, _ in accepted] == [10, 7]  # 6 is too old, 11 is from before a learner restart
    assert (consumer.dropped, consumer.dropped_transitions, consumer.batches) == (2, 10, 2)
    assert consumer.take_lag_window() == (1.5, 3)


def test_malformed_messages_are_rejected_logged_and_counted(board: Board) -> None:
    log = io.StringIO()
    raw = [
        message(0),
        pickle.dumps({"x": np.zeros((4, 2), np.float32)}),
        b"garbage",
        wire.encode(wire.BATCH, 0, 0, 1, {"x": np.zeros((4, 3), np.float32)}),  # well formed, wrong schema
        wire.encode(wire.PARAMS, 0, 0, 2, {"x": np.zeros((4, 2), np.float32)}),  # wrong kind on the queue
        message(3),
    ]
    board.client.rpush(board.keys.queue, *raw)
    consumer = Consumer(board.client, board.keys.queue, validate_x, max_lag=0, log=log)
    accepted = consumer.pop(0)
    assert [m.seq for m, _ in accepted] == [0, 3]
    assert consumer.malformed == 4
    assert log.getvalue().count("rejected malformed message") == 4 and "bad magic" in log.getvalue()


def test_gaps_in_an_actors_sequence_are_counted_as_lost(board: Board) -> None:
    board.client.rpush(board.keys.queue, message(0, sender=1), message(1, sender=1), message(4, sender=1), message(0, sender=2))
    consumer = Consumer(board.client, board.keys.queue, validate_x, max_lag=0)
    consumer.pop(0)
    assert consumer.lost == 2


def test_pushes_are_refused_once_the_learner_stops(board: Board) -> None:
    producer = Producer(board.client, board.keys.queue, board.keys.status, 1)
    producer.put(message(0))
    waiting = []

    def blocked_put() -> None:
        try:
            producer.put(message(1))
        except NotRunning as exc:
            waiting.append(exc.status)

    thread = threading.Thread(target=blocked_put)
    thread.start()
    time.sleep(0.2)  # the queue is full: the producer waits ...
    board.set_status(STOPPING)  # ... until the learner stops for a requeue, which releases it
    thread.join(timeout=5)
    assert waiting == [STOPPING] and board.queue_depth() == 1
    board.set_status(DONE)
    with pytest.raises(NotRunning):
        producer.put(message(2))
