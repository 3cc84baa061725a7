"""Issues 7 and 17: the actor -> learner pipe against raw Redis, and distributed DQN against single-process DQN.

Part 1, `pipe` (seconds): transitions/s from N actor processes to one learner process through a
private redis-server, in the same run, on the same server:

- hpcrl's pipe, at the settings of configs/cartpole_apex.yaml (its `distributed:` section: batch
  size, queue bound, batches per round trip, send delay) and with one setting changed: each actor
  encodes batches of CartPole-sized transitions (obs 4 x f4, action i8, reward f4, next obs 4 x f4,
  discount f4: 44 bytes) with `wire.encode`, collects them in a `queue.Outbox` and sends it with
  `queue.Producer` (the bounded EVALSHA push plus the version/status reads every actor round trip
  carries), as `hpcrl actor` does; the learner pops with `queue.Consumer`, which decodes every batch
  and checks it with the learner's own `ApexLearner.validate`. Counted at the learner; nothing may be
  dropped, lost or malformed, and each actor's batches must arrive in order (checked).
  Columns: `default` (the config's settings), `1/trip` (one batch per round trip, as before issue 17)
  and `batch 512` (the config's settings with 512-transition batches).
- raw Redis: each actor RPUSHes one 44-byte value per transition, pipelined 256 commands per round
  trip (what `redis-benchmark -P` measures; the prior system sent one message per transition),
  written as pre-built protocol bytes on a bare socket, and the learner pops them with LPOP COUNT
  and skips over the bytes: no client library, no codec. Bounded too (an LLEN rides in each round
  trip; 32768 transitions, so that the bound never slows it).

Each cell is the median over `--repeats` rounds; a round measures every cell once, in turn, so that
the load of a shared machine falls on all of them alike. Target (issues 7 and 17): at the config's
own settings the pipe moves >= 1M small transitions/s and >= 0.5 x the raw loop.

Figures (2026-11-25, the 2-core VM shared with other sessions, load average 4-8; two rounds each,
`--seconds 3`, interleaved with the code before issue 17 run from a copy of its commit; M/s, 1/2/4 actors):
- before, batch 64, bound 64 (issue 7's bench): 0.19/0.24/0.45 and 0.21/0.29/0.37, raw 0.28-0.63 x;
  batch 512: 1.37/2.12/3.82 and 1.07/2.13/1.88.
- now, `default` (64 x up to 8 per round trip), the config's bound 8: 0.47/0.38/0.44 and 0.35/0.61/0.70,
  0.46-1.05 x raw; with `--bound 64`: 0.65/1.33/1.29 and 0.45/0.80/1.30, 0.44-2.32 x raw.
Quiet machine (2026-11-25, load < 1.5, 3 x 3 s), 1/2/4 actors: raw 0.97/1.43/1.83; `default`
1.16/1.14/0.93 (1.20/0.80/0.51 x raw): the target holds at the config's 2 actors; 4 actors on 2 cores
reach 0.93M/s. `1/trip` 0.38/0.62/0.70; batch 512 5.30/4.35/3.57.
At bound 8 the queue holds 512 transitions, and a learner that drains it as fast as it can moves at
most that per round trip: the rate is the round trip's (0.5-1 ms on this loaded machine), not the codec's.

Part 3, `bridge` (seconds; root, with the test cluster's namespace nodes up: `tests/clusters/slurm.sh start
--nodes 2`): the same pipe (`default` setting) with the redis-server on the head's bridge address and each
actor process in a namespace node (it enters the node's network namespace before it connects), beside the
same on loopback; and DD-PPO's collective, gloo's all-reduce of a flat gradient buffer (the 64x64 CartPole
policy's 9k floats, and 1M), between 2 ranks in two nodes over the bridge, beside 2 ranks on loopback. A
figure, not a target: the namespaces share this machine's 2 cores, so the bridge costs the veth and
bridge's packet path, not a network's.

Part 2, `learning` (minutes): `hpcrl sweep` through the local executor of configs/cartpole_apex.yaml
with 1, 2 and 4 actors and of configs/cartpole_dqn.yaml (single process), then per run: env steps/s
of the learner (or trainer) over the whole run, and the final evaluation return.

    PYTHONPATH=. python benchmarks/distributed.py pipe [--actors 1 2 4] [--seconds 5] [--repeats 3] [--bound 64]
    PYTHONPATH=. python benchmarks/distributed.py learning [--actors 1 2 4] [--seeds 0 1 2] [--output EMPTY_FOLDER]
    PYTHONPATH=. python benchmarks/distributed.py bridge [--actors 1 2] [--seconds 3] [--nodes slurm-node1 slurm-node2]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import fcntl
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import _args  # benchmarks/_args.py: the script's own folder is first on sys.path
import gymnasium as gym
import numpy as np
import torch

from hpcrl.config.distributed_spec import DistributedConfig
from hpcrl.config.load import load_experiment
from hpcrl.distributed import wire
from hpcrl.distributed.apex import ApexLearner
from hpcrl.distributed.board import DONE, RUNNING, Board, connect
from hpcrl.distributed.queue import Consumer, NotRunning, Outbox, Producer
from hpcrl.distributed.redis_server import RedisServer

REPO = Path(__file__).resolve().parent.parent
OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
TRANSITION_BYTES = 44
RAW_PIPELINE = 256
RAW_BOUND = 64 * 512
CONFIG = REPO / "configs" / "cartpole_apex.yaml"
TARGET_PER_S, TARGET_RATIO = 1_000_000, 0.5


def cartpole_batch(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "obs": rng.standard_normal((n, 4), dtype=np.float32), "action": rng.integers(0, 2, n), "reward": np.ones(n, np.float32),
        "next_obs": rng.standard_normal((n, 4), dtype=np.float32), "discount": np.full(n, 0.99, np.float32),
        "ep_return": np.zeros(0, np.float32), "ep_length": np.zeros(0, np.int32),
    }


@dataclass(frozen=True)
class Setting:
    name: str
    batch: int
    bound: int
    per_send: int
    delay_s: float


def settings(d: DistributedConfig, bound: int | None) -> list[Setting]:
    """The config's own pipe settings, then one batch per round trip, then 512-transition batches
    (`bound` instead of the config's queue bound, if given)."""
    bound = bound or d.queue_bound
    return [
        Setting("default", d.batch_transitions, bound, d.batches_per_send, d.send_delay_s),
        Setting("1/trip", d.batch_transitions, bound, 1, d.send_delay_s),
        Setting("batch 512", 512, bound, d.batches_per_send, d.send_delay_s),
    ]


def pipe_actor(address: tuple[str, int, str], prefix: str, actor: int, s: Setting, stop, node: str | None = None) -> None:
    enter_node(node)
    client = connect(*address)
    board = Board(client, prefix)
    producer = Producer(client, board.keys.queue, board.keys.status, s.bound)
    outbox = Outbox(s.per_send, s.delay_s)
    fields = cartpole_batch(s.batch, np.random.default_rng(actor))
    seq = 0
    try:
        while not stop.is_set():
            outbox.add(wire.encode(wire.BATCH, 0, actor, seq, fields))  # encoded anew each time, as an actor does
            seq += 1
            if outbox.due():
                outbox.send(producer, board.watch)
    except NotRunning:
        pass  # the measurement is over (a producer waiting for room learns it so)


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


def measure(server: RedisServer, actors: int, seconds: float, setting: Setting | None, learner: ApexLearner, nodes: list[str] | None = None) -> float:
    """Transitions/s received by this (learner) process over `seconds`, after a 1 s warm-up; raw Redis when `setting` is None."""
    client = server.client()
    client.flushall()
    address = (server.host, server.port, server.password)
    prefix = f"bench:{setting.name if setting else 'raw'}:"
    board = Board(client, prefix)
    board.set_status(RUNNING)
    stop = mp.Event()
    order: dict[int, list[int]] = {}
    if setting is not None:
        where = [nodes[i % len(nodes)] if nodes else None for i in range(actors)]
        procs = [mp.Process(target=pipe_actor, args=(address, prefix, i, setting, stop, where[i])) for i in range(actors)]
        consumer = Consumer(client, board.keys.queue, learner.validate, max_lag=0)

        def take() -> int:
            batches = consumer.pop(0, 64, timeout=0.01)
            for m, _ in batches:
                order.setdefault(m.sender, []).append(m.seq)
            return sum(n for _, n in batches)
    else:
        procs = [mp.Process(target=raw_actor, args=(address, board.keys.queue, i, RAW_BOUND, stop)) for i in range(actors)]
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
        board.set_status(DONE)
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    if setting is not None:
        assert consumer.malformed == 0 and consumer.dropped == 0 and consumer.lost == 0, vars(consumer)
        assert all(seqs == list(range(seqs[0], seqs[0] + len(seqs))) for seqs in order.values()), "batches out of order or repeated"
    client.close()
    return rate


def pipe(args: argparse.Namespace) -> int:
    exp = load_experiment(CONFIG)
    d = exp.distributed
    assert d is not None
    cells = settings(d, args.bound)
    learner = ApexLearner(exp.train, d, OBS_SPACE, gym.spaces.Discrete(2), torch.device("cpu"))
    print(
        f"{mp.cpu_count()} CPUs; CartPole transitions of {TRANSITION_BYTES} bytes; {CONFIG.relative_to(REPO)}: batches of {d.batch_transitions}, "
        f"queue bound {args.bound or d.queue_bound}{'' if args.bound in (None, d.queue_bound) else ' (--bound; the config has ' + str(d.queue_bound) + ')'}, up to {d.batches_per_send} batches per round trip, send delay {d.send_delay_s:g} s; "
        f"raw: one RPUSH per transition, {RAW_PIPELINE} per round trip; medians of {args.repeats} x {args.seconds:g} s"
    )
    header = "".join(f"  {c.name:>10}  {'/raw':>5}" for c in cells)
    print(f"{'actors':>6}  {'raw Redis':>10}{header}   (M transitions/s)")
    ok = True
    with RedisServer("127.0.0.1") as server:
        for n in args.actors:
            runs: dict[str, list[float]] = {}
            for _ in range(args.repeats):
                runs.setdefault("raw", []).append(measure(server, n, args.seconds, None, learner))
                for c in cells:
                    runs.setdefault(c.name, []).append(measure(server, n, args.seconds, c, learner))
            med = {k: statistics.median(v) for k, v in runs.items()}
            raw = med["raw"]
            if n == d.actors:  # the target is the config's own settings, its actor count included
                ok &= med["default"] >= TARGET_PER_S and med["default"] / raw >= TARGET_RATIO
            row = "".join(f"  {med[c.name] / 1e6:>10.2f}  {med[c.name] / raw:>5.2f}" for c in cells)
            print(f"{n:>6}  {raw / 1e6:>10.2f}{row}", flush=True)
            if args.repeats > 1:
                print("        rounds: " + "; ".join(f"{k} " + " ".join(f"{v / 1e6:.2f}" for v in vs) for k, vs in runs.items()), flush=True)
    if d.actors not in args.actors:
        print(f"the config's {d.actors} actors were not measured (--actors): no verdict")
        return 0
    print(f"target at the config's own settings (`default`, {d.actors} actors): >= {TARGET_PER_S / 1e6:g} M transitions/s and >= {TARGET_RATIO:g} x raw: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


# ------------------------------------------------------------------------------------------ across the bridge

HEAD_IP = "10.251.0.1"
"""The head's address on the test clusters' bridge (tests/clusters/nodes.sh)."""
CLONE_NEWNET = 0x40000000


def enter_node(node: str | None) -> None:
    """Move this process into a namespace node's network (setns): it then dials as that node does."""
    if node is None:
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    with open(f"/run/netns/{node}") as ns:
        if libc.setns(ns.fileno(), CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {node}")


def allreduce_rank(rank: int, master: str, port: int, node: str | None, sizes: list[int], seconds: float, results) -> None:
    """One of 2 gloo ranks: all-reduces of each size for `seconds`, after a warm-up; rank 0 reports ms per call."""
    import torch.distributed as dist

    from hpcrl.netaddr import advertised_address, interface_of

    enter_node(node)
    os.environ["GLOO_SOCKET_IFNAME"] = interface_of(advertised_address()) or "lo" if node else "lo"
    store = dist.TCPStore(master, port, 2, is_master=rank == 0, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    for size in sizes:
        buf = torch.ones(size)
        for _ in range(5):
            dist.all_reduce(buf)
        calls, start = 0, time.monotonic()
        flag = torch.zeros(1)
        while True:
            dist.all_reduce(buf)
            calls += 1
            flag[0] = float(time.monotonic() - start >= seconds) if rank == 0 else 0.0
            dist.broadcast(flag, 0)  # both ranks stop at the same call
            if flag.item():
                break
        if rank == 0:
            results.put((size, 1000 * (time.monotonic() - start) / calls))
    dist.destroy_process_group()


def allreduce_ms(nodes: list[str] | None, sizes: list[int], seconds: float) -> dict[int, float]:
    ctx = mp.get_context("spawn")  # fresh interpreters: gloo in a child forked from a process with torch's threads can hang
    results = ctx.Queue()
    master = node_address(nodes[0]) if nodes else "127.0.0.1"
    port = 29000 + os.getpid() % 1000 + (500 if nodes else 0)
    procs = [ctx.Process(target=allreduce_rank, args=(r, master, port, nodes[r] if nodes else None, sizes, seconds, results)) for r in range(2)]
    for p in procs:
        p.start()
    found = dict(results.get(timeout=120) for _ in sizes)
    for p in procs:
        p.join(timeout=30)
    return found


def node_address(node: str) -> str:
    """A namespace node's address, from the hosts file tests/clusters/nodes.sh wrote for it."""
    for line in Path(f"/etc/netns/{node}/hosts").read_text().splitlines():
        words = line.split()
        if len(words) >= 2 and words[1] == node and not words[0].startswith("127."):
            return words[0]
    raise SystemExit(f"bridge: no address for {node} in /etc/netns/{node}/hosts")


def bridge(args: argparse.Namespace) -> int:
    missing = [n for n in args.nodes if not Path(f"/run/netns/{n}").exists()]
    if os.geteuid() != 0 or missing:
        print(f"bridge: needs root and the namespace nodes {' '.join(args.nodes)} (bash tests/clusters/slurm.sh start --nodes 2); missing: {' '.join(missing) or 'root'}", file=sys.stderr)
        return 2
    exp = load_experiment(CONFIG)
    d = exp.distributed
    assert d is not None
    default = settings(d, None)[0]
    learner = ApexLearner(exp.train, d, OBS_SPACE, gym.spaces.Discrete(2), torch.device("cpu"))
    print(f"{mp.cpu_count()} CPUs shared by every node; pipe at {CONFIG.relative_to(REPO)}'s settings, {args.seconds:g} s a cell; actors in {', '.join(args.nodes)}")
    print(f"{'actors':>6}  {'loopback':>10}  {'bridge':>10}  {'bridge/loopback':>15}   (M transitions/s)")
    with RedisServer("127.0.0.1") as local, RedisServer(HEAD_IP) as head:
        for n in args.actors:
            here = measure(local, n, args.seconds, default, learner)
            there = measure(head, n, args.seconds, default, learner, args.nodes)
            print(f"{n:>6}  {here / 1e6:>10.2f}  {there / 1e6:>10.2f}  {there / here:>15.2f}", flush=True)
    sizes = [9_218, 1_000_000]
    here, there = allreduce_ms(None, sizes, args.seconds), allreduce_ms(args.nodes[:2], sizes, args.seconds)
    print(f"DD-PPO's all-reduce, 2 ranks (gloo): {'floats':>9}  {'loopback ms':>11}  {'bridge ms':>9}  {'bridge/loopback':>15}")
    for size in sizes:
        print(f"{'':36}{size:>10}  {here[size]:>11.3f}  {there[size]:>9.3f}  {there[size] / here[size]:>15.2f}")
    return 0


# ------------------------------------------------------------------------------------------ learning


def sweep(config: str, output: Path, overrides: list[str]) -> Path:
    cmd = [sys.executable, "-m", "hpcrl", "sweep", str(REPO / "configs" / config), "--scheduler", "local", "-p", f"output={output}", *sum((["-p", o] for o in overrides), [])]
    began = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"]
        raise SystemExit(f"distributed.py: hpcrl sweep of {config} failed: {lines[-1]}")
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
    """Every side trained anew, into --output or a temporary folder removed at the end: into a folder that held an
    earlier run, `hpcrl sweep` would submit nothing (its runs are done) and the table would print that run's figures."""
    seeds = f"sweep.seeds=[{','.join(map(str, args.seeds))}]"
    results: list[tuple[str, list[tuple[int, float, float]]]] = []
    with tempfile.TemporaryDirectory(prefix="hpcrl-distributed-") if args.output is None else contextlib.nullcontext(str(args.output)) as folder:
        output = Path(folder)
        lock = open(output / ".lock", "w")  # noqa: SIM115  # held until this process ends: two runs started at once into one --output
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(f"distributed.py: another run of this benchmark is training into {output}") from None
        exp = sweep("cartpole_dqn.yaml", output / "single", [seeds])
        results.append(("single-process DQN", run_figures(exp)))
        for n in args.actors:
            exp = sweep("cartpole_apex.yaml", output / f"actors{n}", [seeds, f"distributed.actors={n}", f"resources.max_concurrent={n + 1}"])
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
    p.add_argument("--actors", type=_args.positive_integer, nargs="+", default=[1, 2, 4], help="actor processes (the config has 2)")
    p.add_argument("--seconds", type=_args.seconds, default=5.0, help="per measurement, after a 1 s warm-up")
    p.add_argument("--repeats", type=_args.positive_integer, default=1, help="rounds over all cells; each cell prints its median")
    p.add_argument("--bound", type=_args.positive_integer, help="queue bound in batches instead of the config's (issue 7 measured with 64)")
    p.set_defaults(func=pipe)
    learn = sub.add_parser("learning")
    learn.add_argument("--actors", type=_args.positive_integer, nargs="+", default=[1, 2, 4])
    learn.add_argument("--seeds", type=_args.seed, nargs="+", default=[0, 1, 2])
    learn.add_argument("--output", type=_args.empty_folder, help="an empty or new folder, kept (default: a temporary one, removed)")
    learn.set_defaults(func=learning)
    across = sub.add_parser("bridge")
    across.add_argument("--actors", type=_args.positive_integer, nargs="+", default=[1, 2])
    across.add_argument("--seconds", type=_args.seconds, default=3.0, help="per measurement, after a 1 s warm-up")
    across.add_argument("--nodes", nargs="+", default=["slurm-node1", "slurm-node2"], help="namespace nodes (tests/clusters/nodes.sh)")
    across.set_defaults(func=bridge)
    args = parser.parse_args()
    if getattr(args, "output", None) is not None:  # learning's
        _args.make_folder(parser, args.output, "--output")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
