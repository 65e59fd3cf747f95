"""Row shapes people bring, converted to what trl reads: Alpaca, ShareGPT and user column names.

Pure functions on plain rows (dicts); `jobs.data.inspection` runs them before the row checks, so the
checks, the preview and the training all see the converted rows.

- Column mapping (`dataset_columns`, e.g. `prompt=question, completion=answer`): each named
  column is renamed to the trl (or Alpaca/ShareGPT) name first.
- Alpaca: `instruction` (+ optional `input`, `system`, `history` of [question, answer] pairs)
  with `output` -> conversational prompt/completion (so the loss covers the answer only), or
  with `chosen`/`rejected` -> conversational preference rows.
- ShareGPT: `conversations` (or `messages`) of {from, value} turns, speakers human/user,
  gpt/assistant, system, tool/function/observation, optional `system` column -> `messages`.
- Tool calling (`jobs.data.tool_turns`): ShareGPT `function_call`/`observation` turns, or OpenAI-style
  `messages` whose assistant turns carry `tool_calls` (detected by a `tools` column or the first rows'
  calls) -> `messages` with `tool_calls` and `tool` turns, plus the `tools` column as JSON text.
- A conversation (ShareGPT or OpenAI-style, e.g. LLaMA-Factory's DPO and KTO demos) with
  `chosen`/`rejected`, or with a `label` for kto -> conversational preference or KTO rows whose
  prompt is the context (`jobs.data.context_rows`).
- OpenAI's fine-tuning rows (`jobs.data.openai_rows`): preference rows (`input`, `preferred_output`,
  `non_preferred_output`) and chat with the legacy `functions`/`function_call`.
- Everything else (trl's own columns; OpenAI-style chat with extra keys, which are dropped)
  passes through unchanged.

    conversion = detect_conversion(columns, first_rows, trainer)   # None: rows are already trl's
    row, problems = conversion.convert(row)                # problems: [(problem, fix)]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from jobs.data.context_rows import context_conversion
from jobs.data.openai_rows import openai_conversion
from jobs.data.tool_turns import calls_tools, tools_text
from jobs.data.turns import Conversion, ProblemList, chat_turns, is_sharegpt_turn, with_system
from jobs.spec.enums import DEFAULT_TRAINER, Trainer

SHAREGPT_COLUMNS = ("conversations", "messages")


# ---------------------------------------------------------------------- column mapping
def rename_columns(row: dict[str, Any], mapping: Mapping[str, str]) -> dict[str, Any]:
    """`row` with each mapped source column renamed to its target (target=source pairs)."""
    if not mapping:
        return row
    sources = set(mapping.values())
    out = {k: v for k, v in row.items() if k not in sources and k not in mapping}
    for target, source in mapping.items():
        if source in row:
            out[target] = row[source]
    return out


def renamed(columns: Iterable[str], mapping: Mapping[str, str]) -> list[str]:
    """The column list after `rename_columns`."""
    return list(rename_columns(dict.fromkeys(columns), mapping))


# ---------------------------------------------------------------------- Alpaca
def _text(row: dict[str, Any], name: str, *, required: bool) -> tuple[str, ProblemList]:
    value = row.get(name)
    if value is None:
        return "", ([(f"`{name}` is missing", f"give every row a `{name}`")] if required else [])
    if not isinstance(value, str):
        return "", [(f"`{name}` is not a string", f"write `{name}` as text")]
    if required and not value.strip():
        return "", [(f"`{name}` is empty", f"give every row a non-empty `{name}`")]
    return value, []


def _history(value: Any) -> tuple[list[dict[str, str]], ProblemList]:
    if value is None:
        return [], []
    pairs_ok = isinstance(value, list) and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(t, str) and t.strip() for t in p) for p in value
    )
    if not pairs_ok:
        return [], [
            (
                "`history` is not a list of [question, answer] pairs",
                'write history as [["earlier question", "earlier answer"], ...], or leave it out',
            )
        ]
    turns = []
    for question, answer in value:
        turns += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return turns, []


def alpaca_row(row: dict[str, Any]) -> tuple[dict[str, Any] | None, ProblemList]:
    """One Alpaca row as conversational prompt/completion (or preference) rows."""
    instruction, problems = _text(row, "instruction", required=True)
    extra, more = _text(row, "input", required=False)
    system, more2 = _text(row, "system", required=False)
    history, more3 = _history(row.get("history"))
    problems += more + more2 + more3
    answers = ("chosen", "rejected") if "output" not in row and ("chosen" in row or "rejected" in row) else ("output",)
    texts = {}
    for name in answers:
        texts[name], found = _text(row, name, required=True)
        problems += found
    if problems:
        return None, problems
    user = instruction if not extra.strip() else f"{instruction}\n\n{extra}"
    prompt = ([{"role": "system", "content": system}] if system.strip() else []) + history
    prompt.append({"role": "user", "content": user})
    if answers == ("output",):
        return {"prompt": prompt, "completion": [{"role": "assistant", "content": texts["output"]}]}, []
    return {"prompt": prompt, **{n: [{"role": "assistant", "content": texts[n]}] for n in answers}}, []


# ---------------------------------------------------------------------- ShareGPT
def sharegpt_row(row: dict[str, Any], column: str) -> tuple[dict[str, Any] | None, ProblemList]:
    """One ShareGPT row ({from, value} turns, optional `system` column) as a `messages` row."""
    turns = row.get(column)
    if isinstance(turns, list) and not all(isinstance(t, dict) and "from" in t and "value" in t for t in turns):
        fix = f'write `{column}` as [{{"from": "human", "value": "..."}}, {{"from": "gpt", "value": "..."}}]'
        return None, [(f"`{column}` has a turn without `from` or `value`", fix)]
    return chat_row(row, column)


def chat_row(row: dict[str, Any], column: str) -> tuple[dict[str, Any] | None, ProblemList]:
    """A conversation ({from, value} or {role, content} turns, tool calls included) with its `system` and
    `tools` columns as a `messages` row (plus `tools`, JSON text, when the row has tool schemas)."""
    messages, problems = chat_turns(row.get(column), column)
    if messages is None:
        return None, problems
    messages, problems = with_system(messages, row)
    tools, more = tools_text(row)
    if messages is None or more:
        return None, problems + more
    return {"messages": messages, **tools}, []


# ---------------------------------------------------------------------- detection
def _sharegpt_column(columns: set[str], rows: list[dict[str, Any]]) -> str | None:
    """The column holding {from, value} turns, judged by the first rows that have a turn."""
    for column in SHAREGPT_COLUMNS:
        if column not in columns:
            continue
        for row in rows:
            turns = row.get(column)
            first = turns[0] if isinstance(turns, list) and turns else None
            if is_sharegpt_turn(first):
                return column
            if isinstance(first, dict) and "role" in first:
                break
        if column == "conversations":
            return column  # trl never reads `conversations`: treat it as ShareGPT and report its turns
    return None


def detect_conversion(
    columns: Iterable[str], rows: list[dict[str, Any]], trainer: Trainer = DEFAULT_TRAINER
) -> Conversion | None:
    """The conversion the columns (and, for ShareGPT vs chat, the first rows) call for; None for trl rows.

    A conversation with `chosen`/`rejected` (any trainer), or with a `label` (kto), is a preference or
    KTO row whose context is the prompt (`jobs.data.context_rows`)."""
    cols = set(columns)
    openai = openai_conversion(cols, rows)  # OpenAI's fine-tuning rows (`jobs.data.openai_rows`)
    if openai is not None:
        return openai
    context = context_conversion(cols, rows, Trainer(trainer))
    if context is not None:
        return context
    sharegpt = _sharegpt_column(cols, rows)
    if sharegpt is not None:
        extra = "".join(f" plus the `{c}` column" for c in ("system", "tools") if c in cols)
        return Conversion(
            "sharegpt",
            f"ShareGPT `{sharegpt}` ({{from, value}} turns){extra} converted to chat `messages`",
            lambda row: sharegpt_row(row, sharegpt),
            ("messages",),
            (sharegpt, "system", "tools"),
        )
    if (
        "messages" in cols
        and not cols & {"prompt", "completion"}
        and ("tools" in cols or calls_tools(rows, ("messages",)))
    ):
        extra = " and the `tools` column" if "tools" in cols else ""
        return Conversion(
            "chat",
            f"chat `messages` with tool calls{extra} converted to the chat template's tool-calling messages",
            lambda row: chat_row(row, "messages"),
            ("messages",),
            ("messages", "system", "tools"),
        )
    trl_columns = {"text", "messages", "prompt", "completion"}
    if "instruction" in cols and not cols & trl_columns and ({"output", "chosen", "rejected"} & cols):
        parts = "/".join(c for c in ("instruction", "input", "system", "history") if c in cols)
        columns_out: tuple[str, ...]
        if "output" in cols:
            target, columns_out = "conversational prompt/completion (loss on the output only)", ("prompt", "completion")
        else:
            target, columns_out = "conversational prompt/chosen/rejected", ("prompt", "chosen", "rejected")
        return Conversion(
            "alpaca",
            f"Alpaca {parts} converted to {target}",
            alpaca_row,
            columns_out,
            ("instruction", "input", "system", "history", "output", "chosen", "rejected"),
        )
    return None
