"""Row-by-row validation of training data: every problem of every row, with its row number.

Everything here works on plain Python rows (dicts), so one code path checks .jsonl, .json, .csv,
.parquet and hub data, and reports the 1-based numbers of the first bad rows instead of an Arrow
stack trace. The caller reads the rows and hands each one in (`RowCheck.add`), so validation
never calls back into the code that reads the data:

    check = RowCheck(RowFormat.MESSAGES, Issues("dataset"))
    for number, row in rows:
        check.add(number, row)
    checked = check.result()                               # Checked: rows, preview, warnings, problems
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobs.data.image_parts import shows_image
from jobs.data.placeholders import Placeholders
from jobs.data.row_formats import COLUMNS, RowFormat, detect_format, only_columns, parse_label
from jobs.data.row_numbers import SHOWN_ROWS, rows_text
from jobs.data.tool_turns import CALL_FIX, ToolRows
from jobs.errors import Problem

ROLES = ("system", "user", "assistant", "tool")
REPEATED_EXAMPLES = 5  # rows with a role twice in a row kept for the chat-template check at submit
MSG_FIX = 'write it as [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]'


# ---------------------------------------------------------------------- collecting issues
@dataclass
class _Issue:
    fix: str
    rows: list[int] = field(default_factory=list)
    count: int = 0
    detail: str | None = None


class Issues:
    """Bad rows grouped by what is wrong; keeps the first `max_rows` row numbers of each."""

    def __init__(self, field_name: str, max_rows: int = 5, label: str = "row"):
        self.field_name, self.max_rows, self.label = field_name, max(1, max_rows), label
        self._by_message: dict[str, _Issue] = {}

    def add(self, row: int, message: str, fix: str, detail: str | None = None) -> None:
        issue = self._by_message.setdefault(message, _Issue(fix, detail=detail))
        issue.count += 1
        if len(issue.rows) < self.max_rows:
            issue.rows.append(row)

    def __bool__(self) -> bool:
        return bool(self._by_message)

    def problems(self) -> list[Problem]:
        out = []
        for message, issue in sorted(self._by_message.items(), key=lambda kv: kv[1].rows[0]):
            where = rows_text(issue.rows, issue.count, self.label)
            text = f"{where}: {message}" + (f" ({issue.detail})" if issue.detail else "")
            out.append(Problem(self.field_name, text, issue.fix))
        return out


# ---------------------------------------------------------------------- value checks
IMAGE_PART_FIXES = {  # an image part where it is not read: sft image chat is detected from the first rows
    "messages": "put a row with an image among the data's first 20 rows (image chat is detected from them), or "
    "remove the image parts for a text-only run",
    "prompt": "images are trained in sft chat rows and dpo pairs (told from the first 20 rows), not yet in kto, "
    "orpo, cpo, reward or grpo rows: remove the image parts for a text-only run",
}


def _turns_problem(value: Any, name: str) -> tuple[str, str] | None:
    """(problem, fix) when `value` is not a non-empty list of {role: str, content: non-empty str}."""
    if not isinstance(value, list):
        return f"`{name}` is not a list of {{role, content}}", MSG_FIX
    if not value:
        return f"`{name}` is an empty list", f"give `{name}` at least one turn: {MSG_FIX}"
    if not all(isinstance(m, dict) for m in value):
        return f"`{name}` has a turn that is not a {{role, content}} object", MSG_FIX
    if any("role" not in m for m in value):
        return f"`{name}` has a turn without `role`", "give every turn a role: system, user or assistant"
    if any(not isinstance(m["role"], str) for m in value):
        return f"`{name}` has a turn whose `role` is not text", "write each role as system, user or assistant"
    bad = sorted({m["role"] for m in value if m["role"] not in ROLES})
    if bad:
        return f"`{name}` has unknown role `{bad[0]}`", "use the roles " + ", ".join(ROLES)
    calls = _calls_problem(value, name)
    if calls:
        return calls
    if any(("content" not in m or m["content"] is None) and not m.get("tool_calls") for m in value):
        return f"`{name}` has a turn without `content`", "give every turn its text as `content`"
    if shows_image(value):
        return f"`{name}` has an image content part, which is not read here", IMAGE_PART_FIXES.get(
            name, IMAGE_PART_FIXES["prompt"]
        )
    if any(not isinstance(m.get("content", ""), str) for m in value):
        return (
            f"`{name}` has a turn whose `content` is not text",
            "write each turn's content as one string (lists of content parts are not supported)",
        )
    if any(not (m.get("content") or "").strip() and not m.get("tool_calls") for m in value):
        return (
            f"`{name}` has an empty or whitespace-only turn",
            "write the turn's text, or remove the turn (a chat of empty turns trains on nothing)",
        )
    return None


def _calls_problem(value: list[dict[str, Any]], name: str) -> tuple[str, str] | None:
    """(problem, fix) when a turn's `tool_calls` are not the chat template's form (`jobs.data.tool_turns`)."""
    for m in value:
        calls = m.get("tool_calls")
        if calls is None:
            continue
        if m.get("role") != "assistant":
            return f"`{name}` has tool calls in a {m.get('role')} turn", "put tool calls in assistant turns only"
        ok = isinstance(calls, list) and all(
            isinstance(c, dict)
            and isinstance(c.get("function"), dict)
            and isinstance(c["function"].get("name"), str)
            and isinstance(c["function"].get("arguments"), dict)
            for c in calls
        )
        if not ok:
            return (
                f"`{name}` has tool calls that are not {{type, function: {{name, arguments}}}} objects",
                CALL_FIX + "; a `tools` column makes the rows read as tool-calling data",
            )
    return None


def _order_problem(roles: list[str], name: str, *, full_chat: bool) -> tuple[str, str] | None:
    """(problem, fix) when the roles are in an order chat templates cannot render or trl cannot mask."""
    body = roles[1:] if roles[0] == "system" else roles
    if "system" in body:
        return f"`{name}` has a system turn after the first turn", "put the one system turn first, or remove it"
    if not body:
        return f"`{name}` holds only a system turn", "add the user's turn (and the assistant's answer)"
    if body[0] != "user":
        return (
            f"`{name}` starts with {'an' if body[0] == 'assistant' else 'a'} {body[0]} turn",
            "start with a user turn (after an optional system turn)",
        )
    for before, after in zip(body, body[1:]):
        if after == "tool" and before not in ("assistant", "tool"):
            return (
                f"`{name}` has a tool turn that does not follow an assistant turn",
                "put each tool result right after the assistant turn that called the tool",
            )
    if full_chat and body[-1] != "assistant":
        return (
            f"`{name}` ends with a {body[-1]} turn, which nothing learns from",
            "end each chat with the assistant's answer, or remove the trailing turn",
        )
    return None


def repeated_role(roles: list[str]) -> str | None:
    """The first role that follows itself (user, user), which strict chat templates refuse; None if none."""
    return next((a for a, b in zip(roles, roles[1:]) if a == b and a in ("user", "assistant")), None)


def _messages_problem(
    value: Any, name: str, *, need_assistant: bool, only_assistant: bool = False
) -> tuple[str, str] | None:
    """(problem, fix) when `value` is not a usable list of chat messages."""
    found = _turns_problem(value, name)
    if found:
        return found
    roles = [m["role"] for m in value]
    if only_assistant:
        if any(r != "assistant" for r in roles):
            return (
                f"`{name}` holds non-assistant turns",
                f"put only the assistant's answer in `{name}`; earlier turns belong in `prompt`",
            )
        return None
    if need_assistant and "assistant" not in roles:
        return (
            f"`{name}` has no assistant turn",
            "add the answer the model should learn as a message with role assistant",
        )
    return _order_problem(roles, name, full_chat=need_assistant)


def _string_problem(value: Any, name: str, *, allow_empty: bool = False) -> tuple[str, str] | None:
    if not isinstance(value, str):
        if value is None:
            return f"`{name}` is missing", f"give every row a `{name}` value"
        return f"`{name}` is not a string", f"write `{name}` as text"
    if not allow_empty and not value.strip():
        return f"`{name}` is empty", f"give every row a non-empty `{name}`"
    return None


def _style(value: Any) -> str:
    return "conversational" if isinstance(value, list) else "plain"


def row_problems(row: dict[str, Any], fmt: RowFormat) -> tuple[list[tuple[str, str]], str | None]:
    """Every (problem, fix) in one row of format `fmt`, and the row's style (plain / conversational)."""
    present = {k for k, v in row.items() if v is not None}
    own = detect_format(present)
    if fmt is RowFormat.PROMPT_ONLY:
        return _prompt_only_problems(row)
    if own is not None and own is not fmt and set(COLUMNS[own]) <= present:
        cols = ", ".join(
            f"`{c}`" for c in sorted(present & {"text", "messages", "prompt", "completion", "chosen", "rejected"})
        )
        want = " + ".join(f"`{c}`" for c in COLUMNS[fmt])
        return [
            (f"has {cols} instead of {want} (mixed formats in one data set)", f"use one format for every row: {want}")
        ], None
    missing = [c for c in COLUMNS[fmt] if c not in present]
    if missing:
        return [(f"`{c}` is missing", f"give every row a `{c}` value") for c in missing], None
    if fmt is RowFormat.TEXT:
        found = _string_problem(row["text"], "text")
        return ([found] if found else []), None
    if fmt is RowFormat.MESSAGES:
        found = _messages_problem(row["messages"], "messages", need_assistant=True)
        return ([found] if found else []), "conversational"
    if fmt is RowFormat.UNPAIRED and parse_label(row["label"]) is None:
        return [
            (
                f"`label` is `{row['label']}`, not true or false",
                "write label: true for a desirable completion, false for an undesirable one",
            )
        ], None
    answers = ("completion",) if fmt in (RowFormat.PROMPT_COMPLETION, RowFormat.UNPAIRED) else ("chosen", "rejected")
    names = ("prompt", *answers)
    styles = {_style(row[n]) for n in names}
    if len(styles) > 1:
        return [
            (
                f"mixes plain text and message lists across {', '.join(f'`{n}`' for n in names)}",
                "write all of them as strings, or all as lists of {role, content}",
            )
        ], None
    style = styles.pop()
    out: list[tuple[str, str]] = []
    if style == "plain":
        for n in names:
            found = _string_problem(row[n], n, allow_empty=(n == "prompt"))
            if found:
                out.append(found)
    else:
        found = _messages_problem(row["prompt"], "prompt", need_assistant=False)
        if found:
            out.append(found)
        for n in answers:
            found = _messages_problem(row[n], n, need_assistant=True, only_assistant=True)
            if found:
                out.append(found)
    return out, style


