"""A run as OpenAI's `fine_tuning.job`, its metrics and events as `fine_tuning.job.event`s, its checkpoints.

Every run is a job, `ftjob-<run id>`: what was asked through `/v1/fine_tuning/jobs` that the spec does not
hold (the `model` as the client named it, `suffix`, `metadata`) is kept beside the run as
`openai-job.json`; everything else is read from the run's record, spec, metrics and events, its one home.

    job_object(store, run)              # the dict the `openai` client parses as FineTuningJob
    job_events(store, run)              # newest first: the loss at each logged step, the run's events
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from jobs.spec.job import JobSpec
from jobs.spec.stored import spec_of
from storage.api_files import file_id_of
from storage.checkpoints import checkpoint_dirs, is_complete
from storage.models import RunStatus
from storage.records import RunRecord
from storage.roles_pages import RunReport

EXTRAS_FILE = "openai-job.json"
JOB_PREFIX = "ftjob-"
STATUSES = {
    RunStatus.QUEUED: "queued",
    RunStatus.RUNNING: "running",
    RunStatus.SUCCEEDED: "succeeded",
    RunStatus.FAILED: "failed",
    RunStatus.CANCELLED: "cancelled",
    RunStatus.INTERRUPTED: "failed",  # the worker went away: `tunedeck resume` can continue it
}
METHODS = {"sft": "supervised", "dpo": "dpo", "grpo": "reinforcement"}  # trainer -> OpenAI's method type
_JOB_ID = re.compile(r"ftjob-(\d{1,18})")


def job_id(run_id: int) -> str:
    return f"{JOB_PREFIX}{run_id}"


def run_id_of(ident: str) -> int | None:
    """The run id of a job id `ftjob-N`, else None."""
    found = _JOB_ID.fullmatch(ident.strip()) if isinstance(ident, str) else None
    return int(found.group(1)) if found else None


def save_extras(store: RunReport, run_id: int, extras: dict[str, Any]) -> None:
    (store.run_dir(run_id) / EXTRAS_FILE).write_text(json.dumps(extras))


def extras_of(store: RunReport, run_id: int) -> dict[str, Any]:
    """What the client asked that the spec does not hold ({} for a run made elsewhere)."""
    try:
        found = json.loads((store.run_path(run_id) / EXTRAS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def fine_tuned_name(run: RunRecord, spec: JobSpec, extras: dict[str, Any]) -> str:
    """`ft:<base>:<suffix>:<run id>`: read as the run's id by `/v1/chat/completions` (`jobs.models.served_names`)."""
    base = Path(str(extras.get("model") or spec.model)).name or "model"
    suffix = re.sub(r"[^A-Za-z0-9._-]+", "-", str(extras.get("suffix") or "tunedeck")).strip("-") or "tunedeck"
    return f"ft:{base}:{suffix}:{run.id}"


def _file_ref(ref: str | None) -> str | None:
    return file_id_of(ref) or ref


def _hyperparameters(spec: JobSpec) -> dict[str, Any]:
    default_lr = JobSpec.__dataclass_fields__["learning_rate"].default
    out: dict[str, Any] = {
        "n_epochs": spec.num_train_epochs if spec.num_train_epochs % 1 else int(spec.num_train_epochs),
        "batch_size": spec.per_device_train_batch_size,
        "learning_rate_multiplier": spec.learning_rate / float(default_lr),  # type: ignore[arg-type]
    }
    if spec.trainer.value == "dpo":
        out["beta"] = spec.beta
    return out


def _method(spec: JobSpec) -> dict[str, Any] | None:
    kind = METHODS.get(spec.trainer.value)
    if kind is None:
        return None  # kto, orpo, ... have no OpenAI method
    return {"type": kind, kind: {"hyperparameters": _hyperparameters(spec)}}


def _trained_tokens(store: RunReport, run: RunRecord) -> int | None:
    if run.status is not RunStatus.SUCCEEDED:
        return None
    found = run.final_metrics.get("num_tokens")
    if found is None:
        last = store.last_metric(run.id, "num_tokens")
        found = last.value if last is not None else None
    return int(found) if found is not None and math.isfinite(found) else None


def _error(run: RunRecord) -> dict[str, Any] | None:
    if run.status is RunStatus.FAILED:
        return {"code": "training_failed", "message": run.error_summary or "the run failed", "param": None}
    if run.status is RunStatus.INTERRUPTED:
        message = (run.error_summary or "its worker stopped") + f" (continue it with `tunedeck resume {run.id}`)"
        return {"code": "interrupted", "message": message, "param": None}
    return None


