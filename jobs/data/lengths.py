"""How many rows of a data set are longer than `max_length` tokens: a cheap warning before training.

warnings = length_warnings(train_ds, tokenizer, spec.max_length, trainer=spec.trainer)
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any

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
        lengths = [
            max(len(tokenizer(t, add_special_tokens=special)["input_ids"]) for t, special in _texts(row, tokenizer))
            for row in rows
        ]
    except Exception as exc:  # noqa: BLE001 - a warning helper must never stop training; any tokenizer's or
        # chat template's own error (their code, not ours) is logged with its traceback and becomes the warning
        log.warning("could not measure row lengths", exc_info=True)
        return [f"could not measure row lengths ({type(exc).__name__}: {exc})"]
    over = sum(1 for length in lengths if length > max_length)
    if not over:
        return []
    if sampled:
        return [
            f"about {round(over / len(lengths) * n)} of {n} rows (estimated from {len(lengths)}) are longer "
            f"than max_length {max_length} tokens and will be {fate}"
        ]
    return [f"{over} of {n} rows are longer than max_length {max_length} tokens and will be {fate}"]


def _texts(row: dict[str, Any], tokenizer: Any) -> list[tuple[str, bool]]:
    """The full sequence(s) trl will tokenize for one row, and whether to add special tokens."""
    if "messages" in row:
        return [_render(row["messages"], tokenizer)]
    if "text" in row:
        return [(row["text"], True)]
    answers = [row[c] for c in ("completion", "chosen", "rejected") if c in row]
    if isinstance(row["prompt"], list):
        return [_render(row["prompt"] + a, tokenizer) for a in answers]
    return [(row["prompt"] + a, True) for a in answers]


def _render(messages: list[dict[str, str]], tokenizer: Any) -> tuple[str, bool]:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False), False
    return "\n".join(m["content"] for m in messages), True
