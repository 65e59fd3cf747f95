"""SQLAlchemy 2 table definitions. Only `storage.store.Store` issues SQL against them."""

from __future__ import annotations

import time
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import BigInteger, Float, ForeignKey, Index, Integer, String, Table, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

SCHEMA_VERSION = 14


class RunStatus(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"

    @property
    def finished(self) -> bool:
        return self in {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.INTERRUPTED}


class MemorySource(str, Enum):
    NVML = "nvml"
    TORCH = "torch"
    HOST = "host"


class Base(DeclarativeBase):
    if TYPE_CHECKING:
        # Every model here is declared with __tablename__, so declarative maps it to a Table (the
        # stubs allow any FromClause, for classes mapped to a select); Table has insert() and delete().
        __table__: ClassVar[Table]


# Row ids of the tables that grow without bound: 64-bit on PostgreSQL. SQLite keeps INTEGER,
# the only type that makes a primary key the (already 64-bit) rowid.
BigId = BigInteger().with_variant(Integer, "sqlite")


class Meta(Base):
    __tablename__ = "meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(256))
    spec_json: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), index=True)
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
    heartbeat_at: Mapped[float | None] = mapped_column(Float)  # written by the worker only, on the database's clock
    worker_id: Mapped[str | None] = mapped_column(String(128))
    worker_pid: Mapped[int | None] = mapped_column(Integer)
    child_pid: Mapped[int | None] = mapped_column(Integer)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    cancel_requested: Mapped[int] = mapped_column(Integer, default=0)
    queue_order: Mapped[float] = mapped_column(Float)
    error_summary: Mapped[str | None] = mapped_column(Text)
    error_detail: Mapped[str | None] = mapped_column(Text)
    current_step: Mapped[int] = mapped_column(Integer, default=0)
    total_steps: Mapped[int | None] = mapped_column(Integer)
    final_metrics_json: Mapped[str | None] = mapped_column(Text)
    resolved_config_json: Mapped[str | None] = mapped_column(Text)
    peak_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    peak_memory_source: Mapped[str | None] = mapped_column(String(16))
    log_path: Mapped[str | None] = mapped_column(Text)
    progress_at: Mapped[float | None] = mapped_column(Float)  # the training child's last step report
    pin_host: Mapped[str | None] = mapped_column(String(128))  # only a worker on this host may claim it
    pin_device: Mapped[str | None] = mapped_column(String(32))  # only a worker on this device may claim it
    note: Mapped[str | None] = mapped_column(Text)  # the user's free-text note (schema 6)
    # 1: never share a device again (it outgrew its share after OOM recovery; schema 9)
    run_alone: Mapped[int | None] = mapped_column(Integer, default=0, server_default="0")
    # A run handed to a cluster's scheduler (schema 10; NULL: a local worker runs it): the engine's
    # name ("slurm", "ray"), its job id there and its state in its own words (`JobState.describe()`).
    engine: Mapped[str | None] = mapped_column(String(16))
    engine_job_id: Mapped[str | None] = mapped_column(String(64))
    engine_state: Mapped[str | None] = mapped_column(Text)
    # Loaded with the run in one extra SELECT per query (never one per row); rows go with the run (FK cascade).
    tag_rows: Mapped[list[RunTag]] = relationship(lazy="selectin", order_by="RunTag.tag", viewonly=True)


def progress_values(step: int, total_steps: int | None = None) -> dict[str, Any]:
    """The `runs` columns of a training child's step report; `progress_at` is its time (never the heartbeat)."""
    values: dict[str, Any] = {"current_step": int(step), "progress_at": time.time()}
    if total_steps is not None:
        values["total_steps"] = int(total_steps)
    return values


class RunTag(Base):
    """One tag of one run (schema 6); a run has any number of distinct tags."""

    __tablename__ = "run_tags"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(64), primary_key=True)
    __table_args__ = (Index("ix_run_tags_tag", "tag"),)


class Metric(Base):
    __tablename__ = "metrics"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(128))
    value: Mapped[float | None] = mapped_column(Float)  # NULL = non-finite (SQLite has no NaN); read back as nan
    time: Mapped[float] = mapped_column(Float)
    __table_args__ = (Index("ix_metrics_run_name_step", "run_id", "name", "step"),)


