"""What a finished program or job left running in its session, named and ended.

A process may outlive the one that started it: a user's trainer that forks helpers, a simulator's
engine (ViZDoom's) whose controller was SIGKILLed. A cluster ends a job's processes when the job
ends; the program supervisor (hpcrl.runtime.program) and the local executor (hpcrl.schedulers.local)
do the same through this one rule, each for the session it started; a Slurm job's step after its ranks' step
failed, and hpcrl's launcher after its ranks failed, for the processes that carry the ranks' mark
(`end_marked_leftovers`: whatever their session).

A killed process also leaves the POSIX shared memory it held (files in /dev/shm, which live in the
node's RAM until they are removed): a SIGKILLed ViZDoom engine its screen buffer (10.6 MB at
160x120) and two message queues. Whoever SIGKILLs a process tree here (hpcrl.rl.env_workers's
`kill_trees`, the benchmarks' measurements) stops it first (`stop`, `stop_session`: a process
still running after the listing may make more), notes what its processes held and, once they are
gone, removes what no live process still holds (`shared_memory_of`, `remove_shared_memory`). What a
process killed from outside held alone is listed by nobody: `remove_unheld` finds it by its maker's name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple, TextIO

LEFTOVER_GRACE_S = 5.0
"""Between SIGTERM and SIGKILL of what was left running."""
KILLED_GONE_S = 60.0
"""How long the processes SIGKILLed here (`kill_holding`, `end_leftovers`) may take to be gone before the shared
memory they held is given up (`remove_shared_memory`; left in /dev/shm for ever, as nobody else knows it was
theirs). An exit waits for the end of an uninterruptible wait (a write to a stalled NFS home, a frozen file system) and, on a loaded node, for a CPU: with 5 s, a process
stuck writing to a frozen file system for 7 s left its file (tests/test_leftovers.py), and a killed benchmark
measurement under the full suite on 2 cores one game's message queues (most likely a worker that slow to die). A
bound all the same: a process stuck for good (a dead NFS server) does not hold the one who killed it for ever."""
SHARED_MEMORY = "/dev/shm/"


def end_leftovers(session: int, out: TextIO | None, who: str, spare: Sequence[int] = (), since: float | None = None) -> None:
    """End what `who` (the program, a finished task) left running in `session` (SIGTERM, then SIGKILL
    after LEFTOVER_GRACE_S), naming each process in the job log `out`, and remove the shared memory
    they alone held; returns when none is left. `spare` are not `who`'s (the program supervisor's
    keeper and its deputy). Given when `who` started (`since`, a `time.time()`), the files it made that
    nobody holds go too, named in the log (`remove_unheld`): a trainer killed alone takes its env workers
    with it (their death signal), and a worker that was starting a game held that game's queues alone."""
    _end_found(lambda: in_session(session), out, who, spare, since)


def end_job_leftovers(since: float, status: int, out: TextIO | None) -> None:
    """The last step of a job script whose hpcrl left no exit status (killed: the OOM killer, a SIGKILL): end what
    it left running in the job's session, named in the job log, and remove the shared memory they held and the
    files made since `since` (the job's start) that nobody holds (`end_leftovers`).

    A scheduler ends a job's processes when the job ends, but only those it tracks: Slurm's proctrack/linuxproc and
    proctrack/pgid lose a process reparented to init (a killed trainer's ViZDoom engine, whose env worker died with
    the trainer) or in a process group of its own (an env worker's), and the engine ran on for ever on the node. No
    scheduler removes what such a process held in the node's /dev/shm (an engine's 10.6 MB screen, at 160x120).
    Spared: this process and those above it in the session (the job shell; a container's starter). A session with
    a terminal is a person's, not a job's: refused (ValueError), ending nothing."""
    if has_terminal():
        raise ValueError("this session has a terminal: end-leftovers ends every process of a job's session but the job shell, and runs as a job script's last step only")
    session = os.getsid(0)
    end_leftovers(session, out, f"the job's hpcrl, killed (exit {status}),", spare=_self_and_above(session), since=since)


STEP_MARK = "HPCRL_STEP_MARK"
"""The variable set in the environment of a run's ranks alone (one value per start of the run: by the job script on
the ranks' srun, by hpcrl's launcher on the ranks it starts), which every process below a rank inherits, in whatever
session or process group, reparented or not."""


def is_mark(text: str) -> bool:
    """Whether `text` can be a start's mark: not empty (which every process that has the variable set empty would
    carry), one line (a start's id)."""
    return bool(text) and "\n" not in text and "\0" not in text


