"""The project's import graph read from its source (ast): one reader for `tests/test_layers.py` and
`bench/architecture.py` (which also reads a baseline commit's checkout, hence `root`).

    graph = module_imports(ROOT)          # {"app.ui.dashboard": {"app.ui.form", ...}, ...}
    layers(graph)["jobs.queue.submit"]    # the longest import chain from it, itself included
    longest_chain(graph, "jobs")          # ["jobs.queue.sweep", "jobs.checks.pipeline", ...]

Lazy imports inside functions count, so a chain or cycle that shows only at run time is seen too.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "jobs", "storage")


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """{dotted module name: its file} for every module of the three packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def module_imports(root: Path = ROOT) -> dict[str, set[str]]:
    """{module: the project modules it imports}, e.g. {"app.ui.dashboard": {"app.ui.form", ...}}."""
    files = module_files(root)

    def known(name: str) -> str:
        while name not in files:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.split(".")[0] not in PACKAGES:
                    continue
                for alias in node.names:  # `from app.ui import form` names a module
                    full = f"{node.module}.{alias.name}"
                    found.add(full if full in files else known(node.module))
            elif isinstance(node, ast.Import):
                found |= {known(a.name) for a in node.names if a.name.split(".")[0] in PACKAGES}
        graph[name] = {m for m in found if m != name}
    return graph


def layers(graph: dict[str, set[str]]) -> dict[str, int]:
    """{module: the length of its longest import chain, itself included} (a leaf is 1)."""

    @functools.cache
    def depth(name: str) -> int:
        return 1 + max((depth(d) for d in graph[name]), default=0)

    return {name: depth(name) for name in graph}


def longest_chain(graph: dict[str, set[str]], prefix: str = "") -> list[str]:
    """The longest import chain starting in a module whose name starts with `prefix`."""
    depth = layers(graph)
    name = max((n for n in depth if n.startswith(prefix)), key=lambda n: (depth[n], n))
    chain = [name]
    while graph[name]:
        name = max(graph[name], key=lambda n: (depth[n], n))
        chain.append(name)
    return chain
