"""The row formats trl reads, and what each trainer takes (used by `jobs.data.validation` and above).

Knows what trl 1.16 accepts: SFTTrainer takes `text`, `messages` or `prompt`/`completion`
rows (prompt/completion as plain strings or as message lists); DPOTrainer takes
`prompt`/`chosen`/`rejected` (plain strings or message lists); KTO `prompt`/`completion`/`label`;
GRPO `prompt` only. Pure: columns in, a format or a problem out.

    fmt = detect_format(["prompt", "completion"])          # RowFormat.PROMPT_COMPLETION
    problem = trainer_fit(fmt, Trainer.DPO, "dataset")      # None when the trainer can use it
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from typing import Any

from jobs.errors import Problem
from jobs.spec.enums import Trainer


class RowFormat(str, Enum):
    TEXT = "text"
    MESSAGES = "messages"
    PROMPT_COMPLETION = "prompt_completion"
    PREFERENCE = "preference"
    UNPAIRED = "unpaired"  # KTO: prompt, completion, label (true: desirable)
    PROMPT_ONLY = "prompt_only"  # GRPO: prompt only; the completions are generated


COLUMNS: dict[RowFormat, tuple[str, ...]] = {
    RowFormat.TEXT: ("text",),
    RowFormat.MESSAGES: ("messages",),
    RowFormat.PROMPT_COMPLETION: ("prompt", "completion"),
    RowFormat.PREFERENCE: ("prompt", "chosen", "rejected"),
    RowFormat.UNPAIRED: ("prompt", "completion", "label"),
    RowFormat.PROMPT_ONLY: ("prompt",),
}
TRAINER_FORMATS: dict[Trainer, tuple[RowFormat, ...]] = {
    Trainer.SFT: (RowFormat.TEXT, RowFormat.MESSAGES, RowFormat.PROMPT_COMPLETION),
    Trainer.DPO: (RowFormat.PREFERENCE,),
    Trainer.KTO: (RowFormat.UNPAIRED, RowFormat.PREFERENCE),  # trl unpairs chosen/rejected rows itself
    Trainer.REWARD: (RowFormat.PREFERENCE,),
    Trainer.ORPO: (RowFormat.PREFERENCE,),
    Trainer.CPO: (RowFormat.PREFERENCE,),
    Trainer.GRPO: (RowFormat.PROMPT_ONLY,),
}
NEEDS = {
    Trainer.SFT: "text, messages or prompt/completion rows",
    Trainer.DPO: "prompt/chosen/rejected rows",
    Trainer.KTO: "prompt/completion/label rows (or prompt/chosen/rejected, which trl unpairs)",
    Trainer.REWARD: "prompt/chosen/rejected rows",
    Trainer.ORPO: "prompt/chosen/rejected rows",
    Trainer.CPO: "prompt/chosen/rejected rows",
    Trainer.GRPO: "prompt rows (a `prompt` string, or chat `prompt` messages ending with the user's turn)",
}
SAMPLE_FOR = {
    Trainer.SFT: "sample:chat-format",
    Trainer.DPO: "sample:preference-format",
    Trainer.KTO: "sample:kto-format",
    Trainer.REWARD: "sample:preference-format",
    Trainer.ORPO: "sample:preference-format",
    Trainer.CPO: "sample:preference-format",
    Trainer.GRPO: "sample:prompt-format",
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


def trainer_fit(fmt: RowFormat, trainer: Trainer, field_name: str) -> Problem | None:
    """A Problem when `trainer` cannot train on rows of `fmt`."""
    if fmt in TRAINER_FORMATS[trainer]:
        return None
    if trainer is Trainer.SFT:
        return Problem(
            field_name,
            f"has {fmt.value} rows ({'/'.join(COLUMNS[fmt])}), which the sft trainer cannot use",
            "set trainer: "
            + " or ".join(t.value for t, f in TRAINER_FORMATS.items() if fmt in f)
            + ", or use text/messages/prompt+completion data such as `sample:chat-format`",
        )
    fits = [t.value for t, f in TRAINER_FORMATS.items() if fmt in f]
    return Problem(
        field_name,
        f"has {fmt.value} rows, but the {trainer.value} trainer needs {NEEDS[trainer]}",
        f"use data such as `{SAMPLE_FOR[trainer]}`, or set trainer: {' or '.join(fits)}",
    )


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
    out = {"role": m.get("role"), "content": m.get("content")}
    for key in ("tool_calls", "name"):
        if m.get(key) is not None:
            out[key] = m[key]
    return out
