"""How long a prompt may be: the model's context, and a prompt's tokens counted before any model is given it.

    limit = context_length(result)          # 1024: the model's max_position_embeddings (None: not known here)
    problem = prompt_problem(result, ["You are brief.", "Hi"])   # None, or the count over the limit, with the fix

The context is the model's own (`max_position_embeddings` of the run's model config, the base model's when the
run is an adapter; else the tokenizer's `model_max_length`). The count is the messages' text with the run's saved
tokenizer (`tokenizer.json`, the `tokenizers` library: no model, no torch), special-token strings typed in the
text counted as the text they are (`jobs.chat.template`). A text too long to be within the limit whatever the
tokenizer does (more characters than the limit times the longest token) is refused uncounted, so a 10 MiB message
costs no more than reading it; a long text is counted a chunk at a time and the count stops past the limit. The chat template adds a few tokens of its own: the generation process checks the
templated prompt against the same limit again (`jobs.chat.generate.LoadedPair.inputs`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from jobs.errors import Problem

_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
CHUNK_CHARS = 65_536  # a long text is counted in pieces of this size, stopping once past the limit
_NO_LIMIT = 10**8  # a tokenizer's model_max_length at or past this is transformers' "unknown" (1e30)


def _config_context(path: Path) -> int | None:
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    for cfg in (config, config.get("text_config") or {}):
        for key in _CONTEXT_KEYS:
            value = cfg.get(key) if isinstance(cfg, dict) else None
            if isinstance(value, int) and 0 < value < _NO_LIMIT:
                return value
    return None


def _base_config(base: str) -> Path | None:
    """The base model's config.json on this machine: a model folder, or the hub cache (never downloaded)."""
    folder = Path(base).expanduser()
    if (folder / "config.json").is_file():
        return folder / "config.json"
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(base, "config.json")
    except Exception:  # noqa: BLE001 - a reference that is no hub id (a built-in name): not known here
        return None
    return Path(found) if isinstance(found, str) else None


@lru_cache(maxsize=64)
def _context(folder: str, base: str) -> tuple[int | None, str]:
    """(the context, where it was read) of a run's result folder and base model."""
    for path in (Path(folder) / "config.json", _base_config(base)):
        value = _config_context(path) if path is not None else None
        if value is not None:
            return value, "the model's max_position_embeddings"
    try:
        value = json.loads((Path(folder) / "tokenizer_config.json").read_text()).get("model_max_length")
    except (OSError, ValueError):
        value = None
    if isinstance(value, (int, float)) and 0 < value < _NO_LIMIT:
        return int(value), "the tokenizer's model_max_length"
    return None, ""


def context_length(result: Any) -> int | None:
    """The number of tokens run `result` (a `RunResult`) can read at once; None when nothing here says."""
    return _context(str(result.folder), str(result.base))[0]


@lru_cache(maxsize=16)
def _tokenizer(folder: str) -> tuple[Any, int] | None:
    """(the run's saved fast tokenizer, its longest token in characters), or None when it has none here."""
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.encode_special_tokens = True  # typed special-token strings are text (`jobs.chat.template`)
    tokenizer.no_truncation()
    longest = max((len(token) for token in tokenizer.get_vocab(with_added_tokens=True)), default=1)
    return tokenizer, max(longest, 1)


def _chunks(text: str) -> Iterator[str]:
    """`text` in pieces of about CHUNK_CHARS, cut at a space where there is one."""
    at = 0
    while at < len(text):
        end = min(len(text), at + CHUNK_CHARS)
        if end < len(text):
            space = text.rfind(" ", at + CHUNK_CHARS // 2, end)
            end = space if space > at else end
        yield text[at:end]
        at = end


def count_tokens(folder: str | Path, texts: Sequence[str], limit: int) -> tuple[int, bool] | None:
    """(the texts' tokens, exact) with the tokenizer saved in `folder`; None: no tokenizer here. Not exact: at
    least that many, past `limit`: from their length alone (each token is at most the longest token's
    characters), or counted a chunk at a time until the count passed the limit (never the whole text at once)."""
    found = _tokenizer(str(folder))
    if found is None:
        return None
    tokenizer, longest = found
    at_least = sum(-(-len(t) // longest) for t in texts)  # ceil: each token covers at most `longest` characters
    if at_least > limit:
        return at_least, False
    counted = 0
    chunks = (chunk for text in texts for chunk in _chunks(text))
    for chunk in chunks:
        counted += len(tokenizer.encode(chunk, add_special_tokens=False).ids)
        if counted > limit:
            return counted, next(chunks, None) is None  # exact when nothing was left to count
    return counted, True


def prompt_problem(result: Any, texts: Sequence[str]) -> Problem | None:
    """Why a prompt of `texts` (the system prompt and the messages' text) is too long for run `result`, or None
    (also when its context or tokenizer is not known here: the process that holds the model checks again)."""
    limit, source = _context(str(result.folder), str(result.base))
    if limit is None:
        return None
    counted = count_tokens(result.folder, texts, limit)
    if counted is None or counted[0] < limit:
        return None
    tokens, exact = counted
    count = f"{tokens:,} tokens" if exact else f"at least {tokens:,} tokens ({sum(map(len, texts)):,} characters)"
    return too_long(result.run_id, count, limit, source)


def too_long(run_id: int, count: str, limit: int, source: str) -> Problem:
    return Problem(
        "messages",
        f"the prompt is {count}, over run {run_id}'s context of {limit:,} tokens ({source}), "
        "with no room left for the answer",
        f"shorten the messages (or the system prompt) to well under {limit:,} tokens, or start a new conversation",
    )