def _prompt_only_problems(row: dict[str, Any]) -> tuple[list[tuple[str, str]], str | None]:
    """A GRPO row: a non-empty `prompt` string, or chat messages that end with the user's turn."""
    prompt = row.get("prompt")
    if prompt is None:
        return [("`prompt` is missing", "give every row a `prompt` value")], None
    if not isinstance(prompt, list):
        found = _string_problem(prompt, "prompt")
        return ([found] if found else []), "plain"
    found = _messages_problem(prompt, "prompt", need_assistant=False)
    if found is None and prompt[-1]["role"] == "assistant":
        found = ("`prompt` ends with an assistant turn", "end the prompt with the user's turn: the model answers it")
    return ([found] if found else []), "conversational"


def _chat_of(row: dict[str, Any], fmt: RowFormat) -> list[dict[str, Any]]:
    """The whole conversation of a valid conversational row (prompt + first answer)."""
    if fmt is RowFormat.MESSAGES:
        return row["messages"]
    if fmt is RowFormat.PROMPT_ONLY:
        return row["prompt"]
    answer = "chosen" if fmt is RowFormat.PREFERENCE else "completion"
    return list(row["prompt"]) + list(row[answer])


# ---------------------------------------------------------------------- whole data set
@dataclass
class Checked:
    """What validating every row found."""

    format: RowFormat
    n_rows: int
    preview: list[dict[str, Any]]
    warnings: list[str]
    problems: list[Problem]
    style: str | None  # "plain" | "conversational" | None (text rows)
    repeated_turns: list[tuple[int, list[dict[str, Any]]]] = field(
        default_factory=list
    )  # first few (row, conversation)
    tools: ToolRows = field(default_factory=ToolRows)  # rows with tool schemas, tool calls or tool results


