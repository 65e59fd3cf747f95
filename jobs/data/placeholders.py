"""Unfilled template placeholders in training rows: `{{name}}`-style fields that train as literal text.

Data sets meant to be filled in before training carry them (LLaMA-Factory's `identity.json`:
"I am {{name}}, an AI assistant developed by {{author}}."); trained as they are, the model learns
to say "{{name}}". The row check hands each row's trl columns in and gets one warning back naming
the first rows and the placeholders found. Pure: strings in, names out.

    found = Placeholders()
    found.add(3, {"prompt": "hi", "completion": "I am {{name}}."})
    found.warning("row")       # 'row 3 holds the unfilled template placeholder {{name}}: ...'
"""

from __future__ import annotations

import re
from typing import Any

from jobs.data.row_numbers import SHOWN_ROWS, rows_text

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_.\-]*)\s*\}\}")
SHOWN_NAMES = 8


def placeholders_in(value: Any) -> list[str]:
    """The placeholder names in `value` (a string, or lists and dicts of them), in order, each once."""
    found: dict[str, None] = {}
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "{{" in item:
                found.update(dict.fromkeys(PLACEHOLDER.findall(item)))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return list(found)


class Placeholders:
    """The rows that hold placeholders (first few numbers, and how many) and the names found."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.count = 0
        self.names: dict[str, None] = {}

    def add(self, number: int, row: dict[str, Any]) -> None:
        names = placeholders_in(row)
        if not names:
            return
        self.count += 1
        if len(self.rows) < SHOWN_ROWS:
            self.rows.append(number)
        self.names.update(dict.fromkeys(names))

    def warning(self, label: str = "row") -> str | None:
        """One warning naming the rows and the placeholders; None when no row has any."""
        if not self.count:
            return None
        where = rows_text(self.rows, self.count, label)
        names = list(self.names)
        shown = ", ".join("{{" + n + "}}" for n in names[:SHOWN_NAMES])
        if len(names) > SHOWN_NAMES:
            shown += f" and {len(names) - SHOWN_NAMES} more"
        what = "placeholders" if len(names) > 1 else "placeholder"
        verb = "hold" if self.count > 1 else "holds"
        return (
            f"{where} {verb} the unfilled template {what} {shown}, which would train as literal text: "
            "fill them in with the real values before training (ignore this if the braces are meant literally)"
        )
