"""How many cores this process may use: its CPU affinity, which a batch system's cgroup or cpuset, `taskset`
or `srun --cpu-bind` sets, not the node's count (`os.cpu_count()`): on a 64-core node a job given 4 cores that
sized itself by the node would run 16 times too many threads or tasks. The one rule for it: the local
executor's pool, the trainers' thread counts and env worker groups, and collect's processes all use it.
"""

from __future__ import annotations

import os


def allowed_cores() -> list[int]:
    """Which cores this process may run on, by number; none where the system does not say (not Linux)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def usable_cores() -> int:
    """How many cores this process may run on (at least 1): `allowed_cores`, or the machine's where it has none."""
    return len(allowed_cores()) or os.cpu_count() or 1
