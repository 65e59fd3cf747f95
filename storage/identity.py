"""Each database's identity, and the run folders that belong to it.

A database gets a random id the first time tunedeck opens it (a `meta` row written once, in
the store's first write transaction). Its run folders live under `runs/<id>/` in the data
folder, so two databases that share one data folder (a second `TUNEDECK_DATABASE_URL`, a test
database, another team's PostgreSQL) can never write into each other's run folders; every run
folder also holds a `.tunedeck-database` file naming its database, and a folder that names
another database is refused rather than reused.

A database that already had runs before it had an id keeps the flat `runs/<run>/` layout it
was created with (moving folders of a live deployment is not ours to do); its folders are
marked on first use, so another database that finds them is refused too.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from storage import models as m

MARKER = ".tunedeck-database"


class RunFolderError(RuntimeError):
    """A run folder that belongs to another database."""


def ensure_identity(s: Session) -> tuple[str, str]:
    """(database id, run folder root relative to the data folder), written on first use."""
    rows = dict(s.execute(select(m.Meta.key, m.Meta.value).where(m.Meta.key.in_(["database_id", "runs_folder"]))).all())
    if "database_id" not in rows:
        new_id = uuid.uuid4().hex
        had_runs = bool(s.scalar(select(func.count()).select_from(m.Run)))
        insert = sqlite.insert if s.get_bind().dialect.name == "sqlite" else postgresql.insert
        s.execute(
            insert(m.Meta)
            .values(
                [
                    {"key": "database_id", "value": new_id},
                    {"key": "runs_folder", "value": "runs" if had_runs else f"runs/{new_id}"},
                ]
            )
            .on_conflict_do_nothing()
        )  # a second process opening it at the same moment: first one wins
        rows = dict(
            s.execute(select(m.Meta.key, m.Meta.value).where(m.Meta.key.in_(["database_id", "runs_folder"]))).all()
        )
    return rows["database_id"], rows["runs_folder"]


def claim_folder(path: Path, database_id: str, database_url: str) -> Path:
    """Create `path` if needed and make sure it belongs to this database (marking it if new)."""
    path.mkdir(parents=True, exist_ok=True)
    marker = path / MARKER
    try:
        owner = marker.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        marker.write_text(database_id + "\n", encoding="utf-8")
        return path
    if owner != database_id:
        raise RunFolderError(
            f"run folder {path} belongs to another database (id {owner}), not to {safe_url(database_url)} "
            f"(id {database_id}); nothing was written there. Give this database its own TUNEDECK_HOME, "
            "or point TUNEDECK_DATABASE_URL back at the database that owns the folder"
        )
    return path


def safe_url(url: str) -> str:
    """A database URL without its password, for messages."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    # make_url's refusals: ArgumentError for a string that is no URL, ValueError for a port that is no
    # number. Such a URL may hold a password in a shape we cannot find, so none of it is shown.
    except (ArgumentError, ValueError):
        return "the configured database"
