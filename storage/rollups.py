"""Rollup SQL for the metric and memory series: level constants and the statements that keep them.

Only `storage.store.Store` runs these statements.
"""

from __future__ import annotations

import math
from typing import Sequence

from sqlalchemy import text

# Levels kept in the rollup tables: buckets of 2**level steps (metrics) or 2**level / 16 s (memory).
# Every 4th power of two, so a graph at any power-of-two width reads at most 16 rollup rows per
# bucket, while each write touches only len(LEVELS) rollup rows per series.
METRIC_LEVELS = (4, 8, 12, 16)
MEMORY_LEVELS = (4, 8, 12, 16)


def _levels_sql(levels: Sequence[int]) -> str:
    return " UNION ALL ".join(f"SELECT {lv}" + (" AS level" if i == 0 else "") for i, lv in enumerate(levels))


def _least(col: str, table: str) -> str:
    """min() of the stored and the new value, ignoring NULLs (SQLite's two-argument min() does not)."""
    return f"{col} = coalesce(min({table}.{col}, excluded.{col}), {table}.{col}, excluded.{col})"


def _greatest(col: str, table: str) -> str:
    return f"{col} = coalesce(max({table}.{col}, excluded.{col}), {table}.{col}, excluded.{col})"


# Folds the rows with id > :after into the rollups, in the writer's transaction (one statement).
_METRIC_ROLLUP_UPSERT = text(
    "INSERT INTO metric_rollups (run_id, name, level, bucket, first_step, last_step, value_min, value_max, "
    "value_sum, row_count) "
    "SELECT x.run_id, x.name, lv.level, x.step >> lv.level, min(x.step), max(x.step), min(x.value), max(x.value), "
    f"sum(x.value), count(*) FROM metrics AS x, ({_levels_sql(METRIC_LEVELS)}) AS lv "
    "WHERE x.id > :after AND x.value IS NOT NULL "
    "GROUP BY x.run_id, x.name, lv.level, x.step >> lv.level "
    "ON CONFLICT (run_id, name, level, bucket) DO UPDATE SET "
    + ", ".join([_least("first_step", "metric_rollups"), _greatest("last_step", "metric_rollups"),
                 _least("value_min", "metric_rollups"), _greatest("value_max", "metric_rollups"),
                 "value_sum = metric_rollups.value_sum + excluded.value_sum",
                 "row_count = metric_rollups.row_count + excluded.row_count"]))

_MEMORY_ROLLUP_UPSERT = text(
    "INSERT INTO memory_rollups (run_id, source, level, bucket, first_time, last_time, used_min, used_max, "
    "total_max, utilization_max, torch_allocated_max, torch_reserved_max, rss_min, rss_max, row_count) "
    "SELECT x.run_id, x.source, lv.level, CAST(x.time * 16 AS INTEGER) >> lv.level, min(x.time), max(x.time), "
    "min(x.used_bytes), max(x.used_bytes), max(x.total_bytes), max(x.utilization), max(x.torch_allocated), "
    "max(x.torch_reserved), min(x.process_rss), max(x.process_rss), count(*) "
    f"FROM memory_samples AS x, ({_levels_sql(MEMORY_LEVELS)}) AS lv "
    "WHERE x.id > :after AND x.run_id IS NOT NULL "
    "GROUP BY x.run_id, x.source, lv.level, CAST(x.time * 16 AS INTEGER) >> lv.level "
    "ON CONFLICT (run_id, level, source, bucket) DO UPDATE SET "
    + ", ".join([_least("first_time", "memory_rollups"), _greatest("last_time", "memory_rollups"),
                 _least("used_min", "memory_rollups"), _greatest("used_max", "memory_rollups"),
                 _greatest("total_max", "memory_rollups"), _greatest("utilization_max", "memory_rollups"),
                 _greatest("torch_allocated_max", "memory_rollups"), _greatest("torch_reserved_max", "memory_rollups"),
                 _least("rss_min", "memory_rollups"), _greatest("rss_max", "memory_rollups"),
                 "row_count = memory_rollups.row_count + excluded.row_count"]))


# Rebuilds one run's metric rollups from its raw rows (after `truncate_metrics`).
_METRIC_ROLLUP_REBUILD = text(
    "INSERT INTO metric_rollups (run_id, name, level, bucket, first_step, last_step, value_min, value_max, "
    "value_sum, row_count) "
    "SELECT x.run_id, x.name, lv.level, x.step >> lv.level, min(x.step), max(x.step), min(x.value), max(x.value), "
    f"sum(x.value), count(*) FROM metrics AS x, ({_levels_sql(METRIC_LEVELS)}) AS lv "
    "WHERE x.run_id = :run_id AND x.value IS NOT NULL "
    "GROUP BY x.run_id, x.name, lv.level, x.step >> lv.level")


def _finite_or_none(value: float) -> float | None:
    """Non-finite metric values are stored as NULL (SQLite would turn NaN into NULL anyway)."""
    value = float(value)
    return value if math.isfinite(value) else None


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else float(value)
