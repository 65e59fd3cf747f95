"""The one owner of the database: every SQL statement tunedeck runs is a method here.

    store = Store()                       # TUNEDECK_DATABASE_URL or ./data/tunedeck.db
    run_id = store.create_run(spec)
    run = store.claim_next_on_device("host:1", "0")   # atomic: two workers never get the same run

Each call opens a short session and closes it. On SQLite every connection gets WAL, a busy
timeout and foreign keys; write transactions start with BEGIN IMMEDIATE so a claim is one
serialised transaction, reads use a plain deferred BEGIN and never wait for writers.

`Store` is composed of small parts, all inside this package: run rows in `store_runs.py` (every status
change of a run or a task is a move of `lifecycle.py`'s table), claims and
device leases (one run per device, or several sharing it) in `store_leases.py`, runs handed to a
cluster's scheduler in `store_engine.py`, metric
and memory series in `store_series.py`, run events, device facts and sweeps in `store_events.py`,
tags, notes and deletion in `store_manage.py`, tasks for workers (exports, pushes) in `store_tasks.py`, chat sessions and replies in `store_chat.py`, hyperparameter searches in `store_search.py`, change stamps for live pages in `store_watch.py`, records in `records.py`, rollup SQL in `rollups.py`,
migrations in `migrations.py`, the store's errors and lock retries in `errors.py`; what the mixins share of `Store` is
and its engines and sessions are in `store_core.py`. Every name is importable from here.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from sqlalchemy import select

from storage import models as m
from storage.errors import Conflict, DatabaseUnavailable, StorageError, is_locked_error, translated
from storage.identity import RunFolderError, claim_folder, ensure_identity
from storage.migrations import MIGRATIONS, migrate
from storage.records import ArtifactRecord, MemoryBucket, MemoryPoint, MetricBucket, MetricPoint, RunControl, RunRecord
from storage.rollups import MEMORY_LEVELS, METRIC_LEVELS
from storage.settings import data_dir, database_url
from storage.store_chat import ChatMessageRecord, ChatMixin, ChatSessionRecord
from storage.store_core import BUSY_TIMEOUT_MS, WRITE_RETRY_S
from storage.store_engine import EngineRunsMixin
from storage.store_events import EventsMixin
from storage.store_leases import DeviceShare, LeasesMixin
from storage.store_manage import ManageMixin, RunningRunError
from storage.store_runs import RunsMixin
from storage.store_scores import Score, ScoreRecord, ScoresMixin
from storage.store_search import SearchMixin, SearchRecord, TrialRecord
from storage.store_series import SeriesMixin
from storage.store_tasks import TaskControl, TaskRecord, TasksMixin
from storage.store_watch import WatchMixin

__all__ = [
    "ArtifactRecord",
    "BUSY_TIMEOUT_MS",
    "ChatMessageRecord",
    "ChatSessionRecord",
    "Conflict",
    "DatabaseUnavailable",
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
    "Score",
    "ScoreRecord",
    "SearchRecord",
    "Store",
    "StorageError",
    "TaskControl",
    "TaskRecord",
    "TrialRecord",
    "WRITE_RETRY_S",
    "is_locked_error",
]

log = logging.getLogger(__name__)


class Store(
    RunsMixin,
    LeasesMixin,
    EngineRunsMixin,
    SeriesMixin,
    EventsMixin,
    ManageMixin,
    WatchMixin,
    TasksMixin,
    ChatMixin,
    ScoresMixin,
    SearchMixin,
):
    """All database access for tunedeck. Cheap to create; safe to use from many threads."""

    def __init__(self, url: str | None = None):
        self._connect(url or database_url())
        self._migrate()

    def _migrate(self) -> None:
        """Create tables, bring an older database up to SCHEMA_VERSION, and read (or write) its identity."""
        with translated():
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

    def rewrite_artifact(self, run_id: int, kind: str, path: str, size: int, sha256: str) -> None:
        """A recorded file rewritten in place (a bundle whose card gained scores): its size and sha256 updated,
        or recorded when it was not."""
        with self._tx() as s:
            rows = list(
                s.scalars(
                    select(m.Artifact).where(
                        m.Artifact.run_id == run_id, m.Artifact.kind == kind, m.Artifact.path == path
                    )
                )
            )
            for row in rows:
                row.size, row.sha256 = size, sha256
            if not rows:
                s.add(m.Artifact(run_id=run_id, kind=kind, path=path, size=size, sha256=sha256, created_at=time.time()))

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
