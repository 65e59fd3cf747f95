"""The spec's trainer options: preference strength (DPO/KTO/ORPO/CPO), GRPO's rewards and sampling, the loss.

Each field says under which trainers it applies (`when=`); `jobs.spec.job.spec_problems` reports the ones set
under another trainer, and `jobs.spec.rewards` parses the reward texts.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.spec.enums import (
    GRPO_ONLY,
    KTO_ONLY,
    PREFERENCE_ONLY,
    SFT_ONLY,
    ImportanceSamplingLevel,
    LossType,
    ScaleRewards,
    Trainer,
)
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
        "grpo: the rewards that score each completion, declared without code: a list such as "
        '[{kind: regex, pattern: "^<answer>", weight: 0.5}, {kind: exact, column: answer}, think_format], or '
        "names with optional weights (think_format, repetition=0.5). Kinds: think_format, repetition, overlong, "
        "accuracy, reasoning_accuracy, cosine_length (trl.rewards), regex, exact, numeric, contains, json_valid, "
        "json_schema, length, required_words, forbidden_words, judge (a judge model or an OpenAI-compatible "
        "endpoint scoring with a rubric); each reward's parameters and scores: "
        "docs/methods-and-data.md.",
        label="Rewards",
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
        "auto: trl's default (nll for sft, sigmoid for dpo and cpo, kto for kto, dapo for grpo). sft: nll or dft. dpo, cpo: sigmoid (DPO), hinge (SLiC) or ipo. kto: kto or apo_zero_unpaired. grpo: grpo (each completion's token losses averaged: favours short right answers), dr_grpo (divided by a constant: no length bias), dapo (averaged over the batch's tokens) or bnpo (over the micro-batch's tokens).",
        label="Loss",
        advanced=True,
    )
    importance_sampling_level: ImportanceSamplingLevel = spec_field(
        ImportanceSamplingLevel.TOKEN,
        Group.METHOD,
        "grpo: token: one importance ratio per token (GRPO); sequence: one per completion, the mean of its tokens' "
        "(GSPO, often steadier).",
        label="Importance sampling level",
        when=GRPO_ONLY,
        advanced=True,
    )
    scale_rewards: ScaleRewards = spec_field(
        ScaleRewards.GROUP,
        Group.METHOD,
        "grpo: divide each advantage by the reward spread of its group, of the whole batch, or none (Dr. GRPO: "
        "no bias towards questions that are too easy or too hard).",
        label="Scale rewards",
        when=GRPO_ONLY,
        advanced=True,
    )
    epsilon_high: float | None = spec_field(
        None,
        Group.METHOD,
        "grpo: upper clip of the importance ratio (1 + epsilon_high) when it should differ from the lower one "
        "(0.2): clip-higher, DAPO uses 0.28, so unlikely tokens can still gain. Empty: 0.2.",
        ge=0.2,
        le=1.0,
        label="Clip-higher epsilon",
        when=GRPO_ONLY,
        advanced=True,
    )
    mask_truncated_completions: bool = spec_field(
        False,
        Group.METHOD,
        "grpo: leave completions cut at max_completion_length out of the loss (DAPO), so an unfinished answer is "
        "not punished as a wrong one.",
        label="Mask truncated completions",
        when=GRPO_ONLY,
        advanced=True,
    )
    top_entropy_quantile: float = spec_field(
        1.0,
        Group.METHOD,
        "grpo: train only on the share of tokens with the highest entropy (1: every token; the 80/20 paper uses "
        "0.2: the forking tokens).",
        ge=0.0,
        le=1.0,
        label="Top-entropy token share",
        when=GRPO_ONLY,
        advanced=True,
    )
    completions_every: int = spec_field(
        1,
        Group.METHOD,
        "grpo: keep the completions of every N-th logged step (each prompt, completion, reward score and "
        "advantage, for the run page's inspector); at most 100 steps are kept, thinned evenly over the run.",
        ge=1,
        le=100000,
        label="Keep completions every N steps",
        when=GRPO_ONLY,
        advanced=True,
    )
    use_vllm: bool = spec_field(
        False,
        Group.METHOD,
        "grpo on a CUDA GPU: sample the completions with vLLM inside the training process (trl's colocate mode) "
        "instead of transformers' generate: faster sampling, for a fixed share of the GPU's memory "
        "(vllm_gpu_memory_utilization) that training cannot use. Needs pip install 'tunedeck[vllm]' on the worker.",
        label="Generate with vLLM",
        when=GRPO_ONLY,
        advanced=True,
    )
    vllm_gpu_memory_utilization: float = spec_field(
        0.3,
        Group.METHOD,
        "grpo with use_vllm: the share of the GPU's memory vLLM reserves when it starts, for its copy of the "
        "weights and its KV cache; training gets the rest.",
        gt=0.0,
        le=0.95,
        label="vLLM share of GPU memory",
        when=GRPO_ONLY,
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
