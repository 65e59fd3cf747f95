"""The store's roles for a run's tasks: exports, pushes, benchmarks and judges, checked and queued for a worker that
reaches the run (`jobs.worker.tasks`), followed to their end and stopped (the run page's Export and Evaluate panels,
`tunedeck export`/`evaluate`/`judge`), each a `Protocol` `Store` plays, checked by mypy in `storage.roles_played`.
The smaller roles they combine are in `storage.roles`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from storage.roles import (
    ArtifactReader,
    Evaluations,
    RunArtifacts,
    RunEvents,
    RunFolders,
    RunReader,
    ScoreReader,
    TaskQueue,
    WorkerDirectory,
)

if TYPE_CHECKING:  # annotations only (a module that asks for a role must not import the database layer)
    from storage.models import TaskStatus
    from storage.records import TaskControl, TaskRecord


class TaskReach(RunReader, WorkerDirectory, Protocol):
    """A run's task refused before queueing when no live worker can reach the run's weights
    (`jobs.worker.tasks.reach_problem`): the run's row and the live workers."""


class TaskFollowing(Protocol):
    """Queued tasks followed to their end (their logs, status and result), or cancelled."""

    def tasks_of(self, task_ids: Iterable[int]) -> list[TaskRecord]: ...

    def cancel_task(self, task_id: int) -> TaskStatus | None: ...


class RunTasks(Protocol):
    """A run's newest tasks (what a reopened run page, or `tunedeck run`'s ending, follows again)."""

    def run_tasks(self, run_id: int, limit: int = 20) -> list[TaskRecord]: ...


class TaskOnWorker(TaskReach, TaskFollowing, Protocol):
    """A task queued for a worker that reaches the run, and followed to its end (`--on-worker`, the panels)."""


class ExportRequests(ArtifactReader, TaskQueue, Protocol):
    """An export or a push checked against the run's recorded files, then queued (`jobs.worker.tasks.request_export`,
    `request_push`)."""


class EvaluationRequests(Evaluations, TaskQueue, Protocol):
    """A benchmark or judge task checked against the run's result and samples, then queued
    (`jobs.worker.tasks.request_evaluate`, `request_judge`)."""


class ExportOnWorker(TaskOnWorker, ExportRequests, Protocol):
    """An export or a push asked of a worker and followed (`tunedeck export --on-worker`, the Export panel's buttons)."""


class EvaluationOnWorker(TaskOnWorker, EvaluationRequests, Protocol):
    """A benchmark or judge task asked of a worker and followed (`--on-worker`, the Evaluate panel's buttons); or
    carried out here (`tunedeck judge`)."""


class ExportTasks(ExportOnWorker, RunTasks, Protocol):
    """The run page's Export panel (`app.ui.export.wire`): the run's files, exports and pushes asked and followed."""


class EvaluationTasks(EvaluationOnWorker, RunTasks, Protocol):
    """The run page's Evaluate panel (`app.ui.evaluate.wire`): benchmark and judge tasks asked and followed."""


class Exporting(ExportOnWorker, RunArtifacts, Protocol):
    """`tunedeck export`: the merged model or GGUF written and recorded here, or asked of a worker and followed."""


class ScoreReport(ScoreReader, RunFolders, RunReader, Protocol):
    """A run's benchmark scores, base beside run, and the judge's verdict from its file (`tunedeck show`/`evaluate`)."""


class Evaluating(EvaluationOnWorker, ScoreReport, RunTasks, Protocol):
    """`tunedeck evaluate`, and `tunedeck run`'s ending: evaluations carried out here (by the run's in-process worker,
    which claims its tasks) or followed on a worker, then the scores printed."""

    def claim_task(self, task_id: int, worker_id: str) -> TaskRecord | None: ...


class TaskServing(ArtifactReader, RunFolders, RunEvents, Protocol):
    """A worker's task service (`jobs.worker.task_service`): the queued tasks it can reach claimed, a GPU task's
    device lease held and released, its progress and end recorded, stale tasks failed; the child gets the
    database's address."""

    @property
    def url(self) -> str: ...

    def queued_tasks(self, kinds: Sequence[str], limit: int = 50) -> list[TaskRecord]: ...

    def get_task(self, task_id: int) -> TaskRecord | None: ...

    def claim_task(self, task_id: int, worker_id: str) -> TaskRecord | None: ...

    def task_progress(self, task_id: int, lines: Sequence[str] = ()) -> TaskControl | None: ...

    def finish_task(
        self,
        task_id: int,
        status: TaskStatus,
        *,
        result: dict[str, Any] | None = None,
        error: str | None = None,
        only_if: Iterable[TaskStatus] = ...,
    ) -> bool: ...

    def fail_stale_tasks(self, older_than_s: float) -> list[int]: ...

    def hold_device_for_task(
        self, device: str, holder: str, host: str, run_id: int | None, task_id: int, pid: int
    ) -> dict[str, Any]: ...

    def release_device(
        self, device: str, worker_id: str, host: str | None = None, run_id: int | None = None
    ) -> bool: ...
