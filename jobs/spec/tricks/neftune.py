"""NEFTune: noise on the input embeddings during training only (no memory, no time)."""

from __future__ import annotations

from typing import Any

from jobs.spec.job import JobSpec
from jobs.spec.tricks.record import DocsRow, TrickRecord

FIELD = "neftune_noise_alpha"
FIELDS = (FIELD,)
SUMMARY = "NEFTune: noise on the input embeddings while training (no memory, no time)"


def kwargs(spec: JobSpec) -> dict[str, Any]:
    # Noise on the input embeddings during training only: no memory, no time.
    return {FIELD: spec.neftune_noise_alpha} if spec.neftune_noise_alpha is not None else {}


DOCS = (
    DocsRow(
        "NEFTune",
        "`neftune_noise_alpha`",
        "none",
        "none",
        "published (NEFTune paper)",
    ),
)  # docs/memory.md's table of tricks (tests/test_trick_homes.py keeps them equal)

TRICK = TrickRecord(FIELD, FIELDS, SUMMARY, kwargs=kwargs, speed_field=False, docs=DOCS)
