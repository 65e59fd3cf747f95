"""The default example's evaluation (its questions scored base vs run, then a judge), before and after issue 35's cut.

    .venv/bin/python bench/example_eval.py --home H            # H: a TUNEDECK_HOME holding a finished run of
                                                                # examples/smollm2-tag-format.yaml
    .venv/bin/python bench/example_eval.py --home H --run 3 --baseline 9c0984a --rounds 2

What a worker runs when the default example's training ends, timed as the child processes it starts, on the
same finished run, one side after the other (`--rounds` alternates which goes first, so the machine's drift
hits both):

- baseline (`--baseline`, default 9c0984a, before this work; exported with `git archive` into a temporary
  folder, no git worktree): the example had no judge field, so evaluating it took the two commands a user (or
  two worker tasks) ran: `tunedeck evaluate RUN --tasks examples/tag-format-questions.jsonl` (every reply up to
  32 tokens) and `tunedeck judge RUN --judge smollm2-135m-instruct` (its own process: torch imported and
  SmolLM2 loaded again, the 6 verdicts generated one by one);
- current (this tree): the one task the example now queues, `tunedeck evaluate RUN --tasks ... --judge
  smollm2-135m-instruct`: one process, the judge is the run's base already loaded, the verdicts generated in
  one batch, the replies capped at the longest expected answer + 8 tokens (22 for these questions).

Each side runs on its own copy of the home (the scores it writes do not meet the other's), with the same
interpreter, TUNEDECK_MODELS_DIR and HF_HUB_OFFLINE=1. Printed: each command's wall time, the phases read from
the harness's log lines (start to the base model's scoring: imports, lm-eval, loading the run and its base;
scoring the base; scoring the run and the rest), the totals and their ratio; then each side's table and judge
line, which must say the same scores (the same measurement, only faster).

Needs a finished run of the default example (`tunedeck run examples/smollm2-tag-format.yaml` with TUNEDECK_HOME
pointed at H) and the converted SmolLM2 (TUNEDECK_MODELS_DIR or `tunedeck setup`). ~3-6 min on a busy 2-core CPU.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "9c0984a"  # main before the default example was scored by default (issue 35)
QUESTIONS = "examples/tag-format-questions.jsonl"  # run from the repository folder
JUDGE = "smollm2-135m-instruct"
_STAMP = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ jobs\.evaluate\.harness: scoring the (base|run) model"
)


def commands(run_id: int, side: str) -> list[list[str]]:
    rid = str(run_id)
    if side == "baseline":
        return [["evaluate", rid, "--tasks", QUESTIONS], ["judge", rid, "--judge", JUDGE]]
    return [["evaluate", rid, "--tasks", QUESTIONS, "--judge", JUDGE]]


def run_side(tree: Path, home: Path, run_id: int, side: str) -> dict[str, object]:
    """Each command of `side` in a fresh process of `tree`, on `home`: walls, phases and what it printed."""
    env = {**os.environ, "PYTHONPATH": str(tree), "TUNEDECK_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    env.pop("TUNEDECK_DATABASE_URL", None)
    walls, phases, printed = [], {}, []
    for argv in commands(run_id, side):
        start = time.time()
        done = subprocess.run(
            [sys.executable, "-m", "app.cli.main", *argv], cwd=tree, env=env, capture_output=True, text=True
        )
        end = time.time()
        if done.returncode != 0:
            raise SystemExit(f"{side}: {' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        walls.append((" ".join(argv[:1] + argv[2:]), end - start))
        stamps = {}
        for line in done.stderr.splitlines():
            found = _STAMP.match(line)
            if found:
                stamps[found.group(2)] = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if argv[0] == "evaluate" and {"base", "run"} <= set(stamps):
            phases = {
                "start -> scoring the base (imports, loads)": stamps["base"] - start,
                "scoring the base": stamps["run"] - stamps["base"],
                "scoring the run, then the rest": end - stamps["run"],
            }
        printed.append(done.stdout)
    return {"walls": walls, "phases": phases, "printed": printed, "total": sum(w for _, w in walls)}


def export_tree(rev: str, dest: Path) -> Path:
    """`rev`'s files in `dest` (git archive: the repository's worktrees are left alone)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def latest_example_run(home: Path) -> int:
    env_home = os.environ.get("TUNEDECK_HOME")
    os.environ["TUNEDECK_HOME"] = str(home)
    sys.path.insert(0, str(ROOT))
    from storage.models import RunStatus
    from storage.store import Store

    store = Store()
    try:
        runs = [r for r in store.list_runs(status=RunStatus.SUCCEEDED, limit=100) if r.name == "smollm2-tag-format"]
    finally:
        store.dispose()
        if env_home is None:
            os.environ.pop("TUNEDECK_HOME")
        else:
            os.environ["TUNEDECK_HOME"] = env_home
    if not runs:
        raise SystemExit(f"no succeeded smollm2-tag-format run in {home}: run the example there first")
    return max(r.id for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=Path, required=True, help="a TUNEDECK_HOME with a finished example run")
    parser.add_argument("--run", type=int, default=None, help="its run id (default: the latest succeeded one)")
    parser.add_argument("--baseline", default=BASELINE, help=f"the revision to compare with (default {BASELINE})")
    parser.add_argument("--rounds", type=int, default=1, help="rounds, alternating which side goes first")
    args = parser.parse_args()
    run_id = args.run or latest_example_run(args.home)
    results: dict[str, list[dict[str, object]]] = {"baseline": [], "current": []}
    with tempfile.TemporaryDirectory(prefix="example-eval-") as tmp:
        trees = {"baseline": export_tree(args.baseline, Path(tmp) / "baseline"), "current": ROOT}
        for n in range(args.rounds):
            for side in ("baseline", "current") if n % 2 == 0 else ("current", "baseline"):
                home = Path(tmp) / f"home-{side}-{n}"
                shutil.copytree(args.home, home, ignore=shutil.ignore_patterns("*.lock"))
                print(f"round {n + 1}: {side} ...", flush=True)
                results[side].append(run_side(trees[side], home, run_id, side))
                shutil.rmtree(home)
    report(results, args.baseline)


