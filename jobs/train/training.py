"""The training itself, without any store: spec in, trained model and its figures out.

    result = train_spec(spec, "out/")      # loads model and data, builds the trl trainer, trains, evaluates
    result.metrics["train_loss"], result.resolved["trainer_config"]

In two steps, which a stored run's recipe (`jobs.train.recipe`) takes apart:

    prepared = prepare(spec, "out/", callbacks, device=device, store=store)   # everything before training
    result = fit(prepared, resume_from=None)                                   # trains, evaluates, measures

`prepare` checks the spec against the device (`jobs.config.mapping.capability_problems`), loads the model
(quantized when the method asks) and the data, maps the spec to trl/peft/bitsandbytes configs with the pure
`jobs.config.mapping`, loads a grpo spec's reward model, adds early stopping's callbacks to the caller's and
builds the trainer (`jobs.train.trainers`) with every trainer `jobs.spec.trainer_records` knows, and the
adapter. `fit` trains, evaluates and measures peak memory, tokens and step time (`jobs.train.results`).
`train_spec` is both in one call, for tests and benches.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
from jobs.train.best import best_checkpoint
from jobs.train.callbacks import STOP_REQUESTED
from jobs.train.failure import NonFiniteLoss
from jobs.train.judges import reward_judges
from jobs.train.readback import trainer_readback
from jobs.train.results import (
    TrainResult,
    add_memory_metrics,
    add_trainer_figures,
    count_params,
    record_final_batch,
    training_metrics,
)
from jobs.train.task_watch import close_watches, task_watch_callback
from jobs.train.trainers import build_trainer
from storage.roles import RunArtifacts

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """Everything set up for training: the trainer built over the model, the data, the configs, the adapter."""

    spec: JobSpec
    device: Device
    trainer: Any
    tokenizer: Any
    callbacks: list[Any]  # the caller's, with early stopping's around them: the trainer's, in its order
    resolved: dict[str, Any]  # the resolved config as the trainer holds it (`jobs.config.mapping.resolved_config`)
    has_eval: bool
    trainable: int
    total: int


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


def prepare(
    spec: JobSpec,
    output_dir: Path | str,
    callbacks: Sequence[Any] = (),
    *,
    device: Device | None = None,
    model_and_tokenizer: tuple[Any, Any] | None = None,
    before_training: Callable[[Any, Any, Any], None] | None = None,
    store: RunArtifacts | None = None,
) -> Prepared:
    """Load, map and build everything training `spec` needs, no store involved (see `train_spec`)."""
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
    reward_model = reward_model_of(spec, device, store)
    callbacks = _with_early_stopping(spec, callbacks, has_eval=has_eval)
    judges = reward_judges(store, lambda: next(model.parameters()).device, compute_dtype(spec, device))
    trainer = build_trainer(spec, model, tokenizer, args, train_ds, eval_ds, peft_cfg, callbacks, reward_model, judges)
    _refuse_empty_reward_data(spec, trainer)
    # Record what the trainer resolved (trl turns padding-free on with packing, for one), not what it was asked.
    resolved["trainer_config"], resolved["library_changes"] = trainer_readback(trainer, resolved["trainer_config"])
    if peft_cfg is not None:
        from jobs.train.adapter_setup import prepare_adapter

        prepare_adapter(spec, trainer, output_dir)
    trainable, total = count_params(trainer.model)
    resolved["trainable_params"], resolved["total_params"] = trainable, total
    log.info("trainable parameters: %d of %d (%.3f%%)", trainable, total, 100 * trainable / max(total, 1))
    return Prepared(spec, device, trainer, tokenizer, callbacks, resolved, has_eval, trainable, total)


def fit(prepared: Prepared, resume_from: str | None = None) -> TrainResult:
    """Train the prepared trainer (from `resume_from`, a checkpoint folder, when given), evaluate, measure.

    Raises NonFiniteLoss when a callback saw a NaN/inf training loss; a stop (signal, cancel, early stopping's
    watched task) returns with `stopped` set and no final evaluation."""
    spec, trainer, callbacks, resolved = prepared.spec, prepared.trainer, prepared.callbacks, prepared.resolved
    output = trainer.train(resume_from_checkpoint=resume_from)
    final_batch = record_final_batch(spec, trainer, resolved)
    nonfinite = [cb.nonfinite_step for cb in callbacks if getattr(cb, "nonfinite_step", None) is not None]
    if nonfinite:
        raise NonFiniteLoss(nonfinite[0])
    stopped = STOP_REQUESTED.is_set() or any(getattr(cb, "stop_reason", None) for cb in callbacks)
    best = best_checkpoint(trainer)
    evaluate = prepared.has_eval and not stopped
    metrics = training_metrics(spec, trainer, output, prepared.trainable, prepared.total, evaluate=evaluate)
    close_watches(callbacks)  # a watched task's folder, kept through the final evaluation
    add_memory_metrics(prepared.device, callbacks, metrics, resolved)
    add_trainer_figures(metrics, resolved, resume_from, final_batch, best)
    history = list(trainer.state.log_history)
    return TrainResult(trainer.model, prepared.tokenizer, trainer, metrics, resolved, stopped, history, best)


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
    """Train `spec` with trl, no store involved: `prepare`, then `fit`; `on_ready` gets the resolved config
    before training.

    `resume_from`: a checkpoint folder to continue from (optimizer, scheduler, RNG, step count).
    `before_training(model, tokenizer, eval_ds)`: called with the base model once the data is loaded,
    before any adapter or trainer touches it (the "before" samples).
    `store`: where a grpo spec's `reward_model_run` is looked up (a run's artifacts); the caller passes it
    (a stored run's recipe its own store): this function never opens one."""
    prepared = prepare(
        spec,
        output_dir,
        callbacks,
        device=device,
        model_and_tokenizer=model_and_tokenizer,
        before_training=before_training,
        store=store,
    )
    if on_ready is not None:
        on_ready(prepared.resolved)
    return fit(prepared, resume_from)


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


def compute_dtype(spec: JobSpec, device: Device) -> Any:
    """The torch dtype of the run's compute precision: what a model that only scores (a reward model, a judge)
    is loaded in."""
    import torch

    return {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}.get(
        resolve_precision(spec, device), torch.float32
    )


def reward_model_of(spec: JobSpec, device: Device, store: RunArtifacts | None) -> Any:
    """A grpo spec's `reward_model_run`, loaded frozen from `store` (None without one)."""
    if not record_for(spec.trainer).generates or spec.reward_model_run is None:
        return None
    from jobs.train.reward_model import load_reward_model

    if store is None:
        raise ValueError(
            f"reward_model_run {spec.reward_model_run}: train_spec was given no store to find that run in; "
            "pass store= (the run's store), or queue the job (its training child passes its own)"
        )

    # The reward model only scores (frozen): it takes the run's compute precision.
    reward_model = load_reward_model(store, spec.reward_model_run, compute_dtype(spec, device))
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
