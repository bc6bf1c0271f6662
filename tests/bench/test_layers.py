"""The shape of bench/ (and the size of neuralcache/'s modules), from the source alone.

bench/ is grouped by role, one package each, and its imports run one way, down:

    __main__ -> runner -> scenarios -> report
                              -> systems -> servers -> wan      (tools -> systems too)

* no circle among bench modules (any import counts: at the top, inside a function, or
  under ``if TYPE_CHECKING``);
* a role package imports only itself and the roles ``ALLOWED`` names for it;
* only ``bench/__main__.py`` imports the runner;
* the other modules at the top of bench/ (and ``bench/maze/``) are commands kept at
  their old paths: each imports one module and runs its ``main``;
* no module in bench/ or neuralcache/ is longer than ``MAX_LINES``.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
MAX_LINES = 600
SIZED = (BENCH, ROOT / "neuralcache")

# role -> the other roles it may import (it may always import itself).  Modules at the
# top of bench/ that are neither __main__ nor the runner are "commands" (shims).
ALLOWED = {
    "main": {"runner", "scenarios", "systems", "wan"},
    "runner": {"report", "scenarios", "systems", "servers", "wan"},
    "tools": {"systems", "servers", "wan"},
    "scenarios": {"report", "systems", "servers", "wan"},
    "report": set(),
    "systems": {"servers", "wan"},
    "servers": {"wan"},
    "wan": set(),
    "commands": {"tools", "report", "scenarios"},
}
ROLE_PACKAGES = {"tools", "scenarios", "report", "systems", "servers", "wan"}
COMMAND_MAX_LINES = 10


def modules(bench: Path = BENCH) -> dict[str, Path]:
    """bench module name -> its file."""
    out = {}
    for p in bench.rglob("*.py"):
        name = ".".join(("bench",) + p.relative_to(bench).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def imported_names(path: Path) -> set[str]:
    """Every dotted name a file imports (``from a import b`` gives ``a.b``), at the top,
    inside functions and under ``if TYPE_CHECKING``, relative imports resolved."""
    pkg = ".".join(("bench",) + path.relative_to(BENCH).parent.parts)
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = pkg.rsplit(".", node.level - 1)[0] if node.level > 1 else pkg
                base = f"{parent}.{base}" if base else parent
            out |= {f"{base}.{a.name}" for a in node.names}
    return out


def import_graph(bench: Path = BENCH) -> dict[str, set[str]]:
    """bench module -> the bench modules it imports (each imported name resolved to the
    longest module it names: ``from bench.systems.base import Mounted`` ->
    ``bench.systems.base``; ``from bench.scenarios import shards`` ->
    ``bench.scenarios.shards``)."""
    files = modules(bench)

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for mod, path in files.items():
        deps = {resolve(n) for n in imported_names(path) if n.split(".")[0] == "bench"}
        graph[mod] = {d for d in deps if d and d != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as
    one circle through them (a path that comes back to its first module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:           # recursive: bench's graph is a few hundred edges
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_circle(graph, comp) for comp in found]


def _circle(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside it."""
    start = min(comp)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & comp):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    return sorted(comp)


def role(mod: str) -> str:
    parts = mod.split(".")
    if mod == "bench.__main__":
        return "main"
    if mod == "bench.runner":
        return "runner"
    if len(parts) > 1 and parts[1] in ROLE_PACKAGES:
        return parts[1]
    return "commands"


def wrong_way(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} ({role(a)}) imports {b} ({role(b)})"
                  for a, deps in graph.items() for b in deps
                  if role(b) != role(a) and role(b) not in ALLOWED[role(a)])


def test_the_graph_sees_every_kind_of_import():
    g = import_graph()
    assert "bench.systems.peers" in g["bench.systems.registry"]          # from a import b
    assert "bench.scenarios.maze.scenario" in g["bench.scenarios.registry"]  # in a function
    assert "bench.servers.seaweed" in g["bench.scenarios.harness"]       # TYPE_CHECKING
    assert "bench.wan.conn" in g["bench.wan.core"]                       # relative
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_import_circles():
    assert cycles(import_graph()) == []


def test_imports_run_one_way_between_the_role_packages():
    assert wrong_way(import_graph()) == []


def test_only_main_imports_the_runner():
    users = {m for m, deps in import_graph().items() if "bench.runner" in deps}
    assert users == {"bench.__main__"}


def test_the_other_top_level_modules_are_commands_that_run_one_moved_module():
    files = modules()
    for mod, deps in import_graph().items():
        if role(mod) != "commands":
            continue
        text = files[mod].read_text()
        if files[mod].name == "__init__.py":      # bench/, bench/maze/: a docstring
            assert not deps, mod
            continue
        assert len(deps) == 1 and "import main" in text, mod
        assert len(text.splitlines()) <= COMMAND_MAX_LINES, mod


def test_no_module_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for tree in SIZED for p in tree.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
