"""What a training produced, read from the trainer: `TrainResult` and the figures it carries.

    metrics = training_metrics(spec, trainer, output, trainable, total, evaluate=True)  # loss, runtime, eval_*
    add_memory_metrics(device, callbacks, metrics, resolved)   # the run's peak memory and where it was read
    add_trainer_figures(metrics, resolved, resume_from, final_batch, best)  # step time, final micro-batch, best

Store-less: `jobs.train.training` fills a `TrainResult` with these for every caller; a stored run's recipe
(`jobs.train.recipe`) then replaces the step time and tokens/s with the figures of its stored rows
(`jobs.train.figures`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.devices.facts import Device
from jobs.spec.job import JobSpec
from jobs.spec.trainer_records import record_for
from jobs.train.best import BestCheckpoint
from jobs.train.phase_probe import MemoryMeter, PhaseProbe
from jobs.train.readback import final_micro_batch
from jobs.train.trainers import perplexity


@dataclass
class TrainResult:
    """What a finished (or stopped) training produced."""

    model: Any
    tokenizer: Any
    trainer: Any
    metrics: dict[str, float]
    resolved: dict[str, Any]
    stopped: bool = False
    log_history: list[dict[str, Any]] = field(default_factory=list)
    best: BestCheckpoint | None = None  # with early stopping: the checkpoint the model was reloaded from


def peak_memory(device: Device, meter: MemoryMeter | None = None) -> tuple[int, str]:
    """Peak torch reserved memory on CUDA, else the process's peak RSS: (bytes, source).

    `meter`: the phase probe's, whose resets of the peak counters it undoes (jobs.train.phase_probe)."""
    peaks = (meter or MemoryMeter(device.cuda)).run_peaks()
    return (peaks["reserved"], "torch") if device.cuda else (peaks["rss"], "host")


def count_params(model: Any) -> tuple[int, int]:
    """(trainable, total) parameters; peft counts 4-bit weights at their real element count."""
    if hasattr(model, "get_nb_trainable_parameters"):
        trainable, total = model.get_nb_trainable_parameters()
        return int(trainable), int(total)
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def trained_tokens(log_history: Sequence[dict[str, Any]]) -> float | None:
    """Non-pad tokens trained, as counted by trl (`num_tokens` of the last training log)."""
    for entry in reversed(log_history):
        if "num_tokens" in entry and "eval_loss" not in entry:
            return float(entry["num_tokens"])
    return None


def checkpoint_step(resume_from: str | None) -> int:
    """The step of a `checkpoint-N` folder (0 without one)."""
    name = Path(resume_from).name if resume_from else ""
    return int(name.split("-")[-1]) if name.startswith("checkpoint-") and name.split("-")[-1].isdigit() else 0


def record_final_batch(spec: JobSpec, trainer: Any, resolved: dict[str, Any]) -> int | None:
    """The micro-batch the auto_find_batch_size loop ended with (None when off); `resolved` records it."""
    final_batch = final_micro_batch(trainer) if spec.auto_find_batch_size else None
    if final_batch is not None and final_batch != spec.per_device_train_batch_size:
        # the loop halved the micro-batch after an out-of-memory error: the record says what ran
        resolved["trainer_config"]["per_device_train_batch_size"] = final_batch
        resolved["library_changes"]["per_device_train_batch_size"] = {
            "requested": spec.per_device_train_batch_size,
            "effective": final_batch,
        }
    return final_batch


def training_metrics(
    spec: JobSpec, trainer: Any, output: Any, trainable: int, total: int, *, evaluate: bool
) -> dict[str, float]:
    """The run's figures from trl's output: loss, runtime, steps, parameters, the eval set's (when
    `evaluate`) and the tokens trained."""
    metrics: dict[str, float] = {
        "train_loss": float(output.training_loss),
        "train_runtime": float(output.metrics.get("train_runtime", 0.0)),
        "global_step": float(output.global_step),
        "trainable_params": float(trainable),
        "total_params": float(total),
    }
    if evaluate:
        metrics.update(
            {
                k: float(v)
                for k, v in trainer.evaluate().items()
                if k.startswith("eval_") and isinstance(v, (int, float))
            }
        )
        if "eval_loss" in metrics and "perplexity" in record_for(spec.trainer).callbacks:
            metrics["eval_perplexity"] = perplexity(metrics["eval_loss"])
    tokens = trained_tokens(trainer.state.log_history)
    if tokens is not None and metrics["train_runtime"] > 0:
        metrics["num_tokens"] = tokens
        metrics["tokens_per_second"] = tokens / metrics["train_runtime"]
    return metrics


def add_memory_metrics(
    device: Device, callbacks: Sequence[Any], metrics: dict[str, float], resolved: dict[str, Any]
) -> None:
    """The run's peak memory (from the phase probe's meter when one ran) into `metrics`, its source into `resolved`."""
    probe = next((cb for cb in callbacks if isinstance(cb, PhaseProbe)), None)
    meter = probe.meter if probe is not None else MemoryMeter(device.cuda)
    peak, source = peak_memory(device, meter)
    metrics["peak_memory_bytes"] = float(peak)
    resolved["peak_memory_source"] = source
    if device.cuda:
        peaks = meter.run_peaks()
        metrics["peak_torch_allocated_bytes"] = float(peaks["allocated"])
        metrics["peak_torch_reserved_bytes"] = float(peaks["reserved"])
    else:
        metrics["peak_rss_bytes"] = float(peak)


def add_trainer_figures(
    metrics: dict[str, float],
    resolved: dict[str, Any],
    resume_from: str | None,
    final_batch: int | None,
    best: BestCheckpoint | None,
) -> None:
    """The mean step time, the micro-batch the run ended with and its best checkpoint, into `metrics`."""
    # A resumed trainer only timed the steps after its checkpoint: the mean is over those.
    timed_steps = metrics["global_step"] - checkpoint_step(resume_from)
    if timed_steps > 0 and metrics["train_runtime"] > 0:
        # seconds per optimizer step from trl's clock; a stored run replaces this and tokens_per_second with the
        # figures of jobs.train.figures (the store-less callers, benches and tests, keep these).
        metrics["step_time_mean"] = metrics["train_runtime"] / timed_steps
    if final_batch is not None:  # the micro-batch accelerate ended with after halving on OOM
        metrics["per_device_train_batch_size_final"] = float(final_batch)
        resolved["per_device_train_batch_size_final"] = final_batch
    if best is not None:
        metrics["best_step"] = float(best.step)
        metrics["best_metric"] = best.value
