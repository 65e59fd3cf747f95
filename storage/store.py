"""The one owner of the database: every SQL statement tunedeck runs is a method here.

    store = Store()                       # TUNEDECK_DATABASE_URL or ./data/tunedeck.db
    run_id = store.create_run(spec)
    run = store.claim_next("worker-1")    # atomic: two workers never get the same run

Each call opens a short session and closes it. On SQLite every connection gets WAL, a busy
timeout and foreign keys; write transactions start with BEGIN IMMEDIATE so a claim is one
serialised transaction, reads use a plain deferred BEGIN and never wait for writers.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

from contextlib import contextmanager
from sqlalchemy import Integer, create_engine, delete, event, func, select, text, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from jobs.spec import JobSpec, SpecError
from storage import models as m
from storage.models import RunStatus
from storage.settings import database_url

BUSY_TIMEOUT_MS = 30_000
# Metric/memory writes retry "database is locked" (a lock held past the busy timeout) with
# exponential backoff for this long before their rows are kept in memory for the next write.
WRITE_RETRY_S = 120.0

log = logging.getLogger(__name__)


def is_locked_error(exc: BaseException) -> bool:
    """True for SQLite's transient 'database is locked' / 'database is busy' errors."""
    text_ = str(getattr(exc, "orig", exc)).lower()
    return isinstance(exc, (OperationalError, sqlite3.OperationalError)) and (
        "database is locked" in text_ or "database is busy" in text_)


@dataclass(frozen=True)
class RunRecord:
    """A snapshot of one run row, detached from any session."""

    id: int
    name: str
    spec: JobSpec
    status: RunStatus
    created_at: float
    started_at: float | None
    finished_at: float | None
    heartbeat_at: float | None
    worker_id: str | None
    worker_pid: int | None
    child_pid: int | None
    exit_code: int | None
    cancel_requested: bool
    error_summary: str | None
    error_detail: str | None
    current_step: int
    total_steps: int | None
    final_metrics: dict[str, float]
    resolved_config: dict[str, Any]
    peak_memory_bytes: int | None
    peak_memory_source: str | None
    log_path: str | None

    @classmethod
    def from_row(cls, row: m.Run) -> "RunRecord":
        return cls(
            id=row.id, name=row.name, spec=_spec_of(row), status=RunStatus(row.status),
            created_at=row.created_at, started_at=row.started_at, finished_at=row.finished_at,
            heartbeat_at=row.heartbeat_at, worker_id=row.worker_id, worker_pid=row.worker_pid,
            child_pid=row.child_pid, exit_code=row.exit_code, cancel_requested=bool(row.cancel_requested),
            error_summary=row.error_summary, error_detail=row.error_detail,
            current_step=row.current_step or 0, total_steps=row.total_steps,
            final_metrics=json.loads(row.final_metrics_json) if row.final_metrics_json else {},
            resolved_config=json.loads(row.resolved_config_json) if row.resolved_config_json else {},
            peak_memory_bytes=row.peak_memory_bytes, peak_memory_source=row.peak_memory_source,
            log_path=row.log_path,
        )


def _spec_problem(spec_json: str) -> str | None:
    """Why a stored spec cannot be trained (None when it parses and validates)."""
    try:
        JobSpec.from_json(spec_json)
    except SpecError as exc:
        problems = "; ".join(f"{p.field}: {p.problem} ({p.fix})" for p in exc.problems)
        return f"the stored job spec is not valid for this tunedeck version: {problems}"
    except Exception as exc:  # noqa: BLE001 - whatever is stored, the queue must go on
        return f"the stored job spec cannot be read ({type(exc).__name__}: {exc})"
    return None


def _next_readable_queued(s: Session, now: float) -> int | None:
    """The first queued run whose spec this version can train; unreadable ones ahead of it are failed.

    Called inside the claim's write transaction, so a spec from an older/newer version or one
    edited by hand fails with the reason instead of crashing the worker that claims it.
    """
    while True:
        candidate = s.scalars(select(m.Run.id).where(m.Run.status == RunStatus.QUEUED.value)
                              .order_by(m.Run.queue_order, m.Run.id).limit(1)).first()
        if candidate is None:
            return None
        problem = _spec_problem(s.get(m.Run, candidate).spec_json)
        if problem is None:
            return candidate
        s.execute(update(m.Run).where(m.Run.id == candidate).values(
            status=RunStatus.FAILED.value, finished_at=now, error_summary=problem[:2000], error_detail=problem))


def _spec_of(row: m.Run) -> JobSpec:
    try:
        return JobSpec.from_json(row.spec_json)
    except Exception:  # noqa: BLE001 - an unreadable stored spec must not break listing runs
        return _lenient_spec(row.spec_json)


def _lenient_spec(spec_json: str) -> JobSpec:
    """The stored spec for display: fields this version cannot read are dropped (defaults shown)."""
    try:
        data = json.loads(spec_json)
    except (TypeError, ValueError):
        data = {}
    data = dict(data) if isinstance(data, dict) else {}
    for _ in range(len(data) + 1):
        try:
            return JobSpec.from_dict(data)
        except SpecError as exc:
            bad = {p.field for p in exc.problems} & set(data)
            if not bad:
                break
            for key in bad:
                data.pop(key)
    return JobSpec()


