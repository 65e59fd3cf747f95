"""Where a run's metric rows go: the store and each `report_to` tracker, every one behind one interface.

    sinks = [StoreSink(store, run_id), *open_trackers(spec, run_id, folder)]   # jobs.train.mirrors
    for sink in sinks:
        sink.log(Rows(points, progress=(step, max_steps)))
    sink.note(findings)      # the training doctor's findings (the store holds them already: nothing to do there)
    sink.close("succeeded")  # tunedeck's final status

A `MetricsSink` takes a batch of rows (`Rows`) as `jobs.train.callbacks.StoreCallback` flushes it, and the
forgetting meter's rows (`jobs.train.forgetting.record`); the store comes first, so a tracker receives
only the rows the store now holds. The batch also carries what only the store keeps: the run's progress
(written in the metrics' transaction: one commit per flush) and the torch memory samples; a tracker reads
`points` and ignores the rest. The store's sink raises when a write fails (the training child's final
flush must not pass silently); a tracker's logs its own errors and training goes on (`jobs.train.mirrors`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from jobs.doctor.findings import Finding
from storage.records import MemoryPoint, MetricPoint
from storage.roles import MetricSink


@dataclass(frozen=True)
class Rows:
    """One batch for every sink: the metric rows, and the progress and memory samples only the store keeps."""

    points: Sequence[MetricPoint]
    progress: tuple[int, int | None] | None = None  # (step, total steps): the store's step report
    memory: Sequence[MemoryPoint] = field(default_factory=tuple)


class MetricsSink(Protocol):
    """A destination of a run's metric rows: the store (`StoreSink`) or a tracker (`jobs.train.mirrors`)."""

    def log(self, rows: Rows) -> None: ...
    def note(self, findings: Sequence[Finding]) -> None: ...
    def close(self, status: str) -> None: ...


class StoreSink:
    """The run's store as a sink: metric rows and progress in one transaction, then the memory samples.

    A locked database keeps rows back for its next write (`storage.store_series`): `held_back` says
    it did at the last write of rows, and `retry()` tries once more to write them."""

    def __init__(self, store: MetricSink, run_id: int) -> None:
        self.store = store
        self.run_id = run_id
        self.held_back = False

    def log(self, rows: Rows) -> None:
        if rows.points:  # one commit for both; 0 written: kept back by the store for its next write
            written = self.store.add_metrics(self.run_id, rows.points, progress=rows.progress)
            self.held_back = written == 0
        elif rows.progress is not None:
            self.store.set_progress(self.run_id, *rows.progress)
        if rows.memory:
            self.store.add_memory_samples(rows.memory)

    def retry(self) -> bool:
        """Write what the store kept back, if anything; True once nothing is kept back."""
        if self.held_back:  # `add_metrics` writes the kept rows first
            self.held_back = self.store.add_metrics(self.run_id, []) == 0
        return not self.held_back

    def note(self, findings: Sequence[Finding]) -> None:
        """Nothing: the worker stored the findings as the run's events."""

    def close(self, status: str) -> None:
        """Nothing: the run's status is recorded by the training child (`storage.lifecycle`)."""
