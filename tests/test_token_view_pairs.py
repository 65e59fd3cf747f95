"""The token view of orpo, cpo and the reward trainer (jobs.data.tokens.pair_views) against REAL trl trainers on the
tiny model, position by position: orpo's and cpo's trained positions are the labels their own forward pass puts
in the loss (captured as `concatenated_forward` passes them: the preference terms' labels and the NLL term's,
which for orpo covers the whole chosen sequence), the cut is the answer tokens `tokenize_row` leaves out; the
reward view is the chosen/rejected ids the RewardTrainer's prepared dataset holds, none trained, and the rows it
filters out at max_length dropped. A mask shifted by one token, or a max_length boundary off by one, fails."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_token_view import real_trainer, shifted, spec_of

from jobs.data.tokens.view import RowView, token_views
from jobs.spec.enums import Trainer
from jobs.spec.job import JobSpec

PAIRS = [
    {"prompt": "Pick a fruit.", "chosen": " Apple.", "rejected": " Rock."},
    {"prompt": "Tell me more.", "chosen": " A long answer that goes on past the limit of tokens.", "rejected": " No."},
    {"prompt": "Is water wet? " * 3, "chosen": " Yes, it is.", "rejected": " No."},  # the prompt fills max_length
    {"prompt": "Say hi.", "chosen": " Hi!", "rejected": " Bye."},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


def trained_labels(trainer: Any, example: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """[chosen, rejected]: the positions in the loss, read from the labels the trainer's own forward pass uses:
    those it gives `get_batch_logps` (the preference terms) and, on the chosen side, those of its NLL term."""
    import torch

    seen: dict[str, Any] = {}
    logps, forward = trainer.get_batch_logps, torch.nn.CrossEntropyLoss.forward

    def keep_logps(logits: Any, labels: Any, *a: Any, **k: Any) -> Any:
        seen["labels"] = labels.clone()
        return logps(logits, labels, *a, **k)

    def keep_nll(self: Any, logits: Any, labels: Any) -> Any:
        seen["nll"] = labels.clone()  # shifted: the label of position p + 1 at index p
        return forward(self, logits, labels)

    monkeypatch.setattr(trainer, "get_batch_logps", keep_logps)
    monkeypatch.setattr(torch.nn.CrossEntropyLoss, "forward", keep_nll)
    batch = trainer.data_collator([example])
    with torch.no_grad():
        trainer.concatenated_forward(trainer.model, batch)
    monkeypatch.undo()
    inputs = trainer.concatenated_inputs(batch, False, trainer.data_collator.pad_token_id, device="cpu")
    if trainer.args.__class__.__name__ == "ORPOConfig":  # orpo: its NLL labels are the attended input ids
        nll = torch.where(inputs["concatenated_attention_mask"] == 1, inputs["concatenated_input_ids"], -100)[0]
    else:
        nll = inputs["concatenated_labels"][0]
    assert seen["nll"].tolist() == nll[1:].tolist()  # what the loss was given, bar the unpredicted first token
    out = []
    for k, side in enumerate(("chosen", "rejected")):
        n = len(example[f"{side}_input_ids"])
        labels = seen["labels"][k].tolist()[:n]
        positions = {p for p, label in enumerate(labels) if label != -100}
        if k == 0:
            positions |= {p for p, label in enumerate(nll.tolist()[:n]) if label != -100}
        out.append(sorted(positions))
    return out


def pair_differences(views: list[RowView], trainer: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    found = []
    for view, example in zip(views, trainer.train_dataset, strict=True):
        for seq, positions in zip(view.sequences, trained_labels(trainer, example, monkeypatch), strict=True):
            ids = [t.id for t in seq.kept]
            if ids != example[f"{seq.name}_input_ids"]:
                found.append(f"row {view.index} {seq.name}: ids differ")
            if seq.trained_positions != positions:
                found.append(f"row {view.index} {seq.name}: view {seq.trained_positions} vs trl {positions}")
    return found


@pytest.mark.parametrize("trainer_name", ["orpo", "cpo"])
def test_orpo_cpo_view_matches_the_labels_trl_trains_on(
    tiny_model: Path, tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trainer_name: str
) -> None:
    spec = spec_of(tiny_model, trainer=trainer_name, max_length=20)
    views = token_views(spec, PAIRS, tokenizer)  # first: its trl config resets the accelerator state the trainer reads
    trainer = real_trainer(spec, PAIRS, tmp_path)
    assert pair_differences(views, trainer, monkeypatch) == []
    assert pair_differences(shifted(views), trainer, monkeypatch) != []  # a mask one token off is caught
    long_answer, full_prompt = views[1].sequences[0], views[2]
    assert long_answer.cut_count > 0 and len(long_answer.kept) == 20 and long_answer.tokens[-1].special  # EOS cut
    assert all(s.cut_count and len(s.kept) == full_prompt.prompt_tokens > 20 for s in full_prompt.sequences)
    assert any("prompt alone fills max_length 20" in n for n in full_prompt.notes)
    chosen, rejected = views[0].sequences
    n_prompt = views[0].prompt_tokens
    assert rejected.trained_positions == list(range(n_prompt, len(rejected.kept)))  # the answer, EOS included
    if trainer_name == "orpo":  # its NLL term trains the chosen prompt too, said in the row's note
        assert chosen.trained_positions == list(range(len(chosen.kept)))
        assert "trains the chosen side's prompt too" in views[0].notes[0]
    else:
        assert chosen.trained_positions == list(range(n_prompt, len(chosen.kept)))


def reward_differences(views: list[RowView], trainer: Any) -> list[str]:
    kept = [[[t.id for t in s.kept] for s in v.sequences] for v in views if not v.dropped]
    theirs = [[list(example["chosen_ids"]), list(example["rejected_ids"])] for example in trainer.train_dataset]
    return [] if kept == theirs else [f"view {kept} vs trl {theirs}"]


def test_reward_view_is_what_the_reward_trainer_scores(tiny_model: Path, tokenizer: Any, tmp_path: Path) -> None:
    """With max_length the first row's length, PAIRS' first and last rows fit (the first exactly) and the middle two
    do not: the view drops what trl filters out (a side over max_length), shows the rest whole, trains no token."""
    wide = token_views(spec_of(tiny_model, trainer="reward", max_length=512), PAIRS, tokenizer)
    edge = max(len(s.tokens) for s in wide[0].sequences)  # row 1 fits exactly
    assert max(len(s.tokens) for s in wide[3].sequences) <= edge < min(len(wide[i].sequences[0].tokens) for i in (1, 2))
    spec = spec_of(tiny_model, trainer="reward", max_length=edge)
    trainer = real_trainer(spec, PAIRS, tmp_path)
    views = token_views(spec, PAIRS, tokenizer)
    assert [v.dropped for v in views] == [False, True, True, False]
    assert reward_differences(views, trainer) == []
    assert all(v.trained_count == 0 and not v.untrained and "no token labels" in v.notes[0] for v in views)
    assert all(t.text == tokenizer.eos_token for v in views for s in v.sequences for t in s.tokens[-1:])  # EOS added
    off_by_one = token_views(spec_of(tiny_model, trainer="reward", max_length=edge - 1), PAIRS, tokenizer)
    assert reward_differences(off_by_one, trainer) != []  # a max_length boundary one token off is caught
    without_eos = [RowView(v.index, tuple(s.__class__(s.name, s.tokens[:-1]) for s in v.sequences), v.dropped)
                   for v in views]  # fmt: skip
    assert reward_differences(without_eos, trainer) != []


def test_the_api_shows_the_new_trainers_rows(tiny_model: Path, tmp_path: Path) -> None:
    """`tokens_record` (the API's `/tokens` and the launch form's token panel) gives each trainer's sides by name."""
    from jobs.checks.shown_data import tokens_record

    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in PAIRS))
    for name, trained, noted in (("orpo", True, True), ("cpo", True, False), ("reward", False, True)):
        spec = JobSpec(model=str(tiny_model), dataset=str(data), trainer=Trainer(name), max_length=20, max_steps=1)
        shown = tokens_record(spec)
        first = shown["rows"][0]
        assert [s["name"] for s in first["sequences"]] == ["chosen", "rejected"]
        assert (first["trained"] > 0) is trained and bool(first["notes"]) is noted


