"""The predictor of this checkout against the measured peaks of a kept `bench/memory_runs.py` grid.

    python bench/memory_runs.py --keep --json before.json      # prints its work folder
    python bench/memory_repredict.py /tmp/tunedeck-memruns-XXXX  # this checkout's predictions, same runs

A measured peak does not depend on the predictor (the runs trained the same way whatever it said), so a
predictor change is checked against a grid already run without training it again: each run's stored spec
is predicted again through the submit check's own path (`jobs.checks.memory.predict_memory`, the worker's
published device facts, the data's measured lengths from the kept cache) and set against the run's
`peak_memory_bytes`, as `bench/memory_runs.py` does. The table: the saved prediction (what the run was told
at submit), the new one, the measured peak and both errors; the last lines as memory_runs prints them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MIB = 2**20
WITHIN, FAR_UNDER = 0.15, 0.15


def repredict(
    work: Path, trainer_bytes: dict[str, int] | None = None
) -> list[tuple[str, int | None, int | None, int | None, str]]:
    """(run name, saved data prediction, new data prediction, measured peak, status) per run of the grid;
    `trainer_bytes`: the trainers' own runtime increments, where the grid's worker published none."""
    if not os.environ.get("TUNEDECK_MODELS_DIR"):  # the model cache memory_runs gave its worker (the user's)
        from storage.settings import models_dir

        os.environ["TUNEDECK_MODELS_DIR"] = str(models_dir())
    os.environ["TUNEDECK_HOME"] = str(work / "home")
    os.environ.pop("TUNEDECK_DATABASE_URL", None)
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    from jobs.checks.memory import measured_lengths, predict_memory
    from jobs.devices.target import target
    from jobs.queue.saved_prediction import load_prediction
    from jobs.spec.stored import stored_spec
    from storage.store import Store

    store = Store()
    facts = target(store).facts
    if trainer_bytes is not None and not facts.trainer_bytes:
        facts = replace(facts, trainer_bytes=trainer_bytes)
    out = []
    for run_id in range(1, 10_000):
        run = store.get_run(run_id)
        if run is None:  # past the last run
            break
        spec = stored_spec(run.spec_json)
        saved = load_prediction(store, run_id) or {}
        memory = predict_memory(spec, facts, lengths=measured_lengths(spec))
        new = memory.prediction.total_bytes if memory.prediction is not None else None
        old = saved.get("data_bytes") if saved.get("data_bytes") is not None else saved.get("total_bytes")
        out.append((spec.run_name or str(run_id), old, new, run.peak_memory_bytes, run.status.value))
    store.dispose()
    return out


def measured_trainer_bytes() -> dict[str, int]:
    """The trainers' own runtime increments, measured in a fresh process as the worker does."""
    done = subprocess.run(
        [sys.executable, "-m", "jobs.train.baseline"], cwd=REPO, capture_output=True, text=True, check=True
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]).get("trainer_bytes", {}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", help="the work folder memory_runs kept (--keep)")
    parser.add_argument("--names", default=None, help="comma-separated job names in run order (memory_runs --list)")
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="a grid kept before the trainers' runtime increments: measure them here (jobs.train.baseline)",
    )
    ns = parser.parse_args(argv)
    rows = repredict(Path(ns.work), measured_trainer_bytes() if ns.baseline else None)
    names = ns.names.split(",") if ns.names else [r[0] for r in rows]
    print(f"{'job':22s} {'saved':>8s} {'new':>8s} {'measured':>9s} {'old err':>8s} {'new err':>8s}  (MiB)")
    errors: dict[str, list[float]] = {"old": [], "new": []}
    for name, (_, old, new, measured, status) in zip(names, rows, strict=False):
        cells = []
        for key, value in (("old", old), ("new", new)):
            if value is None or not measured or status != "succeeded":
                cells.append("-")
                continue
            err = (value - measured) / measured
            errors[key].append(err)
            cells.append(f"{100 * err:+6.1f}%")
        print(
            f"{name:22s} {(old or 0) / MIB:8,.0f} {(new or 0) / MIB:8,.0f} {(measured or 0) / MIB:9,.0f} "
            f"{cells[0]:>8s} {cells[1]:>8s}" + ("" if status == "succeeded" else f"  [{status}]")
        )
    for key, errs in errors.items():
        if errs:
            good = sum(abs(e) <= WITHIN for e in errs)
            print(
                f"{key}: {100 * good / len(errs):.0f}% of {len(errs)} runs within {100 * WITHIN:.0f}%; "
                f"worst {100 * min(errs):+.1f}%, most over {100 * max(errs):+.1f}%"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
