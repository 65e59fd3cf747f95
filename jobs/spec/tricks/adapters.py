"""Adapters as a memory trick: LoRA on a frozen base, QLoRA on a 4-bit NF4 base (the sweep's steps; the
field is `method`, whose mapping is `jobs.config.peft`)."""

from __future__ import annotations

from jobs.spec.enums import Method
from jobs.spec.job import JobSpec
from jobs.spec.tricks.record import Applied, NotApplicable, TrickRecord

FIELDS = ("method",)
SUMMARIES = {Method.LORA: "LoRA adapters on a frozen base", Method.QLORA: "LoRA on a 4-bit NF4 base"}


def method(spec: JobSpec, wanted: Method) -> Applied[JobSpec] | NotApplicable:
    order = {Method.FULL: 0, Method.LORA: 1, Method.QLORA: 2}
    if spec.method is wanted:
        return NotApplicable(f"the method is already {wanted.value}")
    if spec.method not in order or order[spec.method] > order[wanted]:
        return NotApplicable(f"{wanted.value} would not save memory over {spec.method.value}")
    return Applied(spec.replace(method=wanted), f"method {spec.method.value} -> {wanted.value}")


TRICK = TrickRecord("adapters", FIELDS, "LoRA or QLoRA adapters on a frozen base", speed_field=False)
