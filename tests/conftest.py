"""Session fixtures that bring up the real Slurm and Grid Engine the integration tests run against.

CI runs the test command as root on Debian: there `tests/clusters/<name>.sh start` installs the
scheduler when it is missing and starts its daemons (a no-op when they already run), so the tests
marked `slurm` / `sge` run for real instead of skipping. Anywhere else (no root, not Debian) those
tests skip with a one-line reason and the rest of the suite runs. A start that fails where it
should work is an error, not a skip: CI must not pass by skipping its integration tests.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CLUSTERS = REPO / "tests" / "clusters"

# The tests mirror hpcrl/'s rooms (tests/config/, tests/rl/, ..., tests/e2e/) and share helpers by bare name,
# across rooms too (`from test_conformance import Local`, `from factories import write_config`): tests/ is on
# sys.path through this file (pytest's prepend import mode), and so is every room.
sys.path.extend(str(room) for room in sorted(Path(__file__).parent.iterdir()) if room.is_dir() and any(room.glob("test_*.py")))

_started: list[str] = []
"""One line per cluster brought up in this session, printed in pytest's summary."""


def _why_not_here() -> str | None:
    if os.geteuid() != 0:
        return "needs root to start the test cluster"
    if not Path("/etc/debian_version").exists():
        return "needs Debian (tests/clusters/*.sh install Debian's packages)"
    return None


def _start(name: str, *args: str) -> None:
    """Run `tests/clusters/<name>.sh start ARGS` and record how long the daemons took to answer."""
    reason = _why_not_here()
    if reason:
        pytest.skip(f"{name}: {reason}")
    began = time.monotonic()
    # pytest-xdist workers each run this session fixture: the script's own lock lets one install and start the
    # daemons (its apt-get under another lock), and the others then find them running.
    proc = subprocess.run(["bash", str(CLUSTERS / f"{name}.sh"), "start", *args], capture_output=True, text=True, timeout=900)
    took = time.monotonic() - began
    if proc.returncode != 0:
        pytest.fail(f"tests/clusters/{name}.sh start exited {proc.returncode}:\n{proc.stdout}{proc.stderr}", pytrace=False)
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    _started.append(f"{name}: `{name}.sh start` took {took:.1f} s ({last.strip()})")


def _source_env() -> None:
    """Import what tests/clusters/env.sh exports (SGE_ROOT, SGE_CELL) into this process and its children."""
    script = f'source {CLUSTERS / "env.sh"} && env -0'
    proc = subprocess.run(["bash", "-c", script], capture_output=True, check=True)
    for item in proc.stdout.split(b"\0"):
        key, sep, value = item.decode().partition("=")
        if sep and key.startswith("SGE_"):
            os.environ[key] = value


NODES = dict(line.strip().split("=", 1) for line in (CLUSTERS / "suite.env").read_text().splitlines() if line.strip() and not line.startswith("#"))
"""The namespace nodes each cluster runs with (tests/clusters/suite.env, which scripts/test reads too)."""


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    _start("slurm", "--nodes", NODES["SLURM_NODES"])


@pytest.fixture(scope="session")
def sge_cluster() -> None:
    _start("sge", "--hosts", NODES["SGE_HOSTS"])
    _source_env()


def pytest_terminal_summary(terminalreporter) -> None:
    for line in _started:
        terminalreporter.write_line(f"cluster {line}")


# ---------------------------------------------------------------------------------------------- redis
# The distributed tests (marked `redis`) run against a real redis-server on loopback, started the way a
# learner job starts it (free port, random password on stdin). As root on Debian the package is
# installed when missing (tests/clusters/redis.sh); elsewhere without it those tests skip.


def _installed(binary: str, script: str) -> str:
    """The path of `binary`, installed first by tests/clusters/<script>.sh where the suite may install
    packages (root on Debian); elsewhere a test that needs a missing one skips with the reason."""
    import shutil

    if shutil.which(binary) is None:
        reason = _why_not_here()
        if reason:
            pytest.skip(f"{binary} is not installed and the test {reason}")
        _start(script)
    path = shutil.which(binary)
    assert path, f"tests/clusters/{script}.sh start succeeded but no `{binary}` is on PATH"
    return path


