"""The CPU allocator: `cpu_return_freed_memory` gives a CPU worker's malloc a fixed mmap threshold, so freed
tensors leave the process (a lower real peak, ~16-22% fewer tokens/s, measured). Its memory part is
`jobs.memory.trick_effects` (without it, glibc's heap keeps freed activations resident); the environment it
sets is `jobs.devices` (`cpu_allocator_env`)."""

from __future__ import annotations

from jobs.spec.job import JobSpec
from jobs.spec.tricks.record import Applied, DocsRow, HasCuda, NotApplicable, Speed, TrickRecord, flag_step

FIELD = "cpu_return_freed_memory"
FIELDS = (FIELD,)
SUMMARY = "freed memory returned to the system (CPU workers)"
DEVICE = "cpu"  # the "Low memory" preset turns it on for a CPU worker


def step(spec: JobSpec, cuda: bool) -> Applied[JobSpec] | NotApplicable:
    """The sweep's step: on a CPU worker only."""
    if getattr(spec, FIELD):
        return NotApplicable(f"{FIELD} is already on")
    if cuda:
        return NotApplicable("it changes a CPU worker's allocator; a GPU run's memory is torch's")
    return flag_step(spec, FIELD)


def warnings(spec: JobSpec, device: HasCuda) -> list[str]:
    if spec.cpu_return_freed_memory and device.cuda:
        return [f"{FIELD} only changes a CPU worker's allocator; a GPU run ignores it"]
    return []


DOCS = (
    DocsRow(
        "CPU allocator",
        "`cpu_return_freed_memory`",
        "0.84x peak RSS (SmolLM2 LoRA)",
        "0.78-0.84x tokens/s",
        "measured here (`bench/overhead.py`)",
    ),
)  # docs/memory.md's table of tricks (tests/test_trick_homes.py keeps them equal)

TRICK = TrickRecord(
    FIELD,
    FIELDS,
    SUMMARY,
    warnings=warnings,
    speed=Speed(FIELD, "cpu", 0.80, "measured: bench/overhead.py --sides bare,bare-malloc, 0.78-0.84x"),
    docs=DOCS,
)
