"""The training child: one run, one process. The worker spawns it; it is also runnable by hand.

    python -m jobs.train.child --run-id 7        # reads the spec from the store, trains, records

It loads the run's `JobSpec` from the store (TUNEDECK_DATABASE_URL / TUNEDECK_HOME), parsed
strictly: a stored spec this version cannot read fails the run with the fields named, and nothing
is trained. It maps it to trl/peft/bitsandbytes configs with the pure `jobs.config.mapping`, trains
with trl's SFTTrainer or DPOTrainer plus `StoreCallback` and `PhaseProbe` (memory at the points of
the first optimizer step, kept as the run's `phases.json`: `jobs.train.phases`), evaluates, answers
a few held-out prompts with the base (before training) and the result (after:
`jobs.train.before_after`), writes the bundle (`jobs.train.artifacts`) and marks the run
succeeded; any exception marks it failed with a one-line summary and the traceback (exit 1).
SIGTERM stops training at the next step boundary, saves a checkpoint there and marks the run
cancelled (exit 0). A run put back in the queue (`tunedeck resume`) continues from its last
complete checkpoint (`storage.checkpoints`) with optimizer, scheduler and RNG state; its metric
rows after that step are deleted first, so none is duplicated. A non-finite loss fails the run
("non-finite loss at step N") and keeps the last good checkpoint; a full disk while saving
fails it with the folder named and the half-written checkpoint removed. A CUDA out-of-memory
error in training, with `on_oom: recover`, records the next memory trick as a run event and exits
with `jobs.train.oom.EXIT_OOM_RECOVER`; the worker starts the run again with that change (`jobs.train.oom`).
On a shared device the child caps its CUDA memory at its share; an OOM it cannot recover from there
exits with `EXIT_OUTGREW_SHARE`, and the worker queues the run to run alone (`jobs.train.share_cap`).
Output goes to stdout, which the worker sends to the run's train.log.

`run(run_id)` is the run with the store around it (spec, resume point, results, how it ended);
`jobs.train.training.train_spec(spec, output_dir, callbacks)` does the training without any store
(tests, bench); `jobs.train.failure` words the errors. The trackers of `report_to` receive the metric rows as they are
written (`jobs.train.mirrors`); one that cannot start fails the run before it trains.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

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
from jobs.train.mirrors import Mirrors
from jobs.train.parent_watch import stop_with_parent
from jobs.train.phase_probe import PhaseProbe
from jobs.train.training import TrainResult, train_spec
from storage.roles import MetricReader, RunLifecycle, TrainingRecord
from storage.store import MetricPoint

log = logging.getLogger("jobs.train.child")  # named: run as `-m`, this module is __main__


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Ask the training loop to stop at the next step boundary."""
    log.warning("received signal %s: stopping at the next step", signum)
    STOP_REQUESTED.set()


