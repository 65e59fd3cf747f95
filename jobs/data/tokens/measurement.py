"""Measuring the training rows' token lengths with the model's tokenizer, once per data, tokenizer and trainer.

The rows are the ones training will see (`jobs.data.loading.load_data`: columns mapped, Alpaca and
ShareGPT converted, eval_split held out, max_train_samples applied), each turned into the sequence(s)
its trainer tokenizes (`sequences`: sft the text, prompt+completion or the rendered conversation,
plus EOS; dpo, orpo, cpo, reward prompt+chosen and prompt+rejected; kto prompt+completion; grpo the
prompt as it generates from it: with the template's generation prompt, without EOS) and tokenized in batches, untruncated, with the shortcuts of `jobs.data.tokens.shortcuts`
where they apply. Each row's prompt (`prompt_sequence`) is measured too. The result is cached in
`$TUNEDECK_HOME/cache/lengths/` (`TUNEDECK_CACHE_DIR` moves it) under a key made of the data files'
contents, the spec fields that choose the rows, and the tokenizer's files, so a second check (another
max_length, batch size or method) reads about a megabyte instead of tokenizing again.

    folder = tokenizer_folder(spec.model)
    lengths = cached_lengths(spec, folder)                 # RowLengths, or None: not measured yet
    if lengths is None:
        loaded = load_data(spec)
        lengths = measure(loaded.train, local_tokenizer(spec.model), spec.trainer, loaded.origins)
        save_lengths(spec, folder, lengths)

    length_warnings(train_ds, tokenizer, spec.max_length, trainer=spec.trainer)   # before training, on a sample
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from jobs.data.bulk import collector_paused
from jobs.data.digests import file_digest
from jobs.data.tokens.lengths import RowLengths
from jobs.data.tokens.shortcuts import CountMismatch, Shortcuts
from jobs.data.tool_turns import row_tools
from jobs.spec.enums import DEFAULT_TRAINER, Trainer
from jobs.spec.job import JobSpec
from jobs.spec.mixture import DataSource
from jobs.spec.trainer_records import record_for

if TYPE_CHECKING:
    import datasets

log = logging.getLogger(__name__)

# bump when what a cached length means changes (2: each row's prompt length kept too; 3: tools rendered;
# 4: each row's origin kept too; 5: image rows count each image's tokens, jobs.memory.vision; 6: a generating
# trainer's prompts counted as it tokenizes them, with the generation prompt and no EOS)
CACHE_VERSION = "6"
BATCH_ROWS = 2048
# With the shortcuts (`Shortcuts`), every this-many-th sequence is also measured the library's way, as a check.
VERIFY_EVERY = 256
# The spec fields that decide which rows training sees and how they are turned into sequences.
ROW_FIELDS = ("dataset", "dataset_columns", "eval_split", "seed", "max_train_samples", "trainer", "dedupe", "thinking")


def cached_lengths(spec: JobSpec, tokenizer_dir: Path | None, cache: Path | None = None) -> RowLengths | None:
    """The lengths measured earlier for these rows and this tokenizer (`tokenizer_dir`: its files), or None."""
    path = _cache_path(spec, tokenizer_dir, cache)
    if path is None or not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as saved:
            origins = saved["origins"]
            return RowLengths(saved["lengths"], saved["prompts"], origins if origins.size else None)
    except (OSError, ValueError, KeyError):
        log.warning("unreadable length cache %s: measuring again", path, exc_info=True)
        return None


def save_lengths(spec: JobSpec, tokenizer_dir: Path | None, lengths: RowLengths, cache: Path | None = None) -> None:
    """Keep `lengths` for the next check of these rows with this tokenizer (nothing without a tokenizer folder)."""
    path = _cache_path(spec, tokenizer_dir, cache)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    with partial.open("wb") as out:
        origins = lengths.origins if lengths.origins is not None else np.zeros((0, 2), dtype=np.int64)
        np.savez(out, lengths=lengths.lengths, prompts=lengths.prompt_lengths(), origins=origins)
    partial.replace(path)  # whole or not at all: another check may read it at the same time


def _cache_path(spec: JobSpec, tokenizer_dir: Path | None, cache: Path | None) -> Path | None:
    key = cache_key(spec, tokenizer_dir) if tokenizer_dir is not None else None
    return (cache if cache is not None else _cache_dir()) / f"{key}.npz" if key else None


def measure(ds: Any, tokenizer: Any, trainer: Trainer, origins: np.ndarray | None = None) -> RowLengths:
    """Token lengths of every row of `ds` (a datasets.Dataset or a list of row dicts), per sequence; `origins`:
    each row's (source index, row number), kept with them (`jobs.data.loading.LoadedData.origins`)."""
    with collector_paused():  # every row is kept while the texts are made (jobs.data.bulk)
        found = _measure_rows(ds.to_list() if hasattr(ds, "to_list") else list(ds), tokenizer, trainer)
    return found if origins is None else RowLengths(found.lengths, found.prompts, origins)


