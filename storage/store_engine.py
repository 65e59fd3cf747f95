"""Runs handed to a cluster's scheduler (Slurm, Ray) for `storage.store.Store`: claim, job id, state, settling.

    run = store.claim_for_engine("host:1", "slurm")           # queued -> running, no device lease
    store.set_engine_job(run.id, "123", "submitted")          # the engine's job id and state
    store.engine_runs("slurm")                                # running runs of that engine (re-adopted on restart)
    store.settle_engine_run(run.id, RunStatus.FAILED, "Slurm: TIMEOUT (time limit 00:01:00)")

A dispatcher (`jobs.cluster.dispatch`) claims with a status guard and a rowcount check, as a local
worker does, but takes no device lease: the cluster's scheduler hands out the GPUs. A run pinned
to a host (`pin_host`) is claimed all the same (the engine is asked for that node); a run pinned
to a device (`pin_device`) is left to a local worker there. The run's `worker_pid` stays NULL, so
no local worker on the dispatcher's host takes the run for one of its own dead children.

The dispatcher decides how an engine run ended once the engine's job has ended: the job's side
may have marked it interrupted (the engine sent SIGTERM) or cancelled (the training child's answer
to that SIGTERM), and `settle_engine_run` replaces those with the engine's reason. A run that
succeeded, failed by itself, or was cancelled by the user keeps its status.
"""

from __future__ import annotations

from sqlalchemy import select, update

from storage import models as m
from storage.lifecycle import SETTLE, RunChange, move_run
from storage.models import RunStatus
from storage.records import RunRecord
from storage.store_core import StoreCore, rowcount


class EngineRunsMixin(StoreCore):
    """Store methods over the `engine*` columns of `runs` (schema 10)."""

    def claim_for_engine(self, worker_id: str, engine: str) -> RunRecord | None:
        """Atomically move the first queued run (not pinned to a device) to running for the dispatcher `worker_id`."""
        with self._tx() as s:
            candidate = s.scalars(
                select(m.Run.id)
                .where(m.Run.status == RunStatus.QUEUED.value, m.Run.pin_device.is_(None))
                .order_by(m.Run.queue_order, m.Run.id)
                .limit(1)
                .with_for_update(skip_locked=True)
            ).first()
            if candidate is None:
                return None
            claimed_now = move_run(
                s,
                candidate,
                RunChange.CLAIM,
                self._db_now(),
                worker_id=worker_id,
                worker_pid=None,
                child_pid=None,
                engine=engine[:16],
                engine_job_id=None,
                engine_state="submitting",
            )
            if not claimed_now:  # taken or cancelled since it was read
                return None
            claimed = s.get(m.Run, candidate)
            assert claimed is not None  # updated just above, in this transaction
            return RunRecord.from_row(claimed)

    def set_engine_job(self, run_id: int, job_id: str | None, state: str) -> None:
        """The engine's job id of a run (None: not submitted) and its state."""
        with self._tx() as s:
            s.execute(
                update(m.Run)
                .where(m.Run.id == run_id)
                .values(engine_job_id=job_id[:64] if job_id else None, engine_state=state)
            )

    def set_engine_state(self, run_id: int, state: str) -> None:
        with self._tx() as s:
            s.execute(update(m.Run).where(m.Run.id == run_id).values(engine_state=state))

    def engine_runs(self, engine: str) -> list[RunRecord]:
        """Running runs handed to `engine`, oldest claim first."""
        q = (
            select(m.Run)
            .where(m.Run.status == RunStatus.RUNNING.value, m.Run.engine == engine)
            .order_by(m.Run.started_at, m.Run.id)
        )
        with self._read() as s:
            return [RunRecord.from_row(r) for r in s.scalars(q)]

    def adopt_engine_run(self, run_id: int, worker_id: str) -> bool:
        """A restarted dispatcher takes over a running engine run (its job goes on); False if it is not running."""
        with self._tx() as s:
            result = s.execute(
                update(m.Run)
                .where(m.Run.id == run_id, m.Run.status == RunStatus.RUNNING.value, m.Run.engine.is_not(None))
                .values(worker_id=worker_id, heartbeat_at=self._db_now())
            )
            return rowcount(result) == 1

    def settle_engine_run(self, run_id: int, status: RunStatus, summary: str | None, detail: str | None = None) -> bool:
        """The dispatcher's word on how an engine run ended (see the module docstring); False when it keeps its own.

        Replaces running, interrupted (the job's side, on the engine's SIGTERM) and cancelled without the
        user's cancel (the training child's answer to that signal); `status` CANCELLED also replaces them."""
        if status not in SETTLE:
            raise ValueError(
                f"status: an engine run is settled as {', '.join(s.value for s in SETTLE)}, not {status.value}"
            )
        with self._tx() as s:
            return move_run(
                s,
                run_id,
                SETTLE[status],
                self._db_now(),
                error_summary=summary[:2000] if summary else None,
                error_detail=detail,
            )

    def add_engine_reason(self, run_id: int, reason: str) -> bool:
        """Put the engine's reason in front of a failed engine run's summary (once); False if it is not one."""
        with self._tx() as s:
            row = s.get(m.Run, run_id)
            if row is None or row.engine is None or row.status != RunStatus.FAILED.value:
                return False
            if (row.error_summary or "").startswith(reason):
                return False
            row.error_summary = f"{reason}; {row.error_summary}"[:2000] if row.error_summary else reason[:2000]
            return True
