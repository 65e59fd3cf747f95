"""The store's roles for the worker's parts and the cluster dispatcher: a run claimed to share a device
(`jobs.worker.pool`), a worker heard of, and the runs handed to a Slurm or Ray engine and followed there
(`jobs.cluster.dispatch`), each a `Protocol` `Store` plays, checked by mypy in `storage.roles_played`. The smaller
roles they combine are in `storage.roles` (the worker's own: `RunEnding`, `StaleRuns`, `QueueNotes`...)."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from storage.roles import (
    MemoryRecord,
    QueueNotes,
    QueueReader,
    RunEnding,
    RunEvents,
    RunFolders,
    RunReader,
    ShareRequeue,
    StaleRuns,
    WorkerDirectory,
)
from storage.roles_chat import ChatServing
from storage.roles_queue import SearchDriving
from storage.roles_tasks import TaskServing

if TYPE_CHECKING:  # annotations only (a module that asks for a role must not import the database layer)
    from storage.models import RunStatus
    from storage.records import MemoryPoint, RunControl, RunRecord
    from storage.store_leases import DeviceShare


class DeviceClaims(QueueReader, RunFolders, Protocol):
    """The next queued run claimed for a device, beside the runs already sharing it (`jobs.worker.pool`): the
    queue's head, their saved predictions (what each reserves) and the claim, one transaction."""

    def claim_next_on_device(
        self,
        worker_id: str,
        device: str,
        worker_pid: int | None = None,
        host: str | None = None,
        share: DeviceShare | None = None,
        skip: Collection[int] = (),
    ) -> RunRecord | None: ...


class WorkerPresence(Protocol):
    """A worker (or dispatcher) heard of: its beats with the runs it holds, its published device, its going away."""

    def worker_beat(self, worker_id: str, pid: int, host: str, run_id: int | Iterable[int] | None = None) -> None: ...

    def publish_device(self, worker_id: str, host: str, facts: dict[str, Any]) -> None: ...

    def worker_gone(self, worker_id: str) -> None: ...


class EngineRuns(Protocol):
    """Runs handed to a cluster engine (Slurm, Ray): claimed, their job and its state recorded, adopted again by a
    new dispatcher, settled when the job ends."""

    def claim_for_engine(self, worker_id: str, engine: str) -> RunRecord | None: ...

    def set_engine_job(self, run_id: int, job_id: str | None, state: str) -> None: ...

    def set_engine_state(self, run_id: int, state: str) -> None: ...

    def engine_runs(self, engine: str) -> list[RunRecord]: ...

    def adopt_engine_run(self, run_id: int, worker_id: str) -> bool: ...

    def settle_engine_run(
        self, run_id: int, status: RunStatus, summary: str | None, detail: str | None = None
    ) -> bool: ...

    def add_engine_reason(self, run_id: int, reason: str) -> bool: ...


class Dispatching(EngineRuns, WorkerPresence, RunReader, WorkerDirectory, RunEvents, RunFolders, Protocol):
    """The cluster dispatcher (`jobs.cluster.dispatch.Dispatcher`): runs handed to the engine with the database's
    address, followed, cancelled, requeued at the queue's head or ended; its presence as a worker."""

    @property
    def url(self) -> str: ...

    def run_control(self, run_id: int) -> RunControl | None: ...

    def mark_failed(
        self, run_id: int, summary: str, detail: str | None = None, exit_code: int | None = None
    ) -> bool: ...

    def mark_cancelled(self, run_id: int, exit_code: int | None = None) -> bool: ...

    def mark_interrupted(self, run_id: int, summary: str) -> bool: ...

    def requeue(self, run_id: int) -> bool: ...

    def move_queued(self, run_id: int, position: int) -> bool: ...


class WorkerServices(ChatServing, TaskServing, SearchDriving, Protocol):
    """What a worker hands its services (`jobs.worker.services.Place`): the chat service's, the task service's and
    the search driver's roles (`app.cli.main`'s worker runs all three)."""


class Working(
    WorkerServices, StaleRuns, RunEnding, ShareRequeue, QueueNotes, MemoryRecord, DeviceClaims, WorkerPresence, Protocol
):
    """A worker (`jobs.worker.loop.Worker`): its presence and device, stale runs cleaned up, the next run claimed and
    trained in a child given the database's address (its pid, cancel flag, doctor, memory samples, end recorded),
    and its services handed their roles."""

    @property
    def url(self) -> str: ...

    def set_child(self, run_id: int, pid: int | None, log_path: str | None = None) -> None: ...

    def run_control(self, run_id: int) -> RunControl | None: ...

    def memory_samples(
        self, run_id: int | None = None, since: float | None = None, source: str | None = None, limit: int | None = None
    ) -> list[MemoryPoint]: ...
