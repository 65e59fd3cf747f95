"""Managing finished runs for `storage.store.Store`: tags, notes, search filters and deletion.

A mixin: it uses the store's `_tx`, `_read` and `_sqlite`, and keeps all of its SQL here.
Deleting a run removes its row and, through the foreign keys' ON DELETE CASCADE, its metrics,
memory samples, rollups, artifact records and tags, in one write transaction. A running run is
refused (cancel it first). The run's folder on disk is `storage.run_files`' business.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import delete, func, or_, select

from storage import models as m
from storage.models import RunStatus
from storage.store_core import StoreCore

# The highest run id ever deleted: SQLite gives a new row max(id) + 1, so without this the next
# run would take the id of a deleted newest run (and its bookmarks, cached graphs and scripts).
DELETED_MAX_KEY = "runs:deleted_max_id"


class RunningRunError(ValueError):
    """A running run cannot be deleted: cancel it and wait until it has stopped."""

    def __init__(self, run_id: int):
        self.run_id = run_id
        super().__init__(f"run {run_id} is running")


def search_filter(query: Any, search: str | None, tag: str | None) -> Any:
    """`query` (a select over runs) narrowed to runs whose name, tags or note contain `search`
    (case-insensitive; a number also matches that run id) and that carry the tag `tag` exactly."""
    text = (search or "").strip().lower()
    if text:
        tagged = select(m.RunTag.run_id).where(func.lower(m.RunTag.tag).contains(text, autoescape=True))
        matches = [
            func.lower(m.Run.name).contains(text, autoescape=True),
            func.lower(func.coalesce(m.Run.note, "")).contains(text, autoescape=True),
            m.Run.id.in_(tagged),
        ]
        if text.isdigit():
            matches.append(m.Run.id == int(text))
        query = query.where(or_(*matches))
    if tag:
        query = query.where(m.Run.id.in_(select(m.RunTag.run_id).where(m.RunTag.tag == tag)))
    return query


def rows_of_existing_runs(s: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` without those of runs that no longer exist (inside the caller's write transaction).

    A worker flushes a run's last memory samples (and a child its last metrics) a moment after
    the run is marked finished; if the run was deleted in that moment, those rows are dropped
    instead of failing the write (and the worker) on the foreign key.
    """
    ids = {r["run_id"] for r in rows if r["run_id"] is not None}
    if not ids:
        return rows
    live = set(s.scalars(select(m.Run.id).where(m.Run.id.in_(ids))))
    return rows if live == ids else [r for r in rows if r["run_id"] is None or r["run_id"] in live]


class ManageMixin(StoreCore):
    """Store methods for tags, notes and deleting runs."""

    def _unused_run_id(self, s: Any) -> int | None:
        """An explicit id for a new run on SQLite once runs were deleted (None: let the database pick).

        PostgreSQL sequences never hand out an id twice, and explicit ids there would fall out of
        step with the sequence, so this applies to SQLite only.
        """
        if not self._sqlite:
            return None
        floor = s.get(m.Meta, DELETED_MAX_KEY)
        if floor is None:
            return None
        top = s.scalar(select(func.max(m.Run.id))) or 0
        return max(int(floor.value), top) + 1

    def delete_run(self, run_id: int) -> bool:
        """Delete a run with all its rows; False when there is no such run. Raises RunningRunError."""
        with self._tx() as s:
            status = s.scalar(select(m.Run.status).where(m.Run.id == run_id))
            if status is None:
                return False
            if status == RunStatus.RUNNING.value:
                raise RunningRunError(run_id)
            s.execute(delete(m.Run).where(m.Run.id == run_id))
            floor = s.get(m.Meta, DELETED_MAX_KEY)
            highest = max(int(floor.value) if floor else 0, int(run_id))
            s.merge(m.Meta(key=DELETED_MAX_KEY, value=str(highest)))
            return True

    def change_tags(self, run_id: int, add: Iterable[str] = (), remove: Iterable[str] = ()) -> tuple[str, ...] | None:
        """Add and remove tags of a run (already valid: see app.run_summaries); its tags after, None if no such run."""
        with self._tx() as s:
            if s.scalar(select(m.Run.id).where(m.Run.id == run_id)) is None:
                return None
            gone = list(remove)
            if gone:
                s.execute(delete(m.RunTag).where(m.RunTag.run_id == run_id, m.RunTag.tag.in_(gone)))
            tags = set(s.scalars(select(m.RunTag.tag).where(m.RunTag.run_id == run_id)))
            for tag in add:
                if tag not in tags:
                    s.add(m.RunTag(run_id=run_id, tag=tag))
                    tags.add(tag)
            return tuple(sorted(tags))

    def set_note(self, run_id: int, note: str | None) -> bool:
        """Replace a run's note (None or "" removes it); False when there is no such run."""
        with self._tx() as s:
            row = s.get(m.Run, run_id)
            if row is None:
                return False
            row.note = note or None
            return True

    def tag_counts(self) -> dict[str, int]:
        """Every tag in use and how many runs carry it, by tag."""
        q = select(m.RunTag.tag, func.count()).group_by(m.RunTag.tag).order_by(m.RunTag.tag)
        with self._read() as s:
            return {tag: int(n) for tag, n in s.execute(q)}
