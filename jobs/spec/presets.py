"""Launch presets: named, coherent settings of a group of spec fields, applied to a spec as data.

Every preset sets the same fields (`PRESET_FIELDS`), so choosing one after another gives the same
spec as choosing it first: nothing of an earlier preset lingers. "Balanced" is the spec's own
defaults. Applying a preset is pure and says what it changed:

    spec, changes = apply_preset(JobSpec(), "Low memory")
    describe("Low memory", changes)   # 'Low memory changed 9 field(s): Method (method) lora → qlora; ...'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from jobs.spec.enums import Method, Optim
from jobs.spec.field_info import field_infos
from jobs.spec.job import JobSpec
from jobs.spec.tricks import checkpointing, liger, offloading, registry
from jobs.spec.tricks.cpu_allocator import FIELD as CPU_ALLOCATOR


@dataclass(frozen=True)
class Preset:
    """A named group of spec values and one sentence on what it trades."""

    name: str
    summary: str  # a few words for the form, next to the button
    values: dict[str, Any]
    on_cuda: dict[str, Any] = field(default_factory=dict)  # the device's own tricks, where the worker's is CUDA
    on_cpu: dict[str, Any] = field(default_factory=dict)  # ... and where it is a CPU

    def values_for(self, cuda: bool | None = None, modules: frozenset[str] = frozenset()) -> dict[str, Any]:
        """The values for a worker with CUDA (True), a CPU (False) or unknown (None: the device's tricks off);
        `modules`: the Python modules installed there (a trick whose package is missing stays off)."""
        extra = self.on_cuda if cuda else self.on_cpu if cuda is False else {}
        return {**self.values, **{k: v for k, v in extra.items() if NEEDS.get(k, "") in modules | {""}}}

    def plain_values(self) -> dict[str, Any]:
        """The values as YAML would write them (enums by their value)."""
        return {k: v.value if isinstance(v, Enum) else v for k, v in self.values.items()}


# Every preset sets these device tricks (off unless its on_cuda/on_cpu turns one on), so none lingers
# (jobs.spec.tricks.registry); NEEDS: the module a device trick needs installed.
DEVICE_TRICKS, NEEDS = registry.DEVICE_TRICKS, registry.PRESET_MODULES


@dataclass(frozen=True)
class Change:
    """One field a preset changed: its name, value before and value after (plain YAML values)."""

    field: str
    before: Any
    after: Any


PRESETS: tuple[Preset, ...] = (
    Preset(
        "Quick test",
        "10 steps on 64 rows",
        {
            "method": Method.LORA,
            "lora_r": 8,
            "lora_alpha": 16,
            "max_train_samples": 64,
            "max_steps": 10,
            "num_train_epochs": 1.0,
            "per_device_train_batch_size": 4,
            "gradient_accumulation_steps": 1,
            **checkpointing.preset_value("Quick test"),
            "optim": Optim.ADAMW,
            "max_length": 256,
            **DEVICE_TRICKS,
        },
    ),
    # QLoRA and 8-bit AdamW also run on bitsandbytes' CPU backend, so this preset suits any device.
    # On CUDA with checkpointing on, offloading keeps the checkpointed layer inputs in host RAM (offloaded
    # checkpointing); on a CPU, freed memory goes back to the system at some speed (docs/memory.md).
    Preset(
        "Low memory",
        "QLoRA, batch 1 x 8, 8-bit AdamW; offloaded checkpoints (GPU) or freed memory returned (CPU)",
        {
            "method": Method.QLORA,
            "lora_r": 8,
            "lora_alpha": 16,
            "max_train_samples": None,
            "max_steps": -1,
            "num_train_epochs": 1.0,
            "per_device_train_batch_size": 1,
            "gradient_accumulation_steps": 8,
            **checkpointing.preset_value("Low memory"),
            "optim": Optim.ADAMW_8BIT,
            "max_length": 512,
            **DEVICE_TRICKS,
        },
        on_cuda={offloading.FIELD: True},
        on_cpu={CPU_ALLOCATOR: True},
    ),
    # Liger's Triton kernels where the worker has a GPU and the package; glibc's faster allocator on a CPU.
    Preset(
        "Fast",
        "rank 8, batch 16, no checkpointing; Liger kernels on a GPU",
        {
            "method": Method.LORA,
            "lora_r": 8,
            "lora_alpha": 16,
            "max_train_samples": None,
            "max_steps": -1,
            "num_train_epochs": 1.0,
            "per_device_train_batch_size": 16,
            "gradient_accumulation_steps": 1,
            **checkpointing.preset_value("Fast"),
            "optim": Optim.ADAMW,
            "max_length": 512,
            **DEVICE_TRICKS,
        },
        on_cuda={liger.FIELD: True},
    ),
    Preset(
        "Balanced",
        "the defaults",
        {
            "method": Method.LORA,
            "lora_r": 16,
            "lora_alpha": 32,
            "max_train_samples": None,
            "max_steps": -1,
            "num_train_epochs": 1.0,
            "per_device_train_batch_size": 8,
            "gradient_accumulation_steps": 1,
            **checkpointing.preset_value("Balanced"),
            "optim": Optim.ADAMW,
            "max_length": 512,
            **DEVICE_TRICKS,
        },
    ),
    # alpha / r stays 2 as in Balanced, so the learning rate that suits Balanced suits this too.
    Preset(
        "Best quality",
        "rank 64, 3 epochs, 1024 tokens",
        {
            "method": Method.LORA,
            "lora_r": 64,
            "lora_alpha": 128,
            "max_train_samples": None,
            "max_steps": -1,
            "num_train_epochs": 3.0,
            "per_device_train_batch_size": 8,
            "gradient_accumulation_steps": 2,
            **checkpointing.preset_value("Best quality"),
            "optim": Optim.ADAMW,
            "max_length": 1024,
            **DEVICE_TRICKS,
        },
    ),
)
PRESET_FIELDS: tuple[str, ...] = tuple(PRESETS[0].values)


def preset(name: str) -> Preset:
    """The preset called `name`; KeyError naming the choices otherwise."""
    for p in PRESETS:
        if p.name == name:
            return p
    raise KeyError(f"no preset {name!r}; choose one of: {', '.join(p.name for p in PRESETS)}")


def apply_preset(
    spec: JobSpec, name: str, cuda: bool | None = None, modules: frozenset[str] = frozenset()
) -> tuple[JobSpec, list[Change]]:
    """The spec with the preset's values (`Preset.values_for` the worker's device), and the fields whose value
    this changed (in spec order)."""
    values = preset(name).values_for(cuda, modules)
    if spec.trainer not in offloading.TRAINERS:
        values[offloading.FIELD] = False  # that trainer has none (trl)
    after = spec.replace(**values)
    before_d, after_d = spec.to_dict(), after.to_dict()
    order = [f.name for f in field_infos()]
    changes = [Change(n, before_d[n], after_d[n]) for n in order if before_d[n] != after_d[n]]
    return after, changes


def describe(name: str, changes: list[Change]) -> str:
    """One line for the form: what the preset changed, by label and spec name."""
    if not changes:
        return f"{name}: already set, nothing changed."
    labels = {f.name: f.title for f in field_infos()}
    parts = [f"{labels[c.field]} {_show(c.before)} → {_show(c.after)}" for c in changes]
    return f"{name} changed {len(changes)} field(s): " + "; ".join(parts) + "."


def _show(value: Any) -> str:
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
