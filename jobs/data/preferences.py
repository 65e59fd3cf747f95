"""Preference data made by people: the Chat tab's "this one is better" and thumbs, kept as data sets a DPO or KTO
run trains on.

A named set is two JSONL files in `$TUNEDECK_HOME/datasets/preferences/` (a data folder: a dashboard with a login
reads it too): `NAME.dpo.jsonl`, one pair per line in tunedeck's preference format (`prompt` the conversation so far
as turns, `chosen` and `rejected` one assistant turn each), and `NAME.kto.jsonl`, one judged answer per line
(`prompt`, `completion`, `label`). Either file is a `dataset:` as it is (`trainer: dpo` / `trainer: kto`). A row
is appended whole, under a lock, so two tabs picking at once never interleave. Only text turns are kept: a turn
with an image is refused (its picture is not part of the row).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.errors import Problem, ProblemError

DEFAULT_SET = "chat-preferences"
KINDS = {"dpo": "pairs of a better and a worse answer", "kto": "single answers judged good or bad"}
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class Turn:
    """One message of the conversation a preference is about."""

    role: str  # system, user or assistant
    content: str
    image: bool = False


@dataclass(frozen=True)
class PreferenceSet:
    name: str
    dpo: Path
    kto: Path
    pairs: int
    judged: int


def folder() -> Path:
    from storage.settings import data_dir

    return data_dir() / "datasets" / "preferences"


def check_name(name: str, field: str = "preference_set") -> str:
    """The set's name, or ProblemError: letters, digits, `-` and `_`, up to 64 characters."""
    name = (name or "").strip()
    if not NAME_RE.match(name):
        raise ProblemError(
            [
                Problem(
                    field,
                    f"`{name}` is not a data set name (letters, digits, - and _, up to 64 characters)",
                    f"name it e.g. {DEFAULT_SET}",
                )
            ]
        )
    return name


def path_of(name: str, kind: str) -> Path:
    return folder() / f"{check_name(name)}.{kind}.jsonl"


def _messages(turns: Sequence[Turn]) -> list[dict[str, str]]:
    if any(t.image for t in turns):
        raise ProblemError(
            [
                Problem(
                    "conversation",
                    "a turn of this conversation carries an image, which a preference row cannot hold",
                    "pick preferences in a text-only conversation (Clear conversation starts one)",
                )
            ]
        )
    return [{"role": t.role, "content": t.content} for t in turns]


def _prompt_problem(prompt: Sequence[Turn]) -> None:
    if not prompt or prompt[-1].role != "user":
        raise ProblemError(
            [Problem("conversation", "there is no answered message yet", "send a message and wait for both answers")]
        )


def _answer_problem(answer: str, which: str) -> None:
    if not answer.strip():
        raise ProblemError(
            [Problem(which, "the answer is empty", "wait until it has finished, or regenerate it before choosing")]
        )


def _append(path: Path, row: dict[str, Any]) -> int:
    """Append one row (one write, under an exclusive lock); the file's row count after it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
    with open(path, "ab+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
            f.seek(0)
            return sum(1 for raw in f if raw.strip())
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def add_pair(name: str, prompt: Sequence[Turn], chosen: str, rejected: str) -> int:
    """One DPO pair appended to set `name`; the number of pairs it holds now."""
    _prompt_problem(prompt)
    _answer_problem(chosen, "chosen")
    _answer_problem(rejected, "rejected")
    if chosen.strip() == rejected.strip():
        raise ProblemError(
            [
                Problem(
                    "chosen",
                    "both answers are the same text, so the pair teaches nothing",
                    "regenerate with a temperature above 0, or judge the one answer with a thumb instead",
                )
            ]
        )
    row = {
        "prompt": _messages(prompt),
        "chosen": [{"role": "assistant", "content": chosen}],
        "rejected": [{"role": "assistant", "content": rejected}],
    }
    return _append(path_of(name, "dpo"), row)


def add_judgement(name: str, prompt: Sequence[Turn], answer: str, good: bool) -> int:
    """One KTO row (an answer judged good or bad) appended to set `name`; the number of rows it holds now."""
    _prompt_problem(prompt)
    _answer_problem(answer, "answer")
    row = {"prompt": _messages(prompt), "completion": [{"role": "assistant", "content": answer}], "label": good}
    return _append(path_of(name, "kto"), row)


def _rows(path: Path) -> int:
    if not path.is_file():
        return 0
    with open(path, "rb") as f:
        return sum(1 for raw in f if raw.strip())


def sets() -> list[PreferenceSet]:
    """Every preference set in the data folder, by name."""
    names = sorted({p.name.split(".")[0] for p in folder().glob("*.jsonl")} if folder().is_dir() else set())
    out = []
    for name in names:
        if NAME_RE.match(name):
            dpo, kto = path_of(name, "dpo"), path_of(name, "kto")
            out.append(PreferenceSet(name, dpo, kto, _rows(dpo), _rows(kto)))
    return out


def files() -> list[str]:
    """The sets' files that hold rows (the form's data picker lists them)."""
    return [str(p) for s in sets() for p, n in ((s.dpo, s.pairs), (s.kto, s.judged)) if n]
