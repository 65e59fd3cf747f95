"""Store: run lifecycle, metrics/memory/artifacts, pragmas, schema migrations, atomic claims."""

from __future__ import annotations

import math
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jobs.spec.job import JobSpec, SpecError
from storage import models as m
from storage import store as store_module
from storage import store_core
from storage.models import RunStatus
from storage.store import MemoryPoint, MetricPoint, RunControl, Store

BACKENDS = ("sqlite", "postgresql")  # each `store` test runs on both databases (tests/conftest.py)

SPEC = JobSpec(model="tiny-llama", max_steps=5, run_name="lifecycle")


def test_create_and_get(store: Store) -> None:
    run_id = store.create_run(SPEC)
    run = store.get_run(run_id)
    assert run.status is RunStatus.QUEUED and run.spec_json == SPEC.to_json() and run.name == "lifecycle"
    assert run.started_at is None and run.current_step == 0 and not run.cancel_requested
    assert store.get_run(run_id + 100) is None
    assert [r.id for r in store.queued()] == [run_id]


def test_create_refuses_invalid_spec(store: Store) -> None:
    with pytest.raises(SpecError):
        store.create_run(JobSpec(lora_r=0))
    assert store.list_runs() == []


def test_lifecycle_succeeded(store: Store) -> None:
    run_id = store.create_run(SPEC)
    run = store.claim_next_on_device("w1", "0", worker_pid=42)
    assert run.id == run_id and run.status is RunStatus.RUNNING and run.worker_id == "w1" and run.worker_pid == 42
    assert run.started_at and run.heartbeat_at
    store.set_child(run_id, 4242, "/tmp/train.log")
    store.set_progress(run_id, 3, 5)
    store.set_resolved_config(run_id, {"sft": {"lr": 1e-3}})
    assert store.mark_succeeded(run_id, {"train_loss": 0.5})
    assert not store.mark_failed(run_id, "too late")  # first word wins
    run = store.get_run(run_id)
    assert run.status is RunStatus.SUCCEEDED and run.status.finished and run.finished_at
    assert (run.child_pid, run.log_path, run.current_step, run.total_steps) == (4242, "/tmp/train.log", 3, 5)
    assert run.final_metrics == {"train_loss": 0.5} and run.resolved_config == {"sft": {"lr": 1e-3}}
    assert store.claim_next_on_device("w1", "0") is None


def test_lifecycle_failed(store: Store) -> None:
    run_id = store.create_run(SPEC)
    store.claim_next_on_device("w1", "0")
    assert store.mark_failed(run_id, "boom", "trace", exit_code=3)
    run = store.get_run(run_id)
    assert (run.status, run.error_summary, run.error_detail, run.exit_code) == (RunStatus.FAILED, "boom", "trace", 3)


def test_lifecycle_cancelled_queued_and_running(store: Store) -> None:
    queued = store.create_run(SPEC)
    assert store.request_cancel(queued) is RunStatus.CANCELLED
    assert store.get_run(queued).status is RunStatus.CANCELLED
    running = store.create_run(SPEC)
    store.claim_next_on_device("w1", "0")
    assert store.request_cancel(running) is RunStatus.RUNNING
    assert store.get_run(running).cancel_requested
    assert store.mark_cancelled(running, exit_code=-15)
    run = store.get_run(running)
    assert run.status is RunStatus.CANCELLED and run.exit_code == -15
    assert store.request_cancel(9999) is None


def test_interrupted_and_stale(store: Store) -> None:
    run_id = store.create_run(SPEC)
    store.claim_next_on_device("w1", "0")
    assert store.stale_running(60) == []
    time.sleep(0.05)
    assert [r.id for r in store.stale_running(0.01)] == [run_id]
    store.heartbeat(run_id)
    assert store.stale_running(1) == []
    assert store.mark_interrupted(run_id, "worker died")
    assert store.get_run(run_id).status is RunStatus.INTERRUPTED
    assert not store.mark_interrupted(run_id, "again")


