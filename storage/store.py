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
import os
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

from contextlib import contextmanager
from sqlalchemy import create_engine, delete, event, func, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from jobs.spec import JobSpec
from storage import models as m
from storage.models import RunStatus
from storage.settings import database_url

BUSY_TIMEOUT_MS = 30_000


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
            id=row.id, name=row.name, spec=JobSpec.from_json(row.spec_json), status=RunStatus(row.status),
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
            candidate = s.scalars(select(m.Run.id).where(m.Run.status == RunStatus.QUEUED.value)
                                  .order_by(m.Run.queue_order, m.Run.id).limit(1)).first()
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
        with self._tx() as s:
            s.execute(update(m.Run).where(m.Run.id == run_id).values(**values))

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

    # ------------------------------------------------------------------ metrics
    def add_metrics(self, run_id: int, points: Iterable[MetricPoint]) -> int:
        rows = [{"run_id": run_id, "step": p.step, "name": p.name, "value": float(p.value), "time": p.time}
                for p in points]
        if not rows:
            return 0
        with self._tx() as s:
            s.execute(m.Metric.__table__.insert(), rows)
        return len(rows)

    def metrics(self, run_id: int, names: Sequence[str] | None = None) -> list[MetricPoint]:
        q = select(m.Metric.step, m.Metric.name, m.Metric.value, m.Metric.time).where(m.Metric.run_id == run_id)
        if names is not None:
            q = q.where(m.Metric.name.in_(list(names)))
        q = q.order_by(m.Metric.name, m.Metric.step, m.Metric.id)
        with self._read() as s:
            return [MetricPoint(*r) for r in s.execute(q)]

    def metric_names(self, run_id: int) -> list[str]:
        with self._read() as s:
            return list(s.scalars(select(m.Metric.name).where(m.Metric.run_id == run_id).distinct()))

    def last_metric(self, run_id: int, name: str) -> MetricPoint | None:
        q = (select(m.Metric.step, m.Metric.name, m.Metric.value, m.Metric.time)
             .where(m.Metric.run_id == run_id, m.Metric.name == name).order_by(m.Metric.id.desc()).limit(1))
        with self._read() as s:
            r = s.execute(q).first()
            return MetricPoint(*r) if r else None

    # ------------------------------------------------------------------ memory
    def add_memory_samples(self, samples: Iterable[MemoryPoint]) -> int:
        rows = [{k: getattr(p, k) for k in _MEMORY_FIELDS} for p in samples]
        if not rows:
            return 0
        with self._tx() as s:
            s.execute(m.MemorySample.__table__.insert(), rows)
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

    # ------------------------------------------------------------------ artifacts
    def add_artifact(self, run_id: int, kind: str, path: str, size: int, sha256: str) -> int:
        with self._tx() as s:
            row = m.Artifact(run_id=run_id, kind=kind, path=path, size=size, sha256=sha256, created_at=time.time())
            s.add(row)
            s.flush()
            return row.id

    def artifacts(self, run_id: int) -> list[ArtifactRecord]:
        q = select(m.Artifact).where(m.Artifact.run_id == run_id).order_by(m.Artifact.id)
        with self._read() as s:
            return [ArtifactRecord(a.id, a.run_id, a.kind, a.path, a.size, a.sha256, a.created_at) for a in s.scalars(q)]


# Statements that bring a database from version N-1 to N. Append, never edit.
MIGRATIONS: dict[int, list[str]] = {}
