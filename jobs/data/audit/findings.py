"""What an audit found: one `Finding` per kind of trouble, with its count, its first rows and its fix.

A finding names rows as the user's files number them, per field and source ("rows 2, 5 of `a.jsonl`",
`jobs.data.row_numbers`). `Severity.WARNING`: the run would learn something the user most likely does not mean
(duplicates, eval rows in training, empty answers); `Severity.INFO`: worth a look, often meant (short answers,
a mixture's shares).

    Finding("duplicate-rows", Severity.WARNING, 12, rows, "12 training rows repeat an earlier row", "set dedupe: true")
    finding.text(refs)               # one line: '[warning] duplicate-rows: ... (rows 4, 9 of `a.jsonl`). Fix: ...'
"""

from __future__ import annotations

from bisect import insort
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from jobs.data.row_numbers import origins_text

SHOWN = 5  # rows named per finding and source


class Severity(str, Enum):
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True)
class Finding:
    """One kind of trouble in the rows: `rows` are the first (field, source index, row number) it was seen at."""

    code: str
    severity: Severity
    count: int
    rows: tuple[tuple[str, int, int], ...]
    problem: str
    fix: str

    def where(self, refs: dict[str, list[str]]) -> str:
        """The rows named, per field: 'rows 2, 5 of `a.jsonl`; eval: row 3 of `b.jsonl`'."""
        parts = []
        for name in dict.fromkeys(f for f, _, _ in self.rows):
            origins = [(s, n) for f, s, n in self.rows if f == name]
            text = origins_text(origins, refs.get(name, []), shown=SHOWN)
            parts.append(text if name == "dataset" else f"eval data: {text}")
        return "; ".join(parts)

    def text(self, refs: dict[str, list[str]]) -> str:
        where = self.where(refs)
        return (
            f"[{self.severity.value}] {self.code}: {self.problem}"
            + (f" ({where})" if where else "")
            + (f". Fix: {self.fix}" if self.fix else "")
        )

    def record(self, refs: dict[str, list[str]]) -> dict[str, Any]:
        """The finding as JSON for the API and `tunedeck data audit --json`."""
        return {
            "code": self.code,
            "severity": self.severity.value,
            "count": self.count,
            "rows": [{"field": f, "source": refs.get(f, ["?"])[s], "row": n} for f, s, n in self.rows],
            "problem": self.problem,
            "fix": self.fix,
        }


@dataclass
class Shown:
    """A count of rows and the first of them a finding names, kept as the rows come (in any order): the `shown`
    lowest row numbers of each (field, source), nothing else."""

    count: int = 0
    shown: int = SHOWN
    _numbers: dict[tuple[str, int], list[int]] = field(default_factory=dict)

    def add(self, field_name: str, source: int, number: int) -> None:
        self.count += 1
        kept = self._numbers.setdefault((field_name, source), [])
        if len(kept) < self.shown:
            insort(kept, number)
        elif number < kept[-1]:
            kept.pop()
            insort(kept, number)

    def rows(self) -> tuple[tuple[str, int, int], ...]:
        """The rows named: by field (training first), source and row number."""
        places = sorted(self._numbers, key=lambda k: (k[0] != "dataset", k[1]))
        return tuple((f, s, n) for f, s in places for n in self._numbers[(f, s)])
