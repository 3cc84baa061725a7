"""The local executor's pool counts the cores the runner may use (its affinity: the allotment of an
allocation, a `taskset`), not the node's: inside a 1-core allotment of a bigger machine it runs one
1-core task at a time, where `os.cpu_count()` would have started one per core of the node."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs two usable cores to pin to one")
def test_the_pool_of_a_runner_pinned_to_one_core_is_one_task() -> None:
    script = (
        "import os; from pathlib import Path; from hpcrl.schedulers.local import LocalScheduler\n"
        "os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})\n"
        "print(LocalScheduler(Path('.')).task_slots(None, 1), os.cpu_count())\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=60, check=True)
    slots, node = map(int, proc.stdout.split())
    assert slots == 1 and node >= 2, proc.stdout
