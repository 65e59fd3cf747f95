"""What the parts of `storage.store.Store` share, declared once so each mixin is type-checked on its own.

`Store` sets the attributes in its `__init__` and defines the plumbing methods; two methods come
from sibling mixins (`_unused_run_id` from `ManageMixin`, `set_progress` from `RunsMixin`). Every
mixin derives from `StoreCore`, which comes last in `Store`'s MRO, so the real definitions always
win and the bodies here never run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from sqlalchemy.engine import CursorResult, Engine, Result
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.elements import ColumnElement

T = TypeVar("T")


def rowcount(result: Result[Any]) -> int:
    """Rows matched by a plain UPDATE or DELETE (no RETURNING), which the session runs on a DBAPI cursor.

    `Session.execute` is typed as returning `Result`, since some ORM statements yield other results;
    the UPDATE/DELETE statements of the store always yield a `CursorResult`.
    """
    assert isinstance(result, CursorResult), f"expected a CursorResult from UPDATE/DELETE, got {type(result).__name__}"
    return result.rowcount


class StoreCore:
    """The state and plumbing `Store` provides to its mixins."""

    _sqlite: bool  # SQLite (one process-wide writer, BEGIN IMMEDIATE) rather than PostgreSQL
    _read: sessionmaker[Session]  # read sessions: plain deferred BEGIN, never wait for writers
    _read_engine: Engine  # what `_read` sessions bind to (a plain connection for the cheapest reads)
    _unwritten: list[tuple[int, list[dict[str, Any]]]]  # metric rows kept after lock retries ran out
    _buffer_lock: threading.Lock  # guards `_unwritten`

    def _tx(self) -> AbstractContextManager[Session]:
        """One write session inside one transaction (BEGIN IMMEDIATE on SQLite)."""
        raise NotImplementedError

    def _db_now(self) -> ColumnElement[float]:
        """The database server's clock as epoch seconds (an SQL expression)."""
        raise NotImplementedError

    def _retrying(self, fn: Callable[[], T], what: str, deadline_s: float | None = None) -> T:
        """Call `fn()` (one whole write transaction) again on 'database is locked', backing off."""
        raise NotImplementedError

    def _retry_window_s(self) -> float:
        """How long a write retries a locked database before giving up."""
        raise NotImplementedError

    def _unused_run_id(self, s: Session) -> int | None:
        """An explicit id for a new run (`ManageMixin`), or None to let the database pick."""
        raise NotImplementedError

    def set_progress(self, run_id: int, step: int, total_steps: int | None = None) -> None:
        """The training child's step report (`RunsMixin`)."""
        raise NotImplementedError
