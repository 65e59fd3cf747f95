"""What the model is trained on: each training row as the tokens trl builds, each marked in the loss or masked.

The sequences come from trl's own code, never re-derived: the installed trainer's dataset preparation
(`SFTTrainer._prepare_dataset`, `DPOTrainer._prepare_dataset`, `KTOTrainer._prepare_dataset`, run on a stand-in
trainer that holds only what those methods read: the tokenizer, the chat template trl picks and the completion-only
choice, set as the trainer's `__init__` sets them) and its collator (`DataCollatorForLanguageModeling`,
`DataCollatorForPreference`, `DataCollatorForUnpairedPreference`), on the given rows only, with the tokenizer
alone (no model weights).

- sft: the text (EOS added), the prompt/completion join or the rendered conversation; in the loss where the
  collator's label is not -100 (completion_only_loss, assistant_only_loss, padding-free's first token).
  Preparation runs without max_length so the tokens past it can be shown: the cut is trl's own slice
  (`truncation_mode`, or packing's "bfd" which keeps the start), and a row left with nothing trained is
  one trl drops (`dropped`).
- dpo: the prompt, then the chosen and the rejected answer, each as prompt + answer; in the loss where the
  preference collator's `completion_mask` is 1; a prompt of max_length tokens or more is dropped by trl.
- kto: prompt + completion with the row's label (desirable or not), in the loss where the unpaired
  collator's `completion_mask` is 1. A prompt/chosen/rejected row is shown as the two rows trl's own
  unpairing (`unpair_preference_dataset`, inside `KTOTrainer._prepare_dataset`) makes of it: the chosen
  answer desirable, the rejected one undesirable, each prepared and collated as an unpaired row.
- sft image rows (`image`/`images`): trl's `DataCollatorForVisionLanguageModeling` run on the row with the
  model's processor, as SFTTrainer sets it up; in the loss where its label is not -100. Each image's run of
  placeholder tokens (the processor expands the image token to one per image feature) is one `image_blocks` entry.
- dpo image pairs: trl's `DataCollatorForVisionPreference` run on the row with the model's processor, the chosen and
  the rejected sequence, in the loss where its `completion_mask` is 1 (`image_view.image_pair_views`).
- grpo: the prompt the model completes, as the trainer's own `GRPOTrainer._tokenize_prompts` tokenizes it (chat
  prompts through the chat template with the generation prompt and the config's `chat_template_kwargs`; string
  prompts by the tokenizer, its special tokens added), whole: trl 1.16 has no prompt truncation. Every token is
  masked: the loss is on the completions sampled from it (at most max_completion_length tokens each), scored by
  the rewards, which no row holds.
- orpo, cpo, reward (`jobs.data.tokens.pair_views`): the chosen and the rejected side as the trainer's own
  tokenization builds them. orpo/cpo: `tokenize_row` (the answer cut to fit max_length, the prompt kept whole), in
  the loss where its labels are not -100, and for orpo the whole chosen sequence (its NLL term); reward: the ids
  `RewardTrainer._prepare_dataset` gives, none trained (a reward model has no token labels), a row with a side
  over max_length dropped as trl filters it.

    views = token_views(spec, rows, tokenizer)     # one RowView per row, in order
    views[0].sequences[0].tokens[3].trained          # True: this token is in the loss
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from jobs.data.tokens.marks import RowView, Token, TokenSequence, ViewUnavailable, token_of
from jobs.spec.enums import Trainer
from jobs.spec.job import JobSpec
from jobs.spec.trainer_records import record_for

__all__ = ["RowView", "Token", "TokenSequence", "ViewUnavailable", "data_kwargs", "token_views"]

# The SFTConfig/DPOConfig keywords that decide which tokens a row becomes and which of them are trained.
DATA_KWARGS = ("max_length", "packing", "completion_only_loss", "assistant_only_loss", "padding_free")


def token_views(spec: JobSpec, rows: Sequence[dict[str, Any]], tokenizer: Any) -> list[RowView]:
    """Each of `rows` (training rows as `jobs.data.loading.load_data` gives them) as `spec`'s trainer builds it."""
    trainer = Trainer(spec.trainer)
    view = record_for(trainer).token_view
    if not view:
        covered = ", ".join(t.value for t in Trainer if record_for(t).token_view)
        raise ViewUnavailable("trainer", f"the token view covers the {covered} trainers, not {trainer.value}")
    if not rows:
        return []
    images = "image" in rows[0] or "images" in rows[0]  # trl's vision collators build those rows on the fly
    if images and view != "sft" and not record_for(trainer).image_pairs:
        raise ViewUnavailable(
            "dataset", f"the token view shows sft's image rows and dpo's pairs, not {trainer.value}'s"
        )
    with _quiet():
        if images:
            from jobs.data.tokens.image_view import image_pair_views, image_views

            return (image_views if view == "sft" else image_pair_views)(spec, list(rows), tokenizer)
        tokenizer = _with_pad(getattr(tokenizer, "tokenizer", tokenizer))  # a processor's own tokenizer for text rows
        if view in ("orpo", "cpo", "reward"):
            from jobs.data.tokens.pair_views import pair_views

            return pair_views(spec, list(rows), tokenizer, _config(spec))
        views = {"sft": _sft_views, "dpo": _dpo_views, "kto": _kto_views, "grpo": _grpo_views}[view]
        return views(spec, list(rows), tokenizer)


