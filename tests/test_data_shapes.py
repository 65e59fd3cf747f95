"""Data shapes other tools write: LLaMA-Factory's DPO and KTO demos (conversation context + answers),
checked for every preference trainer against slices of the real files (tests/fixtures/llamafactory/)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from training_helpers import tiny_spec

from jobs.checks.pipeline import check
from jobs.data.inspection import check_dataset
from jobs.data.loading import load_data
from jobs.data.placeholders import placeholders_in
from jobs.data.row_formats import RowFormat
from jobs.data.sources import DataError
from jobs.data.tokens.lengths import RowLengths
from jobs.devices.facts import DeviceFacts
from jobs.spec.enums import Trainer
from jobs.spec.job import JobSpec

LF = Path(__file__).parent / "fixtures" / "llamafactory"
DPO_DEMO, KTO_DEMO = str(LF / "dpo_en_demo.json"), str(LF / "kto_en_demo.json")
PREFERENCE_TRAINERS = (Trainer.DPO, Trainer.ORPO, Trainer.CPO, Trainer.REWARD, Trainer.KTO)


def write(path: Path, rows: list[Any]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def problems_text(ref: str, trainer: Trainer) -> str:
    with pytest.raises(DataError) as err:
        check_dataset(ref, trainer)
    return "\n".join(str(p) for p in err.value.problems)


def turn(speaker: str, text: str) -> dict[str, str]:
    return {"from": speaker, "value": text}


def msg(role: str, text: str) -> dict[str, str]:
    return {"role": role, "content": text}


# ---------------------------------------------------------------------- LLaMA-Factory's demos
def test_dataset_info_declares_the_keys_the_fixtures_have() -> None:
    info = json.loads((LF / "dataset_info.json").read_text())
    dpo = json.loads((LF / "dpo_en_demo.json").read_text())
    kto = json.loads((LF / "kto_en_demo.json").read_text())
    assert info["dpo_en_demo"]["formatting"] == "sharegpt" and info["dpo_en_demo"]["ranking"] is True
    assert set(info["dpo_en_demo"]["columns"].values()) == set(dpo[0])  # conversations, chosen, rejected
    assert all(set(r["chosen"]) == {"from", "value"} for r in dpo)  # one turn object each
    assert set(info["kto_en_demo"]["columns"].values()) == set(kto[0])  # messages, label
    assert info["kto_en_demo"]["tags"]["role_tag"] == "role" and set(kto[0]["messages"][0]) == {"role", "content"}
    # The slices hold the shapes that were refused: system prompts and multi-turn context.
    assert sum(r["conversations"][0]["from"] == "system" for r in dpo) >= 5
    assert sum(len(r["conversations"]) >= 5 for r in dpo) >= 5
    assert sum(len(r["messages"]) > 2 for r in kto) >= 5


@pytest.mark.parametrize("trainer", PREFERENCE_TRAINERS)
def test_dpo_demo_accepted_whole_for_every_preference_trainer(trainer: Trainer) -> None:
    info = check_dataset(DPO_DEMO, trainer)  # was: every row refused ("has messages rows", "ends with a user turn")
    assert (info.format, info.n_rows, info.source_format) == (RowFormat.PREFERENCE, 40, "sharegpt")
    assert "conversational prompt of `chosen`/`rejected`" in (info.conversion or "")
    assert not any("dropped" in w for w in info.warnings)


def test_dpo_demo_system_prompt_and_turns_become_the_prompt() -> None:
    rows = json.loads((LF / "dpo_en_demo.json").read_text())
    loaded = load_data(JobSpec(dataset=DPO_DEMO, trainer=Trainer.DPO))
    assert loaded.train.column_names == ["prompt", "chosen", "rejected"] and len(loaded.train) == 40
    system_row = next(i for i, r in enumerate(rows) if r["conversations"][0]["from"] == "system")
    got = loaded.train[system_row]
    assert got["prompt"][0] == msg("system", rows[system_row]["conversations"][0]["value"])
    assert got["prompt"][-1]["role"] == "user"
    assert got["chosen"] == [msg("assistant", rows[system_row]["chosen"]["value"])]
    assert got["rejected"] == [msg("assistant", rows[system_row]["rejected"]["value"])]
    multi = next(i for i, r in enumerate(rows) if len(r["conversations"]) >= 5)
    assert [m["role"] for m in loaded.train[multi]["prompt"]] == ["user", "assistant"] * 2 + ["user"] + [
        "assistant",
        "user",
    ] * ((len(rows[multi]["conversations"]) - 5) // 2)


def test_kto_demo_accepted_for_kto_last_answer_is_the_completion() -> None:
    info = check_dataset(KTO_DEMO, Trainer.KTO)  # was: "needs prompt/completion/label rows"
    assert (info.format, info.n_rows, info.source_format) == (RowFormat.UNPAIRED, 40, "chat")
    rows = json.loads((LF / "kto_en_demo.json").read_text())
    loaded = load_data(JobSpec(dataset=KTO_DEMO, trainer=Trainer.KTO))
    assert loaded.train.column_names == ["prompt", "completion", "label"]
    long = next(i for i, r in enumerate(rows) if len(r["messages"]) > 2)
    assert loaded.train[long]["prompt"] == rows[long]["messages"][:-1]
    assert loaded.train[long]["completion"] == rows[long]["messages"][-1:]
    assert loaded.train["label"] == [r["label"] for r in rows]


def test_kto_demo_stays_chat_for_sft() -> None:
    info = check_dataset(KTO_DEMO, Trainer.SFT)
    assert info.format is RowFormat.MESSAGES and any("`label`" in w for w in info.warnings)


# ---------------------------------------------------------------------- the same shapes, written other ways
def test_chat_messages_with_plain_answers_and_system_column(tmp_path: Path) -> None:
    rows = [
        {"system": "Be brief.", "messages": [msg("user", f"Q{i}?")], "chosen": "Yes.", "rejected": "No."}
        for i in range(8)
    ]
    info = check_dataset(write(tmp_path / "p.jsonl", rows), Trainer.DPO)
    assert info.source_format == "chat" and "plus the `system` column" in (info.conversion or "")
    assert info.preview[0] == {
        "prompt": [msg("system", "Be brief."), msg("user", "Q0?")],
        "chosen": [msg("assistant", "Yes.")],
        "rejected": [msg("assistant", "No.")],
    }


def test_sharegpt_kto_rows(tmp_path: Path) -> None:
    rows = [
        {"conversations": [turn("human", f"Q{i}?"), turn("gpt", "A.")], "label": "true" if i % 2 else "false"}
        for i in range(8)
    ]
    info = check_dataset(write(tmp_path / "k.jsonl", rows), Trainer.KTO)
    assert (info.format, info.source_format) == (RowFormat.UNPAIRED, "sharegpt")
    assert info.preview[1] == {"prompt": [msg("user", "Q1?")], "completion": [msg("assistant", "A.")], "label": True}


GOOD = {"conversations": [turn("human", "Q?")], "chosen": turn("gpt", "A."), "rejected": turn("gpt", "B.")}


@pytest.mark.parametrize(
    "bad,words",
    [
        ({**GOOD, "conversations": [turn("human", "Q?"), turn("gpt", "A.")]}, "row 2: `conversations` ends with an"),
        ({**GOOD, "chosen": None}, "row 2: `chosen` is missing"),
        ({**GOOD, "rejected": 3}, "row 2: `rejected` is not an answer turn"),
        ({**GOOD, "chosen": turn("human", "A.")}, "row 2: `chosen` holds non-assistant turns"),
        ({**GOOD, "conversations": [turn("alien", "Q?")]}, "row 2: `conversations` has unknown speaker `alien`"),
        ({**GOOD, "conversations": [turn("gpt", "Q?")]}, "row 2: `conversations` ends with an assistant turn"),
    ],
)
def test_bad_context_preference_rows_named(tmp_path: Path, bad: dict[str, Any], words: str) -> None:
    assert words in problems_text(write(tmp_path / "p.jsonl", [GOOD, bad, GOOD]), Trainer.DPO)


@pytest.mark.parametrize(
    "bad,words",
    [
        ({"messages": [msg("user", "Q?")], "label": True}, "row 2: `messages` ends with a user turn, not the answer"),
        ({"messages": [msg("assistant", "A.")], "label": True}, "row 2: `messages` holds only the answer"),
        ({"messages": [msg("user", "Q?"), msg("assistant", "A.")], "label": "maybe"}, "`label` is `maybe`"),
    ],
)
def test_bad_kto_chat_rows_named(tmp_path: Path, bad: dict[str, Any], words: str) -> None:
    good = {"messages": [msg("user", "Q?"), msg("assistant", "A.")], "label": True}
    assert words in problems_text(write(tmp_path / "k.jsonl", [good, bad, good]), Trainer.KTO)


# ---------------------------------------------------------------------- data that cannot teach under max_length
BIG_MEMORY = DeviceFacts(kind="cpu", name="cpu", total_bytes=1024**4)


def long_prompt_rows(path: Path, n_rows: int, n_long: int, n_words: int = 200) -> str:
    """Plain prompt/completion rows: the first `n_long` with a prompt of `n_words` words, the rest short."""
    rows = [
        {"prompt": " ".join(["word"] * (n_words if i < n_long else 3)) + f" {i}?", "completion": " A short answer."}
        for i in range(n_rows)
    ]
    return write(path, rows)


def test_answers_cut_counts_rows_whose_prompt_fills_max_length() -> None:
    lengths = RowLengths.of([[120], [40], [300], [90]], prompts=[100, 10, 250, 89])
    cut = lengths.answers_cut(100)
    assert (cut.rows, cut.lost) == (4, (0, 2)) and cut.keeps == 300  # p95 of the lost rows' whole lengths
    assert lengths.answers_cut(None).lost == () and lengths.answers_cut(400).lost == ()
    # The reward trainer drops every pair with a sequence over max_length, whatever its prompt.
    pairs = RowLengths.of([[120, 80], [40, 101], [30, 20]], prompts=[5, 5, 5])
    assert pairs.answers_cut(100, dropped_when_long=True).lost == (0, 1)
    assert RowLengths.of([[120]]).answers_cut(100).lost == ()  # prompts not measured: nothing claimed


def test_data_whose_every_answer_is_cut_away_is_refused_naming_the_max_length_that_keeps_it(
    data_home: Path, tiny_model: Path, tmp_path: Path
) -> None:
    spec = tiny_spec(tiny_model, dataset=long_prompt_rows(tmp_path / "long.jsonl", 16, 16))
    refused = check(spec, device=BIG_MEMORY)
    cut = [p for p in refused.problems if p.field == "max_length"]
    assert len(cut) == 1, refused.problems
    assert cut[0].problem.startswith(
        f"rows 1, 2, 3, 4, 5 (and 11 more) of `{spec.dataset}`, 16 of the 16 training rows, have a prompt of "
        "max_length 96 tokens or more"
    )
    assert "cuts away their whole answer" in cut[0].problem
    keeps = int(re.search(r"set max_length: (\d+)", cut[0].fix).group(1))  # type: ignore[union-attr]
    assert keeps > 96 and "shorten the prompts" in cut[0].fix
    fixed = check(spec.replace(max_length=keeps), device=BIG_MEMORY)
    assert not [p for p in fixed.problems if p.field == "max_length"], fixed.problems
    assert not any("training rows, have a prompt" in w for w in fixed.warnings)


def test_a_few_rows_without_an_answer_are_a_warning(data_home: Path, tiny_model: Path, tmp_path: Path) -> None:
    spec = tiny_spec(tiny_model, dataset=long_prompt_rows(tmp_path / "some.jsonl", 16, 3))
    checked = check(spec, device=BIG_MEMORY)
    assert not [p for p in checked.problems if p.field == "max_length"], checked.problems
    warned = [w for w in checked.warnings if "training rows, have a prompt" in w]
    assert len(warned) == 1 and "keeps 95%" in warned[0]
    assert warned[0].startswith(f"rows 1, 2, 3 of `{spec.dataset}`, 3 of the 16 training rows, have a prompt")


def test_dpo_demo_under_a_short_max_length_is_refused_and_under_its_own_is_not(
    data_home: Path, tiny_model: Path
) -> None:
    spec = tiny_spec(tiny_model, trainer="dpo", dataset=DPO_DEMO, max_train_samples=None, max_length=64)
    refused = check(spec, device=BIG_MEMORY)
    cut = [p for p in refused.problems if p.field == "max_length"]
    assert cut and " of the 40 training rows, have a prompt" in cut[0].problem, refused.problems
    assert cut[0].problem.startswith("rows ") and f"of `{DPO_DEMO}`" in cut[0].problem
    keeps = int(re.search(r"set max_length: (\d+)", cut[0].fix).group(1))  # type: ignore[union-attr]
    fixed = check(spec.replace(max_length=keeps), device=BIG_MEMORY)
    assert not [p for p in fixed.problems if p.field == "max_length"], fixed.problems


def named_rows(message: str) -> dict[str, set[int]]:
    """{data file: the row numbers `message` names in it} ('rows 2, 5 of `a.jsonl` and row 4 of `b.jsonl`, ...')."""
    found: dict[str, set[int]] = {}
    for numbers, more, ref in re.findall(r"rows? ([\d, ]+?)(?: \(and (\d+) more\))? of `([^`]+)`", message):
        assert not more, message  # every row named: none left over
        found[ref] = {int(n) for n in numbers.split(", ")}
    return found


def tagged_prompt_rows(path: Path, n_rows: int, long: set[int], tag: str, blank_first: bool = False) -> str:
    """Prompt/completion rows whose prompt ends with `tag` and the row's number in the file (its line); the rows
    numbered in `long` have a prompt of 200 words. `blank_first`: the file starts with a blank line (so row i
    is on line i + 1)."""
    shift = 1 if blank_first else 0
    rows = [
        {"prompt": " ".join(["word"] * (200 if i in long else 3)) + f" {tag}{i}?", "completion": " A short answer."}
        for i in range(1 + shift, n_rows + 1 + shift)
    ]
    path.write_text("\n" * shift + "".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_rows_whose_answers_are_cut_are_named_as_the_file_numbers_them(
    data_home: Path, tiny_model: Path, tmp_path: Path
) -> None:
    a = tagged_prompt_rows(tmp_path / "a.jsonl", 12, {2, 5}, "a")
    spec = tiny_spec(tiny_model, dataset=a, max_train_samples=None)
    warned = [w for w in check(spec, device=BIG_MEMORY).warnings if "training rows, have a prompt" in w]
    assert len(warned) == 1 and warned[0].startswith(f"rows 2, 5 of `{a}`, 2 of the 12 training rows, have"), warned
    # A second source (its rows on lines 4 and 10: a blank first line) mixed in and shuffled, and an eval_split
    # holding rows out: the training rows are named by their source and line, the held-out ones not at all.
    b = tagged_prompt_rows(tmp_path / "b.jsonl", 12, {4, 10}, "b", blank_first=True)
    mixed = spec.replace(dataset=f"{a}, {b}", eval_split=6)
    loaded = load_data(mixed)
    assert loaded.eval is not None and loaded.train.column_names == loaded.eval.column_names == ["prompt", "completion"]
    held = {re.search(r" ([ab]\d+)\?$", row["prompt"]).group(1) for row in loaded.eval}  # type: ignore[union-attr]
    expected = {
        path: {n for n in long if f"{tag}{n}" not in held} for path, tag, long in ((a, "a", {2, 5}), (b, "b", {4, 10}))
    }
    assert all(expected.values()) and held & {"a2", "a5", "b4", "b10"}  # the seed holds some out, not all
    lost = sum(len(v) for v in expected.values())
    for _ in range(2):  # measured, then read from the lengths cache: the same rows named
        warned = [w for w in check(mixed, device=BIG_MEMORY).warnings if "training rows, have a prompt" in w]
        assert len(warned) == 1 and named_rows(warned[0]) == expected, warned
        assert f", {lost} of the 18 training rows, have a prompt" in warned[0]


def test_most_rows_cut_under_an_eval_split_and_a_mixture_are_refused_naming_them(
    data_home: Path, tiny_model: Path, tmp_path: Path
) -> None:
    a = tagged_prompt_rows(tmp_path / "a.jsonl", 6, {1, 2, 3, 4, 6}, "a")
    b = tagged_prompt_rows(tmp_path / "b.jsonl", 4, {2, 4, 5}, "b", blank_first=True)  # on lines 2 to 5
    spec = tiny_spec(tiny_model, dataset=f"{a}, {b}", eval_split=2, max_train_samples=None)
    held = {re.search(r" ([ab]\d+)\?$", row["prompt"]).group(1) for row in load_data(spec).eval}  # type: ignore[union-attr]
    long = {a: {1, 2, 3, 4, 6}, b: {2, 4, 5}}
    tags = {a: "a", b: "b"}
    expected = {path: {n for n in rows if f"{tags[path]}{n}" not in held} for path, rows in long.items()}
    refused = [p for p in check(spec, device=BIG_MEMORY).problems if p.field == "max_length"]
    assert len(refused) == 1, refused
    assert named_rows(refused[0].problem) == {k: v for k, v in expected.items() if v}
    lost = sum(len(v) for v in expected.values())
    assert f", {lost} of the 8 training rows, have a prompt of max_length 96 tokens" in refused[0].problem


def test_the_reward_trainer_names_the_pairs_it_drops(data_home: Path, tiny_model: Path, tmp_path: Path) -> None:
    rows = [{"prompt": f"Q{i}?", "chosen": f" Yes {i}.", "rejected": f" No {i}."} for i in range(1, 9)]
    rows[2]["chosen"] = rows[6]["rejected"] = " ".join(["word"] * 200)
    spec = tiny_spec(tiny_model, trainer="reward", dataset=write(tmp_path / "pairs.jsonl", rows))
    warned = [w for w in check(spec, device=BIG_MEMORY).warnings if "reward trainer drops" in w]
    assert len(warned) == 1 and warned[0].startswith(f"rows 3, 7 of `{spec.dataset}`, 2 of the 8 training rows"), warned


# ---------------------------------------------------------------------- unfilled template placeholders
def test_placeholders_found_in_strings_lists_and_dicts_not_in_other_braces() -> None:
    row = {"prompt": [msg("user", "Who are you, {{ user }}?")], "completion": "I am {{name}} by {{author}}, {{name}}."}
    assert placeholders_in(row) == ["user", "name", "author"]
    assert placeholders_in("tag the word in curly braces {{ . }} or {{...}}; {x} {{}} { {name} }") == []


def test_identity_placeholders_are_a_warning_naming_rows_and_names() -> None:
    rows = json.loads((LF / "identity.json").read_text())
    holding = [i + 1 for i, r in enumerate(rows) if "{{" in r["output"]]
    info = check_dataset(str(LF / "identity.json"), Trainer.SFT)  # still accepted: a warning, not a refusal
    warned = [w for w in info.warnings if "placeholder" in w]
    assert len(warned) == 1
    first = ", ".join(map(str, holding[:5]))
    assert warned[0].startswith(f"rows {first} (and {len(holding) - 5} more) hold the unfilled template placeholders")
    assert "{{name}}, {{author}}" in warned[0] and "fill them in" in warned[0]


def test_one_placeholder_row_named_and_none_without(tmp_path: Path) -> None:
    rows = [{"prompt": f"Q{i}?", "completion": "A."} for i in range(8)]
    assert not [w for w in check_dataset(write(tmp_path / "a.jsonl", rows), Trainer.SFT).warnings if "{{" in w]
    rows[3]["completion"] = "Ask {{company}}."
    warned = [w for w in check_dataset(write(tmp_path / "b.jsonl", rows), Trainer.SFT).warnings if "{{" in w]
    assert warned and warned[0].startswith("row 4 holds the unfilled template placeholder {{company}}")


def test_placeholder_warning_reaches_the_check(data_home: Path, tiny_model: Path) -> None:
    checked = check(tiny_spec(tiny_model, dataset=str(LF / "identity.json")), device=BIG_MEMORY)
    assert not checked.problems, checked.problems
    assert any("unfilled template placeholders {{name}}, {{author}}" in w for w in checked.warnings)


# ---------------------------------------------------------------------- the new rows train
@pytest.mark.integration
@pytest.mark.parametrize(
    "trainer,fixture,picked",
    [("dpo", "dpo_en_demo.json", (21, 23, 32, 10)), ("kto", "kto_en_demo.json", (12, 26, 33, 6))],
)
def test_llamafactory_rows_train(
    trainer: str, fixture: str, picked: tuple[int, ...], data_home: Path, tiny_model: Path, tmp_path: Path
) -> None:
    """Two steps on the demo's shortest rows (a system-prompt row among the dpo ones): the adapters move."""
    from jobs.devices.facts import CPU
    from jobs.train.training import train_spec

    rows = json.loads((LF / fixture).read_text())
    data = tmp_path / fixture
    data.write_text(json.dumps([rows[i] for i in picked]))
    spec = tiny_spec(
        tiny_model, trainer=trainer, dataset=str(data), max_steps=2, max_length=384, per_device_train_batch_size=2
    )
    result = train_spec(spec, tmp_path / "out", device=CPU)
    losses = [h["loss"] for h in result.log_history if "loss" in h]
    assert len(losses) == 2 and all(loss == loss for loss in losses)  # logged and not NaN
    moved = [p for n, p in result.model.named_parameters() if "lora_B" in n and p.abs().sum() > 0]
    assert moved  # lora_B starts at zero: a gradient reached the adapters


# ---------------------------------------------------------------------- raw text for continued pre-training
def test_raw_text_rows_for_continued_pretraining(data_home: Path, tiny_model: Path) -> None:
    """LLaMA-Factory's c4_demo (`text` rows): sft trains on every token; nothing is an "answer", so a short
    max_length is never refused as cutting answers away (long documents are truncated, or packed)."""
    c4 = str(LF / "c4_demo.jsonl")
    info = check_dataset(c4, Trainer.SFT)
    assert (info.format, info.n_rows, info.source_format, info.conversion) == (RowFormat.TEXT, 30, "trl", None)
    assert load_data(JobSpec(dataset=c4)).train.column_names == ["text"]
    for packing in (False, True):
        spec = tiny_spec(tiny_model, dataset=c4, max_length=64, packing=packing, max_train_samples=None)
        checked = check(spec, device=BIG_MEMORY)
        assert not checked.problems, checked.problems
        assert not any("training rows, have a prompt" in w for w in checked.warnings)
    assert "preference" in problems_text(c4, Trainer.DPO)  # text rows are sft's only
