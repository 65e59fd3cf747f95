"""Runs as plain data, shared by `tunedeck runs --json`, the run page and the API.

What can be done to a run (submit, cancel, resume, delete, tag, clone) lives in `jobs.queue.run_actions`;
this module describes runs for the front ends, so the three of them show the same fields.

    summaries(store, store.list_runs())          # JSON-ready dicts (id, status, tags, disk_bytes, ...)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypedDict

from jobs.spec.stored import spec_of
from storage.records import RunRecord
from storage.roles_pages import RunCounts
from storage.run_files import DiskUsage


# ---------------------------------------------------------------------- plain data
def finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN or infinity: a non-finite value (a diverged loss) becomes null."""
    return value if value is not None and math.isfinite(value) else None


class RunSummary(TypedDict):
    """One run as plain data: `tunedeck runs --json` and the API's `runs` and `run` (times are Unix seconds)."""

    id: int
    name: str
    status: str
    model: str
    method: str
    trainer: str
    tags: list[str]
    note: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    current_step: int
    total_steps: int | None
    last_loss: float | None
    peak_memory_bytes: int | None
    peak_memory_source: str | None
    disk_bytes: int
    error_summary: str | None


def summaries(store: RunCounts, runs: Sequence[RunRecord], disk: DiskUsage | None = None) -> list[RunSummary]:
    """One JSON-ready summary per run."""
    usage = disk or DiskUsage(store)
    loss = store.last_metric_values([r.id for r in runs], "loss")
    return [
        RunSummary(
            id=r.id,
            name=r.name,
            status=r.status.value,
            model=spec_of(r).model,
            method=spec_of(r).method.value,
            trainer=spec_of(r).trainer.value,
            tags=list(r.tags),
            note=r.note,
            created_at=r.created_at,
            started_at=r.started_at,
            finished_at=r.finished_at,
            current_step=r.current_step,
            total_steps=r.total_steps,
            last_loss=finite_or_none(loss.get(r.id)),
            peak_memory_bytes=r.peak_memory_bytes,
            peak_memory_source=r.peak_memory_source,
            disk_bytes=usage.of(r),
            error_summary=r.error_summary,
        )
        for r in runs
    ]