def test_watch_reads_and_beats_are_the_light_statements(store: Store) -> None:
    """run_control is status + cancel flag; worker_beat writes presence and the run's heartbeat in one
    transaction; add_metrics carries the step report in its own transaction."""
    run_id = store.create_run(SPEC)
    assert store.run_control(run_id) == RunControl(RunStatus.QUEUED, False)
    assert store.run_control(9999) is None
    store.claim_next_on_device("w1", "0")
    store.request_cancel(run_id)
    assert store.run_control(run_id) == RunControl(RunStatus.RUNNING, True)
    assert store.get_run(run_id).heartbeat_at is not None
    before = store.get_run(run_id).heartbeat_at
    time.sleep(0.05)
    store.worker_beat("host:1", 1, "host", run_id)
    store.worker_beat("host:1", 1, "host", run_id)  # the second beat updates the same presence row
    assert store.get_run(run_id).heartbeat_at > before
    assert [w["worker_id"] for w in store.live_workers()] == ["host:1"]
    assert store.add_metrics(run_id, [MetricPoint(7, "loss", 1.5, time.time())], progress=(7, 20)) == 1
    run = store.get_run(run_id)
    assert (run.current_step, run.total_steps) == (7, 20) and run.progress_at is not None
    assert store.add_metrics(run_id, [], progress=(8, None)) == 0  # no rows: the report alone
    assert store.get_run(run_id).current_step == 8


def test_list_runs_filters(store: Store) -> None:
    a, b = store.create_run(SPEC), store.create_run(SPEC)
    store.claim_next_on_device("w", "0")
    assert [r.id for r in store.list_runs()] == [b, a]
    assert [r.id for r in store.list_runs(status=RunStatus.RUNNING)] == [a]
    assert [r.id for r in store.list_runs(status=[RunStatus.QUEUED, RunStatus.RUNNING])] == [b, a]


def test_metrics_round_trip(store: Store) -> None:
    run_id = store.create_run(SPEC)
    points = [MetricPoint(s, "loss", 3.0 - s, 100.0 + s) for s in range(1, 4)] + [
        MetricPoint(1, "grad_norm", 0.5, 101.0)
    ]
    assert store.add_metrics(run_id, points) == 4
    assert store.add_metrics(run_id, []) == 0
    assert store.metrics(run_id, ["loss"]) == points[:3]
    assert sorted(store.metric_names(run_id)) == ["grad_norm", "loss"]
    assert store.last_metric(run_id, "loss") == points[2]
    assert store.last_metric(run_id, "nothing") is None


def test_memory_and_peak_round_trip(store: Store) -> None:
    run_id = store.create_run(SPEC)
    samples = [
        MemoryPoint(
            time=10.0,
            source="nvml",
            run_id=run_id,
            device_index=0,
            used_bytes=5,
            total_bytes=10,
            utilization=50.0,
            temperature=60.0,
            power_watts=300.0,
            process_rss=7,
        ),
        MemoryPoint(
            time=11.0, source="torch", run_id=run_id, torch_allocated=1, torch_reserved=2, torch_max_allocated=3
        ),
        MemoryPoint(time=12.0, source="host", run_id=None, used_bytes=9, total_bytes=10),
    ]
    assert store.add_memory_samples(samples) == 3
    assert store.memory_samples(run_id) == samples[:2]
    assert store.memory_samples() == samples
    assert store.memory_samples(source="host") == samples[2:]
    assert store.memory_samples(since=11.0, limit=1) == samples[1:2]
    store.set_peak_memory(run_id, 100, "nvml")
    store.set_peak_memory(run_id, 50, "host")  # lower: ignored
    run = store.get_run(run_id)
    assert (run.peak_memory_bytes, run.peak_memory_source) == (100, "nvml")


