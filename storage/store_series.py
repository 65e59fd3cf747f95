"""Metric and memory series for `storage.store.Store`: writes that keep the rollups, bucketed reads.

A mixin: it uses the store's `_tx`, `_read`, `_retrying` and `_retry_window_s`, and keeps all of
its SQL here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import func, or_, select, update

from storage import models as m
from storage.errors import is_locked_error, lock_errors
from storage.records import _MEMORY_FIELDS, MemoryBucket, MemoryPoint, MetricBucket, MetricPoint
from storage.rollups import (
    MEMORY_LEVELS,
    METRIC_LEVELS,
    _finite_or_none,
    _nan_if_none,
    floor_int,
    shift_right,
    upsert_memory_rollups,
    upsert_metric_rollups,
)
from storage.store_core import StoreCore, rowcount
from storage.store_manage import rows_of_existing_runs

log = logging.getLogger("storage.store")  # the store's logger, as before the split


class SeriesMixin(StoreCore):
    """Store methods over `metrics`, `memory_samples` and their rollup tables."""

    # ------------------------------------------------------------------ metrics
    def add_metrics(
        self, run_id: int, points: Iterable[MetricPoint], progress: tuple[int, int | None] | None = None
    ) -> int:
        """Insert metric rows in one transaction; returns how many rows were written now.

        `progress` (step, total steps): the run's step report, written in the same transaction
        (`Store.set_progress`), so a training child's periodic flush is one commit, not two.

        A write lock held by someone else is waited out (busy timeout), then retried with backoff
        for WRITE_RETRY_S; if it is still locked the rows are kept and written first by the next
        call (or `flush_unwritten`), so a locked database never loses a row or fails training.
        """
        rows = [
            {"run_id": run_id, "step": p.step, "name": p.name, "value": _finite_or_none(p.value), "time": p.time}
            for p in points
        ]
        with self._buffer_lock:
            if rows:
                self._unwritten.append((run_id, rows))
            batch = [r for _, rs in self._unwritten for r in rs]
            if not batch:
                if progress is not None:
                    self.set_progress(run_id, *progress)
                return 0
            try:
                self._retrying(lambda: self._insert_metrics(batch, run_id, progress), "add_metrics")
            except lock_errors() as exc:  # the store's sessions raise DatabaseUnavailable
                if not is_locked_error(exc):
                    if rows:  # not a lock: these rows can never be written; keep the older ones
                        self._unwritten.pop()
                    raise
                log.error(
                    "add_metrics: database still locked after %.0f s; keeping %d rows for the next write",
                    self._retry_window_s(),
                    len(batch),
                )
                return 0
            self._unwritten.clear()
            return len(batch)

    def flush_unwritten(self) -> int:
        """Write metric rows kept back by a locked database; returns how many were written."""
        return self.add_metrics(0, [])

    def _insert_metrics(
        self, rows: list[dict[str, Any]], run_id: int | None = None, progress: tuple[int, int | None] | None = None
    ) -> None:
        with self._tx() as s:
            live = rows_of_existing_runs(s, rows)  # a run deleted meanwhile drops its late rows
            if live:
                s.execute(m.Metric.__table__.insert(), live)
                upsert_metric_rollups(s, live)
            if progress is not None:
                s.execute(update(m.Run).where(m.Run.id == run_id).values(**m.progress_values(*progress)))

    def metrics(
        self, run_id: int, names: Sequence[str] | None = None, after_step: int | None = None
    ) -> list[MetricPoint]:
        """Raw rows by name then step; `after_step` keeps only later steps (for polling)."""
        q = select(m.Metric.step, m.Metric.name, m.Metric.value, m.Metric.time).where(m.Metric.run_id == run_id)
        if names is not None:
            q = q.where(m.Metric.name.in_(list(names)))
        if after_step is not None:
            q = q.where(m.Metric.step > after_step)
        q = q.order_by(m.Metric.name, m.Metric.step, m.Metric.id)
        with self._read() as s:
            return [MetricPoint(st, n, _nan_if_none(v), t) for st, n, v, t in s.execute(q)]

    def metric_names_at(self, run_id: int, step: int) -> list[str]:
        """The names a run has rows for at one step (what a run resumed at that step must not write again)."""
        q = select(m.Metric.name).where(m.Metric.run_id == run_id, m.Metric.step == step).distinct()
        with self._read() as s:
            return list(s.scalars(q))

    def metric_names(self, run_id: int) -> list[str]:
        with self._read() as s:
            return list(s.scalars(select(m.Metric.name).where(m.Metric.run_id == run_id).distinct()))

    def last_metric(self, run_id: int, name: str) -> MetricPoint | None:
        q = (
            select(m.Metric.step, m.Metric.name, m.Metric.value, m.Metric.time)
            .where(m.Metric.run_id == run_id, m.Metric.name == name)
            .order_by(m.Metric.id.desc())
            .limit(1)
        )
        with self._read() as s:
            r = s.execute(q).first()
            return MetricPoint(r[0], r[1], _nan_if_none(r[2]), r[3]) if r else None

    def metric_buckets(self, run_id: int, name: str, width: int, after_step: int = -1) -> list[MetricBucket]:
        """One metric grouped in SQL into buckets of `width` steps (bucket = step // width), min/max kept.

        `after_step` reads only newer rows (an index range scan), so a live graph can be kept up to date
        without rescanning a long run.
        """
        step = m.Metric.step
        bucket = (step if width <= 1 else step // int(width)).label("b")
        q = (
            select(
                bucket,
                func.min(step),
                func.max(step),
                func.min(m.Metric.value),
                func.max(m.Metric.value),
                func.sum(m.Metric.value),
                func.count(),
            )
            .where(m.Metric.run_id == run_id, m.Metric.name == name, step > after_step)
            .group_by("b")
            .order_by("b")
        )
        with self._read() as s:
            return [MetricBucket(*r[1:]) for r in s.execute(q)]

    def metric_extent(self, run_id: int, name: str) -> tuple[int, int] | None:
        """(first step, last step) of one metric of a run, from the index alone; None when it has no rows."""
        # Two scalar subqueries: SQLite answers a lone MIN() or MAX() from the index in O(log n),
        # but scans every row when both share one SELECT.
        cond = (m.Metric.run_id == run_id, m.Metric.name == name)
        q = select(
            select(func.min(m.Metric.step)).where(*cond).scalar_subquery(),
            select(func.max(m.Metric.step)).where(*cond).scalar_subquery(),
        )
        with self._read() as s:
            lo, hi = s.execute(q).one()
            return None if lo is None else (int(lo), int(hi))

    def metric_series(self, run_id: int, name: str, width: int, from_step: int = 0) -> list[MetricBucket]:
        """Same buckets as `metric_buckets` (bucket = step // width), read from the rollup table.

        `width` a power of two: the coarsest rollup level <= width is regrouped in SQL (<= 16 rollup
        rows per bucket), so the cost follows the number of buckets, not of raw rows; narrower
        widths read raw rows. `from_step` (a multiple of `width`) skips older buckets.
        """
        k = width.bit_length() - 1
        level = max((lv for lv in METRIC_LEVELS if lv <= k), default=None)
        if width < 1 or width != 1 << k or level is None:
            return self.metric_buckets(run_id, name, width, after_step=from_step - 1)
        r = m.MetricRollup
        b = shift_right(r.bucket, k - level).label("b")
        q = (
            select(
                b,
                func.min(r.first_step),
                func.max(r.last_step),
                func.min(r.value_min),
                func.max(r.value_max),
                func.sum(r.value_sum),
                func.sum(r.row_count),
            )
            .where(r.run_id == run_id, r.name == name, r.level == level, r.bucket >= (max(0, from_step) >> level))
            .group_by("b")
            .order_by("b")
        )
        with self._read() as s:
            return [MetricBucket(*row[1:]) for row in s.execute(q)]

    def last_metric_values(self, run_ids: Sequence[int], name: str) -> dict[int, float]:
        """The value at the highest step of one metric for each of several runs (for run tables)."""
        if not run_ids:
            return {}
        inner = (
            select(m.Metric.run_id, func.max(m.Metric.step).label("step"))
            .where(m.Metric.run_id.in_(list(run_ids)), m.Metric.name == name)
            .group_by(m.Metric.run_id)
            .subquery()
        )
        q = (
            select(m.Metric.run_id, m.Metric.value)
            .join(inner, (m.Metric.run_id == inner.c.run_id) & (m.Metric.step == inner.c.step))
            .where(m.Metric.name == name)
            .order_by(m.Metric.id)
        )
        with self._read() as s:
            return {run_id: _nan_if_none(value) for run_id, value in s.execute(q)}

    def metric_means(self, run_ids: Sequence[int], name: str) -> dict[int, float]:
        """Mean of every finite value of one metric, per run, from the coarsest rollup level (a few rows
        per run however long it is); runs without rows are left out."""
        if not run_ids:
            return {}
        r = m.MetricRollup
        q = (
            select(r.run_id, func.sum(r.value_sum), func.sum(r.row_count))
            .where(r.run_id.in_(list(run_ids)), r.name == name, r.level == max(METRIC_LEVELS))
            .group_by(r.run_id)
        )
        with self._read() as s:
            return {run_id: total / count for run_id, total, count in s.execute(q) if count}

    # ------------------------------------------------------------------ memory
    def add_memory_samples(self, samples: Iterable[MemoryPoint]) -> int:
        rows = [{k: getattr(p, k) for k in _MEMORY_FIELDS} for p in samples]
        if not rows:
            return 0

        def write() -> None:
            with self._tx() as s:
                live = rows_of_existing_runs(s, rows)  # a run deleted meanwhile drops its late rows
                if live:
                    s.execute(m.MemorySample.__table__.insert(), live)
                    upsert_memory_rollups(s, live)

        self._retrying(write, "add_memory_samples")
        return len(rows)

    def thin_idle_memory(self, older_than: float, keep_every: float = 60.0) -> int:
        """Thin samples of no run older than `older_than` (epoch s) to one per source, device and
        `keep_every` seconds; samples of runs are kept whole (they belong to their run). Returns the
        number of rows deleted."""
        t = m.MemorySample
        old_idle = (t.run_id.is_(None), t.time < older_than)
        slot = func.floor(t.time / keep_every)
        keep = (
            select(func.min(t.id))
            .where(*old_idle)
            .group_by(t.source, func.coalesce(t.device_index, -1), slot)
            .scalar_subquery()
        )
        with self._tx() as s:
            return rowcount(s.execute(t.__table__.delete().where(*old_idle, t.id.not_in(keep))))

    def memory_samples(
        self, run_id: int | None = None, since: float | None = None, source: str | None = None, limit: int | None = None
    ) -> list[MemoryPoint]:
        """Samples in time order; run_id=None means every sample (also those of no run)."""
        q = select(m.MemorySample)
        if run_id is not None:
            q = q.where(m.MemorySample.run_id == run_id)
        if since is not None:
            q = q.where(m.MemorySample.time >= since)
        if source is not None:
            q = q.where(m.MemorySample.source == source)
        q = q.order_by(m.MemorySample.time, m.MemorySample.id)
        if limit is not None:
            q = q.limit(limit)
        with self._read() as s:
            return [MemoryPoint(**{k: getattr(r, k) for k in _MEMORY_FIELDS}) for r in s.scalars(q)]

    def memory_buckets(
        self,
        run_id: int | None,
        origin: float,
        width: float,
        after: float | None = None,
        worker_id: str | None = None,
        device_index: int | None = None,
    ) -> list[MemoryBucket]:
        """Memory samples grouped in SQL per source into time buckets floor((time - origin) / width).

        run_id=None groups every sample (the GPU panel); `after` reads only newer samples;
        `worker_id` (and `device_index`) keep one worker's device apart from the others'.
        """
        t = m.MemorySample
        where = [t.time >= origin]
        if run_id is not None:
            where.append(t.run_id == run_id)
        if worker_id is not None:
            where.append(t.worker_id == worker_id)
        if device_index is not None:
            where.append(or_(t.device_index == device_index, t.device_index.is_(None)))
        if after is not None:
            where.append(t.time > after)
        bucket = floor_int(self._sqlite, (t.time - origin) / width).label("b")
        q = (
            select(
                bucket,
                t.source,
                func.min(t.time),
                func.max(t.time),
                func.min(t.used_bytes),
                func.max(t.used_bytes),
                func.max(t.total_bytes),
                func.max(t.utilization),
                func.max(t.torch_allocated),
                func.max(t.torch_reserved),
                func.min(t.process_rss),
                func.max(t.process_rss),
                func.count(),
            )
            .where(*where)
            .group_by("b", t.source)
            .order_by("b")
        )
        with self._read() as s:
            return [MemoryBucket(*r[1:]) for r in s.execute(q)]

    def memory_series(self, run_id: int, width: float, from_time: float = 0.0) -> list[MemoryBucket]:
        """One run's samples per source in time buckets floor(time / width), width = 2**k / 16 s.

        Buckets are aligned at time 0 so they match the rollup table, which is read when a level
        fits (cost follows the number of buckets); narrower widths read raw samples.
        `from_time` (a multiple of `width`) skips older buckets.
        """
        k = round(math.log2(width * 16))
        if k < 0 or width * 16 != 2**k:
            raise ValueError(f"memory bucket width must be 2**k / 16 s, got {width}")
        level = max((lv for lv in MEMORY_LEVELS if lv <= k), default=None)
        if level is None:
            t = m.MemorySample
            b = shift_right(floor_int(self._sqlite, t.time * 16), k).label("b")
            q = (
                select(
                    b,
                    t.source,
                    func.min(t.time),
                    func.max(t.time),
                    func.min(t.used_bytes),
                    func.max(t.used_bytes),
                    func.max(t.total_bytes),
                    func.max(t.utilization),
                    func.max(t.torch_allocated),
                    func.max(t.torch_reserved),
                    func.min(t.process_rss),
                    func.max(t.process_rss),
                    func.count(),
                )
                .where(t.run_id == run_id, t.time >= from_time)
                .group_by("b", t.source)
                .order_by("b", t.source)
            )
        else:
            r = m.MemoryRollup
            b = shift_right(r.bucket, k - level).label("b")
            first = (math.floor(from_time * 16) >> k) << (k - level) if from_time > 0 else 0
            q = (
                select(
                    b,
                    r.source,
                    func.min(r.first_time),
                    func.max(r.last_time),
                    func.min(r.used_min),
                    func.max(r.used_max),
                    func.max(r.total_max),
                    func.max(r.utilization_max),
                    func.max(r.torch_allocated_max),
                    func.max(r.torch_reserved_max),
                    func.min(r.rss_min),
                    func.max(r.rss_max),
                    func.sum(r.row_count),
                )
                .where(r.run_id == run_id, r.level == level, r.bucket >= first)
                .group_by("b", r.source)
                .order_by("b", r.source)
            )
        with self._read() as s:
            return [MemoryBucket(*row[1:]) for row in s.execute(q)]

    def memory_extent(self, run_id: int | None = None) -> tuple[float, float] | None:
        """(first, last) sample time of a run's memory samples (all samples for None)."""
        t = m.MemorySample
        cond = (t.run_id == run_id,) if run_id is not None else ()
        q = select(
            select(func.min(t.time)).where(*cond).scalar_subquery(),
            select(func.max(t.time)).where(*cond).scalar_subquery(),
        )
        with self._read() as s:
            lo, hi = s.execute(q).one()
            return None if lo is None else (float(lo), float(hi))
