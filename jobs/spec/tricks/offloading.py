"""Activation offloading (CUDA; trl's sft, dpo, kto, reward): the saved activations wait in host memory.

Each saved activation is copied to pinned host memory after its forward and back before its backward, on
side streams: GPU memory for transfer time over PCIe (~10-30%, published). With checkpointing it offloads
the checkpoints (offloaded checkpointing). Its memory part is `jobs.memory.trick_effects` (the layers'
activations move to a host figure).
"""

from __future__ import annotations

from typing import Any

from jobs.errors import Problem
from jobs.spec.enums import OFFLOADING_ONLY
from jobs.spec.job import JobSpec
from jobs.spec.tricks.record import Applied, DocsRow, HasCuda, NotApplicable, Speed, TrickRecord, flag_step

FIELD = "activation_offloading"
FIELDS = (FIELD,)
SUMMARY = "saved activations in host RAM (CUDA)"
TRAINERS = OFFLOADING_ONLY["trainer"]  # the trl configs that have `activation_offloading`
# What a CPU run uses instead (jobs.spec.tricks.checkpointing, named here: importing it would lengthen every
# import chain through the registry by one, over tests/test_layers.py's bound).
CPU_INSTEAD = "gradient_checkpointing"
DEVICE = "cuda"  # the "Low memory" preset turns it on for a CUDA worker


def kwargs(spec: JobSpec) -> dict[str, Any]:
    # Each saved activation is copied to pinned host memory after its forward and back before its
    # backward, on side streams: GPU memory for transfer time over PCIe.
    return {FIELD: True} if spec.activation_offloading else {}


def device_problems(spec: JobSpec, device: HasCuda) -> list[Problem]:
    if spec.activation_offloading and not device.cuda:
        return [
            Problem(
                FIELD,
                "offloads from GPU memory to host memory; on a CPU the activations are in host memory already",
                f"set {FIELD}: false (use {CPU_INSTEAD} on the CPU), or run on a GPU worker",
            )
        ]
    return []


def step(spec: JobSpec, cuda: bool) -> Applied[JobSpec] | NotApplicable:
    """The sweep's step: turn it on (the sweep's check drops it on a CPU worker)."""
    return flag_step(spec, FIELD)


def combination_problems(spec: JobSpec) -> list[Problem]:
    if spec.activation_offloading and spec.trainer not in TRAINERS:
        return [
            Problem(
                FIELD,
                f"the {spec.trainer.value} trainer has no activation offloading (trl: sft, dpo, kto, reward)",
                f"set {FIELD}: false for {spec.trainer.value}",
            )
        ]
    return []


DOCS = (
    DocsRow(
        "activation offloading",
        "`activation_offloading`",
        "activations -> host RAM",
        "~0.7-1.0x (an assumption: 0.85 in Fit)",
        "published range",
    ),
    DocsRow(
        "offloaded checkpointing",
        "`activation_offloading` + `gradient_checkpointing`",
        "a further ~30%, longer context",
        "slower than checkpointing alone",
        "published (Unsloth)",
    ),
)  # docs/memory.md's table of tricks (tests/test_trick_homes.py keeps them equal)

TRICK = TrickRecord(
    FIELD,
    FIELDS,
    SUMMARY,
    kwargs=kwargs,
    device_problems=device_problems,
    combination_problems=combination_problems,
    speed=Speed(FIELD, "cuda", 0.85, "published range 0.7-1.0x (transfers hidden by streams when compute dominates)"),
    docs=DOCS,
)
