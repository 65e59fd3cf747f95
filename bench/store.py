"""Metric-row ingest into the store, alone and with the dashboard's readers polling.

    .venv/bin/python bench/store.py                    # 10 s baseline + 10 s with 6 readers
    .venv/bin/python bench/store.py --seconds 20 --batch 200 --readers 6
    .venv/bin/python bench/store.py --soak 600         # 10 minutes at 10 Hz: written vs read back
    .venv/bin/python bench/store.py --url postgresql+psycopg://postgres@127.0.0.1:5432/bench
                                                       # SQLite and PostgreSQL side by side

Ingest: one writer process calls `Store.add_metrics` with batches of `--batch` rows as fast as
it can (the training callback writes one batch per second; this is the worst case). Readers
are separate processes doing what a dashboard tab does every second (run row, runs table,
loss series from the rollups, last metric, memory series), polling every `--poll` s; 6 of them
stand for the dashboard and 5 more viewers. Every error is counted, "database is locked"
separately. Goal: >= 10,000 rows/s with readers, 0 lock errors. `--url` runs both phases again on
that database (an existing, preferably empty PostgreSQL database; each phase writes a new run) and
prints the columns side by side; the goal applies to each backend.
Soak: the writer writes 3 metrics per step at 10 Hz for SECONDS with the readers running, then
the rows read back are counted. Goal: written == read back.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NAMES = ("loss", "learning_rate", "grad_norm")


def _reader(url: str, run_id: int, poll: float, stop: mp.synchronize.Event, out: mp.Queue) -> None:
    from storage.store import Store, is_locked_error

    store = Store(url)
    reads = errors = locked = 0
    while not stop.is_set():
        try:
            store.get_run(run_id)
            store.list_runs(limit=50)
            store.metric_series(run_id, "loss", 16)
            store.last_metric(run_id, "loss")
            store.memory_samples(run_id, limit=100)
            reads += 1
        except Exception as exc:  # noqa: BLE001 - counted, not raised
            errors += 1
            locked += is_locked_error(exc)
        stop.wait(poll)
    store.dispose()
    out.put((reads, errors, locked))


def _writer(url: str, run_id: int, seconds: float, batch: int, rate_hz: float | None, out: mp.Queue) -> None:
    from storage.store import MetricPoint, Store, is_locked_error

    store = Store(url)
    rows = errors = locked = 0
    step = 0
    start = time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        per_step = len(NAMES)
        steps = max(1, batch // per_step)
        points = [MetricPoint(step + i, name, float(step + i), time.time()) for i in range(steps) for name in NAMES]
        try:
            rows += store.add_metrics(run_id, points)
            step += steps
        except Exception as exc:  # noqa: BLE001
            errors += 1
            locked += is_locked_error(exc)
        if rate_hz:
            time.sleep(max(0.0, start + step / rate_hz - time.perf_counter()))
    rows += store.flush_unwritten()
    elapsed = time.perf_counter() - start
    out.put((rows, elapsed, errors, locked, store.lock_retries))
    store.dispose()


def _phase(
    url: str, run_id: int, seconds: float, batch: int, readers: int, poll: float, rate_hz: float | None = None
) -> dict:
    ctx = mp.get_context("spawn")
    stop, out_r, out_w = ctx.Event(), ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_reader, args=(url, run_id, poll, stop, out_r)) for _ in range(readers)]
    for p in procs:
        p.start()
    time.sleep(2.0 if readers else 0)  # readers up (imports) before the clock starts
    w = ctx.Process(target=_writer, args=(url, run_id, seconds, batch, rate_hz, out_w))
    w.start()
    rows, elapsed, w_err, w_locked, retries = out_w.get()
    w.join()
    stop.set()
    got = [out_r.get() for _ in procs]
    for p in procs:
        p.join()
    return {
        "rows": rows,
        "elapsed": elapsed,
        "rate": rows / elapsed,
        "writer_errors": w_err,
        "reads": sum(g[0] for g in got),
        "reader_errors": sum(g[1] for g in got),
        "locked": w_locked + sum(g[2] for g in got),
        "retries": retries,
    }


def _fresh(home: Path, url: str | None = None) -> tuple[str, int]:
    os.environ["TUNEDECK_HOME"] = str(home)
    from jobs.spec.job import JobSpec
    from storage.store import Store

    url = url or f"sqlite:///{home / 'tunedeck.db'}"
    store = Store(url)
    run_id = store.create_run(JobSpec(model="tiny-llama", max_steps=1))
    store.dispose()
    return url, run_id


def ingest(args: argparse.Namespace) -> int:
    backends = [("sqlite", None)] + ([("postgresql", args.url)] if args.url else [])
    results: dict[str, dict] = {}
    for backend, url in backends:
        for label, readers in (("no readers", 0), (f"{args.readers} readers", args.readers)):
            with tempfile.TemporaryDirectory() as tmp:
                phase_url, run_id = _fresh(Path(tmp), url)
                results[f"{backend}, {label}"] = _phase(phase_url, run_id, args.seconds, args.batch, readers, args.poll)
    rows = [
        ("rows written", "rows"),
        ("seconds", "elapsed"),
        ("rows/s", "rate"),
        ("reader polls", "reads"),
        ("writer errors", "writer_errors"),
        ("reader errors", "reader_errors"),
        ("'database is locked'", "locked"),
        ("lock retries", "retries"),
    ]
    labels = list(results)
    print(f"\nmetric ingest, batches of {args.batch} rows, readers poll every {args.poll} s, {args.seconds:g} s each\n")
    print(f"{'':24}" + "".join(f"{label:>24}" for label in labels))
    for title, key in rows:
        fmt = (lambda v: f"{v:,.0f}") if key != "elapsed" else (lambda v: f"{v:.1f}")
        print(f"{title:24}" + "".join(f"{fmt(results[label][key]):>24}" for label in labels))
    ok = True
    for i, (backend, _url) in enumerate(backends):
        base, loaded = results[labels[2 * i]], results[labels[2 * i + 1]]
        met = (
            loaded["rate"] >= 10_000
            and loaded["locked"] == 0
            and loaded["writer_errors"] == 0
            and loaded["reader_errors"] == 0
        )
        ok = ok and met
        print(
            f"{backend}: with readers / without = {loaded['rate'] / base['rate']:.2f}; goal >= 10,000 rows/s "
            f"with readers and 0 errors: {'MET' if met else 'NOT MET'}"
        )
    return 0 if ok else 1


def soak(args: argparse.Namespace) -> int:
    from storage.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        url, run_id = _fresh(Path(tmp))
        result = _phase(url, run_id, args.soak, len(NAMES), args.readers, args.poll, rate_hz=10.0)
        store = Store(url)
        back = len(store.metrics(run_id))
        store.dispose()
    print(f"\nsoak {args.soak:g} s: writer at 10 Hz (3 metrics per step), {args.readers} readers every {args.poll} s")
    print(f"{'rows written':24}{result['rows']:>12,}")
    print(f"{'rows read back':24}{back:>12,}")
    print(f"{'reader polls':24}{result['reads']:>12,}")
    print(f"{'errors (writer/readers)':24}{result['writer_errors']:>6}/{result['reader_errors']:<5}")
    print(f"{'database is locked':24}{result['locked']:>12}")
    ok = back == result["rows"] and result["locked"] == 0
    print(f"\ngoal written == read back, 0 lock errors: {'MET' if ok else 'NOT MET'}")
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=10.0, help="length of each ingest phase")
    p.add_argument("--batch", type=int, default=300, help="rows per add_metrics call")
    p.add_argument("--readers", type=int, default=6, help="reader processes (dashboard + 5 viewers)")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between a reader's polls")
    p.add_argument("--soak", type=float, default=None, metavar="SECONDS", help="soak mode for SECONDS")
    p.add_argument(
        "--url", default=None, help="also measure this database (e.g. postgresql+psycopg://...), side by side"
    )
    args = p.parse_args()
    return soak(args) if args.soak else ingest(args)


if __name__ == "__main__":
    sys.exit(main())