@dataclass(frozen=True)
class MetricPoint:
    step: int
    name: str
    value: float
    time: float


@dataclass(frozen=True)
class MemoryPoint:
    """One memory sample; `run_id` is None for samples taken while no run was active."""

    time: float
    source: str
    run_id: int | None = None
    device_index: int | None = None
    used_bytes: int | None = None
    total_bytes: int | None = None
    utilization: float | None = None
    temperature: float | None = None
    power_watts: float | None = None
    torch_allocated: int | None = None
    torch_reserved: int | None = None
    torch_max_allocated: int | None = None
    process_rss: int | None = None


@dataclass(frozen=True)
class MetricBucket:
    """A bucket of consecutive steps of one metric: its step span, min, max, sum and row count."""

    first_step: int
    last_step: int
    min: float
    max: float
    total: float
    count: int


@dataclass(frozen=True)
class MemoryBucket:
    """A time bucket of memory samples from one source; maxima keep spikes visible."""

    source: str
    first_time: float
    last_time: float
    used_min: int | None
    used_max: int | None
    total_max: int | None
    utilization_max: float | None
    torch_allocated_max: int | None
    torch_reserved_max: int | None
    rss_min: int | None
    rss_max: int | None
    count: int


@dataclass(frozen=True)
class ArtifactRecord:
    id: int
    run_id: int
    kind: str
    path: str
    size: int
    sha256: str
    created_at: float


_MEMORY_FIELDS = [f for f in MemoryPoint.__dataclass_fields__]


