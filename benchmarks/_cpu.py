"""CPU time used by a process and every process under it, read from /proc (Linux).

On a loaded machine a measurement's rate depends on how many processes it runs against everybody
else's; the CPU time it used per unit of work hardly does. Benchmarks report it beside their rates.
"""

from __future__ import annotations

import os
from pathlib import Path


def tree_cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds used so far by (`pid`, `pid` and all its descendants still running)."""
    tick, parents, used = os.sysconf("SC_CLK_TCK"), {}, {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                text = Path(f"/proc/{name}/stat").read_text()
            except OSError:  # gone meanwhile
                continue
            fields = text[text.rindex(")") + 2 :].split()
            parents[int(name)], used[int(name)] = int(fields[1]), (int(fields[11]) + int(fields[12])) / tick
    tree, grown = {pid}, True
    while grown:
        below = {p for p, parent in parents.items() if parent in tree} - tree
        tree |= below
        grown = bool(below)
    return used.get(pid, 0.0), sum(used.get(p, 0.0) for p in tree)
