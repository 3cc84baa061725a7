"""Every module of hpcrl imports on its own, and the import graph (imports inside functions
included) has no cycle: a cycle hidden by a function-level import is still a cycle (issue 12)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hpcrl"


def module_names() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def imports_of(module: str) -> set[str]:
    """hpcrl modules that `module` imports anywhere in its body (top level or inside functions)."""
    path = PACKAGE.parent / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    known = set(module_names())
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


def test_each_module_imports_on_its_own() -> None:
    """One interpreter, hpcrl's modules cleared from sys.modules before each import (third-party ones
    stay cached, so torch is imported once): an import that works only after another hpcrl module
    was imported fails here. `hpcrl.__main__` runs the CLI when imported and is run as a program."""
    names = [m for m in module_names() if m != "hpcrl.__main__"]
    proc = subprocess.run([sys.executable, "-c", _IMPORT_EACH, *names], capture_output=True, text=True, cwd=PACKAGE.parent, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    proc = subprocess.run([sys.executable, "-m", "hpcrl", "--version"], capture_output=True, text=True, cwd=PACKAGE.parent, timeout=120)
    assert proc.returncode == 0, proc.stderr
