"""Issue 7's figures: the actor -> learner pipe against raw Redis, and distributed DQN against single-process DQN.

Part 1, `pipe` (seconds): transitions/s from N actor processes to one learner process through a
private redis-server, two ways in the same run, on the same server:

- hpcrl's pipe: each actor encodes batches of CartPole-sized transitions (obs 4 x f4, action i8,
  reward f4, next obs 4 x f4, discount f4: 44 bytes) with `wire.encode` and pushes them with
  `queue.Producer` (the bounded EVALSHA push plus the version/status reads every actor round trip
  carries); the learner pops with `queue.Consumer`, which decodes and schema-checks every batch
  (`ApexLearner.validate`). Counted at the learner, nothing is dropped.
- raw Redis: each actor RPUSHes one 44-byte value per transition, pipelined 256 commands per round
  trip (what `redis-benchmark -P` measures; the prior system sent one message per transition),
  written as pre-built protocol bytes on a bare socket, and the learner pops them with LPOP COUNT
  and skips over the bytes: no client library, no codec. Bounded too (an LLEN rides in each round trip).

Target (issue 7): the pipe moves >= 1M small transitions/s and >= 0.5 x the raw loop.

Part 2, `learning` (minutes): `hpcrl sweep` through the local executor of configs/cartpole_apex.yaml
with 1, 2 and 4 actors and of configs/cartpole_dqn.yaml (single process), then per run: env steps/s
of the learner (or trainer) over the whole run, and the final evaluation return.

    PYTHONPATH=. python benchmarks/distributed.py pipe [--actors 1 4] [--seconds 5] [--batch 512]
    PYTHONPATH=. python benchmarks/distributed.py learning [--actors 1 2 4] [--seeds 0 1 2] [--output /tmp/h7bench]
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing as mp
import socket
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

from hpcrl.distributed import wire
from hpcrl.distributed.board import RUNNING, Board, connect
from hpcrl.distributed.queue import Consumer, Producer
from hpcrl.distributed.redis_server import RedisServer

REPO = Path(__file__).resolve().parent.parent
OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
TRANSITION_BYTES = 44
RAW_PIPELINE = 256
TARGET_PER_S, TARGET_RATIO = 1_000_000, 0.5


def cartpole_batch(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "obs": rng.standard_normal((n, 4), dtype=np.float32), "action": rng.integers(0, 2, n), "reward": np.ones(n, np.float32),
        "next_obs": rng.standard_normal((n, 4), dtype=np.float32), "discount": np.full(n, 0.99, np.float32),
        "ep_return": np.zeros(0, np.float32), "ep_length": np.zeros(0, np.int32),
    }


def pipe_actor(address: tuple[str, int, str], prefix: str, actor: int, batch: int, bound: int, stop) -> None:
    client = connect(*address)
    board = Board(client, prefix)
    producer = Producer(client, board.keys.queue, board.keys.status, bound)
    fields = cartpole_batch(batch, np.random.default_rng(actor))
    seq = 0
    while not stop.is_set():
        producer.put(wire.encode(wire.BATCH, 0, actor, seq, fields), board.watch)  # encoded anew each time, as an actor does
        seq += 1


def resp(*parts: bytes) -> bytes:
    """One command in the Redis protocol (RESP)."""
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


class RawConnection:
    """A bare RESP socket: no client library in the way, so the raw loop is as fast as Python can drive Redis."""

    def __init__(self, host: str, port: int, password: str) -> None:
        self.sock = socket.create_connection((host, port))
        self.buf = bytearray()
        self.sock.sendall(resp(b"AUTH", password.encode()))
        assert self.line() == b"+OK"

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("redis-server closed the connection")
        self.buf += chunk

    def line(self) -> bytes:
        while (end := self.buf.find(b"\r\n")) < 0:
            self._fill()
        out = bytes(self.buf[:end])
        del self.buf[: end + 2]
        return out

    def skip(self, n: int) -> None:
        while len(self.buf) < n:
            self._fill()
        del self.buf[:n]


def raw_actor(address: tuple[str, int, str], key: str, actor: int, bound: int, stop) -> None:
    """RAW_PIPELINE RPUSHes of one transition each and an LLEN per round trip (backpressure like the pipe's)."""
    conn = RawConnection(*address)
    round_trip = resp(b"RPUSH", key.encode(), np.random.default_rng(actor).bytes(TRANSITION_BYTES)) * RAW_PIPELINE + resp(b"LLEN", key.encode())
    while not stop.is_set():
        conn.sock.sendall(round_trip)
        for _ in range(RAW_PIPELINE):
            conn.line()
        if int(conn.line()[1:]) >= bound:
            time.sleep(0.0005)


def raw_taker(conn: RawConnection, key: str) -> int:
    """Pop up to 4096 transitions (LPOP COUNT) and skip over them; their number."""
    conn.sock.sendall(resp(b"LPOP", key.encode(), b"4096"))
    head = conn.line()
    n = int(head[1:]) if head.startswith(b"*") else 0
    if n <= 0:
        time.sleep(0.0002)
        return 0
    conn.skip(n * (len(b"$%d\r\n" % TRANSITION_BYTES) + TRANSITION_BYTES + 2))
    return n


def measure(kind: str, server: RedisServer, actors: int, seconds: float, batch: int) -> float:
    """Transitions/s received by this (learner) process over `seconds`, after a 1 s warm-up."""
    client = server.client()
    client.flushall()
    address = (server.host, server.port, server.password)
    prefix = f"bench:{kind}:"
    board = Board(client, prefix)
    board.set_status(RUNNING)
    from hpcrl.distributed.apex import episode_schema, transition_schema

    schema, episodes = transition_schema(OBS_SPACE), episode_schema()

    def validate(m: wire.Message) -> int:
        wire.check_fields({k: v for k, v in m.fields.items() if k in schema}, schema, leading=True)
        wire.check_fields({k: v for k, v in m.fields.items() if k in episodes}, episodes, leading=True)
        return len(m.fields["action"])

    stop = mp.Event()
    if kind == "pipe":
        bound = 64
        procs = [mp.Process(target=pipe_actor, args=(address, prefix, i, batch, bound, stop)) for i in range(actors)]
        consumer = Consumer(client, board.keys.queue, validate, max_lag=0)
        take = lambda: sum(n for _, n in consumer.pop(0, 64, timeout=0.01))  # noqa: E731
    else:
        bound = 64 * batch
        procs = [mp.Process(target=raw_actor, args=(address, board.keys.queue, i, bound, stop)) for i in range(actors)]
        conn = RawConnection(*address)
        take = lambda: raw_taker(conn, board.keys.queue)  # noqa: E731
    for p in procs:
        p.start()
    try:
        warm = time.monotonic() + 1.0
        while time.monotonic() < warm:
            take()
        count, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            count += take()
        rate = count / (time.monotonic() - start)
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    if kind == "pipe":
        assert consumer.malformed == 0 and consumer.dropped == 0 and consumer.lost == 0
    client.close()
    return rate


def pipe(args: argparse.Namespace) -> int:
    print(f"{mp.cpu_count()} CPUs; CartPole transitions of {TRANSITION_BYTES} bytes; pipe batches of {args.batch}; raw: one RPUSH per transition, {RAW_PIPELINE} per round trip")
    print(f"{'actors':>6}  {'hpcrl pipe':>14}  {'raw Redis':>14}  {'pipe/raw':>8}")
    ok = True
    with RedisServer("127.0.0.1") as server:
        for n in args.actors:
            ours = measure("pipe", server, n, args.seconds, args.batch)
            raw = measure("raw", server, n, args.seconds, args.batch)
            ratio = ours / raw
            ok &= ours >= TARGET_PER_S and ratio >= TARGET_RATIO
            print(f"{n:>6}  {ours / 1e6:>10.2f} M/s  {raw / 1e6:>10.2f} M/s  {ratio:>8.2f}", flush=True)
    print(f"target: >= {TARGET_PER_S / 1e6:g} M transitions/s and >= {TARGET_RATIO:g} x raw: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


# ------------------------------------------------------------------------------------------ learning


def sweep(config: str, output: Path, overrides: list[str]) -> Path:
    cmd = [sys.executable, "-m", "hpcrl", "sweep", str(REPO / "configs" / config), "--scheduler", "local", "-p", f"output={output}", *sum((["-p", o] for o in overrides), [])]
    began = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    name = config.removesuffix(".yaml")
    print(f"  {config} {' '.join(overrides)}: {time.monotonic() - began:.0f} s wall", flush=True)
    return output / name


def run_figures(experiment: Path) -> list[tuple[int, float, float]]:
    """(seed, env steps/s over the run, final eval return) per run."""
    out = []
    for rd in sorted((experiment / "runs").iterdir()):
        rows = list(csv.DictReader((rd / "train.csv").open()))
        sps = int(rows[-1]["step"]) / float(rows[-1]["wall_time"])
        returns = [float(r["return"]) for r in csv.DictReader((rd / "eval.csv").open())]
        out.append((int(rd.name.rsplit("-s", 1)[1]), sps, float(np.mean(returns))))
    return out


def learning(args: argparse.Namespace) -> int:
    seeds = f"sweep.seeds=[{','.join(map(str, args.seeds))}]"
    results: list[tuple[str, list[tuple[int, float, float]]]] = []
    exp = sweep("cartpole_dqn.yaml", args.output / "single", [seeds])
    results.append(("single-process DQN", run_figures(exp)))
    for n in args.actors:
        exp = sweep("cartpole_apex.yaml", args.output / f"actors{n}", [seeds, f"distributed.actors={n}", f"resources.max_concurrent={n + 1}"])
        results.append((f"Ape-X DQN, {n} actor{'s' if n > 1 else ''}", run_figures(exp)))
    print(f"\n{'':<22}  {'env steps/s':>11}  {'final return per seed':<28}  {'mean':>6}")
    for name, runs in results:
        per_seed = " ".join(f"s{seed}:{ret:.0f}" for seed, _, ret in runs)
        print(f"{name:<22}  {np.mean([s for _, s, _ in runs]):>11.0f}  {per_seed:<28}  {np.mean([r for _, _, r in runs]):>6.1f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="part", required=True)
    p = sub.add_parser("pipe")
    p.add_argument("--actors", type=int, nargs="+", default=[1, 4])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--batch", type=int, default=512, help="transitions per pipe message")
    p.set_defaults(func=pipe)
    learn = sub.add_parser("learning")
    learn.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4])
    learn.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    learn.add_argument("--output", type=Path, default=Path("/tmp/hpcrl-distributed-bench"))
    learn.set_defaults(func=learning)
    args = parser.parse_args()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
