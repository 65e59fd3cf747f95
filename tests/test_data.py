"""Tests for jobs.data: samples, format detection, every error message, loading for trl."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import datasets
import pytest

from jobs.data.inspection import check_dataset
from jobs.data.loading import load_datasets
from jobs.data.row_formats import RowFormat
from jobs.data.sources import SAMPLES_DIR, DataError, list_samples
from jobs.data.tokens.measurement import length_warnings
from jobs.spec.enums import Trainer
from jobs.spec.job import JobSpec

SFT, DPO = Trainer.SFT, Trainer.DPO
CHAT = {
    "messages": [
        {"role": "user", "content": "Hi?"},
        {"role": "assistant", "content": "[tag] Hi is worth a closer look. Over."},
    ]
}
PREF = {"prompt": "Hi?", "chosen": "[tag] Hi. Over.", "rejected": "Hello there, friend."}


def jsonl(path: Path, rows: list[Any]) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def problems_of(ref: str, trainer: Trainer = SFT, **kw: Any) -> str:
    with pytest.raises(DataError) as err:
        check_dataset(ref, trainer, **kw)
    return "\n".join(str(p) for p in err.value.problems)


# ---------------------------------------------------------------------- samples
def test_list_samples() -> None:
    assert list_samples() == [
        "sample:chat-format",
        "sample:kto-format",
        "sample:preference-format",
        "sample:prompt-format",
    ]


@pytest.mark.parametrize(
    "ref,trainer,fmt,n",
    [
        ("sample:chat-format", SFT, RowFormat.MESSAGES, 240),
        ("sample:chat-format:eval", SFT, RowFormat.MESSAGES, 40),
        ("sample:preference-format", DPO, RowFormat.PREFERENCE, 200),
        ("sample:preference-format:eval", DPO, RowFormat.PREFERENCE, 40),
    ],
)
def test_samples_check(ref: str, trainer: Trainer, fmt: RowFormat, n: int) -> None:
    info = check_dataset(ref, trainer)
    assert (info.format, info.n_rows, info.warnings) == (fmt, n, [])
    assert len(info.preview) == 5


def _questions(name: str, split: str) -> set[str]:
    rows = [json.loads(line) for line in (SAMPLES_DIR / f"{name}.{split}.jsonl").read_text().splitlines()]
    return {r["messages"][0]["content"] if "messages" in r else r["prompt"] for r in rows}


@pytest.mark.parametrize("name", ["chat-format", "preference-format"])
def test_sample_splits_disjoint(name: str) -> None:
    train, eval_ = _questions(name, "train"), _questions(name, "eval")
    assert train and eval_ and not train & eval_


def test_samples_teach_one_format() -> None:
    for line in (SAMPLES_DIR / "chat-format.train.jsonl").read_text().splitlines():
        answer = json.loads(line)["messages"][-1]["content"]
        assert answer.startswith("[tag] ") and answer.endswith(" is worth a closer look. Over.")
    for line in (SAMPLES_DIR / "preference-format.train.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert row["chosen"].startswith("[tag] ") and "[tag]" not in row["rejected"]


def test_make_samples_is_deterministic(tmp_path: Path) -> None:
    import runpy

    runpy.run_path(str(Path(__file__).resolve().parents[1] / "bench" / "make_samples.py"))["write"](tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in SAMPLES_DIR.iterdir())
    for path in SAMPLES_DIR.glob("*.jsonl"):
        assert (tmp_path / path.name).read_bytes() == path.read_bytes(), f"{path.name} is stale: rerun make_samples.py"


def test_a_missing_sample_file_names_the_way_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.data import sources

    (tmp_path / "chat-format.train.jsonl").write_text((SAMPLES_DIR / "chat-format.train.jsonl").read_text())
    monkeypatch.setattr(sources, "SAMPLES_DIR", tmp_path)  # an install that lost the eval split's file
    assert sources.resolve("sample:chat-format", "dataset").path == tmp_path / "chat-format.train.jsonl"
    with pytest.raises(DataError) as caught:
        sources.resolve("sample:chat-format:eval", "eval_dataset")
    (problem,) = caught.value.problems
    assert problem.field == "eval_dataset" and "chat-format.eval.jsonl is missing" in problem.problem
    assert "reinstall tunedeck" in problem.fix and "bench/make_samples.py" in problem.fix


def test_unknown_sample() -> None:
    assert "`sample:nope` is not a bundled sample" in problems_of("sample:nope")


# ---------------------------------------------------------------------- formats
@pytest.mark.parametrize(
    "row,trainer,fmt",
    [
        ({"text": "hello world"}, SFT, RowFormat.TEXT),
        (CHAT, SFT, RowFormat.MESSAGES),
        ({"prompt": "2+2=", "completion": "4"}, SFT, RowFormat.PROMPT_COMPLETION),
        (
            {"prompt": [{"role": "user", "content": "2+2?"}], "completion": [{"role": "assistant", "content": "4"}]},
            SFT,
            RowFormat.PROMPT_COMPLETION,
        ),
        (PREF, DPO, RowFormat.PREFERENCE),
        (
            {
                "prompt": [{"role": "user", "content": "Hi?"}],
                "chosen": [{"role": "assistant", "content": "[tag] Hi. Over."}],
                "rejected": [{"role": "assistant", "content": "Hello."}],
            },
            DPO,
            RowFormat.PREFERENCE,
        ),
    ],
)
def test_formats_detected(tmp_path: Path, row: dict, trainer: Trainer, fmt: RowFormat) -> None:
    info = check_dataset(jsonl(tmp_path / "d.jsonl", [row] * 10), trainer)
    assert info.format is fmt and info.n_rows == 10 and info.preview[0] == row


def test_extra_columns_warned_and_dropped(tmp_path: Path) -> None:
    ref = jsonl(tmp_path / "d.jsonl", [{**CHAT, "id": i, "source": "x"} for i in range(10)])
    info = check_dataset(ref, SFT)
    assert info.columns == ["messages", "id", "source"]
    assert info.warnings == ["column(s) `id`, `source` are not used by sft and will be dropped"]
    train, eval_ = load_datasets(JobSpec(dataset=ref))
    assert train.column_names == ["messages"] and eval_ is None


# ---------------------------------------------------------------------- errors
def test_broken_json_line(tmp_path: Path) -> None:
    ref = jsonl(tmp_path / "d.jsonl", [CHAT, CHAT, '{"messages": [', CHAT, "not json", CHAT])
    text = problems_of(ref)
    assert "rows 3, 5: is not valid JSON (row 3:" in text


def test_bad_rows_named(tmp_path: Path) -> None:
    bad = {"messages": "hello"}
    rows = [CHAT, CHAT, bad, CHAT, CHAT, CHAT, bad, {"messages": [{"role": "user", "content": "no answer"}]}]
    text = problems_of(jsonl(tmp_path / "d.jsonl", rows))
    assert "rows 3, 7: `messages` is not a list of {role, content}" in text
    assert "row 8: `messages` has no assistant turn" in text


def test_bad_rows_capped(tmp_path: Path) -> None:
    rows = [{"text": ""}] * 12
    text = problems_of(jsonl(tmp_path / "d.jsonl", rows), max_bad_rows=3)
    assert "rows 1, 2, 3 (and 9 more): `text` is empty" in text


@pytest.mark.parametrize(
    "row,message",
    [
        (
            {"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]},
            "unknown role `robot`",
        ),
        ({"text": 5}, "`text` is not a string"),
        ({"prompt": "q", "completion": ""}, "`completion` is empty"),
        ({"prompt": "q", "completion": [{"role": "assistant", "content": "a"}]}, "mixes plain text and message lists"),
        ({"prompt": "q", "chosen": "a"}, "no `rejected` column"),
    ],
)
def test_row_messages(tmp_path: Path, row: dict, message: str) -> None:
    trainer = DPO if "chosen" in row else SFT
    assert message in problems_of(jsonl(tmp_path / "d.jsonl", [row] * 3), trainer)


def test_missing_value_in_some_rows(tmp_path: Path) -> None:
    text = problems_of(jsonl(tmp_path / "d.jsonl", [PREF, {"prompt": "q", "chosen": "a"}, PREF]), DPO)
    assert "row 2: `rejected` is missing" in text


def test_mixed_columns(tmp_path: Path) -> None:
    text = problems_of(jsonl(tmp_path / "d.jsonl", [CHAT, CHAT, {"text": "plain"}, CHAT]))
    assert "row 3: has `text` instead of `messages` (mixed formats in one data set)" in text


def test_mixed_styles(tmp_path: Path) -> None:
    conv = {"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "a"}]}
    text = problems_of(jsonl(tmp_path / "d.jsonl", [conv, {"prompt": "q", "completion": "a"}]))
    assert "row 2: is plain where row 1 is conversational" in text


def test_unknown_columns(tmp_path: Path) -> None:
    text = problems_of(jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "a"}]))
    assert "has no column trl can train on (found `question`, `answer`)" in text
    assert "Fix: map your columns with dataset_columns, e.g. `prompt=question, completion=answer`" in text


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(content)
    assert "is empty" in problems_of(str(path))


def test_wrong_format_for_trainer(tmp_path: Path) -> None:
    assert "the dpo trainer needs prompt/chosen/rejected rows" in problems_of("sample:chat-format", DPO)
    assert "which the sft trainer cannot use" in problems_of(jsonl(tmp_path / "d.jsonl", [PREF]), SFT)


def test_missing_file(tmp_path: Path) -> None:
    assert "does not exist" in problems_of(str(tmp_path / "nope.jsonl"))
    assert "is not a sample, a file or a hub data set name" in problems_of("nope")


def test_unsupported_extension(tmp_path: Path) -> None:
    for name in ("d.txt", "d.pkl"):
        (tmp_path / name).write_text("hello\n")
        assert "files are not supported" in problems_of(str(tmp_path / name))


def test_folder(tmp_path: Path) -> None:
    assert "is a folder" in problems_of(str(tmp_path))


def test_field_name_passed_through(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        check_dataset(str(tmp_path / "x.csv"), SFT, field="eval_dataset")
    assert err.value.problems[0].field == "eval_dataset"


# ---------------------------------------------------------------------- other file types
def test_csv(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("prompt,completion,id\n2+2=,4,1\nHi,42,2\n")
    info = check_dataset(str(path), SFT)
    assert info.format is RowFormat.PROMPT_COMPLETION and info.n_rows == 2
    assert info.preview[1] == {"prompt": "Hi", "completion": "42"}  # stays text, not the int 42
    path.write_text("prompt,completion\n2+2=,4\nHi,\n")
    assert "row 2: `completion` is empty" in problems_of(str(path))
    path.write_text("prompt,answer\nq,a\n")
    assert "no `completion` column" in problems_of(str(path))


def test_parquet(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    datasets.Dataset.from_list([PREF] * 4).to_parquet(str(path))
    info = check_dataset(str(path), DPO)
    assert info.format is RowFormat.PREFERENCE and info.n_rows == 4
    train, _ = load_datasets(JobSpec(dataset=str(path), trainer=Trainer.DPO))
    assert len(train) == 4
    (tmp_path / "bad.parquet").write_text("not parquet")
    assert "could not be read as parquet" in problems_of(str(tmp_path / "bad.parquet"))


def test_json_list_and_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps([CHAT] * 3, indent=1))
    assert check_dataset(str(path), SFT).n_rows == 3
    jsonl(path, [CHAT] * 3)  # JSON lines under a .json name
    assert check_dataset(str(path), SFT).n_rows == 3
    path.write_text(json.dumps([CHAT, "x"]))
    assert "row 2: is not a JSON object" in problems_of(str(path))
    path.write_text('[{"text": "a"},')
    assert "is not valid JSON" in problems_of(str(path))


# ---------------------------------------------------------------------- loading for trl
def test_load_sft_sample_with_eval() -> None:
    train, eval_ = load_datasets(JobSpec(max_train_samples=50))
    assert train.column_names == ["messages"] and len(train) == 50
    assert eval_ is not None and len(eval_) == 40
    assert train[0]["messages"][-1]["role"] == "assistant"


def test_load_dpo_sample() -> None:
    train, eval_ = load_datasets(JobSpec(trainer=Trainer.DPO, dataset="sample:preference-format"))
    assert train.column_names == ["prompt", "chosen", "rejected"] and len(train) == 200
    assert eval_ is not None and len(eval_) == 40


def test_load_strips_extra_message_keys(tmp_path: Path) -> None:
    rows = [
        {"messages": [{"role": "user", "content": "q", "name": "me"}, {"role": "assistant", "content": "a"}], "id": 1},
        {**CHAT, "id": "two"},
    ]
    train, _ = load_datasets(JobSpec(dataset=jsonl(tmp_path / "d.jsonl", rows)))
    assert train[0]["messages"][0] == {"role": "user", "content": "q"}
    assert train.column_names == ["messages"]


def test_load_conversational_dpo(tmp_path: Path) -> None:
    row = {
        "prompt": [{"role": "user", "content": "Hi?"}],
        "chosen": [{"role": "assistant", "content": "[tag] Hi. Over."}],
        "rejected": [{"role": "assistant", "content": "Hello."}],
    }
    ref = jsonl(tmp_path / "d.jsonl", [row] * 4)
    train, eval_ = load_datasets(JobSpec(trainer=Trainer.DPO, dataset=ref, eval_dataset=ref))
    assert train[0] == row and eval_ is not None and len(eval_) == 4


def test_load_reports_train_and_eval_problems(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        load_datasets(JobSpec(dataset=str(tmp_path / "a.jsonl"), eval_dataset=str(tmp_path / "b.csv")))
    assert [p.field for p in err.value.problems] == ["dataset", "eval_dataset"]


def test_offline_hub_fails_fast() -> None:
    start = time.monotonic()
    text = problems_of("some-org/not-cached-dataset")
    assert time.monotonic() - start < 10
    assert "`some-org/not-cached-dataset`" in text and "HF_HUB_OFFLINE" in text


# ---------------------------------------------------------------------- lengths
class _WordTokenizer:
    chat_template = None

    eos_token = None

    def __call__(self, texts: list[str], add_special_tokens: bool = True, **_: object) -> dict[str, list[list[int]]]:
        return {"input_ids": [list(range(len(t.split()) + int(add_special_tokens))) for t in texts]}


def test_length_warnings(tmp_path: Path) -> None:
    rows = [{"text": "word " * 200}] * 3 + [{"text": "short"}] * 5
    ds = datasets.Dataset.from_list(rows)
    assert length_warnings(ds, _WordTokenizer(), 96) == [
        "3 of 8 rows are longer than max_length 96 tokens and will be truncated"
    ]
    assert length_warnings(ds, _WordTokenizer(), 1000) == []
    pref = datasets.Dataset.from_list([{"prompt": "a b", "chosen": "c", "rejected": "d " * 50}] * 2)
    assert length_warnings(pref, _WordTokenizer(), 10)[0].startswith("2 of 2 rows")
    big = datasets.Dataset.from_list([{"text": "a b c"}] * 30)
    assert "estimated from 10" in length_warnings(big, _WordTokenizer(), 2, sample_size=10)[0]


def test_length_warnings_chat_template(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    train, _ = load_datasets(JobSpec(max_train_samples=20))
    assert length_warnings(train, tok, 100000) == []
    assert length_warnings(train, tok, 8) == ["20 of 20 rows are longer than max_length 8 tokens and will be truncated"]


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"text": "caf\xe9"}\n')
    assert "is not UTF-8 text" in problems_of(str(path))


@pytest.mark.integration
def test_trl_trainers_accept_loaded_data(tiny_model: Path, tmp_path: Path) -> None:
    """One optimizer step of SFTTrainer and DPOTrainer on what load_datasets returns."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    common = dict(
        max_steps=1,
        per_device_train_batch_size=2,
        bf16=False,
        use_cpu=True,
        gradient_checkpointing=False,
        report_to=[],
        max_length=48,
        save_strategy="no",
    )
    for trainer, dataset, trainer_cls, config_cls in (
        (SFT, "sample:chat-format", SFTTrainer, SFTConfig),
        (DPO, "sample:preference-format", DPOTrainer, DPOConfig),
    ):
        train, eval_ = load_datasets(JobSpec(trainer=trainer, dataset=dataset, max_train_samples=4))
        model = AutoModelForCausalLM.from_pretrained(tiny_model)
        run = trainer_cls(
            model=model,
            processing_class=tok,
            train_dataset=train,
            eval_dataset=eval_.select(range(2)),
            args=config_cls(output_dir=str(tmp_path / trainer.value), **common),
        )
        assert run.train().training_loss > 0
