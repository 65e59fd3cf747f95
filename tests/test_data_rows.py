"""Bad chat rows: each refused with its row number and a fix, never a traceback.

The property tests feed the data checker random rows built from the pieces real files are made
of (message lists with missing, empty, odd or reordered turns; Alpaca, ShareGPT and trl columns).
CI runs the default number of examples with the derandomized profile; to search harder locally:

    TUNEDECK_HYPOTHESIS_EXAMPLES=2000 python -m pytest tests/test_data_rows.py -q -k random
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.data.inspection import DatasetInfo, check_dataset
from jobs.data.sources import DataError
from jobs.errors import Problem
from jobs.spec.enums import Trainer

EXAMPLES = int(os.environ.get("TUNEDECK_HYPOTHESIS_EXAMPLES", "60"))
SEARCH = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))


def write_jsonl(path: Path, rows: list[Any]) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def problems_text(ref: str, trainer: Trainer = Trainer.SFT) -> str:
    with pytest.raises(DataError) as err:
        check_dataset(ref, trainer)
    return "\n".join(str(p) for p in err.value.problems)


def turn(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


GOOD = {"messages": [turn("user", "Hi?"), turn("assistant", "Hello.")]}


# ---------------------------------------------------------------------- named bad rows
@pytest.mark.parametrize(
    "bad,words",
    [
        ({"messages": [{}]}, "row 2: `messages` has a turn without `role`. Fix: give every turn a role"),
        ({"messages": [{"role": "user"}, turn("assistant", "a")]}, "row 2: `messages` has a turn without `content`"),
        ({"messages": [{"content": "q"}, turn("assistant", "a")]}, "row 2: `messages` has a turn without `role`"),
        ({"messages": [turn("user", "q"), {"role": "assistant", "content": None}]}, "turn without `content`"),
        (
            {"messages": [turn("user", "q"), {"role": "assistant", "content": [{"type": "text"}]}]},
            "`content` is not text. Fix: write each turn's content as one string",
        ),
        ({"messages": [{"role": 3, "content": "q"}, turn("assistant", "a")]}, "`role` is not text"),
        (
            {"messages": [turn("user", "   "), turn("assistant", "a")]},
            "row 2: `messages` has an empty or whitespace-only turn",
        ),
        (
            {"messages": [turn("user", ""), turn("assistant", "")]},
            "empty or whitespace-only turn. Fix: write the turn's text",
        ),
        ({"messages": [turn("user", "q"), turn("assistant", "\n\t")]}, "empty or whitespace-only turn"),
        ({"messages": []}, "row 2: `messages` is an empty list"),
        ({"messages": ["hi", "there"]}, "has a turn that is not a {role, content} object"),
        (
            {"messages": [turn("assistant", "a"), turn("user", "q"), turn("assistant", "b")]},
            "row 2: `messages` starts with an assistant turn. Fix: start with a user turn",
        ),
        ({"messages": [turn("system", "s"), turn("assistant", "a")]}, "starts with an assistant turn"),
        (
            {"messages": [turn("user", "q"), turn("system", "s"), turn("assistant", "a")]},
            "system turn after the first turn",
        ),
        ({"messages": [turn("user", "q")]}, "row 2: `messages` has no assistant turn"),
        ({"messages": [turn("system", "s"), turn("user", "q")]}, "has no assistant turn"),
        ({"messages": [turn("user", "q"), turn("assistant", "a"), turn("user", "more?")]}, "ends with a user turn"),
        (
            {"messages": [turn("user", "q"), turn("tool", "42"), turn("assistant", "a")]},
            "tool turn that does not follow an assistant turn",
        ),
        ({"messages": [turn("robot", "q"), turn("assistant", "a")]}, "unknown role `robot`"),
        (
            {"prompt": [turn("assistant", "q")], "completion": [turn("assistant", "a")]},
            "`prompt` starts with an assistant turn",
        ),
        (
            {"prompt": [turn("user", "")], "completion": [turn("assistant", "a")]},
            "`prompt` has an empty or whitespace-only turn",
        ),
        (
            {"prompt": [turn("user", "q")], "completion": [{"role": "assistant"}]},
            "`completion` has a turn without `content`",
        ),
    ],
)
def test_bad_chat_rows_named(tmp_path: Path, bad: dict, words: str) -> None:
    good = GOOD if "messages" in bad else {"prompt": [turn("user", "q")], "completion": [turn("assistant", "a")]}
    text = problems_text(write_jsonl(tmp_path / "d.jsonl", [good, bad, good]))
    assert words in text, text
    assert "Traceback" not in text and "KeyError" not in text


def test_all_empty_chats_are_refused(tmp_path: Path) -> None:
    """A file whose user and assistant turns are all empty strings trains on nothing: refused."""
    empty = {"messages": [turn("user", ""), turn("assistant", "")]}
    text = problems_text(write_jsonl(tmp_path / "d.jsonl", [empty] * 9))
    assert "rows 1, 2, 3, 4, 5 (and 4 more): `messages` has an empty or whitespace-only turn" in text


def test_tool_turns_after_an_assistant_pass(tmp_path: Path) -> None:
    row = {
        "messages": [turn("user", "2+2?"), turn("assistant", "calling calc"), turn("tool", "4"), turn("assistant", "4")]
    }
    assert check_dataset(write_jsonl(tmp_path / "d.jsonl", [row] * 8), Trainer.SFT).n_rows == 8


def test_repeated_roles_warn_with_row_numbers(tmp_path: Path) -> None:
    twice = {"messages": [turn("user", "a"), turn("user", "b"), turn("assistant", "c")]}
    info = check_dataset(write_jsonl(tmp_path / "d.jsonl", [GOOD, twice, GOOD, twice] * 2), Trainer.SFT)
    assert any(w.startswith("rows 2, 4, 6, 8 have two user or two assistant turns in a row") for w in info.warnings)


def test_preview_of_a_bad_row_does_not_crash(tmp_path: Path) -> None:
    """The preview collects rows before they are checked: odd turns must not break it."""
    text = problems_text(write_jsonl(tmp_path / "d.jsonl", [{"messages": [{}, 5, {"role": "user"}]}]))
    assert "row 1: `messages` has a turn that is not a {role, content} object" in text


# ---------------------------------------------------------------------- property search
ROLE_NAMES = st.sampled_from(["system", "user", "assistant", "tool", "human", "gpt", "", "robot"])
TEXTS = st.one_of(st.text(max_size=6), st.sampled_from(["", " ", "\n", "hi"]))
ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(allow_nan=True, allow_infinity=True),
    TEXTS,
    st.lists(TEXTS, max_size=2),
    st.dictionaries(st.sampled_from(["type", "text"]), TEXTS, max_size=2),
)
TURN_KEYS = st.sampled_from(["role", "content", "from", "value", "name", "weight"])
TURNS = st.one_of(
    st.fixed_dictionaries({"role": ROLE_NAMES, "content": TEXTS}),
    st.fixed_dictionaries({"from": ROLE_NAMES, "value": TEXTS}),
    st.dictionaries(TURN_KEYS, st.one_of(ROLE_NAMES, ODD), max_size=3),
    ODD,
)
CHATS = st.one_of(st.lists(TURNS, max_size=5), ODD)
COLUMN = st.sampled_from(
    [
        "messages",
        "conversations",
        "prompt",
        "completion",
        "chosen",
        "rejected",
        "text",
        "instruction",
        "input",
        "output",
        "system",
        "history",
        "label",
        "data",
        "x",
    ]
)
ROWS = st.one_of(
    st.dictionaries(COLUMN, st.one_of(CHATS, TEXTS, ODD), max_size=4),
    st.fixed_dictionaries({"messages": CHATS}),
    st.fixed_dictionaries({"conversations": CHATS}),
    st.fixed_dictionaries({"prompt": st.one_of(CHATS, TEXTS), "completion": st.one_of(CHATS, TEXTS)}),
    st.fixed_dictionaries(
        {"instruction": st.one_of(TEXTS, ODD), "output": st.one_of(TEXTS, ODD)},
        optional={"input": TEXTS, "system": TEXTS, "history": st.lists(st.lists(TEXTS, max_size=3), max_size=2)},
    ),
    ODD,
)


def assert_only_data_errors(ref: str, trainer: Trainer) -> None:
    """check_dataset returns info with rows, or raises DataError whose problems name field, problem and fix."""
    try:
        info = check_dataset(ref, trainer)
    except DataError as exc:
        assert exc.problems
        for p in exc.problems:
            assert isinstance(p, Problem) and p.field == "dataset" and p.problem and p.fix
    else:
        assert isinstance(info, DatasetInfo) and info.n_rows > 0


@SEARCH
@given(
    rows=st.lists(ROWS, max_size=5),
    trainer=st.sampled_from(list(Trainer)),
    wrap=st.sampled_from(["jsonl", "array", "data"]),
)
def test_random_chat_rows_only_data_error(
    tmp_path_factory: pytest.TempPathFactory, rows: list[Any], trainer: Trainer, wrap: str
) -> None:
    path = tmp_path_factory.mktemp("rows") / ("d.jsonl" if wrap == "jsonl" else "d.json")
    if wrap == "jsonl":
        write_jsonl(path, rows)
    else:
        path.write_text(json.dumps(rows if wrap == "array" else {"data": rows}), encoding="utf-8")
    assert_only_data_errors(str(path), trainer)
