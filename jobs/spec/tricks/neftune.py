"""NEFTune: noise on the input embeddings during training only (no memory, no time)."""

from __future__ import annotations

from typing import Any

from jobs.spec.job import JobSpec
from jobs.spec.tricks.record import TrickRecord

FIELD = "neftune_noise_alpha"
FIELDS = (FIELD,)
SUMMARY = "NEFTune: noise on the input embeddings while training (no memory, no time)"


def kwargs(spec: JobSpec) -> dict[str, Any]:
    # Noise on the input embeddings during training only: no memory, no time.
    return {FIELD: spec.neftune_noise_alpha} if spec.neftune_noise_alpha is not None else {}


TRICK = TrickRecord(FIELD, FIELDS, SUMMARY, kwargs=kwargs, speed_field=False)
