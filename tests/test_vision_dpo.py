"""dpo on image preference pairs with a vision-language model: the shapes read, what is refused, what trl's vision
preference collator makes of the rows (the images' pixels and tokens), the measured lengths, and one tiny LLaVA
LoRA run through `tunedeck run` (images drawn here with PIL)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.spec.job import JobSpec

COLOURS = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 200, 30)}
QUESTION = "What colour is it?"


def draw(path: Path, colour: tuple[int, int, int]) -> str:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (48, 40), colour).save(path)
    return path.name


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def text_pairs(folder: Path, n: int = 6) -> list[dict]:
    """`<image>` in a text prompt, the file in `images`, the colour chosen and another rejected."""
    names = list(COLOURS)
    rows = []
    for i in range(n):
        name = names[i % len(names)]
        picture = draw(folder / f"{i}.png", COLOURS[name])
        wrong = names[(i + 1) % len(names)]
        rows.append({"prompt": f"<image>{QUESTION}", "images": [picture], "chosen": name, "rejected": wrong})
    return rows


def part_pairs(folder: Path, n: int = 6) -> list[dict]:
    """trl's shape: prompt turns with a file-less image part, answers as assistant turns, the files in `images`."""
    rows = []
    for row in text_pairs(folder, n):
        question = [{"type": "image"}, {"type": "text", "text": QUESTION}]
        rows.append(
            {
                "prompt": [{"role": "user", "content": question}],
                "chosen": [{"role": "assistant", "content": [{"type": "text", "text": row["chosen"]}]}],
                "rejected": [{"role": "assistant", "content": row["rejected"]}],
                "images": row["images"],
            }
        )
    return rows


def dpo(model: str, data: Path, **fields: object) -> JobSpec:
    return JobSpec.from_dict({"model": model, "dataset": str(data), "trainer": "dpo", **fields})


@pytest.mark.parametrize("rows_of", [text_pairs, part_pairs])
def test_image_pairs_load_as_prompt_parts_answers_and_images(tmp_path: Path, rows_of) -> None:
    from jobs.data.loading import load_data

    loaded = load_data(dpo("tiny-llama", write_rows(tmp_path / "pairs.jsonl", rows_of(tmp_path, 3))))
    row = loaded.train[0]
    assert set(loaded.train.column_names) == {"prompt", "chosen", "rejected", "images"}
    assert [p["type"] for p in row["prompt"][0]["content"]] == ["image", "text"]
    assert row["prompt"][0]["content"][1]["text"] == QUESTION
    assert row["chosen"] == [{"role": "assistant", "content": [{"type": "text", "text": "red"}]}]
    assert row["rejected"][0]["content"][0]["text"] == "blue"
    assert [loaded.train[i]["images"][0].getpixel((5, 5)) for i in range(3)] == list(COLOURS.values())
    assert loaded.train_info.images.count == 3 and "image preference pairs" in (loaded.train_info.conversion or "")


def test_an_image_part_with_its_own_file_needs_no_images_column(tmp_path: Path) -> None:
    from jobs.data.loading import load_data

    draw(tmp_path / "g.png", COLOURS["green"])
    question = [{"type": "image", "image": "g.png"}, {"type": "text", "text": QUESTION}]
    rows = [{"prompt": [{"role": "user", "content": question}], "chosen": "green", "rejected": "red"}] * 2
    loaded = load_data(dpo("tiny-llama", write_rows(tmp_path / "own.jsonl", rows)))
    assert loaded.train[1]["images"][0].getpixel((5, 5)) == COLOURS["green"]


def test_llamafactorys_sharegpt_image_pairs_are_read_too(tmp_path: Path) -> None:
    from jobs.data.loading import load_data

    draw(tmp_path / "b.png", COLOURS["blue"])
    rows = [{"conversations": [{"from": "human", "value": f"<image>{QUESTION}"}], "images": ["b.png"],
             "chosen": {"from": "gpt", "value": "blue"}, "rejected": {"from": "gpt", "value": "red"}}] * 2  # fmt: skip
    loaded = load_data(dpo("tiny-llama", write_rows(tmp_path / "sharegpt.jsonl", rows)))
    row = loaded.train[0]
    assert row["prompt"][0]["role"] == "user" and [p["type"] for p in row["prompt"][0]["content"]] == ["image", "text"]
    assert row["chosen"][0]["content"][0]["text"] == "blue" and row["images"][0].getpixel((5, 5)) == COLOURS["blue"]


def refused(path: Path, trainer: str = "dpo") -> str:
    from jobs.data.loading import check_sources
    from jobs.data.sources import DataError

    with pytest.raises(DataError) as caught:
        check_sources(str(path), trainer)
    return "\n".join(f"{p.field}: {p.problem} -> {p.fix}" for p in caught.value.problems)


