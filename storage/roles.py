"""The store's roles: small `Protocol`s a module asks for instead of the whole `Store` (or `Any`).

`Store` has over a hundred public methods; a module that reads a run's artifacts, or a training
callback that writes metric rows, needs three of them. Typing the parameter by its role says what the
module does with the store, lets mypy check the calls, and lets a test hand in anything that plays
the role. `Store` plays every role (mypy checks it: `storage.roles_played`).

    def bundle_folder(store: RunArtifacts, run_id: int) -> Path | None: ...
    StoreCallback(sink: MetricSink, run_id)        # the training child's metrics, progress, memory, cancel flag

Roles combine by inheritance (`class TrainingRecord(RunLifecycle, MetricReader, Protocol)`), never by
growing one into the whole store again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # annotations only: a module that asks for a role must not import the database layer (plan's 2 s)
    from storage.models import RunStatus
    from storage.records import (
        ArtifactRecord,
        MemoryBucket,
        MemoryPoint,
        MetricBucket,
        MetricPoint,
        RunControl,
        RunRecord,
    )
    from storage.store_chat import ChatMessageRecord, ChatSessionRecord
    from storage.store_scores import Score, ScoreRecord


class RunReader(Protocol):
    """Reads one run's row."""

    def get_run(self, run_id: int) -> RunRecord | None: ...


class RunLister(Protocol):
    """Lists runs, newest first, by status, search text or tag."""

    def list_runs(
        self,
        status: RunStatus | Sequence[RunStatus] | None = None,
        limit: int = 200,
        search: str | None = None,
        tag: str | None = None,
        before: int | None = None,
    ) -> list[RunRecord]: ...


class RunFolders(Protocol):
    """Where a run's files live (`storage.run_files`, the run folder layout)."""

    @property
    def runs_root(self) -> Path: ...

    def run_path(self, run_id: int) -> Path: ...

    def run_dir(self, run_id: int) -> Path: ...


class ArtifactReader(RunReader, Protocol):
    """A run's saved files as recorded (bundle, adapter, exports)."""

    def artifacts(self, run_id: int) -> list[ArtifactRecord]: ...


class RunArtifacts(ArtifactReader, Protocol):
    """A run's recorded files, and its folder to write new ones in and record them."""

    def add_artifact(self, run_id: int, kind: str, path: str, size: int, sha256: str) -> int: ...

    def rewrite_artifact(self, run_id: int, kind: str, path: str, size: int, sha256: str) -> None: ...

    def run_dir(self, run_id: int) -> Path: ...


class RunEvents(Protocol):
    """A run's event log (OOM recoveries, pushes, cluster states)."""

    def add_run_event(
        self, run_id: int, kind: str, message: str, *, step: int | None = None, data: dict[str, Any] | None = None
    ) -> int: ...

    def run_events(self, run_id: int) -> list[dict[str, Any]]: ...


class MetricSink(Protocol):
    """What the training callback writes while a run trains, and the one flag it polls."""

    def add_metrics(
        self, run_id: int, points: Iterable[MetricPoint], progress: tuple[int, int | None] | None = None
    ) -> int: ...

    def set_progress(self, run_id: int, step: int, total_steps: int | None = None) -> None: ...

    def add_memory_samples(self, samples: Iterable[MemoryPoint]) -> int: ...

    def run_control(self, run_id: int) -> RunControl | None: ...

    def metric_names_at(self, run_id: int, step: int) -> list[str]: ...


class MetricReader(RunReader, Protocol):
    """A run's recorded series, read back for figures and tables."""

    def metrics(
        self, run_id: int, names: Sequence[str] | None = None, after_step: int | None = None
    ) -> list[MetricPoint]: ...

    def metric_series(self, run_id: int, name: str, width: int, from_step: int = 0) -> list[MetricBucket]: ...

    def last_metric_values(self, run_ids: Sequence[int], name: str) -> dict[int, float]: ...

    def metric_means(self, run_ids: Sequence[int], name: str) -> dict[int, float]: ...

    def memory_series(self, run_id: int, width: float, from_time: float = 0.0) -> list[MemoryBucket]: ...


class RunLifecycle(RunReader, Protocol):
    """How the training child records a run's end and what it resolved (the worker records the rest)."""

    def set_resolved_config(self, run_id: int, config: dict[str, Any]) -> None: ...

    def set_peak_memory(self, run_id: int, peak_bytes: int, source: str) -> None: ...

    def truncate_metrics(self, run_id: int, after_step: int) -> int: ...

    def mark_succeeded(self, run_id: int, final_metrics: dict[str, float]) -> bool: ...

    def mark_failed(
        self, run_id: int, summary: str, detail: str | None = None, exit_code: int | None = None
    ) -> bool: ...

    def mark_cancelled(self, run_id: int, exit_code: int | None = None) -> bool: ...


