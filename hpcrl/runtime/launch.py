"""The launcher of a multi-rank run (`hpcrl train ... --ranks N`): what the local executor and a Grid
Engine parallel environment run, where Slurm runs `srun`.

It does what torchrun's agent does, with the differences a batch job needs:

- it holds the rendezvous store itself, on a port the kernel picks (port 0), and hands the ranks
  torch's own environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, with
  TORCHELASTIC_USE_AGENT_STORE so rank 0 joins the store instead of opening one): two runs on one
  node never race for a port;
- the scheduler's warning signal goes to every rank on this host, and when every rank checkpoints and
  asks for a requeue (REQUEUE_EXIT), so does the launcher: torchrun turns the signal into its own failure.

A rank that dies (a crash, an OOM kill, kill -9) ends the run at once: the other ranks are sent
SIGTERM, then SIGKILL after a grace period, and the run's FAILED marker names the rank and how it
died. No process is left behind: the ranks carry a mark (hpcrl.leftovers.STEP_MARK) that every
process below them inherits, and what carries it once they are stopped (a killed rank's simulator,
orphaned) is ended, with the shared memory it held. A launcher that dies takes its ranks with it.

Several hosts (Grid Engine): where the job's parallel environment granted slots on several hosts
($PE_HOSTFILE lists them), the ranks are spread over those hosts in proportion to their slots, this
host's first (rank 0 here). The store listens on every address of this host and MASTER_ADDR is this
host's name as Grid Engine knows it (the name every host resolves to its cluster address, never
127.0.0.1). The ranks of each other host are started there by a group launcher (this module run as
`python -m hpcrl.runtime.launch`) under `qrsh -inherit HOST` (Grid Engine's tight integration: the
host's execd starts it as a task of the job, counts it, and kills it with the job). qrsh passes no
environment, so the group's command line carries it. A group is one child of the launcher, as a rank
is: a group that fails (one of its ranks died, its host is gone) ends the run, and its REQUEUE_EXIT
counts as its ranks' ask for a requeue. The warning reaches the other hosts' ranks through the ranks
themselves: every rank stops at the iteration any rank was warned (Ranks.any).

A host that dies under a run that spans hosts: while the run goes on, the launcher asks every
LOST_POLL_S whether qmaster marks one of the other hosts unknown (`qstat -f -qs u`, once its load
reports stop: max_unheard) and, if so, whether its execd still takes a connection. A host gone both
ways ends the run's start at once, as a failure that host caused does, and the launcher asks for a
requeue instead of failing the run: Grid Engine reschedules the task (-r y) onto the hosts left and the
run restarts whole from its last checkpoint. (The host of the launcher itself is Grid Engine's to
handle: reschedule_unknown reschedules a job whose master task was there.)
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TextIO

from hpcrl.leftovers import STEP_MARK, end_marked_leftovers, is_mark
from hpcrl.runtime.lifeline import dies_with_me
from hpcrl.store import rundir, runlock
from hpcrl.store.states import REQUEUE_EXIT

LAUNCH_ID = "HPCRL_LAUNCH_ID"
"""Names one start of a multi-rank job (the job id and its requeue count): its rendezvous file."""

GRACE_S = 10.0
"""How long the other ranks get to exit after one died, before SIGKILL."""
FORWARDED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)

RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", LAUNCH_ID)
HOST_VARS = re.compile(
    r"(SGE_.*|JOB_.*|PE|PE_HOSTFILE|NSLOTS|NHOSTS|NQUEUES|QUEUE|REQUEST|RESTARTED|ENVIRONMENT|ARC|HOSTNAME|HOST|TMPDIR|TMP"
    r"|PWD|OLDPWD|SHLVL|_|SSH_.*|DISPLAY)"
)
"""What Grid Engine and the shell set for each host or task: another host's group gets its own."""
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
GROUP_MARK = "HPCRL_GROUP_MARK"
"""The ranks' mark (`STEP_MARK`) as a group launcher receives it: under another name, so that the launcher itself,
which is not what its ranks left, does not carry it."""
LOST_POLL_S = 5.0
"""How often a launcher whose ranks span hosts asks whether one of them is lost."""


