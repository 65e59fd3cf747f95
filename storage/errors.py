"""The store's one kind of failure (what callers outside storage/ catch instead of the driver's errors),
and waiting out SQLite's 'database is locked' before it becomes one.

    try:
        run = store.claim_next_on_device(worker_id, device)
    except StorageError as exc:         # the database failed this call: log it, wait, go on
        ...

The store turns SQLAlchemy's errors into these where it opens its sessions and connections
(`storage.store_core.StoreCore`), so no module outside storage/ imports sqlalchemy:

- `DatabaseUnavailable`: the database cannot be reached or used now (a lost connection, a file it
  cannot open, 'database is locked' past every retry): the same call may work later;
- `Conflict`: a write broke a constraint (a duplicate key, a missing row a foreign key names);
- `StorageError`: anything else the database or the ORM refused.

The message is the original's; `orig` keeps the driver's own error (e.g. `sqlite3.OperationalError`)
when there is one, and the SQLAlchemy error is the exception's `__cause__`.

A write that meets 'database is locked' (a lock held past the busy timeout) is retried with backoff
first (`call_retrying`, through `StoreCore._retrying`); `is_locked_error` recognises that error in
any of its three shapes.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # sqlalchemy is imported when an error is translated: `tunedeck plan` never loads it
    from sqlalchemy import exc as sa

T = TypeVar("T")


class StorageError(Exception):
    """The database (or the store's use of it) failed a call; `orig` is the driver's error, if any."""

    def __init__(self, message: str, orig: BaseException | None = None) -> None:
        super().__init__(message)
        self.orig = orig


class DatabaseUnavailable(StorageError):
    """The database cannot be reached or used now (connection lost, file unusable, locked past the retries)."""


class Conflict(StorageError):
    """A write broke one of the database's constraints (unique key, foreign key, not null)."""


def storage_error(exc: sa.SQLAlchemyError) -> StorageError:
    """The store's error for one of SQLAlchemy's (same message; the driver's error as `orig`)."""
    from sqlalchemy import exc as sa

    unavailable = (sa.OperationalError, sa.InterfaceError, sa.DisconnectionError, sa.TimeoutError)
    orig = getattr(exc, "orig", None)
    kind = (
        DatabaseUnavailable
        if isinstance(exc, unavailable)
        else Conflict
        if isinstance(exc, sa.IntegrityError)
        else StorageError
    )
    return kind(str(exc), orig if isinstance(orig, BaseException) else None)


@contextmanager
def translated() -> Iterator[None]:
    """Raise SQLAlchemy's errors from the block as the store's (`storage_error`), chained to the original."""
    from sqlalchemy import exc as sa

    try:
        yield
    except sa.SQLAlchemyError as exc:
        raise storage_error(exc) from exc


def lock_errors() -> tuple[type[BaseException], ...]:
    """What 'database is locked' arrives as: SQLAlchemy's error, the driver's, or the store's own."""
    from sqlalchemy import exc as sa

    return (sa.OperationalError, sqlite3.OperationalError, DatabaseUnavailable)


def is_locked_error(exc: BaseException) -> bool:
    """True for SQLite's transient 'database is locked' / 'database is busy' errors."""
    text_ = str(getattr(exc, "orig", None) or exc).lower()
    return isinstance(exc, lock_errors()) and ("database is locked" in text_ or "database is busy" in text_)


def call_retrying(
    fn: Callable[[], T], what: str, window_s: float, log: logging.Logger, on_retry: Callable[[], None]
) -> T:
    """Call `fn()` (one whole write transaction) again on 'database is locked', backing off.

    Gives up (re-raises) once the next wait would end past `window_s` from now; `on_retry` is
    called before each wait.
    """
    deadline = time.monotonic() + window_s
    delay = 0.05
    while True:
        try:
            return fn()
        except lock_errors() as exc:
            if not is_locked_error(exc) or time.monotonic() + delay > deadline:
                raise
            on_retry()
            log.warning("%s: database is locked; retrying in %.2f s", what, delay)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
