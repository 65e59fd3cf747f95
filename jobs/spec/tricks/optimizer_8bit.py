"""8-bit and paged optimizers (bitsandbytes): AdamW's two moments in 8 bits, ~2 B/param instead of 8, at
nearly the same speed; paged variants move the state to CPU RAM under GPU pressure (CUDA only). The field is
`optim`; the predictor sizes each optimizer's state itself (`jobs.memory.targets.optimizer_bytes`)."""

from __future__ import annotations

from jobs.spec.enums import Optim
from jobs.spec.job import JobSpec
from jobs.spec.tricks.record import Applied, DocsRow, NotApplicable, TrickRecord

FIELDS = ("optim",)
SUMMARY = "8-bit AdamW (bitsandbytes)"
# The 8-bit counterpart of each 32-bit optimizer state.
EIGHT_BIT = {Optim.ADAMW: Optim.ADAMW_8BIT, Optim.PAGED_ADAMW_32BIT: Optim.PAGED_ADAMW_8BIT}


def optimizer_8bit(spec: JobSpec) -> Applied[JobSpec] | NotApplicable:
    target = EIGHT_BIT.get(spec.optim)
    if target is None:
        return NotApplicable(f"optimizer {spec.optim.value} has no 8-bit counterpart here (or is 8-bit already)")
    return Applied(spec.replace(optim=target), f"optimizer {spec.optim.value} -> {target.value}")


DOCS = (
    DocsRow(
        "8-bit AdamW",
        "`optim: adamw_bnb_8bit`",
        "state 8 -> ~2 B/param",
        "about the same",
        "published (bitsandbytes)",
    ),
)  # docs/memory.md's table of tricks (tests/test_trick_homes.py keeps them equal)

TRICK = TrickRecord("optim_8bit", FIELDS, SUMMARY, speed_field=False, docs=DOCS)
