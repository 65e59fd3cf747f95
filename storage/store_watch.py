"""Change stamps: one cheap read that says whether anything a live page shows may have changed.

A live page (the dashboard's event stream, `app.ui.live`) asks this several times a second and
rebuilds what it shows only when a stamp moves. Each stamp is one SELECT of scalar subqueries over
primary keys and indexed columns, so it costs the same for a run of ten rows as for one of a million:

    stamp = store.run_stamp(run_id)     # None: no such run
    store.series_stamp()                # the newest metric and memory-sample ids of the whole store
    store.runs_stamp()                  # the runs table: any run added, started, stepped, ended, tagged

A moved stamp means "look again", not "this changed": the series stamp moves with any run's rows,
and the reader then asks its own run's (incremental) series caches, which read only new rows.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import case, func, select

from storage import models as m
from storage.store_core import StoreCore


class WatchMixin(StoreCore):
    def run_stamp(self, run_id: int) -> tuple[Any, ...] | None:
        """What the run page's text shows of one run: its row's moving columns and its events' newest id
        (the status first)."""
        r = m.Run
        events = select(func.max(m.RunEvent.id)).where(m.RunEvent.run_id == run_id).scalar_subquery()
        q = select(
            r.status,
            r.current_step,
            r.total_steps,
            r.progress_at,
            r.started_at,
            r.finished_at,
            r.peak_memory_bytes,
            r.cancel_requested,
            r.exit_code,
            r.error_summary,
            r.note,
            events,
        ).where(r.id == run_id)
        with self._read() as s:
            row = s.execute(q).one_or_none()
        return None if row is None else tuple(row)

    def series_stamp(self) -> tuple[int | None, int | None]:
        """(newest metric id, newest memory sample id) over the whole store: two primary-key lookups."""
        q = select(
            select(func.max(m.Metric.id)).scalar_subquery(),
            select(func.max(m.MemorySample.id)).scalar_subquery(),
        )
        with self._read() as s:
            metric, memory = s.execute(q).one()
        return metric, memory

    def runs_stamp(self) -> tuple[Any, ...]:
        """What the runs table shows: counts and the newest moving columns over every run and tag.

        One pass over the runs table (thousands of rows: about a millisecond), not one per run."""
        r = m.Run
        q = select(
            func.count(r.id),
            func.max(r.id),
            func.max(r.progress_at),
            func.max(r.started_at),
            func.max(r.finished_at),
            func.sum(r.current_step),
            func.sum(r.cancel_requested),
            func.count(r.finished_at),
            *(func.sum(case((r.status == status.value, 1), else_=0)) for status in m.RunStatus),
            func.sum(func.length(func.coalesce(r.note, ""))),
            func.sum(func.length(r.name)),
            select(func.count()).select_from(m.RunTag).scalar_subquery(),
        )
        with self._read() as s:
            return tuple(s.execute(q).one())

    def devices_stamp(self) -> tuple[Any, ...]:
        """The workers' published devices (count, newest publication): the GPU panel's device line."""
        d = m.WorkerDevice
        with self._read() as s:
            return tuple(s.execute(select(func.count(d.worker_id), func.max(d.published_at))).one())
