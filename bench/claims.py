"""Claim race: N worker processes take queued runs as fast as they can (claim only, no training).

    .venv/bin/python bench/claims.py                                   # SQLite: 8 processes, 500 runs
    .venv/bin/python bench/claims.py --url postgresql+psycopg://postgres@127.0.0.1:5432/bench
                                                                       # SQLite and PostgreSQL side by side

Each process is a worker of its own device: it calls `Store.claim_next_on_device`, marks the run
succeeded and releases its device (what a worker does once the run's processes are gone), until
the queue is empty. All processes start at the same moment. Afterwards every run must have been
claimed exactly once: "double claims" counts runs handed to two workers (goal 0), "lost" runs
never claimed (goal 0). `--url` names an existing PostgreSQL database; its `runs` rows of earlier
races are left alone (each race queues its own runs and counts only those).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _claimer(url: str, n: int, go: float, out: mp.Queue) -> None:
    from storage.store import Store

    store = Store(url)
    worker, device = f"bench-{os.getpid()}", f"bench-{n}"
    got, errors = [], 0
    while time.time() < go:
        time.sleep(0.001)
    while True:
        try:
            run = store.claim_next_on_device(worker, device, os.getpid())
        except Exception:  # noqa: BLE001 - counted, the race goes on
            errors += 1
            continue
        if run is None:
            break
        got.append(run.id)
        store.mark_succeeded(run.id, {})
        store.release_device(device, worker)
    out.put((got, errors, time.time()))
    store.dispose()


def race(url: str, processes: int, runs: int) -> dict:
    from jobs.spec.job import JobSpec
    from storage.models import RunStatus
    from storage.store import Store

    store = Store(url)
    spec = JobSpec(model="tiny-llama", max_steps=1)
    ids = {store.create_run(spec) for _ in range(runs)}
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    go = time.time() + 3.0 + 0.3 * processes  # every process imported and connected before the start
    procs = [ctx.Process(target=_claimer, args=(url, n, go, out)) for n in range(processes)]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    claimed = Counter(i for got, _, _ in results for i in got if i in ids)
    elapsed = max(end for _, _, end in results) - go
    statuses = Counter(r.status for r in store.list_runs(limit=runs * 10) if r.id in ids)
    store.dispose()
    return {
        "claims": sum(claimed.values()),
        "double": sum(c - 1 for c in claimed.values() if c > 1),
        "lost": len(ids - set(claimed)),
        "errors": sum(e for _, e, _ in results),
        "seconds": elapsed,
        "rate": sum(claimed.values()) / elapsed,
        "succeeded": statuses[RunStatus.SUCCEEDED],
        "per_process": sorted(len(got) for got, _, _ in results),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", type=int, default=8)
    p.add_argument("--runs", type=int, default=500)
    p.add_argument("--url", default=None, help="also race on this database (e.g. postgresql+psycopg://...)")
    args = p.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TUNEDECK_HOME"] = tmp
        results["sqlite"] = race(f"sqlite:///{Path(tmp) / 'tunedeck.db'}", args.processes, args.runs)
        if args.url:
            results["postgresql"] = race(args.url, args.processes, args.runs)
    print(f"\nclaim race: {args.processes} processes, {args.runs} queued runs each backend\n")
    print(f"{'':24}" + "".join(f"{k:>16}" for k in results))
    for title, key, fmt in (
        ("runs claimed", "claims", "{:,}"),
        ("double claims", "double", "{}"),
        ("never claimed", "lost", "{}"),
        ("claim errors", "errors", "{}"),
        ("succeeded afterwards", "succeeded", "{:,}"),
        ("seconds", "seconds", "{:.2f}"),
        ("claims/s", "rate", "{:,.0f}"),
    ):
        print(f"{title:24}" + "".join(f"{fmt.format(r[key]):>16}" for r in results.values()))
    for name, r in results.items():
        print(f"{name}: runs per process {r['per_process']}")
    ok = all(r["double"] == 0 and r["lost"] == 0 and r["errors"] == 0 for r in results.values())
    print(f"\ngoal 0 double claims, 0 lost, 0 errors: {'MET' if ok else 'NOT MET'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
