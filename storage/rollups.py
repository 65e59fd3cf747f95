"""Rollups of the metric and memory series: level constants and the upserts that keep them.

The aggregates of a batch are computed here from the rows being written (not read back from the
table by id), then folded into the rollup rows with one upsert per batch: `INSERT ... ON
CONFLICT DO UPDATE`, which SQLite and PostgreSQL both apply row by row under the row's lock, so
concurrent writers to the same bucket add up instead of overwriting each other. Only
`storage.store.Store` runs these statements.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from typing import Any

from sqlalchemy import BigInteger, Integer, func, literal, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import InstrumentedAttribute, Session
from sqlalchemy.sql.elements import ColumnElement

from storage import models as m

# Levels kept in the rollup tables: buckets of 2**level steps (metrics) or 2**level / 16 s (memory).
# Every 4th power of two, so a graph at any power-of-two width reads at most 16 rollup rows per
# bucket, while each write touches only len(LEVELS) rollup rows per series.
METRIC_LEVELS = (4, 8, 12, 16)
MEMORY_LEVELS = (4, 8, 12, 16)

_MEMORY_MIN = {"used_min": "used_bytes", "rss_min": "process_rss"}
_MEMORY_MAX = {
    "used_max": "used_bytes",
    "total_max": "total_bytes",
    "utilization_max": "utilization",
    "torch_allocated_max": "torch_allocated",
    "torch_reserved_max": "torch_reserved",
    "rss_max": "process_rss",
}


def time_bucket(t: float) -> int:
    """The level-0 memory bucket of a time: floor(t * 16) (a 64-bit integer for any epoch time)."""
    return math.floor(t * 16)


def floor_int(sqlite_: bool, expr: ColumnElement[Any]) -> ColumnElement[Any]:
    """floor(expr) as a 64-bit integer in SQL (PostgreSQL's CAST rounds; SQLite's truncates, expr >= 0)."""
    if sqlite_:
        return func.cast(expr, Integer)
    return func.cast(func.floor(expr), BigInteger)


def shift_right(expr: ColumnElement[int] | InstrumentedAttribute[int], bits: int) -> ColumnElement[Any]:
    """expr >> bits, with `bits` bound as a plain integer (PostgreSQL has no bigint >> bigint)."""
    return expr.op(">>")(literal(int(bits), Integer))


def _pick(values: Iterable[Any], fn: Callable[..., Any]) -> Any:
    present = [v for v in values if v is not None]
    return fn(present) if present else None


def metric_rollup_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rollup rows (one per run, metric, level, bucket) of a batch of metric rows; NULL values skipped."""
    groups: dict[tuple[int, str, int, int], list[dict[str, Any]]] = {}
    for r in rows:
        if r["value"] is None:
            continue
        for level in METRIC_LEVELS:
            groups.setdefault((r["run_id"], r["name"], level, r["step"] >> level), []).append(r)
    return [
        {
            "run_id": run_id,
            "name": name,
            "level": level,
            "bucket": bucket,
            "first_step": min(r["step"] for r in rs),
            "last_step": max(r["step"] for r in rs),
            "value_min": min(r["value"] for r in rs),
            "value_max": max(r["value"] for r in rs),
            "value_sum": sum(r["value"] for r in rs),
            "row_count": len(rs),
        }
        for (run_id, name, level, bucket), rs in sorted(groups.items())
    ]


