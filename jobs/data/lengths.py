"""How many rows of a data set are longer than `max_length` tokens: a cheap warning before training.

The rows are measured as the memory prediction measures them (`jobs.data.row_tokens.measure`), on a
sample of at most `sample_size` rows.

warnings = length_warnings(train_ds, tokenizer, spec.max_length, trainer=spec.trainer)
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any

from jobs.data.row_tokens import measure
from jobs.spec.enums import Trainer

if TYPE_CHECKING:
    import datasets

log = logging.getLogger(__name__)


def length_warnings(
    ds: datasets.Dataset,
    tokenizer: Any,
    max_length: int | None,
    sample_size: int = 1000,
    trainer: Trainer = Trainer.SFT,
) -> list[str]:
    """Warn how many rows exceed `max_length` tokens; measures at most `sample_size` rows (cheap).

    The reward trainer drops such rows (trl filters them out) where the others truncate them."""
    if Trainer(trainer) is Trainer.GRPO:
        return []  # grpo keeps prompts whole (GRPOConfig has no max_length); completions stop at max_completion_length
    fate = "dropped (the reward trainer filters them out)" if Trainer(trainer) is Trainer.REWARD else "truncated"
    n = len(ds)
    if not n or not max_length:
        return []
    sampled = n > sample_size
    rows = ds.select(sorted(random.Random(0).sample(range(n), sample_size))) if sampled else ds
    try:
        measured = measure(rows, tokenizer, Trainer(trainer))
    except Exception as exc:  # noqa: BLE001 - a warning helper must never stop training; any tokenizer's or
        # chat template's own error (their code, not ours) is logged with its traceback and becomes the warning
        log.warning("could not measure row lengths", exc_info=True)
        return [f"could not measure row lengths ({type(exc).__name__}: {exc})"]
    over = measured.stats(max_length).truncated
    if not over:
        return []
    if sampled:
        return [
            f"about {round(over / measured.rows * n)} of {n} rows (estimated from {measured.rows}) are longer "
            f"than max_length {max_length} tokens and will be {fate}"
        ]
    return [f"{over} of {n} rows are longer than max_length {max_length} tokens and will be {fate}"]
