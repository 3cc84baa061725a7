"""CPU time used by a process and every process under it, read from /proc (Linux).

On a loaded machine a measurement's rate depends on how many processes it runs against everybody
else's; the CPU time it used per unit of work hardly does. Benchmarks report it beside their rates,
and `cpu_by_part` splits it into the parts of a system (its learner, its env workers, the game
engines under them): where a side's time goes, comparable between sides.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
"""/proc's clock ticks a second."""
ENGINE = "engines"
"""The part of every process named `vizdoom`: ViZDoom's game engines, whoever started them."""


def _stat(path: str) -> tuple[str, int, float] | None:
    """(name, parent pid, CPU seconds) from a /proc stat file; None for a process or thread gone meanwhile."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return text[text.index("(") + 1 : text.rindex(")")], int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


def _processes() -> dict[int, tuple[str, int, float]]:
    found = {int(n): _stat(f"/proc/{n}/stat") for n in os.listdir("/proc") if n.isdigit()}
    return {pid: stat for pid, stat in found.items() if stat is not None}


def _descendants(pid: int, processes: Mapping[int, tuple[str, int, float]]) -> set[int]:
    tree, grown = {pid}, True
    while grown:
        below = {p for p, (_, parent, _) in processes.items() if parent in tree} - tree
        tree |= below
        grown = bool(below)
    return tree - {pid}


def tree_cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds used so far by (`pid`, `pid` and all its descendants still running)."""
    processes = _processes()
    own = processes.get(pid, ("", 0, 0.0))[2]
    return own, own + sum(processes[p][2] for p in _descendants(pid, processes))


def cpu_by_part(pid: int, threads: Mapping[int, str] = {}, processes: Mapping[int, str] = {}, rest: str = "env workers") -> dict[str, float]:  # noqa: B006 - read only
    """CPU seconds used so far by `pid` and its descendants, by part: `threads` names threads of `pid` by
    native id (the rest of `pid`, exited threads included, is `main`); `processes` names descendants by pid,
    and a process under a named one is counted with it; ViZDoom's engines are ENGINE wherever they run;
    any other descendant is `rest`. The parts add up to `tree_cpu_seconds(pid)[1]`."""
    table = _processes()
    parts: dict[str, float] = {}

    def add(part: str, seconds: float) -> None:
        parts[part] = parts.get(part, 0.0) + seconds

    own = table.get(pid, ("", 0, 0.0))[2]
    for tid, part in threads.items():
        stat = _stat(f"/proc/{pid}/task/{tid}/stat")
        if stat is not None:
            add(part, stat[2])
            own -= stat[2]
    add("main", own)
    for descendant in _descendants(pid, table):
        name, _, seconds = table[descendant]
        add(ENGINE if name == "vizdoom" else _named_ancestor(descendant, pid, table, processes) or rest, seconds)
    return parts


def _named_ancestor(p: int, top: int, table: Mapping[int, tuple[str, int, float]], names: Mapping[int, str]) -> str | None:
    """The name of `p` or of its nearest ancestor below `top` that `names` names; None if none is."""
    while p != top and p in table:
        if p in names:
            return names[p]
        p = table[p][1]
    return None
