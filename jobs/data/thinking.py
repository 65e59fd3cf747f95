"""Reasoning in the rows: `<think>...</think>` in an answer, or a turn's `reasoning_content` / `thinking` field.

A turn's reasoning field (OpenAI-style `reasoning_content`, DeepSeek/Anthropic-style `thinking`) is folded into its
content as the `<think>` block reasoning models write (`jobs.data.row_formats.folded`, where rows take trl's
shape), so it is never dropped silently with the field.
Then the spec's `thinking` choice decides what is trained (`apply_thinking`, at load time, so the token view shows
it): `train` (all of it: the rows as they are), `answer_only` (the reasoning moves into the prompt, masked with it:
prompt/completion rows of text), `strip` (every `<think>` block removed). Chat templates that take
`enable_thinking` (Qwen3 and its kind) get it, true unless the choice is `strip` (`template_kwargs`).

    ds = apply_thinking(ds, Thinking.STRIP)
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from jobs.data.sources import DataError
from jobs.errors import Problem
from jobs.spec.enums import Thinking

if TYPE_CHECKING:
    import datasets

BLOCK = re.compile(r"<think>.*?</think>\s*", re.S)
INNER = re.compile(r"<think>(.*?)</think>", re.S)
LEADING = re.compile(r"^\s*(<think>.*?</think>\s*)", re.S)
ANSWER_COLUMNS = ("completion", "chosen", "rejected")


def has_thinking(texts: Any) -> bool:
    """Whether any of the answer texts holds a `<think>` block."""
    return any(isinstance(t, str) and BLOCK.search(t) for t in texts)


def reasoning_texts(row: dict[str, Any]) -> list[str]:
    """The non-empty reasoning of a row's answers (trl's columns), each block's text stripped."""
    out: list[str] = []
    for column in ("messages", *ANSWER_COLUMNS):
        value = row.get(column)
        texts = [value] if isinstance(value, str) else [
            m.get("content") for m in value or [] if isinstance(m, dict) and m.get("role") == "assistant"
        ]  # fmt: skip
        for text in texts:
            out += [t.strip() for t in INNER.findall(text or "") if t.strip()]
    return out


def _strip_value(value: Any) -> Any:
    if isinstance(value, str):
        return BLOCK.sub("", value)
    if isinstance(value, list):
        return [
            {**m, "content": BLOCK.sub("", m["content"])}
            if isinstance(m, dict) and m.get("role") == "assistant" and isinstance(m.get("content"), str)
            else m
            for m in value
        ]
    return value


def _stripped(row: dict[str, Any]) -> dict[str, Any]:
    return {c: _strip_value(row[c]) for c in ("messages", *ANSWER_COLUMNS) if c in row}


def _answer_only(row: dict[str, Any]) -> dict[str, Any]:
    found = LEADING.match(row["completion"])
    if not found:
        return {"prompt": row["prompt"], "completion": row["completion"]}
    return {"prompt": row["prompt"] + found.group(1), "completion": row["completion"][found.end() :]}


def apply_thinking(ds: datasets.Dataset, choice: Thinking | str | None) -> datasets.Dataset:
    """The rows with the reasoning trained, masked or removed as `choice` says; DataError when `answer_only` meets
    rows it cannot mask (conversations: the reasoning and the answer are one assistant turn)."""
    choice = Thinking(choice) if choice else None
    if choice is None or choice is Thinking.TRAIN:
        return ds
    if choice is Thinking.STRIP:
        return ds.map(_stripped, desc="Stripping <think> blocks")
    if not {"prompt", "completion"} <= set(ds.column_names) or not isinstance(ds[0]["completion"], str):
        raise DataError(
            [
                Problem(
                    "thinking",
                    "answer_only masks the reasoning of prompt/completion rows of text; these rows are "
                    "conversations, where the reasoning and the answer are one assistant turn",
                    "set thinking: strip (train the answers alone) or train (all of it), or write the rows as "
                    "prompt/completion text",
                )
            ]
        )
    return ds.map(_answer_only, desc="Moving <think> blocks into the prompt")


def template_kwargs(choice: Thinking | str | None) -> dict[str, Any] | None:
    """The chat template's `enable_thinking` (templates without it ignore it); None when `thinking` is unset."""
    return None if not choice else {"enable_thinking": Thinking(choice) is not Thinking.STRIP}
