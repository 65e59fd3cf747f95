"""OpenAI's fine-tuning JSONL rows, made into trl's: preference rows and chat with legacy function calls.

OpenAI's fine-tuning API takes two row shapes that trl does not read as they are:

- preference (DPO) rows: `{"input": {"messages": [...], "tools": [...]}, "preferred_output": [{"role":
  "assistant", ...}], "non_preferred_output": [...]}` -> conversational `prompt`/`chosen`/`rejected` (the
  input's messages are the prompt, its tools the `tools` column), checked as every preference row is
  (`jobs.data.context_rows.preference_row`);
- supervised `messages` with the legacy function calling: a `functions` list of schemas, assistant turns
  with `function_call: {name, arguments}` and `function` turns holding the result -> `messages` with
  `tool_calls` and `tool` turns, plus `tools` (`jobs.data.tool_turns`). Rows with `tools`/`tool_calls` are
  already read by the chat conversion (`jobs.data.formats`).

    conversion = openai_conversion(columns, first_rows)      # None for any other rows
    row, problems = conversion.convert(row)
"""

from __future__ import annotations

from typing import Any

from jobs.data.context_rows import preference_row
from jobs.data.tool_turns import tools_text
from jobs.data.turns import Conversion, ProblemList, chat_turns

PREFERENCE = ("input", "preferred_output", "non_preferred_output")
INPUT_FIX = 'write `input` as {"messages": [{"role": "user", "content": "..."}], "tools": [...]} (tools optional)'


def preference_input_row(row: dict[str, Any]) -> tuple[dict[str, Any] | None, ProblemList]:
    """An OpenAI preference row as a conversational prompt/chosen/rejected row."""
    given = row.get("input")
    if not isinstance(given, dict) or not isinstance(given.get("messages"), list):
        return None, [("`input` is not an object with `messages`", INPUT_FIX)]
    shaped = {"messages": given["messages"], "tools": given.get("tools")}
    for name, column in (("preferred_output", "chosen"), ("non_preferred_output", "rejected")):
        if row.get(name) is None:
            return None, [(f"`{name}` is missing", f'give every row a `{name}`: [{{"role": "assistant", ...}}]')]
        shaped[column] = row[name]
    return preference_row(shaped, "messages")


def _legacy_turn(turn: Any) -> Any:
    """A turn with a legacy `function_call` as one with `tool_calls`; a `function` turn as a `tool` turn."""
    if not isinstance(turn, dict):
        return turn
    out = {k: v for k, v in turn.items() if k != "function_call"}
    if turn.get("function_call") is not None:
        out["tool_calls"] = [{"type": "function", "function": turn["function_call"]}]
    if turn.get("role") == "function":
        out["role"] = "tool"
    return out


def legacy_functions_row(row: dict[str, Any]) -> tuple[dict[str, Any] | None, ProblemList]:
    """A `messages` row with `functions` / `function_call` as a `messages` row with tool calls and `tools`."""
    turns = row.get("messages")
    turns = [_legacy_turn(t) for t in turns] if isinstance(turns, list) else turns
    messages, problems = chat_turns(turns, "messages")
    if messages is None:
        return None, problems
    tools, problems = tools_text({"tools": row.get("tools") or row.get("functions")})
    return (None, problems) if problems else ({"messages": messages, **tools}, [])


def _legacy_calls(rows: list[dict[str, Any]]) -> bool:
    for row in rows:
        turns = row.get("messages")
        if isinstance(turns, list) and any(
            isinstance(t, dict) and (t.get("function_call") or t.get("role") == "function") for t in turns
        ):
            return True
    return False


def openai_conversion(cols: set[str], rows: list[dict[str, Any]]) -> Conversion | None:
    """The conversion for OpenAI's preference rows or legacy function-calling chat; None for other rows."""
    if set(PREFERENCE) <= cols:
        return Conversion(
            "openai",
            "OpenAI preference rows (`input`, `preferred_output`, `non_preferred_output`) as the conversational "
            "prompt of `chosen`/`rejected`",
            preference_input_row,
            ("prompt", "chosen", "rejected"),
            PREFERENCE,
        )
    if "messages" in cols and not cols & {"prompt", "completion"} and ("functions" in cols or _legacy_calls(rows)):
        return Conversion(
            "openai",
            "chat `messages` with OpenAI's legacy `functions`/`function_call` as the chat template's tool calls",
            legacy_functions_row,
            ("messages",),
            ("messages", "functions", "tools"),
        )
    return None
