"""Schema migrations: statements that bring an older database up to `models.SCHEMA_VERSION`."""

from __future__ import annotations

from sqlalchemy.orm import Session

from storage import models as m

# Statements that bring a database from version N-1 to N. Append, never edit.
MIGRATIONS: dict[int, list[str]] = {
    # 2: rollup tables (created by create_all just before migrations run), backfilled from the raw rows.
    2: [
        "INSERT INTO metric_rollups (run_id, name, level, bucket, first_step, last_step, value_min, value_max, "
        "value_sum, row_count) SELECT x.run_id, x.name, lv.level, x.step >> lv.level, min(x.step), max(x.step), "
        "min(x.value), max(x.value), sum(x.value), count(*) FROM metrics AS x, (SELECT 4 AS level UNION ALL "
        "SELECT 8 UNION ALL SELECT 12 UNION ALL SELECT 16) AS lv WHERE true "
        "GROUP BY x.run_id, x.name, lv.level, x.step >> lv.level",
        "INSERT INTO memory_rollups (run_id, source, level, bucket, first_time, last_time, used_min, used_max, "
        "total_max, utilization_max, torch_allocated_max, torch_reserved_max, rss_min, rss_max, row_count) "
        "SELECT x.run_id, x.source, lv.level, CAST(x.time * 16 AS INTEGER) >> lv.level, min(x.time), max(x.time), "
        "min(x.used_bytes), max(x.used_bytes), max(x.total_bytes), max(x.utilization), max(x.torch_allocated), "
        "max(x.torch_reserved), min(x.process_rss), max(x.process_rss), count(*) FROM memory_samples AS x, "
        "(SELECT 4 AS level UNION ALL SELECT 8 UNION ALL SELECT 12 UNION ALL SELECT 16) AS lv "
        "WHERE x.run_id IS NOT NULL GROUP BY x.run_id, x.source, lv.level, CAST(x.time * 16 AS INTEGER) >> lv.level",
    ],
    # 3: metrics.value nullable (NULL = a non-finite value; SQLite turns NaN into NULL): SQLite cannot
    # drop a NOT NULL, so the table is rebuilt (ids kept, so the rollups stay valid).
    3: [
        "CREATE TABLE metrics_v3 (id INTEGER NOT NULL, run_id INTEGER NOT NULL, step INTEGER NOT NULL, "
        "name VARCHAR(128) NOT NULL, value FLOAT, time FLOAT NOT NULL, PRIMARY KEY (id), "
        "FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE)",
        "INSERT INTO metrics_v3 (id, run_id, step, name, value, time) SELECT id, run_id, step, name, value, time "
        "FROM metrics",
        "DROP TABLE metrics",
        "ALTER TABLE metrics_v3 RENAME TO metrics",
        "CREATE INDEX ix_metrics_run_name_step ON metrics (run_id, name, step)",
    ],
    # 5: run_events (OOM recoveries), worker_devices (published device facts), sweep_runs (trick
    # sweeps): new tables only, created by create_all just before migrations run; nothing to backfill.
    5: [],
}


def migrate(s: Session, url: str) -> None:
    """Bring the schema recorded in `meta` up to SCHEMA_VERSION, inside the caller's write transaction."""
    row = s.get(m.Meta, "schema_version")
    if row is None:
        s.add(m.Meta(key="schema_version", value=str(m.SCHEMA_VERSION)))
        return
    found = int(row.value)
    if found > m.SCHEMA_VERSION:
        raise RuntimeError(
            f"database {url} has schema version {found}, newer than this tunedeck's "
            f"{m.SCHEMA_VERSION}: upgrade tunedeck, or point TUNEDECK_DATABASE_URL at another database")
    for version in range(found + 1, m.SCHEMA_VERSION + 1):
        for statement in MIGRATIONS.get(version, []):
            s.connection().exec_driver_sql(statement)
    row.value = str(m.SCHEMA_VERSION)
