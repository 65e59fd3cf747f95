"""The training callback that feeds the store: metrics rows, progress, torch memory, cancel.

`StoreCallback(store, run_id)` is added to the trl trainer by the training recipe (`jobs.train.recipe`). It is built to cost
well under 2% of training time:
- logged values are buffered and written in one transaction at most every `flush_interval`
  (1 s) and at train end, never one transaction per scalar; and the writes keep to a budget
  (`write_budget`, 0.5% of the time): when a flush takes longer than 0.5% of a second (a slow
  disk, a busy database, a cold start on a shared core), the next one waits longer, up to
  `max_flush_interval` (5 s), so a slow store costs the live graphs seconds, not training time;
- throughput comes from numbers trl already computes (`num_tokens`, a host-side counter)
  and `time.perf_counter()` at step ends, so it adds no CUDA synchronisation;
- torch memory counters are read from the caching allocator's host-side stats (no sync);
- achieved TFLOP/s and MFU are tokens/s times a per-token FLOPs count fixed at the start
  (`jobs.memory.flops`): no NVML or device query in the step loop;
- the database is asked about `cancel_requested` at most every `cancel_interval` (2 s; None:
  never, for a child a worker watches, since the worker relays a cancel as SIGTERM), while a
  SIGTERM flag (a `threading.Event`) is checked at every step for free;
- progress rides in the metrics' transaction: one commit per flush;
- each flushed batch goes to every metrics sink in turn (`jobs.train.sinks`): the store first, then the
  `report_to` trackers (`jobs.train.mirrors`), on the same thread, so the trackers receive exactly the rows
  the run page graphs;
- the periodic flushes run on a writer thread (`_Writer`), in order: on a GPU the training
  thread waits for the device most of the time, so the writes cost it nothing; `flush()` (train
  end, before the run's status changes) waits for them and writes the rest itself.
A stop (signal or cancel) also asks the trainer for a checkpoint at that step boundary, so a
cancelled run can be resumed; every saved checkpoint gets a completeness marker
(`storage.checkpoints`), written only once every row logged up to it is in the store (`on_save`
flushes first, on the training thread): a process killed at any moment leaves no complete checkpoint
whose steps' metrics are missing, since a resume redoes only the steps after it. A resumed run does not
write again the rows the store already has at its checkpoint's step (the end-of-training figures or an
evaluation of the attempt that was killed). A non-finite training loss stops training at once, without saving, and
is reported as `nonfinite_step` (trl hides NaN/inf from the log unless
`logging_nan_inf_filter=False`, which `jobs.config.mapping` sets). The logged loss is the mean over the
steps since the previous log, so a NaN in any of them shows; and every step that saves a
checkpoint also logs first, so no checkpoint is written (and marked complete) after a NaN that
fell between two logging steps.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from jobs.memory.flops import FlopsRate
from jobs.train.sinks import MetricsSink, Rows, StoreSink
from storage.models import MemorySource
from storage.records import MemoryPoint, MetricPoint
from storage.roles import MetricSink

log = logging.getLogger(__name__)

STOP_REQUESTED = threading.Event()  # set by the SIGTERM handler of jobs.train.child


class StoreCallback(TrainerCallback):
    """Writes logged metrics, throughput, progress and torch memory of one run to the store."""

    def __init__(
        self,
        store: MetricSink,
        run_id: int,
        *,
        stop_event: threading.Event | None = None,
        flush_interval: float = 1.0,
        cancel_interval: float | None = 2.0,
        cuda: bool | None = None,
        save_interval_s: float | None = None,
        write_budget: float = 0.005,
        max_flush_interval: float = 5.0,
        worker_id: str | None = None,
        trackers: Sequence[MetricsSink] = (),
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.store = store
        # Seconds for every interval and duration here (flush cadence, write cost, step time, cancel
        # and save intervals); wall-clock time.time() only stamps the rows. Tests pass a fake one.
        self._clock = clock
        self.run_id = run_id
        self.stop_event = stop_event if stop_event is not None else STOP_REQUESTED
        self.flush_interval = flush_interval
        self.write_budget = write_budget  # the share of time flushes may take
        self.max_flush_interval = max(max_flush_interval, flush_interval)
        self._flush_every = flush_interval  # flush_interval, stretched when flushes are slow
        self._flush_cost: float | None = None  # seconds per flush, smoothed
        self._writer: _Writer | None = None
        self.cancel_interval = cancel_interval
        self.save_interval_s = save_interval_s  # a checkpoint at least this often (spec.save_minutes)
        self.worker_id = worker_id  # the worker whose device the torch samples are of (jobs.train.recipe passes it)
        self.store_sink = StoreSink(store, run_id)
        self.sinks: list[MetricsSink] = [self.store_sink, *trackers]  # report_to's trackers after the store
        self._last_save = 0.0
        if cuda is None:
            import torch

            cuda = torch.cuda.is_available()
        self.cuda = cuda
        self.stop_reason: str | None = None  # "signal" | "cancel" once training was asked to stop
        self.nonfinite_step: int | None = None  # the step whose training loss was NaN or inf
        self.tokens_per_second: list[float] = []
        self.flops: FlopsRate | None = None  # set by jobs.train.recipe once the model is built: adds tflops / mfu
        self.num_tokens: float | None = None
        self._metrics: list[MetricPoint] = []
        self._memory: list[MemoryPoint] = []
        self._last_flush = self._last_cancel_check = 0.0
        self._last_step_end = self._prev_log_time = 0.0
        self._prev_log_step = 0
        self._prev_tokens: float | None = None
        self._max_steps: int | None = None
        self._progress_step = -1
        self._step = 0
        self._resumed_at = -1  # the step training (re)started at, and the names the store had there
        self._stored_at_resume: frozenset[str] = frozenset()

    @property
    def step(self) -> int:
        """The last optimizer step that ended (0 before the first)."""
        return self._step

    # ------------------------------------------------------------------ trainer events
    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Start the clocks and publish the step count."""
        now = self._clock()
        self._last_flush = self._last_cancel_check = self._last_step_end = self._prev_log_time = now
        self._last_save = now
        self._prev_log_step = state.global_step
        self._prev_tokens = 0.0  # trl counts num_tokens from zero in each trainer
        self._max_steps = state.max_steps if state.max_steps and state.max_steps > 0 else None
        self._step = state.global_step
        if state.global_step > 0:  # resumed from checkpoint-N: what the store holds at step N is not written again
            self._resumed_at = state.global_step
            self._stored_at_resume = frozenset(self.store.metric_names_at(self.run_id, state.global_step))
        self.flush(force_progress=True)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Time the step; flush, check for cancel on their cadences."""
        now = self._clock()
        self._last_step_end = now
        self._step = state.global_step
        if self.stop_event.is_set() and self.stop_reason is None:
            self.stop_reason = "signal"
            log.info("stop requested by signal: stopping after step %s", state.global_step)
        if (
            self.cancel_interval is not None
            and now - self._last_cancel_check >= self.cancel_interval
            and self.stop_reason is None
        ):
            self._last_cancel_check = now
            run = self.store.run_control(self.run_id)
            if run is None or run.cancel_requested:
                self.stop_reason = "cancel"
                log.info("cancel requested: stopping after step %s", state.global_step)
        if self.stop_reason is not None:
            control.should_training_stop = True
            control.should_save = True  # a checkpoint to resume from (storage.checkpoints)
        elif self.save_interval_s and now - self._last_save >= self.save_interval_s:
            control.should_save = True  # timed: a crash loses at most save_interval_s of training
        if control.should_save:
            # The trainer logs before it saves: a log here checks the loss of every step since the
            # last one (on_log), and cancels this save if it went non-finite.
            control.should_log = True
        if now - self._last_flush >= self._flush_every:
            self._flush_soon()

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Buffer every numeric logged value, plus tokens/s, step time and torch memory."""
        if not logs:
            return
        step, wall = state.global_step, time.time()
        for name, value in logs.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if step == self._resumed_at and name in self._stored_at_resume:
                continue  # the killed attempt wrote it already (after its last checkpoint)
            self._metrics.append(MetricPoint(step, name, float(value), wall))  # the store keeps NaN/inf as NULL
        loss = logs.get("loss")
        if isinstance(loss, (int, float)) and not math.isfinite(loss) and self.nonfinite_step is None:
            # Stop before this step's save: the last good checkpoint stays the newest one.
            self.nonfinite_step = step
            log.error("non-finite loss (%s) at step %s: stopping without saving", loss, step)
            control.should_training_stop = True
            control.should_save = False
        if "loss" in logs and step > self._prev_log_step:
            self._throughput(logs, state, step, wall)
        if self.cuda:
            self._memory.append(_torch_memory(self.run_id, wall, self.worker_id))
        if self._clock() - self._last_flush >= self._flush_every:
            self._flush_soon()

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """The trainer finished writing checkpoint-N: write every buffered row, then mark it complete (resumable).

        In that order: the marker says the store has every step's metrics up to N, so a resume from it
        loses none. Rows a locked database kept back leave the checkpoint unmarked (a resume takes the
        previous one); they go with the next write."""
        from pathlib import Path

        from storage.checkpoints import mark_complete

        self._last_save = self._clock()
        folder = Path(str(args.output_dir)) / f"checkpoint-{state.global_step}"
        if not folder.is_dir():
            return
        if self._flush_for_checkpoint():
            mark_complete(folder, state.global_step)
        else:
            log.warning("%s not marked complete: the database kept its metric rows back (still locked)", folder)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Write whatever is buffered."""
        self._step = state.global_step
        self.flush(force_progress=True)

    # ------------------------------------------------------------------ helpers
    def _throughput(self, logs: dict[str, Any], state: TrainerState, step: int, wall: float) -> None:
        """Seconds per optimizer step and tokens/s over the steps since the previous training log."""
        elapsed = self._last_step_end - self._prev_log_time
        steps = step - self._prev_log_step
        self._prev_log_time, self._prev_log_step = self._last_step_end, step
        if elapsed <= 0 or steps <= 0:
            return
        self._metrics.append(MetricPoint(step, "step_time", elapsed / steps, wall))
        tokens = logs.get("num_tokens")
        if tokens is None and getattr(state, "num_input_tokens_seen", None):
            tokens = state.num_input_tokens_seen
        if tokens is None:
            return
        tokens = float(tokens)
        if self._prev_tokens is not None and tokens >= self._prev_tokens:
            tps = (tokens - self._prev_tokens) / elapsed
            self.tokens_per_second.append(tps)
            self._metrics.append(MetricPoint(step, "tokens_per_second", tps, wall))
            if self.flops is not None:  # arithmetic on numbers already here: no device query
                self._metrics.append(MetricPoint(step, "tflops", self.flops.tflops(tps), wall))
                mfu = self.flops.mfu(tps)
                if mfu is not None:
                    self._metrics.append(MetricPoint(step, "mfu", mfu, wall))
        self._prev_tokens = tokens
        self.num_tokens = tokens

    def flush(self, force_progress: bool = False) -> None:
        """Write everything buffered now, in this thread, after any write still in the background.

        What jobs.train.recipe calls before it changes the run's status: the rows are in the store
        when this returns, and a failure to write them raises here."""
        batch = self._take(force_progress)
        if self._writer is not None:
            self._writer.drain()
        self._write(batch)

    def _flush_for_checkpoint(self) -> bool:
        """Write everything buffered now; False while the store still keeps rows back for a later write."""
        self.flush()
        return self.store_sink.retry()  # one more try for the rows kept back

    def _flush_soon(self) -> None:
        """The periodic flush: hand the batch to the writer thread and go back to training."""
        batch = self._take(False)
        if self._writer is None:
            self._writer = _Writer(self._write)
        self._writer.submit(batch)

    @property
    def flush_every(self) -> float:
        """Seconds between flushes now: flush_interval, or longer while flushes are slow."""
        return self._flush_every

    def _take(self, force_progress: bool) -> Rows:
        """Empty the buffers into one batch (and the progress, when it moved)."""
        self._last_flush = self._clock()
        metrics, self._metrics = self._metrics, []
        memory, self._memory = self._memory, []
        progress = None
        if force_progress or self._step != self._progress_step:
            self._progress_step = self._step
            progress = (self._step, self._max_steps)
        return Rows(metrics, progress, memory)

    def _write(self, batch: Rows) -> None:
        """One batch to every sink in turn, the store first: a failed store write raises, so no tracker gets
        rows the store lacks (a tracker never raises). The store's write is timed against the budget."""
        for sink in self.sinks:
            start = self._clock()
            try:
                sink.log(batch)
            finally:
                if sink is self.store_sink:
                    self._count_write(self._clock() - start)

    def _count_write(self, took: float) -> None:
        """The flush interval after a store write of `took` seconds: a slow write counts at once; fast ones
        bring the estimate down gradually."""
        cost = self._flush_cost
        self._flush_cost = took if cost is None or took > cost else 0.7 * cost + 0.3 * took
        self._flush_every = min(self.max_flush_interval, max(self.flush_interval, self._flush_cost / self.write_budget))


