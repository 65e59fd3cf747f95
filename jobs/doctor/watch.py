"""The training doctor inside the worker: reads a run's new metric rows, runs the rules, stores each finding once.

    doctor = Doctor(store, run_id, spec)

    doctor.check()                            # every EXAMINE_INTERVAL_S while the run trains, and once at its end

Incremental and cheap: each check reads only the rows after the last step it saw (an index range of the
`metrics` table) and the torch memory samples after the last one, keeps per metric its first HEAD_POINTS
and last TAIL_POINTS points (eval metrics whole: there are few), and runs the pure rules
(`jobs.doctor.rulebook`) over that. A new finding becomes a run event of kind "finding"
(`Finding.event_data`); one whose rule is in the spec's `doctor_stop_on` also asks for the run's cancel,
which the worker's watch then carries out like the user's (`jobs.worker.loop`). `bench/doctor_cost.py`
measures what a check costs.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

from jobs.doctor.findings import EVENT_KIND, Finding, Point, RunContext, findings_of
from jobs.doctor.rulebook import examine
from jobs.spec.doctor_codes import RuleCode, stop_codes, stop_severities
from jobs.spec.job import JobSpec
from jobs.spec.trainer_records import record_for
from storage.models import MemorySource
from storage.records import MemoryPoint, MetricPoint

log = logging.getLogger(__name__)

EXAMINE_INTERVAL_S = 2.0  # the worker checks a training run this often (the child writes rows every 1-5 s)
HEAD_POINTS = 64  # the first points of each metric kept (the rules compare the start with now)
TAIL_POINTS = 512  # the newest points of each metric kept (the windows the rules read)
WHOLE = ("eval_",)  # metrics kept whole: evaluations are few, and overfitting names the best of them all


class DoctorStore(Protocol):
    """What the doctor reads and writes (`storage.store.Store` has it)."""

    def metrics(
        self, run_id: int, names: Sequence[str] | None = None, after_step: int | None = None
    ) -> list[MetricPoint]: ...

    def memory_samples(
        self, run_id: int | None = None, since: float | None = None, source: str | None = None, limit: int | None = None
    ) -> list[MemoryPoint]: ...

    def run_events(self, run_id: int) -> list[dict[str, Any]]: ...

    def add_run_event(
        self, run_id: int, kind: str, message: str, *, step: int | None = None, data: dict[str, Any] | None = None
    ) -> int: ...

    def request_cancel(self, run_id: int) -> Any: ...


def context_of(spec: JobSpec) -> RunContext:
    """The spec values the rules read."""
    return RunContext(
        learning_rate=spec.learning_rate,
        warmup_steps=spec.warmup_steps,
        max_grad_norm=spec.max_grad_norm,
        num_train_epochs=spec.num_train_epochs,
        beta=spec.beta,
        total_steps=spec.max_steps if spec.max_steps > 0 else None,
        num_generations=spec.num_generations,
        max_completion_length=spec.max_completion_length,
        temperature=spec.temperature,
        generates=record_for(spec.trainer).generates,
    )


class _Curve:
    """One metric's points as the doctor keeps them: the head, and a bounded tail (or every point)."""

    def __init__(self, whole: bool) -> None:
        self.head: list[Point] = []
        self.tail: deque[Point] = deque(maxlen=None if whole else TAIL_POINTS)
        self.last_step = -1

    def add(self, step: int, value: float) -> bool:
        """Keep a point; False for a step this metric already has (read again, or written twice)."""
        if step <= self.last_step:
            return False
        self.last_step = step
        if len(self.head) < HEAD_POINTS and self.tail.maxlen is not None:
            self.head.append((step, value))
        else:
            self.tail.append((step, value))
        return True

    def points(self) -> list[Point]:
        return [*self.head, *self.tail]


