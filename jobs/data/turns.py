"""Chat turns as people write them, made into trl's {role, content} messages; and what a conversion is.

Pure functions on plain values, shared by the ShareGPT conversion (`jobs.data.formats`) and the
preference/KTO rows with chat context (`jobs.data.context_rows`):

- ShareGPT turns are {from, value} with speakers human/user, gpt/assistant, system,
  tool/function/observation, and function_call (a tool call, `jobs.data.tool_turns`); OpenAI-style
  turns are {role, content} plus `tool_calls` / a tool turn's `name` (other keys dropped).
- An answer column (`chosen`, `rejected`) may hold one turn object, a list of turns, or a plain
  string (the assistant's text), as LLaMA-Factory's and trl's data sets write them.

    messages, problems = chat_turns(row["conversations"], "conversations")
    answer, problems = answer_turns(row["chosen"], "chosen")
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jobs.data.tool_turns import call_message, chat_message

ProblemList = list[tuple[str, str]]
Message = dict[str, Any]
SPEAKERS = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "bot": "assistant",
    "model": "assistant",
    "chatgpt": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}


@dataclass(frozen=True)
class Conversion:
    """A detected source format and the pure function that turns one of its rows into trl's."""

    source: str  # "alpaca" | "sharegpt" | "chat" | "openai"
    description: str  # what the preview and the resolved config say was done
    convert: Callable[[dict[str, Any]], tuple[dict[str, Any] | None, ProblemList]]
    columns: tuple[str, ...]  # the trl columns the converted rows have
    reads: tuple[str, ...]  # the source columns the conversion uses (the rest are dropped)


def is_sharegpt_turn(turn: Any) -> bool:
    """Whether one turn is written ShareGPT's way ({from, value}) rather than OpenAI's ({role, content})."""
    return isinstance(turn, dict) and ("from" in turn or "value" in turn) and "role" not in turn


def _fix(column: str) -> str:
    return f'write `{column}` as [{{"from": "human", "value": "..."}}, {{"from": "gpt", "value": "..."}}]'


def chat_turns(turns: Any, column: str) -> tuple[list[Message] | None, ProblemList]:
    """`turns` ({from, value} or {role, content} objects) as {role, content} messages; None and the problems
    when they are not a list of such turns. Roles other than ShareGPT's speakers are left to the row check."""
    if not isinstance(turns, list) or not turns:
        return None, [(f"`{column}` is not a list of {{from, value}} turns", _fix(column))]
    messages = []
    for turn in turns:
        one, problems = _turn(turn, column)
        if one is None:
            return None, problems
        messages.append(one)
    return messages, []


def _turn(turn: Any, column: str) -> tuple[Message | None, ProblemList]:
    if not isinstance(turn, dict):
        return None, [(f"`{column}` has a turn that is not a {{from, value}} object", _fix(column))]
    if not is_sharegpt_turn(turn):
        return chat_message(turn, column)
    if "from" not in turn or "value" not in turn:
        return None, [(f"`{column}` has a turn without `from` or `value`", _fix(column))]
    speaker = turn["from"].strip().lower() if isinstance(turn["from"], str) else turn["from"]
    if speaker == "function_call":
        return call_message(turn["value"], column)
    if speaker not in SPEAKERS:
        return None, [
            (
                f"`{column}` has unknown speaker `{speaker}`",
                "use the speakers human, gpt, system, function_call or observation (or user/assistant/tool)",
            )
        ]
    return {"role": SPEAKERS[speaker], "content": turn["value"]}, []


def answer_turns(value: Any, column: str) -> tuple[list[Message] | None, ProblemList]:
    """An answer column as assistant messages: one turn object, a list of turns, or the assistant's text."""
    if isinstance(value, str):
        return [{"role": "assistant", "content": value}], []
    if isinstance(value, dict):
        one, problems = _turn(value, column)
        return ([one] if one is not None else None), problems
    if isinstance(value, list) and value:
        return chat_turns(value, column)
    return None, [
        (
            f"`{column}` is not an answer turn",
            f'write `{column}` as {{"from": "gpt", "value": "..."}}, {{"role": "assistant", "content": "..."}} '
            "or the answer's text",
        )
    ]


def with_system(messages: list[Message], row: dict[str, Any]) -> tuple[list[Message] | None, ProblemList]:
    """`messages` with the row's `system` column (when it has text) put first, unless they start with one."""
    system = row.get("system")
    if system is None:
        return messages, []
    if not isinstance(system, str):
        return None, [("`system` is not a string", "write `system` as text")]
    if system.strip() and messages[0].get("role") != "system":
        return [{"role": "system", "content": system}, *messages], []
    return messages, []
