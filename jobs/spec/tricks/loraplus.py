"""LoRA+: LoRA's B matrices learn `loraplus_lr_ratio` times faster than A (same memory, faster convergence;
paper: ratio 16). An optimizer built by peft (`create_loraplus_optimizer`, in `jobs.train.loraplus`)."""

from __future__ import annotations

from typing import Any

from jobs.errors import Problem
from jobs.spec.enums import LORA_FAMILY, Optim
from jobs.spec.job import JobSpec
from jobs.spec.tricks.record import DocsRow, TrickRecord

FIELD = "loraplus_lr_ratio"
FIELDS = (FIELD,)
SUMMARY = "LoRA+: a higher learning rate for LoRA's B matrices (no memory)"


def loraplus_kwargs(spec: JobSpec) -> dict[str, Any] | None:
    """peft `create_loraplus_optimizer` arguments (besides the model and the optimizer class), or None when off."""
    if spec.loraplus_lr_ratio is None:
        return None
    # LoRA+ gives B a learning rate `ratio` times A's: the same memory, faster convergence (paper: ratio 16).
    return {
        "lr": spec.learning_rate,
        "loraplus_lr_ratio": spec.loraplus_lr_ratio,
        "loraplus_weight_decay": spec.weight_decay,
    }


def combination_problems(spec: JobSpec) -> list[Problem]:
    out: list[Problem] = []
    if spec.loraplus_lr_ratio is not None and spec.method not in LORA_FAMILY:
        out.append(
            Problem(
                FIELD,
                f"LoRA+ sets the learning rate of LoRA's B matrices; method {spec.method.value} has none",
                f"leave {FIELD} empty, or use method: lora, dora or qlora",
            )
        )
    if spec.loraplus_lr_ratio is not None and spec.optim is Optim.ADAFACTOR:
        out.append(
            Problem(
                FIELD,
                "LoRA+ is built here on AdamW (torch or bitsandbytes 8-bit); adafactor sets its own step sizes",
                "use optim: adamw_torch or adamw_bnb_8bit with LoRA+",
            )
        )
    return out


DOCS = (
    DocsRow(
        "LoRA+",
        "`loraplus_lr_ratio`",
        "none",
        "up to 2x fewer steps",
        "published (LoRA+ paper)",
    ),
)  # docs/memory.md's table of tricks (tests/test_trick_homes.py keeps them equal)

TRICK = TrickRecord(FIELD, FIELDS, SUMMARY, combination_problems=combination_problems, speed_field=False, docs=DOCS)