CHAT_PAIRS = [
    {
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Pick a fruit."}],
        "chosen": [{"role": "assistant", "content": "Apple."}],
        "rejected": [{"role": "assistant", "content": "Rock, a long answer that goes on past the limit."}],
    },
    {
        "prompt": [{"role": "user", "content": "Say hi."}],
        "chosen": [{"role": "assistant", "content": "Hi!"}],
        "rejected": [{"role": "assistant", "content": "Bye."}],
    },
]


@pytest.mark.parametrize("trainer_name", ["orpo", "cpo", "reward"])
def test_chat_pairs_match_the_real_trainer_too(
    tiny_model: Path, tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trainer_name: str
) -> None:
    """Conversational pairs go through the chat template as each trainer renders them (orpo/cpo: trl's
    `maybe_apply_chat_template`; reward: its `_prepare_dataset`), compared as above."""
    spec = spec_of(tiny_model, trainer=trainer_name, max_length=40)
    views = token_views(spec, CHAT_PAIRS, tokenizer)
    trainer = real_trainer(spec, CHAT_PAIRS, tmp_path)
    if trainer_name == "reward":
        assert reward_differences(views, trainer) == []
        assert [v.dropped for v in views] == [True, False]  # the long rejected answer: over max_length
        assert reward_differences([replace(v, dropped=False) for v in views], trainer) != []  # a row kept: caught
        return
    assert pair_differences(views, trainer, monkeypatch) == []
    assert pair_differences(shifted(views), trainer, monkeypatch) != []
    assert views[0].sequences[1].cut_count > 0  # the long rejected answer, cut at max_length
    assert "<|im_start|>assistant" in "".join(t.text for t in views[1].sequences[0].kept)
