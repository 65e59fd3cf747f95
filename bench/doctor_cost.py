"""What the training doctor costs the worker: CPU per check and per 1,000 metric rows, and the share of a core.

    .venv/bin/python bench/doctor_cost.py                # 200 rows/s, a check every 2 s, 60 checks
    .venv/bin/python bench/doctor_cost.py --rows-per-s 1000 --checks 100

A throw-away data folder and SQLite store; one running run. Each round writes what a live run writes
between two checks (`rows_per_s * EXAMINE_INTERVAL_S` rows: ten metrics per logged step, as an SFT run
logging every step writes, with torch memory samples beside them), then times the worker's
`Doctor.check()` (reading the new rows, the rules, storing findings) with `time.process_time()`: CPU,
not wall time, of this process, the SQLite reads included. It also times the rules alone
(`jobs.doctor.rulebook.examine`) over the curves as the doctor keeps them once full (HEAD_POINTS +
TAIL_POINTS per metric). Prints ms per check, ms per 1,000 rows, and the % of one core at that row rate.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NAMES = ("loss", "grad_norm", "learning_rate", "epoch", "num_tokens", "mean_token_accuracy", "entropy")


def step_rows(step: int, rng: random.Random, now: float) -> list:
    from storage.records import MetricPoint

    smooth = 2.0 * math.exp(-step / 2000) + 0.5
    loss = smooth + rng.gauss(0, 0.05)
    values = [loss, 1.0 + rng.random(), 2e-4, step / 5000, 4096.0 * step, 0.6 + rng.random() / 10, 1.5]
    rows = [MetricPoint(step, n, v, now) for n, v in zip(NAMES, values)]
    rows += [
        MetricPoint(step, "step_time", 0.05, now),
        MetricPoint(step, "tokens_per_second", 3000 + rng.gauss(0, 100), now),
    ]
    if step % 200 == 0:
        rows.append(MetricPoint(step, "eval_loss", smooth + 0.1 + rng.gauss(0, 0.005), now))  # a mean over many rows
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows-per-s", type=float, default=200.0)
    parser.add_argument("--checks", type=int, default=60)
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="tunedeck-doctor-bench-")
    os.environ["TUNEDECK_HOME"] = home
    os.environ.pop("TUNEDECK_DATABASE_URL", None)
    from jobs.doctor.rulebook import examine
    from jobs.doctor.watch import EXAMINE_INTERVAL_S, Doctor, context_of
    from jobs.spec.job import JobSpec
    from storage.models import MemorySource
    from storage.records import MemoryPoint
    from storage.store import Store

    store = Store()
    spec = JobSpec(model="tiny-llama")
    run_id = store.create_run(spec)
    store.claim_next_on_device("bench", "0")
    doctor = Doctor(store, run_id, spec, interval_s=0.0)
    rng = random.Random(0)
    per_check = int(args.rows_per_s * EXAMINE_INTERVAL_S)
    step, costs, rows_read = 0, [], 0
    for _ in range(args.checks):
        batch: list = []
        samples = []
        while len(batch) < per_check:
            step += 1
            now = 1e9 + step
            batch += step_rows(step, rng, now)
            samples.append(MemoryPoint(now, MemorySource.TORCH.value, run_id, torch_allocated=10**9))
        store.add_metrics(run_id, batch)
        store.add_memory_samples(samples)
        start = time.process_time()
        doctor.check()
        costs.append(time.process_time() - start)
        rows_read += len(batch)
    curves = {name: c.points() for name, c in doctor._curves.items()}
    start, n = time.process_time(), 200
    for _ in range(n):
        examine(curves, context_of(spec), since=step - 40)
    rules_ms = (time.process_time() - start) / n * 1e3
    check_ms = statistics.median(costs[5:]) * 1e3  # the first checks read a cold store
    per_1000 = check_ms / per_check * 1000
    share = check_ms / (EXAMINE_INTERVAL_S * 1e3)
    print(
        f"rows: {rows_read} in {args.checks} checks of {per_check} rows ({args.rows_per_s:g} rows/s, a check every {EXAMINE_INTERVAL_S:g} s); {step} steps"
    )
    print(f"check (read + rules + store): median {check_ms:.2f} ms, max {max(costs) * 1e3:.2f} ms")
    print(
        f"rules alone over the kept curves ({sum(len(c) for c in curves.values())} points): {rules_ms:.2f} ms per evaluation"
    )
    print(f"per 1,000 rows: {per_1000:.2f} ms CPU")
    print(f"share of one core at {args.rows_per_s:g} rows/s: {share:.3%}")
    print(f"findings on this normal run: {len(doctor.found or ())}")
    store.dispose()


if __name__ == "__main__":
    main()
