"""Launch presets: named, coherent settings of a group of spec fields, applied to a spec as data.

Every preset sets the same fields (`PRESET_FIELDS`), so choosing one after another gives the same
spec as choosing it first: nothing of an earlier preset lingers. "Balanced" is the spec's own
defaults. Applying a preset is pure and says what it changed:

    spec, changes = apply_preset(JobSpec(), "Low memory")
    describe("Low memory", changes)   # 'Low memory changed 9 field(s): Method (method) lora → qlora; ...'
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from jobs.spec.enums import Method, Optim
from jobs.spec.field_info import field_infos
from jobs.spec.job import JobSpec


@dataclass(frozen=True)
class Preset:
    """A named group of spec values and one sentence on what it trades."""

    name: str
    summary: str  # a few words for the form, next to the button
    values: dict[str, Any]

    def plain_values(self) -> dict[str, Any]:
        """The values as YAML would write them (enums by their value)."""
        return {k: v.value if isinstance(v, Enum) else v for k, v in self.values.items()}


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
            "gradient_checkpointing": False,
            "optim": Optim.ADAMW,
            "max_length": 256,
        },
    ),
    # QLoRA and 8-bit AdamW also run on bitsandbytes' CPU backend, so this preset suits any device.
    Preset(
        "Low memory",
        "QLoRA, batch 1 x 8, 8-bit AdamW",
        {
            "method": Method.QLORA,
            "lora_r": 8,
            "lora_alpha": 16,
            "max_train_samples": None,
            "max_steps": -1,
            "num_train_epochs": 1.0,
            "per_device_train_batch_size": 1,
            "gradient_accumulation_steps": 8,
            "gradient_checkpointing": True,
            "optim": Optim.ADAMW_8BIT,
            "max_length": 512,
        },
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
            "gradient_checkpointing": False,
            "optim": Optim.ADAMW,
            "max_length": 512,
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
            "gradient_checkpointing": True,
            "optim": Optim.ADAMW,
            "max_length": 1024,
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


def apply_preset(spec: JobSpec, name: str) -> tuple[JobSpec, list[Change]]:
    """The spec with the preset's values, and the fields whose value this changed (in spec order)."""
    chosen = preset(name)
    after = spec.replace(**chosen.values)
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
