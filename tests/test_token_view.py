"""The token view (jobs.data.tokens.view) against a REAL trl trainer's prepared data and collator, position by
position: the view's trained positions must equal the positions where the trainer's collator gives a label
(sft: labels != -100; dpo, kto: completion_mask == 1), for sft completion-only, assistant-only, packing, dpo and
kto (its prompt/chosen/rejected pairs as the two rows the trainer's own unpairing makes of each);
grpo's view is the prompt ids a real GRPOTrainer generates from, none trained.
A view whose mask is shifted by one token must fail the same comparison."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jobs.data.tokens.view import RowView, token_views
from jobs.devices.facts import CPU
from jobs.spec.job import JobSpec

PROMPT_COMPLETION = [
    {"prompt": "What is the capital of France?", "completion": " Paris is the capital."},
    {"prompt": "Name a colour.", "completion": " Blue, like the sky on a clear summer day over the sea."},
    {"prompt": "A very long question " * 12, "completion": " Lost."},  # the prompt alone fills max_length
    {"prompt": "Two plus two?", "completion": " Four."},
]
MESSAGES = [
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "How are you?"},
            {"role": "assistant", "content": "Fine, thanks."},
        ]
    },
    {"messages": [{"role": "user", "content": "Say yes"}, {"role": "assistant", "content": "Yes."}]},
]
UNPAIRED = [
    {"prompt": "Pick a fruit.", "completion": " Apple.", "label": True},
    {"prompt": "Pick a fruit.", "completion": " Rock.", "label": False},
    {"prompt": "Is water wet? " * 3, "completion": " Yes, it is, in every everyday sense of the word.", "label": True},
    {"prompt": "Say hi.", "completion": " Bye.", "label": False},
]
PREFERENCE = [
    {"prompt": "Pick a fruit.", "chosen": " Apple.", "rejected": " Rock."},
    {"prompt": "Is water wet? " * 3, "chosen": " Yes, it is, in every everyday sense of the word.", "rejected": " No."},
    {"prompt": "Say hi.", "chosen": " Hi!", "rejected": " Bye."},
]

CHAT_PREFERENCE = [
    {
        "prompt": [{"role": "user", "content": "Pick a fruit."}],
        "chosen": [{"role": "assistant", "content": "Apple."}],
        "rejected": [{"role": "assistant", "content": "A rock, which is not a fruit at all, whatever you say."}],
    },
    {
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}],
        "chosen": [{"role": "assistant", "content": "Hi!"}],
        "rejected": [{"role": "assistant", "content": "Bye."}],
    },
]


def spec_of(model: Path, **fields: Any) -> JobSpec:
    return JobSpec(model=str(model), dataset="sample:chat-format", max_steps=1, per_device_train_batch_size=2,
                   **fields)  # fmt: skip


def real_trainer(spec: JobSpec, rows: list[dict[str, Any]], tmp_path: Path) -> Any:
    import datasets

    from jobs.config.mapping import training_config
    from jobs.train.trainers import build_trainer
    from jobs.train.training import load_model

    model, tokenizer = load_model(spec, CPU)
    args = training_config(spec, CPU, str(tmp_path / "out"))
    return build_trainer(spec, model, tokenizer, args, datasets.Dataset.from_list(rows), None, None, [])


def collator_positions(trainer: Any, example: dict[str, Any]) -> list[list[int]]:
    """Per sequence of one prepared example, the positions the real collator puts in the loss."""
    batch = trainer.data_collator([example])
    if "completion_ids" in example:  # kto: prompt + completion
        n = len(example["prompt_ids"]) + len(example["completion_ids"])
        return [[i for i, b in enumerate(batch["completion_mask"][0].tolist()[:n]) if b]]
    if "completion_mask" in batch:  # dpo: chosen, then rejected
        ends = [len(example["prompt_ids"]) + len(example[k]) for k in ("chosen_ids", "rejected_ids")]
        return [[i for i, b in enumerate(batch["completion_mask"][k].tolist()[: ends[k]]) if b] for k in (0, 1)]
    labels = batch["labels"][0].tolist()
    if "seq_lengths" in example:  # packed: one list per packed row
        out, start = [], 0
        for length in example["seq_lengths"]:
            out.append([i for i in range(length) if labels[start + i] != -100])
            start += length
        return out
    return [[i for i, label in enumerate(labels) if label != -100]]


def view_positions(views: list[RowView]) -> dict[tuple[int, ...], list[int]]:
    """{kept token ids: trained positions} for every sequence of every row trl keeps."""
    return {tuple(t.id for t in s.kept): s.trained_positions for v in views if not v.dropped for s in v.sequences}


def differences(views: list[RowView], trainer: Any) -> list[str]:
    """Where the view and the real trainer's collator disagree (empty: they agree everywhere)."""
    ours = view_positions(views)
    found = []
    theirs: dict[tuple[int, ...], list[int]] = {}
    for example in trainer.train_dataset:
        if "completion_ids" in example:
            ids = tuple(example["prompt_ids"] + example["completion_ids"])[: trainer.args.max_length]
            theirs[ids] = collator_positions(trainer, example)[0]
        elif "prompt_ids" in example:
            for name, positions in zip(("chosen_ids", "rejected_ids"), collator_positions(trainer, example)):
                theirs[tuple(example["prompt_ids"] + example[name])[: trainer.args.max_length]] = positions
        elif "seq_lengths" in example:
            start = 0
            for length, positions in zip(example["seq_lengths"], collator_positions(trainer, example)):
                theirs[tuple(example["input_ids"][start : start + length])] = positions
                start += length
        else:
            theirs[tuple(example["input_ids"])] = collator_positions(trainer, example)[0]
    if set(ours) != set(theirs):
        found.append(f"sequences differ: {len(set(ours) ^ set(theirs))} not in both")
    for ids, positions in theirs.items():
        if ours.get(ids) != positions:
            found.append(f"{len(ids)}-token sequence: view {ours.get(ids)} vs collator {positions}")
    return found


