"""Change stamps: one cheap read that says whether anything a live page shows may have changed.

A live page (the dashboard's event stream, `app.ui.live`) asks this several times a second and
rebuilds what it shows only when a stamp moves. Each stamp is one SELECT of scalar subqueries over
primary keys and indexed columns, so it costs the same for a run of ten rows as for one of a million:

    stamp = store.run_stamp(run_id)     # None: no such run
    store.series_stamp()                # the newest metric and memory-sample ids of the whole store
    run, series = store.live_stamps(run_id)   # both in one SELECT: a live page's tick
    store.run_extents(run_id, ("loss", "eval_loss"))  # each series' first and last step (time), one SELECT
    store.runs_stamp()                  # the runs table: any run added, started, stepped, ended, tagged

A moved stamp means "look again", not "this changed": the series stamp moves with any run's rows,
and the reader then asks its own run's (incremental) series caches, which read only new rows.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from sqlalchemy import Integer, Select, bindparam, case, func, literal, select
from sqlalchemy.sql.elements import BindParameter

from storage import models as m
from storage.store_core import StoreCore

_RUN: BindParameter[int] = bindparam("run_id", type_=Integer)
# What the run page's text shows of one run: its row's moving columns and its events' newest id (the status first).
_RUN_STAMP = (
    m.Run.status,
    m.Run.current_step,
    m.Run.total_steps,
    m.Run.progress_at,
    m.Run.started_at,
    m.Run.finished_at,
    m.Run.peak_memory_bytes,
    m.Run.cancel_requested,
    m.Run.exit_code,
    m.Run.error_summary,
    m.Run.note,
    select(func.max(m.RunEvent.id)).where(m.RunEvent.run_id == _RUN).scalar_subquery(),
)
_SERIES_STAMP = (
    select(func.max(m.Metric.id)).scalar_subquery(),
    select(func.max(m.MemorySample.id)).scalar_subquery(),
)
# Built once: SQLAlchemy then finds the compiled SQL by the statement's memoized cache key, and
# building the expression each call cost more than running it.
_RUN_STAMP_Q = select(*_RUN_STAMP).where(m.Run.id == _RUN)
_SERIES_STAMP_Q = select(*_SERIES_STAMP)
_LIVE_STAMPS_Q = select(*_RUN_STAMP, *_SERIES_STAMP).where(m.Run.id == _RUN)


@lru_cache(maxsize=64)
def _extents_q(names: tuple[str, ...]) -> Select[Any]:
    """First and last step of each named metric of run `run_id`, then its first and last memory sample time.

    Each MIN() and MAX() in a scalar subquery of its own: SQLite answers a lone one from the index in
    O(log n), but scans every row when both share one SELECT (`SeriesMixin.metric_extent`)."""
    metric, sample = m.Metric, m.MemorySample
    columns = []
    for name in names:
        cond = (metric.run_id == _RUN, metric.name == literal(name))
        columns += [select(fn(metric.step)).where(*cond).scalar_subquery() for fn in (func.min, func.max)]
    columns += [select(fn(sample.time)).where(sample.run_id == _RUN).scalar_subquery() for fn in (func.min, func.max)]
    return select(*columns)


class WatchMixin(StoreCore):
    def run_stamp(self, run_id: int) -> tuple[Any, ...] | None:
        """What the run page's text shows of one run: its row's moving columns and its events' newest id
        (the status first)."""
        with self._read() as s:
            row = s.execute(_RUN_STAMP_Q, {"run_id": run_id}).one_or_none()
        return None if row is None else tuple(row)

    def series_stamp(self) -> tuple[int | None, int | None]:
        """(newest metric id, newest memory sample id) over the whole store: two primary-key lookups."""
        with self._read() as s:
            metric, memory = s.execute(_SERIES_STAMP_Q).one()
        return metric, memory

    def live_stamps(self, run_id: int | None) -> tuple[tuple[Any, ...] | None, tuple[int | None, int | None]]:
        """(run_stamp(run_id), series_stamp()) in one SELECT: what a live page asks 4 times a second.

        On a plain connection (a read, so no session is needed): ~0.15 ms, against ~1.7 ms for the two
        calls through ORM sessions. No run_id, or no such run: (None, series_stamp())."""
        with self._plain_read() as conn:
            row = None if run_id is None else conn.execute(_LIVE_STAMPS_Q, {"run_id": run_id}).one_or_none()
            if row is None:
                metric, memory = conn.execute(_SERIES_STAMP_Q).one()
                return None, (metric, memory)
        *run, metric, memory = row
        return tuple(run), (metric, memory)

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

    def run_extents(
        self, run_id: int, names: tuple[str, ...]
    ) -> tuple[dict[str, tuple[int, int] | None], tuple[float, float] | None]:
        """`metric_extent(run_id, name)` of each name and `memory_extent(run_id)` in one SELECT: what the
        run page's charts ask before reading their new buckets (`app.ui.run.RunPageData.rows`)."""
        with self._plain_read() as conn:
            row = conn.execute(_extents_q(names), {"run_id": run_id}).one()
        metrics = {
            name: None if row[2 * i] is None else (int(row[2 * i]), int(row[2 * i + 1])) for i, name in enumerate(names)
        }
        lo, hi = row[-2], row[-1]
        return metrics, None if lo is None else (float(lo), float(hi))
