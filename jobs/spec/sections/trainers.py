"""The spec's trainer options: preference strength (DPO/KTO/ORPO/CPO), GRPO's rewards and sampling, the loss.

Each field says under which trainers it applies (`when=`); `jobs.spec.job.spec_problems` reports the ones set
under another trainer, and `jobs.spec.rewards` parses the reward texts.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.spec.enums import GRPO_ONLY, KTO_ONLY, PREFERENCE_ONLY, SFT_ONLY, LossType, Trainer
from jobs.spec.field import Group, spec_field


@dataclass(frozen=True)
class TrainerFields:
    """What only some trainers read: beta, KTO's weights, GRPO's rewards and generations, the loss."""

    beta: float = spec_field(
        0.1,
        Group.METHOD,
        "DPO/KTO/CPO temperature: how far the policy may move from the reference; ORPO: weight of the odds-ratio term; GRPO: weight of the KL penalty towards the base model (0: none, and no reference pass).",
        ge=0.0,
        le=10.0,
        label="Preference beta",
        when={"trainer": PREFERENCE_ONLY["trainer"] | {Trainer.GRPO}},
    )
    desirable_weight: float = spec_field(
        1.0,
        Group.METHOD,
        "kto only: weight of the desirable (label true) rows' loss; raise it when they are the minority.",
        gt=0.0,
        le=100.0,
        label="Desirable weight",
        when=KTO_ONLY,
        advanced=True,
    )
    undesirable_weight: float = spec_field(
        1.0,
        Group.METHOD,
        "kto only: weight of the undesirable (label false) rows' loss.",
        gt=0.0,
        le=100.0,
        label="Undesirable weight",
        when=KTO_ONLY,
        advanced=True,
    )
    rewards: str | None = spec_field(
        None,
        Group.METHOD,
        "grpo: built-in rewards from trl.rewards, comma-separated, each with an optional weight (name=weight): "
        "think_format (1 when the answer opens with <think>...</think>), repetition (penalty up to -1 for "
        "repeated 3-grams), overlong (penalty as completions near max_completion_length).",
        label="Built-in rewards",
        when=GRPO_ONLY,
    )
    reward_model_run: int | None = spec_field(
        None,
        Group.METHOD,
        "grpo: the id of a finished run with trainer: reward; its reward model scores every completion.",
        ge=1,
        label="Reward model (reward run id)",
        when=GRPO_ONLY,
    )
    reward_model_weight: float = spec_field(
        1.0,
        Group.METHOD,
        "grpo: weight of the reward model's score in the total reward.",
        ge=-100.0,
        le=100.0,
        label="Reward model weight",
        when=GRPO_ONLY,
        advanced=True,
    )
    reward_function: str | None = spec_field(
        None,
        Group.METHOD,
        "grpo: your own reward, module:function or path/to/file.py:function, called as trl calls "
        "reward functions (prompts, completions, completion_ids, your data's other columns; one float per completion). Runs Python: accepted "
        "only from a spec file on the command line, never from the dashboard or its API.",
        label="Custom reward function",
        when=GRPO_ONLY,
        advanced=True,
    )
    reward_function_weight: float = spec_field(
        1.0,
        Group.METHOD,
        "grpo: weight of the custom reward function in the total reward.",
        ge=-100.0,
        le=100.0,
        label="Custom reward weight",
        when=GRPO_ONLY,
        advanced=True,
    )
    num_generations: int = spec_field(
        4,
        Group.METHOD,
        "grpo: completions sampled per prompt; their rewards are compared within the group. The "
        "effective batch (micro-batch x accumulation) must be a multiple of it.",
        ge=2,
        le=64,
        label="Completions per prompt",
        when=GRPO_ONLY,
    )
    max_completion_length: int = spec_field(
        64,
        Group.METHOD,
        "grpo: most tokens generated per completion.",
        ge=1,
        le=8192,
        label="Max completion tokens",
        when=GRPO_ONLY,
    )
    temperature: float = spec_field(
        1.0,
        Group.METHOD,
        "grpo: sampling temperature of the completions; lower is less varied, "
        "and too little variety leaves nothing to compare.",
        gt=0.0,
        le=2.0,
        label="Sampling temperature",
        when=GRPO_ONLY,
        advanced=True,
    )
    loss_type: LossType = spec_field(
        LossType.AUTO,
        Group.METHOD,
        "auto: trl's default (nll for sft, sigmoid for dpo and cpo, kto for kto). sft: nll or dft. dpo, cpo: sigmoid (DPO), hinge (SLiC) or ipo. kto: kto or apo_zero_unpaired.",
        label="Loss",
        advanced=True,
    )
    completion_only_loss: bool = spec_field(
        True,
        Group.METHOD,
        "SFT on prompt/completion rows: loss on the completion only. No effect on text or messages rows.",
        label="Loss on completions only",
        when=SFT_ONLY,
        advanced=True,
    )
    assistant_only_loss: bool = spec_field(
        False,
        Group.METHOD,
        "SFT on chat messages rows: loss on the assistant turns only. Needs `{% generation %}` markers in the chat template (the built-in models have them).",
        label="Loss on assistant turns only",
        when=SFT_ONLY,
        advanced=True,
    )