def end_marked_leftovers(mark: str, since: float, who: str, out: TextIO | None) -> None:
    """After a run's ranks failed (one killed alone: the OOM killer), end every process of this node whose
    environment carries `STEP_MARK`=`mark`, named in the job log as what `who` left, and remove the shared memory
    they held and the files made since `since` that nobody holds.

    A killed rank's processes (its env's simulator) are orphaned: Slurm's proctrack/linuxproc and /pgid lose those
    reparented to init or in a group of their own, Grid Engine ends them with the job but leaves what they held in
    the node's /dev/shm. They may be in another session than the one looking (under srun each step has its own), but
    they carry the mark, which nothing else does: whatever session this runs in (a person's terminal, a CI runner's
    step), nothing but the run's is ended. Spared: this process and every process above it."""
    if not is_mark(mark):
        raise ValueError(f"not a step mark: {mark!r}")
    entry = f"{STEP_MARK}={mark}".encode()
    _end_found(lambda: marked(entry), out, who, _self_and_above(), since)


def _self_and_above(session: int | None = None) -> list[int]:
    """This process and its ancestors (those in `session` only, where given): what a cleanup run under them spares."""
    found, pid = [], os.getpid()
    while pid > 1 and (stat := process_stat(pid)) is not None and session in (None, stat.session):
        found.append(pid)
        pid = stat.parent
    return found


def has_terminal() -> bool:
    """Whether this process's session has a controlling terminal (a job's has none)."""
    try:
        os.close(os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY))
    except OSError:
        return False
    return True


def _end_found(find: Callable[[], list[tuple[int, str]]], out: TextIO | None, who: str, spare: Sequence[int], since: float | None) -> None:
    """`_end_left`; then, given `since`, remove the ViZDoom files made since then that nobody holds (`remove_unheld`),
    named in `out`: the one end of `end_leftovers` and `end_marked_leftovers`."""
    _end_left(find, out, who, spare)
    if since is not None and (removed := remove_unheld(since)):
        print(f"hpcrl: removed the shared memory nobody held: {', '.join(removed)}", file=out, flush=True)


def _end_left(find: Callable[[], list[tuple[int, str]]], out: TextIO | None, who: str, spare: Sequence[int]) -> None:
    """End what `find` lists (pid, command line) but `spare`, and whatever they start meanwhile (`find` again), named
    in `out` with the shared memory they held and nobody else holds, which goes with them."""
    left = [(pid, command) for pid, command in find() if pid not in spare]
    if not left:
        return
    named = "; ".join(f"pid {pid} ({command})" for pid, command in left)
    print(f"hpcrl: {who} left {len(left)} process(es) running: {named}; ending them (SIGTERM, SIGKILL after {LEFTOVER_GRACE_S:g} s)", file=out, flush=True)
    ended = {pid for pid, _ in left}
    held = shared_memory_of(ended)
    for sig, grace in ((signal.SIGTERM, LEFTOVER_GRACE_S), (signal.SIGKILL, KILLED_GONE_S)):
        if sig == signal.SIGKILL:  # what outlived SIGTERM, stopped before its last listing: it makes nothing more
            stop([pid for pid, _ in left], grace)
            held |= shared_memory_of(pid for pid, _ in left)
        deadline = time.monotonic() + grace
        while left and time.monotonic() < deadline:
            for pid, _ in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            time.sleep(0.05)
            left = [(pid, command) for pid, command in find() if pid not in spare]  # also what they started meanwhile
            held |= shared_memory_of(pid for pid, _ in left if pid not in ended)
            ended |= {pid for pid, _ in left}
        if not left:
            removed = remove_shared_memory(held, ended)
            if removed:
                print(f"hpcrl: removed the shared memory they left: {', '.join(removed)}", file=out, flush=True)
            return
        if sig == signal.SIGTERM:
            print(f"hpcrl: still running after SIGTERM, sent SIGKILL: {', '.join(f'pid {pid}' for pid, _ in left)}", file=out, flush=True)
    print(f"hpcrl: could not end {', '.join(f'pid {pid}' for pid, _ in left)} (uninterruptible?)", file=out, flush=True)