class TaskQueue(Protocol):
    """Queues a task for a run (an export, a push, an evaluation) that a worker carries out."""

    def create_task(self, run_id: int | None, kind: str, args: dict[str, Any] | None = None) -> int: ...


class TrainingRecord(MetricSink, MetricReader, RunLifecycle, RunArtifacts, RunEvents, RunFolders, TaskQueue, Protocol):
    """Everything the training child (`jobs.train.child.run`, its `jobs.train.recipe`) does with the store, role by role."""


class WorkerDirectory(Protocol):
    """The workers that announced themselves and the devices they published."""

    def live_workers(self, within_s: float = 10.0) -> list[dict[str, Any]]: ...

    def published_devices(self) -> list[dict[str, Any]]: ...


class CheckReader(ArtifactReader, WorkerDirectory, RunLister, Protocol):
    """What the check pipeline reads before a spec is queued: the workers' published devices (the target),
    the running runs (their GPU memory is not another process's) and a grpo `reward_model_run`'s row and files."""


class Sweeps(MetricReader, CheckReader, Protocol):
    """Trick sweeps: probe runs queued under one sweep id, read back with their metrics."""

    def create_sweep(self, probes: list[tuple[str, str, str, str]]) -> tuple[int, list[int]]: ...

    def sweep_runs(self, sweep_id: int) -> list[dict[str, Any]]: ...

    def sweep_ids(self, limit: int = 50) -> list[int]: ...


class Leases(Protocol):
    """Who holds a device on a host (a training run, a chat process)."""

    def device_lease(self, device: str, host: str | None = None) -> dict[str, Any]: ...


class ScoreSink(Protocol):
    """Where evaluation results go: benchmark and judge scores by task, both models."""

    def set_scores(self, run_id: int, task: str, scores: Sequence[Score]) -> None: ...


class ScoreReader(Protocol):
    """A run's benchmark and judge scores, both models."""

    def scores(self, run_id: int) -> list[ScoreRecord]: ...


class Evaluations(ScoreSink, ScoreReader, RunArtifacts, RunEvents, Protocol):
    """What an evaluation (benchmark tasks, a judge) reads and writes: the run's result, scores, an event;
    the scores again for the bundle's card, and the bundle rewritten with it."""

    def rewrite_artifact(self, run_id: int, kind: str, path: str, size: int, sha256: str) -> None: ...


class ChatRuns(Leases, ArtifactReader, Protocol):
    """What the chat process reads: which run's result to load, and whether a training run holds the GPU."""


class TerminalChat(ChatRuns, RunFolders, Protocol):
    """`tunedeck chat`/`generate`: the chat process's reads, and the run's folder that keeps a prompt's picture."""


class RunEnding(RunReader, RunFolders, Protocol):
    """How the worker records a training child's end (`jobs.worker.outcome`): its exit code and final status."""

    def set_exit_code(self, run_id: int, exit_code: int) -> None: ...

    def mark_failed(
        self, run_id: int, summary: str, detail: str | None = None, exit_code: int | None = None
    ) -> bool: ...

    def mark_cancelled(self, run_id: int, exit_code: int | None = None) -> bool: ...


class StaleRuns(Leases, RunReader, RunLister, Protocol):
    """A worker's clean-up of runs whose worker died (`jobs.worker.leases`): find them, interrupt, free the device."""

    def stale_running(self, older_than_s: float) -> list[RunRecord]: ...

    def mark_interrupted(self, run_id: int, summary: str) -> bool: ...

    def release_device(
        self, device: str, worker_id: str, host: str | None = None, run_id: int | None = None
    ) -> bool: ...


class ShareRequeue(Protocol):
    """A run that outgrew its share of a device goes back to the head of the queue to run alone."""

    def requeue_alone(self, run_id: int, summary: str) -> bool: ...


class QueueReader(Protocol):
    """The queued runs, in the order a worker takes them."""

    def queued(self) -> list[RunRecord]: ...


class QueueNotes(QueueReader, RunFolders, RunEvents, Protocol):
    """What the fit check of queued runs reads (their saved predictions) and notes (`jobs.worker.fit`)."""


class MemoryRecord(Protocol):
    """The memory sampler's writes (`jobs.devices.sampler`): samples, a run's peak, idle samples thinned."""

    def add_memory_samples(self, samples: Iterable[MemoryPoint]) -> int: ...

    def set_peak_memory(self, run_id: int, peak_bytes: int, source: str) -> None: ...

    def thin_idle_memory(self, older_than: float, keep_every: float = 60.0) -> int: ...


class ChatHistory(Protocol):
    """A run's chat sessions and turns, read back (`app.ui.chat_preferences`)."""

    def chat_history(self, session_id: int) -> list[ChatMessageRecord]: ...

    def latest_chat(self, run_id: int) -> ChatSessionRecord | None: ...