@pytest.fixture(scope="session")
def redis_installed() -> None:
    """redis-server on PATH: every `redis` test needs it, also those whose learner starts its own."""
    _installed("redis-server", "redis")


@pytest.fixture(scope="session")
def redis_server(redis_installed):
    from hpcrl.distributed.redis_server import RedisServer

    server = RedisServer("127.0.0.1").start()
    _started.append(f"redis: redis-server pid {server.proc.pid if server.proc else '?'} on 127.0.0.1:{server.port}")
    yield server
    server.stop()


@pytest.fixture
def redis_client(redis_server):
    """A client of the session's server with an empty database (each test starts clean)."""
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def board(redis_client, request):
    """A RUNNING run board under the test module's PREFIX (the queue tests' shared setup)."""
    from hpcrl.distributed.board import RUNNING, Board

    b = Board(redis_client, request.module.PREFIX)
    b.set_status(RUNNING)
    return b


# ------------------------------------------------------------------------------------------- chromium
# tests/results/test_report.py looks at report.html in a real browser: headless Chromium, Debian's package. As root on
# Debian it is installed when missing (tests/clusters/chromium.sh); elsewhere without it that test skips.


@pytest.fixture(scope="session")
def chromium() -> str:
    """The path of the `chromium` binary, installed first where the suite may install packages."""
    return _installed("chromium", "chromium")


@pytest.fixture(autouse=True)
def _denormals_back_after_each_test():
    """A test that trains in this process leaves torch's set_flush_denormal(True) (hpcrl's
    setup_torch: FTZ/DAZ on x86) behind for every later test of its xdist worker, whose CPU then
    compares 5e-324 as 0: the config bounds' probes next to 0 failed by test order alone."""
    yield
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_flush_denormal(False)


_WARNINGS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)


@pytest.fixture(autouse=True)
def _signal_handlers_back_after_each_test():
    """A test that runs a job entry point in this process (`cli.main(["train", ...])`) leaves the
    warnings ignored (guard.ignore_warnings, meant for a job's own process): every process a later
    test of its xdist worker starts would inherit SIG_IGN, and a job shell cannot trap a signal
    ignored at its start, so a local task's warning was lost (seen as a requeue test that failed by
    test order alone)."""
    saved = {sig: signal.getsignal(sig) for sig in _WARNINGS}
    yield
    for sig, handler in saved.items():
        if handler is not None:
            signal.signal(sig, handler)


# ---------------------------------------------------------------------------------------------- tiers
# Every test is a unit test unless a marker says otherwise (pyproject's `markers`): `slow` computes for tens of
# seconds (learning runs, reference cross-checks), `e2e` runs processes as a user would (sweeps, jobs, programs,
# rank or env-worker groups, a browser), `slurm`/`sge`/`redis` need those daemons. `--fast` (`scripts/test
# --fast`) runs the unit tier only and holds it to being one: an unmarked test that uses more than
# --unit-seconds of CPU fails there, so a slow test cannot slip into the edit-test loop unmarked.

TIERS = ("multinode", "slow", "e2e", "slurm", "sge", "redis")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hpcrl tiers")
    group.addoption("--fast", action="store_true", help=f"the unit tier: deselect the tests marked {'/'.join(TIERS)}")
    group.addoption("--unit-seconds", type=float, default=5.0, help="with --fast, fail an unmarked test whose setup and call use more CPU seconds, or 10x that in wall time (default 5)")


