"""Building the trl trainer a spec asks for, and the trainer-specific metrics it logs.

`jobs.train.training.prepare` calls `build_trainer(...)` with the model, the configs from `jobs.config.mapping` and the
data from `jobs.data.loading`; which trl class, and what it takes besides the common arguments, is the
trainer's record (`jobs.spec.trainer_records`); the callbacks and reward sources it names live here.

    trainer = build_trainer(spec, model, tokenizer, args, train_ds, eval_ds, peft_cfg, callbacks)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from jobs.spec.job import JobSpec
from jobs.spec.trainer_records import record_for

if TYPE_CHECKING:
    from jobs.config.rewards import JudgeFor


def perplexity(loss: float) -> float:
    """exp(mean token cross-entropy): the eval perplexity of a causal LM (inf when it overflows)."""
    return math.exp(loss) if loss < 700 else math.inf


class PerplexityCallback(TrainerCallback):
    """Adds `eval_perplexity` next to every logged `eval_loss` (SFT), before the store sees the logs."""

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        if logs is not None and isinstance(logs.get("eval_loss"), (int, float)):
            logs["eval_perplexity"] = perplexity(float(logs["eval_loss"]))


class GRPOLogCallback(TrainerCallback):
    """trl's GRPO logs its own `step_time` (the training step only, generation excluded); renamed to
    `grpo_step_time`, so the store's `step_time` (jobs.train.figures: the whole optimizer step) keeps one meaning."""

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        if logs is not None and "step_time" in logs:
            logs["grpo_step_time"] = logs.pop("step_time")


def reward_sources(
    spec: JobSpec, reward_model: tuple[Any, Any] | None = None, judges: JudgeFor | None = None
) -> tuple[list[Any], list[Any]]:
    """GRPO's (reward functions, their processing classes) in `jobs.config.trainers.reward_weights`' order:
    the declared rewards as listed, the reward run's model (with its own tokenizer), the custom function.
    `judges`: the judge rewards' judges (`jobs.train.judges.reward_judges`)."""
    from jobs.config.rewards import reward_functions
    from jobs.spec.custom_reward import load_function

    funcs: list[Any] = list(reward_functions(spec.declared_rewards, spec.max_completion_length, judges))
    classes: list[Any] = [None] * len(funcs)
    if spec.reward_model_run is not None:
        if reward_model is None:
            raise ValueError("reward_model_run is set but no reward model was loaded")
        funcs.append(reward_model[0])
        classes.append(reward_model[1])
    if spec.reward_function is not None:
        funcs.append(load_function(spec.reward_function))
        classes.append(None)
    return funcs, classes


# The callbacks a trainer's record names (`callbacks`), put before the run's own.
CALLBACKS = {"perplexity": PerplexityCallback, "grpo_log": GRPOLogCallback}


def build_trainer(
    spec: JobSpec,
    model: Any,
    tokenizer: Any,
    args: Any,
    train_ds: Any,
    eval_ds: Any,
    peft_cfg: Any,
    callbacks: Sequence[Any],
    reward_model: tuple[Any, Any] | None = None,
    judges: JudgeFor | None = None,
) -> Any:
    """The trl trainer the spec's record names, with LoRA+'s optimizer when the spec asks for it
    (`jobs.train.loraplus`). DPO and KTO take the base with the adapter off as their reference
    (ref_model=None; without an adapter trl copies the model); a reward model trains a sequence-classification
    model (`jobs.models.loading.load_model_and_tokenizer(reward_head=True)`); GRPO scores with the spec's
    rewards (`reward_model`: a reward run's (model, tokenizer), `jobs.train.reward_model`)."""
    from jobs.train.loraplus import attach_loraplus

    record = record_for(spec.trainer)
    kw: dict[str, Any] = dict(
        model=model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        processing_class=tokenizer,
        peft_config=peft_cfg,
        callbacks=[*(CALLBACKS[name]() for name in record.callbacks), *callbacks],
    )
    if record.ref_model_none:
        kw["ref_model"] = None
    if record.generates:
        from jobs.train.completions import CompletionsKeeper

        kw["reward_funcs"], kw["reward_processing_classes"] = reward_sources(spec, reward_model, judges)
        kw["callbacks"].append(CompletionsKeeper(spec.completions_every))  # trl's completion files, kept bounded
    # ORPO and CPO are experimental in trl: pinned, tested in tests/test_orpo_cpo.py
    trainer = record.trainer_type()(**kw)
    attach_loraplus(trainer, spec)
    return trainer
