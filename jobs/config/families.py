"""What a model family cannot train with tunedeck's libraries, found by training each zoo family
(`bench/zoo_table.py`, docs/models.md) and refused before queueing with the reason and the fix.

    family_problems(spec, shape)   # [] or Problems; shape: jobs.memory.shape.ModelShape, or None (unknown)
"""

from __future__ import annotations

from typing import Any

from jobs.errors import Problem
from jobs.spec.job import JobSpec
from jobs.spec.trainer_records import record_for


def family_problems(spec: JobSpec, shape: Any) -> list[Problem]:
    if shape is None:
        return []
    out: list[Problem] = []
    if record_for(spec.trainer).needs_backbone and not shape.backbone:
        # trl 1.16 SFT's fused LM head runs `model.base_model` and reads `last_hidden_state`; a model whose
        # base_model_prefix names no attribute (Llama4ForCausalLM: "language_model") returns itself, and the
        # run fails at its first step: "'MoeCausalLMOutputWithPast' object has no attribute 'last_hidden_state'".
        out.append(
            Problem(
                "model",
                f"{shape.model_type} models cannot train with trainer: sft here (trl's loss looks for the model's "
                "backbone under a name this architecture does not use, and fails at the first step)",
                "pick a model of another family (docs/models.md lists the families that train)",
            )
        )
    return out