def report(results: dict[str, list[dict[str, object]]], baseline: str) -> None:
    def median(values: list[float]) -> float:
        ordered, half = sorted(values), len(values) // 2
        return ordered[half] if len(values) % 2 else (ordered[half - 1] + ordered[half]) / 2

    def row(label: str, b: float | None, c: float | None) -> str:
        cells = [f"{v:>9.1f}s" if v is not None else f"{'':>10}" for v in (b, c)]
        ratio = f"{c / b:>6.2f}x" if b and c is not None else ""
        return f"{label:<48} {cells[0]} {cells[1]} {ratio}"

    rounds = len(results["current"])
    print(f"\nthe default example's evaluation: baseline {baseline} vs this tree (median of {rounds} round(s))")
    print(f"{'':<48} {'baseline':>10} {'current':>10}  ratio")
    first = results["current"][0]["phases"]
    for name in first:
        b = [r["phases"][name] for r in results["baseline"] if name in r["phases"]]
        c = [r["phases"][name] for r in results["current"]]
        print(row(f"evaluate: {name}", median(b) if b else None, median(c)))
    for side in ("baseline", "current"):
        for label, wall in results[side][-1]["walls"]:
            print(
                row(
                    f"{side} process: {label[:32]}",
                    wall if side == "baseline" else None,
                    wall if side == "current" else None,
                )
            )
    b_total = median([float(r["total"]) for r in results["baseline"]])
    c_total = median([float(r["total"]) for r in results["current"]])
    print(row("total (what the example adds after training)", b_total, c_total))
    for side in ("baseline", "current"):
        print(f"\n{side} printed:")
        for out in results[side][-1]["printed"]:
            keep = [ln for ln in out.splitlines() if "±" in ln or ln.strip().startswith(("task ", "judge"))]
            print("\n".join(keep))


if __name__ == "__main__":
    main()