def _measure_rows(rows: list[dict[str, Any]], tokenizer: Any, trainer: Trainer) -> RowLengths:
    trainer = Trainer(trainer)
    fast = Shortcuts.of(tokenizer)
    if fast is not None:
        try:
            return _measure(rows, tokenizer, trainer, fast)
        except CountMismatch as exc:  # proven for the known tokenizers and templates; still never trusted blindly
            log.warning("the shortcuts disagreed with the tokenizer (%s): measuring the library's way", exc)
    return _measure(rows, tokenizer, trainer, None)


def _measure(rows: list[dict[str, Any]], tokenizer: Any, trainer: Trainer, fast: Shortcuts | None) -> RowLengths:
    eos = getattr(tokenizer, "eos_token", None) or ""
    generates = record_for(trainer).generates  # its sequences are prompts, which it renders for generation
    out: list[list[int]] = []
    prompts: list[int] = []
    for start in range(0, len(rows), BATCH_ROWS):
        batch = rows[start : start + BATCH_ROWS]
        chunk = [sequences(row, trainer) for row in batch]
        tools = [row_tools(row) for row in batch]  # each row's tool schemas go to the template with its turns
        flat = [seq for row in chunk for seq in row]
        counts = _count(
            flat, tokenizer, eos, fast, prompts=generates, tools=[t for row, t in zip(chunk, tools) for _ in row]
        )
        i = 0
        for row in chunk:
            out.append(counts[i : i + len(row)])
            i += len(row)
        heads = [prompt_sequence(row, trainer) for row in batch]
        found = [h for h in heads if h is not None]
        head_tools = [t for h, t in zip(heads, tools) if h is not None]
        head_counts = iter(_count(found, tokenizer, eos, fast, prompts=True, tools=head_tools) if found else [])
        prompts += [next(head_counts) if h is not None else 0 for h in heads]
    return RowLengths.of(out, prompts)


def sequences(row: dict[str, Any], trainer: Trainer) -> list[str | list[dict[str, Any]]]:
    """The sequence(s) the trainer builds from one row: a string, or a conversation to render."""
    if "messages" in row:
        return [row["messages"]]
    if "text" in row:
        return [row["text"]]
    if record_for(trainer).generates:
        return [row["prompt"]]  # a grpo row is prompt-only: the data checks refuse rows without one
    prompt = row.get("prompt")
    answers = [row[c] for c in ("completion", "chosen", "rejected") if c in row]
    if prompt is None:
        return answers  # a reward pair with the prompt inside each answer
    return [prompt + a for a in answers]  # strings joined, or conversations continued


def prompt_sequence(row: dict[str, Any], trainer: Trainer) -> str | list[dict[str, Any]] | None:
    """What comes before the answer in the trainer's sequences: the prompt, or a chat's turns before its first
    assistant turn; None where nothing does (text rows, reward pairs without a prompt, grpo)."""
    if record_for(trainer).generates or "text" in row:
        return None
    if "messages" in row:
        messages = row["messages"]
        first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), 0)
        return messages[:first] or None
    prompt = row.get("prompt")
    return prompt if prompt else None


