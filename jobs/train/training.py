"""The training itself, without any store: spec in, trained model and its figures out.

    result = train_spec(spec, "out/")      # loads model and data, builds the trl trainer, trains, evaluates
    result.metrics["train_loss"], result.resolved["trainer_config"]

It checks the spec against the device (`jobs.config.mapping.capability_problems`), loads the model
(quantized when the method asks) and the data, maps the spec to trl/peft/bitsandbytes configs with
the pure `jobs.config.mapping`, builds the trainer (`jobs.train.trainers`), trains, evaluates and
measures peak memory, tokens and step time. `jobs.train.child` calls it for a stored run; tests
and benches call it directly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.config.evaluation import early_stopping_callback
from jobs.config.mapping import (
    QUANTIZED_METHODS,
    capability_problems,
    capability_warnings,
    peft_config,
    quantization_config,
    resolve_precision,
    resolved_config,
    torch_dtype_name,
    training_config,
)
from jobs.config.peft import frozen_vision
from jobs.devices.facts import Device
from jobs.devices.probe import detect_device
from jobs.errors import Problem
from jobs.models.expert_keys import fill_expert_keys
from jobs.models.vision import apply_budget, freeze_matching, is_vision_config
from jobs.spec.enums import Precision
from jobs.spec.job import JobSpec, SpecError
from jobs.spec.trainer_records import record_for
from jobs.spec.tricks import checkpointing
from jobs.train.best import BestCheckpoint, best_checkpoint
from jobs.train.callbacks import STOP_REQUESTED
from jobs.train.failure import NonFiniteLoss
from jobs.train.phase_probe import MemoryMeter, PhaseProbe
from jobs.train.readback import final_micro_batch, trainer_readback
from jobs.train.task_watch import close_watches, task_watch_callback
from jobs.train.trainers import build_trainer, perplexity
from storage.roles import RunArtifacts

log = logging.getLogger(__name__)


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


def load_model(spec: JobSpec, device: Device) -> tuple[Any, Any]:
    """Resolve and load the spec's model (quantized when the method asks) and its tokenizer."""
    import torch

    from jobs.models.loading import load_model_and_tokenizer
    from jobs.models.references import resolve_model

    precision = resolve_precision(spec, device)
    resolved = resolve_model(spec.model, trust_remote_code=spec.trust_remote_code)
    model, tokenizer = load_model_and_tokenizer(
        resolved,
        torch_dtype=getattr(torch, torch_dtype_name(spec, precision)),
        quantization_config=quantization_config(spec, precision),
        trust_remote_code=spec.trust_remote_code,
        reward_head=record_for(spec.trainer).score_head,
    )
    apply_budget(tokenizer, spec.image_min_pixels, spec.image_max_pixels)  # a vision-language model's processor
    return model, tokenizer


def _checkpoint_step(resume_from: str | None) -> int:
    """The step of a `checkpoint-N` folder (0 without one)."""
    name = Path(resume_from).name if resume_from else ""
    return int(name.split("-")[-1]) if name.startswith("checkpoint-") and name.split("-")[-1].isdigit() else 0


