"""The store raises its own errors (`storage.errors`), never SQLAlchemy's: callers outside storage/ catch
`StorageError` (or `DatabaseUnavailable`, `Conflict`) and need not import the driver."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from engines import import_or_missing
from sqlalchemy.exc import IntegrityError, OperationalError

from storage.errors import Conflict, DatabaseUnavailable, StorageError, is_locked_error
from storage.store import Store

BACKENDS = ("sqlite", "postgresql")  # each `store` test runs on both databases (tests/conftest.py)


def test_a_broken_constraint_is_a_conflict(store: Store) -> None:
    with pytest.raises(Conflict) as caught:
        store.create_task(987_654, "merged")  # no such run: the foreign key refuses it
    assert isinstance(caught.value, StorageError)
    assert isinstance(caught.value.__cause__, IntegrityError)  # the driver's error stays attached
    assert store.run_tasks(987_654) == []


def test_a_database_that_cannot_be_opened_is_unavailable(data_home: Path) -> None:
    with pytest.raises(DatabaseUnavailable, match="unable to open database file") as caught:
        Store(f"sqlite:///{data_home / 'no such folder' / 'tunedeck.db'}")
    assert isinstance(caught.value.__cause__, OperationalError)


def test_a_database_server_that_does_not_answer_is_unavailable(data_home: Path) -> None:
    import_or_missing("psycopg")  # a main dependency: missing under CI=true fails, never skips
    with socket.socket() as sock:  # a port nothing listens on: bound here, never listening
        sock.bind(("127.0.0.1", 0))
        url = f"postgresql+psycopg://postgres@127.0.0.1:{sock.getsockname()[1]}/tunedeck"
        with pytest.raises(DatabaseUnavailable) as caught:
            Store(url)
    assert isinstance(caught.value.__cause__, OperationalError)


def test_a_failure_inside_a_session_leaves_as_the_stores_error(store: Store) -> None:
    with pytest.raises(DatabaseUnavailable, match="server closed the connection"):
        with store._tx():  # the store's session boundary (test-only shortcut)
            raise OperationalError("SELECT 1", {}, Exception("server closed the connection unexpectedly"))
    with pytest.raises(ValueError):  # not the database's: passes through as it is
        with store._read():
            raise ValueError("mine")


def test_a_locked_database_is_recognised_in_the_stores_error() -> None:
    assert is_locked_error(DatabaseUnavailable("(sqlite3.OperationalError) database is locked"))
    assert not is_locked_error(StorageError("database is locked"))  # not an unavailable database
    assert not is_locked_error(DatabaseUnavailable("unable to open database file"))
