"""Claims and device leases for `storage.store.Store`: which runs hold a device, and taking the next one.

    run = store.claim_next_on_device("host:1", "0")                        # one run per device (the default)
    run = store.claim_next_on_device("host:1", "0", share=DeviceShare(limit=4, capacity_bytes=80 * GIB,
                                                                      reserve={7: 9 * GIB, 8: 12 * GIB}))
    store.release_device("0", "host:1", run_id=7)                          # that run's processes are gone

The lease is a `meta` row `device:<host>:<device>` = {"run_id", "worker_id", "pid", "time", "runs"},
taken in the claim's transaction and released by its worker after the run's process group is gone,
so a run still writing its last checkpoint never shares the GPU with the next one unless both share.
`runs` lists every run on the device with the bytes it reserved (`null`: it does not share); `run_id`
is the first of them (what the chat manager and older readers look at). A worker that died holding
it is replaced by one on the same host (the only place its processes can be seen), which ends the
orphaned group and then releases the lease (`jobs.worker.loop.Worker`, `jobs.worker.leases`).

Sharing (`DeviceShare`): the store knows nothing of predictions; the worker passes, for each queued
run that may share, the bytes it would reserve on the device (its predicted peak plus a margin). A
run joins a device that already runs others only when it and every run there share, their count is
under the limit, and the reserved bytes together fit `capacity_bytes`; all of it decided in the
claim's one transaction. The queue stays FIFO: when its head does not fit, nothing is claimed.

Fit (`skip`): the worker also passes the queued runs its device cannot hold at all (their saved
prediction against its memory, `jobs.worker.fit`); the claim passes over them, so they stay queued
for a worker with a larger device while this one takes the next run that fits.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import or_, select, true
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from storage import models as m
from storage.lifecycle import RunChange, move_run
from storage.models import RunStatus
from storage.records import RunRecord
from storage.store_core import StoreCore


@dataclass(frozen=True)
class DeviceShare:
    """How a worker lets runs share its device: at most `limit` at once, reserving `reserve[run_id]` bytes each.

    A run missing from `reserve` does not share: it waits for a free device and holds it alone."""

    limit: int
    capacity_bytes: int
    reserve: Mapping[int, int] = field(default_factory=dict)


def _next_queued(s: Session, host: str, device: str, skip: Collection[int] = ()) -> int | None:
    """The first queued run not in `skip`, row-locked until the claim's transaction ends.

    On PostgreSQL the row is taken `FOR UPDATE SKIP LOCKED`: a run another claim holds is passed
    over, and one that stopped being queued since this statement began is re-checked and skipped.
    Whether its spec can be trained is the claimer's question (`jobs.spec.stored.spec_problem`).
    """
    return s.scalars(
        select(m.Run.id)
        .where(
            m.Run.status == RunStatus.QUEUED.value,
            or_(m.Run.pin_host.is_(None), m.Run.pin_host == host),
            or_(m.Run.pin_device.is_(None), m.Run.pin_device == device),
            m.Run.id.not_in(list(skip)) if skip else true(),
        )
        .order_by(m.Run.queue_order, m.Run.id)
        .limit(1)
        .with_for_update(skip_locked=True)
    ).first()


def _lease_key(host: str, device: str) -> str:
    return f"device:{host}:{device}"[:64]


def _lock_lease(s: Session, key: str) -> m.Meta:
    """The lease row of a device, created if missing and locked until the transaction ends.

    SQLite's BEGIN IMMEDIATE already serialises every claim; on PostgreSQL the row lock makes
    two claims for one device take turns, so both cannot see it free under READ COMMITTED.
    """
    if s.get_bind().dialect.name == "postgresql":
        s.execute(postgresql.insert(m.Meta).values(key=key, value="{}").on_conflict_do_nothing())
        return s.scalars(select(m.Meta).where(m.Meta.key == key).with_for_update()).one()
    row = s.get(m.Meta, key)
    if row is None:
        row = m.Meta(key=key, value="{}")
        s.add(row)
    return row


def lease_runs(lease: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The runs a lease holds: [{"run_id", "bytes"}] (`bytes` None: not shared); a lease of before sharing has one."""
    if "runs" in lease:
        return list(lease["runs"])
    return [{"run_id": lease["run_id"], "bytes": None}] if lease.get("run_id") is not None else []


