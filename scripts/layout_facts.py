"""The layout's facts, for a note or a review: rooms, import levels, arrows back up, cycles.

    .venv/bin/python scripts/layout_facts.py            # this checkout
    .venv/bin/python scripts/layout_facts.py /work/main  # another checkout (its hpcrl/ folder)

The import graph is the one tests/test_imports.py checks (imports inside functions included); a
room is a folder under hpcrl/ or a top-level module. "Levels" is the number of modules on the
longest import chain. Arrows back up are counted against tests/test_imports.py's ROOMS, so they
mean something only for a checkout with that layout.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from test_imports import back_arrows, imports_of, module_names, room_of  # noqa: E402


def levels(graph: dict[str, set[str]]) -> tuple[int, list[str]]:
    """The longest import chain (the graph has no cycle: test_imports checks it)."""
    best: dict[str, list[str]] = {}

    def chain(node: str) -> list[str]:
        if node not in best:
            best[node] = [node]
            best[node] = [node, *max((chain(n) for n in graph.get(node, ())), key=len, default=[])]
        return best[node]

    longest = max((chain(m) for m in graph), key=len)
    return len(longest), longest


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's components of more than one node: each is a cycle (or several)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                top = stack.pop()
                component.add(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def main(argv: list[str]) -> int:
    package = (Path(argv[0]).resolve() if argv else REPO) / "hpcrl"
    modules = [m for m in module_names(package) if m != "hpcrl"]
    graph = {m: {i for i in imports_of(m, package) if i != "hpcrl"} for m in modules}
    rooms = Counter(room_of(m) for m in modules)
    folders = {room: n for room, n in rooms.items() if (package.parent / Path(*room.split("."))).is_dir()}
    rooms_graph = {room: {room_of(i) for m in modules if room_of(m) == room for i in graph[m]} - {room} for room in rooms}
    depth, longest = levels(graph)
    arrows = sorted(back_arrows(graph))
    print(f"modules: {len(modules)}; top-level modules: {len(rooms) - len(folders)}; folders: {len(folders)}")
    print("rooms: " + ", ".join(f"{room.removeprefix('hpcrl.')}/ ({n})" for room, n in sorted(folders.items())))
    print(f"import levels: {depth} (longest chain: {' -> '.join(m.removeprefix('hpcrl.') for m in longest)})")
    print(f"arrows back up (tests/test_imports.py ROOMS): {len(arrows)}")
    for src, dst in arrows:
        print(f"  {src.removeprefix('hpcrl.')} -> {dst.removeprefix('hpcrl.')}")
    print(f"module cycles: {len(strongly_connected(graph))}")
    room_cycles = strongly_connected(rooms_graph)
    print(f"room cycles: {len(room_cycles)}" + "".join(f"\n  {{{', '.join(sorted(r.removeprefix('hpcrl.') for r in c))}}}" for c in room_cycles))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
