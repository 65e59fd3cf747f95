"""Gradient checkpointing: recompute the activations in the backward pass instead of keeping them.

Only each block's input stays alive through the forward; one block at a time is recomputed in the backward:
activation memory drops from O(layers x everything) to ~O(layers x hidden), for about one extra forward
(~20-30% slower; FLOPs +2N per token). trl turns it on by default; tunedeck sets it explicitly.

Everything tunedeck knows about it is here; the spec field is declared in `jobs.spec.sections.memory`, the
predictor's activation formula asks `on` (jobs.memory.predict), the planner `fit_choices`.
"""

from __future__ import annotations

from typing import Any

from jobs.spec.enums import Method
from jobs.spec.job import JobSpec
from jobs.spec.tricks.record import Applied, DocsRow, NotApplicable, TrickRecord

FIELD = "gradient_checkpointing"
FIELDS = (FIELD,)
SUMMARY = "recompute activations in the backward pass"
# transformers warns that the old name is deprecated each time a config is built (child: filtered out).
DEPRECATION_WARNING = f".*{FIELD}.*deprecated.*"
# The field in each launch preset (jobs.spec.presets): off where speed matters, on where memory or length does.
PRESETS = {"Quick test": False, "Low memory": True, "Fast": False, "Balanced": False, "Best quality": True}


def on(spec: JobSpec) -> bool:
    """Whether the spec recomputes its activations."""
    return spec.gradient_checkpointing


def training_flag(spec: JobSpec) -> dict[str, Any]:
    """The TrainingArguments switch (transformers 5 calls it activation_checkpointing; the old name is an alias)."""
    return {"activation_checkpointing": spec.gradient_checkpointing}


def training_options(spec: JobSpec) -> dict[str, Any]:
    """Its options when on: non-reentrant checkpoints work with a frozen base."""
    return {"activation_checkpointing_kwargs": {"use_reentrant": False}} if spec.gradient_checkpointing else {}


def kbit_kwargs(spec: JobSpec) -> dict[str, Any]:
    """peft `prepare_model_for_kbit_training`'s checkpointing arguments (quantized bases)."""
    return {"use_gradient_checkpointing": spec.gradient_checkpointing, "gradient_checkpointing_kwargs": {"use_reentrant": False}}  # fmt: skip


def recomputes_in(trainer_config: dict[str, Any]) -> bool:
    """Whether a run's resolved trainer config (a trl config's dict) recomputed activations."""
    return bool(trainer_config.get(FIELD))


def preset_value(preset: str) -> dict[str, Any]:
    return {FIELD: PRESETS[preset]}


def step(spec: JobSpec) -> Applied[JobSpec] | NotApplicable:
    """The sweep's and the out-of-memory ladder's step: turn it on."""
    if spec.gradient_checkpointing:
        return NotApplicable("gradient checkpointing is already on")
    if spec.method is Method.PREFIX_TUNING:
        return NotApplicable("prefix tuning fails with gradient checkpointing")
    return Applied(spec.replace(gradient_checkpointing=True), "gradient checkpointing on")


def fit_choices(spec: JobSpec) -> list[bool]:
    """The values Fit to GPU tries (prefix tuning refuses checkpointing, so it keeps the spec's)."""
    if spec.method is Method.PREFIX_TUNING:
        return [spec.gradient_checkpointing]
    return sorted({spec.gradient_checkpointing, True})


def with_choice(value: bool) -> dict[str, Any]:
    """A variant's change (`spec.replace(**with_choice(True))`)."""
    return {FIELD: value}


def oom_tip(spec: JobSpec) -> str | None:
    """The out-of-memory advice line, when it could still be turned on."""
    if not spec.gradient_checkpointing and spec.method is not Method.PREFIX_TUNING:
        return f"{FIELD}: true"
    return None


def described(spec: JobSpec) -> str | None:
    """Its words in the model card's training settings."""
    return "gradient checkpointing" if spec.gradient_checkpointing else None


DOCS = (
    DocsRow(
        "gradient checkpointing",
        "`gradient_checkpointing`",
        "activations `34sbh` -> `2sbh` a layer",
        "~20-30% slower",
        "published (HF; NeMo)",
    ),
)  # docs/memory.md's table of tricks (tests/test_trick_homes.py keeps them equal)

TRICK = TrickRecord("gradient_checkpointing", FIELDS, SUMMARY, docs=DOCS)
