"""The token view of sft's image rows (jobs.data.tokens.image_view) against a REAL SFTTrainer on the tiny LLaVA:
the view's trained positions equal the trainer's vision collator's labels != -100, position by position, for the
whole sequence, assistant-only loss and a max_length cut; each image's placeholder tokens are one block; a mask
shifted by one token fails the comparison."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from jobs.data.tokens.view import RowView, token_views
from jobs.devices.facts import CPU
from jobs.spec.job import JobSpec

ANSWERS = ["red, a warm colour like a ripe tomato", "blue", "green as grass"]


def image_data(folder: Path) -> Path:
    """Chat rows with `<image>` in the user's turn and one coloured square in `images`."""
    from PIL import Image

    (folder / "pics").mkdir(parents=True, exist_ok=True)
    lines = []
    for i, answer in enumerate(ANSWERS):
        Image.new("RGB", (40, 40), (40 * i, 200, 90)).save(folder / "pics" / f"{i}.png")
        turns = [{"role": "user", "content": "<image>What colour is it?"}, {"role": "assistant", "content": answer}]
        lines.append(json.dumps({"messages": turns, "images": [f"pics/{i}.png"]}))
    path = folder / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def collator_positions(spec: JobSpec, tmp_path: Path) -> tuple[list[list[int]], list[list[int]], Any]:
    """(input ids, trained positions) per training row, from a real SFTTrainer's collator; and the loaded rows."""
    from jobs.config.mapping import training_config
    from jobs.data.loading import load_data
    from jobs.train.trainers import build_trainer
    from jobs.train.training import load_model

    model, processor = load_model(spec, CPU)
    loaded = load_data(spec)
    args = training_config(spec, CPU, str(tmp_path / "out"))
    args.completion_only_loss = False  # as jobs.train.training sets it for image chat rows
    trainer = build_trainer(spec, model, processor, args, loaded.train, None, None, [])
    ids, trained = [], []
    for i in range(len(trainer.train_dataset)):
        batch = trainer.data_collator([trainer.train_dataset[i]])
        ids.append(batch["input_ids"][0].tolist())
        trained.append([j for j, label in enumerate(batch["labels"][0].tolist()) if label != -100])
    return ids, trained, loaded


def shifted(views: list[RowView]) -> list[RowView]:
    out = []
    for v in views:
        (s,) = v.sequences
        marks = [False, *[t.trained for t in s.tokens][:-1]]
        out.append(
            replace(v, sequences=(replace(s, tokens=tuple(replace(t, trained=m) for t, m in zip(s.tokens, marks))),))
        )
    return out


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"max_length": 512}, id="whole"),
        pytest.param({"max_length": 512, "assistant_only_loss": True}, id="assistant-only"),
        pytest.param({"max_length": 30}, id="cut"),
    ],
)
def test_image_rows_view_matches_the_vision_collator(tiny_vlm: Path, tmp_path: Path, fields: dict) -> None:
    from jobs.models.vision import local_processing_class

    spec = JobSpec(model=str(tiny_vlm), dataset=str(image_data(tmp_path)), max_steps=1, per_device_train_batch_size=1,
                   **fields)  # fmt: skip
    ids, trained, loaded = collator_positions(spec, tmp_path)
    views = token_views(spec, loaded.train.to_list(), local_processing_class(str(tiny_vlm)))
    kept = [[t.id for t in v.sequences[0].kept] for v in views]
    assert kept == ids
    assert [v.sequences[0].trained_positions for v in views] == trained
    assert [s.trained_positions for v in shifted(views) for s in v.sequences] != trained  # one token off: caught
    for view in views:
        ((start, length),) = view.sequences[0].image_blocks  # one image: one block of the processor's image tokens
        tokens = view.sequences[0].tokens
        assert length == 16 and {t.text for t in tokens[start : start + length]} == {"<image>"}
        assert "1 image(s): 16 image tokens" in view.notes[0]
    if fields.get("assistant_only_loss"):  # `tunedeck data show`: each image's tokens as one masked piece
        from app.cli.data_show import render_tokens

        shown = render_tokens(views[0].sequences[0].tokens, False, views[0].sequences[0].image_blocks)
        assert shown.startswith("[masked]<|im_start|>user\n[image × 16]What colour") and "<image><image>" not in shown
    if fields["max_length"] == 30:
        assert all(v.sequences[0].cut_count > 0 for v in views) and all(len(k) == 30 for k in kept)
    if fields.get("assistant_only_loss"):
        assert all(not any(t.trained for t in v.sequences[0].tokens[:20]) for v in views)  # the image is masked