@contextmanager
def _quiet() -> Iterator[None]:
    """No progress bars for the few rows shown (datasets draws one per preparation step)."""
    from datasets.utils import logging as datasets_logging

    shown = datasets_logging.is_progress_bar_enabled()
    datasets_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            datasets_logging.enable_progress_bar()


def data_kwargs(spec: JobSpec) -> dict[str, Any]:
    """The trl config keywords of `spec` that shape the tokens: each spec field passed under its own name, as
    `jobs.config.mapping.training_kwargs` passes them (the trainer's record lists the ones its config takes)."""
    record = record_for(spec.trainer)
    keys = [k for k in DATA_KWARGS if k in ("max_length", "padding_free") or k in record.kwargs]
    return {k: getattr(spec, k) for k in keys if k not in record.unsupported}


def _config(spec: JobSpec, **override: Any) -> Any:
    import importlib
    import tempfile

    record = record_for(spec.trainer)
    cls = getattr(importlib.import_module(record.module), record.config_class)
    kw = {**data_kwargs(spec), **override}
    if cls.__name__ != "SFTConfig":
        kw = {k: v for k, v in kw.items() if k in ("max_length",)}
    return cls(output_dir=tempfile.gettempdir(), report_to="none", use_cpu=True, bf16=False, **kw)


def _with_pad(tokenizer: Any) -> Any:
    """trl's collators pad with the tokenizer's pad token, else its EOS (as training's loader sets it)."""
    if getattr(tokenizer, "pad_token", None) is None and getattr(tokenizer, "eos_token", None) is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _dataset(rows: list[dict[str, Any]]) -> Any:
    import datasets

    return datasets.Dataset.from_list(rows)


# ---------------------------------------------------------------------- sft
def _sft_stand_in(args: Any, tokenizer: Any, first: dict[str, Any]) -> Any:
    """An SFTTrainer holding what `_prepare_dataset` reads, set as its `__init__` sets it (trl 1.x)."""
    from trl import SFTTrainer
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    trainer = SFTTrainer.__new__(SFTTrainer)
    trainer._tokenizer = tokenizer
    if args.assistant_only_loss and not has_generation_markers(tokenizer.chat_template):
        trainer.chat_template = get_training_chat_template(tokenizer)
    else:
        trainer.chat_template = None
    if args.completion_only_loss is None:
        trainer.completion_only_loss = "prompt" in first and "completion" in first
    else:
        trainer.completion_only_loss = args.completion_only_loss
    trainer.padding_free = args.padding_free or (args.packing and args.packing_strategy in {"bfd", "bfd_split"})
    return trainer