def test_old_idle_memory_samples_are_thinned_and_run_samples_kept(store: Store) -> None:
    run_id = store.create_run(JobSpec())
    now = 108_000.0  # a whole number of minutes
    idle_old = [MemoryPoint(time=now - 7200 + 5 * i, source="host", run_id=None, used_bytes=i) for i in range(360)]
    run_old = [MemoryPoint(time=now - 7200 + 5 * i, source="host", run_id=run_id, used_bytes=i) for i in range(360)]
    idle_new = [MemoryPoint(time=now - 600 + 5 * i, source="host", run_id=None, used_bytes=i) for i in range(120)]
    store.add_memory_samples(idle_old + run_old + idle_new)
    deleted = store.thin_idle_memory(older_than=now - 3600, keep_every=60.0)
    kept_old_idle = [p for p in store.memory_samples(source="host") if p.run_id is None and p.time < now - 3600]
    # 30 minutes of 5 s samples older than the window: one a minute stays (the first of each minute).
    assert len(kept_old_idle) == 30 and deleted == 360 - 30
    assert all(p.time % 60 == 0 for p in kept_old_idle)
    assert store.memory_samples(run_id) == run_old  # a run's samples stay whole
    assert [p for p in store.memory_samples(since=now - 600) if p.run_id is None] == idle_new
    assert store.thin_idle_memory(older_than=now - 3600, keep_every=60.0) == 0  # idempotent


