"""Liger kernels: Triton kernels for RMSNorm, SwiGLU and RoPE (CUDA only; pip install 'tunedeck[gpu]').

trl 1.16 turns Liger's fused linear cross-entropy off (it keeps its own chunked LM head, which already never
materialises the logits), so here the kernels save the layers' temporaries; the predictor does not model that
(the activations stay at their unfused size, said in a note). Published: +20% tokens/s on Llama-3-8B.
"""

from __future__ import annotations

from typing import Any

from jobs.errors import Problem
from jobs.spec.job import JobSpec
from jobs.spec.tricks.record import Applied, DocsRow, HasCuda, NotApplicable, Packages, Speed, TrickRecord, flag_step

FIELD = "use_liger_kernel"
FIELDS = (FIELD,)
SUMMARY = "Liger's Triton kernels (CUDA)"
PACKAGES: Packages = (("liger_kernel", "liger-kernel"), ("triton", "triton"))  # extra: tunedeck[gpu]
MODULE = PACKAGES[0][0]  # what a preset checks is installed before turning it on
DEVICE = "cuda"  # presets turn it on only for a worker of this kind (the "Fast" preset)


def kwargs(spec: JobSpec) -> dict[str, Any]:
    # Triton kernels for RMSNorm, SwiGLU, RoPE; trl 1.16 turns Liger's fused linear cross-entropy off
    # (it keeps its own chunked LM head, which already never materialises the logits).
    return {FIELD: True} if spec.use_liger_kernel else {}


def device_problems(spec: JobSpec, device: HasCuda) -> list[Problem]:
    if spec.use_liger_kernel and not device.cuda:
        return [
            Problem(
                FIELD,
                "Liger's kernels are Triton kernels, which need a CUDA device; this one is a CPU",
                f"set {FIELD}: false, or run on a GPU worker",
            )
        ]
    return []


def step(spec: JobSpec, cuda: bool) -> Applied[JobSpec] | NotApplicable:
    """The sweep's step: turn it on (the sweep's check drops it where the device or the package is missing)."""
    return flag_step(spec, FIELD)


def packages(spec: JobSpec) -> dict[str, Packages]:
    return {FIELD: PACKAGES} if spec.use_liger_kernel else {}


DOCS = (
    DocsRow(
        "Liger kernels",
        "`use_liger_kernel`",
        "-60% (with its fused loss; trl keeps its own)",
        "+20% tokens/s",
        "published (Liger, Llama-3-8B)",
    ),
    DocsRow(
        "cut cross-entropy",
        "(trl's fused LM head)",
        "logits never materialised",
        "-",
        "published (CCE paper); trl 1.16 does it already",
    ),
)  # docs/memory.md's table of tricks (tests/test_trick_homes.py keeps them equal)

TRICK = TrickRecord(
    FIELD,
    FIELDS,
    SUMMARY,
    kwargs=kwargs,
    device_problems=device_problems,
    packages=packages,
    installs=PACKAGES,
    speed=Speed(FIELD, "cuda", 1.20, "published: +20% on Llama-3-8B"),
    memory_note="Liger kernels: their smaller layer temporaries are not modelled (predicted at the unfused size)",
    docs=DOCS,
)
