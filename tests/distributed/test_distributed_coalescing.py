"""Coalescing on the experience queue (issue 17): an actor's small batches share round trips, yet each stays its
own message, so what the learner receives, counts and drops is what it was with one batch per round trip.

Against a real redis-server on loopback; the actor tests drive `hpcrl.distributed.actor.Actor` itself (real
CartPole envs, real network) in a thread, with the learner's side played by `queue.Consumer`.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from factories import validate_x

from hpcrl.distributed import queue, rendezvous, wire
from hpcrl.distributed.board import DONE, RUNNING, Board
from hpcrl.distributed.queue import Consumer, Outbox, Producer

pytestmark = pytest.mark.redis
PREFIX = "hpcrl:coalesce:"


def message(seq: int, n: int = 4, sender: int = 0) -> bytes:
    return wire.encode(wire.BATCH, 0, sender, seq, {"x": np.arange(n * 2, dtype=np.float32).reshape(n, 2) + 1000 * seq})


# ---------------------------------------------------------------------------------------------- the queue


def test_k_batches_go_in_one_round_trip_and_arrive_as_k_messages_in_order(board: Board) -> None:
    producer = Producer(board.client, board.keys.queue, board.keys.status, bound=100)
    blobs = [message(seq) for seq in range(8)]
    piggybacked = producer.put_many(list(blobs), board.watch)
    assert (producer.pushes, producer.sent, producer.blocked) == (1, 8, 0)
    assert piggybacked[1] == RUNNING.encode()  # the version/status reads ride along, as with one batch
    assert board.queue_depth() == 8  # eight batches on the queue, not one: the bound still counts batches
    consumer = Consumer(board.client, board.keys.queue, validate_x, max_lag=0)
    got = consumer.pop(0)
    assert [m.seq for m, _ in got] == list(range(8))
    for (m, n), blob in zip(got, blobs):
        np.testing.assert_array_equal(m.fields["x"], wire.decode(blob).fields["x"])
        assert n == 4
    assert (consumer.batches, consumer.transitions, consumer.lost, consumer.dropped) == (8, 32, 0, 0)


def test_a_push_takes_only_what_fits_below_the_bound_and_waits_for_the_rest(board: Board) -> None:
    bound, total = 3, 11
    producer = Producer(board.client, board.keys.queue, board.keys.status, bound)
    consumer = Consumer(board.client, board.keys.queue, validate_x, max_lag=0)
    depths = []

    def watch_depth() -> None:
        while thread.is_alive():
            depths.append(board.queue_depth())

    pending = [message(seq) for seq in range(total)]
    thread = threading.Thread(target=producer.put_many, args=(pending,))
    thread.start()
    watcher = threading.Thread(target=watch_depth)
    watcher.start()
    got = []
    while len(got) < total:
        time.sleep(0.02)  # a slow learner
        got += [m.seq for m, _ in consumer.pop(0, max_batches=2)]
    thread.join(timeout=10)
    watcher.join(timeout=10)
    assert got == list(range(total)) and pending == []  # all of them, once each, in order
    assert max(depths) <= bound
    assert producer.sent == total and producer.blocked == 1 and producer.blocked_s > 0  # one call, one wait counted


def test_what_a_stopping_learner_refused_stays_in_the_outbox(board: Board) -> None:
    producer = Producer(board.client, board.keys.queue, board.keys.status, bound=2)
    outbox = Outbox(batches=5, max_delay_s=60)
    for seq in range(5):
        outbox.add(message(seq))
    assert outbox.due()  # full
    board.set_status("stopping")
    with pytest.raises(queue.NotRunning):
        outbox.send(producer)
    assert len(outbox) == 5 and board.queue_depth() == 0
    board.set_status(RUNNING)
    consumer = Consumer(board.client, board.keys.queue, validate_x, 0)
    got: list[int] = []

    def learner() -> None:
        while len(got) < 5:
            time.sleep(0.1)
            got.extend(m.seq for m, _ in consumer.pop(0))

    thread = threading.Thread(target=learner, daemon=True)
    thread.start()
    outbox.send(producer)  # two fit at once; the learner's pops make room for the rest
    thread.join(timeout=10)
    assert len(outbox) == 0 and producer.sent == 5 and got == [0, 1, 2, 3, 4]


def test_outbox_is_due_when_full_or_when_its_oldest_batch_waited_long_enough() -> None:
    outbox = Outbox(batches=3, max_delay_s=0.2)
    assert not outbox.due()  # empty
    outbox.add(b"a")
    outbox.add(b"b")
    assert not outbox.due()
    time.sleep(0.25)
    assert outbox.due()  # a partial outbox goes once the delay ran out
    fresh = Outbox(batches=3, max_delay_s=60)
    for blob in (b"a", b"b", b"c"):
        fresh.add(blob)
    assert fresh.due()  # a full one goes at once
    with pytest.raises(ValueError):
        Outbox(batches=0, max_delay_s=1)


# ---------------------------------------------------------------------------------------------- the actor


class _NoSignal:
    signal = None

    def __bool__(self) -> bool:
        return False


def _actor(tmp_path: Path, distributed: dict):
    """An Actor of a one-run Ape-X experiment, its envs, the network parameters a learner publishes, and
    the learner's own check of a batch (`ApexLearner.validate`)."""
    import torch

    from hpcrl.config.load import load_experiment
    from hpcrl.distributed.actor import Actor, acting_half
    from hpcrl.distributed.apex import ApexLearner, param_arrays
    from hpcrl.sweep.runs import expand

    config = {
        "name": "coalesce", "algo": "dqn", "env": {"id": "CartPole-v1"}, "output": str(tmp_path / "logs"),
        "train": {"total_steps": 100_000, "hidden_sizes": [16], "n_step": 3},
        "distributed": {"actors": 1, "heartbeat_s": 30.0, "dead_after_s": 60.0, **distributed},
        "sweep": {"seeds": [0]}, "resources": {"max_concurrent": 2},
    }  # fmt: skip
    path = tmp_path / "apex.yaml"
    path.write_text(yaml.safe_dump(config))
    (run,) = expand(load_experiment(path))
    actor = Actor(tmp_path, run, 0, _NoSignal(), acting_half(run, 0), None)
    envs = actor.policy.envs
    learner = ApexLearner(run.config.train, run.config.distributed, envs.single_observation_space, envs.single_action_space, torch.device("cpu"))
    return actor, envs, param_arrays(actor.policy.net), learner.validate