def _count(
    seqs: list[Any],
    tokenizer: Any,
    eos: str,
    fast: Shortcuts | None,
    prompts: bool = False,
    tools: list[list[dict[str, Any]] | None] | None = None,
) -> list[int]:
    """Token counts of strings (trl appends EOS to plain text) and conversations (chat template). With shortcuts,
    every VERIFY_EVERY-th sequence is also rendered and counted the library's way, and must agree.

    `prompts`: the sequences are prompts, as trl tokenizes them on their own: strings without EOS,
    conversations with the generation prompt (the assistant's header) that the answer follows.
    `tools`: each sequence's tool schemas (None: none), rendered by the template as trl renders them."""
    render = fast.render if fast is not None and fast.render is not None else None
    counter = fast.counter if fast is not None else None
    tools = tools if tools is not None else [None] * len(seqs)
    texts: list[str] = []
    special: list[bool] = []
    for seq, schemas in zip(seqs, tools):
        if isinstance(seq, list):
            texts.append(
                render(seq, prompts, schemas) if render is not None else _render(seq, tokenizer, prompts, schemas)
            )
            special.append(not getattr(tokenizer, "chat_template", None))
        else:
            texts.append(seq if prompts or not eos or seq.endswith(eos) else seq + eos)
            special.append(True)
    counts = [0] * len(texts)
    for flag in (True, False):
        idx = [i for i, s in enumerate(special) if s is flag]
        if not idx:
            continue
        some = [texts[i] for i in idx]
        for i, n in zip(idx, counter.counts(some, flag) if counter is not None else _library(some, tokenizer, flag)):
            counts[i] = n
    if fast is not None:
        for i in range(0, len(seqs), VERIFY_EVERY):
            seq = seqs[i]
            text = _render(seq, tokenizer, prompts, tools[i]) if isinstance(seq, list) else texts[i]
            theirs = _library([text], tokenizer, special[i])[0]
            if theirs != counts[i]:
                raise CountMismatch(f"{counts[i]} tokens where the tokenizer counts {theirs} in {text[:80]!r}")
    return counts


def _library(texts: list[str], tokenizer: Any, flag: bool) -> list[int]:
    ids = tokenizer(texts, add_special_tokens=flag, return_attention_mask=False)["input_ids"]
    return [len(one) for one in ids]


def _render(
    messages: list[dict[str, Any]], tokenizer: Any, generation: bool = False, tools: list[Any] | None = None
) -> str:
    if getattr(tokenizer, "chat_template", None):
        more: dict[str, Any] = {"add_generation_prompt": True} if generation else {}  # not every tokenizer takes it
        if tools:
            more["tools"] = tools
        return tokenizer.apply_chat_template(messages, tokenize=False, **more)
    return "\n".join(str(m.get("content", "")) for m in messages)


def cache_key(spec: JobSpec, folder: Path) -> str | None:
    """A digest of what the lengths depend on (`folder`: the tokenizer's files); None when the data cannot be
    found (then nothing is cached)."""
    from jobs.data.sources import DataError, resolve

    digest = hashlib.sha256(f"v{CACHE_VERSION}".encode())
    for name in ROW_FIELDS:
        digest.update(f"{name}={getattr(spec, name)!r};".encode())
    sources: Sequence[DataSource | None] = spec.dataset_sources or [None]
    for listed in sources:  # every source's contents (the text above holds the caps)
        if listed is None:
            return None  # a `dataset` that cannot be read is no data to measure
        try:
            source = resolve(listed.ref, "dataset")
        except DataError:
            return None
        if source.path is not None:
            digest.update(file_digest(source.path))
        else:
            digest.update(f"hub:{source.hub}".encode())
    digest.update(spec.model.encode())
    for file in sorted(folder.iterdir()):
        if file.is_file() and ("token" in file.name or "chat_template" in file.name or file.name == "vocab.json"):
            digest.update(file.name.encode())
            digest.update(file_digest(file))
    return digest.hexdigest()[:32]


def _cache_dir() -> Path:
    from storage.settings import cache_dir

    return cache_dir() / "lengths"


def length_warnings(
    ds: datasets.Dataset,
    tokenizer: Any,
    max_length: int | None,
    sample_size: int = 1000,
    trainer: Trainer = DEFAULT_TRAINER,
) -> list[str]:
    """Warn how many rows exceed `max_length` tokens; measures at most `sample_size` rows (cheap).

    The reward trainer drops such rows (trl filters them out) where the others truncate them."""
    if record_for(trainer).generates:
        return []  # grpo keeps prompts whole (GRPOConfig has no max_length); completions stop at max_completion_length
    fate = "dropped (the reward trainer filters them out)" if record_for(trainer).drops_long_rows else "truncated"
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