def _tier(item: pytest.Item) -> str | None:
    return next((name for name in TIERS if item.get_closest_marker(name)), None)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`redis` tests get the server installed; --fast keeps the unit tier; otherwise the marked tests go
    first. The suite's wall time under xdist is bounded below by its longest test, and scripts/test has
    xdist deal the tests out one at a time in this order (--maxschedchunk 1): a long learning run that
    started last would finish alone, minutes after the others."""
    for item in items:
        if item.get_closest_marker("redis") and "redis_installed" not in item.fixturenames:
            item.fixturenames.insert(0, "redis_installed")  # type: ignore[attr-defined]
    if config.getoption("fast"):
        deselected = [item for item in items if _tier(item)]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if not _tier(item)]
        return
    rank = {"multinode": 0, "slow": 0, None: 2}
    first = {name: i for i, name in enumerate(LONGEST)}
    items.sort(key=lambda item: (rank.get(_tier(item), 1), first.get(item.nodeid.split("[")[0], len(first))))


LONGEST = (
    "tests/rl/test_alphazero.py::test_tic_tac_toe_learns_to_never_lose_against_perfect_play",
    "tests/sweep/test_study.py::test_bundled_study_prunes_and_finds_a_policy_that_solves_cartpole",
    "tests/test_benchmarks.py::test_a_benchmark_runs_at_a_tiny_size",
    "tests/rl/test_vizdoom.py::test_ppo_learns_basic_with_the_bundled_config",
    "tests/results/test_comparisons.py::test_aggregates_match_rliable_on_the_same_score_matrix",
    "tests/distributed/test_distributed_selfplay.py::test_decoupled_run_survives_a_killed_self_play_job_and_a_requeued_trainer",
)
"""The longest tests of the rest (`--durations` of the full suite, 2026-11-27: 350-100 s each under its load), dealt
out before the other tests of their tier: one of them started last finished alone, with the other workers idle."""


SCHEDULER_QUERIES = ("sinfo", "squeue", "sacct", "scontrol", "qstat", "qconf", "qacct")
"""The machine's scheduler tools a sweep or status asks (never sbatch/qsub, which `--scheduler auto` looks
for on PATH). Where Slurm is installed and its controller is down, each takes 9 s to fail."""


@pytest.fixture(scope="session")
def _scheduler_query_stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of SCHEDULER_QUERIES stand-ins that fail at once, as on a machine without a cluster."""
    stubs = tmp_path_factory.mktemp("scheduler-query-stubs")
    for tool in SCHEDULER_QUERIES:
        (stubs / tool).write_text(f"#!/bin/sh\necho '{tool}: not asked in the unit tier (tests/conftest.py)' >&2\nexit 1\n")
        (stubs / tool).chmod(0o755)
    return stubs


@pytest.fixture(autouse=True)
def _no_scheduler_queries_in_the_unit_tier(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit test never asks the machine's scheduler (sinfo, qstat, ...): its answer, or the 9 s it takes to
    fail where a controller is down, made the unit tier depend on the machine (217 s against 65 s). Its PATH
    starts with stand-ins that fail at once; a test that needs answers brings its own stand-ins first."""
    if not _tier(request.node):
        monkeypatch.setenv("PATH", f"{request.getfixturevalue('_scheduler_query_stubs')}{os.pathsep}{os.environ['PATH']}")


_START = pytest.StashKey[tuple[float, float]]()


def _cpu_seconds() -> float:
    """CPU time of this process and of the children it has waited for (the `hpcrl` subprocesses a test runs)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_START] = (time.monotonic(), _cpu_seconds())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Under --fast, an unmarked test that used more than --unit-seconds of CPU (setup and call), or ten
    times that in wall time, fails. CPU rather than wall time: on a machine shared with other work the
    wall time says more about the neighbours than about the test; the wall cap catches a test that sleeps."""
    report = (yield).get_result()
    limit = item.config.getoption("unit_seconds") if item.config.getoption("fast") else 0.0
    if not limit or report.when != "call" or not report.passed or _tier(item) or _START not in item.stash:
        return
    began, cpu_began = item.stash[_START]
    wall, cpu = time.monotonic() - began, _cpu_seconds() - cpu_began
    if cpu > limit or wall > 10 * limit:
        report.outcome = "failed"
        report.longrepr = (
            f"a unit test took {cpu:.1f} CPU seconds and {wall:.1f} s (--unit-seconds {limit:g}: CPU, and 10x in wall time): "
            f"make it faster, or mark it {' or '.join(TIERS[:2])} (pyproject's markers)"
        )