def job_object(store: RunReport, run: RunRecord) -> dict[str, Any]:
    """The run as the `openai` client's FineTuningJob."""
    spec, extras = spec_of(run), extras_of(store, run.id)
    done = run.status is RunStatus.SUCCEEDED
    return {
        "id": job_id(run.id),
        "object": "fine_tuning.job",
        "created_at": int(run.created_at),
        "finished_at": int(run.finished_at) if run.finished_at and run.status.finished else None,
        "model": str(extras.get("model") or spec.model),
        "fine_tuned_model": fine_tuned_name(run, spec, extras) if done else None,
        "organization_id": "tunedeck",
        "result_files": [],
        "status": STATUSES[run.status],
        "validation_file": _file_ref(spec.eval_dataset),
        "training_file": _file_ref(spec.dataset) or "",
        "hyperparameters": _hyperparameters(spec),
        "method": _method(spec),
        "trained_tokens": _trained_tokens(store, run),
        "error": _error(run),
        "seed": spec.seed,
        "estimated_finish": None,
        "integrations": [],
        "metadata": extras.get("metadata") or None,
        "user_provided_suffix": extras.get("suffix"),
        "tunedeck_run_id": run.id,
    }


# ---------------------------------------------------------------------- events
def _event(ident: str, when: float, message: str, level: str = "info", **more: Any) -> dict[str, Any]:
    event = {"id": ident, "object": "fine_tuning.job.event", "created_at": int(when), "level": level}
    return event | {"message": message, "type": "message", "data": None} | more


def _metric_events(store: RunReport, run: RunRecord) -> list[dict[str, Any]]:
    """One `metrics` event per logged step: the training loss (and the eval loss where it was measured)."""
    points = store.metrics(run.id, names=["loss", "eval_loss"])
    evals = {p.step: p.value for p in points if p.name == "eval_loss"}
    total = run.total_steps
    out = []
    for p in points:
        if p.name != "loss" or not math.isfinite(p.value):
            continue
        data: dict[str, Any] = {"step": p.step, "train_loss": p.value, "total_steps": total}
        text = f"Step {p.step}/{total or '?'}: training loss={p.value:.4f}"
        if p.step in evals and math.isfinite(evals[p.step]):
            data["valid_loss"] = evals[p.step]
            text += f", validation loss={evals[p.step]:.4f}"
        out.append(_event(f"ftevent-{run.id}-m{p.step}", p.time, text, type="metrics", data=data))
    return out


def job_events(store: RunReport, run: RunRecord) -> list[dict[str, Any]]:
    """The job's events, newest first: created, started, the run's own events, the loss by step, the end."""
    ident = job_id(run.id)
    events = [_event(f"ftevent-{run.id}-created", run.created_at, f"Created fine-tuning job: {ident}")]
    if run.started_at:
        events.append(_event(f"ftevent-{run.id}-started", run.started_at, "Fine-tuning job started"))
    for e in store.run_events(run.id):
        level = "error" if "fail" in e["kind"] else "warn" if "oom" in e["kind"] else "info"
        events.append(_event(f"ftevent-{run.id}-e{e['id']}", e["time"], e["message"], level, data=e["data"] or None))
    events += _metric_events(store, run)
    if run.status.finished and run.finished_at:
        text = {
            RunStatus.SUCCEEDED: "The job has successfully completed",
            RunStatus.CANCELLED: "The job was cancelled",
        }.get(run.status, f"The job failed: {run.error_summary or run.status.value}")
        level = "info" if run.status in (RunStatus.SUCCEEDED, RunStatus.CANCELLED) else "error"
        events.append(_event(f"ftevent-{run.id}-end", run.finished_at, text, level))
    order = {e["id"]: i for i, e in enumerate(events)}  # same second: in the order written
    return sorted(events, key=lambda e: (e["created_at"], order[e["id"]]), reverse=True)


def job_checkpoints(store: RunReport, run: RunRecord) -> list[dict[str, Any]]:
    """The run's kept checkpoints (those saved whole), newest first, with the training loss at their step."""
    losses = {p.step: p.value for p in store.metrics(run.id, names=["loss"])}
    spec, extras = spec_of(run), extras_of(store, run.id)
    out = []
    for step, folder in sorted(checkpoint_dirs(store.run_path(run.id) / "output"), reverse=True):
        try:
            if not is_complete(folder):
                continue  # being written, or left by a process that died while saving it
            created = int(folder.stat().st_mtime)
        except OSError:
            continue  # removed meanwhile (save_total_limit)
        loss = losses.get(step)
        out.append(
            {
                "id": f"ftckpt-{run.id}-{step}",
                "object": "fine_tuning.job.checkpoint",
                "created_at": created,
                "fine_tuned_model_checkpoint": f"{fine_tuned_name(run, spec, extras)}:ckpt-step-{step}",
                "fine_tuning_job_id": job_id(run.id),
                "step_number": step,
                "metrics": {"step": step, "train_loss": loss if loss is not None and math.isfinite(loss) else None},
            }
        )
    return out


def page(items: list[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any]:
    """A cursor page of `items` (already in order): those after the one whose id is `after`, at most `limit`."""
    ids = [i["id"] for i in items]
    start = ids.index(after) + 1 if after in ids else 0
    chosen = items[start : start + limit]
    return {
        "object": "list",
        "data": chosen,
        "has_more": start + limit < len(items),
        "first_id": chosen[0]["id"] if chosen else None,
        "last_id": chosen[-1]["id"] if chosen else None,
    }
