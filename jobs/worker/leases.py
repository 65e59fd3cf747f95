"""Device leases and runs whose worker is gone: what a worker tidies before it claims.

    release_device(store, "0", worker_id, host, stop)          # free our lease, retrying while the database is down
    cleanup_stale(store, host, stale_after=30, grace_period=20)  # mark runs interrupted whose worker died
    take_over_device(store, "0", worker_id, host, grace_period=20)  # a dead worker's lease of our device

A run is stale when its heartbeat is older than `stale_after` (the database's clock), or when its
worker ran on this host and its process is dead (rq's StartedJobRegistry.cleanup). Its training
child, if it is ours and still alive, is ended: it would keep the GPU busy.
"""

from __future__ import annotations

import logging
import os
import threading

from jobs.worker.outcome import first_line
from jobs.worker.processes import end_group, group_members, is_training_child, pid_alive
from storage.errors import StorageError
from storage.models import RunStatus
from storage.roles import StaleRuns
from storage.store import RunRecord
from storage.store_leases import lease_runs

log = logging.getLogger(__name__)


def release_device(
    store: StaleRuns,
    device: str,
    worker_id: str,
    host: str,
    stop: threading.Event,
    first_delay: float = 1.0,
    max_delay: float = 30.0,
    run_id: int | None = None,
) -> None:
    """Free this worker's device lease (of `run_id` only, if given), retrying while the database is unreachable (until `stop` is set)."""
    delay = first_delay
    while True:
        try:
            store.release_device(device, worker_id, host=host, run_id=run_id)
            return
        except StorageError as exc:
            log.error(
                "worker %s: could not release device %s (%s); retrying in %.1f s",
                worker_id,
                device,
                first_line(exc),
                delay,
            )
            if stop.wait(delay):
                return  # a restarted worker on this host takes the lease over
            delay = min(2 * delay, max_delay)


def cleanup_stale(store: StaleRuns, host: str, stale_after: float, grace_period: float) -> list[int]:
    """Mark running runs interrupted whose worker is gone; kill their orphaned children. Returns their ids."""
    marked = []
    stale = {r.id: r for r in store.stale_running(stale_after)}
    for run in store.list_runs(status=RunStatus.RUNNING, limit=10_000):
        # The more exact reason first: a dead process on this host is known, a stale heartbeat only suspected.
        if dead_local_worker(run, host):
            reason = f"worker {run.worker_id} (pid {run.worker_pid}) is no longer running"
        elif run.id in stale:
            reason = f"worker {run.worker_id} stopped sending heartbeats (none for {stale_after:g} s)"
        else:
            continue
        # Marked first: the orphan answers SIGTERM by saving a checkpoint and marking its run
        # cancelled, which must not win over 'interrupted'.
        if store.mark_interrupted(run.id, reason):
            log.warning("run %s interrupted: %s", run.id, reason)
            marked.append(run.id)
        kill_orphan(run, host, grace_period)
    return marked


def take_over_device(store: StaleRuns, device: str, worker_id: str, host: str, grace_period: float) -> None:
    """Free this host's lease of `device` when the worker holding it is dead and its run's processes are gone."""
    lease = store.device_lease(device, host=host)
    holder, pid = lease.get("worker_id"), lease.get("pid")
    if not holder or holder == worker_id or pid_alive(pid):
        return
    ending = False
    for entry in lease_runs(lease):  # one run, or several that shared the device
        run = store.get_run(entry["run_id"])
        if run is None:
            continue
        if run.status is RunStatus.RUNNING and store.mark_interrupted(
            run.id, f"worker {holder} (pid {pid}) is no longer running"
        ):
            log.warning("run %s interrupted: its worker %s is gone", run.id, holder)
        kill_orphan(run, host, grace_period)
        ending = ending or bool(run.child_pid and group_members(run.child_pid))
    if ending:
        return  # still ending; the lease waits for them
    if store.release_device(device, holder, host=host):
        log.info("device %s: lease of dead worker %s released", device, holder)


def dead_local_worker(run: RunRecord, host: str) -> bool:
    """Whether the run's worker ran on this host (not this process) and is dead."""
    wid = run.worker_id or ""
    if not wid.startswith(f"{host}:") or run.worker_pid is None:
        return False
    return run.worker_pid != os.getpid() and not pid_alive(run.worker_pid)


def kill_orphan(run: RunRecord, host: str, grace_period: float) -> None:
    """A training child whose worker died keeps the GPU busy: end it (only if it is ours)."""
    wid = run.worker_id or ""
    if not run.child_pid or not wid.startswith(f"{host}:"):
        return
    if is_training_child(run.child_pid, run.id):
        log.warning("run %s: ending orphaned training process group %s", run.id, run.child_pid)
        end_group(run.child_pid, grace_period)
