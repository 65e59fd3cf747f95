"""Run rows for `storage.store.Store`: queue, status changes, queue order, worker presence (claims and
device leases: `storage.store_leases`). Every status change is a move of `storage.lifecycle`.

A mixin: it uses the store's `_tx`, `_read` and `_retrying`, and keeps all of its SQL here.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import delete, func, select, update

from storage import models as m
from storage.lifecycle import RunChange, move_run, new_run
from storage.models import RunStatus
from storage.records import QueueableSpec, RunControl, RunRecord
from storage.rollups import rebuild_metric_rollups
from storage.store_core import StoreCore, rowcount
from storage.store_manage import search_filter


class RunsMixin(StoreCore):
    """Store methods over the `runs` table and the `meta` rows of device leases and workers."""

    # ------------------------------------------------------------------ runs
    def create_run(self, spec: QueueableSpec) -> int:
        """Queue a spec after its own `validate()`; stored as its JSON. Returns the new run id."""
        spec.validate()
        return self.create_run_unchecked(spec.to_json(), spec.display_name, spec.pin_host, spec.pin_device)

    def create_run_unchecked(
        self, spec_json: str, name: str = "unchecked", pin_host: str | None = None, pin_device: str | None = None
    ) -> int:
        """Queue spec JSON as it is (`create_run` validates first; tests store older/odd specs)."""
        now = time.time()
        with self._tx() as s:
            row = new_run(
                id=self._unused_run_id(s),
                name=name,
                spec_json=spec_json,
                pin_host=pin_host or None,
                pin_device=pin_device or None,
                created_at=now,
                queue_order=now,
                cancel_requested=0,
                current_step=0,
                run_alone=0,
            )
            s.add(row)
            s.flush()
            return row.id

    def count_runs(self) -> int:
        with self._read() as s:
            return int(s.scalar(select(func.count()).select_from(m.Run)) or 0)

    def get_run(self, run_id: int) -> RunRecord | None:
        with self._read() as s:
            row = s.get(m.Run, run_id)
            return RunRecord.from_row(row) if row else None

    def run_control(self, run_id: int) -> RunControl | None:
        """Status and cancel flag only: what the worker and the training child poll while a run trains.

        One two-column SELECT, no ORM objects and no tag load: a poll costs a fraction of `get_run`."""
        with self._read() as s:
            row = s.execute(select(m.Run.status, m.Run.cancel_requested).where(m.Run.id == run_id)).first()
        return RunControl(RunStatus(row.status), bool(row.cancel_requested)) if row is not None else None

    def list_runs(
        self,
        status: RunStatus | Sequence[RunStatus] | None = None,
        limit: int = 200,
        search: str | None = None,
        tag: str | None = None,
        before: int | None = None,
    ) -> list[RunRecord]:
        """Newest first, optionally filtered by status, a search text (name, tags, note), a tag, and to the runs
        older than run `before` (the next page after it)."""
        q = search_filter(select(m.Run).order_by(m.Run.id.desc()).limit(limit), search, tag)
        if before is not None:
            q = q.where(m.Run.id < before)
        if status is not None:
            statuses = [status] if isinstance(status, RunStatus) else list(status)
            q = q.where(m.Run.status.in_([st.value for st in statuses]))
        with self._read() as s:
            return [RunRecord.from_row(r) for r in s.scalars(q)]

    def queued(self) -> list[RunRecord]:
        """Queued runs in the order the worker will take them."""
        q = select(m.Run).where(m.Run.status == RunStatus.QUEUED.value).order_by(m.Run.queue_order, m.Run.id)
        with self._read() as s:
            return [RunRecord.from_row(r) for r in s.scalars(q)]

    def _set(self, run_id: int, **values: Any) -> None:
        def write() -> None:
            with self._tx() as s:
                s.execute(update(m.Run).where(m.Run.id == run_id).values(**values))

        self._retrying(write, "update run")

    def set_child(self, run_id: int, pid: int | None, log_path: str | None = None) -> None:
        values: dict[str, Any] = {"child_pid": pid}
        if log_path is not None:
            values["log_path"] = log_path
        self._set(run_id, **values)

    def heartbeat(self, run_id: int) -> None:
        """The worker's sign of life for its run, on the database's clock (only the worker writes it)."""
        self._set(run_id, heartbeat_at=self._db_now())

    def set_progress(self, run_id: int, step: int, total_steps: int | None = None) -> None:
        """The training child's step report; `progress_at` is its time (never the heartbeat)."""
        self._set(run_id, **m.progress_values(step, total_steps))

    def set_resolved_config(self, run_id: int, config: dict[str, Any]) -> None:
        self._set(run_id, resolved_config_json=json.dumps(config, default=str))

    def set_peak_memory(self, run_id: int, peak_bytes: int, source: str) -> None:
        """Raise the run's recorded peak if this one is higher."""
        with self._tx() as s:
            row = s.get(m.Run, run_id)
            if row is not None and (row.peak_memory_bytes is None or peak_bytes > row.peak_memory_bytes):
                row.peak_memory_bytes = int(peak_bytes)
                row.peak_memory_source = source

    def _move(self, run_id: int, change: RunChange, **values: Any) -> bool:
        with self._tx() as s:
            return move_run(s, run_id, change, self._db_now(), **values)

    def mark_succeeded(self, run_id: int, final_metrics: dict[str, float]) -> bool:
        return self._move(run_id, RunChange.SUCCEED, final_metrics_json=json.dumps(final_metrics), error_summary=None)

    def mark_failed(self, run_id: int, summary: str, detail: str | None = None, exit_code: int | None = None) -> bool:
        """Fail a running (or queued) run; returns False when it had already finished (first word wins)."""
        return self._move(
            run_id, RunChange.FAIL, error_summary=summary[:2000], error_detail=detail, exit_code=exit_code
        )

    def mark_cancelled(self, run_id: int, exit_code: int | None = None) -> bool:
        return self._move(run_id, RunChange.CANCEL, exit_code=exit_code)

    def mark_interrupted(self, run_id: int, summary: str) -> bool:
        return self._move(run_id, RunChange.INTERRUPT, error_summary=summary)

    def set_exit_code(self, run_id: int, exit_code: int) -> None:
        self._set(run_id, exit_code=exit_code)

    def request_cancel(self, run_id: int) -> RunStatus | None:
        """Cancel a queued run at once; flag a running one for its worker. Returns the new status."""
        with self._tx() as s:
            if move_run(s, run_id, RunChange.CANCEL, self._db_now(), only_from=[RunStatus.QUEUED]):
                return RunStatus.CANCELLED
            move_run(s, run_id, RunChange.ASK_TO_STOP, self._db_now())
            status = s.scalar(select(m.Run.status).where(m.Run.id == run_id))
            return RunStatus(status) if status is not None else None

    def stale_running(self, older_than_s: float) -> list[RunRecord]:
        """Running runs whose worker has not beaten for `older_than_s`, by the database's clock (hosts' clocks differ)."""
        q = select(m.Run).where(
            m.Run.status == RunStatus.RUNNING.value,
            func.coalesce(m.Run.heartbeat_at, m.Run.started_at, 0) < self._db_now() - older_than_s,
        )
        with self._read() as s:
            return [RunRecord.from_row(r) for r in s.scalars(q)]

    # ------------------------------------------------------------------ queue order, resume
    def move_queued(self, run_id: int, position: int) -> bool:
        """Move a queued run to `position` (0 = next to run) of the queue; False if it is not queued."""
        with self._tx() as s:
            rows = list(
                s.scalars(
                    select(m.Run).where(m.Run.status == RunStatus.QUEUED.value).order_by(m.Run.queue_order, m.Run.id)
                )
            )
            mine = next((r for r in rows if r.id == run_id), None)
            if mine is None:
                return False
            rest = [r for r in rows if r.id != run_id]
            position = max(0, min(position, len(rest)))
            # Between its new neighbours, so nothing else moves and later submissions stay behind.
            if not rest:
                return True
            if position == 0:
                mine.queue_order = rest[0].queue_order - 1.0
            elif position == len(rest):
                mine.queue_order = math.nextafter(rest[-1].queue_order, math.inf)
            else:
                mine.queue_order = (rest[position - 1].queue_order + rest[position].queue_order) / 2
            return True

    def requeue(self, run_id: int) -> bool:
        """Put an interrupted, cancelled or failed run back at the end of the queue (same id, same history).

        Its engine job (a cluster's, schema 10) is forgotten: whoever claims it next, a local worker or a
        dispatcher, runs it afresh (the run's events keep the earlier jobs)."""
        with self._tx() as s:
            return move_run(
                s,
                run_id,
                RunChange.REQUEUE,
                self._db_now(),
                cancel_requested=0,
                exit_code=None,
                child_pid=None,
                error_summary=None,
                error_detail=None,
                engine=None,
                engine_job_id=None,
                engine_state=None,
            )

    def truncate_metrics(self, run_id: int, after_step: int) -> int:
        """Delete a run's metric rows with step > after_step (a resume redoes those steps); rebuilds its rollups."""
        with self._tx() as s:
            n = rowcount(s.execute(delete(m.Metric).where(m.Metric.run_id == run_id, m.Metric.step > after_step)))
            if n:
                rebuild_metric_rollups(s, run_id)
            return n

    # ------------------------------------------------------------------ workers
    # A worker's presence is a `meta` row `worker:<id>` = {"pid", "host", "time"}, refreshed
    # while it lives (idle or busy), so `tunedeck run` can tell whether anyone will take its run.
    def worker_beat(self, worker_id: str, pid: int, host: str, run_id: int | Iterable[int] | None = None) -> None:
        """The worker's presence row, and the heartbeat of the run(s) it trains (if any), in one transaction.

        Plain UPDATE statements (an INSERT the first time): this runs every couple of seconds for
        the life of a worker, next to a training process that should have the machine."""
        key = f"worker:{worker_id}"[:64]
        value = json.dumps({"worker_id": worker_id, "pid": pid, "host": host, "time": time.time()})
        with self._tx() as s:
            if not rowcount(s.execute(update(m.Meta).where(m.Meta.key == key).values(value=value))):
                s.add(m.Meta(key=key, value=value))
            ids = [run_id] if isinstance(run_id, int) else list(run_id or ())
            if ids:
                s.execute(update(m.Run).where(m.Run.id.in_(ids)).values(heartbeat_at=self._db_now()))

    def worker_gone(self, worker_id: str) -> None:
        with self._tx() as s:
            s.execute(delete(m.Meta).where(m.Meta.key == f"worker:{worker_id}"[:64]))

    def live_workers(self, within_s: float = 10.0) -> list[dict[str, Any]]:
        """Workers that announced themselves in the last `within_s` seconds."""
        cutoff = time.time() - within_s
        with self._read() as s:
            rows = [json.loads(v) for v in s.scalars(select(m.Meta.value).where(m.Meta.key.like("worker:%")))]
        return [r for r in rows if r.get("time", 0) >= cutoff]
