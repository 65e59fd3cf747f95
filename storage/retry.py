"""Waiting out SQLite's 'database is locked': recognising the error and retrying with backoff."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import OperationalError

T = TypeVar("T")


def is_locked_error(exc: BaseException) -> bool:
    """True for SQLite's transient 'database is locked' / 'database is busy' errors."""
    text_ = str(getattr(exc, "orig", exc)).lower()
    return isinstance(exc, (OperationalError, sqlite3.OperationalError)) and (
        "database is locked" in text_ or "database is busy" in text_
    )


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
        except (OperationalError, sqlite3.OperationalError) as exc:
            if not is_locked_error(exc) or time.monotonic() + delay > deadline:
                raise
            on_retry()
            log.warning("%s: database is locked; retrying in %.2f s", what, delay)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
