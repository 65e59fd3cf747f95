"""LoRA+ (`loraplus_lr_ratio`): the trainer's optimizer built by peft with B's learning rate raised.

peft's `create_loraplus_optimizer` needs the peft model, which trl creates inside the trainer, so the
optimizer is made after the trainer and handed to it before training (the Trainer makes its own only
when it has none). The arguments are the pure mapping `jobs.spec.tricks.loraplus.loraplus_kwargs`.

    attach_loraplus(trainer, spec)      # nothing when loraplus_lr_ratio is empty
"""

from __future__ import annotations

from typing import Any

from jobs.spec.enums import Optim
from jobs.spec.job import JobSpec
from jobs.spec.tricks.loraplus import loraplus_kwargs


def optimizer_class(optim: Optim) -> Any:
    """The optimizer class the Trainer would build for `optim` (AdamW, bitsandbytes' 8-bit or paged AdamW)."""
    import torch

    if optim is Optim.ADAMW:
        return torch.optim.AdamW
    import bitsandbytes as bnb

    return {
        Optim.ADAMW_8BIT: bnb.optim.AdamW8bit,
        Optim.PAGED_ADAMW_8BIT: bnb.optim.PagedAdamW8bit,
        Optim.PAGED_ADAMW_32BIT: bnb.optim.PagedAdamW32bit,
    }[optim]


def attach_loraplus(trainer: Any, spec: JobSpec) -> None:
    """Give `trainer` a LoRA+ optimizer when the spec asks for one (the checks refused other optimizers)."""
    kwargs = loraplus_kwargs(spec)
    if kwargs is None:
        return
    from peft.optimizers import create_loraplus_optimizer

    trainer.optimizer = create_loraplus_optimizer(trainer.model, optimizer_class(spec.optim), **kwargs)
