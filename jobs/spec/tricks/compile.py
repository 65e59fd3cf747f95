"""torch.compile (inductor): fused elementwise ops, fewer intermediate tensors and kernel launches, after a
compile of a minute or more; its workspace and cache are not predicted (said in a note)."""

from __future__ import annotations

from typing import Any

from jobs.errors import Problem
from jobs.spec.enums import Method
from jobs.spec.job import JobSpec
from jobs.spec.tricks.record import Applied, DocsRow, NotApplicable, Speed, TrickRecord, flag_step

FIELD = "torch_compile"
FIELDS = (FIELD,)
SUMMARY = "torch.compile (CUDA; minutes of compiling on a CPU)"
# Methods whose layers torch.compile cannot trace whole: bitsandbytes' quantized matmuls are opaque custom
# calls (graph breaks at every layer), and prompt methods pass a peft cache object through the model.
COMPILE_BREAKING = {Method.QLORA, Method.LORA_8BIT, Method.PREFIX_TUNING}


def kwargs(spec: JobSpec) -> dict[str, Any]:
    # inductor fuses elementwise ops (fewer intermediate tensors, fewer kernel launches) after a
    # compile of a minute or more; its own workspace and cache are not predicted.
    return {FIELD: True} if spec.torch_compile else {}


def step(spec: JobSpec, cuda: bool) -> Applied[JobSpec] | NotApplicable:
    """The sweep's step: on CUDA only (the CPU's inductor compiles for minutes)."""
    if getattr(spec, FIELD):
        return NotApplicable(f"{FIELD} is already on")
    if not cuda:
        return NotApplicable("torch.compile on a CPU compiles for minutes (longer than a probe)")
    return flag_step(spec, FIELD)


def combination_problems(spec: JobSpec) -> list[Problem]:
    if not (spec.torch_compile and spec.method in COMPILE_BREAKING):
        return []
    return [
        Problem(
            FIELD,
            f"method {spec.method.value} breaks torch.compile's graph at every layer "
            + (
                "(bitsandbytes' quantized matmuls are opaque to it)"
                if spec.method is not Method.PREFIX_TUNING
                else "(the prefix travels as a cache object)"
            )
            + ", so it would compile for nothing",
            f"set {FIELD}: false, or use method: lora",
        )
    ]


DOCS = (
    DocsRow(
        "torch.compile",
        "`torch_compile`",
        "-15%",
        "+27% tokens/s",
        "published (torchtune, a 3B)",
    ),
)  # docs/memory.md's table of tricks (tests/test_trick_homes.py keeps them equal)

TRICK = TrickRecord(
    FIELD,
    FIELDS,
    SUMMARY,
    kwargs=kwargs,
    combination_problems=combination_problems,
    speed=Speed(FIELD, "cuda", 1.27, "published: torchtune +27% on a 3B"),
    memory_note="torch.compile: the compiler's workspace and fused buffers are not modelled",
    docs=DOCS,
)
