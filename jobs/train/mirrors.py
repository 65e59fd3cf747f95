"""Mirrors of a run's metrics in other experiment trackers: W&B, MLflow, TensorBoard, trackio (`report_to`).

Why not transformers' own `report_to`: its integrations log what the trainer logs, while the run page
graphs more (tokens/s, step time, TFLOP/s, MFU, computed by `jobs.train.callbacks.StoreCallback`). Here
each tracker is a metrics sink beside the store's (`TrackerSink`, `jobs.train.sinks`): the callback hands
every batch of rows to the store's sink, then to each tracker's, so each tracker receives exactly the rows
tunedeck records, at the same steps. Each tracker also gets the spec as its
config and the run's tunedeck address (`run_url`: `TUNEDECK_URL`, which `tunedeck serve` sets for its
own worker, plus `/?run=N`).

Credentials and destinations come from the worker's environment, read by each library itself
(WANDB_API_KEY, WANDB_MODE=offline, WANDB_PROJECT, MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME,
TRACKIO_DIR, ...); the dashboard never sees them. Without MLFLOW_TRACKING_URI, MLflow's store is
`sqlite:///$TUNEDECK_HOME/mlflow.db` (`jobs.checks.trackers.mlflow_tracking_uri`). TensorBoard event files
and W&B's local files go to the run's folder (`tensorboard/`, `wandb/`) unless WANDB_DIR says otherwise.

What can be known before the run queues is checked at submit (`jobs.checks.trackers`: the package, MLflow's
store, W&B's key). A tracker that still cannot start fails the run before it trains (a wrong key shows at
once, not after hours); one that fails while logging is logged and training goes on, like a slow store write.

    trackers = open_trackers(spec, run_id, store.run_dir(run_id))    # one TrackerSink per tracker
    trackers[0].log(Rows([MetricPoint(1, "loss", 2.3, time.time())]))
    trackers[0].note(findings)   # the training doctor's findings stored so far: tags / notes / text (at the run's end)
    trackers[0].close("succeeded")
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from jobs.doctor.findings import Finding
from jobs.spec.job import JobSpec
from jobs.spec.trackers import Tracker
from jobs.train.sinks import Rows
from storage.records import MetricPoint

log = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:7860"
TAG_PREFIX = "doctor:"  # a finding's tag: "doctor:loss_spike" (W&B tag; MLflow tag tunedeck.doctor:loss_spike)
PROJECT = "tunedeck"  # the W&B project, MLflow experiment and trackio project unless the environment names one


def run_url(run_id: int) -> str:
    """The run's page on the dashboard (`TUNEDECK_URL`, default the local dashboard)."""
    return f"{os.environ.get('TUNEDECK_URL', DEFAULT_URL).rstrip('/')}/?run={run_id}"


def by_step(points: Sequence[MetricPoint]) -> list[tuple[int, dict[str, float], float]]:
    """Rows grouped by step, in step order: (step, {name: value}, the latest wall time among them)."""
    grouped: dict[int, tuple[dict[str, float], float]] = {}
    for p in points:
        values, wall = grouped.get(p.step, ({}, p.time))
        values[p.name] = p.value
        grouped[p.step] = (values, max(wall, p.time))
    return [(step, values, wall) for step, (values, wall) in sorted(grouped.items())]


class Mirror(Protocol):
    """One tracker's own client (below): it may raise; `TrackerSink` keeps its errors from training."""

    def log(self, points: Sequence[MetricPoint]) -> None: ...
    def note(self, findings: Sequence[Finding]) -> None: ...
    def close(self, status: str) -> None: ...


class TrackerSink:
    """One open tracker as a metrics sink (`jobs.train.sinks.MetricsSink`): its errors are logged, never raised,
    so training and the other sinks go on."""

    def __init__(self, tracker: Tracker, mirror: Mirror) -> None:
        self.tracker = tracker
        self.mirror = mirror

    def log(self, rows: Rows) -> None:
        if not rows.points:
            return
        try:
            self.mirror.log(rows.points)
        except Exception:  # a tracker's error is logged; training and the other trackers go on
            log.exception("mirroring %d metric rows to %s failed", len(rows.points), self.tracker.value)

    def note(self, findings: Sequence[Finding]) -> None:
        """The training doctor's findings (`jobs.doctor`) as the tracker's tags or notes."""
        if not findings:
            return
        try:
            self.mirror.note(findings)
        except Exception:
            log.exception("noting %d findings in %s failed", len(findings), self.tracker.value)

    def close(self, status: str) -> None:
        """Finish the tracker's run with tunedeck's final status (succeeded, failed, cancelled)."""
        try:
            self.mirror.close(status)
        except Exception:
            log.exception("closing the %s run failed", self.tracker.value)