class Store:
    """All database access for tunedeck. Cheap to create; safe to use from many threads."""

    def __init__(self, url: str | None = None):
        self.url = url or database_url()
        self._sqlite = self.url.startswith("sqlite")
        self._write_engine = self._make_engine(immediate=True)
        self._read_engine = self._make_engine(immediate=False) if self._sqlite else self._write_engine
        self._write = sessionmaker(self._write_engine, expire_on_commit=False)
        self.lock_retries = 0  # how often a write met 'database is locked' and was retried
        self._unwritten: list[tuple[int, list[dict[str, Any]]]] = []  # metric rows kept after retries ran out
        self._buffer_lock = threading.Lock()
        self._read = sessionmaker(self._read_engine, expire_on_commit=False)
        self._migrate()

    # ------------------------------------------------------------------ engine
    def _make_engine(self, immediate: bool) -> Engine:
        kwargs: dict[str, Any] = {}
        if self._sqlite:
            kwargs["connect_args"] = {"timeout": BUSY_TIMEOUT_MS / 1000, "check_same_thread": False}
        engine = create_engine(self.url, **kwargs)
        if self._sqlite:
            @event.listens_for(engine, "connect")
            def _on_connect(dbapi_conn: Any, _record: Any) -> None:
                dbapi_conn.isolation_level = None  # SQLAlchemy's begin event emits BEGIN itself
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
                cur.execute("PRAGMA foreign_keys=ON")
                cur.execute("PRAGMA synchronous=NORMAL")
                cur.close()

            @event.listens_for(engine, "begin")
            def _on_begin(conn: Any) -> None:
                conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")
        return engine

    @contextmanager
    def _tx(self) -> Iterator[Session]:
        with self._write() as session, session.begin():
            yield session

    def _retrying(self, fn: Any, what: str, deadline_s: float | None = None) -> Any:
        """Call `fn()` (one whole write transaction) again on 'database is locked', backing off."""
        deadline = time.monotonic() + (WRITE_RETRY_S if deadline_s is None else deadline_s)
        delay = 0.05
        while True:
            try:
                return fn()
            except (OperationalError, sqlite3.OperationalError) as exc:
                if not is_locked_error(exc) or time.monotonic() + delay > deadline:
                    raise
                self.lock_retries += 1
                log.warning("%s: database is locked; retrying in %.2f s", what, delay)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _migrate(self) -> None:
        """Create tables and bring an older database up to SCHEMA_VERSION."""
        m.Base.metadata.create_all(self._write_engine)
        with self._tx() as s:
            row = s.get(m.Meta, "schema_version")
            if row is None:
                s.add(m.Meta(key="schema_version", value=str(m.SCHEMA_VERSION)))
                return
            found = int(row.value)
            if found > m.SCHEMA_VERSION:
                raise RuntimeError(
                    f"database {self.url} has schema version {found}, newer than this tunedeck's "
                    f"{m.SCHEMA_VERSION}: upgrade tunedeck, or point TUNEDECK_DATABASE_URL at another database")
            for version in range(found + 1, m.SCHEMA_VERSION + 1):
                for statement in MIGRATIONS.get(version, []):
                    s.connection().exec_driver_sql(statement)
            row.value = str(m.SCHEMA_VERSION)

    @property
    def schema_version(self) -> int:
        with self._read() as s:
            row = s.get(m.Meta, "schema_version")
            return int(row.value) if row else 0

    def dispose(self) -> None:
        self._write_engine.dispose()
        self._read_engine.dispose()

    # ------------------------------------------------------------------ runs
    def create_run(self, spec: JobSpec) -> int:
        """Queue a validated spec; returns the new run id."""
        spec.validate()
        now = time.time()
        with self._tx() as s:
            row = m.Run(name=spec.display_name, spec_json=spec.to_json(), status=RunStatus.QUEUED.value,
                        created_at=now, queue_order=now, cancel_requested=0, current_step=0)
            s.add(row)
            s.flush()
            return row.id

    def create_run_unchecked(self, spec_json: str, name: str = "unchecked") -> int:
        """Queue raw spec JSON without validating it: for tests of older/odd stored specs only."""
        now = time.time()
        with self._tx() as s:
            row = m.Run(name=name, spec_json=spec_json, status=RunStatus.QUEUED.value,
                        created_at=now, queue_order=now, cancel_requested=0, current_step=0)
            s.add(row)
            s.flush()
            return row.id

    def count_runs(self) -> int:
        with self._read() as s:
            return int(s.scalar(select(func.count()).select_from(m.Run)) or 0)

    def get_run(self, run_id: int) -> RunRecord | None:
        with self._read() as s:
            row = s.get(m.Run, run_id)
            return RunRecord.from_row(row) if row else None

    def list_runs(self, status: RunStatus | Sequence[RunStatus] | None = None, limit: int = 200) -> list[RunRecord]:
        """Newest first, optionally filtered by status."""
        q = select(m.Run).order_by(m.Run.id.desc()).limit(limit)
        if status is not None:
            statuses = [status] if isinstance(status, RunStatus) else list(status)
            q = q.where(m.Run.status.in_([st.value for st in statuses]))
        with self._read() as s:
            return [RunRecord.from_row(r) for r in s.scalars(q)]

    def queued(self) -> list[RunRecord]:
        """Queued runs in the order the worker will take them."""
        q = select(m.Run).where(m.Run.status == RunStatus.QUEUED.value).order_by(m.Run.queue_order, m.Run.id)
        with self._read() as s:
            return [RunRecord.from_row(r) for r in s.scalars(q)]

    def claim_next(self, worker_id: str, worker_pid: int | None = None) -> RunRecord | None:
        """Atomically move the first queued run to running for this worker."""
        now = time.time()
        with self._tx() as s:
            candidate = _next_readable_queued(s, now)
            if candidate is None:
                return None
            result = s.execute(update(m.Run).where(m.Run.id == candidate, m.Run.status == RunStatus.QUEUED.value)
                               .values(status=RunStatus.RUNNING.value, worker_id=worker_id,
                                       worker_pid=worker_pid if worker_pid is not None else os.getpid(),
                                       started_at=now, heartbeat_at=now))
            if result.rowcount != 1:
                return None
            return RunRecord.from_row(s.get(m.Run, candidate))

    def _set(self, run_id: int, **values: Any) -> None:
        def write() -> None:
            with self._tx() as s:
                s.execute(update(m.Run).where(m.Run.id == run_id).values(**values))

        self._retrying(write, "update run")

    def set_child(self, run_id: int, pid: int | None, log_path: str | None = None) -> None:
        values: dict[str, Any] = {"child_pid": pid}
        if log_path is not None:
            values["log_path"] = log_path
        self._set(run_id, **values)

    def heartbeat(self, run_id: int) -> None:
        self._set(run_id, heartbeat_at=time.time())

    def set_progress(self, run_id: int, step: int, total_steps: int | None = None) -> None:
        values: dict[str, Any] = {"current_step": int(step), "heartbeat_at": time.time()}
        if total_steps is not None:
            values["total_steps"] = int(total_steps)
        self._set(run_id, **values)

    def set_resolved_config(self, run_id: int, config: dict[str, Any]) -> None:
        self._set(run_id, resolved_config_json=json.dumps(config, default=str))

    def set_peak_memory(self, run_id: int, peak_bytes: int, source: str) -> None:
        """Raise the run's recorded peak if this one is higher."""
        with self._tx() as s:
            row = s.get(m.Run, run_id)
            if row is not None and (row.peak_memory_bytes is None or peak_bytes > row.peak_memory_bytes):
                row.peak_memory_bytes = int(peak_bytes)
                row.peak_memory_source = source

    def _finish(self, run_id: int, status: RunStatus, only_if: Iterable[RunStatus], **values: Any) -> bool:
        with self._tx() as s:
            result = s.execute(update(m.Run).where(m.Run.id == run_id,
                                                   m.Run.status.in_([st.value for st in only_if]))
                               .values(status=status.value, finished_at=time.time(), **values))
            return result.rowcount == 1

    def mark_succeeded(self, run_id: int, final_metrics: dict[str, float]) -> bool:
        return self._finish(run_id, RunStatus.SUCCEEDED, [RunStatus.RUNNING],
                            final_metrics_json=json.dumps(final_metrics), error_summary=None)

    def mark_failed(self, run_id: int, summary: str, detail: str | None = None, exit_code: int | None = None) -> bool:
        """Fail a running run; returns False when it had already finished (first word wins)."""
        return self._finish(run_id, RunStatus.FAILED, [RunStatus.RUNNING, RunStatus.QUEUED],
                            error_summary=summary[:2000], error_detail=detail, exit_code=exit_code)

    def mark_cancelled(self, run_id: int, exit_code: int | None = None) -> bool:
        return self._finish(run_id, RunStatus.CANCELLED, [RunStatus.RUNNING, RunStatus.QUEUED], exit_code=exit_code)

    def mark_interrupted(self, run_id: int, summary: str) -> bool:
        return self._finish(run_id, RunStatus.INTERRUPTED, [RunStatus.RUNNING], error_summary=summary)

    def set_exit_code(self, run_id: int, exit_code: int) -> None:
        self._set(run_id, exit_code=exit_code)

    def request_cancel(self, run_id: int) -> RunStatus | None:
        """Cancel a queued run at once; flag a running one for its worker. Returns the new status."""
        with self._tx() as s:
            row = s.get(m.Run, run_id)
            if row is None:
                return None
            if row.status == RunStatus.QUEUED.value:
                row.status = RunStatus.CANCELLED.value
                row.finished_at = time.time()
            elif row.status == RunStatus.RUNNING.value:
                row.cancel_requested = 1
            return RunStatus(row.status)

    def stale_running(self, older_than_s: float) -> list[RunRecord]:
        cutoff = time.time() - older_than_s
        q = select(m.Run).where(m.Run.status == RunStatus.RUNNING.value,
                                func.coalesce(m.Run.heartbeat_at, m.Run.started_at, 0) < cutoff)
        with self._read() as s:
            return [RunRecord.from_row(r) for r in s.scalars(q)]

    def delete_run(self, run_id: int) -> None:
        with self._tx() as s:
            s.execute(delete(m.Run).where(m.Run.id == run_id))

    # ------------------------------------------------------------------ device lease, queue order, resume
    # One running run per device: the lease is a `meta` row `device:<name>` = {"run_id", "worker_id"},
    # taken in the same BEGIN IMMEDIATE transaction as the claim. It is free again as soon as its
    # run is no longer `running` (finished, or marked interrupted by stale-run cleanup), so a dead
    # worker never needs to release it.
    def claim_next_on_device(self, worker_id: str, device: str, worker_pid: int | None = None) -> RunRecord | None:
        """`claim_next`, but only while no other run holds `device`; records the lease."""
        now = time.time()
        key = f"device:{device}"[:64]
        with self._tx() as s:
            lease = s.get(m.Meta, key)
            if lease is not None:
                holder = s.get(m.Run, json.loads(lease.value).get("run_id"))
                if holder is not None and holder.status == RunStatus.RUNNING.value:
                    return None
            candidate = _next_readable_queued(s, now)
            if candidate is None:
                return None
            s.execute(update(m.Run).where(m.Run.id == candidate)
                      .values(status=RunStatus.RUNNING.value, worker_id=worker_id,
                              worker_pid=worker_pid if worker_pid is not None else os.getpid(),
                              started_at=now, heartbeat_at=now, finished_at=None))
            s.merge(m.Meta(key=key, value=json.dumps({"run_id": candidate, "worker_id": worker_id, "time": now})))
            return RunRecord.from_row(s.get(m.Run, candidate))

    def move_queued(self, run_id: int, position: int) -> bool:
        """Move a queued run to `position` (0 = next to run) of the queue; False if it is not queued."""
        with self._tx() as s:
            rows = list(s.scalars(select(m.Run).where(m.Run.status == RunStatus.QUEUED.value)
                                  .order_by(m.Run.queue_order, m.Run.id)))
            mine = next((r for r in rows if r.id == run_id), None)
            if mine is None:
                return False
            rest = [r for r in rows if r.id != run_id]
            position = max(0, min(position, len(rest)))
            # Between its new neighbours, so nothing else moves and later submissions stay behind.
            if not rest:
                return True
            if position == 0:
                mine.queue_order = rest[0].queue_order - 1.0
            elif position == len(rest):
                mine.queue_order = math.nextafter(rest[-1].queue_order, math.inf)
            else:
                mine.queue_order = (rest[position - 1].queue_order + rest[position].queue_order) / 2
            return True

    def requeue(self, run_id: int) -> bool:
        """Put an interrupted, cancelled or failed run back at the end of the queue (same id, same history)."""
        ended = [RunStatus.INTERRUPTED.value, RunStatus.CANCELLED.value, RunStatus.FAILED.value]
        with self._tx() as s:
            result = s.execute(update(m.Run).where(m.Run.id == run_id, m.Run.status.in_(ended))
                               .values(status=RunStatus.QUEUED.value, queue_order=time.time(), cancel_requested=0,
                                       finished_at=None, exit_code=None, child_pid=None, error_summary=None,
                                       error_detail=None))
            return result.rowcount == 1

    def truncate_metrics(self, run_id: int, after_step: int) -> int:
        """Delete a run's metric rows with step > after_step (a resume redoes those steps); rebuilds its rollups."""
        with self._tx() as s:
            n = s.execute(delete(m.Metric).where(m.Metric.run_id == run_id, m.Metric.step > after_step)).rowcount
            if n:
                s.execute(delete(m.MetricRollup).where(m.MetricRollup.run_id == run_id))
                s.execute(_METRIC_ROLLUP_REBUILD, {"run_id": run_id})
            return n

    # ------------------------------------------------------------------ workers
    # A worker's presence is a `meta` row `worker:<id>` = {"pid", "host", "time"}, refreshed
    # while it lives (idle or busy), so `tunedeck run` can tell whether anyone will take its run.
    def worker_beat(self, worker_id: str, pid: int, host: str) -> None:
        key = f"worker:{worker_id}"[:64]
        value = json.dumps({"worker_id": worker_id, "pid": pid, "host": host, "time": time.time()})
        with self._tx() as s:
            s.merge(m.Meta(key=key, value=value))

    def worker_gone(self, worker_id: str) -> None:
        with self._tx() as s:
            s.execute(delete(m.Meta).where(m.Meta.key == f"worker:{worker_id}"[:64]))

    def live_workers(self, within_s: float = 10.0) -> list[dict[str, Any]]:
        """Workers that announced themselves in the last `within_s` seconds."""
        cutoff = time.time() - within_s
        with self._read() as s:
            rows = [json.loads(v) for v in s.scalars(select(m.Meta.value).where(m.Meta.key.like("worker:%")))]
        return [r for r in rows if r.get("time", 0) >= cutoff]

    # ------------------------------------------------------------------ metrics
    def add_metrics(self, run_id: int, points: Iterable[MetricPoint]) -> int:
        """Insert metric rows in one transaction; returns how many rows were written now.

        A write lock held by someone else is waited out (busy timeout), then retried with backoff
        for WRITE_RETRY_S; if it is still locked the rows are kept and written first by the next
        call (or `flush_unwritten`), so a locked database never loses a row or fails training.
        """
        rows = [{"run_id": run_id, "step": p.step, "name": p.name, "value": _finite_or_none(p.value), "time": p.time}
                for p in points]
        with self._buffer_lock:
            if rows:
                self._unwritten.append((run_id, rows))
            batch = [r for _, rs in self._unwritten for r in rs]
            if not batch:
                return 0
            try:
                self._retrying(lambda: self._insert_metrics(batch), "add_metrics")
            except (OperationalError, sqlite3.OperationalError) as exc:
                if not is_locked_error(exc):
                    if rows:  # not a lock: these rows can never be written; keep the older ones
                        self._unwritten.pop()
                    raise
                log.error("add_metrics: database still locked after %.0f s; keeping %d rows for the next write",
                          WRITE_RETRY_S, len(batch))
                return 0
            self._unwritten.clear()
            return len(batch)

    def flush_unwritten(self) -> int:
        """Write metric rows kept back by a locked database; returns how many were written."""
        return self.add_metrics(0, [])

    def _insert_metrics(self, rows: list[dict[str, Any]]) -> None:
        with self._tx() as s:
            # The write lock is ours (BEGIN IMMEDIATE), so every id above `before` is one of these rows.
            before = s.scalar(select(func.coalesce(func.max(m.Metric.id), 0)))
            s.execute(m.Metric.__table__.insert(), rows)
            s.execute(_METRIC_ROLLUP_UPSERT, {"after": before})

    def metrics(self, run_id: int, names: Sequence[str] | None = None) -> list[MetricPoint]:
        q = select(m.Metric.step, m.Metric.name, m.Metric.value, m.Metric.time).where(m.Metric.run_id == run_id)
        if names is not None:
            q = q.where(m.Metric.name.in_(list(names)))
        q = q.order_by(m.Metric.name, m.Metric.step, m.Metric.id)
        with self._read() as s:
            return [MetricPoint(st, n, _nan_if_none(v), t) for st, n, v, t in s.execute(q)]

    def metric_names(self, run_id: int) -> list[str]:
        with self._read() as s:
            return list(s.scalars(select(m.Metric.name).where(m.Metric.run_id == run_id).distinct()))

    def last_metric(self, run_id: int, name: str) -> MetricPoint | None:
        q = (select(m.Metric.step, m.Metric.name, m.Metric.value, m.Metric.time)
             .where(m.Metric.run_id == run_id, m.Metric.name == name).order_by(m.Metric.id.desc()).limit(1))
        with self._read() as s:
            r = s.execute(q).first()
            return MetricPoint(r[0], r[1], _nan_if_none(r[2]), r[3]) if r else None

    def metric_buckets(self, run_id: int, name: str, width: int, after_step: int = -1) -> list[MetricBucket]:
        """One metric grouped in SQL into buckets of `width` steps (bucket = step // width), min/max kept.

        `after_step` reads only newer rows (an index range scan), so a live graph can be kept up to date
        without rescanning a long run.
        """
        step = m.Metric.step
        bucket = (step if width <= 1 else func.cast(step / width, Integer)).label("b")
        q = (select(bucket, func.min(step), func.max(step), func.min(m.Metric.value), func.max(m.Metric.value),
                    func.sum(m.Metric.value), func.count())
             .where(m.Metric.run_id == run_id, m.Metric.name == name, step > after_step)
             .group_by("b").order_by("b"))
        with self._read() as s:
            return [MetricBucket(*r[1:]) for r in s.execute(q)]

    def metric_extent(self, run_id: int, name: str) -> tuple[int, int] | None:
        """(first step, last step) of one metric of a run, from the index alone; None when it has no rows."""
        # Two scalar subqueries: SQLite answers a lone MIN() or MAX() from the index in O(log n),
        # but scans every row when both share one SELECT.
        cond = (m.Metric.run_id == run_id, m.Metric.name == name)
        q = select(select(func.min(m.Metric.step)).where(*cond).scalar_subquery(),
                   select(func.max(m.Metric.step)).where(*cond).scalar_subquery())
        with self._read() as s:
            lo, hi = s.execute(q).one()
            return None if lo is None else (int(lo), int(hi))

    def metric_series(self, run_id: int, name: str, width: int, from_step: int = 0) -> list[MetricBucket]:
        """Same buckets as `metric_buckets` (bucket = step // width), read from the rollup table.

        `width` a power of two: the coarsest rollup level <= width is regrouped in SQL (<= 16 rollup
        rows per bucket), so the cost follows the number of buckets, not of raw rows; narrower
        widths read raw rows. `from_step` (a multiple of `width`) skips older buckets.
        """
        k = width.bit_length() - 1
        level = max((lv for lv in METRIC_LEVELS if lv <= k), default=None)
        if width < 1 or width != 1 << k or level is None:
            return self.metric_buckets(run_id, name, width, after_step=from_step - 1)
        r = m.MetricRollup
        b = r.bucket.op(">>")(k - level).label("b")
        q = (select(b, func.min(r.first_step), func.max(r.last_step), func.min(r.value_min), func.max(r.value_max),
                    func.sum(r.value_sum), func.sum(r.row_count))
             .where(r.run_id == run_id, r.name == name, r.level == level, r.bucket >= (max(0, from_step) >> level))
             .group_by("b").order_by("b"))
        with self._read() as s:
            return [MetricBucket(*row[1:]) for row in s.execute(q)]

    def last_metric_values(self, run_ids: Sequence[int], name: str) -> dict[int, float]:
        """The value at the highest step of one metric for each of several runs (for run tables)."""
        if not run_ids:
            return {}
        inner = (select(m.Metric.run_id, func.max(m.Metric.step).label("step"))
                 .where(m.Metric.run_id.in_(list(run_ids)), m.Metric.name == name)
                 .group_by(m.Metric.run_id).subquery())
        q = (select(m.Metric.run_id, m.Metric.value)
             .join(inner, (m.Metric.run_id == inner.c.run_id) & (m.Metric.step == inner.c.step))
             .where(m.Metric.name == name).order_by(m.Metric.id))
        with self._read() as s:
            return {run_id: _nan_if_none(value) for run_id, value in s.execute(q)}

    # ------------------------------------------------------------------ memory
    def add_memory_samples(self, samples: Iterable[MemoryPoint]) -> int:
        rows = [{k: getattr(p, k) for k in _MEMORY_FIELDS} for p in samples]
        if not rows:
            return 0

        def write() -> None:
            with self._tx() as s:
                before = s.scalar(select(func.coalesce(func.max(m.MemorySample.id), 0)))
                s.execute(m.MemorySample.__table__.insert(), rows)
                if any(r["run_id"] is not None for r in rows):
                    s.execute(_MEMORY_ROLLUP_UPSERT, {"after": before})

        self._retrying(write, "add_memory_samples")
        return len(rows)

    def memory_samples(self, run_id: int | None = None, since: float | None = None,
                       source: str | None = None, limit: int | None = None) -> list[MemoryPoint]:
        """Samples in time order; run_id=None means every sample (also those of no run)."""
        q = select(m.MemorySample)
        if run_id is not None:
            q = q.where(m.MemorySample.run_id == run_id)
        if since is not None:
            q = q.where(m.MemorySample.time >= since)
        if source is not None:
            q = q.where(m.MemorySample.source == source)
        q = q.order_by(m.MemorySample.time, m.MemorySample.id)
        if limit is not None:
            q = q.limit(limit)
        with self._read() as s:
            return [MemoryPoint(**{k: getattr(r, k) for k in _MEMORY_FIELDS}) for r in s.scalars(q)]

    def memory_buckets(self, run_id: int | None, origin: float, width: float,
                       after: float | None = None) -> list[MemoryBucket]:
        """Memory samples grouped in SQL per source into time buckets floor((time - origin) / width).

        run_id=None groups every sample (the GPU panel); `after` reads only newer samples.
        """
        t = m.MemorySample
        where = [t.time >= origin]
        if run_id is not None:
            where.append(t.run_id == run_id)
        if after is not None:
            where.append(t.time > after)
        bucket = func.cast((t.time - origin) / width, Integer).label("b")
        q = (select(bucket, t.source, func.min(t.time), func.max(t.time),
                    func.min(t.used_bytes), func.max(t.used_bytes), func.max(t.total_bytes), func.max(t.utilization),
                    func.max(t.torch_allocated), func.max(t.torch_reserved),
                    func.min(t.process_rss), func.max(t.process_rss), func.count())
             .where(*where).group_by("b", t.source).order_by("b"))
        with self._read() as s:
            return [MemoryBucket(*r[1:]) for r in s.execute(q)]

    def memory_series(self, run_id: int, width: float, from_time: float = 0.0) -> list[MemoryBucket]:
        """One run's samples per source in time buckets floor(time / width), width = 2**k / 16 s.

        Buckets are aligned at time 0 so they match the rollup table, which is read when a level
        fits (cost follows the number of buckets); narrower widths read raw samples.
        `from_time` (a multiple of `width`) skips older buckets.
        """
        k = round(math.log2(width * 16))
        if k < 0 or width * 16 != 2 ** k:
            raise ValueError(f"memory bucket width must be 2**k / 16 s, got {width}")
        level = max((lv for lv in MEMORY_LEVELS if lv <= k), default=None)
        if level is None:
            t = m.MemorySample
            b = func.cast(t.time * 16, Integer).op(">>")(k).label("b")
            q = (select(b, t.source, func.min(t.time), func.max(t.time),
                        func.min(t.used_bytes), func.max(t.used_bytes), func.max(t.total_bytes), func.max(t.utilization),
                        func.max(t.torch_allocated), func.max(t.torch_reserved),
                        func.min(t.process_rss), func.max(t.process_rss), func.count())
                 .where(t.run_id == run_id, t.time >= from_time).group_by("b", t.source).order_by("b", t.source))
        else:
            r = m.MemoryRollup
            b = r.bucket.op(">>")(k - level).label("b")
            first = (math.floor(from_time * 16) >> k) << (k - level) if from_time > 0 else 0
            q = (select(b, r.source, func.min(r.first_time), func.max(r.last_time),
                        func.min(r.used_min), func.max(r.used_max), func.max(r.total_max), func.max(r.utilization_max),
                        func.max(r.torch_allocated_max), func.max(r.torch_reserved_max),
                        func.min(r.rss_min), func.max(r.rss_max), func.sum(r.row_count))
                 .where(r.run_id == run_id, r.level == level, r.bucket >= first)
                 .group_by("b", r.source).order_by("b", r.source))
        with self._read() as s:
            return [MemoryBucket(*row[1:]) for row in s.execute(q)]

    def memory_extent(self, run_id: int | None = None) -> tuple[float, float] | None:
        """(first, last) sample time of a run's memory samples (all samples for None)."""
        t = m.MemorySample
        cond = (t.run_id == run_id,) if run_id is not None else ()
        q = select(select(func.min(t.time)).where(*cond).scalar_subquery(),
                   select(func.max(t.time)).where(*cond).scalar_subquery())
        with self._read() as s:
            lo, hi = s.execute(q).one()
            return None if lo is None else (float(lo), float(hi))

    # ------------------------------------------------------------------ artifacts
    def add_artifact(self, run_id: int, kind: str, path: str, size: int, sha256: str) -> int:
        with self._tx() as s:
            row = m.Artifact(run_id=run_id, kind=kind, path=path, size=size, sha256=sha256, created_at=time.time())
            s.add(row)
            s.flush()
            return row.id

    def artifact_paths(self, kind: str) -> list[str]:
        """Paths of every run's artifacts of one kind (e.g. the downloadable `bundle` zips)."""
        with self._read() as s:
            return list(s.scalars(select(m.Artifact.path).where(m.Artifact.kind == kind).order_by(m.Artifact.id)))

    def artifacts(self, run_id: int) -> list[ArtifactRecord]:
        q = select(m.Artifact).where(m.Artifact.run_id == run_id).order_by(m.Artifact.id)
        with self._read() as s:
            return [ArtifactRecord(a.id, a.run_id, a.kind, a.path, a.size, a.sha256, a.created_at) for a in s.scalars(q)]