class Doctor:
    """One run's doctor: see the module docstring."""

    def __init__(self, store: DoctorStore, run_id: int, spec: JobSpec, interval_s: float = EXAMINE_INTERVAL_S) -> None:
        self.store = store
        self.run_id = run_id
        self.ctx = context_of(spec)
        self.stop_on: set[RuleCode] = set(stop_codes(spec.doctor_stop_on)[0])
        self.stop_on_severity = stop_severities(spec.doctor_stop_on)
        self.interval_s = interval_s
        self.found: set[RuleCode] | None = None  # read at the first check (inside the worker's error handling)
        self._curves: dict[str, _Curve] = {}
        self._read_after = -1  # rows are read from the step after this one (the newest step seen, less one)
        self._memory_after: float | None = None  # torch samples are read from this time on
        self._memory_after_read: float | None = None  # ... and those up to this time were taken already
        self._times: deque[tuple[float, int]] = deque(maxlen=TAIL_POINTS)  # (time, step) of the loss rows
        self._next = 0.0

    def due(self) -> bool:
        """Whether a check is due (every `interval_s`); the worker asks at each poll."""
        return time.monotonic() >= self._next

    def check(self, final: bool = False) -> list[Finding]:
        """Read the new rows, run the rules, store the new findings; a `doctor_stop_on` one cancels the run
        (not when `final`: the run has ended). Returns the findings stored now."""
        self._next = time.monotonic() + self.interval_s
        if self.found is None:  # a resumed or recovered run's findings are not stored again
            self.found = {f.code for f in findings_of(self.store.run_events(self.run_id))}
        first_new = self._read_rows()
        if first_new is None:
            return []
        curves = {name: c.points() for name, c in self._curves.items()}
        try:
            new = sorted(examine(curves, self.ctx, since=first_new - 1, found=self.found), key=lambda f: f.step)
        except Exception:  # noqa: BLE001 (a bug in a rule: logged whole; the diagnosis stops, the training goes on)
            log.exception("run %s: the training doctor failed and stops for this run", self.run_id)
            self._next = float("inf")
            return []
        for finding in new:
            self.found.add(finding.code)
            stops = (finding.code in self.stop_on or finding.severity.value in self.stop_on_severity) and not final
            data = {**finding.event_data(), "stops_run": stops}
            message = finding.message + (" The run stops (doctor_stop_on)." if stops else "")
            self.store.add_run_event(self.run_id, EVENT_KIND, message, step=finding.step, data=data)
            log.warning("run %s: %s", self.run_id, message)
            if stops:
                self.store.request_cancel(self.run_id)
        return new

    def _read_rows(self) -> int | None:
        """Add the rows written since the last check to the curves; the lowest new step (None: nothing new)."""
        # From the newest step seen, not after it: a row of that step may come in a later flush (an eval).
        rows = self.store.metrics(self.run_id, after_step=self._read_after - 1 if self._read_after >= 0 else None)
        first_new: int | None = None
        for p in rows:
            whole = p.name.startswith(WHOLE)
            if self._curves.setdefault(p.name, _Curve(whole)).add(p.step, p.value):
                first_new = p.step if first_new is None else min(first_new, p.step)
                if p.name == "loss":
                    self._times.append((p.time, p.step))
        if rows:
            self._read_after = max(self._read_after, max(p.step for p in rows))
        memory_new = self._read_memory()
        if memory_new is not None:
            first_new = memory_new if first_new is None else min(first_new, memory_new)
        return first_new

    def _read_memory(self) -> int | None:
        """Add the torch allocator's new samples as `torch_allocated`, each at the step logged with it."""
        samples = self.store.memory_samples(self.run_id, since=self._memory_after, source=MemorySource.TORCH.value)
        times = [t for t, _ in self._times]
        first_new = None
        for s in samples:
            if not times or s.time > times[-1]:
                break  # its loss row is not read yet: taken at the next check
            self._memory_after = s.time
            i = bisect_right(times, s.time)
            if s.torch_allocated is None or i == 0 or s.time <= (self._memory_after_read or -1.0):
                continue  # no torch figure, before the first loss row kept, or read at the last check
            step = self._times[i - 1][1]
            if self._curves.setdefault("torch_allocated", _Curve(False)).add(step, float(s.torch_allocated)):
                first_new = step if first_new is None else min(first_new, step)
        self._memory_after_read = self._memory_after
        return first_new
