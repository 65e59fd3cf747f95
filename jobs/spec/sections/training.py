"""The spec's training schedule: learning rate and its schedule, length, regularisation, logging, checkpoints, seed."""

from __future__ import annotations

from dataclasses import dataclass

from jobs.spec.enums import Scheduler
from jobs.spec.field import SEED_MAX, STEP_COUNT_MAX, Group, spec_field


@dataclass(frozen=True)
class TrainingFields:
    """How long and how fast the run learns, and how often it logs, evaluates and saves."""

    learning_rate: float = spec_field(
        2e-4,
        Group.TRAINING,
        "Peak learning rate. LoRA likes 1e-4..1e-3; full fine-tuning 1e-5..5e-5.",
        gt=0.0,
        le=1.0,
        label="Learning rate",
    )
    lr_scheduler_type: Scheduler = spec_field(
        Scheduler.LINEAR,
        Group.TRAINING,
        "How the learning rate changes over training.",
        label="Learning-rate schedule",
        advanced=True,
    )
    warmup_steps: int = spec_field(
        0,
        Group.TRAINING,
        "Optimizer steps of linear warm-up.",
        ge=0,
        le=STEP_COUNT_MAX,
        label="Warm-up steps",
        advanced=True,
    )
    num_train_epochs: float = spec_field(
        1.0,
        Group.TRAINING,
        "Passes over the training data (ignored when max_steps is set).",
        gt=0.0,
        le=1000.0,
        label="Epochs",
    )
    max_steps: int = spec_field(
        -1,
        Group.TRAINING,
        "Stop after this many optimizer steps; -1 trains for num_train_epochs.",
        ge=-1,
        le=STEP_COUNT_MAX,
        label="Max steps",
    )
    weight_decay: float = spec_field(
        0.0, Group.TRAINING, "AdamW weight decay.", ge=0.0, le=1.0, label="Weight decay", advanced=True
    )
    max_grad_norm: float = spec_field(
        1.0,
        Group.TRAINING,
        "Gradient clipping norm; 0 turns clipping off.",
        ge=0.0,
        le=1e6,
        label="Gradient clipping",
        advanced=True,
    )
    neftune_noise_alpha: float | None = spec_field(
        None,
        Group.TRAINING,
        "NEFTune: add uniform noise of this scale to the input embeddings while training (the paper used 5-15; "
        "empty: off). Costs no memory or time; published gains are on instruction-following benchmarks.",
        gt=0.0,
        le=100.0,
        label="NEFTune noise",
        advanced=True,
    )
    logging_steps: int = spec_field(
        1,
        Group.TRAINING,
        "Log metrics every N optimizer steps.",
        ge=1,
        le=STEP_COUNT_MAX,
        label="Log every N steps",
        advanced=True,
    )
    eval_steps: int | None = spec_field(
        None,
        Group.TRAINING,
        "Evaluate every N steps (empty: only at the end, when there is eval data).",
        ge=1,
        le=STEP_COUNT_MAX,
        label="Evaluate every N steps",
        advanced=True,
    )
    save_steps: int | None = spec_field(
        None,
        Group.TRAINING,
        "Save a resumable checkpoint every N steps (empty: none).",
        ge=1,
        le=STEP_COUNT_MAX,
        label="Checkpoint every N steps",
        advanced=True,
    )
    save_minutes: float | None = spec_field(
        10.0,
        Group.TRAINING,
        "Also save a resumable checkpoint every N minutes of training, so a crash loses at most that (empty: off).",
        gt=0.0,
        le=1e6,
        label="Checkpoint every N minutes",
        advanced=True,
    )
    save_total_limit: int | None = spec_field(
        2,
        Group.TRAINING,
        "Keep at most N checkpoints on disk, the newest (empty: keep all).",
        ge=1,
        label="Checkpoints kept",
        advanced=True,
    )
    seed: int = spec_field(
        42,
        Group.TRAINING,
        "Random seed for data order and initialisation.",
        ge=0,
        le=SEED_MAX,
        label="Seed",
        advanced=True,
    )