def shifted(views: list[RowView]) -> list[RowView]:
    """The mutation: every trained mark moved one token later."""
    from dataclasses import replace

    out = []
    for v in views:
        seqs = []
        for s in v.sequences:
            marks = [t.trained for t in s.tokens]
            marks = [False, *marks[:-1]]
            seqs.append(replace(s, tokens=tuple(replace(t, trained=m) for t, m in zip(s.tokens, marks))))
        out.append(replace(v, sequences=tuple(seqs)))
    return out


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


@pytest.mark.parametrize(
    ("rows", "fields"),
    [
        pytest.param(PROMPT_COMPLETION, {"max_length": 24}, id="sft-completion-only"),
        pytest.param(PROMPT_COMPLETION, {"max_length": 24, "completion_only_loss": False}, id="sft-whole-sequence"),
        pytest.param(MESSAGES, {"max_length": 40, "assistant_only_loss": True}, id="sft-assistant-only"),
        pytest.param(MESSAGES, {"max_length": 512}, id="sft-messages"),
        pytest.param(PROMPT_COMPLETION, {"max_length": 32, "packing": True}, id="sft-packing"),
        pytest.param(PREFERENCE, {"max_length": 20, "trainer": "dpo"}, id="dpo"),
        pytest.param(UNPAIRED, {"max_length": 20, "trainer": "kto"}, id="kto"),
        pytest.param(PREFERENCE, {"max_length": 20, "trainer": "kto"}, id="kto-pairs"),  # trl unpairs them
        pytest.param(CHAT_PREFERENCE, {"max_length": 40, "trainer": "kto"}, id="kto-chat-pairs"),
    ],
)
def test_view_matches_the_real_collator(tiny_model: Path, tokenizer: Any, tmp_path: Path, rows, fields) -> None:
    spec = spec_of(tiny_model, **fields)
    trainer = real_trainer(spec, rows, tmp_path)
    views = token_views(spec, rows, tokenizer)
    assert len(views) == len(rows)
    assert any(v.trained_count for v in views)
    assert differences(views, trainer) == []
    assert differences(shifted(views), trainer) != []  # a mask one token off is caught


def test_kto_pairs_are_the_two_rows_trl_unpairs_them_into(tiny_model: Path, tokenizer: Any, tmp_path: Path) -> None:
    """A prompt/chosen/rejected row under kto is one view of two sequences, the chosen answer desirable and the
    rejected one undesirable, as a real KTOTrainer's unpaired, prepared rows hold them (ids and label); a pair whose
    prompt fills max_length is dropped, as the trainer drops both its halves."""
    rows = PREFERENCE  # the second pair's prompt alone fills max_length 20
    spec = spec_of(tiny_model, max_length=20, trainer="kto")
    trainer = real_trainer(spec, rows, tmp_path)
    theirs = {tuple(e["prompt_ids"] + e["completion_ids"])[:20]: bool(e["label"]) for e in trainer.train_dataset}
    views = token_views(spec, rows, tokenizer)
    assert [v.index for v in views] == [0, 1, 2]
    assert all([s.name for s in v.sequences] == ["chosen (desirable)", "rejected (undesirable)"] for v in views)
    ours = {
        tuple(t.id for t in s.kept): s.name.startswith("chosen") for v in views if not v.dropped for s in v.sequences
    }
    assert ours == theirs and len(theirs) == 4  # two pairs kept, each as a desirable and an undesirable row
    swapped = {ids: not label for ids, label in ours.items()}
    assert swapped != theirs  # a view with the labels the wrong way round is caught
    assert [v.dropped for v in views] == [False, True, False]
    answer = "".join(t.text for t in views[0].sequences[1].tokens if t.trained)
    assert answer == " Rock." + tokenizer.eos_token  # the rejected answer, EOS added as for unpaired rows


