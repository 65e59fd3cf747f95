"""Several data sets per job: `dataset` lists sources, each converted and capped on its own, then mixed with the seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.data.sources import SAMPLES_DIR, DataError
from jobs.devices.facts import CPU
from jobs.spec.enums import Trainer
from jobs.spec.job import JobSpec, SpecError
from jobs.spec.mixture import DataSource, parse_sources
from jobs.spec.stored import read_spec


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def chat(n: int, tag: str) -> list[dict]:
    return [
        {"messages": [{"role": "user", "content": f"{tag} q{i}"}, {"role": "assistant", "content": f"{tag} a{i}"}]}
        for i in range(n)
    ]


def sharegpt(n: int, tag: str) -> list[dict]:
    return [
        {"conversations": [{"from": "human", "value": f"{tag} q{i}"}, {"from": "gpt", "value": f"{tag} a{i}"}]}
        for i in range(n)
    ]


# ---------------------------------------------------------------------- the spec
def test_a_yaml_list_is_stored_as_one_text_and_reads_back_as_the_same_sources() -> None:
    spec = JobSpec.from_yaml(
        "dataset: [a.jsonl, {path: b.csv, max_rows: 500, columns: {prompt: question, completion: answer}}]\n"
    )
    assert spec.dataset == "a.jsonl, b.csv [max_rows=500, prompt=question, completion=answer]"
    assert spec.dataset_sources == [
        DataSource("a.jsonl"),
        DataSource("b.csv", 500, "prompt=question, completion=answer"),
    ]
    assert JobSpec.from_json(spec.to_json()).dataset_sources == spec.dataset_sources
    assert JobSpec.from_yaml(spec.to_yaml()) == spec
    assert spec.dataset_sources[1].column_map == {"prompt": "question", "completion": "answer"}


def test_a_single_reference_is_one_source_and_old_stored_specs_still_read() -> None:
    old = json.dumps({"dataset": "sample:chat-format", "dataset_columns": "prompt=q, completion=a"})
    spec = read_spec(old)
    assert spec.dataset == "sample:chat-format"
    assert spec.dataset_sources == [DataSource("sample:chat-format")]
    assert parse_sources("org/name")[0] == [DataSource("org/name")]  # a hub id


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("a.jsonl, , b.jsonl", "source 2 of the list is empty"),
        ("a.jsonl [max_rows=0]", "max_rows `0`"),
        ("a.jsonl [rows=5]", "unknown option `rows`"),
        ("a.jsonl [max_rows=5", "unmatched"),
        ("a.jsonl, a.jsonl", "listed twice"),
        ("a.jsonl [prompt=x, completion=x]", "column `x` is mapped twice"),
    ],
)
def test_a_list_that_cannot_be_read_names_dataset_the_problem_and_a_fix(text: str, problem: str) -> None:
    with pytest.raises(SpecError) as caught:
        JobSpec.from_dict({"dataset": text})
    (found,) = caught.value.problems
    assert found.field == "dataset" and problem in found.problem and found.fix


def test_eval_dataset_takes_the_same_list_and_its_problems_name_eval_dataset(tmp_path: Path) -> None:
    from jobs.data.loading import load_data

    a = write_jsonl(tmp_path / "a.jsonl", chat(4, "A"))
    spec = JobSpec.from_dict(
        {"dataset": str(a), "eval_dataset": ["sample:chat-format:eval", {"path": str(a), "max_rows": 2}]}
    )
    assert spec.eval_dataset == f"sample:chat-format:eval, {a} [max_rows=2]"
    assert len(load_data(spec).eval) == 40 + 2
    with pytest.raises(DataError) as caught:
        load_data(spec.replace(eval_dataset=f"{a}, {tmp_path / 'gone.jsonl'}"))
    (problem,) = caught.value.problems
    assert problem.field == "eval_dataset" and problem.problem.startswith("source 2 of 2 (")
    with pytest.raises(SpecError) as bad:
        JobSpec.from_dict({"eval_dataset": f"{a}, {a}"})
    assert [p.field for p in bad.value.problems] == ["eval_dataset"]


def test_a_list_item_that_is_no_data_set_is_refused() -> None:
    with pytest.raises(SpecError) as caught:
        JobSpec.from_dict({"dataset": ["a.jsonl", {"file": "b.jsonl"}]})
    assert [p.field for p in caught.value.problems] == ["dataset"]
    assert "path, max_rows, columns" in caught.value.problems[0].fix


# ---------------------------------------------------------------------- loading
def test_sources_are_converted_each_capped_and_mixed_with_the_seed(tmp_path: Path) -> None:
    from jobs.data.loading import load_data

    a = write_jsonl(tmp_path / "a.jsonl", chat(10, "A"))
    b = write_jsonl(tmp_path / "b.jsonl", sharegpt(10, "B"))  # ShareGPT: converted on its own
    spec = JobSpec.from_dict({"dataset": [str(a), {"path": str(b), "max_rows": 4}], "seed": 1})
    loaded = load_data(spec)
    users = [row["messages"][0]["content"] for row in loaded.train]
    assert sorted(users) == sorted([f"A q{i}" for i in range(10)] + [f"B q{i}" for i in range(4)])
    assert users != sorted(users, key=lambda u: (u[0], int(u.split("q")[1])))  # shuffled, not a then b
    again = [row["messages"][0]["content"] for row in load_data(spec).train]
    other = [row["messages"][0]["content"] for row in load_data(spec.replace(seed=2)).train]
    assert again == users and other != users  # the seed decides the order
    record = loaded.record()["dataset"]
    assert record["rows"] == 14 and [s["rows"] for s in record["sources"]] == [10, 4]
    assert "source 2 of 2" in record["conversion"] and "ShareGPT" in record["conversion"]


def test_max_train_samples_and_eval_split_apply_to_the_mixture(tmp_path: Path) -> None:
    from jobs.data.loading import load_data

    a = write_jsonl(tmp_path / "a.jsonl", chat(10, "A"))
    b = write_jsonl(tmp_path / "b.jsonl", chat(10, "B"))
    loaded = load_data(JobSpec.from_dict({"dataset": f"{a}, {b}", "eval_split": 4, "max_train_samples": 12}))
    assert len(loaded.eval) == 4 and len(loaded.train) == 12


def test_a_source_own_columns_replace_dataset_columns_for_it_only(tmp_path: Path) -> None:
    from jobs.data.loading import load_data

    a = write_jsonl(tmp_path / "a.jsonl", [{"q": f"A{i}", "ans": f"x{i}"} for i in range(3)])
    b = write_jsonl(tmp_path / "b.jsonl", [{"question": f"B{i}", "reply": f"y{i}"} for i in range(3)])
    spec = JobSpec.from_dict(
        {
            "dataset": [str(a), {"path": str(b), "columns": {"prompt": "question", "completion": "reply"}}],
            "dataset_columns": "prompt=q, completion=ans",
        }
    )
    train = load_data(spec).train
    assert sorted(train["prompt"]) == ["A0", "A1", "A2", "B0", "B1", "B2"]


def test_each_problem_names_its_source(tmp_path: Path) -> None:
    from jobs.data.loading import check_sources, load_data

    a = write_jsonl(tmp_path / "a.jsonl", chat(3, "A"))
    bad = chat(3, "B")
    bad[1]["messages"] = [{"role": "user", "content": "only a question"}]
    b = write_jsonl(tmp_path / "b.jsonl", bad)
    text = f"{a}, {b}, {tmp_path / 'missing.jsonl'}"
    for attempt in (lambda: check_sources(text, Trainer.SFT), lambda: load_data(JobSpec(dataset=text))):
        with pytest.raises(DataError) as caught:
            attempt()
        problems = caught.value.problems
        assert {p.field for p in problems} == {"dataset"}
        assert any(p.problem.startswith(f"source 2 of 3 (`{b}`): row") for p in problems), problems
        assert any(p.problem.startswith("source 3 of 3 (") and "does not exist" in p.problem for p in problems)
        assert all(p.fix for p in problems)


def test_sources_in_different_row_formats_are_refused_naming_each(tmp_path: Path) -> None:
    from jobs.data.loading import check_sources

    plain = write_jsonl(tmp_path / "plain.jsonl", [{"prompt": "2+2=", "completion": "4"}])
    text = f"sample:chat-format, {plain}"
    with pytest.raises(DataError) as caught:
        check_sources(text, Trainer.SFT)
    (problem,) = caught.value.problems
    assert "different row formats" in problem.problem and "`sample:chat-format` messages" in problem.problem
    assert f"`{plain}` prompt_completion (plain text)" in problem.problem
    assert "separate jobs" in problem.fix


def test_chat_and_alpaca_sources_are_refused_with_the_rewrite_that_joins_them(tmp_path: Path) -> None:
    from jobs.data.loading import check_sources

    alpaca = write_jsonl(tmp_path / "alpaca.jsonl", [{"instruction": "Say hi", "output": "Hi"}])
    with pytest.raises(DataError) as caught:
        check_sources(f"sample:chat-format, {alpaca}", Trainer.SFT)
    (problem,) = caught.value.problems
    assert f"`{alpaca}` prompt_completion (conversational)" in problem.problem
    assert "as chat `messages`" in problem.fix and "Alpaca" in problem.fix


def test_a_single_source_loads_as_before_in_its_own_order() -> None:
    from jobs.data.loading import load_data

    loaded = load_data(JobSpec(dataset="sample:chat-format", max_train_samples=3))
    first = [json.loads(line) for line in (SAMPLES_DIR / "chat-format.train.jsonl").read_text().splitlines()[:3]]
    assert loaded.train["messages"] == [r["messages"] for r in first]
    assert "sources" not in loaded.record()["dataset"]
    assert loaded.eval is not None  # the sample's own eval split


# ---------------------------------------------------------------------- checks, preview, cache, access
def test_the_checks_count_the_capped_mixture_and_name_sources_in_warnings(tmp_path: Path) -> None:
    from jobs.checks.datasets import dataset_problems

    a = write_jsonl(tmp_path / "a.jsonl", [{**r, "extra": 1} for r in chat(6, "A")])
    spec = JobSpec(dataset=f"{a}, sample:chat-format [max_rows=5]")
    problems, infos = dataset_problems(spec, tokenizer=lambda: None)
    assert problems == []
    info = infos["dataset"]
    assert info.n_rows == 11 and [p.n_rows for p in info.parts] == [6, 5]
    assert any(w.startswith(f"source 1 of 2 (`{a}`): column(s) `extra`") for w in info.warnings), info.warnings
    assert not any("sample:chat-format" in w for w in info.warnings)  # a cap asked for is no warning


def test_the_preview_shows_each_source(tmp_path: Path) -> None:
    from app.ui.data import preview_dataset

    b = write_jsonl(tmp_path / "b.jsonl", sharegpt(4, "B"))
    text, rows = preview_dataset(f"sample:chat-format [max_rows=3], {b}", "sft")
    assert text.startswith("Detected format: **messages** · 2 data sets mixed") and "7 rows in all" in text
    assert (
        "`sample:chat-format`: **messages** · 3 of its 240 rows (max_rows)" in text
        and f"`{b}`: **messages** · 4 rows" in text
    )
    assert "sharegpt converted" in text
    shown = " ".join(rows["messages"])
    assert len(rows) == 5 and "B q0" in shown and "[tag]" in shown  # rows of both sources, B's converted


def test_the_length_cache_key_covers_every_source(tmp_path: Path) -> None:
    from jobs.data.tokens.measurement import cache_key

    a = write_jsonl(tmp_path / "a.jsonl", chat(3, "A"))
    b = write_jsonl(tmp_path / "b.jsonl", chat(3, "B"))
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    spec = JobSpec(dataset=f"{a}, {b}")
    first = cache_key(spec, tok)
    write_jsonl(b, chat(4, "B"))  # only the second source changes
    assert first is not None and cache_key(spec, tok) not in (None, first)
    assert cache_key(JobSpec(dataset=f"{a}, {b} [max_rows=2]"), tok) != cache_key(spec, tok)
    assert cache_key(JobSpec(dataset=f"{a}, {tmp_path / 'gone.jsonl'}"), tok) is None


def test_a_shared_server_refuses_any_source_outside_its_data_folders(tmp_path: Path) -> None:
    from jobs.checks.access import AccessPolicy

    inside = tmp_path / "data"
    inside.mkdir()
    a = write_jsonl(inside / "a.jsonl", chat(2, "A"))
    policy = AccessPolicy(restricted=True, data_dirs=(inside.resolve(),))
    assert policy.data_problem(f"{a}, sample:chat-format", "dataset") is None
    refused = policy.data_problem(f"{a}, /etc/passwd.jsonl [max_rows=2]", "dataset")
    assert refused is not None and refused.field == "dataset" and "`/etc/passwd.jsonl`" in refused.problem


# ---------------------------------------------------------------------- training
@pytest.mark.integration
def test_a_two_source_job_trains_on_the_mixed_rows(tiny_model: Path, tmp_path: Path) -> None:
    from training_helpers import tiny_spec

    from jobs.train.training import train_spec

    b = write_jsonl(tmp_path / "b.jsonl", sharegpt(8, "B"))
    spec = tiny_spec(tiny_model, dataset=f"sample:chat-format [max_rows=8], {b}", max_steps=4, max_train_samples=None)
    result = train_spec(spec, tmp_path / "out", device=CPU)
    losses = [e["loss"] for e in result.log_history if "loss" in e]
    assert len(losses) == 4 and sum(losses[-2:]) < sum(losses[:2]), losses  # it learned from the mixed rows
    data = result.resolved["data"]
    assert data["train_rows"] == 16 and [s["rows"] for s in data["dataset"]["sources"]] == [8, 8]


# ---------------------------------------------------------------------- the form, the CLI and the API
def test_the_form_queues_a_typed_list_of_sources(store, tiny_model: Path, tmp_path: Path) -> None:
    from training_helpers import tiny_spec

    from app.ui import form as ui_form
    from app.ui.form_spec import NAMES
    from jobs.checks.access import AccessPolicy

    b = write_jsonl(tmp_path / "b.jsonl", sharegpt(6, "B"))
    spec = tiny_spec(tiny_model, max_steps=1)
    values = dict(zip(NAMES, ui_form.form_values(spec), strict=True))
    values["dataset"] = f"sample:chat-format [max_rows=20], {b}"  # typed into the dataset box
    errors, run_id = ui_form.launch(store, *values.values(), policy=AccessPolicy.dashboard())
    assert errors == "" and run_id is not None
    assert read_spec(store.get_run(run_id).spec_json).dataset_sources == [
        DataSource("sample:chat-format", 20),
        DataSource(str(b)),
    ]


def test_the_cli_takes_a_comma_separated_list_with_set(
    tiny_model: Path, tmp_path: Path, data_home: Path, capsys
) -> None:
    from app.cli.main import main

    b = write_jsonl(tmp_path / "b.jsonl", chat(6, "B"))
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model: {tiny_model}\ndataset: sample:chat-format\nmax_steps: 1\nmax_length: 96\n")
    assert main(["submit", str(spec), "--set", f"dataset=sample:chat-format [max_rows=5], {b}"]) == 0
    assert capsys.readouterr().out.strip().isdigit()
    broken = main(["submit", str(spec), "--set", f"dataset=sample:chat-format, {tmp_path / 'nope.jsonl'}"])
    err = capsys.readouterr().err
    assert broken != 0 and "dataset: source 2 of 2 (`" in err and "does not exist" in err
