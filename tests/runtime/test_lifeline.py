"""hpcrl.runtime.lifeline: a child asks the kernel for a death signal, and a child whose parent died
before it could ask ends at once; a parent that is PID 1 of its namespace is not taken for a dead one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}

ORPHAN = """
import os, sys, time
from hpcrl.runtime.lifeline import die_with_parent
parent = os.getpid()
if os.fork():
    os._exit(0)  # the parent dies before its child asks for a death signal
deadline = time.monotonic() + 10
while os.getppid() == parent and time.monotonic() < deadline:
    time.sleep(0.01)
os.write(1, b"orphaned\\n")
die_with_parent(parent=parent)
os.write(1, b"lived on\\n")
"""

PID_ONE = """
import os, subprocess, sys
from hpcrl.runtime.lifeline import die_with_parent, dies_with_me
assert os.getpid() == 1
rank = subprocess.run([sys.executable, "-c", "print('rank ran')"], preexec_fn=dies_with_me(), capture_output=True, text=True)
worker = subprocess.run([sys.executable, "-c", "from hpcrl.runtime.lifeline import die_with_parent; die_with_parent(); print('worker ran')"], capture_output=True, text=True)
print(rank.returncode, rank.stdout.strip(), worker.returncode, worker.stdout.strip())
"""


def test_a_child_whose_parent_died_before_it_asked_for_its_death_signal_ends_at_once() -> None:
    """Whoever adopts the orphan (init, or a subreaper such as hpcrl's keeper)."""
    done = subprocess.run([sys.executable, "-c", ORPHAN], env=ENV, capture_output=True, text=True, timeout=30)
    assert done.stdout == "orphaned\n", done.stdout + done.stderr  # not "lived on"


@pytest.mark.skipif(shutil.which("unshare") is None, reason="no unshare(1)")
def test_children_of_a_parent_that_is_pid_1_of_its_namespace_live() -> None:
    """A launcher or trainer that is PID 1 (a container started without an init): its ranks and env
    workers used to take their parent's pid 1 for a dead parent's and exit at once, code 1."""
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", PID_ONE], env=ENV, capture_output=True, text=True, timeout=60)
    if done.returncode != 0 and "Operation not permitted" in done.stderr:
        pytest.skip(f"no PID namespace here: {done.stderr.strip()}")
    assert done.stdout.split() == ["0", "rank", "ran", "0", "worker", "ran"], done.stdout + done.stderr
