"""One stored run's training as a recipe: set up, train, save, clean up (the shape of torchtune's recipes).

    spec = load_spec(store, run_id)        # read and validated once per process (None: the run failed, fields named)
    recipe = Recipe(store, run_id, spec)
    exit_code = run_recipe(recipe)         # setup, train, save; on any exception `failed`; cleanup always

- `setup`: the metrics sinks (the store's, then each `report_to` tracker's: `jobs.train.sinks`; a tracker that
  cannot start fails the run before anything loads), the device and this run's share of it
  (`jobs.train.share_cap`), the checkpoint to resume from (`resume_point`), every callback once (the store's,
  the phase probe's, a scheduler restorer after an OOM recovery, the caller's), then model, data, configs,
  peft, reward model and trainer (`jobs.train.training.prepare`); the base model's "before" answers and
  forgetting figures are taken on the way (`jobs.train.before_after`, `jobs.train.forgetting`).
- `train`: `jobs.train.training.fit`; the last rows flushed, the peak memory recorded; a stop (SIGTERM,
  cancel) marks the run cancelled, its checkpoint kept.
- `save`: the run's figures (`jobs.train.figures`), its best checkpoint, the "after" answers and forgetting
  figures, the bundle (`jobs.train.artifacts`), the run marked succeeded and its evaluations queued.
- `failed(exc)`: how the run ended on an exception, and the exit code (`jobs.train.failure` words it).
- `cleanup`: every sink gets the training doctor's findings stored so far and the run's final status.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from jobs.devices.probe import detect_device
from jobs.doctor.findings import findings_of
from jobs.memory.flops import FlopsRate
from jobs.spec.evaluation import evaluation_tasks
from jobs.spec.job import JobSpec, SpecError
from jobs.spec.stored import read_spec, unreadable_summary
from jobs.spec.trainer_records import record_for
from jobs.spec.tricks import checkpointing
from jobs.train import before_after, figures, forgetting, oom, phases, share_cap
from jobs.train.best import EVENT_KIND as BEST_EVENT
from jobs.train.best import BestCheckpoint
from jobs.train.callbacks import STOP_REQUESTED, StoreCallback
from jobs.train.failure import disk_full, summarize, torch_oom
from jobs.train.mirrors import TrackerSink, open_trackers
from jobs.train.phase_probe import PhaseProbe
from jobs.train.results import TrainResult
from jobs.train.training import Prepared, fit, prepare
from storage.records import MetricPoint
from storage.roles import MetricReader, RunLifecycle, TrainingRecord

log = logging.getLogger(__name__)


class Steps(Protocol):
    """What `run_recipe` calls, in its order."""

    def setup(self) -> None: ...
    def train(self) -> None: ...
    def save(self) -> None: ...
    def failed(self, exc: BaseException) -> int: ...
    def cleanup(self) -> None: ...


def setup_logging() -> None:
    """The training process's log lines to stdout (the worker redirects it to the run's train.log)."""
    logging.basicConfig(
        stream=sys.stdout, level=logging.INFO, force=True, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    warnings.filterwarnings("ignore", message=checkpointing.DEPRECATION_WARNING, category=FutureWarning)
    import datasets
    import transformers

    datasets.disable_progress_bars()  # progress bars are carriage-return noise in a log file
    transformers.utils.logging.disable_progress_bar()


def run_recipe(recipe: Steps) -> int:
    """setup, train, save: exit code 0; on any exception (a signal's KeyboardInterrupt too) `failed` records how
    the run ended and gives the exit code; `cleanup` runs last either way."""
    try:
        recipe.setup()
        recipe.train()
        recipe.save()
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the run row
        return recipe.failed(exc)
    finally:
        recipe.cleanup()


def load_spec(store: TrainingRecord, run_id: int) -> JobSpec | None:
    """The spec run `run_id` trains, parsed strictly once: the last OOM recovery's (`jobs.train.oom`), else the one
    submitted (the worker checked it before it started this process). None when the run does not exist, or its
    spec cannot be read: then the run is failed with the fields named, and nothing is trained."""
    record = store.get_run(run_id)
    if record is None:
        log.error("run %s does not exist", run_id)
        return None
    recovered = oom.recovered_spec_data(store.run_events(run_id))
    try:
        spec = read_spec(record.spec_json if recovered is None else json.dumps(recovered))
    except SpecError as exc:  # never train something else: the run fails, naming the fields
        summary = unreadable_summary(exc)
        log.error("run %s failed: %s", run_id, summary)
        store.mark_failed(run_id, summary, str(exc), exit_code=1)
        return None
    log.info("run %s: %s\n%s", run_id, spec.display_name, spec.to_yaml())
    return spec


class TrackersFailed(Exception):
    """A `report_to` tracker could not start: the run fails before it trains."""


class Recipe:
    """Run `run_id` of `store` trained as `spec` says. `callbacks`: extra trainer callbacks (tests inject faults)."""

    def __init__(self, store: TrainingRecord, run_id: int, spec: JobSpec, callbacks: Sequence[Any] = ()) -> None:
        self.store, self.run_id, self.spec = store, run_id, spec
        self.extra = list(callbacks)
        self.output_dir = store.run_dir(run_id) / "output"
        self.trackers: list[TrackerSink] = []
        self.callback: StoreCallback | None = None
        self.resume_from: str | None = None
        self.prepared: Prepared | None = None  # set once the trainer is built: an OOM after it a smaller step can avoid
        self.result: TrainResult | None = None
        self.held_out: Any = None  # the eval rows, kept for the forgetting meter's "after"

    # ------------------------------------------------------------------ the steps
    def setup(self) -> None:
        """Sinks, device, resume point, callbacks, then everything `prepare` builds; the resolved config recorded."""
        store, run_id, spec = self.store, self.run_id, self.spec
        try:
            self.trackers = open_trackers(spec, run_id, store.run_dir(run_id))  # report_to (jobs.train.mirrors)
        except Exception as exc:  # noqa: BLE001 - a tracker that cannot start fails the run before it trains
            raise TrackersFailed(f"report_to: a tracker could not start ({type(exc).__name__}: {exc})") from exc
        # Under a worker (it passes TUNEDECK_WORKER_ID) a cancel arrives as SIGTERM within the
        # worker's poll interval; asking the database as well would only cost the training time.
        worker_id = os.environ.get("TUNEDECK_WORKER_ID") or None
        self.callback = StoreCallback(
            store,
            run_id,
            save_interval_s=spec.save_minutes * 60 if spec.save_minutes else None,
            cancel_interval=None if worker_id else 2.0,
            worker_id=worker_id,
            trackers=self.trackers,
        )
        device = detect_device()
        log.info("device: %s", device)
        share_cap.apply_cap()  # a shared device: this run's share of it (`jobs.train.share_cap`)
        self.resume_from = resume_point(store, run_id, self.output_dir)
        restore = [cb for cb in (oom.scheduler_restorer(self.resume_from),) if cb is not None]
        # memory at the points of the first optimizer step, kept as phases.json (jobs.train.phases)
        probe = PhaseProbe(device.cuda, on_record=lambda measured: phases.record(store, run_id, measured))
        prepared = prepare(
            spec,
            self.output_dir,
            [probe, self.callback, *restore, *self.extra],
            device=device,
            store=store,
            before_training=self._before_training,
        )
        store.set_resolved_config(run_id, prepared.resolved)
        self.callback.flops = FlopsRate.for_run(prepared.resolved)
        self.prepared = prepared

    def train(self) -> None:
        """Train; the last rows in the store before the status changes; a stopped run marked cancelled."""
        assert self.prepared is not None and self.callback is not None, "setup() first"
        result = self.result = fit(self.prepared, self.resume_from)
        self.callback.flush()  # eval metrics and the last steps land before the status changes
        if self.spec.auto_find_batch_size:  # the record gains the micro-batch training ended with
            self.store.set_resolved_config(self.run_id, result.resolved)
        self._record_peak_memory(result)
        if result.stopped:
            log.info("run %s stopped early (%s): marking cancelled", self.run_id, self.callback.stop_reason or "signal")
            self.store.mark_cancelled(self.run_id, exit_code=0)

    def save(self) -> None:
        """The run's figures, the after-samples and the bundle; the run marked succeeded (nothing for a stopped run)."""
        assert self.result is not None and self.callback is not None, "train() first"
        result = self.result
        if result.stopped:
            return
        self._add_run_figures(result, self.callback.flops)
        if result.best is not None:  # why training ended where it did, and which step the bundle holds
            self._record_best(result.best)
        self._succeed(result)

    def cleanup(self) -> None:
        """Every sink gets the doctor's findings the worker stored so far, then the run's final status."""
        ended = self.store.get_run(self.run_id)
        found = findings_of(self.store.run_events(self.run_id))
        status = ended.status.value if ended is not None else "failed"
        for sink in self.callback.sinks if self.callback is not None else self.trackers:
            sink.note(found)
            sink.close(status)

    def failed(self, exc: BaseException) -> int:
        """How the run ended on `exc` (called while it is being handled), recorded; the exit code."""
        from storage.checkpoints import checkpoint_dirs, is_complete, remove_incomplete

        store, run_id, spec, output_dir = self.store, self.run_id, self.spec, self.output_dir
        if isinstance(exc, TrackersFailed):
            log.error("run %s failed: %s", run_id, exc)
            store.mark_failed(run_id, str(exc), traceback.format_exc(), exit_code=1)
            return 1
        try:
            if self.callback is not None:
                self.callback.flush()
        except Exception:  # noqa: BLE001 - the failure itself matters more than its last metrics
            log.exception("could not write the last metrics")
        if isinstance(exc, KeyboardInterrupt) or STOP_REQUESTED.is_set():
            store.mark_cancelled(run_id, exit_code=0)
            log.info("run %s cancelled", run_id)
            return 0
        step = (self.callback.step if self.callback is not None else 0) + 1
        if (
            isinstance(exc, torch_oom())
            and self.prepared is not None
            and oom.handle(store, run_id, spec, step, output_dir)
        ):
            log.warning("run %s: out of memory; the worker continues it with the change above", run_id)
            return oom.EXIT_OOM_RECOVER
        if isinstance(exc, torch_oom()) and share_cap.capped():
            log.warning(
                "run %s: out of memory within its share of the device; the worker queues it to run alone", run_id
            )
            return share_cap.EXIT_OUTGREW_SHARE
        summary = summarize(exc, spec)
        past = len(oom.recoveries(store, run_id)) if isinstance(exc, torch_oom()) else 0
        if past:
            summary += f" (after {past} automatic recover{'y' if past == 1 else 'ies'}; see the run's events)"
        if disk_full(exc):
            partial = [f for _step, f in checkpoint_dirs(output_dir) if not is_complete(f)]
            what, where = ("checkpoint", partial[-1]) if partial else ("output", output_dir)
            summary = (
                f"disk full while saving {what} to {where}: free space or lower save frequency "
                f"(save_steps); earlier complete checkpoints are kept"
            )
            remove_incomplete(output_dir)  # give the space back; it could not be resumed from anyway
        log.error("run %s failed: %s\n%s", run_id, summary, traceback.format_exc())
        store.mark_failed(run_id, summary, traceback.format_exc(), exit_code=1)
        return 1

    # ------------------------------------------------------------------ their parts
    def _before_training(self, model: Any, tokenizer: Any, eval_ds: Any) -> None:
        """The base model's before/after answers and its forgetting-meter figures (step 0); keeps the eval rows."""
        store, run_id = self.store, self.run_id
        before_after.record_before(store.run_dir(run_id), self.spec, model, tokenizer, eval_ds)
        self.held_out = eval_ds
        if not record_for(self.spec.trainer).score_head and not store.metrics(run_id, [forgetting.GENERAL]):
            # a resumed run keeps its base figures; every sink gets the rows as it gets every other
            assert self.callback is not None
            forgetting.record(self.callback.sinks, 0, model, tokenizer, eval_ds)

    def _record_peak_memory(self, result: TrainResult) -> None:
        """The peak the trainer measured, then the memory sampler's own readings when it has some."""
        store, run_id = self.store, self.run_id
        store.set_peak_memory(run_id, int(result.metrics["peak_memory_bytes"]), result.resolved["peak_memory_source"])
        sampled = figures.sampled_peak(store, run_id)  # the sampler's readings so far (it records its own at the end)
        if sampled is not None:
            store.set_peak_memory(run_id, *sampled)

    def _add_run_figures(self, result: TrainResult, flops: FlopsRate | None) -> None:
        """`result.metrics` gains the run's figures as the UI shows them (jobs.train.figures), its TFLOP/s
        and MFU, and a resumed run's loss over the whole run."""
        store, run_id = self.store, self.run_id
        # metrics.json, the model card and the final metrics carry the figures as the UI shows them.
        result.metrics.pop("step_time_mean", None)
        result.metrics.pop("tokens_per_second", None)
        result.metrics.update(figures.run_figures(store, store.get_run(run_id)).metrics())
        tps = result.metrics.get("tokens_per_second")
        if tps and flops is not None:  # achieved TFLOP/s and MFU at the run's mean tokens/s
            result.metrics["tflops_mean"] = flops.tflops(tps)
            mfu = flops.mfu(tps)
            if mfu is not None:
                result.metrics["mfu_mean"] = mfu
        if self.resume_from is not None:
            # The trainer's train_loss covers only the steps after the resume; the stored loss rows
            # (kept up to the checkpoint, redone after it) cover the whole run.
            whole = whole_run_mean(store, run_id, "loss")
            if whole is not None:
                result.metrics["train_loss"] = whole

    def _record_best(self, best: BestCheckpoint) -> None:
        log.info("run %s: %s", self.run_id, best.message())
        self.store.add_run_event(self.run_id, BEST_EVENT, best.message(), step=best.step, data=best.data())
        if best.metric.endswith("loss"):  # a dot on the loss graph at the step the bundle holds
            self.store.add_metrics(self.run_id, [MetricPoint(best.step, BEST_EVENT, best.value, time.time())])

    def _succeed(self, result: TrainResult) -> None:
        """The bundle and its before/after samples written, the run marked succeeded, its benchmarks queued."""
        from jobs.train.artifacts import write_artifacts

        store, run_id, spec = self.store, self.run_id, self.spec
        samples = before_after.record_after(store, run_id, spec, result.model, result.tokenizer)
        meter = None
        if store.metrics(run_id, [forgetting.GENERAL]):  # the base was measured: now the result
            run = store.get_run(run_id)
            step = max(1, run.current_step if run is not None else 1)
            sinks = self.callback.sinks if self.callback is not None else []
            forgetting.record(sinks, step, result.model, result.tokenizer, self.held_out)
            meter = forgetting.read(store, run_id)
        parts = before_after.bundle_parts(samples)
        parts["card_extra"] = parts.get("card_extra", "") + forgetting.card_section(meter)
        write_artifacts(store, run_id, spec, result.model, result.tokenizer, result.metrics, **parts)
        store.mark_succeeded(run_id, result.metrics)
        log.info("run %s succeeded: %s", run_id, result.metrics)
        for kind, args in evaluation_tasks(spec):  # benchmarks and a judge, base vs result: a worker's task
            task_id = store.create_task(run_id, kind, args)
            log.info("run %s: %s queued as task %s (%s)", run_id, kind, task_id, args)


def resume_point(store: RunLifecycle, run_id: int, output_dir: Path) -> str | None:
    """The checkpoint to continue from (None: start afresh); drops metric rows the resume redoes."""
    from storage.checkpoints import last_complete, remove_incomplete

    for folder in remove_incomplete(output_dir):
        log.warning("removed incomplete checkpoint %s", folder)
    last = last_complete(output_dir)
    dropped = store.truncate_metrics(run_id, last[0] if last else -1)
    if last is None:
        if dropped:
            log.info("no complete checkpoint: starting over (%d metric rows of the earlier attempt removed)", dropped)
        return None
    log.info("resuming from %s (step %d); %d metric rows after it removed", last[1], last[0], dropped)
    return str(last[1])


def whole_run_mean(store: MetricReader, run_id: int, name: str) -> float | None:
    """Mean of every stored value of one metric of a run (its rollups; None without rows)."""
    buckets = store.metric_series(run_id, name, 1 << 30)
    count = sum(b.count for b in buckets)
    return sum(b.total or 0.0 for b in buckets) / count if count else None
