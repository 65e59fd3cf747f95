"""What the content findings need of a stream of rows (`jobs.data.audit.content` turns it into findings).

A row is looked at once and let go: each finding keeps its count and its first rows (`Shown`); one answer given
to different prompts is found from three compact columns, one entry per (row, answer): the answer's hash, its
prompt's hash and the row's index, with the first words of an answer kept only once it is seen a second time.

    tally = ContentTally()
    tally.add_train(index, row, thinking)   # each training row (`jobs.data.audit.rows.Row`), in file order
    tally.add_text(row)                # every row, training and eval: characters that are not text
    tally.repeated()                   # Repeated or None
"""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass, field

import numpy as np

from jobs.data.audit.findings import Shown
from jobs.data.audit.rows import Row

SHORT_ANSWER = 3  # characters: answers shorter than this are named (info)
REPEATED_ANSWER = 20  # characters: shorter answers ("Yes") may well answer several prompts
REPEATED_PROMPTS = 5  # prompts one answer is given to: fewer are often paraphrases of one question
WORD = re.compile(r"[^\W_]")  # a letter or digit: an answer without one ("", "...", "-") says nothing
NOT_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")
QUOTED = 60  # characters of the most repeated answer quoted


@dataclass(frozen=True)
class Repeated:
    """Answers given to `REPEATED_PROMPTS` different prompts or more."""

    rows: np.ndarray  # the training rows (indices) that give one of them, sorted
    answers: int  # how many such answers
    top_prompts: int  # prompts of the most repeated one
    top: str  # its first `QUOTED` characters


def size(answer: str) -> int:
    return len(answer.strip())


@dataclass
class ContentTally:
    empty: Shown = field(default_factory=Shown)
    short: Shown = field(default_factory=Shown)
    same: Shown = field(default_factory=Shown)  # chosen identical to rejected
    thinking: Shown = field(default_factory=Shown)
    not_text: Shown = field(default_factory=Shown)
    broken: int = 0  # rows with U+FFFD
    labelled: int = 0
    good: int = 0  # desirable kto rows
    _answer: array = field(default_factory=lambda: array("q"))
    _prompt: array = field(default_factory=lambda: array("q"))
    _holder: array = field(default_factory=lambda: array("q"))
    _seen: set[int] = field(default_factory=set)
    _quoted: dict[int, str] = field(default_factory=dict)

    def add_train(self, index: int, row: Row, thinking: bool = False) -> None:
        """A training row; `thinking`: it carries reasoning (`jobs.data.thinking.has_thinking` of its answers)."""
        where = (row.field, row.source, row.number)
        if any(not WORD.search(a) for a in row.answers):
            self.empty.add(*where)
        elif row.answers and min(map(size, row.answers)) < SHORT_ANSWER:
            self.short.add(*where)
        if len(row.answers) == 2 and row.label is None and row.answers[0] == row.answers[1]:
            self.same.add(*where)
        if row.label is not None:
            self.labelled += 1
            self.good += bool(row.label)
        if thinking:
            self.thinking.add(*where)
        if row.prompt:
            self._answers(index, row)

    def _answers(self, index: int, row: Row) -> None:
        prompt = int.from_bytes(row.prompt, "little", signed=True)
        for a in dict.fromkeys(row.answers):
            if size(a) < REPEATED_ANSWER:
                continue
            h = hash(a)
            self._answer.append(h)
            self._prompt.append(prompt)
            self._holder.append(index)
            if h not in self._seen:
                self._seen.add(h)
            elif h not in self._quoted:
                self._quoted[h] = a[:QUOTED]

    def add_text(self, row: Row) -> None:
        if NOT_TEXT.search(row.text):
            self.not_text.add(row.field, row.source, row.number)
            self.broken += "\ufffd" in row.text

    def repeated(self) -> Repeated | None:
        """The answers given to `REPEATED_PROMPTS` prompts or more, and the rows giving them."""
        answer = np.frombuffer(self._answer, dtype=np.int64) if len(self._answer) else np.zeros(0, np.int64)
        if not len(answer):
            return None
        prompt = np.frombuffer(self._prompt, dtype=np.int64)
        order = np.lexsort((prompt, answer))
        a, p = answer[order], prompt[order]
        new_pair = np.concatenate(([True], (a[1:] != a[:-1]) | (p[1:] != p[:-1])))
        answers, prompts = np.unique(a[new_pair], return_counts=True)  # distinct prompts per answer
        _, first_seen = np.unique(answer, return_index=True)  # the same answers, in the same (sorted) order
        many = prompts >= REPEATED_PROMPTS
        if not many.any():
            return None
        holders = np.frombuffer(self._holder, dtype=np.int64)
        rows = np.unique(holders[np.isin(answer, answers[many])])
        candidates = np.flatnonzero(many)
        top = candidates[np.lexsort((first_seen[candidates], -prompts[candidates]))[0]]
        return Repeated(rows, int(many.sum()), int(prompts[top]), self._quoted[int(answers[top])])