def how_it_ended(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class LaunchError(RuntimeError):
    """The ranks cannot be placed (an unreadable host file, a loopback master address): one line."""


def pe_hosts(path: Path) -> list[tuple[str, int]]:
    """Hosts and their slots, in order, from Grid Engine's $PE_HOSTFILE (`host slots queue processors`
    per line; a host with slots in two queues is listed twice and counted once)."""
    hosts: dict[str, int] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise LaunchError(f"$PE_HOSTFILE {path}: {exc.strerror or exc}") from None
    for line in lines:
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 2 or not fields[1].isdigit():
            raise LaunchError(f"$PE_HOSTFILE {path}: unreadable line {line!r} (expected: host slots queue processors)")
        hosts[fields[0]] = hosts.get(fields[0], 0) + int(fields[1])
    return list(hosts.items())


def place(ranks: int, hosts: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """How many of `ranks` run on each host: in proportion to its slots (largest remainder; ties go to
    the earlier host), hosts that get none left out."""
    total = sum(slots for _, slots in hosts)
    if total <= 0:
        raise LaunchError("$PE_HOSTFILE grants no slots")
    shares = [(ranks * slots) // total for _, slots in hosts]
    order = sorted(range(len(hosts)), key=lambda i: (-((ranks * hosts[i][1]) % total), i))
    for i in order[: ranks - sum(shares)]:
        shares[i] += 1
    return [(host, n) for (host, _), n in zip(hosts, shares, strict=True) if n > 0]


def _this_host_first(hosts: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """This host's entry first (its ranks are started here, rank 0 among them); hosts compare by short name."""
    me = socket.gethostname().split(".")[0]
    mine = [h for h in hosts if h[0].split(".")[0] == me]
    if not mine:
        raise LaunchError(f"this host ({socket.gethostname()}) is not in $PE_HOSTFILE ({', '.join(h for h, _ in hosts)}): cannot place rank 0 here")
    return mine + [h for h in hosts if h not in mine]


def _is_loopback(name: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(name)).is_loopback
    except (OSError, ValueError):
        return False


def spread(ranks: int, env: dict[str, str] | None = None) -> list[tuple[str, int]] | None:
    """The hosts of a Grid Engine job whose slots span several hosts, with the ranks each runs (this
    host first); None on one host (no $PE_HOSTFILE, or one host in it)."""
    env = dict(os.environ) if env is None else env
    path = env.get("PE_HOSTFILE")
    if not path:
        return None
    hosts = pe_hosts(Path(path))
    if len(hosts) <= 1:
        return None
    placed = dict(place(ranks, hosts))
    ordered = _this_host_first([(host, placed.get(host, 0)) for host, _ in hosts])
    if ordered[0][1] == ranks:
        return None  # every rank here: the single-host launcher
    # This host first even with no rank of its own (too few slots here for one): it holds the store.
    return [ordered[0], *(entry for entry in ordered[1:] if entry[1] > 0)]


def execd_answers(host: str, timeout_s: float = 5.0) -> bool:
    """Whether `host`'s sge_execd takes a TCP connection (SGE_EXECD_PORT, else the sge_execd service, else 6445)."""
    try:
        port = int(os.environ.get("SGE_EXECD_PORT") or socket.getservbyname("sge_execd", "tcp"))
    except (OSError, ValueError):
        port = 6445
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def lost_hosts(hosts: list[str]) -> list[str]:
    """The hosts of `hosts` that are gone: qmaster marks their queue instances unknown (`qstat -f -qs u`)
    and their execd takes no connection. Unknown alone is not enough: every host is unknown for a while
    after qmaster restarts. Where qstat does not answer, none."""
    try:
        listing = subprocess.run(["qstat", "-f", "-qs", "u"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    unknown = {fields[0].partition("@")[2] for fields in (line.split() for line in listing.splitlines()) if fields and "@" in fields[0]}
    return [host for host in hosts if host in unknown and not execd_answers(host)]


def launch(argv: list[str], ranks: int, run_dir: Path | None, out: TextIO | None = None) -> int:
    """Run `argv` as `ranks` processes and wait for all of them; returns the run's exit code
    (REQUEUE_EXIT when every rank asked for a requeue). On one host unless the job's parallel
    environment spans several (see the module docstring)."""
    from torch.distributed import TCPStore  # deferred: `hpcrl --help` does not pay for torch

    started = time.time()
    try:
        hosts = spread(ranks)
    except LaunchError as exc:
        print(f"hpcrl: error: {exc}", file=sys.stderr)
        if run_dir is not None and not rundir.is_done(run_dir):
            rundir.mark(run_dir, rundir.FAILED, str(exc))
        return 1
    here = hosts[0][1] if hosts else ranks
    master = hosts[0][0] if hosts else "127.0.0.1"
    store = TCPStore(master, 0, ranks + 1, is_master=True, wait_for_workers=False)
    base = {
        **os.environ, "MASTER_ADDR": master, "MASTER_PORT": str(store.port), "WORLD_SIZE": str(ranks),
        "LOCAL_WORLD_SIZE": str(here), "TORCHELASTIC_USE_AGENT_STORE": "True", LAUNCH_ID: os.environ.get(LAUNCH_ID) or uuid.uuid4().hex,
        STEP_MARK: uuid.uuid4().hex,  # every process below a rank carries it, on every host: what the ranks left
    }  # fmt: skip
    # Each rank dies with the launcher, however it dies: without its store a rank would run on alone.
    children = [subprocess.Popen(argv, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}, preexec_fn=dies_with_me()) for r in range(here)]
    labels = [f"rank {r} of {ranks}" for r in range(here)]
    if hosts:
        first = here
        for host, count in hosts[1:]:
            try:
                children.append(subprocess.Popen(group_argv(host, first, count, argv, base)))
            except OSError as exc:
                _stop(children, grace_s=0.0)
                print(f"hpcrl: error: cannot start the ranks on {host}: qrsh: {exc.strerror or exc}", file=sys.stderr)
                if run_dir is not None and not rundir.is_done(run_dir):
                    rundir.mark(run_dir, rundir.FAILED, f"qrsh -inherit {host}: {exc.strerror or exc}")
                return 1
            labels.append(f"ranks {first}-{first + count - 1} of {ranks} on {host}")
            first += count
        print(f"hpcrl: {ranks} ranks on {len(hosts)} hosts: " + ", ".join(f"{count} on {host}" for host, count in hosts) + f" (MASTER_ADDR {master})", file=out)

    def forward(signum: int, _frame: FrameType | None) -> None:
        for child in children[:here]:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        others = [host for host, _ in hosts[1:]] if hosts else []
        code = _wait(children, labels, run_dir, out, f"all {ranks} ranks", (lambda: lost_hosts(others)) if others else None)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _stop(children, grace_s=0.0)
    _end_what_they_left(code, base[STEP_MARK], f"the run's ranks (exit {code})", started, out)
    return code


def group_argv(host: str, first: int, count: int, argv: list[str], env: dict[str, str]) -> list[str]:
    """`qrsh -inherit HOST COMMAND`: the group launcher of `count` ranks from rank `first` on `host`, with
    this job's environment (less what Grid Engine sets per host) and working directory. qrsh joins its
    words into one line for the remote shell, so the line is quoted here, word by word."""
    passed = {(GROUP_MARK if k == STEP_MARK else k): v for k, v in env.items() if NAME.fullmatch(k) and not HOST_VARS.fullmatch(k)}
    words = ["env", *(f"{k}={v}" for k, v in passed.items()), sys.executable, "-m", "hpcrl.runtime.launch", str(first), str(count), "--", *argv]
    line = f"cd {shlex.quote(os.getcwd())} && exec " + " ".join(shlex.quote(w) for w in words)
    return ["qrsh", "-inherit", "-nostdin", host, line]


def group(argv: list[str], first: int, count: int, out: TextIO | None = None) -> int:
    """One host's ranks `first`..`first + count - 1` of a run that spans hosts, in the environment the
    launcher passed (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, ...): started, watched and signalled as the
    launcher does on its own host."""
    master = os.environ.get("MASTER_ADDR", "")
    if not master or _is_loopback(master):
        where = f"{master} resolves to {socket.gethostbyname(master)}" if master else "MASTER_ADDR is not set"
        print(f"hpcrl: error: ranks {first}-{first + count - 1} on {socket.gethostname()}: {where} here, not the launcher's host", file=sys.stderr)
        return 1
    mark = os.environ.get(GROUP_MARK)
    if mark is not None and not is_mark(mark):
        print(f"hpcrl: error: ranks {first}-{first + count - 1} on {socket.gethostname()}: {GROUP_MARK} is not a start's mark: {mark!r}", file=sys.stderr)
        return 2
    base = {k: v for k, v in os.environ.items() if k != GROUP_MARK}
    base.update({"LOCAL_WORLD_SIZE": str(count), STEP_MARK: mark or ""})  # "": no mark, not a stray one of the caller's
    started = time.time()
    children = [subprocess.Popen(argv, env={**base, "RANK": str(first + r), "LOCAL_RANK": str(r)}, preexec_fn=dies_with_me()) for r in range(count)]
    print(f"hpcrl: ranks {first}-{first + count - 1} started on {socket.gethostname()}", file=out, flush=True)

    def forward(signum: int, _frame: FrameType | None) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    which = f"ranks {first}-{first + count - 1} on {socket.gethostname()}"
    try:
        code = _wait(children, [f"rank {first + r} on {socket.gethostname()}" for r in range(count)], None, out, which)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _stop(children, grace_s=0.0)
    _end_what_they_left(code, base[STEP_MARK], f"the {which} (exit {code})", started, out)
    return code


def _end_what_they_left(code: int, mark: str, who: str, since: float, out: TextIO | None) -> None:
    """After ranks that failed (one killed alone: the OOM killer), end what they left on this host, the processes
    that carry their mark, and what those held (`hpcrl.leftovers.end_marked_leftovers`): a killed rank's simulator,
    orphaned, is lost to Slurm's proctrack/linuxproc, and Grid Engine, which ends it with the job, leaves its files
    in the node's /dev/shm. Ranks that finished, asked for a requeue or found their run held by another trainer were
    not cut short."""
    if code not in (0, REQUEUE_EXIT, runlock.LOCKED_EXIT) and mark:
        end_marked_leftovers(mark, since, who, out)


def _wait(
    children: list[subprocess.Popen], labels: list[str], run_dir: Path | None, out: TextIO | None, which: str = "",
    lost: Callable[[], list[str]] | None = None,
) -> int:
    """Until every child ended or one failed; `which`: the ranks, for the requeue line (all of them by default).
    `lost`: the hosts of the run that are gone (asked every LOST_POLL_S, and when a child failed): the run's
    start ends and asks for a requeue, to restart whole on the hosts left."""
    asked = time.monotonic()
    while True:
        codes = [child.poll() for child in children]
        failed = [(i, c) for i, c in enumerate(codes) if c is not None and c not in (0, REQUEUE_EXIT)]
        if lost is not None and (failed or time.monotonic() - asked >= LOST_POLL_S):
            asked = time.monotonic()
            gone = lost()
            if gone:
                _stop(children, GRACE_S)
                print(f"hpcrl: {', '.join(gone)} lost (qmaster: unknown; its execd does not answer): the run restarts whole from its last checkpoint; asking for a requeue", file=sys.stderr)
                return REQUEUE_EXIT
        if failed:
            i, code = failed[0]
            _stop(children, GRACE_S)
            if code == runlock.LOCKED_EXIT and labels[i].startswith("rank 0 "):  # another trainer holds the run: not a failure of it
                return code
            reason = f"{labels[i]} {how_it_ended(code)}; the other ranks were stopped"
            print(f"hpcrl: error: {reason}", file=sys.stderr)
            if run_dir is not None and not rundir.is_done(run_dir):
                rundir.mark(run_dir, rundir.FAILED, reason)
            return 1
        if all(c is not None for c in codes):
            if all(c == REQUEUE_EXIT for c in codes):
                print(f"hpcrl: {which or f'all {len(children)} ranks'} checkpointed; asking for a requeue", file=out)
                return REQUEUE_EXIT
            return max(codes)  # type: ignore[type-var]
        time.sleep(0.1)


def _stop(children: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM to the ranks still running, SIGKILL to those still there after `grace_s`."""
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def main(args: list[str]) -> int:
    """`python -m hpcrl.runtime.launch FIRST COUNT -- ARGV...`: one host's group (see `group`)."""
    if len(args) < 4 or args[2] != "--" or not (args[0].isdigit() and args[1].isdigit()) or int(args[1]) < 1:
        print("usage: python -m hpcrl.runtime.launch FIRST COUNT -- COMMAND...", file=sys.stderr)
        return 2
    return group(args[3:], int(args[0]), int(args[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
