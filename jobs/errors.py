"""What every refusal carries: `Problem` (field, what is wrong, the fix) and one exception base.

Every error that reports bad input (a spec, data, a model reference, a file, a CLI flag, a
management request, login settings) is a `ProblemError` with `.problems`; callers catch the
base, never test for the attribute. The module imports nothing of the project, so every layer
can raise and catch it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input: which field, what is wrong, how to fix it."""

    field: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.field}: {self.problem}. Fix: {self.fix}"


class ProblemError(ValueError):
    """Raised with every problem found at once; `str()` lists them (subclasses name the subject)."""

    subject = ""  # e.g. "in the job spec": the headline reads "2 problem(s) in the job spec:"

    def __init__(self, problems: Iterable[Problem]):
        self.problems = list(problems)
        super().__init__(self.message())

    def message(self) -> str:
        if self.subject:
            lines = "\n".join(f"  - {p}" for p in self.problems)
            return f"{len(self.problems)} problem(s) {self.subject}:\n{lines}"
        return "; ".join(str(p) for p in self.problems)
