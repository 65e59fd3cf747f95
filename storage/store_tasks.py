"""Tasks for `storage.store.Store`: requests the dashboard writes for a worker (exports, pushes), their progress and result.

    task_id = store.create_task(run_id, "merged", {"dtype": "fp32"})      # queued
    task = store.claim_task(task_id, "host:12")       # status guard + rowcount: one worker gets it
    store.task_progress(task_id, ["loading base ..."])   # append lines, heartbeat; returns its control
    store.finish_task(task_id, TaskStatus.SUCCEEDED, result={"files": [...]})
    store.fail_stale_tasks(30.0)                      # running tasks whose worker stopped beating

The store knows nothing of what a kind means: kinds and arguments are strings and JSON to it
(`jobs.worker.tasks` gives them meaning). Heartbeats are on the database's clock, as runs' are, so
any worker on any host can tell a task whose worker died. A task's log keeps its newest
`TASK_LOG_LINES` lines in one text column (the same on SQLite and PostgreSQL).

A GPU task holds its worker's device lease while it runs (`hold_device_for_task`), in the same
`meta` row a training run's claim takes (`storage.store_leases`), under a holder id of its own, so a
training claim waits for the export and the export waits for a training run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import func, select, update

from storage import models as m
from storage.lifecycle import TASK_ENDS, TaskChange, move_task, new_task
from storage.models import TaskStatus
from storage.records import TaskControl, TaskRecord
from storage.store_core import StoreCore
from storage.store_leases import _lease_key, _lock_lease, lease_runs

TASK_LOG_LINES = 200  # the newest lines of a task's progress kept in the store
_LINE_CHARS = 2000  # one line longer than this is cut (a progress bar without newlines)


class TasksMixin(StoreCore):
    """Store methods over the `tasks` table (and a GPU task's hold on the device lease)."""

    def create_task(self, run_id: int | None, kind: str, args: dict[str, Any] | None = None) -> int:
        with self._tx() as s:
            row = new_task(
                run_id=run_id,
                kind=kind[:32],
                args_json=json.dumps(args or {}),
                created_at=time.time(),
                cancel_requested=0,
                log_text="",
                log_count=0,
            )
            s.add(row)
            s.flush()
            return row.id

    def get_task(self, task_id: int) -> TaskRecord | None:
        with self._read() as s:
            row = s.get(m.Task, task_id)
            return TaskRecord.from_row(row) if row is not None else None

    def tasks_of(self, task_ids: Iterable[int]) -> list[TaskRecord]:
        """The tasks with these ids, in id order (one SELECT: what a page following them reads each tick)."""
        ids = [int(i) for i in task_ids]
        if not ids:
            return []
        with self._read() as s:
            return [
                TaskRecord.from_row(r) for r in s.scalars(select(m.Task).where(m.Task.id.in_(ids)).order_by(m.Task.id))
            ]

    def run_tasks(self, run_id: int, limit: int = 20) -> list[TaskRecord]:
        """A run's newest tasks, newest first."""
        q = select(m.Task).where(m.Task.run_id == run_id).order_by(m.Task.id.desc()).limit(limit)
        with self._read() as s:
            return [TaskRecord.from_row(r) for r in s.scalars(q)]

    def queued_tasks(self, kinds: Sequence[str], limit: int = 50) -> list[TaskRecord]:
        """Queued tasks of these kinds, oldest first (the worker picks the ones whose run it can reach)."""
        q = (
            select(m.Task)
            .where(m.Task.status == TaskStatus.QUEUED.value, m.Task.kind.in_(list(kinds)))
            .order_by(m.Task.id)
            .limit(limit)
        )
        with self._read() as s:
            return [TaskRecord.from_row(r) for r in s.scalars(q)]

    def claim_task(self, task_id: int, worker_id: str) -> TaskRecord | None:
        """Move a queued task to running for `worker_id`; None when another worker (or a cancel) was first."""
        with self._tx() as s:
            if not move_task(s, task_id, TaskChange.CLAIM, self._db_now(), worker_id=worker_id[:128]):
                return None
            row = s.get(m.Task, task_id)
            assert row is not None  # updated just above, in this transaction
            return TaskRecord.from_row(row)

    def task_progress(self, task_id: int, lines: Sequence[str] = ()) -> TaskControl | None:
        """Append `lines` to a task's log (keeping the newest TASK_LOG_LINES) and beat its heartbeat, in one
        transaction; returns its status and whether a cancel was asked for (None: the task is gone)."""
        with self._tx() as s:
            row = s.get(m.Task, task_id)
            if row is None:
                return None
            values: dict[str, Any] = {"heartbeat_at": self._db_now()}
            if lines:
                kept = (row.log_text.split("\n") if row.log_text else []) + [line[:_LINE_CHARS] for line in lines]
                values["log_text"] = "\n".join(kept[-TASK_LOG_LINES:])
                values["log_count"] = (row.log_count or 0) + len(lines)
            s.execute(update(m.Task).where(m.Task.id == task_id).values(**values))
            return TaskControl(TaskStatus(row.status), bool(row.cancel_requested))

    def finish_task(
        self,
        task_id: int,
        status: TaskStatus,
        *,
        result: dict[str, Any] | None = None,
        error: str | None = None,
        only_if: Iterable[TaskStatus] = (TaskStatus.RUNNING,),
    ) -> bool:
        """End a task (succeeded, failed or cancelled) if it is still in one of `only_if`; True when it was.

        `only_if` narrows the statuses `storage.lifecycle.TASK_MOVES` lets that end start from."""
        assert status.finished, status
        with self._tx() as s:
            return move_task(
                s,
                task_id,
                TASK_ENDS[status],
                self._db_now(),
                only_from=only_if,
                result_json=json.dumps(result) if result is not None else None,
                error=error[:4000] if error else None,
            )

    def cancel_task(self, task_id: int) -> TaskStatus | None:
        """Cancel a task: a queued one at once, a running one by asking its worker (it stops the child).

        Returns the task's status after the call (None: no such task)."""
        if self.finish_task(
            task_id, TaskStatus.CANCELLED, error="cancelled before it started", only_if=[TaskStatus.QUEUED]
        ):
            return TaskStatus.CANCELLED
        with self._tx() as s:
            move_task(s, task_id, TaskChange.ASK_TO_STOP, self._db_now())
            row = s.get(m.Task, task_id)
            return TaskStatus(row.status) if row is not None else None

    def fail_stale_tasks(self, older_than_s: float) -> list[int]:
        """Fail running tasks whose worker has not beaten for `older_than_s` (the database's clock); their ids."""
        q = select(m.Task.id, m.Task.worker_id).where(
            m.Task.status == TaskStatus.RUNNING.value,
            func.coalesce(m.Task.heartbeat_at, 0) < self._db_now() - older_than_s,
        )
        with self._read() as s:
            stale = list(s.execute(q).all())
        failed = []
        for task_id, worker_id in stale:
            reason = (
                f"worker {worker_id} stopped sending heartbeats (none for {older_than_s:g} s) while it carried "
                "this out; request it again"
            )
            if self.finish_task(task_id, TaskStatus.FAILED, error=reason):
                failed.append(task_id)
        return failed

    def hold_device_for_task(
        self, device: str, holder: str, host: str, run_id: int | None, task_id: int, pid: int
    ) -> dict[str, Any]:
        """Take (host, device)'s lease for a task, under `holder` (not the worker's own id, so its training
        claims wait). Returns {} when taken, else the lease that holds the device now (nothing changed)."""
        with self._tx() as s:
            lease = _lock_lease(s, _lease_key(host, device))
            current = json.loads(lease.value or "{}")
            if lease_runs(current) and current.get("worker_id") != holder:
                return current
            lease.value = json.dumps(
                {
                    "run_id": run_id,
                    "worker_id": holder,
                    "pid": pid,
                    "time": time.time(),
                    "runs": [{"run_id": run_id, "bytes": None}],
                    "task_id": task_id,
                }
            )
            return {}
