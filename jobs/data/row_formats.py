"""The row formats trl reads, and what each trainer takes (used by `jobs.data.validation` and above).

Knows what trl 1.16 accepts: SFTTrainer takes `text`, `messages` or `prompt`/`completion`
rows (prompt/completion as plain strings or as message lists); DPOTrainer takes
`prompt`/`chosen`/`rejected` (plain strings or message lists); KTO `prompt`/`completion`/`label`;
GRPO `prompt` only. Pure: columns in, a format out.

    fmt = detect_format(["prompt", "completion"])          # RowFormat.PROMPT_COMPLETION

Which trainer takes which format is the trainer's record (`jobs.spec.trainer_records`; `jobs.data.trainer_rows`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jobs.spec.enums import RowFormat

COLUMNS: dict[RowFormat, tuple[str, ...]] = {
    RowFormat.TEXT: ("text",),
    RowFormat.MESSAGES: ("messages",),
    RowFormat.PROMPT_COMPLETION: ("prompt", "completion"),
    RowFormat.PREFERENCE: ("prompt", "chosen", "rejected"),
    RowFormat.UNPAIRED: ("prompt", "completion", "label"),
    RowFormat.PROMPT_ONLY: ("prompt",),
}
LABELS = {True: True, False: False, "true": True, "false": False, "1": True, "0": False}
FORMS_HINT = (
    "give each row `text`, or `messages` (a list of {role, content}), or `prompt` + `completion` (sft); "
    "or `prompt` + `chosen` + `rejected` (dpo); or `prompt` + `completion` + `label` (kto)"
)
# Column names seen in popular data sets, and what trl calls them.
RENAMES = {
    "question": "prompt",
    "instruction": "prompt",
    "input": "prompt",
    "answer": "completion",
    "output": "completion",
    "response": "completion",
    "conversations": "messages",
    "conversation": "messages",
    "content": "text",
}


def detect_format(columns: Iterable[str]) -> RowFormat | None:
    """The format a set of columns asks for (first match wins: preference, messages, prompt/completion, text)."""
    cols = set(columns)
    if {"chosen", "rejected"} & cols:
        return RowFormat.PREFERENCE
    if "label" in cols and "completion" in cols:
        return RowFormat.UNPAIRED
    if "messages" in cols:
        return RowFormat.MESSAGES
    if "completion" in cols:
        return RowFormat.PROMPT_COMPLETION
    if "text" in cols:
        return RowFormat.TEXT
    if "prompt" in cols:
        return RowFormat.PROMPT_COMPLETION
    return None


ANSWER_COLUMNS = ("text", "messages", "completion", "chosen", "rejected", "label")


def reward_columns(columns: Iterable[str]) -> list[str]:
    """A grpo data set's columns besides `prompt` that trl hands to the reward functions (answers are dropped)."""
    return [c for c in columns if c != "prompt" and c not in ANSWER_COLUMNS]


def parse_label(value: Any) -> bool | None:
    """A KTO label as a bool (true/false, 1/0, also as text from CSV); None when it is neither."""
    key = value.strip().lower() if isinstance(value, str) else value
    try:
        return LABELS.get(key)
    except TypeError:  # unhashable (a list or dict)
        return None


def only_columns(row: dict[str, Any], fmt: RowFormat, tools: bool = False) -> dict[str, Any]:
    """The row reduced to what trl reads; chat messages reduced to {role, content} (plus a tool call's
    `tool_calls` and a tool turn's `name`); labels to bools. `tools`: keep the `tools` column too."""
    out: dict[str, Any] = {}
    for c in COLUMNS[fmt]:
        v = row.get(c)
        if c == "label":
            out[c] = parse_label(v)
            continue
        if isinstance(v, list):
            v = [_message(m) if isinstance(m, dict) else m for m in v]
        out[c] = v
    if tools:
        out["tools"] = row.get("tools")
    return out


def _message(m: dict[str, Any]) -> dict[str, Any]:
    m = folded(m)  # a reasoning field becomes a <think> block, never dropped with the field
    out = {"role": m.get("role"), "content": m.get("content")}
    for key in ("tool_calls", "name"):
        if m.get(key) is not None:
            out[key] = m[key]
    return out


REASONING_FIELDS = ("reasoning_content", "thinking")  # OpenAI-style, DeepSeek/Anthropic-style


def folded(message: dict[str, Any]) -> dict[str, Any]:
    """`message` with its reasoning field (if any) as a `<think>` block before its content."""
    reasoning = next((message[k] for k in REASONING_FIELDS if isinstance(message.get(k), str) and message[k]), None)
    if reasoning is None or "<think>" in (message.get("content") or ""):
        return message
    return {**message, "content": f"<think>\n{reasoning.strip()}\n</think>\n\n{message.get('content') or ''}"}