class RowCheck:
    """Validates a data set one row at a time: `add` each (row number, row), then `result()`; bad rows go to
    `issues`."""

    def __init__(self, fmt: RowFormat, issues: Issues, preview_rows: int = 5) -> None:
        self.fmt, self.issues, self.preview_rows = fmt, issues, preview_rows
        self._n_rows, self._same_answer = 0, 0
        self._preview: list[dict[str, Any]] = []
        self._first_style: tuple[int, str] | None = None
        self._repeated: list[int] = []
        self._examples: list[tuple[int, list[dict[str, Any]]]] = []
        self._labels: dict[bool, int] = {True: 0, False: 0}
        self._placeholders = Placeholders()
        self._tools = ToolRows()

    def add(self, number: int, row: dict[str, Any]) -> None:
        """Validate one row against the format."""
        fmt, issues = self.fmt, self.issues
        self._n_rows += 1
        if len(self._preview) < self.preview_rows:
            shown = only_columns(row, fmt, tools="tools" in row)
            converted = row.get("image_sizes") and row.get("images")  # an image row: its images for the thumbnails
            self._preview.append({**shown, "images": row["images"]} if converted else shown)
        self._placeholders.add(number, {c: row.get(c) for c in COLUMNS[fmt]})  # only what trains
        found, style = row_problems(row, fmt)
        for message, fix in found:
            issues.add(number, message, fix)
        if found:
            return
        first = self._first_style
        if style and first is None:
            self._first_style = (number, style)
        elif style and first is not None and style != first[1]:
            # trl decides plain vs conversational from the first row only; Arrow needs one type per column.
            issues.add(
                number,
                f"is {style} where {issues.label} {first[0]} is {first[1]}"
                " (plain strings and message lists mixed in one data set)",
                "use one style for the whole file: all strings, or all lists of {role, content}",
            )
        self._tools.add(number, _chat_of(row, fmt) if style == "conversational" else None, row.get("tools"))
        if fmt is RowFormat.PREFERENCE and row["chosen"] == row["rejected"]:
            self._same_answer += 1
        if fmt is RowFormat.UNPAIRED:
            self._labels[bool(parse_label(row["label"]))] += 1
        if style == "conversational" and repeated_role([m["role"] for m in _chat_of(row, fmt)]):
            self._repeated.append(number)
            if len(self._repeated) <= REPEATED_EXAMPLES:
                self._examples.append((number, _chat_of(row, fmt)))

    def result(self) -> Checked:
        """What validating the rows added so far found."""
        fmt, issues, n_rows, repeated, labels = self.fmt, self.issues, self._n_rows, self._repeated, self._labels
        warnings = []
        if repeated:
            where = rows_text(repeated[:SHOWN_ROWS], len(repeated), issues.label)
            warnings.append(
                f"{where} {'have' if len(repeated) > 1 else 'has'} two user or two assistant turns in a row: fine for most chat "
                "templates, refused by strict ones (Llama 2, Mistral) when training starts; merge such turns"
            )
        if self._same_answer:
            warnings.append(
                f"{self._same_answer} of {n_rows} rows have identical chosen and rejected answers; they teach nothing"
            )
        if fmt is RowFormat.UNPAIRED and labels[True] + labels[False] and not all(labels.values()):
            missing = "undesirable (label false)" if labels[True] else "desirable (label true)"
            warnings.append(
                f"no {missing} rows: kto learns from both kinds; add some, or use sft for desirable rows only"
            )
        unfilled = self._placeholders.warning(issues.label)
        if unfilled:
            warnings.append(unfilled)
        if 0 < n_rows < 8:
            warnings.append(f"only {n_rows} rows: enough for a smoke test, too few to learn much")
        style = self._first_style[1] if self._first_style else None
        return Checked(
            fmt,
            n_rows,
            self._preview,
            warnings,
            issues.problems(),
            style,
            self._examples,
            self._tools,
        )