def open_trackers(spec: JobSpec, run_id: int, folder: Path) -> list[TrackerSink]:
    """Start each tracker in spec.report_to (raises when one cannot start, after closing those started:
    the run fails before training)."""
    name = f"{run_id}-{spec.display_name}"
    config = {**spec.to_dict(), "tunedeck_run_id": run_id, "tunedeck_url": run_url(run_id)}
    opened: list[TrackerSink] = []
    try:
        for tracker in spec.tracker_list:
            opened.append(TrackerSink(tracker, OPENERS[tracker](name, config, folder)))
            log.info("mirroring metrics to %s", tracker.value)
    except BaseException:
        for sink in opened:
            sink.close("failed")
        raise
    return opened


# ---------------------------------------------------------------------- the trackers
class _Wandb:
    def __init__(self, name: str, config: dict[str, Any], folder: Path):
        import wandb

        where = None if os.environ.get("WANDB_DIR") else folder
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", PROJECT),
            name=name,
            config=config,
            notes=config["tunedeck_url"],
            dir=str(where) if where else None,
            reinit="create_new",
        )

    def log(self, points: Sequence[MetricPoint]) -> None:
        for step, values, _wall in by_step(points):
            self.run.log(values, step=step)

    def note(self, findings: Sequence[Finding]) -> None:
        self.run.tags = (*(self.run.tags or ()), *(TAG_PREFIX + f.code.value for f in findings))
        self.run.notes = "\n".join([self.run.notes or "", *(f.message for f in findings)]).strip()

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "succeeded" else 1)


class _Mlflow:
    def __init__(self, name: str, config: dict[str, Any], folder: Path):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        from jobs.checks.trackers import mlflow_tracking_uri

        # MLFLOW_TRACKING_URI, else sqlite:///$TUNEDECK_HOME/mlflow.db: never MLflow's own default, a mlflow.db
        # in whatever folder the worker was started in
        self.client = MlflowClient(tracking_uri=mlflow_tracking_uri())
        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", PROJECT)
        experiment = self.client.get_experiment_by_name(experiment_name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(experiment_name)
        url = config["tunedeck_url"]
        tags = {"tunedeck.url": url, "tunedeck.run_id": str(config["tunedeck_run_id"]), "mlflow.note.content": url}
        self.run_id = self.client.create_run(experiment_id, run_name=name, tags=tags).info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in config.items() if v is not None]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[start : start + 100])

    def log(self, points: Sequence[MetricPoint]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(p.name, p.value, int(p.time * 1000), p.step) for p in points]
        for start in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics per batch
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def note(self, findings: Sequence[Finding]) -> None:
        for f in findings:
            self.client.set_tag(self.run_id, f"tunedeck.{TAG_PREFIX}{f.code.value}", f"{f.message} Fix: {f.fix}"[:5000])

    def close(self, status: str) -> None:
        final = {"succeeded": "FINISHED", "cancelled": "KILLED"}.get(status, "FAILED")
        self.client.set_terminated(self.run_id, status=final)


class _TensorBoard:
    def __init__(self, name: str, config: dict[str, Any], folder: Path):
        import yaml
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder / "tensorboard"))
        self.writer.add_text("tunedeck_url", config["tunedeck_url"], 0)
        spec_text = yaml.safe_dump(config, sort_keys=False)
        self.writer.add_text("spec", "    " + spec_text.replace("\n", "\n    "), 0)  # indented: markdown code

    def log(self, points: Sequence[MetricPoint]) -> None:
        for p in points:
            self.writer.add_scalar(p.name, p.value, global_step=p.step, walltime=p.time)
        self.writer.flush()

    def note(self, findings: Sequence[Finding]) -> None:
        for f in findings:
            self.writer.add_text(f"doctor/{f.code.value}", f"{f.message} Fix: {f.fix}", f.step)
        self.writer.flush()

    def close(self, status: str) -> None:
        self.writer.add_text("status", status, 0)
        self.writer.close()


class _Trackio:
    def __init__(self, name: str, config: dict[str, Any], folder: Path):
        import trackio

        self.run = trackio.init(
            project=os.environ.get("TRACKIO_PROJECT", PROJECT),
            name=name,
            config=config,
            embed=False,
            auto_log_gpu=False,  # tunedeck's own sampler records the device
            auto_log_cpu=False,
        )

    def log(self, points: Sequence[MetricPoint]) -> None:
        for step, values, _wall in by_step(points):
            self.run.log(values, step=step)

    def note(self, findings: Sequence[Finding]) -> None:
        """trackio has neither tags nor notes: each finding is a logged `doctor/<code>` of 1 at its step."""
        for f in findings:
            self.run.log({f"doctor/{f.code.value}": 1.0}, step=f.step)

    def close(self, status: str) -> None:
        self.run.finish()


OPENERS: dict[Tracker, Any] = {
    Tracker.WANDB: _Wandb,
    Tracker.MLFLOW: _Mlflow,
    Tracker.TENSORBOARD: _TensorBoard,
    Tracker.TRACKIO: _Trackio,
}
