"""GRPO's checks across fields: its rewards, its group sizes, and its loss knobs under another trainer.

`jobs.spec.job.spec_problems` calls `grpo_problems` with the trainer record's `generates`. The rewards
themselves are parsed and checked once by `jobs.spec.rewards` (`JobSpec.reward_problems`, each problem
naming `rewards[i].param`); the columns they read are checked with the data (`jobs.checks.rewards`).
Pure: no file system, no device.
"""

from __future__ import annotations

from typing import Protocol

from jobs.errors import Problem
from jobs.spec.custom_reward import function_ref_problem
from jobs.spec.enums import PREFERENCE_ONLY, Trainer

TRY_REWARDS_TASK = "try_rewards"  # the worker task that tries a spec's rewards (`jobs.queue.trial`)
TRIAL_PROMPTS_MAX = 16  # prompts one "try rewards" samples at most (each num_generations completions)

# GRPOConfig's loss knobs (loss_type is shared with the other trainers and checked with them).
LOSS_KNOBS = (
    "importance_sampling_level",
    "scale_rewards",
    "epsilon_high",
    "mask_truncated_completions",
    "top_entropy_quantile",
)
# vLLM generation (`jobs.config.vllm`): always trl's colocate mode
VLLM_OPTIONS = ("use_vllm", "vllm_gpu_memory_utilization")
GRPO_OPTIONS = (*LOSS_KNOBS, "completions_every", *VLLM_OPTIONS)  # refused under another trainer when changed
COMPLETIONS_KEPT = 100  # steps of completions a run keeps at most (`jobs.train.completions`)


class GrpoSpec(Protocol):
    """The fields these checks read (a `jobs.spec.job.JobSpec` has them all, and the loss knobs)."""

    @property
    def trainer(self) -> Trainer: ...
    @property
    def beta(self) -> float: ...
    @property
    def rewards(self) -> str | None: ...
    @property
    def reward_problems(self) -> list[Problem]: ...
    @property
    def reward_model_run(self) -> int | None: ...
    @property
    def reward_function(self) -> str | None: ...
    @property
    def num_generations(self) -> int: ...
    @property
    def effective_batch_size(self) -> int: ...
    @property
    def per_device_train_batch_size(self) -> int: ...
    @property
    def gradient_accumulation_steps(self) -> int: ...
    @property
    def auto_find_batch_size(self) -> bool: ...
    @property
    def use_vllm(self) -> bool: ...
    @property
    def vllm_gpu_memory_utilization(self) -> float: ...


def grpo_problems(spec: GrpoSpec, generates: bool) -> list[Problem]:
    """GRPO's rewards, group sizes and loss knobs; reward fields and loss knobs under another trainer."""
    grpo = generates  # the trainer's record: the rewards score generated answers
    out: list[Problem] = []
    if spec.beta == 0 and spec.trainer in PREFERENCE_ONLY["trainer"]:
        out.append(
            Problem(
                "beta",
                f"0 leaves {spec.trainer.value} without its preference term",
                "use a value > 0 (0 is only for grpo: no KL penalty)",
            )
        )
    given = [n for n in ("rewards", "reward_model_run", "reward_function") if getattr(spec, n) is not None]
    if not grpo:
        # a spec dataclass's class attribute is the field's default
        knobs = [n for n in GRPO_OPTIONS if getattr(spec, n) != getattr(type(spec), n)]
        return (
            out
            + [
                Problem(
                    n,
                    f"is a grpo option; the {spec.trainer.value} trainer has no rewards",
                    f"remove {n}, or set trainer: grpo",
                )
                for n in given
            ]
            + [
                Problem(n, f"is a grpo option; the {spec.trainer.value} trainer does not read it", f"remove {n}")
                for n in knobs
            ]
        )
    if spec.rewards is not None:
        out.extend(spec.reward_problems)
    if spec.reward_function is not None:
        found = function_ref_problem(spec.reward_function)
        if found:
            out.append(Problem("reward_function", *found))
    if not given:
        out.append(
            Problem(
                "rewards",
                "grpo needs at least one reward to score the completions",
                'declare rewards (e.g. rewards: [{kind: regex, pattern: "Answer: \\\\d+"}, repetition]), a finished reward run '
                "(reward_model_run: ID), or a reward_function in a spec file",
            )
        )
    # 0 or less is a bound problem of its own (and 0 would divide by zero).
    if spec.num_generations > 0 and spec.effective_batch_size % spec.num_generations:
        # trl: "generation_batch_size (6) must be divisible by num_generations (4)."
        out.append(
            Problem(
                "num_generations",
                f"{spec.num_generations} does not divide the effective batch "
                f"({spec.per_device_train_batch_size} x {spec.gradient_accumulation_steps} = "
                f"{spec.effective_batch_size}); trl generates whole groups of completions per prompt",
                "make per_device_train_batch_size x gradient_accumulation_steps a multiple of num_generations",
            )
        )
    if not spec.use_vllm and spec.vllm_gpu_memory_utilization != type(spec).vllm_gpu_memory_utilization:
        out.append(
            Problem(
                "vllm_gpu_memory_utilization",
                "is vLLM's share of the GPU, and use_vllm is off: nothing would read it",
                "set use_vllm: true, or remove vllm_gpu_memory_utilization",
            )
        )
    if spec.auto_find_batch_size:
        # trl: "auto_find_batch_size is not supported by GRPO, because the generation batch must contain full
        # prompt groups of num_generations completions"
        out.append(
            Problem(
                "auto_find_batch_size",
                "is not supported by grpo (a halved batch would split the groups of completions per prompt)",
                "set auto_find_batch_size: false and lower "
                "per_device_train_batch_size instead (keep it a multiple of num_generations)",
            )
        )
    return out
