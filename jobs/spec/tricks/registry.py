"""Every memory trick, in one list (`TRICKS`), and what the rest of tunedeck asks of all of them at once.

The mapping (`jobs.config.mapping`), the checks, the predictor's notes, Fit to GPU's speed model, the presets,
the sweep and the docs read this; none of them names a trick's field. Spec in, kwargs / problems / steps out;
the facts a refusal depends on (the device; the packages the worker lacks) come in as arguments.

    kw.update(trick_kwargs(spec))                        # inside jobs.config.mapping.training_kwargs
    problems = trick_device_problems(spec, device) + trick_combination_problems(spec)
    found = apply(Trick.ACCUMULATION, spec)              # the sweep's / OOM ladder's step: micro-batch 16 x 1 -> 8 x 2
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from jobs.errors import Problem
from jobs.spec.enums import Method, Precision
from jobs.spec.job import JobSpec
from jobs.spec.tricks import (
    accumulation,
    adapters,
    checkpointing,
    compile,
    cpu_allocator,
    liger,
    loraplus,
    low_rank,
    neftune,
    offloading,
    optimizer_8bit,
    precision,
)
from jobs.spec.tricks.record import Applied, HasCuda, NotApplicable, Packages, Speed, TrickRecord

# Every trick once. The order is the order of their keyword arguments, refusals and notes.
TRICKS: tuple[TrickRecord, ...] = (
    checkpointing.TRICK,
    accumulation.TRICK,
    precision.TRICK,
    optimizer_8bit.TRICK,
    adapters.TRICK,
    liger.TRICK,
    offloading.TRICK,
    low_rank.TRICK,
    loraplus.TRICK,
    neftune.TRICK,
    compile.TRICK,
    cpu_allocator.TRICK,
)


def _first(*records: TrickRecord) -> tuple[TrickRecord, ...]:
    """TRICKS with these first (the order a list of refusals or warnings was printed in before the registry)."""
    return records + tuple(t for t in TRICKS if t not in records)


COMBINATION_ORDER = _first(low_rank.TRICK)  # GaLore's refusals came before offloading's
WARNING_ORDER = _first(cpu_allocator.TRICK)  # the allocator's warning came before GaLore's
DOCS_ORDER = _first(accumulation.TRICK)  # docs/memory.md's table opens with the oldest trick
# Fit to GPU's speed factors, multiplied in this order (a float product: the order is kept).
SPEEDS: tuple[Speed, ...] = tuple(s for t in (cpu_allocator.TRICK, offloading.TRICK, liger.TRICK, compile.TRICK) if (s := t.speed))  # fmt: skip
# The tricks only one kind of device runs: every preset sets them (off unless its device's list turns one
# on), so none lingers; `PRESET_MODULES`: the module one needs installed before a preset turns it on.
DEVICE_TRICKS: dict[str, bool] = {offloading.FIELD: False, liger.FIELD: False, cpu_allocator.FIELD: False}
PRESET_MODULES = {liger.FIELD: liger.MODULE}


class Trick(str, Enum):
    """The sweep's (and `tunedeck sweep --tricks`') names of the tricks it can apply one at a time."""

    BASELINE = "baseline"
    GRADIENT_CHECKPOINTING = checkpointing.FIELD
    ACCUMULATION = accumulation.TRICK.name
    OPTIM_8BIT = optimizer_8bit.TRICK.name
    BF16 = Precision.BF16.value
    FP16 = Precision.FP16.value
    LORA = Method.LORA.value
    QLORA = Method.QLORA.value
    # The newer tricks: the sweep's check drops the ones the worker's device cannot run.
    OFFLOADING = offloading.FIELD
    CPU_ALLOCATOR = cpu_allocator.FIELD
    LIGER = liger.FIELD
    GALORE = low_rank.TRICK.name
    COMPILE = compile.FIELD


TRICK_HELP = {
    Trick.BASELINE: "the spec as written",
    Trick.GRADIENT_CHECKPOINTING: checkpointing.SUMMARY,
    Trick.ACCUMULATION: accumulation.SUMMARY,
    Trick.OPTIM_8BIT: optimizer_8bit.SUMMARY,
    Trick.BF16: precision.SUMMARIES[Precision.BF16],
    Trick.FP16: precision.SUMMARIES[Precision.FP16],
    Trick.LORA: adapters.SUMMARIES[Method.LORA],
    Trick.QLORA: adapters.SUMMARIES[Method.QLORA],
    Trick.OFFLOADING: offloading.SUMMARY,
    Trick.CPU_ALLOCATOR: cpu_allocator.SUMMARY,
    Trick.LIGER: liger.SUMMARY,
    Trick.GALORE: low_rank.SUMMARY,
    Trick.COMPILE: compile.SUMMARY,
}
_FLAG_STEPS = {
    Trick.OFFLOADING: offloading.step,
    Trick.CPU_ALLOCATOR: cpu_allocator.step,
    Trick.LIGER: liger.step,
    Trick.COMPILE: compile.step,
}


def apply(trick: Trick, spec: JobSpec, *, cuda: bool = False, bf16: bool = False) -> Applied[JobSpec] | NotApplicable:
    """Apply one trick; `cuda`/`bf16` describe the device that will run it (for precision tricks)."""
    if trick is Trick.BASELINE:
        return Applied(spec, "as written")
    if trick is Trick.GRADIENT_CHECKPOINTING:
        return checkpointing.step(spec)
    if trick is Trick.ACCUMULATION:
        return accumulation.smaller_micro_batch(spec)
    if trick is Trick.OPTIM_8BIT:
        return optimizer_8bit.optimizer_8bit(spec)
    if trick in (Trick.BF16, Trick.FP16):
        return precision.precision(spec, Precision(trick.value), cuda, bf16)
    if trick in _FLAG_STEPS:
        return _FLAG_STEPS[trick](spec, cuda)
    if trick is Trick.GALORE:
        return low_rank.step(spec)
    return adapters.method(spec, Method(trick.value))


def trick_kwargs(spec: JobSpec) -> dict[str, Any]:
    """TrainingArguments / trl config keyword arguments of the tricks that are on (none when all are off)."""
    kw: dict[str, Any] = {}
    for trick in TRICKS:
        kw.update(trick.kwargs(spec))
    return kw


def trick_device_problems(spec: JobSpec, device: HasCuda) -> list[Problem]:
    """What the device cannot do with the spec's tricks."""
    return [p for trick in TRICKS for p in trick.device_problems(spec, device)]