def stop_session(session: int, spare: Iterable[int] = (), timeout: float = LEFTOVER_GRACE_S) -> list[int]:
    """SIGSTOP every live process of `session` but `spare`, and whatever they start meanwhile, until a listing
    finds none new (each waited for until it has stopped, within `timeout` s in all); the pids stopped.

    Whoever SIGKILLs a session lists the shared memory its processes hold first (`shared_memory_of`), to remove
    it once they are gone. A process still running between that listing and the kill, a game engine in its
    start, makes files nobody removes: a benchmark killed while its games started left their 10.6 MB screen
    buffers in /dev/shm. A stopped process makes nothing more, and SIGKILL ends it all the same."""
    spare = set(spare)
    return stop_all_found(lambda: [pid for pid, _ in in_session(session) if pid not in spare], timeout)


def stop_all_found(find: Callable[[], Iterable[int]], timeout: float = LEFTOVER_GRACE_S) -> list[int]:
    """SIGSTOP every process `find` lists, and list again until it finds none not yet stopped (each waited for
    until it has stopped, within `timeout` s in all): whatever they start meanwhile is found and stopped too, and
    what they hold can then be listed with none of them making more. The pids stopped, in the order found."""
    stopped: dict[int, None] = {}
    deadline = time.monotonic() + timeout
    while new := [pid for pid in dict.fromkeys(find()) if pid not in stopped]:
        stop(new, max(deadline - time.monotonic(), 0.0))
        stopped.update(dict.fromkeys(new))
    return list(stopped)


def kill_holding(pids: Sequence[int], stop_wait: float = LEFTOVER_GRACE_S, since: float | None = None) -> list[str]:
    """SIGKILL these processes and remove the shared memory only they held, once they are gone (within
    KILLED_GONE_S), and, given when what they belong to started (`since`), the ViZDoom files made since then
    that nobody holds (`remove_unheld`: what one of them killed earlier from outside held alone); the paths
    removed. They are stopped first (`stop`, waiting up to `stop_wait` s), so that what they hold is listed
    when none of them can make more."""
    stop(pids, stop_wait)
    held = shared_memory_of(pids)
    trackers = [pid for pid in pids if _is_resource_tracker(pid)]
    for pid in pids:
        if pid not in trackers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    _let_trackers_clean_up(trackers)
    removed = remove_shared_memory(held, pids)
    return removed if since is None else sorted({*removed, *remove_unheld(since)})


RESOURCE_TRACKER = b"multiprocessing.resource_tracker"
"""In the command line of multiprocessing's resource tracker, the process a spawn or forkserver start makes to
unlink its clients' named semaphores (/dev/shm/sem.mp-*) once they are all gone."""


def _is_resource_tracker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return RESOURCE_TRACKER in f.read()
    except OSError:
        return False


def _let_trackers_clean_up(trackers: Sequence[int], timeout: float = LEFTOVER_GRACE_S) -> None:
    """Let multiprocessing's resource trackers (stopped, spared by the kill) end by themselves, then SIGKILL what is
    left. Their clients killed, a tracker reads the end of its pipe and unlinks the semaphores they registered.
    Killed with them, it left those in /dev/shm (3 a killed Sample Factory measurement), and no listing could find
    them: glibc's sem_open maps a temporary file, links it under the name and unlinks it, so /proc shows a deleted one."""
    for pid in trackers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    wait_gone(trackers, timeout)
    for pid in trackers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def wait_gone(pids: Sequence[int], timeout: float) -> None:
    """Wait, up to `timeout` s, until none of these processes is live (gone, or a zombie that holds nothing)."""
    deadline = time.monotonic() + timeout
    while [pid for pid in pids if (stat := process_stat(pid)) is not None and stat.live] and time.monotonic() < deadline:
        time.sleep(0.01)


