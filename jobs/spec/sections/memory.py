"""The spec's memory tricks: batch shape, checkpointing, precision, optimizer, sequence length, OOM handling.

Each trick's memory/speed trade-off is told in its help text (and, at more length, next to its
mapping in `jobs.config`); `jobs.memory` predicts the peak they lead to.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.spec.enums import SFT_ONLY, OnOom, Optim, Precision
from jobs.spec.field import Group, spec_field


@dataclass(frozen=True)
class MemoryFields:
    """The knobs that trade memory for time (or for nothing, like packing)."""

    per_device_train_batch_size: int = spec_field(
        8,
        Group.MEMORY,
        "Micro-batch size: examples per forward pass. Activation memory grows with it.",
        ge=1,
        le=4096,
        label="Micro-batch size",
    )
    gradient_accumulation_steps: int = spec_field(
        1,
        Group.MEMORY,
        "Micro-batches per optimizer step. Same effective batch with less memory; costs time.",
        ge=1,
        le=4096,
        label="Gradient accumulation",
    )
    gradient_checkpointing: bool = spec_field(
        False,
        Group.MEMORY,
        "Recompute activations in the backward pass: much less activation memory, ~20-30% slower.",
        label="Gradient checkpointing",
    )
    precision: Precision = spec_field(
        Precision.AUTO,
        Group.MEMORY,
        "auto: the best the device supports (bf16 on recent GPUs, fp32 on CPU). fp16 uses loss scaling and needs CUDA.",
        label="Precision",
        advanced=True,
    )
    optim: Optim = spec_field(
        Optim.ADAMW,
        Group.MEMORY,
        "Optimizer. AdamW keeps ~8 B/param of state; 8-bit AdamW ~2 B; paged variants spill to CPU under pressure (CUDA only).",
        label="Optimizer",
    )
    max_length: int = spec_field(
        512,
        Group.MEMORY,
        "Maximum tokens per example; longer rows are truncated. Activations grow with it.",
        ge=8,
        le=131072,
        label="Max tokens per example",
    )
    packing: bool = spec_field(
        False,
        Group.MEMORY,
        "Pack several short examples into one sequence (SFT only): fewer pad tokens, faster.",
        label="Packing",
        when=SFT_ONLY,
        advanced=True,
    )
    padding_free: bool = spec_field(
        False,
        Group.MEMORY,
        "Flatten each batch into one sequence without padding (SFT: needs packing, which turns it on anyway).",
        label="Padding-free batches",
        advanced=True,
    )
    auto_find_batch_size: bool = spec_field(
        False,
        Group.MEMORY,
        "On a CUDA out-of-memory error, halve the micro-batch and retry instead of failing.",
        label="Shrink the batch on out-of-memory",
        advanced=True,
    )
    on_oom: OnOom = spec_field(
        OnOom.RECOVER,
        Group.MEMORY,
        "recover: on a CUDA out-of-memory error, continue from the last checkpoint with a smaller micro-batch (same effective batch), then gradient checkpointing, then 8-bit AdamW; at most 3 times, each change recorded on the run. fail: stop with advice.",
        label="On out-of-memory",
        advanced=True,
    )
    ignore_memory_prediction: bool = spec_field(
        False,
        Group.MEMORY,
        "Queue the run even when the predicted peak memory exceeds the device's memory (the prediction can be wrong for unusual models).",
        label="Queue even if predicted not to fit",
        advanced=True,
    )

    @property
    def effective_batch_size(self) -> int:
        return self.per_device_train_batch_size * self.gradient_accumulation_steps
