"""Schema migrations: statements that bring an older database up to `models.SCHEMA_VERSION`."""

from __future__ import annotations

import re

from sqlalchemy import inspect
from sqlalchemy.orm import Session

from storage import models as m

# One statement for every database, or one per dialect ({"sqlite": ..., "postgresql": ...}; a
# dialect left out skips the step). PostgreSQL tables are altered in place, never rebuilt, so
# their id sequences and identity columns are kept.
Statement = str | dict[str, str]

_TIME_BUCKET = {"sqlite": "CAST(x.time * 16 AS INTEGER)", "postgresql": "CAST(floor(x.time * 16) AS BIGINT)"}
_MEMORY_BACKFILL = (
    "INSERT INTO memory_rollups (run_id, source, level, bucket, first_time, last_time, used_min, used_max, "
    "total_max, utilization_max, torch_allocated_max, torch_reserved_max, rss_min, rss_max, row_count) "
    "SELECT x.run_id, x.source, lv.level, {b} >> lv.level, min(x.time), max(x.time), "
    "min(x.used_bytes), max(x.used_bytes), max(x.total_bytes), max(x.utilization), max(x.torch_allocated), "
    "max(x.torch_reserved), min(x.process_rss), max(x.process_rss), count(*) FROM memory_samples AS x, "
    "(SELECT 4 AS level UNION ALL SELECT 8 UNION ALL SELECT 12 UNION ALL SELECT 16) AS lv "
    "WHERE x.run_id IS NOT NULL GROUP BY x.run_id, x.source, lv.level, {b} >> lv.level"
)

