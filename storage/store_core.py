"""The engine and sessions every part of `storage.store.Store` stands on, and what the parts share.

`StoreCore` opens the engines (`_connect`: on SQLite WAL, a busy timeout, foreign keys, and BEGIN
IMMEDIATE for writes) and gives the mixins their plumbing: `_tx()` (one write transaction), `_read()`
(a read session), `_plain_read()` (a plain connection), which raise the store's errors
(`storage.errors`) for SQLAlchemy's, `_db_now()` (the database's clock) and `_retrying()` (lock retries). It is the
base of every mixin, so the mixins call down into it, never up into `store.py`. Two methods come
from sibling mixins and are declared here only (`_unused_run_id` from `ManageMixin`, `set_progress`
from `RunsMixin`): the real definitions come first in `Store`'s MRO, so those bodies never run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import Float, create_engine, event, func
from sqlalchemy.engine import Connection, CursorResult, Engine, Result
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.elements import ColumnElement

from storage.errors import call_retrying, translated

T = TypeVar("T")
log = logging.getLogger("storage.store")

BUSY_TIMEOUT_MS = 30_000
# Metric/memory writes retry "database is locked" (a lock held past the busy timeout) with
# exponential backoff for this long before their rows are kept in memory for the next write.
WRITE_RETRY_S = 120.0


def rowcount(result: Result[Any]) -> int:
    """Rows matched by a plain UPDATE or DELETE (no RETURNING), which the session runs on a DBAPI cursor.

    `Session.execute` is typed as returning `Result`, since some ORM statements yield other results;
    the UPDATE/DELETE statements of the store always yield a `CursorResult`.
    """
    assert isinstance(result, CursorResult), f"expected a CursorResult from UPDATE/DELETE, got {type(result).__name__}"
    return result.rowcount


class StoreCore:
    """The engines, sessions and lock retries `Store` and its mixins use."""

    url: str
    _sqlite: bool  # SQLite (one process-wide writer, BEGIN IMMEDIATE) rather than PostgreSQL
    _read_sessions: sessionmaker[Session]  # read sessions: plain deferred BEGIN, never wait for writers
    _read_engine: Engine  # what read sessions bind to (a plain connection for the cheapest reads)
    _unwritten: list[tuple[int, list[dict[str, Any]]]]  # metric rows kept after lock retries ran out
    _buffer_lock: threading.Lock  # guards `_unwritten`

    def _connect(self, url: str) -> None:
        self.url = url
        self._sqlite = url.startswith("sqlite")
        self._write_engine = self._make_engine(immediate=True)
        self._read_engine = self._make_engine(immediate=False) if self._sqlite else self._write_engine
        self._write = sessionmaker(self._write_engine, expire_on_commit=False)
        self.lock_retries = 0  # how often a write met 'database is locked' and was retried
        self._unwritten = []
        self._buffer_lock = threading.Lock()
        self._read_sessions = sessionmaker(self._read_engine, expire_on_commit=False)

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

    # The store's session boundary: every session and connection is opened by one of these three, and
    # each raises SQLAlchemy's errors as the store's own (`storage.errors`), so callers outside
    # storage/ catch `StorageError` and never import sqlalchemy.
    @contextmanager
    def _tx(self) -> Iterator[Session]:
        """One write session inside one transaction (BEGIN IMMEDIATE on SQLite)."""
        with translated(), self._write() as session, session.begin():
            yield session

    @contextmanager
    def _read(self) -> Iterator[Session]:
        """One read session (a plain deferred BEGIN: it never waits for writers)."""
        with translated(), self._read_sessions() as session:
            yield session

    @contextmanager
    def _plain_read(self) -> Iterator[Connection]:
        """A plain connection for the cheapest reads (no ORM session)."""
        with translated(), self._read_engine.connect() as conn:
            yield conn

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

    def _unused_run_id(self, s: Session) -> int | None:
        """An explicit id for a new run (`ManageMixin`), or None to let the database pick."""
        raise NotImplementedError

    def set_progress(self, run_id: int, step: int, total_steps: int | None = None) -> None:
        """The training child's step report (`RunsMixin`)."""
        raise NotImplementedError
