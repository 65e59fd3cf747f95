"""The token view of image rows (sft's image chat, dpo's image pairs): what trl's vision collator builds, marked.

trl builds image rows on the fly, in its collator (`DataCollatorForVisionLanguageModeling`): the processor applies
the chat template to the row's content parts, expands each image token to one token per image feature, and
truncates at max_length (the start kept); the label of every token is its id, -100 on padding and, with
assistant_only_loss, outside the assistant's turns. The view runs that collator on each row alone, set as
SFTTrainer sets it (max_length, assistant_only_loss, completion_only_loss, the training chat template), with the
model's processor (the caller's, its pixel budget set as training sets it): once without max_length, to show the tokens the cut removes, and once as training runs it,
whose labels mark the trained tokens. Each image's run of placeholder tokens is one block (`image_blocks`).

dpo's image pairs go through `DataCollatorForVisionPreference` the same way (`image_pair_views`): the chosen and
the rejected sequence, trained where its completion_mask is 1.

    views = image_views(spec, rows, processor)   # rows with `images` (or `image`) and `messages`
    views = image_pair_views(spec, rows, processor)   # dpo: prompt/chosen/rejected rows with `images`
"""

from __future__ import annotations

import copy
from typing import Any

from jobs.data.tokens.marks import RowView, TokenSequence, ViewUnavailable, token_of
from jobs.spec.job import JobSpec


def image_views(spec: JobSpec, rows: list[dict[str, Any]], tokenizer: Any) -> list[RowView]:
    """Each image row as the vision collator builds it; `tokenizer`: the model's processor
    (`jobs.models.tokenizer.local_processing_class`, its pixel budget set)."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    if not hasattr(tokenizer, "image_processor"):
        raise ViewUnavailable(
            "model", f"image rows are built by a vision-language model's processor, and {spec.model} has none here"
        )
    processor = tokenizer
    if spec.assistant_only_loss and not has_generation_markers(processor.chat_template):
        template = get_training_chat_template(processor)
    else:
        template = None
    # training sets it False for image chat rows (jobs.train.training: trl's vision collator refuses it there)
    completion_only = spec.completion_only_loss and "messages" not in rows[0]

    def collator(max_length: int | None) -> Any:
        return DataCollatorForVisionLanguageModeling(
            processor=processor, max_length=max_length, completion_only_loss=completion_only,
            assistant_only_loss=spec.assistant_only_loss, chat_template=template,
        )  # fmt: skip

    whole, trained_run = collator(None), collator(spec.max_length)
    text = processor.tokenizer
    special = set(text.all_special_ids)
    image_id = getattr(processor, "image_token_id", None)
    out = []
    for i, row in enumerate(rows):
        example = _decoded(row)
        built = whole([copy.deepcopy(example)])
        ids = built["input_ids"][0].tolist()
        labels = trained_run([copy.deepcopy(example)])["labels"][0].tolist()
        trained = {j for j, label in enumerate(labels) if label != -100}
        tokens = tuple(token_of(text, t, n in trained, n >= len(labels), special) for n, t in enumerate(ids))
        blocks = _blocks(ids, image_id)
        notes = [f"{len(blocks)} image(s): {', '.join(str(n) for _, n in blocks)} image tokens"] if blocks else []
        seq = TokenSequence("text", tokens, image_blocks=blocks)
        untrained = all(label == -100 for label in built["labels"][0].tolist())  # trl drops no image row
        out.append(RowView(i, (seq,), untrained=untrained, notes=notes))
    return out


def image_pair_views(spec: JobSpec, rows: list[dict[str, Any]], tokenizer: Any) -> list[RowView]:
    """Each dpo image pair as trl's `DataCollatorForVisionPreference` builds it with the model's processor: the
    prompt (its images expanded) then the chosen, and then the rejected, answer; trained where its completion_mask
    is 1. Run once without max_length (every token) and once as training runs it (the start kept, as trl requires
    for images)."""
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    if not hasattr(tokenizer, "image_processor"):
        raise ViewUnavailable(
            "model", f"image pairs are built by a vision-language model's processor, and {spec.model} has none here"
        )
    whole = DataCollatorForVisionPreference(processor=tokenizer, max_length=None)
    trained_run = DataCollatorForVisionPreference(processor=tokenizer, max_length=spec.max_length)
    text = tokenizer.tokenizer
    special = set(text.all_special_ids)
    image_id = getattr(tokenizer, "image_token_id", None)
    out = []
    for i, row in enumerate(rows):
        example = _decoded(row)
        built, run = whole([copy.deepcopy(example)]), trained_run([copy.deepcopy(example)])
        sequences = []
        for k, side in enumerate(("chosen", "rejected")):  # the collator's rows: chosen, then rejected
            ids = built["input_ids"][k][: int(built["attention_mask"][k].sum())].tolist()
            kept = int(run["attention_mask"][k].sum())
            trained = {j for j, bit in enumerate(run["completion_mask"][k].tolist()[:kept]) if bit}
            tokens = tuple(token_of(text, t, n in trained, n >= kept, special) for n, t in enumerate(ids))
            sequences.append(TokenSequence(side, tokens, image_blocks=_blocks(ids, image_id)))
        blocks = sequences[0].image_blocks
        notes = [f"{len(blocks)} image(s): {', '.join(str(n) for _, n in blocks)} image tokens"] if blocks else []
        n_prompt = int(built["attention_mask"][0].sum() - built["completion_mask"][0].sum())
        out.append(RowView(i, tuple(sequences), prompt_tokens=n_prompt, notes=notes))
    return out


def _decoded(row: dict[str, Any]) -> dict[str, Any]:
    """The row as training's data loader gives it to the collator: its images opened (PIL), as `datasets` decodes
    its Image columns (the rows given hold their paths or bytes)."""
    import datasets

    image = datasets.Image()
    example = dict(row)
    for key in ("image", "images"):
        if key in example:
            found = example[key]
            many = found if isinstance(found, list) else [found]
            opened = [image.decode_example({"path": x, "bytes": None} if isinstance(x, str) else x) for x in many]
            example[key] = opened if isinstance(found, list) else opened[0]
    return example


def _blocks(ids: list[int], image_id: int | None) -> tuple[tuple[int, int], ...]:
    """(first position, length) of each run of the image token."""
    runs: list[tuple[int, int]] = []
    for n, t in enumerate(ids):
        if t != image_id:
            continue
        if runs and runs[-1][0] + runs[-1][1] == n:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((n, 1))
    return tuple(runs)