# Statements that bring a database from version N-1 to N. Append, never edit.
MIGRATIONS: dict[int, list[Statement]] = {
    # 2: rollup tables (created by create_all just before migrations run), backfilled from the raw rows.
    2: [
        "INSERT INTO metric_rollups (run_id, name, level, bucket, first_step, last_step, value_min, value_max, "
        "value_sum, row_count) SELECT x.run_id, x.name, lv.level, x.step >> lv.level, min(x.step), max(x.step), "
        "min(x.value), max(x.value), sum(x.value), count(*) FROM metrics AS x, (SELECT 4 AS level UNION ALL "
        "SELECT 8 UNION ALL SELECT 12 UNION ALL SELECT 16) AS lv WHERE true "
        "GROUP BY x.run_id, x.name, lv.level, x.step >> lv.level",
        {dialect: _MEMORY_BACKFILL.format(b=b) for dialect, b in _TIME_BUCKET.items()},
    ],
    # 3: metrics.value nullable (NULL = a non-finite value; SQLite turns NaN into NULL): SQLite cannot
    # drop a NOT NULL, so the table is rebuilt (ids kept, so the rollups stay valid).
    3: [
        {
            "sqlite": "CREATE TABLE metrics_v3 (id INTEGER NOT NULL, run_id INTEGER NOT NULL, step INTEGER NOT NULL, "
            "name VARCHAR(128) NOT NULL, value FLOAT, time FLOAT NOT NULL, PRIMARY KEY (id), "
            "FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE)",
            "postgresql": "ALTER TABLE metrics ALTER COLUMN value DROP NOT NULL",
        },
        {
            "sqlite": "INSERT INTO metrics_v3 (id, run_id, step, name, value, time) SELECT id, run_id, step, name, "
            "value, time FROM metrics"
        },
        {"sqlite": "DROP TABLE metrics"},
        {"sqlite": "ALTER TABLE metrics_v3 RENAME TO metrics"},
        {"sqlite": "CREATE INDEX ix_metrics_run_name_step ON metrics (run_id, name, step)"},
    ],
    # 4: 64-bit ids and memory buckets on PostgreSQL (SQLite's INTEGER is 64-bit already); the id
    # sequences widen with their columns.
    4: [
        {"postgresql": statement}
        for statement in (
            "ALTER TABLE metrics ALTER COLUMN id TYPE BIGINT",
            "ALTER SEQUENCE IF EXISTS metrics_id_seq AS BIGINT",
            "ALTER TABLE memory_samples ALTER COLUMN id TYPE BIGINT",
            "ALTER SEQUENCE IF EXISTS memory_samples_id_seq AS BIGINT",
            "ALTER TABLE memory_rollups ALTER COLUMN bucket TYPE BIGINT",
        )
    ],
    # 5: run_events (OOM recoveries), worker_devices (published device facts), sweep_runs (trick
    # sweeps): new tables only, created by create_all just before migrations run; nothing to backfill.
    5: [],
    # 6: a note per run; its tags live in the new run_tags table (created by create_all).
    6: [
        "ALTER TABLE runs ADD COLUMN note TEXT",
    ],
    # 7: the child's progress time apart from the worker's heartbeat; runs pinned to a host/device;
    # the device of a run's memory rollups.
    7: [
        "ALTER TABLE runs ADD COLUMN progress_at FLOAT",
        "ALTER TABLE runs ADD COLUMN pin_host VARCHAR(128)",
        "ALTER TABLE runs ADD COLUMN pin_device VARCHAR(32)",
        "ALTER TABLE memory_rollups ADD COLUMN device_index INTEGER",
    ],
    # 8: the worker (host:pid) whose device a memory sample is of: one graph per device when
    # several workers share a store.
    8: ["ALTER TABLE memory_samples ADD COLUMN worker_id VARCHAR(128)"],
    # 9: a run that outgrew its share of a device runs alone from then on.
    9: ["ALTER TABLE runs ADD COLUMN run_alone INTEGER DEFAULT 0"],
    # 10: runs handed to a cluster's scheduler (Slurm, Ray): the engine, its job id and its state.
    10: [
        "ALTER TABLE runs ADD COLUMN engine VARCHAR(16)",
        "ALTER TABLE runs ADD COLUMN engine_job_id VARCHAR(64)",
        "ALTER TABLE runs ADD COLUMN engine_state TEXT",
    ],
    # 11: a chat user turn's attached image (a file in the data folder) for vision-language runs.
    11: ["ALTER TABLE chat_messages ADD COLUMN image_path TEXT"],
    # 12: whose a chat session is: the Chat tab's ("tab", every older session) or one /v1 request's ("api").
    12: ["ALTER TABLE chat_sessions ADD COLUMN kind VARCHAR(8) NOT NULL DEFAULT 'tab'"],
    # 13: hyperparameter searches and their trials (`searches`, `search_trials`): new tables only,
    # created by create_all; Optuna keeps its own tables (studies, trials, ...) in the same database.
    13: [],
    # 14: tasks.run_id nullable (a task on a spec before any run exists: "try rewards"); SQLite rebuilds
    # the table (ids kept), PostgreSQL drops the NOT NULL in place.
    14: [
        {
            "sqlite": "CREATE TABLE tasks_v14 (id INTEGER NOT NULL, run_id INTEGER, kind VARCHAR(32) NOT NULL, "
            "args_json TEXT NOT NULL, status VARCHAR(16) NOT NULL, worker_id VARCHAR(128), created_at FLOAT NOT NULL, "
            "started_at FLOAT, finished_at FLOAT, heartbeat_at FLOAT, cancel_requested INTEGER NOT NULL, "
            "log_text TEXT NOT NULL, log_count INTEGER NOT NULL, result_json TEXT, error TEXT, PRIMARY KEY (id), "
            "FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE)",
            "postgresql": "ALTER TABLE tasks ALTER COLUMN run_id DROP NOT NULL",
        },
        {
            "sqlite": "INSERT INTO tasks_v14 SELECT id, run_id, kind, args_json, status, worker_id, created_at, "
            "started_at, finished_at, heartbeat_at, cancel_requested, log_text, log_count, result_json, error FROM tasks"
        },
        {"sqlite": "DROP TABLE tasks"},
        {"sqlite": "ALTER TABLE tasks_v14 RENAME TO tasks"},
        {"sqlite": "CREATE INDEX ix_tasks_status ON tasks (status)"},
        {"sqlite": "CREATE INDEX ix_tasks_run_id ON tasks (run_id)"},
    ],
}


def statement_for(statement: Statement, dialect: str) -> str | None:
    """The SQL of one migration step on this dialect (None: nothing to do there)."""
    return statement if isinstance(statement, str) else statement.get(dialect)


def _column_exists(s: Session, sql: str) -> bool:
    """True for `ALTER TABLE t ADD COLUMN c ...` when t already has c (SQLite has no ADD COLUMN IF NOT EXISTS)."""
    match = re.match(r"ALTER TABLE (\w+) ADD COLUMN (\w+)", sql)
    if match is None:
        return False
    table, column = match.groups()
    return column in {c["name"] for c in inspect(s.connection()).get_columns(table)}


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
            f"{m.SCHEMA_VERSION}: upgrade tunedeck, or point TUNEDECK_DATABASE_URL at another database"
        )
    dialect = s.get_bind().dialect.name
    for version in range(found + 1, m.SCHEMA_VERSION + 1):
        for statement in MIGRATIONS.get(version, []):
            sql = statement_for(statement, dialect)
            if sql is not None and not _column_exists(s, sql):
                s.connection().exec_driver_sql(sql)
    row.value = str(m.SCHEMA_VERSION)