# Statements that bring a database from version N-1 to N. Append, never edit.
MIGRATIONS: dict[int, list[str]] = {
    # 2: rollup tables (created by create_all just before migrations run), backfilled from the raw rows.
    2: [
        "INSERT INTO metric_rollups (run_id, name, level, bucket, first_step, last_step, value_min, value_max, "
        "value_sum, row_count) SELECT x.run_id, x.name, lv.level, x.step >> lv.level, min(x.step), max(x.step), "
        "min(x.value), max(x.value), sum(x.value), count(*) FROM metrics AS x, (SELECT 4 AS level UNION ALL "
        "SELECT 8 UNION ALL SELECT 12 UNION ALL SELECT 16) AS lv WHERE true "
        "GROUP BY x.run_id, x.name, lv.level, x.step >> lv.level",
        "INSERT INTO memory_rollups (run_id, source, level, bucket, first_time, last_time, used_min, used_max, "
        "total_max, utilization_max, torch_allocated_max, torch_reserved_max, rss_min, rss_max, row_count) "
        "SELECT x.run_id, x.source, lv.level, CAST(x.time * 16 AS INTEGER) >> lv.level, min(x.time), max(x.time), "
        "min(x.used_bytes), max(x.used_bytes), max(x.total_bytes), max(x.utilization), max(x.torch_allocated), "
        "max(x.torch_reserved), min(x.process_rss), max(x.process_rss), count(*) FROM memory_samples AS x, "
        "(SELECT 4 AS level UNION ALL SELECT 8 UNION ALL SELECT 12 UNION ALL SELECT 16) AS lv "
        "WHERE x.run_id IS NOT NULL GROUP BY x.run_id, x.source, lv.level, CAST(x.time * 16 AS INTEGER) >> lv.level",
    ],
    # 3: metrics.value nullable (NULL = a non-finite value; SQLite turns NaN into NULL): SQLite cannot
    # drop a NOT NULL, so the table is rebuilt (ids kept, so the rollups stay valid).
    3: [
        "CREATE TABLE metrics_v3 (id INTEGER NOT NULL, run_id INTEGER NOT NULL, step INTEGER NOT NULL, "
        "name VARCHAR(128) NOT NULL, value FLOAT, time FLOAT NOT NULL, PRIMARY KEY (id), "
        "FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE)",
        "INSERT INTO metrics_v3 (id, run_id, step, name, value, time) SELECT id, run_id, step, name, value, time "
        "FROM metrics",
        "DROP TABLE metrics",
        "ALTER TABLE metrics_v3 RENAME TO metrics",
        "CREATE INDEX ix_metrics_run_name_step ON metrics (run_id, name, step)",
    ],
}

