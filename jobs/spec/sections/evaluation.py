"""The spec's evaluation section: early stopping on an eval metric, and the best checkpoint it keeps."""

from __future__ import annotations

from dataclasses import dataclass

from jobs.spec.field import Group, spec_field


@dataclass(frozen=True)
class EvaluationFields:
    """When to stop because the held-out data stopped getting better, and what "better" means."""

    early_stopping_patience: int | None = spec_field(
        None,
        Group.TRAINING,
        "Stop once the watched metric (metric_for_best_model) failed to improve for this many evaluations in a row, and put the best checkpoint in the bundle (empty: train to the end). Needs eval data (eval_dataset, eval_split or a sample's own eval split) and eval_steps; a checkpoint is saved at each evaluation.",
        ge=1,
        label="Early-stopping patience",
        advanced=True,
    )
    early_stopping_threshold: float = spec_field(
        0.0,
        Group.TRAINING,
        "How much the watched metric must improve over the best so far to count as better (0: any improvement).",
        ge=0.0,
        le=1e6,
        label="Early-stopping threshold",
        advanced=True,
    )
    metric_for_best_model: str = spec_field(
        "eval_loss",
        Group.TRAINING,
        "The eval metric that picks the best checkpoint with early_stopping_patience: eval_loss (lower is better) or another metric the trainer logs at evaluation, such as eval_mean_token_accuracy (names not ending in loss: higher is better); or a benchmark task's score, task:<task>/<metric> (higher is better), e.g. task:my-questions/exact_match, where my-questions.jsonl is a file of questions listed in eval_tasks: the model is scored on it at every evaluation (eval_steps) as after training, the score logged as eval_task/<task>/<metric>; its metrics: acc (questions with choices), exact_match (rows with an answer), regex_match (rows with a regex).",
        label="Watched metric",
        advanced=True,
    )
    doctor_stop_on: str | None = spec_field(
        None,
        Group.TRAINING,
        "Findings of the training doctor that also stop the run (cancel it, keeping its last checkpoint), comma-separated "
        "rule codes (in YAML also a list): loss_spike, grad_norm_explosion, nonfinite_loss, loss_flat, loss_near_zero, "
        "overfitting, throughput_drop, memory_creep, reward_saturated, chosen_logps_falling, grpo_no_signal, "
        'completions_clipped, kl_unbounded, entropy_collapse (docs/runs.md, "The training doctor"). Every finding is '
        "recorded and shown either way. A severity (info, warning, fatal) stops on every finding of it. Empty: findings "
        "only warn.",
        label="Stop on findings",
        advanced=True,
    )
    eval_tasks: str | None = spec_field(
        None,
        Group.RUN,
        "Benchmark tasks scored on the result and on its base model, with the same settings, when training ends (lm-evaluation-harness, zero-shot), comma-separated: a .jsonl of questions you wrote (rows with question, choices and answer: multiple choice by log-likelihood; rows with question and an answer and/or a regex: the generated answer scored by exact match and by the regex), an lm-eval task .yaml, or a task of lm-eval's registry such as hellaswag or arc_easy (its data comes from the hub). Empty: none.",
        label="Benchmark tasks",
        advanced=True,
    )
    judge: str | None = spec_field(
        None,
        Group.RUN,
        "A judge that compares the result's before/after answers with its base model's when training ends, each held-out prompt shown in both orders, and gives the run's win rate (wins, ties, losses): a built-in model name such as smollm2-135m-instruct, a local model folder, a hub id, run:N (another run's result), or an OpenAI-compatible endpoint written URL#MODEL (the worker's OPENAI_API_KEY is sent only to endpoints its operator lists in TUNEDECK_TRUSTED_ENDPOINTS; any other is called without a key, and a dashboard with a login refuses it). Needs before/after samples (sample_count above 0). Empty: none.",
        label="Judge",
        advanced=True,
    )