class _Writer(threading.Thread):
    """Writes the callback's periodic batches in order, off the training thread.

    On a GPU the training thread waits for the device most of the time, so a write there costs
    nothing; on a CPU it runs on whatever core is free. A failed periodic write is logged and
    training goes on (the store keeps rows a locked database refused for the next write)."""

    def __init__(self, write: Any) -> None:
        super().__init__(name="tunedeck-metrics-writer", daemon=True)
        self._write = write
        self._queue: queue.Queue[Rows] = queue.Queue()
        self.start()

    def submit(self, batch: Rows) -> None:
        self._queue.put(batch)

    def drain(self) -> None:
        """Return once every batch submitted so far has been written (or has failed)."""
        self._queue.join()

    def run(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                self._write(batch)
            # a thread boundary: a failed periodic write (any of the store's errors) is logged with its
            # traceback and training goes on; the final flush runs on the training thread and raises
            except Exception:
                log.exception("writing %d metric rows failed; training goes on", len(batch.points))
            finally:
                self._queue.task_done()


def physical_index(index: int) -> int:
    """The NVML index of CUDA device `index` when CUDA_VISIBLE_DEVICES renumbers them (a pinned worker's child)."""
    names = [x.strip() for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    return int(names[index]) if index < len(names) and names[index].isdigit() else index


def _torch_memory(run_id: int, wall: float, worker_id: str | None) -> MemoryPoint:
    """The caching allocator's counters for the current device (host-side reads, no sync)."""
    import torch

    index = torch.cuda.current_device()
    return MemoryPoint(
        time=wall,
        source=MemorySource.TORCH.value,
        run_id=run_id,
        device_index=physical_index(index),
        worker_id=worker_id,
        torch_allocated=torch.cuda.memory_allocated(index),
        torch_reserved=torch.cuda.memory_reserved(index),
        torch_max_allocated=torch.cuda.max_memory_allocated(index),
    )
