"""Pure mapping of the trainer-specific part of a `JobSpec` to trl config keyword arguments.

`jobs.config.mapping.training_kwargs` builds what every trl config shares (batch, precision, optimizer,
schedule); this module adds what one trainer family reads and removes what its config lacks.
Spec in, kwargs out, no I/O, in the same style as `jobs.config.mapping`.

    name = config_class_name(spec)               # "SFTConfig", "DPOConfig", "KTOConfig", "GRPOConfig"
    kw = {**common, **trainer_kwargs(spec)}; drop_unsupported(spec, kw)
"""

from __future__ import annotations

from typing import Any

from jobs.spec.enums import LossType, Trainer
from jobs.spec.job import JobSpec

CONFIG_CLASSES = {
    Trainer.SFT: "SFTConfig",
    Trainer.DPO: "DPOConfig",
    Trainer.KTO: "KTOConfig",
    Trainer.REWARD: "RewardConfig",
    Trainer.ORPO: "ORPOConfig",
    Trainer.CPO: "CPOConfig",
    Trainer.GRPO: "GRPOConfig",
}
# Where each config (and its trainer) lives; trl.experimental may change in any release, so trl is pinned.
MODULES = {Trainer.ORPO: "trl.experimental.orpo", Trainer.CPO: "trl.experimental.cpo"}
DEFAULT_LOSSES = {Trainer.SFT: "nll", Trainer.DPO: "sigmoid", Trainer.KTO: "kto", Trainer.CPO: "sigmoid"}
# Common TrainingArguments-level keys a trainer's config does not have (it would raise TypeError).
UNSUPPORTED: dict[Trainer, tuple[str, ...]] = {
    t: ("padding_free",) for t in (Trainer.KTO, Trainer.REWARD, Trainer.ORPO, Trainer.CPO)
}
# GRPOConfig has no max_length either: prompts are kept whole, completions end at max_completion_length.
UNSUPPORTED[Trainer.GRPO] = ("padding_free", "max_length")
# The peft task type, which decides the model head peft wraps (and trains: a reward model's score head).
TASK_TYPES = {Trainer.REWARD: "SEQ_CLS"}


def config_class_name(spec: JobSpec) -> str:
    """The trl config class the spec's trainer takes."""
    return CONFIG_CLASSES[spec.trainer]


def trl_module(spec: JobSpec) -> str:
    """The module holding the spec's trainer and config class (`trl`, or a `trl.experimental` one)."""
    return MODULES.get(spec.trainer, "trl")


def loss_type_name(spec: JobSpec) -> str:
    """trl's loss_type: the spec's choice, or trl's own default for the trainer when auto."""
    if spec.loss_type is LossType.AUTO:
        return DEFAULT_LOSSES.get(spec.trainer, "auto")
    return spec.loss_type.value


def trainer_kwargs(spec: JobSpec) -> dict[str, Any]:
    """The keyword arguments only the spec's trainer reads."""
    if spec.trainer is Trainer.SFT:
        # Packing concatenates short rows into max_length blocks: no compute or memory is spent
        # on padding, often ~2x tokens/s on short-row data; attention may span row boundaries.
        # Loss masks cost nothing in memory or time; they change what the model learns from.
        return {
            "packing": spec.packing,
            "completion_only_loss": spec.completion_only_loss,
            "assistant_only_loss": spec.assistant_only_loss,
            "loss_type": loss_type_name(spec),
        }
    if spec.trainer is Trainer.DPO:
        return {"beta": spec.beta, "loss_type": loss_type_name(spec)}
    if spec.trainer is Trainer.KTO:
        # KTO scores each completion on its own (desirable or not) against a KL baseline taken from
        # the other completions of the micro-batch: the reference pass doubles the forward cost,
        # like DPO, but no pairs are needed.
        return {
            "beta": spec.beta,
            "loss_type": loss_type_name(spec),
            "desirable_weight": spec.desirable_weight,
            "undesirable_weight": spec.undesirable_weight,
        }
    if spec.trainer is Trainer.ORPO:
        # ORPO adds an odds-ratio penalty (weight beta) to the SFT loss on the chosen answer: one model,
        # no reference pass, so it costs about what SFT on chosen+rejected costs.
        return {"beta": spec.beta}
    if spec.trainer is Trainer.CPO:
        # CPO: a DPO-style loss without the reference model plus a behaviour-cloning term on the chosen answer.
        return {"beta": spec.beta, "loss_type": loss_type_name(spec)}
    if spec.trainer is Trainer.GRPO:
        # GRPO samples num_generations completions per prompt and scores them; each completion's advantage is
        # its reward minus the group's mean. Generation runs before every optimizer step (no KV cache kept for
        # training); beta > 0 adds a reference pass (the base with the adapter off, or a second full model).
        return {
            "num_generations": spec.num_generations,
            "max_completion_length": spec.max_completion_length,
            "beta": spec.beta,
            "temperature": spec.temperature,
            "reward_weights": reward_weights(spec),
            "log_completions": False,
            # trl evaluates whole groups too: the eval batch is the micro-batch rounded up to a multiple of
            # num_generations (inference only: no gradients or optimizer state).
            "per_device_eval_batch_size": -(-spec.per_device_train_batch_size // spec.num_generations)
            * spec.num_generations,
        }
    if spec.trainer is Trainer.REWARD:
        # A reward model is the base with a one-output classification head ("score"), trained so that
        # chosen answers score above rejected ones; one forward per answer, no reference model.
        return {}
    raise ValueError(f"no trainer mapping for {spec.trainer!r}")  # pragma: no cover - enum is closed


def reward_weights(spec: JobSpec) -> list[float]:
    """One weight per reward source, in the order jobs.train.trainers passes them: built-ins as listed, then the
    reward model, then the custom function."""
    from jobs.spec.rewards import parse_rewards

    weights = list(parse_rewards(spec.rewards)[0].values()) if spec.rewards else []
    if spec.reward_model_run is not None:
        weights.append(spec.reward_model_weight)
    if spec.reward_function is not None:
        weights.append(spec.reward_function_weight)
    return weights


def task_type(spec: JobSpec) -> str:
    """peft's task_type for the spec's trainer: SEQ_CLS for a reward model, else CAUSAL_LM."""
    return TASK_TYPES.get(spec.trainer, "CAUSAL_LM")


def drop_unsupported(spec: JobSpec, kw: dict[str, Any]) -> dict[str, Any]:
    """`kw` without the common keys the spec's trainer config does not accept."""
    for key in UNSUPPORTED.get(spec.trainer, ()):
        kw.pop(key, None)
    return kw