# ---------------------------------------------------------------------- rollups
# Levels kept in the rollup tables: buckets of 2**level steps (metrics) or 2**level / 16 s (memory).
# Every 4th power of two, so a graph at any power-of-two width reads at most 16 rollup rows per
# bucket, while each write touches only len(LEVELS) rollup rows per series.
METRIC_LEVELS = (4, 8, 12, 16)
MEMORY_LEVELS = (4, 8, 12, 16)


def _levels_sql(levels: Sequence[int]) -> str:
    return " UNION ALL ".join(f"SELECT {lv}" + (" AS level" if i == 0 else "") for i, lv in enumerate(levels))


def _least(col: str, table: str) -> str:
    """min() of the stored and the new value, ignoring NULLs (SQLite's two-argument min() does not)."""
    return f"{col} = coalesce(min({table}.{col}, excluded.{col}), {table}.{col}, excluded.{col})"


def _greatest(col: str, table: str) -> str:
    return f"{col} = coalesce(max({table}.{col}, excluded.{col}), {table}.{col}, excluded.{col})"


# Folds the rows with id > :after into the rollups, in the writer's transaction (one statement).
_METRIC_ROLLUP_UPSERT = text(
    "INSERT INTO metric_rollups (run_id, name, level, bucket, first_step, last_step, value_min, value_max, "
    "value_sum, row_count) "
    "SELECT x.run_id, x.name, lv.level, x.step >> lv.level, min(x.step), max(x.step), min(x.value), max(x.value), "
    f"sum(x.value), count(*) FROM metrics AS x, ({_levels_sql(METRIC_LEVELS)}) AS lv "
    "WHERE x.id > :after AND x.value IS NOT NULL "
    "GROUP BY x.run_id, x.name, lv.level, x.step >> lv.level "
    "ON CONFLICT (run_id, name, level, bucket) DO UPDATE SET "
    + ", ".join([_least("first_step", "metric_rollups"), _greatest("last_step", "metric_rollups"),
                 _least("value_min", "metric_rollups"), _greatest("value_max", "metric_rollups"),
                 "value_sum = metric_rollups.value_sum + excluded.value_sum",
                 "row_count = metric_rollups.row_count + excluded.row_count"]))

