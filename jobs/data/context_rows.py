"""Preference and KTO rows whose prompt is a conversation: its context (system prompt, earlier turns).

LLaMA-Factory's DPO demo writes a preference row as a ShareGPT conversation plus one answer turn each:

    {"conversations": [{"from": "system", ...}, {"from": "human", ...}],
     "chosen": {"from": "gpt", "value": "..."}, "rejected": {"from": "gpt", "value": "..."}}

and its KTO demo as a whole chat plus a verdict on the last answer:

    {"messages": [{"role": "user", ...}, {"role": "assistant", ...}], "label": true}

Both become trl's conversational rows, rendered with the model's chat template at training:
the conversation (with a `system` column put first) is the `prompt`; `chosen`/`rejected` (one turn
object, a list of turns or plain text) are the answers; for kto the last assistant turn is the
`completion` and everything before it the prompt. Turns may be {from, value} or {role, content}, tool calls
included (`jobs.data.tool_turns`); a `tools` column is kept as JSON text (trl's dpo, kto and reward trainers
pass it to the template).

    conversion = context_conversion({"conversations", "chosen", "rejected"}, first_rows, Trainer("dpo"))
    row, problems = conversion.convert(row)        # {"prompt": [...], "chosen": [...], "rejected": [...]}
"""

from __future__ import annotations

from typing import Any

from jobs.data.tool_turns import tools_text
from jobs.data.turns import Conversion, Message, ProblemList, answer_turns, chat_turns, is_sharegpt_turn, with_system
from jobs.spec.enums import RowFormat, Trainer
from jobs.spec.trainer_records import record_for

CONVERSATION_COLUMNS = ("conversations", "messages")
ANSWERS = ("chosen", "rejected")


def _context(row: dict[str, Any], column: str) -> tuple[list[Message] | None, ProblemList]:
    """The row's conversation as messages, with its `system` column first."""
    messages, problems = chat_turns(row.get(column), column)
    if messages is None:
        return None, problems
    return with_system(messages, row)


def preference_row(row: dict[str, Any], column: str) -> tuple[dict[str, Any] | None, ProblemList]:
    """A conversation + `chosen` + `rejected` as a conversational prompt/chosen/rejected row."""
    context, problems = _context(row, column)
    if context is None:
        return None, problems
    if context[-1].get("role") == "assistant":
        problems.append(
            (
                f"`{column}` ends with an assistant turn",
                f"end `{column}` with the user's turn: `chosen` and `rejected` are the answers to it",
            )
        )
    out: dict[str, Any] = {"prompt": context}
    for name in ANSWERS:
        if row.get(name) is None:
            problems.append((f"`{name}` is missing", f"give every row a `{name}` answer"))
            continue
        answer, found = answer_turns(row[name], name)
        problems += found
        out[name] = answer
    tools, found = tools_text(row)
    problems += found
    return (None, problems) if problems else ({**out, **tools}, [])


def kto_row(row: dict[str, Any], column: str) -> tuple[dict[str, Any] | None, ProblemList]:
    """A conversation + `label` as a conversational prompt/completion/label row: the last turn is the
    completion the label judges, the turns before it the prompt."""
    messages, problems = _context(row, column)
    if messages is None:
        return None, problems
    last = messages[-1].get("role")
    if last != "assistant":
        return None, [
            (
                f"`{column}` ends with a {last} turn, not the answer `label` judges",
                "end each conversation with the assistant's answer; `label` says whether it is desirable",
            )
        ]
    if len(messages) == 1:
        return None, [
            (f"`{column}` holds only the answer", "put the user's turn the answer replies to before it in the row")
        ]
    tools, problems = tools_text(row)
    if problems:
        return None, problems
    return {"prompt": messages[:-1], "completion": [messages[-1]], "label": row.get("label"), **tools}, []


def _style(column: str, rows: list[dict[str, Any]]) -> str:
    """ "sharegpt" when the first rows' turns are {from, value}, else "chat"."""
    for row in rows:
        turns = row.get(column)
        if isinstance(turns, list) and turns:
            return "sharegpt" if is_sharegpt_turn(turns[0]) else "chat"
    return "sharegpt" if column == "conversations" else "chat"


def context_conversion(cols: set[str], rows: list[dict[str, Any]], trainer: Trainer) -> Conversion | None:
    """The conversion for a conversation with `chosen`/`rejected` (every trainer: the row check says which
    can use it) or, for kto, with a `label`; None for any other columns."""
    column = next((c for c in CONVERSATION_COLUMNS if c in cols), None)
    if column is None or cols & {"prompt", "completion", "instruction"}:
        return None
    source = _style(column, rows)
    turns = "{from, value}" if source == "sharegpt" else "{role, content}"
    extra = " plus the `system` column" if "system" in cols else ""
    if set(ANSWERS) <= cols:
        return Conversion(
            source,
            f"`{column}` ({turns} turns){extra} as the conversational prompt of `chosen`/`rejected`",
            lambda row: preference_row(row, column),
            ("prompt", "chosen", "rejected"),
            (column, "system", "tools", *ANSWERS),
        )
    if RowFormat.UNPAIRED in record_for(trainer).row_formats and "label" in cols and not cols & set(ANSWERS):
        return Conversion(
            source,
            f"`{column}` ({turns} turns){extra} split into the conversational prompt and the last assistant "
            "turn as the completion `label` judges",
            lambda row: kto_row(row, column),
            ("prompt", "completion", "label"),
            (column, "system", "tools", "label"),
        )
    return None