def trick_combination_problems(spec: JobSpec) -> list[Problem]:
    """Combinations of the tricks with the method, trainer and batch that trl/transformers/peft reject."""
    return [p for trick in COMBINATION_ORDER for p in trick.combination_problems(spec)]


def trick_warnings(spec: JobSpec, device: HasCuda) -> list[str]:
    """Tricks that run, but not as the spec suggests."""
    return [w for trick in WARNING_ORDER for w in trick.warnings(spec, device)]


def _needed(spec: JobSpec) -> dict[str, Packages]:
    """field -> the packages the spec's tricks need."""
    return {name: needs for trick in TRICKS for name, needs in trick.packages(spec).items()}


def needed_modules(spec: JobSpec) -> dict[str, str]:
    """python module -> pip requirement, for every package the spec's tricks need."""
    return {module: req for needs in _needed(spec).values() for module, req in needs}


def package_problems(spec: JobSpec, device: HasCuda, missing: frozenset[str]) -> list[Problem]:
    """The tricks whose packages (pip names in `missing`) are not installed; Triton only matters on CUDA."""
    out: list[Problem] = []
    for name, needs in _needed(spec).items():
        for module, requirement in needs:
            if requirement in missing and not (module == "triton" and not device.cuda):
                out.append(
                    Problem(
                        name,
                        f"needs the Python package {requirement}, which is not installed where the run would start",
                        f"pip install {requirement} (or pip install 'tunedeck[gpu]'), or turn {name} off",
                    )
                )
    return out


def package_modules() -> tuple[str, ...]:
    """Every python module some trick needs (what `jobs.checks` looks up on the worker)."""
    return tuple(dict.fromkeys(module for t in TRICKS for module, _ in t.installs))


def memory_notes(spec: JobSpec) -> list[str]:
    """The notes of the tricks that are on and whose effect the predictor does not model."""
    return [t.memory_note for t in TRICKS if t.memory_note and any(getattr(spec, f) for f in t.fields)]


def speed_fields() -> tuple[str, ...]:
    """The tricks' fields that decide a run's speed (Fit to GPU's "same setup")."""
    return tuple(f for t in TRICKS if t.speed_field for f in t.fields)


def docs_table() -> str:
    """docs/memory.md's table of the tricks, each row from its trick's record (tests/test_trick_homes.py holds
    the page to it: a changed figure is changed in the trick's module and pasted from here)."""
    lines = ["| trick | field | memory | speed | source |", "|---|---|---|---|---|"]
    lines += [f"| {r.trick} | {r.field} | {r.memory} | {r.speed} | {r.source} |" for t in DOCS_ORDER for r in t.docs]
    return "\n".join(lines)