def train_spec(
    spec: JobSpec,
    output_dir: Path | str,
    callbacks: Sequence[Any] = (),
    *,
    device: Device | None = None,
    on_ready: Callable[[dict[str, Any]], None] | None = None,
    model_and_tokenizer: tuple[Any, Any] | None = None,
    resume_from: str | None = None,
    before_training: Callable[[Any, Any, Any], None] | None = None,
    store: RunArtifacts | None = None,
) -> TrainResult:
    """Train `spec` with trl, no store involved; `on_ready` gets the resolved config before training.

    `resume_from`: a checkpoint folder to continue from (optimizer, scheduler, RNG, step count).
    `before_training(model, tokenizer, eval_ds)`: called with the base model once the data is loaded,
    before any adapter or trainer touches it (the "before" samples).
    `store`: where a grpo spec's `reward_model_run` is looked up (a run's artifacts); the caller passes it
    (`jobs.train.child` its own store): this function never opens one."""
    from jobs.data.loading import load_data

    device = device or detect_device()
    _check_capabilities(spec, device)
    model, tokenizer = model_and_tokenizer or load_model(spec, device)
    loaded = load_data(spec)
    train_ds, eval_ds = loaded.train, loaded.eval
    for info in filter(None, (loaded.train_info, loaded.eval_info)):
        if info.conversion:
            log.info("data %s: %s", info.ref, info.conversion)
    log.info("data: %d training rows, %s eval rows", len(train_ds), len(eval_ds) if eval_ds is not None else "no")
    if before_training is not None:
        before_training(model, tokenizer, eval_ds)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    moe = moe_layout_of(model)
    vision = prepare_vision(spec, model)
    has_eval = eval_ds is not None
    args = training_config(spec, device, str(output_dir), has_eval=has_eval)
    if loaded.train_info.images.count and "messages" in train_ds.column_names:
        args.completion_only_loss = False  # no effect on messages rows, but trl's vision collator refuses it
    where = str(output_dir)
    resolved = resolved_config(spec, device, where, has_eval=has_eval, model_type=model_type, moe=moe, vision=vision)
    resolved["data"] = loaded.record()  # which formats were detected and how they were converted
    peft_cfg = peft_config(spec, model_type, moe, vision=vision)
    if spec.method in QUANTIZED_METHODS:
        # Casts norms/embeddings to fp32 and freezes the quantized base; trl does not do it itself.
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, **checkpointing.kbit_kwargs(spec))
    reward_model = _reward_model(spec, device, store)
    callbacks = _with_early_stopping(spec, callbacks, has_eval=has_eval)
    trainer = build_trainer(spec, model, tokenizer, args, train_ds, eval_ds, peft_cfg, callbacks, reward_model)
    _refuse_empty_reward_data(spec, trainer)
    # Record what the trainer resolved (trl turns padding-free on with packing, for one), not what it was asked.
    resolved["trainer_config"], resolved["library_changes"] = trainer_readback(trainer, resolved["trainer_config"])
    if peft_cfg is not None:
        from jobs.train.adapter_setup import prepare_adapter

        prepare_adapter(spec, trainer, output_dir)
    trainable, total = count_params(trainer.model)
    resolved["trainable_params"], resolved["total_params"] = trainable, total
    log.info("trainable parameters: %d of %d (%.3f%%)", trainable, total, 100 * trainable / max(total, 1))
    if on_ready is not None:
        on_ready(resolved)
    output = trainer.train(resume_from_checkpoint=resume_from)
    final_batch = _record_final_batch(spec, trainer, resolved)
    nonfinite = [cb.nonfinite_step for cb in callbacks if getattr(cb, "nonfinite_step", None) is not None]
    if nonfinite:
        raise NonFiniteLoss(nonfinite[0])
    stopped = STOP_REQUESTED.is_set() or any(getattr(cb, "stop_reason", None) for cb in callbacks)
    best = best_checkpoint(trainer)
    metrics = _training_metrics(spec, trainer, output, trainable, total, evaluate=eval_ds is not None and not stopped)
    close_watches(callbacks)  # a watched task's folder, kept through the final evaluation
    _add_memory_metrics(device, callbacks, metrics, resolved)
    _add_run_figures(metrics, resolved, resume_from, final_batch, best)
    history = list(trainer.state.log_history)
    return TrainResult(trainer.model, tokenizer, trainer, metrics, resolved, stopped, history, best)


def _with_early_stopping(spec: JobSpec, callbacks: Sequence[Any], *, has_eval: bool) -> list[Any]:
    """The callbacks with early stopping's: a watched task's scorer first (its score is in the evaluation's metrics
    before the store and the trainer read them), transformers' EarlyStoppingCallback last."""
    stopper = early_stopping_callback(spec, has_eval=has_eval)
    watch = task_watch_callback(spec) if stopper is not None else None
    return [*([watch] if watch else []), *callbacks, *([stopper] if stopper else [])]


