"""The bench modules import one way: runner -> scenarios -> maze.scenario -> harness."""
from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _imports(path: Path) -> set[str]:
    """Every bench module a file imports, at the top or inside a function."""
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
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in out if m.startswith("bench")}


def _modules() -> dict[str, set[str]]:
    mods = {}
    for p in BENCH.rglob("*.py"):
        name = ".".join(("bench",) + p.relative_to(BENCH).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = _imports(p)
    return mods


def test_only_main_imports_the_runner():
    users = {m for m, deps in _modules().items() if "bench.runner" in deps}
    assert users == {"bench.__main__"}


def test_harness_and_scenarios_do_not_import_upwards():
    mods = _modules()
    assert not mods["bench.harness"] & {"bench.runner", "bench.scenarios", "bench.maze.scenario"}
    assert not mods["bench.maze.scenario"] & {"bench.runner", "bench.scenarios"}
    assert "bench.runner" not in mods["bench.scenarios"]
