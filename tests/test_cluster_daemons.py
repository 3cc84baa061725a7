"""What the test clusters' scripts count as a running daemon (tests/clusters/daemons.sh, sourced by slurm.sh and
sge.sh). A daemon killed with its node stays a zombie until init reaps it, ~2 s on these VMs: counted as running,
a revive right after a kill started no daemon and waited 120 s for a host that never came back (a CI run of 2026-12-06)."""

from __future__ import annotations

import fcntl
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CLUSTERS = Path(__file__).resolve().parent / "clusters"
DAEMONS_SH = CLUSTERS / "daemons.sh"


def shell(script: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """`script` run by bash with daemons.sh sourced, as slurm.sh and sge.sh run their commands."""
    prelude = f'set -euo pipefail; log() {{ printf "%s\\n" "$*"; }}; source "{DAEMONS_SH}"; '
    return subprocess.run(["bash", "-c", prelude + script, "bash", *args], capture_output=True, text=True, timeout=timeout)


def running(pidfile: Path, comm: str) -> bool:
    return shell('running "$1" "$2"', str(pidfile), comm).returncode == 0


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[tuple[subprocess.Popen, Path]]:
    """A `sleep` standing in for a daemon, its pid file written. The test is its parent and reaps it only at the
    end, so a killed one stays a zombie for as long as the test looks at it."""
    proc = subprocess.Popen(["sleep", "60"])
    pidfile = tmp_path / "daemon.pid"
    pidfile.write_text(f"{proc.pid}\n")
    yield proc, pidfile
    proc.kill()
    proc.wait()


def test_a_daemon_runs_until_killed_and_its_unreaped_zombie_does_not(sleeper: tuple[subprocess.Popen, Path]) -> None:
    proc, pidfile = sleeper
    assert running(pidfile, "sleep")
    assert not running(pidfile, "sge_execd"), "a pid reused by another command counted as the daemon"
    proc.kill()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
        assert time.monotonic() < deadline, "the killed sleep never became a zombie"
        time.sleep(0.01)
    assert not running(pidfile, "sleep"), "a killed daemon not yet reaped counted as running"


def test_a_missing_empty_or_garbled_pid_file_is_no_daemon(tmp_path: Path) -> None:
    pidfile = tmp_path / "daemon.pid"
    assert not running(pidfile, "sleep")
    for text in ("", "\n", "abc\n", "999999999\n"):
        pidfile.write_text(text)
        assert not running(pidfile, "sleep"), repr(text)


def test_a_live_daemon_whose_name_reads_like_a_zombie_s_stat_is_running(tmp_path: Path) -> None:
    """/proc/PID/stat puts the command name in parentheses, and a name may hold ') Z ': the state is read after
    the last ')'."""
    name = "d) Z (x"
    code = f"open('/proc/self/comm', 'w').write({name!r}); import sys, time; print('ready', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        pidfile = tmp_path / "daemon.pid"
        pidfile.write_text(str(proc.pid))
        assert running(pidfile, name)
    finally:
        proc.kill()
        proc.wait()


def test_stopping_a_daemon_returns_once_it_has_exited_not_once_it_is_reaped(sleeper: tuple[subprocess.Popen, Path]) -> None:
    """sge.sh stops several execds and Slurm's daemons one after another: a stop that waited for init to reap each
    one (or, with a parent that never reaps, 15 s and a SIGKILL to a corpse) slowed every start and stop."""
    proc, pidfile = sleeper
    started = time.monotonic()
    out = shell('stop_pidfile "$1" sleep', str(pidfile))
    took = time.monotonic() - started
    assert out.returncode == 0, out.stderr
    assert re.fullmatch(rf"stopping sleep \(pid {proc.pid}\)\n", out.stdout), out.stdout
    assert took < 5, f"stop took {took:.1f} s"
    assert not pidfile.exists(), "a stopped daemon's pid file was left for a later start to read"
    assert shell('stop_pidfile "$1" sleep', str(pidfile)).returncode == 0, "stopping a stopped daemon failed"


def test_both_clusters_take_the_one_rule_and_keep_no_copy_of_their_own() -> None:
    for script in ("slurm.sh", "sge.sh"):
        text = (CLUSTERS / script).read_text()
        assert 'source "$(dirname "${BASH_SOURCE[0]}")/daemons.sh"' in text, script
        for helper in ("pid_alive", "pid_of", "running", "wait_for", "stop_pidfile"):
            assert not re.search(rf"^{helper}\(\)", text, re.M), f"{script} defines its own {helper}"


def test_commands_that_start_or_stop_daemons_take_turns_and_the_rest_do_not_wait(tmp_path: Path) -> None:
    """Two `start`s (the suite's session start beside a test's `revive-host`) each started one node's daemon, and the
    second could not bind its port: they run one after the other. `status` waits for no one."""
    script = tmp_path / "cluster.sh"
    script.write_text(
        f'set -euo pipefail\nlog() {{ :; }}\nsource "{DAEMONS_SH}"\n'
        f'take_turns "{tmp_path}/cluster.lock" TEST_CLUSTER_LOCKED "$@"\n'
        f'echo "in $1 $(date +%s.%N)" >>"{tmp_path}/trace"; sleep 0.5; echo "out $1 $(date +%s.%N)" >>"{tmp_path}/trace"\n'
    )
    procs = [subprocess.Popen(["bash", str(script), command]) for command in ("start", "revive-host", "stop")]
    assert [p.wait(timeout=30) for p in procs] == [0, 0, 0]
    trace = [line.split() for line in (tmp_path / "trace").read_text().splitlines()]
    assert [what for what, _, _ in trace] == ["in", "out"] * 3, "two of them ran at once"
    with open(tmp_path / "cluster.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        started = time.monotonic()
        assert subprocess.run(["bash", str(script), "status"], timeout=30).returncode == 0
        assert time.monotonic() - started < 5, "status waited for the lock"


def test_a_daemon_that_ignores_sigterm_is_killed_after_the_patience_it_was_given(tmp_path: Path) -> None:
    """sge.sh gives sge_qmaster a minute (it began its shutdown 15 s after SIGTERM once, and 15 s of patience killed it
    as it wrote its spool); what still runs after that is killed, and named."""
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        pidfile = tmp_path / "daemon.pid"
        pidfile.write_text(str(proc.pid))
        comm = Path(f"/proc/{proc.pid}/comm").read_text().strip()
        started = time.monotonic()
        out = shell('stop_pidfile "$1" "$2" "$3"', str(pidfile), comm, "2")
        took = time.monotonic() - started
        assert out.returncode == 0, out.stderr
        assert f"{comm} (pid {proc.pid}) ignored SIGTERM for 2 s; sending SIGKILL" in out.stdout, out.stdout
        assert 1.8 < took < 10, f"stop took {took:.1f} s with 2 s of patience"
        assert proc.wait(timeout=10) == -9 and not pidfile.exists()
    finally:
        proc.kill()
        proc.wait()