def _check_capabilities(spec: JobSpec, device: Device) -> None:
    """Refuse what `device` cannot run (SpecError, every problem at once); log its warnings."""
    problems = capability_problems(spec, device)
    if problems:
        raise SpecError(problems)
    for warning in capability_warnings(spec, device):
        log.warning("%s", warning)


def _reward_model(spec: JobSpec, device: Device, store: RunArtifacts | None) -> Any:
    """A grpo spec's `reward_model_run`, loaded frozen from `store` (None without one)."""
    if not record_for(spec.trainer).generates or spec.reward_model_run is None:
        return None
    import torch

    from jobs.train.reward_model import load_reward_model

    if store is None:
        raise ValueError(
            f"reward_model_run {spec.reward_model_run}: train_spec was given no store to find that run in; "
            "pass store= (the run's store), or queue the job (its training child passes its own)"
        )

    # The reward model only scores (frozen): it takes the run's compute precision.
    dtype = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}.get(
        resolve_precision(spec, device), torch.float32
    )
    reward_model = load_reward_model(store, spec.reward_model_run, dtype)
    log.info("reward model: run %s", spec.reward_model_run)
    return reward_model


def _refuse_empty_reward_data(spec: JobSpec, trainer: Any) -> None:
    if record_for(spec.trainer).drops_long_rows and len(trainer.train_dataset) == 0:
        # trl's RewardTrainer drops rows over max_length; with none left it fails with "num_samples=0".
        raise SpecError(
            [
                Problem(
                    "max_length",
                    f"every training row is longer than {spec.max_length} tokens, and the "
                    "reward trainer drops such rows",
                    "raise max_length (the data preview counts long rows)",
                )
            ]
        )


def _record_final_batch(spec: JobSpec, trainer: Any, resolved: dict[str, Any]) -> int | None:
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


def _training_metrics(
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


def _add_memory_metrics(
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


def _add_run_figures(
    metrics: dict[str, float],
    resolved: dict[str, Any],
    resume_from: str | None,
    final_batch: int | None,
    best: BestCheckpoint | None,
) -> None:
    """The mean step time, the micro-batch the run ended with and its best checkpoint, into `metrics`."""
    # A resumed trainer only timed the steps after its checkpoint: the mean is over those.
    timed_steps = metrics["global_step"] - _checkpoint_step(resume_from)
    if timed_steps > 0 and metrics["train_runtime"] > 0:
        # seconds per optimizer step from trl's clock; `run` replaces this and tokens_per_second with the
        # figures of jobs.train.figures (the store-less callers, benches and tests, keep these).
        metrics["step_time_mean"] = metrics["train_runtime"] / timed_steps
    if final_batch is not None:  # the micro-batch accelerate ended with after halving on OOM
        metrics["per_device_train_batch_size_final"] = float(final_batch)
        resolved["per_device_train_batch_size_final"] = final_batch
    if best is not None:
        metrics["best_step"] = float(best.step)
        metrics["best_metric"] = best.value


def prepare_vision(spec: JobSpec, model: Any) -> bool:
    """Whether `model` is a vision-language model; if so, the parts `vision_train` keeps out of training are
    frozen (in a full fine-tune too; LoRA leaves them out through peft_config's exclude_modules)."""
    if not is_vision_config(getattr(model, "config", None)):
        return False
    frozen_parts = frozen_vision(spec)
    if frozen_parts is not None:
        frozen = freeze_matching(model, frozen_parts)
        log.info("vision-language model (vision_train %s): %d parameters frozen", spec.vision_train.value, frozen)
    return True


def moe_layout_of(model: Any) -> Any:
    """Where the loaded model keeps its experts (`jobs.models.moe_layout`), or None for a dense model; the expert
    keys trl's load-balancing loss reads are set on its config from it where the family has none
    (`jobs.models.expert_keys`: GraniteMoE-hybrid's config has no `num_experts`)."""
    from jobs.models.moe_layout import moe_layout

    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "get_output_embeddings"):
        return None
    layout = moe_layout(model, config.get_text_config() if hasattr(config, "get_text_config") else config)
    fill_expert_keys(model, layout)
    return layout