def _sft_views(spec: JobSpec, rows: list[dict[str, Any]], tokenizer: Any) -> list[RowView]:
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    args = _config(spec)
    whole = _config(spec, max_length=None, packing=False, padding_free=False)  # every token, the cut shown by us
    trainer = _sft_stand_in(args, tokenizer, rows[0])
    try:
        prepared: list[dict[str, Any] | None] = list(
            trainer._prepare_dataset(_dataset(rows), tokenizer, whole, False, None, "view")
        )
    except RuntimeError:  # trl refuses rows with no assistant tokens under assistant_only_loss: find which
        prepared = [_one_sft_row(trainer, tokenizer, whole, row) for row in rows]
    collator = DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id, padding_free=trainer.padding_free)
    cut = _slice(args.max_length, "keep_start" if args.packing else args.truncation_mode)
    special = set(tokenizer.all_special_ids)
    out = []
    for i, example in enumerate(prepared):
        if example is None:
            out.append(RowView(i, (), dropped=True, untrained=True, notes=["trl refuses it: no assistant tokens"]))
            continue
        ids, labels = list(example["input_ids"]), list(example["labels"])
        kept = range(len(ids))[cut]
        batch = collator([{"input_ids": ids[cut], "labels": labels[cut]}])
        trained = {kept[j] for j, label in enumerate(batch["labels"][0].tolist()) if label != -100}
        tokens = tuple(token_of(tokenizer, t, n in trained, n not in kept, special) for n, t in enumerate(ids))
        dropped = not trained and not args.packing  # trl filters out rows left fully masked (not when packing)
        untrained = all(label == -100 for label in labels)
        out.append(RowView(i, (TokenSequence("text", tokens),), dropped=dropped, untrained=untrained))
    return out


def _one_sft_row(trainer: Any, tokenizer: Any, args: Any, row: dict[str, Any]) -> dict[str, Any] | None:
    """One row prepared alone; None when trl refuses it (assistant_only_loss and no assistant token)."""
    try:
        return next(iter(trainer._prepare_dataset(_dataset([row]), tokenizer, args, False, None, "view")))
    except RuntimeError:
        return None


def _slice(max_length: int | None, mode: str) -> slice:
    """trl's truncation (`SFTTrainer._prepare_dataset`, `DataCollatorForPreference`): the first or last tokens."""
    if max_length is None:
        return slice(None)
    return slice(None, max_length) if mode == "keep_start" else slice(-max_length, None)


# ---------------------------------------------------------------------- dpo
def _dpo_views(spec: JobSpec, rows: list[dict[str, Any]], tokenizer: Any) -> list[RowView]:
    from trl import DPOTrainer
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    args = _config(spec)
    trainer = DPOTrainer.__new__(DPOTrainer)
    trainer._tokenizer = tokenizer
    prepared = trainer._prepare_dataset(_dataset(rows), tokenizer, _config(spec, max_length=None), "view")
    collator = DataCollatorForPreference(
        pad_token_id=tokenizer.pad_token_id, max_length=args.max_length, truncation_mode=args.truncation_mode
    )
    special = set(tokenizer.all_special_ids)
    out = []
    for i, example in enumerate(prepared):
        batch = collator([example])
        sequences = []
        for name, k in (("chosen", 0), ("rejected", 1)):
            whole = list(example["prompt_ids"]) + list(example[f"{name}_ids"])
            mask = batch["completion_mask"][k].tolist()
            kept = range(len(whole))[_slice(args.max_length, args.truncation_mode)]
            trained = {kept[j] for j, bit in enumerate(mask[: len(kept)]) if bit}
            sequences.append(
                TokenSequence(
                    name,
                    tuple(token_of(tokenizer, t, n in trained, n not in kept, special) for n, t in enumerate(whole)),
                )
            )
        n_prompt = len(example["prompt_ids"])
        dropped = args.max_length is not None and args.truncation_mode == "keep_start" and n_prompt >= args.max_length
        untrained = not example["chosen_ids"] and not example["rejected_ids"]
        out.append(RowView(i, tuple(sequences), dropped=dropped, untrained=untrained, prompt_tokens=n_prompt))
    return out


# ---------------------------------------------------------------------- kto
VIEW_ROW = (
    "__view_row"  # each row's position, carried through trl's preparation (its unpairing copies it to both halves)
)


