"""The token view of orpo's, cpo's and the reward trainer's preference rows: each side as trl tokenizes it.

- orpo, cpo (`trl.experimental`): the trainer's own preparation, run on a stand-in trainer that holds what it
  reads (`maybe_extract_prompt`, `maybe_apply_chat_template`, then `tokenize_row`: the prompt with BOS, each
  answer with EOS, the answer cut so that prompt + answer fit max_length; the prompt is never cut). Run twice:
  with max_length (what training sees, whose labels mark the trained tokens) and without (to show what the cut
  removes). Both trainers' preference terms read the answers' labels (-100 on the prompt); cpo's NLL term reads the
  same labels of the chosen side, while orpo's NLL term is computed over the whole chosen sequence
  (`concatenated_forward`: its input ids where the attention mask is 1), so orpo trains the chosen prompt too.
- reward: `RewardTrainer._prepare_dataset` (EOS added to plain-text answers, the prompt joined to each answer, the
  chat template for conversations), run once without max_length (the tokens) and once with it (trl drops a row
  whose chosen or rejected side is longer; it never cuts). A reward model has no token labels: the score head
  reads each whole sequence and the loss compares the chosen score with the rejected one, so no token is marked
  trained and the row says so.

    views = pair_views(spec, rows, tokenizer)     # spec.trainer: orpo, cpo or reward
"""

from __future__ import annotations

import sys
from typing import Any

from jobs.data.tokens.marks import RowView, TokenSequence, token_of
from jobs.spec.enums import Trainer
from jobs.spec.job import JobSpec
from jobs.spec.trainer_records import record_for

SIDES = ("chosen", "rejected")
NO_LABELS = (
    "a reward model has no token labels: its score head scores each whole sequence, and the loss ranks the chosen "
    "score above the rejected one"
)


def pair_views(spec: JobSpec, rows: list[dict[str, Any]], tokenizer: Any, config: Any) -> list[RowView]:
    """Each preference row as `spec`'s trainer builds it (`config`: its trl config, max_length set as training
    sets it)."""
    if record_for(spec.trainer).token_view == "reward":
        return _reward_views(spec, rows, tokenizer, config)
    return _odds_views(spec, rows, tokenizer, config)


def _dataset(rows: list[dict[str, Any]]) -> Any:
    import datasets

    return datasets.Dataset.from_list(rows)


def _stand_in(spec: JobSpec) -> Any:
    """The spec's trl trainer, not initialised: the caller sets what its preparation reads."""
    cls: Any = record_for(spec.trainer).trainer_type()
    return cls.__new__(cls)


# ------------------------------------------------------------------------------ orpo, cpo
def _tokenized(spec: JobSpec, rows: list[dict[str, Any]], tokenizer: Any, max_length: int) -> list[dict[str, Any]]:
    """`tokenize_row` of each row, after the trainer's `__init__` steps before it, on a stand-in trainer."""
    from trl.data_utils import maybe_apply_chat_template, maybe_extract_prompt

    trainer = _stand_in(spec)
    trainer.processing_class, trainer.is_encoder_decoder = tokenizer, False  # tunedeck trains causal LMs
    trainer.max_length, trainer.max_completion_length = max_length, None
    ds = _dataset(rows).map(maybe_extract_prompt)
    ds = ds.map(maybe_apply_chat_template, fn_kwargs={"processing_class": tokenizer})
    return [trainer.tokenize_row(dict(example)) for example in ds]


def _odds_views(spec: JobSpec, rows: list[dict[str, Any]], tokenizer: Any, config: Any) -> list[RowView]:
    max_length = config.max_length if config.max_length is not None else 512  # as the trainer's __init__ sets it
    kept_rows = _tokenized(spec, rows, tokenizer, max_length)
    whole_rows = _tokenized(spec, rows, tokenizer, sys.maxsize)
    whole_prompt = record_for(spec.trainer).token_view == "orpo"  # its NLL term: the whole chosen sequence
    special = set(tokenizer.all_special_ids)
    out = []
    for i, (kept, whole) in enumerate(zip(kept_rows, whole_rows, strict=True)):
        sequences = []
        for side in SIDES:
            ids, every = list(kept[f"{side}_input_ids"]), list(whole[f"{side}_input_ids"])  # trl keeps the start
            labels = kept[f"{side}_labels"]
            attended = kept[f"{side}_attention_mask"]
            trained = {n for n, label in enumerate(labels) if label != -100}
            if whole_prompt and side == "chosen":
                trained |= {n for n, bit in enumerate(attended) if bit == 1}
            tokens = tuple(token_of(tokenizer, t, n in trained, n >= len(ids), special) for n, t in enumerate(every))
            sequences.append(TokenSequence(side, tokens))
        n_prompt = len(kept["prompt_input_ids"])
        untrained = all(label == -100 for side in SIDES for label in whole[f"{side}_labels"]) and not whole_prompt
        notes = _odds_notes(spec, kept, n_prompt, max_length, whole_prompt)
        out.append(RowView(i, tuple(sequences), untrained=untrained, prompt_tokens=n_prompt, notes=notes))
    return out


def _odds_notes(spec: JobSpec, kept: dict[str, Any], n_prompt: int, max_length: int, whole_prompt: bool) -> list[str]:
    notes = []
    if whole_prompt:
        notes.append("orpo's NLL term trains the chosen side's prompt too; its odds-ratio term reads both answers")
    if not kept["chosen_labels"] or all(label == -100 for label in kept["chosen_labels"]):
        notes.append(
            f"the prompt alone fills max_length {max_length}: {Trainer(spec.trainer).value} keeps its {n_prompt} "
            "tokens whole and cuts every answer token"
        )
    return notes


# ------------------------------------------------------------------------------ reward
def _reward_views(spec: JobSpec, rows: list[dict[str, Any]], tokenizer: Any, config: Any) -> list[RowView]:
    import copy

    trainer = _stand_in(spec)
    marked = [{**row, "__view_row": i} for i, row in enumerate(rows)]
    whole = copy.copy(config)
    whole.max_length = None
    tokenized = list(trainer._prepare_dataset(_dataset(marked), tokenizer, whole, "view"))
    if config.max_length is None:
        survivors = {row["__view_row"] for row in tokenized}
    else:
        survivors = {row["__view_row"] for row in trainer._prepare_dataset(_dataset(marked), tokenizer, config, "view")}
    special = set(tokenizer.all_special_ids)
    out = []
    for example in tokenized:
        sides = []
        for side in SIDES:
            ids = list(example[f"{side}_ids"])
            sides.append(TokenSequence(side, tuple(token_of(tokenizer, t, False, False, special) for t in ids)))
        dropped = example["__view_row"] not in survivors
        over = f"a side is over max_length {config.max_length}: trl drops such rows whole, it never cuts them"
        notes = [NO_LABELS, over] if dropped else [NO_LABELS]
        out.append(RowView(int(example["__view_row"]), tuple(sides), dropped=dropped, notes=notes))
    return out