def memory_rollup_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rollup rows (one per run, level, source, bucket) of a batch of memory samples of runs."""
    groups: dict[tuple[int, int, str, int], list[dict[str, Any]]] = {}
    for r in rows:
        if r["run_id"] is None:
            continue
        b = time_bucket(r["time"])
        for level in MEMORY_LEVELS:
            groups.setdefault((r["run_id"], level, r["source"], b >> level), []).append(r)
    out = []
    for (run_id, level, source, bucket), rs in sorted(groups.items()):
        row = {
            "run_id": run_id,
            "level": level,
            "source": source,
            "bucket": bucket,
            "first_time": min(r["time"] for r in rs),
            "last_time": max(r["time"] for r in rs),
            "row_count": len(rs),
            "device_index": _pick((r["device_index"] for r in rs), max),
        }
        row.update({k: _pick((r[col] for r in rs), min) for k, col in _MEMORY_MIN.items()})
        row.update({k: _pick((r[col] for r in rs), max) for k, col in _MEMORY_MAX.items()})
        out.append(row)
    return out


def _extreme(sqlite_: bool, which: str, old: Any, new: Any) -> ColumnElement[Any]:
    """least/greatest of the stored and the new value, ignoring NULLs (SQLite's min(a, b) does not)."""
    fn = {"min": func.min if sqlite_ else func.least, "max": func.max if sqlite_ else func.greatest}[which]
    return func.coalesce(fn(old, new), old, new)


@cache
def _metric_upsert(sqlite_: bool) -> Any:
    """One-row upsert into `metric_rollups`, built once per dialect and run as an executemany."""
    t = m.MetricRollup.__table__
    stmt = (sqlite.insert if sqlite_ else postgresql.insert)(t)
    new, old = stmt.excluded, t.c
    return stmt.on_conflict_do_update(
        index_elements=[t.c.run_id, t.c.name, t.c.level, t.c.bucket],
        set_={
            "first_step": _extreme(sqlite_, "min", old.first_step, new.first_step),
            "last_step": _extreme(sqlite_, "max", old.last_step, new.last_step),
            "value_min": _extreme(sqlite_, "min", old.value_min, new.value_min),
            "value_max": _extreme(sqlite_, "max", old.value_max, new.value_max),
            "value_sum": old.value_sum + new.value_sum,
            "row_count": old.row_count + new.row_count,
        },
    )


@cache
def _memory_upsert(sqlite_: bool) -> Any:
    """One-row upsert into `memory_rollups`, built once per dialect and run as an executemany."""
    t = m.MemoryRollup.__table__
    stmt = (sqlite.insert if sqlite_ else postgresql.insert)(t)
    new, old = stmt.excluded, t.c
    set_ = {
        "first_time": _extreme(sqlite_, "min", old.first_time, new.first_time),
        "last_time": _extreme(sqlite_, "max", old.last_time, new.last_time),
        "row_count": old.row_count + new.row_count,
        "device_index": func.coalesce(new.device_index, old.device_index),
    }
    set_.update({k: _extreme(sqlite_, "min", old[k], new[k]) for k in _MEMORY_MIN})
    set_.update({k: _extreme(sqlite_, "max", old[k], new[k]) for k in _MEMORY_MAX})
    return stmt.on_conflict_do_update(index_elements=[t.c.run_id, t.c.level, t.c.source, t.c.bucket], set_=set_)


def _is_sqlite(s: Session) -> bool:
    return s.get_bind().dialect.name == "sqlite"


def upsert_metric_rollups(s: Session, rows: Sequence[dict[str, Any]]) -> None:
    """Fold a batch of metric rows into `metric_rollups` (in the caller's transaction).

    Rows are sorted by key, so two writers of the same buckets lock them in the same order.
    """
    values = metric_rollup_rows(rows)
    if values:
        s.execute(_metric_upsert(_is_sqlite(s)), values)


def upsert_memory_rollups(s: Session, rows: Sequence[dict[str, Any]]) -> None:
    """Fold a batch of memory samples into `memory_rollups` (in the caller's transaction)."""
    values = memory_rollup_rows(rows)
    if values:
        s.execute(_memory_upsert(_is_sqlite(s)), values)


def rebuild_metric_rollups(s: Session, run_id: int) -> None:
    """Recompute one run's metric rollups from its raw rows (after `truncate_metrics`)."""
    s.execute(m.MetricRollup.__table__.delete().where(m.MetricRollup.run_id == run_id))
    raw = s.execute(
        select(m.Metric.run_id, m.Metric.name, m.Metric.step, m.Metric.value).where(
            m.Metric.run_id == run_id, m.Metric.value.is_not(None)
        )
    )
    upsert_metric_rollups(s, [dict(r._mapping) for r in raw])


def _finite_or_none(value: float) -> float | None:
    """Non-finite metric values are stored as NULL (SQLite would turn NaN into NULL anyway)."""
    value = float(value)
    return value if math.isfinite(value) else None


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else float(value)
