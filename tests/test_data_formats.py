"""Data in the shapes people bring: Alpaca, ShareGPT, OpenAI-style chat, JSON arrays and wrappers,
BOM, CRLF, gzip, and `dataset_columns` - each detected, converted, previewed and trainable."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from jobs.data.inspection import check_dataset
from jobs.data.loading import load_data
from jobs.data.row_formats import RowFormat
from jobs.data.sources import DataError
from jobs.spec.enums import Trainer
from jobs.spec.job import JobSpec, SpecError

SFT, DPO = Trainer.SFT, Trainer.DPO


def lines(rows: list[Any], newline: str = "\n") -> str:
    return "".join(json.dumps(r) + newline for r in rows)


def write(path: Path, text: str, *, bom: bool = False) -> str:
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    return str(path)


def problems_text(ref: str, trainer: Trainer = SFT, **kw: Any) -> str:
    with pytest.raises(DataError) as err:
        check_dataset(ref, trainer, **kw)
    return "\n".join(str(p) for p in err.value.problems)


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


ALPACA = [{"instruction": f"Name a colour ({i}).", "input": "", "output": "Blue."} for i in range(8)]
SHAREGPT = [
    {"conversations": [{"from": "human", "value": f"Hi {i}?"}, {"from": "gpt", "value": "Hello."}]} for i in range(8)
]
CHAT = [{"messages": [user(f"Hi {i}?"), assistant("Hello.")]} for i in range(8)]


# ---------------------------------------------------------------------- Alpaca
def test_alpaca_becomes_conversational_prompt_completion(tmp_path: Path) -> None:
    rows = [
        {
            "instruction": "Translate.",
            "input": "chat",
            "output": "cat",
            "system": "Be brief.",
            "history": [["Hi", "Hello"]],
        }
    ] + ALPACA
    info = check_dataset(write(tmp_path / "a.json", json.dumps(rows)), SFT)
    assert (info.source_format, info.format, info.n_rows) == ("alpaca", RowFormat.PROMPT_COMPLETION, 9)
    assert info.conversion.startswith("Alpaca instruction/input/system/history converted to conversational")
    assert info.preview[0] == {
        "prompt": [
            {"role": "system", "content": "Be brief."},
            user("Hi"),
            assistant("Hello"),
            user("Translate.\n\nchat"),
        ],
        "completion": [assistant("cat")],
    }
    assert info.preview[1]["prompt"] == [user("Name a colour (0).")]  # empty input adds nothing
    assert info.warnings == []  # instruction/input/output/system/history are all used


def test_alpaca_preference_rows_train_dpo(tmp_path: Path) -> None:
    rows = [{"instruction": f"Greet {i}.", "chosen": "Hi!", "rejected": "Go away."} for i in range(8)]
    info = check_dataset(write(tmp_path / "p.jsonl", lines(rows)), DPO)
    assert (info.source_format, info.format) == ("alpaca", RowFormat.PREFERENCE)
    assert info.preview[0] == {
        "prompt": [user("Greet 0.")],
        "chosen": [assistant("Hi!")],
        "rejected": [assistant("Go away.")],
    }


@pytest.mark.parametrize(
    "bad,words",
    [
        ({"instruction": "", "output": "x"}, "row 2: `instruction` is empty"),
        ({"instruction": "q", "output": "  "}, "row 2: `output` is empty"),
        ({"instruction": 5, "output": "x"}, "row 2: `instruction` is not a string"),
        ({"output": "x"}, "row 2: `instruction` is missing"),
        (
            {"instruction": "q", "output": "x", "history": [["only one"]]},
            "`history` is not a list of [question, answer] pairs",
        ),
    ],
)
def test_bad_alpaca_rows_named(tmp_path: Path, bad: dict, words: str) -> None:
    assert words in problems_text(write(tmp_path / "a.jsonl", lines([ALPACA[0], bad, ALPACA[1]])))


# ---------------------------------------------------------------------- ShareGPT
def test_sharegpt_speakers_and_system_column(tmp_path: Path) -> None:
    row = {
        "system": "You are terse.",
        "conversations": [
            {"from": "human", "value": "2+2?"},
            {"from": "gpt", "value": "calling calc"},
            {"from": "tool", "value": "4"},
            {"from": "gpt", "value": "4"},
        ],
    }
    info = check_dataset(write(tmp_path / "s.jsonl", lines([row] + SHAREGPT)), SFT)
    assert (info.source_format, info.format) == ("sharegpt", RowFormat.MESSAGES)
    assert "plus the `system` column" in info.conversion
    assert info.preview[0]["messages"] == [
        {"role": "system", "content": "You are terse."},
        user("2+2?"),
        assistant("calling calc"),
        {"role": "tool", "content": "4"},
        assistant("4"),
    ]


def test_sharegpt_turns_under_messages(tmp_path: Path) -> None:
    rows = [{"messages": r["conversations"]} for r in SHAREGPT]
    info = check_dataset(write(tmp_path / "s.jsonl", lines(rows)), SFT)
    assert info.source_format == "sharegpt" and info.preview[0]["messages"] == [user("Hi 0?"), assistant("Hello.")]


@pytest.mark.parametrize(
    "bad,words",
    [
        ({"conversations": [{"from": "alien", "value": "x"}]}, "row 2: `conversations` has unknown speaker `alien`"),
        ({"conversations": [{"from": "human"}]}, "row 2: `conversations` has a turn without `from` or `value`"),
        ({"conversations": "hi"}, "row 2: `conversations` is not a list of {from, value} turns"),
        (
            {"conversations": [{"from": "gpt", "value": "a"}, {"from": "human", "value": "q"}]},
            "row 2: `messages` starts with an assistant turn",
        ),
        (
            {"conversations": [{"from": "human", "value": ""}, {"from": "gpt", "value": ""}]},
            "empty or whitespace-only turn",
        ),
        ({"conversations": [{"from": "human", "value": "q"}]}, "has no assistant turn"),
    ],
)
def test_bad_sharegpt_rows_named(tmp_path: Path, bad: dict, words: str) -> None:
    assert words in problems_text(write(tmp_path / "s.jsonl", lines([SHAREGPT[0], bad, SHAREGPT[1]])))


# ---------------------------------------------------------------------- OpenAI-style chat
def test_openai_chat_extra_keys_are_ignored(tmp_path: Path) -> None:
    rows = [
        {
            "id": f"c{i}",
            "messages": [
                {"role": "system", "content": "Be kind.", "name": "policy"},
                {"role": "user", "content": "Hi?", "name": "ann"},
                {"role": "assistant", "content": "Hello.", "weight": 1},
            ],
        }
        for i in range(8)
    ]
    ref = write(tmp_path / "o.jsonl", lines(rows))
    info = check_dataset(ref, SFT)
    assert (info.source_format, info.conversion) == ("trl", None)
    loaded = load_data(JobSpec(dataset=ref))
    assert loaded.train.column_names == ["messages"]
    assert loaded.train[0]["messages"][1] == user("Hi?")


# ---------------------------------------------------------------------- containers and encodings
@pytest.mark.parametrize(
    "name,text,bom",
    [
        ("bom.jsonl", lines(CHAT), True),
        ("crlf.jsonl", lines(CHAT, "\r\n"), False),
        ("bom-crlf.jsonl", lines(CHAT, "\r\n"), True),
        ("array.json", json.dumps(CHAT, indent=2), False),
        ("array-in.jsonl", json.dumps(CHAT), False),
        ("wrapped.json", json.dumps({"version": 2, "data": CHAT}, indent=1), False),
        ("wrapped-crlf-bom.json", json.dumps({"rows": CHAT}, indent=1).replace("\n", "\r\n"), True),
    ],
)
def test_containers_and_encodings(tmp_path: Path, name: str, text: str, bom: bool) -> None:
    ref = write(tmp_path / name, text, bom=bom)
    info = check_dataset(ref, SFT)
    assert (info.format, info.n_rows) == (RowFormat.MESSAGES, 8)
    assert load_data(JobSpec(dataset=ref)).train[7]["messages"] == CHAT[7]["messages"]


def test_bom_csv(tmp_path: Path) -> None:
    ref = write(tmp_path / "d.csv", "prompt,completion\r\nHi,Hello\r\n", bom=True)
    info = check_dataset(ref, SFT)
    assert info.columns == ["prompt", "completion"] and info.preview == [{"prompt": "Hi", "completion": "Hello"}]


def test_gzip(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl.gz"
    path.write_bytes(gzip.compress(b"\xef\xbb\xbf" + lines(ALPACA, "\r\n").encode()))
    info = check_dataset(str(path), SFT)
    assert (info.source_format, info.n_rows) == ("alpaca", 8)
    assert len(load_data(JobSpec(dataset=str(path))).train) == 8
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(lines(CHAT).encode())[:30])
    assert "is not a complete gzip file" in problems_text(str(broken))


def test_broken_json_line_in_gzip_is_numbered(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl.gz"
    path.write_bytes(gzip.compress((lines(CHAT[:2]) + '{"messages": [\n').encode()))
    assert "row 3: is not valid JSON" in problems_text(str(path))


def test_ambiguous_wrapper(tmp_path: Path) -> None:
    ref = write(tmp_path / "two.json", json.dumps({"train": CHAT, "test": CHAT}))
    assert "holds several lists of rows (`train`, `test`)" in problems_text(ref)


# ---------------------------------------------------------------------- dataset_columns
QA = [{"question": f"Q{i}?", "answer": f"A{i}.", "id": i} for i in range(8)]


def test_dataset_columns_from_yaml_mapping_and_text(tmp_path: Path) -> None:
    ref = write(tmp_path / "qa.jsonl", lines(QA))
    from_yaml = JobSpec.from_yaml(f"dataset: {ref}\ndataset_columns: {{prompt: question, completion: answer}}\n")
    from_form = JobSpec.from_dict({"dataset": ref, "dataset_columns": "prompt=question, completion=answer"})
    assert from_yaml == from_form and from_yaml.column_map == {"prompt": "question", "completion": "answer"}
    assert JobSpec.from_json(from_yaml.to_json()) == from_yaml
    loaded = load_data(from_yaml)
    assert loaded.train.column_names == ["prompt", "completion"] and loaded.train[0] == {
        "prompt": "Q0?",
        "completion": "A0.",
    }
    assert loaded.record()["dataset"]["dataset_columns"] == {"prompt": "question", "completion": "answer"}


def test_dataset_columns_feed_alpaca(tmp_path: Path) -> None:
    rows = [{"task": "Say hi.", "reply": "Hi."}] * 8
    info = check_dataset(
        write(tmp_path / "t.jsonl", lines(rows)), SFT, column_map={"instruction": "task", "output": "reply"}
    )
    assert info.source_format == "alpaca" and info.preview[0]["completion"] == [assistant("Hi.")]


def test_dataset_columns_missing_column(tmp_path: Path) -> None:
    ref = write(tmp_path / "qa.jsonl", lines(QA))
    with pytest.raises(DataError) as err:
        check_dataset(ref, SFT, column_map={"prompt": "question", "completion": "reply"})
    (problem,) = err.value.problems
    assert problem.field == "dataset_columns"
    assert (
        "maps `completion` to `reply`, but dataset has no `reply` column (found `question`, `answer`, `id`)"
        in problem.problem
    )


@pytest.mark.parametrize(
    "value,words",
    [
        ("prompt", "`prompt` is not a target=column pair"),
        ("answer=question", "`answer` is not a column tunedeck reads"),
        ("prompt=a, prompt=b", "`prompt` is mapped twice"),
        ("prompt=a, completion=a", "column `a` is mapped twice"),
        (",", "is empty"),
    ],
)
def test_dataset_columns_spec_problems(value: str, words: str) -> None:
    with pytest.raises(SpecError) as err:
        JobSpec.from_dict({"dataset_columns": value})
    assert any(p.field == "dataset_columns" and words in p.problem for p in err.value.problems)


def test_unknown_columns_suggest_dataset_columns(tmp_path: Path) -> None:
    text = problems_text(write(tmp_path / "qa.jsonl", lines(QA)))
    assert "Fix: map your columns with dataset_columns, e.g. `prompt=question, completion=answer`" in text


# ---------------------------------------------------------------------- preview and training
def test_preview_names_the_conversion(tmp_path: Path) -> None:
    from app.ui.data import preview_dataset

    text, rows = preview_dataset(write(tmp_path / "s.jsonl", lines(SHAREGPT)), "sft")
    assert text.startswith("Detected format: **sharegpt**, converted to **messages** · 8 rows")
    assert "the rows below are the converted ones" in text
    assert list(rows.columns) == ["messages"] and '"role": "user"' in rows.iloc[0]["messages"]
    text, rows = preview_dataset(write(tmp_path / "qa.jsonl", lines(QA)), "sft", "prompt=question, completion=answer")
    assert "`question` read as `prompt`" in text and list(rows.columns) == ["prompt", "completion"]
    text, _ = preview_dataset(str(tmp_path / "qa.jsonl"), "sft", "prompt")
    assert "**dataset_columns**: `prompt` is not a target=column pair" in text


@pytest.mark.integration
@pytest.mark.parametrize("shape", ["alpaca", "sharegpt"])
def test_converted_data_trains_and_is_recorded(tiny_model: Path, tmp_path: Path, shape: str) -> None:
    """Converted rows train through trl, and the resolved config says what was converted."""
    from jobs.devices.facts import CPU
    from jobs.train.training import train_spec
    from tests.training_helpers import tiny_spec

    ref = write(tmp_path / f"{shape}.jsonl", lines(ALPACA if shape == "alpaca" else SHAREGPT))
    seen: dict[str, Any] = {}
    result = train_spec(
        tiny_spec(tiny_model, dataset=ref, max_steps=2), tmp_path / "out", device=CPU, on_ready=seen.update
    )
    assert result.metrics["global_step"] == 2 and result.metrics["train_loss"] > 0
    assert seen["data"]["dataset"]["source_format"] == shape
    assert seen["data"]["dataset"]["conversion"] and seen["data"]["train_rows"] == 8


def test_one_line_chat_file_is_a_row_not_a_wrapper(tmp_path: Path) -> None:
    """{"messages": [...]} on one line is one row, though it looks like a {"data": [...]} wrapper."""
    for name in ("one.jsonl", "one.json"):
        info = check_dataset(write(tmp_path / name, lines(CHAT[:1])), SFT)
        assert (info.format, info.n_rows) == (RowFormat.MESSAGES, 1)


def test_cli_show_says_what_was_converted(store) -> None:
    """`tunedeck show` prints the data part of the resolved config: formats, conversions, rows used."""
    from app.cli.show import show_text

    run_id = store.create_run(JobSpec(model="tiny-llama"))
    info = {
        "ref": "a.jsonl",
        "format": "prompt_completion",
        "source_format": "alpaca",
        "rows": 20,
        "conversion": "Alpaca instruction/input converted to conversational prompt/completion",
        "dataset_columns": None,
    }
    store.set_resolved_config(
        run_id, {"data": {"dataset": info, "eval_dataset": None, "train_rows": 16, "eval_rows": 4}}
    )
    text = show_text(store, store.get_run(run_id))
    assert "  dataset: a.jsonl: 20 rows, prompt_completion (Alpaca instruction/input converted" in text
    assert "  rows used: 16 train, 4 eval" in text


STRICT_TEMPLATE = (
    "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant') }}"
    "{% endif %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
)


def _with_template(tiny_model: Path, folder: Path, template: str) -> Path:
    import shutil

    shutil.copytree(tiny_model, folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template
    config_path.write_text(json.dumps(config))
    for extra in ("chat_template.jinja", "chat_template.json"):
        (folder / extra).unlink(missing_ok=True)
    return folder


def test_two_users_in_a_row_are_refused_where_the_models_template_forbids_it(tmp_path: Path, tiny_model: Path) -> None:
    from jobs.checks.pipeline import check

    def dataset_problems(spec: JobSpec) -> list:
        return [p for p in check(spec).problems if p.field == "dataset"]

    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}] * 3
    rows.insert(
        1,
        {
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "user", "content": "b"},
                {"role": "assistant", "content": "c"},
            ]
        },
    )
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    strict = _with_template(tiny_model, tmp_path / "strict", STRICT_TEMPLATE)
    (problem,) = dataset_problems(JobSpec(model=str(strict), dataset=str(data), max_steps=1))
    assert problem.field == "dataset" and "rows 2 " in problem.problem and "must alternate" in problem.problem
    assert "merge consecutive turns" in problem.fix
    # The tiny model's own (ChatML-like) template accepts the row: a warning only, nothing refused.
    assert dataset_problems(JobSpec(model=str(tiny_model), dataset=str(data), max_steps=1)) == []
    assert any("in a row" in w for w in check_dataset(str(data), Trainer.SFT).warnings)