class MemorySample(Base):
    __tablename__ = "memory_samples"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    time: Mapped[float] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(8))
    device_index: Mapped[int | None] = mapped_column(Integer)
    worker_id: Mapped[str | None] = mapped_column(String(128))  # the worker whose device this sample is of
    used_bytes: Mapped[int | None] = mapped_column(BigInteger)
    total_bytes: Mapped[int | None] = mapped_column(BigInteger)
    utilization: Mapped[float | None] = mapped_column(Float)
    temperature: Mapped[float | None] = mapped_column(Float)
    power_watts: Mapped[float | None] = mapped_column(Float)
    torch_allocated: Mapped[int | None] = mapped_column(BigInteger)
    torch_reserved: Mapped[int | None] = mapped_column(BigInteger)
    torch_max_allocated: Mapped[int | None] = mapped_column(BigInteger)
    process_rss: Mapped[int | None] = mapped_column(BigInteger)
    __table_args__ = (Index("ix_memory_run_time", "run_id", "time"), Index("ix_memory_time", "time"))


class MetricRollup(Base):
    """Per-run, per-metric aggregates over aligned buckets of 2**level steps (bucket = step >> level).

    Maintained by `Store.add_metrics` in the same transaction as the raw rows, so a long run's
    graph reads ~1,000 rollup rows instead of scanning every raw row.
    """

    __tablename__ = "metric_rollups"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    level: Mapped[int] = mapped_column(Integer, primary_key=True)
    bucket: Mapped[int] = mapped_column(Integer, primary_key=True)
    first_step: Mapped[int] = mapped_column(Integer)
    last_step: Mapped[int] = mapped_column(Integer)
    value_min: Mapped[float] = mapped_column(Float)
    value_max: Mapped[float] = mapped_column(Float)
    value_sum: Mapped[float] = mapped_column(Float)
    row_count: Mapped[int] = mapped_column(Integer)
    __table_args__ = {"sqlite_with_rowid": False}


class MemoryRollup(Base):
    """Per-run, per-source aggregates of memory samples over aligned time buckets of 2**level / 16 s.

    bucket = floor(time * 16) >> level; maintained by `Store.add_memory_samples` (run samples only).
    """

    __tablename__ = "memory_rollups"
    # Key order (run, level, source, bucket): a graph reads all sources of one level at once.
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    level: Mapped[int] = mapped_column(Integer, primary_key=True)
    source: Mapped[str] = mapped_column(String(8), primary_key=True)
    bucket: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # floor(time * 16) > 2**31
    first_time: Mapped[float] = mapped_column(Float)
    last_time: Mapped[float] = mapped_column(Float)
    used_min: Mapped[int | None] = mapped_column(BigInteger)
    used_max: Mapped[int | None] = mapped_column(BigInteger)
    total_max: Mapped[int | None] = mapped_column(BigInteger)
    utilization_max: Mapped[float | None] = mapped_column(Float)
    torch_allocated_max: Mapped[int | None] = mapped_column(BigInteger)
    torch_reserved_max: Mapped[int | None] = mapped_column(BigInteger)
    rss_min: Mapped[int | None] = mapped_column(BigInteger)
    rss_max: Mapped[int | None] = mapped_column(BigInteger)
    row_count: Mapped[int] = mapped_column(Integer)
    device_index: Mapped[int | None] = mapped_column(Integer)  # the GPU the samples came from (a run has one)
    __table_args__ = {"sqlite_with_rowid": False}


class Artifact(Base):
    __tablename__ = "artifacts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    path: Mapped[str] = mapped_column(Text)
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)


class RunEvent(Base):
    """Something that happened to a run besides its status: e.g. an OOM recovery and the spec it continued with."""

    __tablename__ = "run_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    time: Mapped[float] = mapped_column(Float)
    step: Mapped[int | None] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
    data_json: Mapped[str | None] = mapped_column(Text)


class WorkerDevice(Base):
    """The device facts a worker published when it started (plain JSON; `jobs.devices.facts` reads it)."""

    __tablename__ = "worker_devices"
    worker_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    host: Mapped[str] = mapped_column(String(256))
    facts_json: Mapped[str] = mapped_column(Text)
    published_at: Mapped[float] = mapped_column(Float)


class SweepRun(Base):
    """One probe run of a trick sweep: which sweep, which trick, and the note on what changed."""

    __tablename__ = "sweep_runs"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    sweep_id: Mapped[int] = mapped_column(Integer, index=True)
    trick: Mapped[str] = mapped_column(String(32))
    note: Mapped[str] = mapped_column(Text)


class Search(Base):
    """A hyperparameter search (schema 13): a base spec, its space and budget (`jobs.search.plan`, as JSON),
    the Optuna study that samples it (kept in this same database) and which worker drives it now."""

    __tablename__ = "searches"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(256))
    plan_json: Mapped[str] = mapped_column(Text)
    study_name: Mapped[str] = mapped_column(String(256))
    state: Mapped[str] = mapped_column(String(16), index=True)  # active, finished, stopped
    created_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
    driver_id: Mapped[str | None] = mapped_column(String(128))  # the worker that advances it
    driver_at: Mapped[float | None] = mapped_column(Float)  # its last turn, on the database's clock


