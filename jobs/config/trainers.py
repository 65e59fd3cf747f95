"""Pure mapping of the trainer-specific part of a `JobSpec` to trl config keyword arguments.

`jobs.config.mapping.training_kwargs` builds what every trl config shares (batch, precision, optimizer,
schedule); this module adds what one trainer family reads and removes what its config lacks, as the
trainer's record says (`jobs.spec.trainer_records`: its `kwargs`, `unsupported`, `default_loss`).
Spec in, kwargs out, no I/O, in the same style as `jobs.config.mapping`.

    name = config_class_name(spec)               # "SFTConfig", "DPOConfig", "KTOConfig", "GRPOConfig"
    kw = {**common, **trainer_kwargs(spec)}; drop_unsupported(spec, kw)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jobs.spec.enums import LossType
from jobs.spec.job import JobSpec
from jobs.spec.trainer_records import record_for


def config_class_name(spec: JobSpec) -> str:
    """The trl config class the spec's trainer takes."""
    return record_for(spec.trainer).config_class


def trl_module(spec: JobSpec) -> str:
    """The module holding the spec's trainer and config class (`trl`, or a `trl.experimental` one)."""
    return record_for(spec.trainer).module


def loss_type_name(spec: JobSpec) -> str:
    """trl's loss_type: the spec's choice, or trl's own default for the trainer when auto."""
    if spec.loss_type is LossType.AUTO:
        return record_for(spec.trainer).default_loss
    return spec.loss_type.value


def grpo_eval_batch(spec: JobSpec) -> int:
    """trl evaluates whole groups too: the eval batch is the micro-batch rounded up to a multiple of
    num_generations (inference only: no gradients or optimizer state)."""
    return -(-spec.per_device_train_batch_size // spec.num_generations) * spec.num_generations


# The value of each keyword a trainer's record lists in `kwargs` (what each means: the records' comments).
KWARG_VALUES: dict[str, Callable[[JobSpec], Any]] = {
    "packing": lambda spec: spec.packing,
    "completion_only_loss": lambda spec: spec.completion_only_loss,
    "assistant_only_loss": lambda spec: spec.assistant_only_loss,
    "loss_type": loss_type_name,
    "beta": lambda spec: spec.beta,
    "desirable_weight": lambda spec: spec.desirable_weight,
    "undesirable_weight": lambda spec: spec.undesirable_weight,
    "num_generations": lambda spec: spec.num_generations,
    "max_completion_length": lambda spec: spec.max_completion_length,
    "temperature": lambda spec: spec.temperature,
    "reward_weights": lambda spec: reward_weights(spec),
    "log_completions": lambda spec: True,  # trl prints a table of prompts, completions and rewards at each log
    "importance_sampling_level": lambda spec: spec.importance_sampling_level.value,
    "scale_rewards": lambda spec: spec.scale_rewards.value,
    "epsilon_high": lambda spec: spec.epsilon_high,
    "mask_truncated_completions": lambda spec: spec.mask_truncated_completions,
    "top_entropy_quantile": lambda spec: spec.top_entropy_quantile,
    "per_device_eval_batch_size": grpo_eval_batch,
    "use_vllm": lambda spec: spec.use_vllm,
    "vllm_mode": lambda spec: "colocate",  # always: vLLM inside the training process (jobs.config.vllm)
    "vllm_gpu_memory_utilization": lambda spec: spec.vllm_gpu_memory_utilization,
    "vllm_max_model_length": lambda spec: vllm_max_model_length(spec),
}


def vllm_max_model_length(spec: JobSpec) -> int | None:
    """vLLM's context with use_vllm (None without): the prompt bound (max_length, as the predictor takes it) plus
    every completion token. Without it vLLM takes the model's whole context and may find no room in its share for
    one sequence's KV cache."""
    return spec.max_length + spec.max_completion_length if spec.use_vllm else None


def trainer_kwargs(spec: JobSpec) -> dict[str, Any]:
    """The keyword arguments only the spec's trainer reads (its record's `kwargs`)."""
    return {key: KWARG_VALUES[key](spec) for key in record_for(spec.trainer).kwargs}


def reward_weights(spec: JobSpec) -> list[float]:
    """One weight per reward source, in the order jobs.train.trainers passes them: the declared rewards as
    listed, then the reward model, then the custom function."""
    weights = [r.weight for r in spec.declared_rewards]
    if spec.reward_model_run is not None:
        weights.append(spec.reward_model_weight)
    if spec.reward_function is not None:
        weights.append(spec.reward_function_weight)
    return weights


def task_type(spec: JobSpec) -> str:
    """peft's task_type for the spec's trainer: SEQ_CLS for a reward model, else CAUSAL_LM."""
    return record_for(spec.trainer).task_type


def drop_unsupported(spec: JobSpec, kw: dict[str, Any]) -> dict[str, Any]:
    """`kw` without the common keys the spec's trainer config does not accept."""
    for key in record_for(spec.trainer).unsupported:
        kw.pop(key, None)
    return kw
