"""How the code is laid out, measured: import layers, module sizes, and the launch-to-queue call path.

    .venv/bin/python bench/architecture.py                     # this tree
    .venv/bin/python bench/architecture.py --baseline f3c20f3  # and an older commit, side by side

Figures (the same definitions as tests/test_layers.py):
- layers: the longest chain of project imports, in modules, lazy imports inside functions included
  (a module that imports nothing of the project is 1 layer); printed with the chain itself;
- modules over 400 lines, and the largest module;
- the launch path: the form's Launch handler is called with the form's defaults (on a tiny offline
  model, in a throw-away data folder) under `sys.setprofile`, and every call from one project file
  into another is recorded until the run is queued. "files" counts the distinct files entered,
  "edges" the distinct caller-file -> callee-file pairs; an edge "against imports" goes into a
  module with MORE import layers below it than the caller has (a callback, or an object handed
  down from above), printed with how many calls took it; "files calling each other" counts the
  pairs of files with edges both ways (back and forth).
The baseline is checked out into a temporary git worktree and measured with the same code.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from import_graph import layers, longest_chain, module_files, module_imports  # noqa: E402 - the one reader (tests/)


def static_figures(root: Path) -> dict:
    graph = module_imports(root)
    depth = layers(graph)
    chain = longest_chain(graph)
    jobs = {n: d for n, d in depth.items() if n.startswith("jobs")}
    sizes = {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in module_files(root).values()}
    flat_jobs = [p for p in (root / "jobs").glob("*.py") if p.stem != "__init__"]
    return {
        "modules": len(graph),
        "jobs_root_modules": len(flat_jobs),
        "layers": len(chain),
        "chain": chain,
        "jobs_layers": max(jobs.values()),
        "over_400": sorted(((n, f) for f, n in sizes.items() if n > 400), reverse=True),
        "largest": max(sizes.values()),
    }


# ---------------------------------------------------------------------- the traced launch (child side)
def _trace_source() -> str:
    return r"""
import json, os, sys
from pathlib import Path
root = Path(sys.argv[1]).resolve()
out = Path(sys.argv[2])
sys.path.insert(0, str(root))
try:
    from app.ui import form as ui_form
    from jobs.models.tiny import build_tiny_model
except ImportError:
    from app import ui_form
    from jobs.tiny import build_tiny_model
from storage.store import Store
model = build_tiny_model(Path(os.environ["TUNEDECK_HOME"]) / "tiny-llama")
store = Store()
try:
    from jobs.spec.job import JobSpec
except ImportError:
    from jobs.spec import JobSpec
values = list(ui_form.form_values(JobSpec()))
# the default job on the tiny model (the embedded model needs a download)
try:
    from jobs.spec.field import field_infos
except ImportError:
    try:
        from jobs.spec.field_info import field_infos
    except ImportError:
        from jobs.spec import field_infos
order = [f.name for f in field_infos()]
values[order.index("model")] = str(model)
prefix = str(root) + os.sep
calls = []
stack = []

def profile(frame, event, arg):
    if event == "call":
        file = frame.f_code.co_filename
        caller = stack[-1] if stack else None
        # a module body running (a lazy import) is not a call of the launch path
        mine = file.startswith(prefix) and "/tests/" not in file and "/bench/" not in file \
            and frame.f_code.co_name != "<module>"
        stack.append(file if mine else caller)
        if mine and caller is not None and caller != file:
            calls.append((caller[len(prefix):], file[len(prefix):]))
    elif event == "return" and stack:
        stack.pop()

sys.setprofile(profile)
result = ui_form.launch(store, *values)
sys.setprofile(None)
out.write_text(json.dumps({"calls": calls, "result": str(result)[:300], "queued": len(store.queued())}))
"""


def traced_launch(root: Path, graph: dict[str, set[str]]) -> dict:
    depth = layers(graph)
    by_file = {str(p.relative_to(root)): n for n, p in module_files(root).items()}
    with tempfile.TemporaryDirectory() as home:
        out = Path(home) / "trace.json"
        env = {**os.environ, "TUNEDECK_HOME": home, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1"}
        env.pop("TUNEDECK_DATABASE_URL", None)
        proc = subprocess.run(
            [sys.executable, "-c", _trace_source(), str(root), str(out)],
            cwd=home,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"traced launch failed in {root}:\n{proc.stderr[-3000:]}")
        data = json.loads(out.read_text())
    calls = [(a, b) for a, b in data["calls"] if a in by_file and b in by_file]
    edges = set(calls)
    against = {(a, b) for a, b in edges if depth[by_file[b]] > depth[by_file[a]]}
    entered = {b for _, b in calls} | {a for a, _ in calls}
    return {
        "files": len(entered),
        "edges": len(edges),
        "climbs": len(against),
        "climb_calls": sum(1 for c in calls if c in against),
        "climb_edges": sorted(f"{a} -> {b}" for a, b in against),
        "pairs": len({frozenset(e) for e in edges if (e[1], e[0]) in edges}),
        "queued": data["queued"],
    }


def measure(root: Path) -> dict:
    figures = static_figures(root)
    figures.update(traced_launch(root, module_imports(root)))
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="a commit to measure side by side (checked out into a temp worktree)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    columns = {"this tree": measure(ROOT)}
    if args.baseline:
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp) / "baseline"
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), args.baseline], check=True
            )
            try:
                columns[f"baseline {args.baseline}"] = measure(tree)
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    if args.json:
        print(json.dumps(columns, indent=2))
        return 0
    rows = [
        ("modules", "modules"),
        ("modules loose in jobs/", "jobs_root_modules"),
        ("import layers (whole tree)", "layers"),
        ("import layers (jobs/)", "jobs_layers"),
        ("largest module (lines)", "largest"),
        ("modules over 400 lines", "over_400"),
        ("launch: files entered", "files"),
        ("launch: file-to-file call edges", "edges"),
        ("launch: edges against imports", "climbs"),
        ("launch: calls along those edges", "climb_calls"),
        ("launch: files calling each other", "pairs"),
        ("launch: runs queued", "queued"),
    ]
    names = list(columns)
    print(f"{'':34}" + "".join(f"{n:>22}" for n in names))
    for label, key in rows:
        cells = [columns[n][key] for n in names]
        cells = [len(c) if isinstance(c, list) else c for c in cells]
        print(f"{label:34}" + "".join(f"{c!s:>22}" for c in cells))
    for name in names:
        print(f"\nlongest import chain, {name}:\n  " + " -> ".join(columns[name]["chain"]))
        if columns[name]["climb_edges"]:
            print("  calls against the imports: " + ", ".join(columns[name]["climb_edges"]))
        if columns[name]["over_400"]:
            print("  over 400 lines: " + ", ".join(f"{f} ({n})" for n, f in columns[name]["over_400"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