def _admits(holder: Mapping[str, Any], worker_id: str, candidate: int, share: DeviceShare | None) -> bool:
    """Whether `candidate` may start on a device whose lease is `holder`."""
    held = lease_runs(holder)
    if not held:
        return True
    if holder.get("worker_id") != worker_id:
        return False  # another worker's device: never shared across workers
    if share is None:
        return True  # the one-run worker claiming again while it holds the lease (as before sharing)
    mine = share.reserve.get(candidate)
    if mine is None or len(held) >= share.limit or any(r.get("bytes") is None for r in held):
        return False
    return sum(int(r["bytes"]) for r in held) + mine <= share.capacity_bytes


class LeasesMixin(StoreCore):
    """Store methods over the claim of queued runs and the `meta` rows of device leases."""

    def claim_next_on_device(
        self,
        worker_id: str,
        device: str,
        worker_pid: int | None = None,
        host: str | None = None,
        share: DeviceShare | None = None,
        skip: Collection[int] = (),
    ) -> RunRecord | None:
        """Atomically move the first queued run to running for this worker, while `device` has room for it.

        One transaction: the device's lease row is locked, the run is taken with a status guard
        and a rowcount check, and the lease records it; two workers never get the same run. Without
        `share` one device never runs two (a lease held by this same worker is taken over, as
        before sharing); with it, a run joins the runs already there when all of them share and it
        fits (see the module docstring). The lease is (host, device): it stays taken until its
        worker releases it (`release_device`, once the run's process group is gone). A run pinned
        to a host or device (`pin_host`, `pin_device`) is only taken by a worker there; a run in
        `skip` (it does not fit this device) is passed over and stays queued.
        """
        now = time.time()
        host = host or socket.gethostname()
        with self._tx() as s:
            lease = _lock_lease(s, _lease_key(host, device))
            holder = json.loads(lease.value or "{}")
            if lease_runs(holder) and holder.get("worker_id") != worker_id:
                return None
            candidate = _next_queued(s, host, device, skip)
            if candidate is None or not _admits(holder, worker_id, candidate, share):
                return None
            claimed_now = move_run(
                s,
                candidate,
                RunChange.CLAIM,
                self._db_now(),
                worker_id=worker_id,
                worker_pid=worker_pid if worker_pid is not None else os.getpid(),
            )
            if not claimed_now:  # taken or cancelled since it was read: nothing claimed
                return None
            held = lease_runs(holder) if share is not None else []
            runs = [*held, {"run_id": candidate, "bytes": share.reserve.get(candidate) if share else None}]
            lease.value = json.dumps(
                {"run_id": runs[0]["run_id"], "worker_id": worker_id, "pid": worker_pid, "time": now, "runs": runs}
            )
            claimed = s.get(m.Run, candidate)
            assert claimed is not None  # its row was updated just above, in this transaction
            return RunRecord.from_row(claimed)

    def device_lease(self, device: str, host: str | None = None) -> dict[str, Any]:
        """Who holds (host, device): {"run_id", "worker_id", "pid", "time", "runs"}, or {} when it is free."""
        with self._read() as s:
            row = s.get(m.Meta, _lease_key(host or socket.gethostname(), device))
            return json.loads(row.value) if row is not None and row.value else {}

    def release_device(self, device: str, worker_id: str, host: str | None = None, run_id: int | None = None) -> bool:
        """Free (host, device) of run `run_id` (None: of all its runs) if `worker_id` holds it; True when it did.

        Call once the run's processes are gone; the device is free when no run is left on it."""
        with self._tx() as s:
            lease = _lock_lease(s, _lease_key(host or socket.gethostname(), device))
            holder = json.loads(lease.value or "{}")
            if holder.get("worker_id") != worker_id:
                return False
            left = [r for r in lease_runs(holder) if run_id is not None and r["run_id"] != run_id]
            if not left:
                lease.value = "{}"
                return True
            lease.value = json.dumps({**holder, "run_id": left[0]["run_id"], "runs": left})
            return True

    def requeue_alone(self, run_id: int, summary: str) -> bool:
        """Put a running run back at the head of the queue to run alone (it outgrew its share of a device).

        It keeps its id and history, is flagged `run_alone` (never shared again) and its summary says why;
        False when it was no longer running."""
        with self._tx() as s:
            return move_run(
                s,
                run_id,
                RunChange.REQUEUE_ALONE,
                self._db_now(),
                run_alone=1,
                cancel_requested=0,
                exit_code=None,
                child_pid=None,
                error_summary=summary[:2000],
            )
