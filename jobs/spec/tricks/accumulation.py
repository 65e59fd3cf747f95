"""Gradient accumulation: a smaller micro-batch and more accumulation steps, the same effective batch.

Activation memory scales with the micro-batch only; smaller kernels cost speed. Its fields are the batch's
(`per_device_train_batch_size`, `gradient_accumulation_steps`); the predictor and the planner size every
micro-batch themselves.
"""

from __future__ import annotations

from jobs.spec.job import JobSpec
from jobs.spec.tricks.record import Applied, DocsRow, NotApplicable, TrickRecord

FIELDS = ("per_device_train_batch_size", "gradient_accumulation_steps")
SUMMARY = "smaller micro-batch, more accumulation steps (same effective batch)"


def _smallest_factor(n: int) -> int:
    """The smallest prime factor of n >= 2 (n itself when prime)."""
    f = 2
    while f * f <= n:
        if n % f == 0:
            return f
        f += 1
    return n


def smaller_micro_batch(spec: JobSpec) -> Applied[JobSpec] | NotApplicable:
    """Divide the micro-batch by its smallest factor (2 when even), multiply accumulation by it."""
    mb, acc = spec.per_device_train_batch_size, spec.gradient_accumulation_steps
    if mb <= 1:
        return NotApplicable("the micro-batch is already 1")
    f = _smallest_factor(mb)
    changed = spec.replace(per_device_train_batch_size=mb // f, gradient_accumulation_steps=acc * f)
    return Applied(changed, f"micro-batch {mb} x {acc} -> {mb // f} x {acc * f}")


DOCS = (
    DocsRow(
        "gradient accumulation",
        "`gradient_accumulation_steps`",
        "activations of one micro-batch",
        "batch 4: 8.86 -> 1x4: 7.75 samples/s",
        "published (HF, bert-large, V100)",
    ),
)  # docs/memory.md's table of tricks (tests/test_trick_homes.py keeps them equal)

TRICK = TrickRecord("accumulation", FIELDS, SUMMARY, speed_field=False, docs=DOCS)