class _Recorder(Outbox):
    """An outbox that remembers, per send, how many batches went and how long the oldest had waited."""

    def __init__(self, batches: int, max_delay_s: float) -> None:
        super().__init__(batches, max_delay_s)
        self.sends: list[tuple[int, float]] = []

    def send(self, producer, piggyback=None):  # noqa: ANN001, ANN201
        self.sends.append((len(self.blobs), time.monotonic() - self.since))
        return super().send(producer, piggyback)


def _run_actor(actor, board: Board, server, until: int, consumer: Consumer, step_s: float = 0.0) -> list[tuple[wire.Message, int]]:
    """Run the actor's session in a thread until the consumer accepted `until` batches, then end the run."""
    real_step = actor.policy.step

    def step() -> None:
        if step_s:
            time.sleep(step_s)
        real_step()

    actor.policy.step = step
    info = rendezvous.Rendezvous(server.host, server.port, server.password, board.keys.prefix, "inst", "host", 1)
    result: list = []

    def session() -> None:
        try:
            result.append(actor._session(info))
        except queue.NotRunning as exc:  # a push refused by the run's end: `hpcrl actor` exits 0 on it
            result.append(actor._code_for(exc.status))

    thread = threading.Thread(target=session)
    thread.start()
    got: list[tuple[wire.Message, int]] = []
    deadline = time.monotonic() + 60
    while len(got) < until and time.monotonic() < deadline and thread.is_alive():
        got += consumer.pop(0, max_batches=64, timeout=0.05)
    board.set_status(DONE)
    while thread.is_alive() and time.monotonic() < deadline:
        consumer.pop(0, max_batches=64)  # room for a push the actor is waiting to make, so it reads `done`
        thread.join(timeout=0.05)
    assert not thread.is_alive() and result == [0]
    return got + consumer.pop(0, max_batches=1000)


def test_a_fast_actor_sends_k_batches_per_round_trip_and_the_learner_gets_each_once_in_order(tmp_path: Path, redis_server, redis_client) -> None:
    actor, envs, params, check = _actor(tmp_path, {"envs_per_actor": 2, "batch_transitions": 8, "batches_per_send": 4, "send_delay_s": 30.0, "queue_bound": 64})
    actor.outbox = _Recorder(4, 30.0)
    built: list[dict[str, np.ndarray]] = []
    take = actor.policy.take_batch
    actor.policy.take_batch = lambda: built.append(take()) or built[-1]
    board = Board(redis_client, PREFIX)
    board.publish(0, params)
    board.set_status(RUNNING)
    consumer = Consumer(redis_client, board.keys.queue, check, max_lag=1000)
    try:
        got = _run_actor(actor, board, redis_server, 40, consumer)
    finally:
        envs.close()
    assert all(n == 4 for n, _ in actor.outbox.sends)  # K per round trip (the delay never ran out)
    assert [m.seq for m, _ in got] == list(range(len(got))) and len(got) >= 40  # no loss, no duplicate, in order
    assert (consumer.lost, consumer.dropped, consumer.malformed) == (0, 0, 0)
    for (m, n), fields in zip(got, built):  # the very transitions the actor built, batch by batch
        assert n == len(fields["action"]) >= 8
        for key, value in fields.items():
            np.testing.assert_array_equal(m.fields[key], value)


def test_a_slow_actor_sends_a_partial_outbox_within_the_delay(tmp_path: Path, redis_server, redis_client) -> None:
    # 2 envs, 8 transitions a batch, 20 ms a step: a batch every ~80 ms; the delay lets 2-3 of them wait together.
    delay, step_s = 0.2, 0.02
    actor, envs, params, check = _actor(tmp_path, {"envs_per_actor": 2, "batch_transitions": 8, "batches_per_send": 100, "send_delay_s": delay})
    actor.outbox = _Recorder(100, delay)
    board = Board(redis_client, PREFIX)
    board.publish(0, params)
    board.set_status(RUNNING)
    consumer = Consumer(redis_client, board.keys.queue, check, max_lag=1000)
    try:
        got = _run_actor(actor, board, redis_server, 12, consumer, step_s=step_s)
    finally:
        envs.close()
    sends = actor.outbox.sends
    assert len(sends) >= 3 and all(n < 100 for n, _ in sends)  # never full: every send is the delay's
    waited = [w for _, w in sends]
    print(f"outbox sends (batches, oldest waited s): {[(n, round(w, 3)) for n, w in sends]}")
    assert all(w >= delay for w in waited)  # not before the delay ...
    assert max(waited) < delay + 3 * step_s + 0.25  # ... and no later than the step that crossed it (plus a loaded machine's slack)
    assert [m.seq for m, _ in got] == list(range(len(got))) and (consumer.lost, consumer.dropped) == (0, 0)