def test_sampler_thins_idle_samples_on_its_cadence(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.devices.sampler import Sampler

    monkeypatch.setenv("TUNEDECK_IDLE_MEMORY_RETENTION_H", "1")
    calls = []
    monkeypatch.setattr(store, "thin_idle_memory", lambda older_than: calls.append(older_than) or 0)
    sampler = Sampler(store, thin_every_s=600)
    assert sampler.retention_s == 3600
    sampler.thin_idle(10_000.0)
    sampler.thin_idle(10_300.0)  # within the cadence: no second pass
    sampler.thin_idle(10_600.0)
    assert calls == [10_000.0 - 3600, 10_600.0 - 3600]


@pytest.mark.parametrize("raw", ["soon", "0", "-3"])
def test_bad_idle_retention_setting_names_the_variable(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from storage.settings import idle_memory_retention_s

    monkeypatch.setenv("TUNEDECK_IDLE_MEMORY_RETENTION_H", raw)
    with pytest.raises(ValueError, match="TUNEDECK_IDLE_MEMORY_RETENTION_H"):
        idle_memory_retention_s()


def test_rollups_add_up_under_concurrent_writers(store: Store) -> None:
    """Four writers interleave rows of one series into shared buckets: every rollup equals the raw rows."""
    run_id = store.create_run(SPEC)
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        own = Store(store.url)
        try:
            start.wait()
            for batch in range(10):  # steps n, n+4, n+8, ...: every bucket gets rows from every writer
                steps = range(n + 4 * 25 * batch, n + 4 * 25 * (batch + 1), 4)
                own.add_metrics(run_id, [MetricPoint(st, "loss", float(st % 97), 1.0) for st in steps])
                own.add_memory_samples(
                    [
                        MemoryPoint(time=1.7e9 + st / 8, source="host", run_id=run_id, process_rss=1000 + st)
                        for st in steps
                    ]
                )
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        finally:
            own.dispose()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    for width in (16, 256, 4096):
        assert store.metric_series(run_id, "loss", width) == store.metric_buckets(run_id, "loss", width)
    assert sum(b.count for b in store.metric_series(run_id, "loss", 16)) == 1000
    for width in (1.0, 16.0):  # 2**4 / 16 s and 2**8 / 16 s, at epoch times (buckets above 2**31)
        rolled = store.memory_series(run_id, width)
        raw = store.memory_series(run_id, 1 / 16)  # narrower than every level: read from raw samples
        assert sum(b.count for b in rolled) == sum(b.count for b in raw) == 1000
        assert [b.rss_max for b in rolled][-1] == 1000 + 999
        assert min(b.rss_min for b in rolled) == 1000


def test_memory_buckets_of_epoch_times_match_the_rollups(store: Store) -> None:
    run_id = store.create_run(SPEC)
    t0 = 1_764_000_000.0  # floor(t * 16) is above 2**31: a 32-bit CAST would overflow
    store.add_memory_samples(
        [MemoryPoint(time=t0 + k * 0.3, source="host", run_id=run_id, process_rss=k) for k in range(200)]
    )
    rolled = store.memory_series(run_id, 1.0)
    assert len(rolled) == len({math.floor(t0 + k * 0.3) for k in range(200)})
    assert [b.count for b in rolled] == [b.count for b in store.memory_buckets(run_id, 0.0, 1.0)]


def test_artifacts_round_trip_and_cascade(store: Store) -> None:
    run_id = store.create_run(SPEC)
    aid = store.add_artifact(run_id, "adapter", "/x/adapter", 123, "ab" * 32)
    [art] = store.artifacts(run_id)
    assert (art.id, art.kind, art.path, art.size, art.sha256) == (aid, "adapter", "/x/adapter", 123, "ab" * 32)
    store.add_metrics(run_id, [MetricPoint(1, "loss", 1.0, 1.0)])
    store.delete_run(run_id)
    assert store.artifacts(run_id) == [] and store.metrics(run_id) == []  # foreign keys cascade


def test_pragmas_on_every_connection(store: Store, backend: str) -> None:
    if backend != "sqlite":
        pytest.skip("pragmas are SQLite's")
    for engine in (store._write_engine, store._read_engine):
        for _ in range(3):
            conn = engine.raw_connection()  # a fresh pool connection each time after invalidate
            try:
                cur = conn.cursor()
                assert cur.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
                assert cur.execute("PRAGMA busy_timeout").fetchone()[0] == store_core.BUSY_TIMEOUT_MS
                assert cur.execute("PRAGMA foreign_keys").fetchone()[0] == 1
            finally:
                conn.invalidate()


def test_worker_presence(store: Store) -> None:
    store.worker_beat("host:1", 1, "host")
    assert [w["worker_id"] for w in store.live_workers()] == ["host:1"]
    assert store.live_workers(within_s=-1) == []
    store.worker_gone("host:1")
    assert store.live_workers() == []


# ---------------------------------------------------------------------- schema versions
def _db_path(data_home: Path) -> Path:
    return data_home / "old.db"


def test_new_database_gets_current_version(data_home: Path) -> None:
    s = Store(f"sqlite:///{_db_path(data_home)}")
    assert s.schema_version == m.SCHEMA_VERSION
    s.dispose()


def test_migration_upgrades_an_older_database(data_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _db_path(data_home)
    # An older database built by hand: today's tables minus a column a newer version adds.
    Store(f"sqlite:///{path}").dispose()
    with sqlite3.connect(path) as con:
        con.execute(
            "INSERT INTO runs (name, spec_json, status, created_at, queue_order, cancel_requested, current_step)"
            " VALUES ('old', ?, 'succeeded', 1.0, 1.0, 0, 0)",
            (JobSpec().to_json(),),
        )
    con.close()
    new_version = m.SCHEMA_VERSION + 1
    monkeypatch.setattr(m, "SCHEMA_VERSION", new_version)
    monkeypatch.setitem(store_module.MIGRATIONS, new_version, ["ALTER TABLE runs ADD COLUMN later_field TEXT"])
    s = Store(f"sqlite:///{path}")
    assert s.schema_version == new_version
    assert [r.name for r in s.list_runs()] == ["old"]  # data kept
    s.dispose()
    with sqlite3.connect(path) as con:
        columns = [row[1] for row in con.execute("PRAGMA table_info(runs)")]
    con.close()
    assert "later_field" in columns
    Store(f"sqlite:///{path}").dispose()  # idempotent: already at the new version


def test_database_without_version_row_is_stamped(data_home: Path) -> None:
    path = _db_path(data_home)
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE meta (key VARCHAR(64) PRIMARY KEY, value TEXT)")
    con.close()
    s = Store(f"sqlite:///{path}")
    assert s.schema_version == m.SCHEMA_VERSION
    s.dispose()


def test_newer_database_is_refused(data_home: Path) -> None:
    path = _db_path(data_home)
    Store(f"sqlite:///{path}").dispose()
    with sqlite3.connect(path) as con:
        con.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    con.close()
    with pytest.raises(RuntimeError, match="schema version 999, newer than"):
        Store(f"sqlite:///{path}")


# ---------------------------------------------------------------------- atomic claims
N_RUNS = 50


def test_claim_is_atomic_across_threads(store: Store) -> None:
    ids = {store.create_run(SPEC) for _ in range(N_RUNS)}
    claimed: dict[str, list[int]] = {"a": [], "b": [], "c": [], "d": []}
    start = threading.Barrier(len(claimed))

    def claimer(name: str) -> None:
        own = Store(store.url)
        start.wait()
        while (run := own.claim_next_on_device(name, f"device-{name}")) is not None:
            claimed[name].append(run.id)
            own.mark_succeeded(run.id, {})  # frees this claimer's device for its next claim
        own.dispose()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in claimed]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    every = [i for got in claimed.values() for i in got]
    assert sorted(every) == sorted(ids)  # each run exactly once
    for name, got in claimed.items():
        assert all(store.get_run(i).worker_id == name for i in got)


CLAIMER = """
import sys, time
from storage.store import Store
s = Store(sys.argv[1])
while time.time() < float(sys.argv[2]):
    time.sleep(0.001)
got = []
while (run := s.claim_next_on_device(sys.argv[3], sys.argv[3])) is not None:
    got.append(run.id)
    s.mark_succeeded(run.id, {})
print(",".join(map(str, got)))
"""


def test_claim_is_atomic_across_processes(store: Store) -> None:
    ids = {store.create_run(SPEC) for _ in range(N_RUNS)}
    go = time.time() + 2.0  # both processes start claiming at the same moment
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, store.url, str(go), f"p{i}"], stdout=subprocess.PIPE, text=True
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    every = [int(x) for out in outputs for x in out.split(",") if x]
    assert sorted(every) == sorted(ids)
    assert all(r.status is RunStatus.SUCCEEDED for r in store.list_runs())


def test_upgrade_keeps_ids_and_widens_them(store: Store, backend: str) -> None:
    """A version-3 database upgrades in place: ids and their sequence go on; PostgreSQL ids become 64-bit."""
    from sqlalchemy import text

    run_id = store.create_run(SPEC)
    store.add_metrics(run_id, [MetricPoint(1, "loss", 1.0, 1.0)])
    with store._tx() as s:
        s.execute(text("UPDATE meta SET value = '3' WHERE key = 'schema_version'"))
        s.execute(text("ALTER TABLE runs DROP COLUMN note"))  # added by schema 6
        s.execute(text("ALTER TABLE memory_samples DROP COLUMN worker_id"))  # added by schema 8
    again = Store(store.url)
    assert again.schema_version == m.SCHEMA_VERSION
    again.add_memory_samples([MemoryPoint(time=1.0, source="host", run_id=run_id, used_bytes=1, worker_id="h:1")])
    assert [p.worker_id for p in again.memory_samples(run_id)] == ["h:1"]
    again.add_metrics(run_id, [MetricPoint(2, "loss", 2.0, 2.0)])
    assert [p.step for p in again.metrics(run_id)] == [1, 2]
    if backend == "postgresql":
        with again._read() as s:
            types = dict(
                s.execute(
                    text(
                        "SELECT table_name, data_type FROM information_schema.columns "
                        "WHERE column_name = 'id' AND table_name IN ('metrics', 'memory_samples')"
                    )
                ).all()
            )
        assert types == {"metrics": "bigint", "memory_samples": "bigint"}
    again.dispose()


def test_storage_imports_neither_jobs_nor_app() -> None:
    """The store keeps the spec as JSON; parsing it is the callers' job (nothing imports upward)."""
    import ast

    for path in sorted((Path(__file__).resolve().parents[1] / "storage").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n.split(".")[0] in ("jobs", "app")], path.name