def stop(pids: Sequence[int], timeout: float = LEFTOVER_GRACE_S) -> None:
    """SIGSTOP these processes and wait, up to `timeout` s, until each has stopped or is gone: a stop is
    delivered when the process next runs, and until then it may still fork or create a file."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while [pid for pid in pids if (stat := process_stat(pid)) is not None and stat.state not in "TtZX"] and time.monotonic() < deadline:
        time.sleep(0.001)


def in_session(session: int) -> list[tuple[int, str]]:
    """The live (not zombie) processes of `session`, with their command lines, read from /proc
    (none without /proc: then the scheduler ends the rest)."""
    return _commands(pid for pid in processes() if (stat := process_stat(pid)) is not None and stat.session == session and stat.live)


def marked(entry: bytes) -> list[tuple[int, str]]:
    """The live processes whose environment, as they were started with it, holds `entry` (`NAME=value`), with their
    command lines; those of other users, whose environment cannot be read, are not listed."""

    def has(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                return entry in f.read().split(b"\0")
        except OSError:
            return False

    return _commands(pid for pid in processes() if has(pid) and (stat := process_stat(pid)) is not None and stat.live)


def _commands(pids: Iterable[int]) -> list[tuple[int, str]]:
    """(pid, command line, its first 200 characters) of these processes, less those gone while we looked."""
    found: list[tuple[int, str]] = []
    for pid in pids:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone while we looked
            continue
        found.append((pid, command[:200]))
    return found


class ProcessStat(NamedTuple):
    """The fields of /proc/<pid>/stat that tell whose a process is."""

    state: str
    parent: int
    group: int
    session: int

    @property
    def live(self) -> bool:
        """Running or able to (a zombie holds nothing and waits to be reaped)."""
        return self.state not in ("Z", "X")


def process_stat(pid: int) -> ProcessStat | None:
    """A process's state, parent, group and session, from /proc; None once it is gone (or without /proc).
    The command name in parentheses may hold anything, spaces and parentheses too: the fields after its
    last ')' are read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state, parent, group, session = f.read().rpartition(")")[2].split()[:4]
        return ProcessStat(state, int(parent), int(group), int(session))
    except (OSError, ValueError):
        return None


def processes() -> list[int]:
    """Every process's pid in /proc (none without it)."""
    try:
        return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except FileNotFoundError:
        return []


def shared_memory_of(pids: Iterable[int]) -> set[str]:
    """The files of /dev/shm that these processes map or hold open (from /proc; none without it)."""
    found: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/maps") as f:
                maps = f.read()
            if SHARED_MEMORY in maps:  # most processes map none: no line to split
                found.update(parts[5] for line in maps.splitlines() if len(parts := line.split(maxsplit=5)) == 6 and parts[5].startswith(SHARED_MEMORY))
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if (target := os.readlink(f"/proc/{pid}/fd/{fd}")).startswith(SHARED_MEMORY):
                        found.add(target)
    return {path for path in found if not path.endswith(" (deleted)")}


HELD_FOR_LIFE = ("ViZDoom",)
"""Names in /dev/shm whose makers hold each file from its creation to its removal, so that one no process holds is
lost: ViZDoom's games' (`ViZDoomMQCtr<id>` and `ViZDoomMQDoom<id>`, the message queues its controller makes;
`ViZDoomSM<id>`, the screen buffer its engine makes; each opened by the other side too). Not multiprocessing's
semaphores (glibc's sem_open maps them under another name), nor a SharedMemory, which its owner may close and open
again by name, nor torch's files."""


def remove_unheld(since: float, prefixes: Sequence[str] = HELD_FOR_LIFE) -> list[str]:
    """Remove the files of /dev/shm named with one of `prefixes` (those of HELD_FOR_LIFE), this user's, made at
    `since` (a `time.time()`) or later, that no live process maps or holds open; the paths removed, sorted.

    The one case the kills here cannot list: a process killed from outside (the OOM killer, a segfault, a user's
    kill, the death signal of a trainer killed) that alone held what it made. A ViZDoom env worker killed between
    making its game's message queues and starting the engine that opens them left both in /dev/shm for ever. A
    second early: the file system's clock is the coarser. Without /proc no holder can be seen, and nothing is removed."""
    if not processes():
        return []
    uid = os.getuid()
    candidates = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(SHARED_MEMORY):
            with contextlib.suppress(OSError):
                if entry.name.startswith(tuple(prefixes)) and (stat := entry.stat(follow_symlinks=False)).st_uid == uid and stat.st_ctime >= since - 1.0:
                    candidates.append(entry.path)
    if not candidates:
        return []
    return remove_shared_memory(set(candidates), [])


def remove_shared_memory(held: set[str], killed: Iterable[int], timeout: float = KILLED_GONE_S) -> list[str]:
    """Remove those of `held` (what `shared_memory_of` found in the processes `killed`) that no live
    process holds once `killed` have exited (waited for up to `timeout` s): theirs alone. One that
    another process still maps or holds open stays (one of another user's, whose /proc this user may
    not read, is not seen; removing the name leaves a mapping it holds intact). The paths removed, sorted."""
    if not held:
        return []
    wait_gone(list(killed), timeout)
    removed = []
    for path in sorted(held - shared_memory_of(processes())):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed.append(path)
    return removed

