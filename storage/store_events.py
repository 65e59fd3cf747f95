"""Run events, published worker device facts and trick sweeps for `storage.store.Store`.

A mixin: it uses the store's `_tx` and `_read`, and keeps all of its SQL here. Everything it
stores is plain JSON (dicts); `jobs.train.oom`, `jobs.devices.facts` and `jobs.queue.sweep` give it meaning.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select

from storage import models as m
from storage.lifecycle import new_run
from storage.store_core import StoreCore


class EventsMixin(StoreCore):
    """Store methods over `run_events`, `worker_devices` and `sweep_runs`."""

    # ------------------------------------------------------------------ run events
    def add_run_event(
        self, run_id: int, kind: str, message: str, *, step: int | None = None, data: dict[str, Any] | None = None
    ) -> int:
        with self._tx() as s:
            row = m.RunEvent(
                run_id=run_id,
                time=time.time(),
                step=step,
                kind=kind,
                message=message,
                data_json=json.dumps(data) if data is not None else None,
            )
            s.add(row)
            s.flush()
            return row.id

    def run_events(self, run_id: int) -> list[dict[str, Any]]:
        """A run's events, oldest first: {id, time, step, kind, message, data}."""
        q = select(m.RunEvent).where(m.RunEvent.run_id == run_id).order_by(m.RunEvent.id)
        with self._read() as s:
            return [
                {
                    "id": e.id,
                    "time": e.time,
                    "step": e.step,
                    "kind": e.kind,
                    "message": e.message,
                    "data": json.loads(e.data_json) if e.data_json else {},
                }
                for e in s.scalars(q)
            ]

    def events_of_runs(self, run_ids: Sequence[int], kind: str) -> dict[int, list[dict[str, Any]]]:
        """The events of one kind of several runs in one read, oldest first: {run_id: [{step, message, data}]}
        (the runs table's and Compare's doctor column)."""
        out: dict[int, list[dict[str, Any]]] = {}
        if not run_ids:
            return out
        q = (
            select(m.RunEvent)
            .where(m.RunEvent.run_id.in_(list(run_ids)), m.RunEvent.kind == kind)
            .order_by(m.RunEvent.id)
        )
        with self._read() as s:
            for e in s.scalars(q):
                data = json.loads(e.data_json) if e.data_json else {}
                out.setdefault(e.run_id, []).append(
                    {"kind": e.kind, "step": e.step, "message": e.message, "data": data}
                )
        return out

    # ------------------------------------------------------------------ worker devices
    def publish_device(self, worker_id: str, host: str, facts: dict[str, Any]) -> None:
        """Record (or replace) the device facts of a worker; kept after it stops (last known hardware)."""
        with self._tx() as s:
            s.merge(
                m.WorkerDevice(
                    worker_id=worker_id[:128], host=host[:256], facts_json=json.dumps(facts), published_at=time.time()
                )
            )

    def published_devices(self) -> list[dict[str, Any]]:
        """Every published worker device, newest first: {worker_id, host, facts, published_at}."""
        q = select(m.WorkerDevice).order_by(m.WorkerDevice.published_at.desc())
        with self._read() as s:
            return [
                {
                    "worker_id": d.worker_id,
                    "host": d.host,
                    "facts": json.loads(d.facts_json),
                    "published_at": d.published_at,
                }
                for d in s.scalars(q)
            ]

    # ------------------------------------------------------------------ trick sweeps
    def create_sweep(self, probes: list[tuple[str, str, str, str]]) -> tuple[int, list[int]]:
        """Queue one run per (trick, note, run name, spec JSON) under a new sweep id, in one transaction.

        The caller (`jobs.queue.sweep`) has validated each spec. Returns (sweep id, run ids)."""
        now = time.time()
        with self._tx() as s:
            sweep_id = int(s.scalar(select(func.coalesce(func.max(m.SweepRun.sweep_id), 0))) or 0) + 1
            ids = []
            for i, (trick, note, name, spec_json) in enumerate(probes):
                row = new_run(
                    id=self._unused_run_id(s),
                    name=name,
                    spec_json=spec_json,
                    created_at=now,
                    queue_order=now + i * 1e-6,
                    cancel_requested=0,
                    current_step=0,
                )
                s.add(row)
                s.flush()
                s.add(m.SweepRun(run_id=row.id, sweep_id=sweep_id, trick=trick, note=note))
                ids.append(row.id)
            return sweep_id, ids

    def sweep_runs(self, sweep_id: int) -> list[dict[str, Any]]:
        """The probe runs of one sweep in queue order: {run_id, trick, note}."""
        q = select(m.SweepRun).where(m.SweepRun.sweep_id == sweep_id).order_by(m.SweepRun.run_id)
        with self._read() as s:
            return [{"run_id": r.run_id, "trick": r.trick, "note": r.note} for r in s.scalars(q)]

    def sweep_ids(self, limit: int = 50) -> list[int]:
        """Sweep ids, newest first."""
        q = select(m.SweepRun.sweep_id).group_by(m.SweepRun.sweep_id).order_by(m.SweepRun.sweep_id.desc()).limit(limit)
        with self._read() as s:
            return [int(x) for x in s.scalars(q)]
