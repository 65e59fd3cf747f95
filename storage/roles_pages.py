"""The store's roles for the dashboard's pages and the reports of a run: chart series, the GPU tab, the run page's
text, the runs table, Compare, `tunedeck show`, chat picks and the Try rewards panel (each a `Protocol` `Store`
plays, checked by mypy in `storage.roles_played`). The smaller roles they combine are in `storage.roles`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from storage.roles import (
    CheckReader,
    MetricReader,
    QueueReader,
    RunArtifacts,
    RunEvents,
    RunFolders,
    RunLister,
    RunReader,
    ScoreReader,
    WorkerDirectory,
)
from storage.roles_queue import CheckTasks

if TYPE_CHECKING:  # annotations only (a module that asks for a role must not import the database layer)
    from storage.records import MemoryBucket, MetricBucket, MetricPoint, TaskRecord


class SeriesReader(Protocol):
    """Charts' series, read in buckets with their extents (`app.ui.series`)."""

    def metric_series(self, run_id: int, name: str, width: int, from_step: int = 0) -> list[MetricBucket]: ...

    def metric_extent(self, run_id: int, name: str) -> tuple[int, int] | None: ...

    def memory_series(self, run_id: int, width: float, from_time: float = 0.0) -> list[MemoryBucket]: ...

    def memory_extent(self, run_id: int | None = None) -> tuple[float, float] | None: ...


class DeviceMemory(WorkerDirectory, Protocol):
    """The GPU tab: the workers, their devices and the memory samples in buckets (`app.ui.gpu`)."""

    def memory_buckets(
        self,
        run_id: int | None,
        origin: float,
        width: float,
        after: float | None = None,
        worker_id: str | None = None,
        device_index: int | None = None,
    ) -> list[MemoryBucket]: ...


class LastMetric(Protocol):
    """A run's last value of a metric."""

    def last_metric(self, run_id: int, name: str) -> MetricPoint | None: ...


class RunText(LastMetric, ScoreReader, RunArtifacts, RunFolders, Protocol):
    """The run page's text panels: throughput, samples, phases, scores (`app.ui.run_text`)."""


class RunCounts(MetricReader, RunLister, RunFolders, Protocol):
    """The runs table: runs by status or search text, their count, events, figures and disk use (`app.ui.runs`)."""

    def count_runs(self) -> int: ...

    def events_of_runs(self, run_ids: Sequence[int], kind: str) -> dict[int, list[dict[str, Any]]]: ...


class TaskReader(Protocol):
    """A task's row (an export, a trial), for its progress."""

    def get_task(self, task_id: int) -> TaskRecord | None: ...


class RunReport(RunText, RunCounts, RunEvents, SeriesReader, Protocol):
    """A run told in full: its row, summary, scores, events and series (Compare, `tunedeck show`, the OpenAI job views)."""


class RewardTrials(CheckTasks, TaskReader, Protocol):
    """The form's "Try rewards" panel: the task queued, its row followed, the live workers asked."""


class RunFollowing(LastMetric, QueueReader, RunReader, Protocol):
    """A run followed to its end (`tunedeck run`'s progress bar): its row, its place in the queue, its last loss."""


class RewardTrying(CheckReader, TaskReader, RunFolders, Protocol):
    """`tunedeck grpo try` (`app.cli.grpo`): the spec checked (a grpo `reward_model_run`'s files), or a worker's
    Try rewards task read and its result written next to the task's log."""
