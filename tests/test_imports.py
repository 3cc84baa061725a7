"""Every module of hpcrl imports on its own, and the import graph (imports inside functions
included) has no cycle: a cycle hidden by a function-level import is still a cycle (issue 12)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "hpcrl"


def module_names(package: Path = PACKAGE) -> list[str]:
    names = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def imports_of(module: str, package: Path = PACKAGE) -> set[str]:
    """hpcrl modules that `module` imports anywhere in its body (top level or inside functions)."""
    path = package.parent / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    known = set(module_names(package))
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from hpcrl.store import rundir` imports the module hpcrl.store.rundir; `from hpcrl.x import f` imports hpcrl.x.
            candidates = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in candidates:
            if name in known:
                found.add(name)
    # Importing a module runs its packages' __init__ first; those edges are not choices of this module.
    return {name for name in found if not module.startswith(name + ".") and name != module}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path that ends where it starts, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_import_graph_has_no_cycle() -> None:
    graph = {module: imports_of(module) for module in module_names()}
    assert graph["hpcrl.submit.pipeline"] >= {"hpcrl.submit.jobplan"}, "the graph builder lost pipeline's imports"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


# The rooms of the layout, foundations first: a module imports only modules of its own room or of a
# room above it in this list, so the list reads as the order in which the layers are built on each
# other (config -> the experiment and run directories -> what to try -> the backends -> inside a job
# -> the image -> planning and submitting the jobs -> the training stack -> results -> the commands).
# Top-level modules are rooms of their own. No arrow points back up, so the rooms have no cycle either.
ROOMS = (
    "hpcrl", "hpcrl.io", "hpcrl.cores", "hpcrl.leftovers", "hpcrl.netaddr", "hpcrl.config", "hpcrl.templates", "hpcrl.store", "hpcrl.sweep", "hpcrl.schedulers", "hpcrl.job",
    "hpcrl.runtime", "hpcrl.halves", "hpcrl.image", "hpcrl.submit", "hpcrl.games", "hpcrl.rl", "hpcrl.distributed", "hpcrl.results",
    "hpcrl.status", "hpcrl.starters", "hpcrl.stages", "hpcrl.api", "hpcrl.cli", "hpcrl.__main__",
)
# Rooms that a login node's commands load (status, collect, the scheduler backends): never the
# training stack, not even through a function-level import.
NO_TRAINING_STACK = ("hpcrl.schedulers", "hpcrl.store", "hpcrl.results")
TRAINING_STACK = ("hpcrl.rl", "hpcrl.distributed")


def room_of(module: str) -> str:
    """The room of a module: its folder under hpcrl/, or the module itself at the top level."""
    return ".".join(module.split(".")[:2])


def back_arrows(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Imports from a room to a room below it in ROOMS (or to a room ROOMS does not name)."""
    rank = {room: i for i, room in enumerate(ROOMS)}
    return {(m, i) for m, deps in graph.items() for i in deps if rank.get(room_of(i), len(ROOMS)) > rank.get(room_of(m), -1)}


def reaches(graph: dict[str, set[str]], module: str) -> set[str]:
    """Every hpcrl module that importing `module` may load, function-level imports included."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def imports_torch(module: str, package: Path = PACKAGE) -> bool:
    path = package.parent / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if any(name == "torch" or name.startswith("torch.") for name in names):
            return True
    return False


def test_every_module_lives_in_a_named_room() -> None:
    assert {room_of(m) for m in module_names()} <= set(ROOMS)


def rooms_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The rooms each room imports (itself left out)."""
    rooms: dict[str, set[str]] = {}
    for module, deps in graph.items():
        rooms.setdefault(room_of(module), set()).update(room_of(i) for i in deps)
    return {room: deps - {room} for room, deps in rooms.items()}


def test_imports_point_up_the_rooms_never_down() -> None:
    """A room imports only the rooms it is built on (ROOMS), so the tree reads as the pipeline does."""
    graph = {module: imports_of(module) for module in module_names()}
    assert back_arrows(graph) == set()


def test_the_rooms_import_each_other_without_a_cycle() -> None:
    """Folders, not just modules: image/ and submit/ importing each other is a cycle of rooms."""
    cycle = find_cycle(rooms_graph({module: imports_of(module) for module in module_names()}))
    assert cycle is None, "room cycle: " + " -> ".join(cycle or [])


def test_login_node_rooms_never_load_the_training_stack() -> None:
    """`hpcrl status`, `collect` and the backends run on a login node: neither torch nor rl/ nor distributed/."""
    graph = {module: imports_of(module) for module in module_names()}
    for module in graph:
        if room_of(module) in NO_TRAINING_STACK:
            loaded = reaches(graph, module) | {module}
            assert not {m for m in loaded if room_of(m) in TRAINING_STACK}, module
            assert not [m for m in loaded if imports_torch(m)], module


def test_the_room_checks_see_a_back_arrow_and_torch() -> None:
    assert back_arrows({"hpcrl.config.schema": {"hpcrl.store.rundir"}}) == {("hpcrl.config.schema", "hpcrl.store.rundir")}
    assert back_arrows({"hpcrl.store.rundir": {"hpcrl.config.schema"}}) == set()
    assert imports_torch("hpcrl.rl.checkpoint") and not imports_torch("hpcrl.store.rundir")
    assert reaches({"a": {"b"}, "b": {"c"}, "c": set()}, "a") == {"b", "c"}
    assert rooms_graph({"hpcrl.image.build": {"hpcrl.submit.jobplan"}, "hpcrl.submit.pipeline": {"hpcrl.image.build", "hpcrl.submit.jobplan"}}) == {
        "hpcrl.image": {"hpcrl.submit"},
        "hpcrl.submit": {"hpcrl.image"},
    }


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import() -> None:
    source = "def f():\n    from hpcrl.submit.pipeline import plan_scripts\n"
    assert any(isinstance(n, ast.ImportFrom) for n in ast.walk(ast.parse(source)))
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


_IMPORT_EACH = """
import importlib, sys
failed = []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m == "hpcrl" or m.startswith("hpcrl.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


@pytest.mark.slow
def test_each_module_imports_on_its_own() -> None:
    """One interpreter, hpcrl's modules cleared from sys.modules before each import (third-party ones
    stay cached, so torch is imported once): an import that works only after another hpcrl module
    was imported fails here. `hpcrl.__main__` runs the CLI when imported and is run as a program."""
    names = [m for m in module_names() if m != "hpcrl.__main__"]
    proc = subprocess.run([sys.executable, "-c", _IMPORT_EACH, *names], capture_output=True, text=True, cwd=PACKAGE.parent, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    proc = subprocess.run([sys.executable, "-m", "hpcrl", "--version"], capture_output=True, text=True, cwd=PACKAGE.parent, timeout=120)
    assert proc.returncode == 0, proc.stderr
