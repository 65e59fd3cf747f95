"""Frozen snapshots of stored rows (runs, metric points, memory samples, buckets, artifacts).

They are detached from any session, so the UI and the worker can hold them freely; only
`storage.store.Store` creates them from rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from storage import models as m
from storage.models import RunStatus, TaskStatus


@dataclass(frozen=True)
class RunRecord:
    """A snapshot of one run row, detached from any session."""

    id: int
    name: str
    spec_json: str  # the job spec as stored; `jobs.spec.stored.spec_of(run)` parses it
    status: RunStatus
    created_at: float
    started_at: float | None
    finished_at: float | None
    heartbeat_at: float | None
    worker_id: str | None
    worker_pid: int | None
    child_pid: int | None
    exit_code: int | None
    cancel_requested: bool
    error_summary: str | None
    error_detail: str | None
    current_step: int
    total_steps: int | None
    final_metrics: dict[str, float]
    resolved_config: dict[str, Any]
    peak_memory_bytes: int | None
    peak_memory_source: str | None
    log_path: str | None
    tags: tuple[str, ...] = ()
    note: str | None = None
    progress_at: float | None = None
    pin_host: str | None = None
    pin_device: str | None = None
    run_alone: bool = False  # outgrew its share of a device: never shared again
    engine: str | None = None  # the cluster scheduler that runs it ("slurm", "ray"); None: a local worker
    engine_job_id: str | None = None  # its job id there
    engine_state: str | None = None  # its state there, in the engine's words: "RUNNING on node3"

    @classmethod
    def from_row(cls, row: m.Run) -> RunRecord:
        return cls(
            id=row.id,
            name=row.name,
            spec_json=row.spec_json,
            status=RunStatus(row.status),
            created_at=row.created_at,
            started_at=row.started_at,
            finished_at=row.finished_at,
            heartbeat_at=row.heartbeat_at,
            worker_id=row.worker_id,
            worker_pid=row.worker_pid,
            child_pid=row.child_pid,
            exit_code=row.exit_code,
            cancel_requested=bool(row.cancel_requested),
            error_summary=row.error_summary,
            error_detail=row.error_detail,
            current_step=row.current_step or 0,
            total_steps=row.total_steps,
            final_metrics=json.loads(row.final_metrics_json) if row.final_metrics_json else {},
            resolved_config=json.loads(row.resolved_config_json) if row.resolved_config_json else {},
            peak_memory_bytes=row.peak_memory_bytes,
            peak_memory_source=row.peak_memory_source,
            log_path=row.log_path,
            tags=tuple(t.tag for t in row.tag_rows),
            note=row.note,
            progress_at=row.progress_at,
            pin_host=row.pin_host,
            pin_device=row.pin_device,
            run_alone=bool(row.run_alone),
            engine=row.engine,
            engine_job_id=row.engine_job_id,
            engine_state=row.engine_state,
        )


@dataclass(frozen=True)
class RunControl:
    """The two columns a watcher needs each second: is the run still running, is a cancel asked for."""

    status: RunStatus
    cancel_requested: bool


@dataclass(frozen=True)
class MetricPoint:
    step: int
    name: str
    value: float
    time: float


@dataclass(frozen=True)
class MemoryPoint:
    """One memory sample; `run_id` is None for samples taken while no run was active."""

    time: float
    source: str
    run_id: int | None = None
    device_index: int | None = None
    used_bytes: int | None = None
    total_bytes: int | None = None
    utilization: float | None = None
    temperature: float | None = None
    power_watts: float | None = None
    torch_allocated: int | None = None
    torch_reserved: int | None = None
    torch_max_allocated: int | None = None
    process_rss: int | None = None
    worker_id: str | None = None  # the worker whose device this is (None: written before schema 8)


@dataclass(frozen=True)
class MetricBucket:
    """A bucket of consecutive steps of one metric: its step span, min, max, sum and row count."""

    first_step: int
    last_step: int
    # None when every value in the bucket is non-finite (stored as NULL): only buckets read from raw
    # rows (`Store.metric_buckets`, narrow widths) can be; rollups skip NULL values.
    min: float | None
    max: float | None
    total: float | None
    count: int


@dataclass(frozen=True)
class MemoryBucket:
    """A time bucket of memory samples from one source; maxima keep spikes visible."""

    source: str
    first_time: float
    last_time: float
    used_min: int | None
    used_max: int | None
    total_max: int | None
    utilization_max: float | None
    torch_allocated_max: int | None
    torch_reserved_max: int | None
    rss_min: int | None
    rss_max: int | None
    count: int


@dataclass(frozen=True)
class ArtifactRecord:
    id: int
    run_id: int
    kind: str
    path: str
    size: int
    sha256: str
    created_at: float


_MEMORY_FIELDS = [f for f in MemoryPoint.__dataclass_fields__]


class QueueableSpec(Protocol):
    """What the store needs of a job spec (`jobs.spec.job.JobSpec`): it stores the JSON, never parses it."""

    @property
    def display_name(self) -> str: ...

    @property
    def pin_host(self) -> str | None: ...

    @property
    def pin_device(self) -> str | None: ...

    def validate(self) -> Any: ...

    def to_json(self) -> str: ...


@dataclass(frozen=True)
class TaskRecord:
    id: int
    run_id: int | None  # None: a task on a spec, before any run (its spec in `args`)
    kind: str
    args: dict[str, Any]
    status: TaskStatus
    worker_id: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    cancel_requested: bool
    log: list[str]
    log_count: int
    result: dict[str, Any] | None
    error: str | None

    @classmethod
    def from_row(cls, row: m.Task) -> TaskRecord:
        return cls(
            id=row.id,
            run_id=row.run_id,
            kind=row.kind,
            args=json.loads(row.args_json or "{}"),
            status=TaskStatus(row.status),
            worker_id=row.worker_id,
            created_at=row.created_at,
            started_at=row.started_at,
            finished_at=row.finished_at,
            cancel_requested=bool(row.cancel_requested),
            log=row.log_text.split("\n") if row.log_text else [],
            log_count=row.log_count or 0,
            result=json.loads(row.result_json) if row.result_json else None,
            error=row.error,
        )


@dataclass(frozen=True)
class TaskControl:
    """What the worker carrying a task out needs to know after each progress write."""

    status: TaskStatus
    cancel_requested: bool