class SearchTrial(Base):
    """One trial of a search: Optuna's trial, its sampled values, its run (none when it was refused before
    queueing) and its outcome (`state`: asked, running, pruning, complete, pruned, failed, infeasible)."""

    __tablename__ = "search_trials"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    search_id: Mapped[int] = mapped_column(ForeignKey("searches.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)  # Optuna's trial number in the study
    optuna_trial_id: Mapped[int] = mapped_column(Integer)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"), index=True)
    params_json: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16))
    value: Mapped[float | None] = mapped_column(Float)  # the objective told to Optuna (or its last report)
    reported_step: Mapped[int] = mapped_column(Integer, default=-1)  # the last step reported to Optuna
    reason: Mapped[str | None] = mapped_column(Text)  # why it was refused, pruned or failed
    created_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)


class TaskStatus(str, Enum):
    """Where a task (work a worker carries out beside training: an export, a push) stands."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in {TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED}


class Task(Base):
    """A request the dashboard wrote for a worker (an export, a push), with its progress and result.

    `kind` and `args_json` mean something to the worker only (`jobs.worker.tasks`); the store keeps
    them as text. `log_text` holds the newest lines of its progress (`storage.store_tasks.TASK_LOG_LINES`),
    `log_count` counts every line ever written (what a page compares to see that something moved).
    A task with no run (`run_id` NULL, schema 13) is on a spec before training: "try rewards"."""

    __tablename__ = "tasks"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # NULL: a task on a spec before any run exists ("try rewards"; its spec is in args_json)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    args_json: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), index=True)
    worker_id: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
    heartbeat_at: Mapped[float | None] = mapped_column(Float)  # written by the worker, on the database's clock
    cancel_requested: Mapped[int] = mapped_column(Integer, default=0)
    log_text: Mapped[str] = mapped_column(Text, default="")
    log_count: Mapped[int] = mapped_column(Integer, default=0)
    result_json: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)


class ReplyStatus(str, Enum):
    """Where one chat reply is: written by the dashboard as pending, claimed and streamed by a worker."""

    PENDING = "pending"
    STREAMING = "streaming"
    DONE = "done"
    FAILED = "failed"


class ChatKind(str, Enum):
    """Whose a chat session is: the Chat tab's conversation, or one /v1 request's (never shown in the tab)."""

    TAB = "tab"
    API = "api"


class ChatSession(Base):
    """One conversation with a finished run (and its base, side by side): its system prompt and sampling."""

    __tablename__ = "chat_sessions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    system: Mapped[str] = mapped_column(Text, default="")
    sampling_json: Mapped[str] = mapped_column(Text, default="{}")
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    # ChatKind: "tab" (the Chat tab's conversation) or "api" (one /v1 request's, deleted once it is answered)
    kind: Mapped[str] = mapped_column(String(8), default="tab", server_default="tab")


class ChatMessage(Base):
    """One message of a chat session: a user turn, or one side's ("base" or "run") reply to it."""

    __tablename__ = "chat_messages"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("chat_sessions.id", ondelete="CASCADE"))
    turn: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(16))  # user | assistant
    side: Mapped[str | None] = mapped_column(String(8))  # assistant replies: base | run
    content: Mapped[str] = mapped_column(Text, default="")
    status: Mapped[str] = mapped_column(String(16))  # ReplyStatus (a user turn is done when written)
    note: Mapped[str | None] = mapped_column(Text)  # the worker's progress line, e.g. "loading the model"
    error: Mapped[str | None] = mapped_column(Text)
    worker_id: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
    image_path: Mapped[str | None] = mapped_column(Text)  # a user turn's attached image: a file in the data folder
    __table_args__ = (
        Index("ix_chat_messages_session_turn", "session_id", "turn"),
        Index("ix_chat_messages_status", "status"),
    )


class EvalScore(Base):
    """One benchmark score of a run or of its base model: a task's metric with its standard error.

    `model` is "run" or "base" (the same settings on both, `jobs.evaluate`); a task evaluated again
    replaces its earlier rows. A new table: `create_all` makes it in an existing database."""

    __tablename__ = "eval_scores"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    task: Mapped[str] = mapped_column(String(200))
    model: Mapped[str] = mapped_column(String(16))
    metric: Mapped[str] = mapped_column(String(100))
    value: Mapped[float | None] = mapped_column(Float)
    stderr: Mapped[float | None] = mapped_column(Float)
    samples: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)
