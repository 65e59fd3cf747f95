"""Mixed precision: bf16 (a GPU that has it) or fp16 with loss scaling (CUDA): half the activations' bytes
and faster matmuls. The field is `precision`; `jobs.config.mapping.resolve_precision` picks `auto`'s."""

from __future__ import annotations

from jobs.spec.enums import Precision
from jobs.spec.job import JobSpec
from jobs.spec.tricks.record import Applied, DocsRow, NotApplicable, TrickRecord

FIELDS = ("precision",)
SUMMARIES = {Precision.BF16: "bf16 mixed precision", Precision.FP16: "fp16 mixed precision with loss scaling"}


def precision(spec: JobSpec, wanted: Precision, cuda: bool, bf16: bool) -> Applied[JobSpec] | NotApplicable:
    """Mixed precision where the target device supports it (fp16 needs CUDA; bf16 a GPU that has it)."""
    if spec.precision is wanted:
        return NotApplicable(f"precision is already {wanted.value}")
    if not cuda:
        return NotApplicable(f"{wanted.value} mixed precision needs a CUDA device; the worker has none")
    if wanted is Precision.BF16 and not bf16:
        return NotApplicable("the worker's GPU does not support bf16")
    return Applied(spec.replace(precision=wanted), f"precision {spec.precision.value} -> {wanted.value}")


DOCS = (
    DocsRow(
        "mixed precision",
        "`precision`",
        "activations halved",
        "~2x on tensor cores",
        "published (HF)",
    ),
)  # docs/memory.md's table of tricks (tests/test_trick_homes.py keeps them equal)

TRICK = TrickRecord("precision", FIELDS, "bf16 or fp16 mixed precision", speed_field=False, docs=DOCS)