def test_the_cut_and_the_dropped_row_are_marked(tiny_model: Path, tokenizer: Any) -> None:
    views = token_views(spec_of(tiny_model, max_length=24), PROMPT_COMPLETION, tokenizer)
    long_answer, lost = views[1].sequences[0], views[2]
    assert long_answer.cut_count > 0 and len(long_answer.kept) == 24
    assert all(t.cut for t in long_answer.tokens[24:])
    assert lost.dropped and lost.trained_count == 0
    assert not views[0].dropped and views[0].sequences[0].tokens[-1].special  # EOS shown, trained
    assert views[0].sequences[0].tokens[-1].trained


def run_data_show(spec_file: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "app.cli.main", "data", "show", str(spec_file), *flags],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip


def test_data_show_prints_the_masks(tiny_model: Path, tmp_path: Path) -> None:
    import json

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in PROMPT_COMPLETION))
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(f"model: {tiny_model}\ndataset: {data}\nmax_length: 24\n")
    piped = run_data_show(spec_file)  # stdout is a pipe: plain marks
    assert piped.returncode == 0, piped.stderr
    assert "[masked]What is the capital of France?[/masked] Paris is the capital.<|im_end|>" in piped.stdout
    assert "\x1b[" not in piped.stdout
    assert "== row 2 of" in piped.stdout and "cut at max_length 24" in piped.stdout
    assert "[cut]" in piped.stdout.split("== row 2")[1].split("== row 3")[0]
    coloured = run_data_show(spec_file, "--row", "3", "--color", "always")
    assert coloured.returncode == 0, coloured.stderr
    assert "== row 3 of" in coloured.stdout and "== row 1" not in coloured.stdout
    assert "(trl drops this row" in coloured.stdout
    row = coloured.stdout.split("== row 3")[1]
    assert "\x1b[90m" in row and "\x1b[32m" not in row and "✂" in row  # nothing trained: grey, then the cut
    missing = run_data_show(spec_file, "--row", "99")
    assert (
        missing.returncode == 2 and "row 99 of" in missing.stderr and "not among the 4 training rows" in missing.stderr
    )


PROMPTS: list[dict[str, Any]] = [
    {"prompt": "Write a haiku about the sea."},
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]},
    {"prompt": [{"role": "user", "content": "Two plus two?"}]},
]


def test_grpo_view_is_the_prompt_trl_generates_from(tiny_model: Path, tokenizer: Any, tmp_path: Path) -> None:
    """Per row, the view's tokens are the prompt ids a real GRPOTrainer generates from (its `_tokenize_prompts` on
    the batch of its own train_dataset's prompts), all masked, with the completion's bound noted."""
    for rows in (PROMPTS[:1], PROMPTS[1:]):  # string prompts, then chat prompts (one format per data set)
        spec = spec_of(tiny_model, trainer="grpo", num_generations=2, max_completion_length=16, rewards="repetition")
        trainer = real_trainer(spec, rows, tmp_path)
        theirs = [list(ids) for ids in trainer._tokenize_prompts([r["prompt"] for r in trainer.train_dataset])[0]]
        views = token_views(spec, rows, tokenizer)
        assert [[t.id for t in v.sequences[0].tokens] for v in views] == theirs
        assert all(v.trained_count == 0 and not v.dropped and not v.untrained for v in views)
        assert all("at most 16 tokens" in v.notes[0] for v in views)
    chat = views[0].sequences[0].tokens
    assert "".join(t.text for t in chat).endswith("<|im_start|>assistant\n")  # the generation prompt, shown
    without = tokenizer.apply_chat_template(PROMPTS[1]["prompt"], add_generation_prompt=False, tokenize=True)
    without = list(without["input_ids"] if hasattr(without, "keys") else without)
    assert without == theirs[0][: len(without)] != theirs[0]  # a view without the generation prompt is caught


def test_trainers_and_rows_the_view_does_not_cover_are_refused_by_name(
    tiny_model: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import replace

    from jobs.data.tokens.view import ViewUnavailable
    from jobs.spec.trainer_records import RECORDS, record_for

    assert all(record.token_view for record in RECORDS.values())  # every trainer's text rows are shown
    monkeypatch.setitem(RECORDS, record_for("reward").trainer, replace(record_for("reward"), token_view=""))
    with pytest.raises(ViewUnavailable) as reward:  # a trainer added without a view is refused by name
        token_views(spec_of(tiny_model, trainer="reward"), PREFERENCE, tokenizer)
    assert reward.value.problems[0].field == "trainer" and "not reward" in reward.value.problems[0].problem
    monkeypatch.undo()
    pair = {**PREFERENCE[0], "images": ["a.png"]}  # sft's and dpo's are shown (tests/test_token_view_images.py)
    with pytest.raises(ViewUnavailable) as images:
        token_views(spec_of(tiny_model, trainer="orpo"), [pair], tokenizer)
    assert "sft's image rows and dpo's pairs, not orpo's" in images.value.problems[0].problem
    with pytest.raises(ViewUnavailable) as text_only:  # dpo's pairs need the model's processor
        token_views(spec_of(tiny_model, trainer="dpo"), [pair], tokenizer)
    assert text_only.value.problems[0].field == "model" and "processor" in text_only.value.problems[0].problem
