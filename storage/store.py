"""The one owner of the database: every SQL statement tunedeck runs is a method here.

    store = Store()                       # TUNEDECK_DATABASE_URL or ./data/tunedeck.db
    run_id = store.create_run(spec)
    run = store.claim_next_on_device("host:1", "0")   # atomic: two workers never get the same run

Each call opens a short session and closes it. On SQLite every connection gets WAL, a busy
timeout and foreign keys; write transactions start with BEGIN IMMEDIATE so a claim is one
serialised transaction, reads use a plain deferred BEGIN and never wait for writers.

`Store` is composed of small parts, all inside this package: run rows in `store_runs.py`, claims and
device leases (one run per device, or several sharing it) in `store_leases.py`, metric
and memory series in `store_series.py`, run events, device facts and sweeps in `store_events.py`,
tags, notes and deletion in `store_manage.py`, change stamps for live pages in `store_watch.py`, records in `records.py`, rollup SQL in `rollups.py`,
migrations in `migrations.py`, lock retries in `retry.py`; what the mixins share of `Store` is
declared in `store_core.py`. Every name is importable from here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Float, create_engine, event, func, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.elements import ColumnElement

from storage import models as m
from storage.identity import RunFolderError, claim_folder, ensure_identity
from storage.migrations import MIGRATIONS, migrate
from storage.records import ArtifactRecord, MemoryBucket, MemoryPoint, MetricBucket, MetricPoint, RunControl, RunRecord
from storage.retry import call_retrying, is_locked_error
from storage.rollups import MEMORY_LEVELS, METRIC_LEVELS
from storage.settings import data_dir, database_url
from storage.store_events import EventsMixin
from storage.store_leases import DeviceShare, LeasesMixin
from storage.store_manage import ManageMixin, RunningRunError
from storage.store_runs import RunsMixin
from storage.store_series import SeriesMixin
from storage.store_watch import WatchMixin

__all__ = [
    "ArtifactRecord",
    "BUSY_TIMEOUT_MS",
    "DeviceShare",
    "MEMORY_LEVELS",
    "METRIC_LEVELS",
    "MIGRATIONS",
    "MemoryBucket",
    "MemoryPoint",
    "MetricBucket",
    "MetricPoint",
    "RunControl",
    "RunFolderError",
    "RunRecord",
    "RunningRunError",
    "Store",
    "WRITE_RETRY_S",
    "is_locked_error",
]

BUSY_TIMEOUT_MS = 30_000
# Metric/memory writes retry "database is locked" (a lock held past the busy timeout) with
# exponential backoff for this long before their rows are kept in memory for the next write.
WRITE_RETRY_S = 120.0

log = logging.getLogger(__name__)
T = TypeVar("T")


class Store(RunsMixin, LeasesMixin, SeriesMixin, EventsMixin, ManageMixin, WatchMixin):
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

    def _db_now(self) -> ColumnElement[float]:
        """The database server's clock as epoch seconds (an SQL expression): one clock for every host."""
        if self._sqlite:
            return (func.julianday("now") - 2440587.5) * 86400.0
        return func.cast(func.extract("epoch", func.clock_timestamp()), Float)

    def _retrying(self, fn: Callable[[], T], what: str, deadline_s: float | None = None) -> T:
        """Call `fn()` (one whole write transaction) again on 'database is locked', backing off."""
        return call_retrying(
            fn, what, self._retry_window_s() if deadline_s is None else deadline_s, log, self._count_lock_retry
        )

    def _count_lock_retry(self) -> None:
        self.lock_retries += 1

    def _retry_window_s(self) -> float:
        """WRITE_RETRY_S, read at call time (tests shorten it on this module)."""
        return WRITE_RETRY_S

    def _migrate(self) -> None:
        """Create tables, bring an older database up to SCHEMA_VERSION, and read (or write) its identity."""
        m.Base.metadata.create_all(self._write_engine)
        with self._tx() as s:
            migrate(s, self.url)
            self.database_id, self._runs_folder = ensure_identity(s)

    @property
    def runs_root(self) -> Path:
        """This database's own folder of run folders (`storage.identity`)."""
        return data_dir() / self._runs_folder

    def run_path(self, run_id: int) -> Path:
        """The run's folder, neither created nor claimed (for measuring and removing it)."""
        return self.runs_root / f"{int(run_id):06d}"

    def run_dir(self, run_id: int) -> Path:
        """The run's folder under this database's own root (`storage.identity`), created if needed.

        Raises RunFolderError when the folder belongs to another database.
        """
        return claim_folder(self.run_path(run_id), self.database_id, self.url)

    @property
    def schema_version(self) -> int:
        with self._read() as s:
            row = s.get(m.Meta, "schema_version")
            return int(row.value) if row else 0

    def dispose(self) -> None:
        self._write_engine.dispose()
        self._read_engine.dispose()

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
            return [
                ArtifactRecord(a.id, a.run_id, a.kind, a.path, a.size, a.sha256, a.created_at) for a in s.scalars(q)
            ]
