"""Database under load: a 10 Hz metrics writer, the dashboard and 5 more readers polling, and
another process holding the write lock for seconds. No 'database is locked' reaches anyone and
no metric row is lost.

The lock is injected for real: a separate process runs BEGIN IMMEDIATE and sleeps. One test
keeps the production busy timeout (the writer just waits); the other lowers it below the lock
time so SQLite really raises 'database is locked' and the store's retry path has to recover.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jobs.spec.job import JobSpec
from storage import store_core
from storage.store import MetricPoint, Store, is_locked_error

pytestmark = pytest.mark.slow  # real processes holding database locks: the slow tier


_HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE meta SET value = value WHERE key = 'schema_version'")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


def _hold_write_lock(db: str, seconds: float) -> subprocess.Popen:
    """Another process holding SQLite's write lock for `seconds`; returns once it holds it."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, db, str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked", "the lock holder never got the lock"
    return proc


def _load(store: Store, run_id: int, db: str, lock_s: float, write_s: float) -> dict:
    """Writer at 10 Hz + 6 reader threads + a lock-holding process; returns counts and errors."""
    errors: list[str] = []
    written = 0
    reads = 0
    latencies: list[float] = []
    stop = threading.Event()

    def writer() -> None:
        nonlocal written
        step = 0
        end = time.monotonic() + write_s
        while time.monotonic() < end:
            points = [
                MetricPoint(step, name, float(step), time.time()) for name in ("loss", "learning_rate", "grad_norm")
            ]
            try:
                store.add_metrics(run_id, points)
                written += len(points)
            except Exception as exc:  # noqa: BLE001 - the test counts every error
                errors.append(f"writer: {exc}")
            step += 1
            time.sleep(0.1)

    def reader(i: int) -> None:
        nonlocal reads
        while not stop.is_set():
            began = time.monotonic()
            try:
                store.get_run(run_id)
                store.list_runs(limit=50)
                store.metric_series(run_id, "loss", 16) if i % 2 else store.metrics(run_id, ["loss"])
                store.last_metric(run_id, "loss")
                reads += 1
                latencies.append(time.monotonic() - began)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"reader {i}: {exc}")
            time.sleep(0.05)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    w = threading.Thread(target=writer)
    w.start()
    time.sleep(0.5)
    holder = _hold_write_lock(db, lock_s)
    w.join()
    stop.set()
    for t in threads:
        t.join()
    return {
        "errors": errors,
        "written": written,
        "reads": reads,
        "max_read_s": max(latencies, default=0.0),
        "holder_exit": holder.wait(30),
    }


@pytest.fixture
def run(store: Store) -> int:
    return store.create_run(JobSpec(model="tiny-llama", max_steps=1))


def test_writer_waits_out_a_held_lock(store: Store, run: int, data_home: Path) -> None:
    result = _load(store, run, str(data_home / "tunedeck.db"), lock_s=4.0, write_s=7.0)
    assert result["holder_exit"] == 0
    assert result["errors"] == []
    assert result["written"] >= 3 * 10  # ~10 Hz for 7 s, less the 4 s behind the lock (a loaded CI box is slower)
    assert len(store.metrics(run)) == result["written"]
    assert result["reads"] > 6 * 10
    assert result["max_read_s"] < 2.0  # readers never waited for the 4 s lock (WAL)


def test_locked_error_is_retried_not_raised(data_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Busy timeout 0.5 s < lock 3 s: SQLite raises 'database is locked'; the store retries."""
    monkeypatch.setattr(store_core, "BUSY_TIMEOUT_MS", 500)
    store = Store()
    try:
        run_id = store.create_run(JobSpec(model="tiny-llama", max_steps=1))
        result = _load(store, run_id, str(data_home / "tunedeck.db"), lock_s=3.0, write_s=5.0)
        assert result["errors"] == []
        assert store.lock_retries > 0, "the lock never reached the writer: the test injected nothing"
        assert len(store.metrics(run_id)) == result["written"]
        steps = sorted({p.step for p in store.metrics(run_id, ["loss"])})
        assert steps == list(range(len(steps)))  # no gap
    finally:
        store.dispose()


def test_rows_kept_when_retries_run_out(data_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Still locked after the retry budget: rows stay buffered and go with the next write."""
    monkeypatch.setattr(store_core, "BUSY_TIMEOUT_MS", 100)
    monkeypatch.setattr(store_core, "WRITE_RETRY_S", 0.5)
    store = Store()
    try:
        run_id = store.create_run(JobSpec(model="tiny-llama", max_steps=1))
        holder = _hold_write_lock(str(data_home / "tunedeck.db"), 2.5)
        assert store.add_metrics(run_id, [MetricPoint(0, "loss", 1.0, time.time())]) == 0  # kept, not raised
        holder.wait(30)
        assert store.add_metrics(run_id, [MetricPoint(1, "loss", 0.5, time.time())]) == 2
        assert [p.step for p in store.metrics(run_id)] == [0, 1]
        assert store.flush_unwritten() == 0
    finally:
        store.dispose()


def test_is_locked_error() -> None:
    assert is_locked_error(sqlite3.OperationalError("database is locked"))
    assert not is_locked_error(sqlite3.OperationalError("no such table: x"))
    assert not is_locked_error(ValueError("database is locked"))
