"""The wrapper around a user's program inside its job (`hpcrl train ... -- PROGRAM`), driven by hand
the way a job script drives it: the signal it forwards, the exit codes it turns into markers, and
what a scheduler's kill leaves for the next lifetime.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from factories import deep_update

from hpcrl.config.load import experiment_from_dict
from hpcrl.status import experiment_status
from hpcrl.store import rundir
from hpcrl.store.expdir import run_dir, write_experiment
from hpcrl.sweep.runs import expand

REPO = Path(__file__).resolve().parents[2]
ENV = {**{k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}, "PYTHONPATH": str(REPO)}

PROGRAM = r'''
import os, signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
mode = sys.argv[2]
out.write_text("")
def note(text):
    with out.open("a") as f:
        f.write(text + "\n")
note("argv " + " ".join(sys.argv[3:]) + " lifetime " + os.environ["HPCRL_LIFETIME"] + " seed " + os.environ["HPCRL_SEED"])
note("threads " + os.environ["OMP_NUM_THREADS"])
if mode == "stop":
    def stop(signum, frame):
        note("got " + signal.Signals(signum).name)
        sys.exit(int(os.environ["HPCRL_REQUEUE_EXIT"]))
    signal.signal(getattr(signal, "SIG" + os.environ["HPCRL_STOP_SIGNAL"]), stop)
elif mode == "linger":  # notes every stop signal, and takes half a second to stop: a second one would be seen
    stopping = []
    def linger(signum, frame):
        note("got " + signal.Signals(signum).name)
        stopping.append(time.monotonic())
    signal.signal(getattr(signal, "SIG" + os.environ["HPCRL_STOP_SIGNAL"]), linger)
    note("ready")
    while not stopping or time.monotonic() - stopping[0] < 0.5:
        time.sleep(0.01)
    sys.exit(int(os.environ["HPCRL_REQUEUE_EXIT"]))
elif mode == "ignore":
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif mode == "fail":
    print("loading the data set")
    raise ValueError("the data set is empty")
elif mode == "segv":
    os.kill(os.getpid(), signal.SIGSEGV)
elif mode == "done":
    sys.exit(0)
note("ready")
time.sleep(60)
'''


def experiment(tmp_path: Path, mode: str, **program) -> Path:
    (tmp_path / "prog.py").write_text(PROGRAM)
    data = {
        "name": "w", "algo": "program", "output": str(tmp_path / "logs"), "sweep": {"seeds": [3]}, "resources": {"cpus": 2},
        "program": deep_update({"command": [sys.executable, str(tmp_path / "prog.py"), str(tmp_path / "notes"), mode], "args": ["--at", "{run_id}"],
                                "resume_args": ["--resume", "{checkpoint_dir}"], "workdir": str(tmp_path)}, program),
    }  # fmt: skip
    exp = experiment_from_dict(data)
    write_experiment(exp, expand(exp), {})
    return exp.dir


def start(root: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hpcrl", "train", str(root), "--task", "0"], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group, as a job's


def wait_for(path: Path, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in (path.read_text() if path.exists() else ""):
        assert time.monotonic() < deadline, f"{text!r} never appeared in {path}"
        time.sleep(0.05)


def the_run(root: Path) -> Path:
    return next((root / "runs").iterdir())


@pytest.mark.e2e
@pytest.mark.parametrize("stop_signal", ["USR1", "TERM"])
def test_the_warning_reaches_the_program_as_its_stop_signal_and_asks_for_a_requeue(tmp_path: Path, stop_signal: str) -> None:
    root = experiment(tmp_path, "stop", stop_signal=stop_signal)
    proc = start(root)
    wait_for(tmp_path / "notes", "ready")
    proc.send_signal(signal.SIGUSR1)  # what the job shell passes on from the scheduler
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 99, out + err
    assert f"got SIG{stop_signal}" in (tmp_path / "notes").read_text()
    rd = the_run(root)
    assert rundir.run_state(rd) == "started" and not rundir.is_failed(rd)
    assert "asking for a requeue" in out


@pytest.mark.e2e
def test_a_program_killed_at_the_hard_limit_leaves_no_marker_and_resumes_next_time(tmp_path: Path) -> None:
    root = experiment(tmp_path, "ignore")
    proc = start(root)
    wait_for(tmp_path / "notes", "ready")
    proc.send_signal(signal.SIGUSR1)  # the warning, ignored
    time.sleep(0.5)
    assert proc.poll() is None
    os.killpg(proc.pid, signal.SIGKILL)  # the scheduler's kill at the hard limit: the whole job
    proc.communicate(timeout=30)
    rd = the_run(root)
    assert rundir.run_state(rd) == "started" and not rundir.is_done(rd) and not rundir.is_failed(rd)
    # The next lifetime (a re-sweep's retry) is told so and gets the resume arguments after the
    # job script's command line (here one that finishes at once).
    words = [sys.executable, str(tmp_path / "prog.py"), str(tmp_path / "notes"), "done", "--at", rd.name]
    proc = subprocess.run([sys.executable, "-m", "hpcrl", "train", str(root), "--task", "0", "--", *words], env=ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    notes = (tmp_path / "notes").read_text()
    assert f"--at {rd.name} --resume {rd / 'checkpoints'} lifetime 2 seed 3" in notes
    assert rundir.is_done(rd)


@pytest.mark.e2e
def test_a_failing_program_is_failed_with_its_last_line_and_the_tail_of_its_output(tmp_path: Path) -> None:
    root = experiment(tmp_path, "fail")
    proc = start(root)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    rd = the_run(root)
    failed = rundir.reason(rd, rundir.FAILED)
    assert rundir.first_line(rd, rundir.FAILED) == "program exited with 1: ValueError: the data set is empty"
    assert "loading the data set" in failed and "Traceback" in failed
    assert "loading the data set" in (rd / rundir.PROGRAM_LOG).read_text()  # the whole output, kept
    assert "loading the data set" in out  # and in the job log
    rows, _, _ = experiment_status(root)
    assert rows[0].train == "failed" and rows[0].note.startswith("train failed: program exited with 1: ValueError")


@pytest.mark.e2e
def test_a_program_killed_by_a_signal_nobody_sent_is_failed_with_the_signal(tmp_path: Path) -> None:
    root = experiment(tmp_path, "segv")
    proc = start(root)
    proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert rundir.first_line(the_run(root), rundir.FAILED).startswith("program killed by SIGSEGV")


def test_a_program_missing_inside_the_job_is_one_line(tmp_path: Path) -> None:
    root = experiment(tmp_path, "done", command=["no-such-trainer-xyz"])
    proc = start(root)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert rundir.first_line(the_run(root), rundir.FAILED).startswith("program: 'no-such-trainer-xyz' not found")


@pytest.mark.e2e
def test_words_after_dash_dash_are_the_command_that_runs(tmp_path: Path) -> None:
    """The job script's literal command line is what runs (the config renders it when there is none),
    and the log names it as a shell would read it: pasted into one, the same words run."""
    root = experiment(tmp_path, "done")
    words = [sys.executable, str(tmp_path / "prog.py"), str(tmp_path / "notes"), "done", "--from-the-script", "it's two words"]
    proc = subprocess.run([sys.executable, "-m", "hpcrl", "train", str(root), "--task", "0", "--", *words], env=ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    notes = (tmp_path / "notes").read_text()
    assert "argv --from-the-script it's two words lifetime 1" in notes
    logged = next(line for line in proc.stdout.splitlines() if ": running " in line).split(": running ", 1)[1]
    assert shlex.split(logged) == words
    assert "threads 2" in notes  # resources.cpus, not a thread per core of the node
    assert run_dir(root, the_run(root).name).joinpath(rundir.DONE).exists()


def test_a_command_after_dash_dash_for_hpcrls_own_trainer_is_refused(tmp_path: Path) -> None:
    from factories import TINY

    exp = experiment_from_dict(deep_update(TINY, {"output": str(tmp_path / "logs")}))
    write_experiment(exp, expand(exp), {})
    proc = subprocess.run([sys.executable, "-m", "hpcrl", "train", str(exp.dir), "--task", "0", "--", "python", "x.py"], env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "a command after -- is for algo 'program'" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "hpcrl", "status", str(exp.dir), "--", "x"], env=ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "is for `hpcrl train`" in proc.stderr
