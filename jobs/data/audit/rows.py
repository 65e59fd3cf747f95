"""The rows an audit compares (`jobs.data.audit.reading` reads them): what each row is, computed once.

A row keeps its place as the checks name it: (field, source index, row number), and what the findings compare:
its key (the row as trl reads it, as canonical JSON, hashed), its text (every string in it), its prompt and its
answers. Pure: rows in, `Row`s out; training's `dedupe` (`jobs.data.audit.dedupe`) keys rows the same way.

    make_row("dataset", 0, 7, row, RowFormat.MESSAGES)   # looked at by `jobs.data.audit.scanned.AuditData.add`, not kept
    row_key(row, fmt)                  # the same key for a checked row and a `datasets` row (`jobs.data.audit.dedupe`)
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jobs.data.row_formats import COLUMNS, RowFormat, only_columns


@dataclass(frozen=True)
class Row:
    """One row as the findings read it."""

    field: str  # "dataset" or "eval_dataset"
    source: int  # the index of its source in that field
    number: int  # its number as the checks name it (line number for JSON lines)
    key: bytes  # the row as trl reads it, hashed
    text: str  # every string in it, for the near-duplicate search
    prompt: bytes  # the prompt's text (chat turns before the last answer), hashed; b'' when none
    answers: tuple[str, ...]  # the answers: assistant turns, completion, chosen and rejected
    label: bool | None = None  # kto's label

    @property
    def origin(self) -> tuple[int, int]:
        return self.source, self.number


class Places:
    """Each row's (source index, row number), two compact columns: what a finding names a row by."""

    def __init__(self) -> None:
        self._sources = array("i")
        self._numbers = array("q")

    def __len__(self) -> int:
        return len(self._numbers)

    def append(self, source: int, number: int) -> None:
        self._sources.append(source)
        self._numbers.append(number)

    def at(self, index: int) -> tuple[int, int]:
        return self._sources[index], self._numbers[index]


def _plain(value: Any) -> Any:
    """`value` without None entries in dicts (a `datasets` row fills absent keys with None)."""
    if isinstance(value, dict):
        return {k: (_plain(v) if isinstance(v, (dict, list)) else v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [(_plain(v) if isinstance(v, (dict, list)) else v) for v in value]
    return value


def trl_columns(row: dict[str, Any], fmt: RowFormat, extra: Sequence[str] = ()) -> dict[str, Any]:
    """What trl reads of `row`: its format's columns (labels as bools), tool schemas, its images, and the `extra`
    columns grpo hands to its reward functions (two prompts with different reference answers differ)."""
    out = _plain(only_columns(row, fmt, tools=True))
    if row.get("images") is not None:
        out["images"] = row["images"]
    for c in extra:
        out[f"extra:{c}"] = row.get(c)
    return out


def row_key(row: dict[str, Any], fmt: RowFormat) -> bytes:
    """A row's identity: two rows with the same key train the same (images compared by their text form)."""
    return key_of(trl_columns(row, fmt))


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()


def key_of(trl: dict[str, Any]) -> bytes:
    """The key of a row already reduced to what trl reads (`trl_columns`)."""
    text = json.dumps(trl, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _strings(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for k in ("content", "text"):  # a message's or a content part's words, not its role
            if k in value:
                _strings(value[k], out)
    elif isinstance(value, list):
        for v in value:
            _strings(v, out)


def text_of(value: Any) -> str:
    """Every string of a cell (chat turns' contents, content parts' text), joined by spaces."""
    out: list[str] = []
    _strings(value, out)
    return " ".join(out)


def words_of(trl: dict[str, Any], fmt: RowFormat, extra: Sequence[str] = ()) -> str:
    """A row's words for the near-duplicate search: its columns' text (not its tool schemas) and its `extra`
    columns' values."""
    cells = [trl.get(c) for c in COLUMNS[fmt] if c != "label"]
    values = [trl.get(f"extra:{c}") for c in extra]
    return " ".join([text_of(cells), *(v if isinstance(v, str) else json.dumps(v, default=str) for v in values)])


def _split(row: dict[str, Any], fmt: RowFormat) -> tuple[Any, tuple[str, ...]]:
    """(the prompt, the answers) of a row in format `fmt`."""
    if fmt is RowFormat.MESSAGES:
        turns = row.get("messages") or []
        said = [i for i, t in enumerate(turns) if isinstance(t, dict) and t.get("role") == "assistant"]
        answers = tuple(text_of(turns[i].get("content")) for i in said if not turns[i].get("tool_calls"))
        return (turns[: said[-1]] if said else turns), answers
    if fmt is RowFormat.PREFERENCE:
        return row.get("prompt"), (text_of(row.get("chosen")), text_of(row.get("rejected")))
    if fmt in (RowFormat.PROMPT_COMPLETION, RowFormat.UNPAIRED):
        return row.get("prompt"), (text_of(row.get("completion")),)
    return None, ()  # text rows and grpo's prompts: no answer to audit


def make_row(
    field_name: str, source: int, number: int, row: dict[str, Any], fmt: RowFormat, extra: Sequence[str] = ()
) -> Row:
    trl = trl_columns(row, fmt, extra)
    prompt, answers = _split(trl, fmt)
    return Row(
        field_name,
        source,
        number,
        key_of(trl),
        words_of(trl, fmt, extra),
        _digest(text_of(prompt)) if prompt is not None else b"",
        answers,
        trl.get("label") if fmt is RowFormat.UNPAIRED else None,
    )