def test_image_pairs_that_cannot_be_read_are_refused_with_their_rows(tmp_path: Path) -> None:
    rows = text_pairs(tmp_path, 5)
    rows[1]["images"] = [rows[1]["images"][0], rows[0]["images"][0]]  # one place, two images
    rows[2]["images"] = ["nope.png"]
    rows[3]["chosen"] = [{"role": "assistant", "content": [{"type": "image", "image": "0.png"}]}]
    rows[0]["rejected"] = "<image> blue"  # an answer's `<image>` would become an image place in it
    rows[4]["prompt"] = QUESTION  # no place for its image
    text = refused(write_rows(tmp_path / "bad.jsonl", rows))
    assert "row 2: has 1 image place(s) in `prompt` but 2 image(s)" in text, text
    assert "write one `<image>` (or an image part) in `prompt` for each entry of `images`" in text
    assert "row 3: `images` names an image file that does not exist" in text, text
    assert "row 4: `chosen` has an image: only the prompt shows images" in text, text
    assert "row 1: `rejected` has an image: only the prompt shows images" in text, text
    assert "row 5: has 0 image place(s) in `prompt` but 1 image(s)" in text, text
    completions = [{"prompt": f"<image>{QUESTION}", "images": ["0.png"], "completion": "red"}]
    text = refused(write_rows(tmp_path / "completions.jsonl", completions))
    assert "write dpo's image pairs as `prompt` (with one `<image>` where each image goes)" in text, text
    kto = [{"prompt": f"<image>{QUESTION}", "images": ["0.png"], "completion": "red", "label": True}]
    text = refused(write_rows(tmp_path / "kto.jsonl", kto), "kto")
    assert "kto does not train on images yet (sft and dpo do)" in text, text


def test_image_pairs_for_a_text_only_model_are_refused_before_queueing(tmp_path: Path, tiny_model: Path) -> None:
    from jobs.checks.datasets import dataset_problems

    spec = dpo(str(tiny_model), write_rows(tmp_path / "pairs.jsonl", text_pairs(tmp_path, 3)))
    problems, _ = dataset_problems(spec, tokenizer=lambda: None)
    assert [p.field for p in problems] == ["model"], problems
    assert "is a text-only model, but" in problems[0].problem and "3 image(s) in 3 row(s)" in problems[0].problem


def test_the_vision_collator_gets_each_pairs_pixels_and_the_measured_lengths_count_the_image_tokens(
    tmp_path: Path, tiny_vlm: Path
) -> None:
    """What trl's dpo builds from the loaded rows with the run's processor: the images' pixels (each prompt twice,
    for chosen and rejected), 16 image tokens in each sequence, and as many tokens as the prediction measured."""
    from transformers import AutoProcessor
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    from jobs.checks.memory import measured_lengths
    from jobs.data.loading import load_data

    spec = dpo(str(tiny_vlm), write_rows(tmp_path / "pairs.jsonl", part_pairs(tmp_path, 3)))
    loaded = load_data(spec)
    processor = AutoProcessor.from_pretrained(tiny_vlm)
    batch = DataCollatorForVisionPreference(processor)([dict(r) for r in loaded.train])
    assert tuple(batch["pixel_values"].shape) == (6, 3, 32, 32)
    image_token = processor.tokenizer.convert_tokens_to_ids("<image>")
    assert (batch["input_ids"] == image_token).sum(dim=1).tolist() == [16] * 6  # 32x32 pixels in 8x8 patches
    built = batch["attention_mask"].sum(dim=1).tolist()  # chosen sequences, then rejected
    lengths = measured_lengths(spec)
    assert lengths is not None
    assert lengths.lengths[:, 0].tolist() == built[:3] and lengths.lengths[:, 1].tolist() == built[3:], (
        lengths.lengths.tolist(),
        built,
    )


@pytest.mark.integration
def test_tunedeck_run_trains_dpo_on_image_pairs(data_home: Path, tmp_path: Path, tiny_vlm: Path) -> None:
    from app.cli.main import main
    from storage.models import RunStatus
    from storage.store import Store

    data = write_rows(tmp_path / "pairs.jsonl", text_pairs(tmp_path, 6))
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"model: {tiny_vlm}\ndataset: {data}\ntrainer: dpo\nmax_steps: 3\nper_device_train_batch_size: 2\n"
        "learning_rate: 0.01\nlogging_steps: 1\neval_split: 2\nsample_count: 2\nsample_new_tokens: 4\n"
    )
    assert main(["run", str(spec)]) == 0
    store = Store()
    try:
        run = store.get_run(1)
        assert run.status is RunStatus.SUCCEEDED, run.error_detail
        assert [p.step for p in store.metrics(1, ["loss"])] == [1, 2, 3]
        assert [p.step for p in store.metrics(1, ["rewards/margins"])] == [1, 2, 3]  # trl's dpo figures
    finally:
        store.dispose()
    bundle = next(data_home.glob("runs/*/000001/bundle"))
    assert (bundle / "processor_config.json").is_file() and (bundle / "adapter_model.safetensors").is_file()
    assert "vision_tower" in json.loads((bundle / "adapter_config.json").read_text())["exclude_modules"]
    # The before/after samples: the held-out pairs' prompts with their pictures, answered by base and result.
    samples = json.loads(next(data_home.glob("runs/*/000001/samples.json")).read_text())
    assert samples["errors"] == [] and samples["source"] == "the first prompts of the held-out (eval) rows", samples
    assert samples["prompts"] and all(
        len(p["images"]) == 1 and Path(p["images"][0]).is_file() for p in samples["prompts"]
    )
    assert len(samples["before"]) == len(samples["after"]) == len(samples["prompts"])