_MEMORY_ROLLUP_UPSERT = text(
    "INSERT INTO memory_rollups (run_id, source, level, bucket, first_time, last_time, used_min, used_max, "
    "total_max, utilization_max, torch_allocated_max, torch_reserved_max, rss_min, rss_max, row_count) "
    "SELECT x.run_id, x.source, lv.level, CAST(x.time * 16 AS INTEGER) >> lv.level, min(x.time), max(x.time), "
    "min(x.used_bytes), max(x.used_bytes), max(x.total_bytes), max(x.utilization), max(x.torch_allocated), "
    "max(x.torch_reserved), min(x.process_rss), max(x.process_rss), count(*) "
    f"FROM memory_samples AS x, ({_levels_sql(MEMORY_LEVELS)}) AS lv "
    "WHERE x.id > :after AND x.run_id IS NOT NULL "
    "GROUP BY x.run_id, x.source, lv.level, CAST(x.time * 16 AS INTEGER) >> lv.level "
    "ON CONFLICT (run_id, level, source, bucket) DO UPDATE SET "
    + ", ".join([_least("first_time", "memory_rollups"), _greatest("last_time", "memory_rollups"),
                 _least("used_min", "memory_rollups"), _greatest("used_max", "memory_rollups"),
                 _greatest("total_max", "memory_rollups"), _greatest("utilization_max", "memory_rollups"),
                 _greatest("torch_allocated_max", "memory_rollups"), _greatest("torch_reserved_max", "memory_rollups"),
                 _least("rss_min", "memory_rollups"), _greatest("rss_max", "memory_rollups"),
                 "row_count = memory_rollups.row_count + excluded.row_count"]))


# Rebuilds one run's metric rollups from its raw rows (after `truncate_metrics`).
_METRIC_ROLLUP_REBUILD = text(
    "INSERT INTO metric_rollups (run_id, name, level, bucket, first_step, last_step, value_min, value_max, "
    "value_sum, row_count) "
    "SELECT x.run_id, x.name, lv.level, x.step >> lv.level, min(x.step), max(x.step), min(x.value), max(x.value), "
    f"sum(x.value), count(*) FROM metrics AS x, ({_levels_sql(METRIC_LEVELS)}) AS lv "
    "WHERE x.run_id = :run_id AND x.value IS NOT NULL "
    "GROUP BY x.run_id, x.name, lv.level, x.step >> lv.level")


def _finite_or_none(value: float) -> float | None:
    """Non-finite metric values are stored as NULL (SQLite would turn NaN into NULL anyway)."""
    value = float(value)
    return value if math.isfinite(value) else None


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else float(value)
