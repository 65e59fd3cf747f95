"""Tool-calling turns and the `tools` column, made into the messages transformers' chat templates take.

Two shapes people bring, both converted to one form:

- ShareGPT (LLaMA-Factory's `glaive_toolcall_en_demo`): `function_call` turns whose value is the JSON
  `{"name": ..., "arguments": {...}}` (or a list of them, parallel calls), `observation` turns holding
  the tool's result, and a `tools` column holding the JSON text of the tool schemas.
- OpenAI chat: assistant turns with `tool_calls: [{"type": "function", "function": {"name", "arguments"}}]`
  (`arguments` a JSON string or an object; `content` may be null), `tool` turns (optional `name`,
  `tool_call_id`), and a `tools` list.

The form (what `tokenizer.apply_chat_template(messages, tools=tools)` renders):

    {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    {"role": "tool", "content": "{\"temp\": 21}", "name": "get_weather"}     # name: when the row gives it

and the row's `tools` kept as JSON text of [{"type": "function", "function": {name, description,
parameters}}] (Arrow cannot hold schemas of different shapes in one column; trl json-loads a string
`tools` itself before rendering). Pure functions on plain values; problems are (problem, fix) pairs.

    message, problems = call_message(turn["value"], "conversations")
    tools, problems = parse_tools(row.get("tools"))          # None when the row has no tools
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

SAMPLES = 5  # conversations of each kind kept for the template check
ProblemList = list[tuple[str, str]]
Message = dict[str, Any]
TOOL_KEYS = ("tool_calls", "name")  # kept on messages besides role and content
CALL_FIX = (
    'write each call as {"name": "the_tool", "arguments": {"key": "value"}} '
    '(OpenAI: {"type": "function", "function": {"name": ..., "arguments": ...}})'
)
TOOLS_FIX = (
    'write `tools` as a list (or its JSON text) of tool schemas: [{"name": "the_tool", "description": "...", '
    '"parameters": {"type": "object", "properties": {...}}}]'
)


def _json(value: Any) -> tuple[Any, bool]:
    """`value` parsed when it is JSON text (else as it is), and whether that worked."""
    if not isinstance(value, str):
        return value, True
    try:
        return json.loads(value), True
    except ValueError:
        return None, False


def tool_call(value: Any, column: str) -> tuple[dict[str, Any] | None, ProblemList]:
    """One call ({name, arguments} or OpenAI's {type, function: {name, arguments}}) in the template's form."""
    function = value.get("function") if isinstance(value, dict) and "function" in value else value
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"].strip():
        return None, [(f"`{column}` has a tool call without a `name`", CALL_FIX)]
    arguments, ok = _json(function.get("arguments", {}))
    if arguments is None and ok:
        arguments = {}
    if not ok or not isinstance(arguments, dict):
        return None, [
            (
                f"`{column}` has a call of `{function['name']}` whose `arguments` are not a JSON object",
                'write `arguments` as an object (or its JSON text), e.g. {"city": "Paris"}',
            )
        ]
    return {"type": "function", "function": {"name": function["name"], "arguments": arguments}}, []


def tool_calls(values: Any, column: str) -> tuple[list[dict[str, Any]] | None, ProblemList]:
    """A list of calls (or one call) in the template's form."""
    calls = values if isinstance(values, list) else [values]
    if not calls:
        return None, [(f"`{column}` has an empty list of tool calls", CALL_FIX)]
    out = []
    for one in calls:
        call, problems = tool_call(one, column)
        if call is None:
            return None, problems
        out.append(call)
    return out, []


def call_message(value: Any, column: str) -> tuple[Message | None, ProblemList]:
    """A ShareGPT `function_call` turn's value (JSON text of one call or a list of calls) as an assistant
    message with `tool_calls`."""
    parsed, ok = _json(value)
    if not ok or parsed is None:
        return None, [(f"`{column}` has a `function_call` turn whose value is not JSON", CALL_FIX)]
    calls, problems = tool_calls(parsed, column)
    if calls is None:
        return None, problems
    return {"role": "assistant", "content": "", "tool_calls": calls}, []


def chat_message(turn: dict[str, Any], column: str) -> tuple[Message | None, ProblemList]:
    """An OpenAI-style turn ({role, content, tool_calls?, name?}) with its calls in the template's form; other
    keys (tool_call_id, ...) dropped. Content null next to tool calls becomes ""."""
    out: Message = {"role": turn.get("role"), "content": turn.get("content")}
    if turn.get("tool_calls") is not None:
        calls, problems = tool_calls(turn["tool_calls"], column)
        if calls is None:
            return None, problems
        out["tool_calls"] = calls
        if out["content"] is None:
            out["content"] = ""
    if isinstance(turn.get("name"), str) and out["role"] == "tool":
        out["name"] = turn["name"]
    return out, []


def _schema(value: Any) -> dict[str, Any] | None:
    """One tool schema as {"type": "function", "function": {...}}; None when it has no name."""
    if isinstance(value, dict) and isinstance(value.get("function"), dict):
        value = value["function"]
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"].strip():
        return None
    return {"type": "function", "function": value}


def parse_tools(value: Any, column: str = "tools") -> tuple[list[dict[str, Any]] | None, ProblemList]:
    """The row's tool schemas (a list, or its JSON text) as [{"type": "function", "function": {...}}]; None
    when it has none ("", "[]", null)."""
    parsed, ok = _json(value.strip() if isinstance(value, str) else value)
    if isinstance(value, str) and not value.strip():
        return None, []
    if not ok or (parsed is not None and not isinstance(parsed, list)):
        return None, [(f"`{column}` is not a list of tool schemas (or its JSON text)", TOOLS_FIX)]
    schemas = [_schema(one) for one in parsed or []]
    if any(s is None for s in schemas):
        return None, [(f"`{column}` has a tool schema without a `name`", TOOLS_FIX)]
    return ([s for s in schemas if s is not None] or None), []


def tools_text(row: dict[str, Any]) -> tuple[dict[str, Any], ProblemList]:
    """{"tools": JSON text} for a row with tool schemas, {} for one without, and the problems."""
    if row.get("tools") is None:
        return {}, []
    tools, problems = parse_tools(row["tools"])
    return ({"tools": json.dumps(tools, ensure_ascii=False)} if tools else {}), problems


def row_tools(row: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A converted row's tools as the template takes them (None: none, or not readable)."""
    return parse_tools(row.get("tools"))[0]


def uses_tools(messages: Any) -> bool:
    """Whether a conversation calls tools or holds a tool's result."""
    return isinstance(messages, list) and any(
        isinstance(m, dict) and (m.get("tool_calls") or m.get("role") == "tool") for m in messages
    )


def calls_tools(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> bool:
    """Whether any of the first rows' OpenAI-style conversations in `columns` call tools."""
    return any(uses_tools(row.get(c)) for row in rows for c in columns)


@dataclass
class ToolRows:
    """The rows of a data set that use tools: how many, the first few numbers, and conversations for the template
    check to render: the first few with tool calls and the first few with parallel calls (one assistant turn
    calling several tools, which templates such as Llama 3.1's refuse)."""

    count: int = 0
    numbers: list[int] = field(default_factory=list)
    samples: list[tuple[int, list[Message], str | None]] = field(default_factory=list)  # (row, turns, tools)
    _parallel: int = 0

    def add(self, number: int, conversation: Any, tools: Any) -> None:
        """Count one row when it has tool schemas (`tools`) or its `conversation` calls tools."""
        calls = [len(m.get("tool_calls") or []) for m in conversation or [] if isinstance(m, dict)]
        if not tools and not uses_tools(conversation):
            return
        self.count += 1
        if len(self.numbers) < SAMPLES:
            self.numbers.append(number)
        parallel = max(calls, default=0) > 1
        if parallel and self._parallel < SAMPLES:
            self._parallel += 1
            self.samples.append((number, conversation, tools))
        elif any(calls) and len(self.samples) - self._parallel < SAMPLES:
            self.samples.append((number, conversation, tools))