def test_image_rows_without_the_processor_are_refused_by_name(tiny_vlm: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from jobs.data.loading import load_data
    from jobs.data.tokens.view import ViewUnavailable

    spec = JobSpec(model=str(tiny_vlm), dataset=str(image_data(tmp_path)), max_steps=1)
    rows = load_data(spec).train.to_list()
    with pytest.raises(ViewUnavailable) as refused:
        token_views(spec, rows, AutoTokenizer.from_pretrained(str(tiny_vlm)))  # the tokenizer alone: no images
    assert refused.value.problems[0].field == "model" and "processor" in refused.value.problems[0].problem


def test_data_show_shows_an_image_row_with_its_block(tiny_vlm: Path, tmp_path: Path) -> None:
    """`tunedeck data show` loads the model's processor for image rows (jobs.models.vision.local_processing_class)."""
    import os
    import subprocess
    import sys

    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(f"model: {tiny_vlm}\ndataset: {image_data(tmp_path)}\nassistant_only_loss: true\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent), "HF_HUB_OFFLINE": "1"}
    shown = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "data", "show", str(spec_file), "--row", "2"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "(1 image(s): 16 image tokens)" in shown.stdout
    assert "[masked]<|im_start|>user\n[image × 16]What colour is it?" in shown.stdout
    assert "[/masked]blue<|im_end|>" in shown.stdout


@pytest.mark.parametrize("max_length", [512, 36], ids=["whole", "cut"])  # the prompt: 34 tokens
def test_dpo_image_pairs_view_matches_the_vision_preference_collator(
    tiny_vlm: Path, tmp_path: Path, max_length: int
) -> None:
    """dpo's image pairs: per side, the view's kept ids and trained positions equal a real DPOTrainer's vision
    preference collator's (attention_mask, completion_mask == 1), the image one block; one token off fails."""
    from test_vision_dpo import dpo, part_pairs, write_rows

    from jobs.config.mapping import training_config
    from jobs.data.loading import load_data
    from jobs.models.vision import local_processing_class
    from jobs.train.trainers import build_trainer
    from jobs.train.training import load_model

    spec = dpo(str(tiny_vlm), write_rows(tmp_path / "pairs.jsonl", part_pairs(tmp_path, 3)), max_length=max_length,
               max_steps=1, per_device_train_batch_size=1)  # fmt: skip
    loaded = load_data(spec)
    views = token_views(spec, loaded.train.to_list(), local_processing_class(str(tiny_vlm)))
    model, processor = load_model(spec, CPU)
    trainer = build_trainer(spec, model, processor, training_config(spec, CPU, str(tmp_path / "out")), loaded.train,
                            None, None, [])  # fmt: skip
    theirs = []
    for i in range(len(trainer.train_dataset)):
        batch = trainer.data_collator([trainer.train_dataset[i]])
        for k in (0, 1):  # chosen, then rejected
            n = int(batch["attention_mask"][k].sum())
            mask = batch["completion_mask"][k].tolist()[:n]
            theirs.append((batch["input_ids"][k].tolist()[:n], [j for j, bit in enumerate(mask) if bit]))
    ours = [([t.id for t in s.kept], s.trained_positions) for v in views for s in v.sequences]
    assert ours == theirs
    assert [s.trained_positions for v in shifted_pairs(views) for s in v.sequences] != [p for _, p in theirs]
    for view in views:
        assert [s.name for s in view.sequences] == ["chosen", "rejected"]
        assert all(len(s.image_blocks) == 1 and s.image_blocks[0][1] == 16 for s in view.sequences)
        assert view.trained_count > 0 and "1 image(s): 16 image tokens" in view.notes[0]
    if max_length == 36:
        assert all(len(s.kept) == 36 and len(s.trained_positions) == 2 for v in views for s in v.sequences)
        assert any(s.cut_count for v in views for s in v.sequences)


def shifted_pairs(views: list[RowView]) -> list[RowView]:
    out = []
    for v in views:
        seqs = []
        for s in v.sequences:
            marks = [False, *[t.trained for t in s.tokens][:-1]]
            seqs.append(replace(s, tokens=tuple(replace(t, trained=m) for t, m in zip(s.tokens, marks))))
        out.append(replace(v, sequences=tuple(seqs)))
    return out
