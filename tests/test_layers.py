"""The structure stays one-directional: app -> jobs -> storage, and no two modules import each other.

Imports are read from the source (ast), lazy imports inside functions included, so a cycle that
only shows at run time is caught here too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "jobs", "storage")
LAYER = {"app": 2, "jobs": 1, "storage": 0}


def module_imports() -> dict[str, set[str]]:
    """{module: the project modules it imports}, e.g. {"app.ui": {"app.ui_form", "storage.store"}}."""
    graph: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).glob("*.py")):
            name = f"{package}.{path.stem}"
            found: set[str] = set()
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    if node.module in PACKAGES:  # `from app import ui_form`
                        found |= {f"{node.module}.{a.name}" for a in node.names}
                    elif node.module.split(".")[0] in PACKAGES:
                        found.add(node.module)
                elif isinstance(node, ast.Import):
                    found |= {a.name for a in node.names if a.name.split(".")[0] in PACKAGES}
            graph[name] = {m for m in found if m != name}
    return graph


def test_no_layer_imports_upward() -> None:
    upward = [f"{a} imports {b}" for a, deps in module_imports().items() for b in deps
              if LAYER[b.split(".")[0]] > LAYER[a.split(".")[0]]]
    assert not upward, upward


def test_no_import_cycles() -> None:
    graph = module_imports()
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        for dep in sorted(graph.get(node, ())):
            if dep in path:
                cycles.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif len(path) < 12:
                visit(dep, path + [dep])

    for start in sorted(graph):
        visit(start, [start])
    assert not cycles, sorted(set(cycles))[:10]


def test_the_import_reader_sees_lazy_imports(tmp_path: Path) -> None:
    assert "storage.settings" in module_imports()["app.ui_data"]  # imported inside a function