def _kto_views(spec: JobSpec, rows: list[dict[str, Any]], tokenizer: Any) -> list[RowView]:
    """Each row as KTOTrainer prepares it: a prompt/completion/label row is one sequence; a prompt/chosen/rejected
    row is the two rows trl's `unpair_preference_dataset` makes of it (chosen: label True, rejected: False), each
    prepared as an unpaired row."""
    from trl import KTOTrainer
    from trl.trainer.kto_trainer import DataCollatorForUnpairedPreference

    args = _config(spec)
    trainer = KTOTrainer.__new__(KTOTrainer)
    trainer._tokenizer, trainer.calculate_KL = tokenizer, False  # the KL pass pairs rows of a batch: not one row's
    marked = _dataset([{**row, VIEW_ROW: i} for i, row in enumerate(rows)])
    halves: dict[int, list[dict[str, Any]]] = {}
    for example in trainer._prepare_dataset(marked, tokenizer, _config(spec, max_length=None), "view"):
        halves.setdefault(int(example[VIEW_ROW]), []).append(example)
    collator = DataCollatorForUnpairedPreference(pad_token_id=tokenizer.pad_token_id, max_length=args.max_length)
    special = set(tokenizer.all_special_ids)
    paired = "chosen" in rows[0] and "rejected" in rows[0]  # as `_prepare_dataset` decides to unpair
    out = []
    for i in range(len(rows)):
        examples = sorted(halves[i], key=lambda e: not e["label"])  # the desirable (chosen) half first
        sequences, dropped, notes = [], [], []
        for example in examples:
            mask = collator([example])["completion_mask"][0].tolist()
            whole = list(example["prompt_ids"]) + list(example["completion_ids"])
            kept = range(len(whole))[_slice(args.max_length, "keep_start")]  # the collator keeps the start
            trained = {kept[j] for j, bit in enumerate(mask[: len(kept)]) if bit}
            tokens = tuple(token_of(tokenizer, t, n in trained, n not in kept, special) for n, t in enumerate(whole))
            label = "desirable" if example["label"] else "undesirable"
            name = f"{'chosen' if example['label'] else 'rejected'} ({label})" if paired else f"completion ({label})"
            sequences.append(TokenSequence(name, tokens))
            dropped.append(args.max_length is not None and len(example["prompt_ids"]) >= args.max_length)
        if paired:
            notes.append("kto trains the chosen and the rejected answer as two rows: trl unpairs the pair")
        if any(dropped) and not all(dropped):
            side = sequences[dropped.index(True)].name
            notes.append(f"trl drops the {side} row: its prompt alone fills max_length {args.max_length}")
        untrained = not any(e["completion_ids"] for e in examples)
        n_prompt = len(examples[0]["prompt_ids"])
        out.append(RowView(i, tuple(sequences), all(dropped), untrained, prompt_tokens=n_prompt, notes=notes))
    return out


# ---------------------------------------------------------------------- grpo
def _grpo_views(spec: JobSpec, rows: list[dict[str, Any]], tokenizer: Any) -> list[RowView]:
    """Each row's prompt as GRPO generates from it, every token masked (the loss is on the sampled completions)."""
    from trl import GRPOTrainer

    trainer = GRPOTrainer.__new__(GRPOTrainer)  # what `_tokenize_prompts` reads, as `__init__` sets it
    trainer.processing_class, trainer._tokenizer, trainer._is_vlm = tokenizer, tokenizer, False
    trainer.environment_factories, trainer.chat_template = None, None
    trainer.tools = []  # tunedeck passes no tools (trl renders `tools or None`)
    trainer.chat_template_kwargs = _config(spec).chat_template_kwargs or {}
    special = set(tokenizer.all_special_ids)
    note = (
        f"GRPO samples completions of at most {spec.max_completion_length} tokens after this prompt and trains on "
        "them as the rewards score them: no token of the row itself is in the loss"
    )
    out = []
    for i, row in enumerate(rows):
        ids = [int(t) for t in trainer._tokenize_prompts([row["prompt"]])[0][0]]
        tokens = tuple(token_of(tokenizer, t, False, False, special) for t in ids)
        out.append(RowView(i, (TokenSequence("prompt", tokens),), prompt_tokens=len(ids), notes=[note]))
    return out