def setup_logging() -> None:
    """Log lines to stdout (the worker redirects it to the run's train.log)."""
    logging.basicConfig(
        stream=sys.stdout, level=logging.INFO, force=True, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    warnings.filterwarnings("ignore", message=checkpointing.DEPRECATION_WARNING, category=FutureWarning)
    import datasets
    import transformers

    datasets.disable_progress_bars()  # progress bars are carriage-return noise in a log file
    transformers.utils.logging.disable_progress_bar()


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


def run(run_id: int, store: TrainingRecord | None = None, callbacks: Sequence[Any] = ()) -> int:
    """Train run `run_id` from the store; returns the process exit code.

    `callbacks`: extra trainer callbacks (tests inject faults through them)."""
    from storage.store import Store

    store = store or Store()
    record = store.get_run(run_id)
    if record is None:
        log.error("run %s does not exist", run_id)
        return 1
    try:
        submitted = read_spec(record.spec_json)
    except SpecError as exc:  # never train something else: the run fails, naming the fields
        summary = unreadable_summary(exc)
        log.error("run %s failed: %s", run_id, summary)
        store.mark_failed(run_id, summary, str(exc), exit_code=1)
        return 1
    spec = oom.effective_spec(store, run_id, submitted)  # after an OOM recovery: the changed spec
    log.info("run %s: %s\n%s", run_id, spec.display_name, spec.to_yaml())
    try:
        mirrors = Mirrors.open(spec, run_id, store.run_dir(run_id))  # report_to (jobs.train.mirrors)
    except Exception as exc:  # noqa: BLE001 - a tracker that cannot start fails the run before it trains
        summary = f"report_to: a tracker could not start ({type(exc).__name__}: {exc})"
        log.error("run %s failed: %s", run_id, summary)
        store.mark_failed(run_id, summary, traceback.format_exc(), exit_code=1)
        return 1
    try:
        return _train(store, run_id, spec, callbacks, mirrors)
    finally:
        ended = store.get_run(run_id)
        mirrors.note(findings_of(store.run_events(run_id)))  # the doctor's findings the worker stored so far
        mirrors.close(ended.status.value if ended is not None else "failed")


def _train(store: TrainingRecord, run_id: int, spec: JobSpec, callbacks: Sequence[Any], mirrors: Mirrors) -> int:
    """Train the parsed spec with its metrics mirrored; record how it ended; the exit code."""
    # Under a worker (it passes TUNEDECK_WORKER_ID) a cancel arrives as SIGTERM within the
    # worker's poll interval; asking the database as well would only cost the training time.
    worker_id = os.environ.get("TUNEDECK_WORKER_ID") or None
    callback = StoreCallback(
        store,
        run_id,
        save_interval_s=spec.save_minutes * 60 if spec.save_minutes else None,
        cancel_interval=None if worker_id else 2.0,
        worker_id=worker_id,
        mirrors=mirrors,
    )
    output_dir = store.run_dir(run_id) / "output"
    training = []  # set once the trainer is built: an OOM after that is one a smaller step can avoid
    held_out: dict[str, Any] = {}  # the eval rows, kept for the forgetting meter's "after" (jobs.train.forgetting)

    def ready(cfg: dict[str, Any]) -> None:
        store.set_resolved_config(run_id, cfg)
        callback.flops = FlopsRate.for_run(cfg)
        training.append(True)

    try:
        device = detect_device()
        log.info("device: %s", device)
        share_cap.apply_cap()  # a shared device: this run's share of it (`jobs.train.share_cap`)
        resume_from = resume_point(store, run_id, output_dir)
        restore = [cb for cb in (oom.scheduler_restorer(resume_from),) if cb is not None]
        # memory at the points of the first optimizer step, kept as phases.json (jobs.train.phases)
        probe = PhaseProbe(device.cuda, on_record=lambda measured: phases.record(store, run_id, measured))
        result = train_spec(
            spec,
            output_dir,
            [probe, callback, *restore, *callbacks],
            device=device,
            resume_from=resume_from,
            on_ready=ready,
            store=store,
            before_training=lambda m, t, ev: _before_training(store, run_id, spec, m, t, ev, held_out, mirrors),
        )
        callback.flush()  # eval metrics and the last steps land before the status changes
        if spec.auto_find_batch_size:  # the record gains the micro-batch training ended with
            store.set_resolved_config(run_id, result.resolved)
        _record_peak_memory(store, run_id, result)
        if result.stopped:
            log.info("run %s stopped early (%s): marking cancelled", run_id, callback.stop_reason or "signal")
            store.mark_cancelled(run_id, exit_code=0)
            return 0
        _add_run_figures(store, run_id, result, callback.flops, resumed=resume_from is not None)
        if result.best is not None:  # why training ended where it did, and which step the bundle holds
            _record_best(store, run_id, result.best)
        _succeed(store, run_id, spec, result, held_out.get("eval"), mirrors)
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the run row
        return _failed(store, run_id, spec, exc, callback, output_dir, training=bool(training))


def _record_peak_memory(store: TrainingRecord, run_id: int, result: TrainResult) -> None:
    """The peak the trainer measured, then the memory sampler's own readings when it has some."""
    store.set_peak_memory(run_id, int(result.metrics["peak_memory_bytes"]), result.resolved["peak_memory_source"])
    sampled = figures.sampled_peak(store, run_id)  # the sampler's readings so far (it records its own at the end)
    if sampled is not None:
        store.set_peak_memory(run_id, *sampled)


def _add_run_figures(
    store: TrainingRecord, run_id: int, result: TrainResult, flops: FlopsRate | None, *, resumed: bool
) -> None:
    """`result.metrics` gains the run's figures as the UI shows them (jobs.train.figures), its TFLOP/s
    and MFU, and a resumed run's loss over the whole run."""
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
    if resumed:
        # The trainer's train_loss covers only the steps after the resume; the stored loss rows
        # (kept up to the checkpoint, redone after it) cover the whole run.
        whole = whole_run_mean(store, run_id, "loss")
        if whole is not None:
            result.metrics["train_loss"] = whole


def _record_best(store: TrainingRecord, run_id: int, best: BestCheckpoint) -> None:
    log.info("run %s: %s", run_id, best.message())
    store.add_run_event(run_id, BEST_EVENT, best.message(), step=best.step, data=best.data())
    if best.metric.endswith("loss"):  # a dot on the loss graph at the step the bundle holds
        store.add_metrics(run_id, [MetricPoint(best.step, BEST_EVENT, best.value, time.time())])


def _before_training(
    store: TrainingRecord,
    run_id: int,
    spec: JobSpec,
    model: Any,
    tokenizer: Any,
    eval_ds: Any,
    held_out: dict,
    mirrors: Mirrors,
) -> None:
    """The base model's before/after answers and its forgetting-meter figures (step 0); keeps the eval rows."""
    before_after.record_before(store.run_dir(run_id), spec, model, tokenizer, eval_ds)
    held_out["eval"] = eval_ds
    if not record_for(spec.trainer).score_head and not store.metrics(run_id, [forgetting.GENERAL]):
        # a resumed run keeps its base figures; the trackers get the rows as they get every other
        mirrors.log(forgetting.record(store, run_id, 0, model, tokenizer, eval_ds))


def _succeed(
    store: TrainingRecord,
    run_id: int,
    spec: JobSpec,
    result: TrainResult,
    eval_ds: Any = None,
    mirrors: Mirrors | None = None,
) -> None:
    """The bundle and its before/after samples written, the run marked succeeded, its benchmarks queued."""
    from jobs.train.artifacts import write_artifacts

    samples = before_after.record_after(store, run_id, spec, result.model, result.tokenizer)
    meter = None
    if store.metrics(run_id, [forgetting.GENERAL]):  # the base was measured: now the result
        run = store.get_run(run_id)
        step = max(1, run.current_step if run is not None else 1)
        points = forgetting.record(store, run_id, step, result.model, result.tokenizer, eval_ds)
        if mirrors is not None:
            mirrors.log(points)
        meter = forgetting.read(store, run_id)
    parts = before_after.bundle_parts(samples)
    parts["card_extra"] = parts.get("card_extra", "") + forgetting.card_section(meter)
    write_artifacts(store, run_id, spec, result.model, result.tokenizer, result.metrics, **parts)
    store.mark_succeeded(run_id, result.metrics)
    log.info("run %s succeeded: %s", run_id, result.metrics)
    for kind, args in evaluation_tasks(spec):  # benchmarks and a judge, base vs result: a worker's task
        task_id = store.create_task(run_id, kind, args)
        log.info("run %s: %s queued as task %s (%s)", run_id, kind, task_id, args)


def _failed(
    store: TrainingRecord,
    run_id: int,
    spec: JobSpec,
    exc: BaseException,
    callback: StoreCallback,
    output_dir: Path,
    *,
    training: bool,
) -> int:
    """How the run ended on `exc` (called while it is being handled), recorded; the exit code.
    `training`: the trainer was built (an OOM after that is one a smaller step can avoid)."""
    from storage.checkpoints import checkpoint_dirs, is_complete, remove_incomplete

    try:
        callback.flush()
    except Exception:  # noqa: BLE001 - the failure itself matters more than its last metrics
        log.exception("could not write the last metrics")
    if isinstance(exc, KeyboardInterrupt) or STOP_REQUESTED.is_set():
        store.mark_cancelled(run_id, exit_code=0)
        log.info("run %s cancelled", run_id)
        return 0
    if isinstance(exc, torch_oom()) and training and oom.handle(store, run_id, spec, callback.step + 1, output_dir):
        log.warning("run %s: out of memory; the worker continues it with the change above", run_id)
        return oom.EXIT_OOM_RECOVER
    if isinstance(exc, torch_oom()) and share_cap.capped():
        log.warning("run %s: out of memory within its share of the device; the worker queues it to run alone", run_id)
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


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `--run-id`, install the SIGTERM handler, train."""
    parser = argparse.ArgumentParser(description="Train one tunedeck run (spawned by the worker).")
    parser.add_argument("--run-id", type=int, required=True)
    ns = parser.parse_args(argv)
    setup_logging()
    signal.signal(signal.SIGTERM, _on_sigterm)
    stop_with_parent(_on_sigterm)
    return run(ns.run_id)


if __name__ == "__main__":
    sys.exit(main())
