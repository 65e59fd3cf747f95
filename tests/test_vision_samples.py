"""Before/after samples of a vision-language run: a held-out image row's prompt keeps its picture (a PNG in the
run's samples/ folder), and the model answers it with the picture's pixels through the processor."""

from __future__ import annotations

import json
from pathlib import Path

from jobs.spec.job import JobSpec

QUESTION = "What colour is it?"


def image_rows(folder: Path, n: int = 4) -> Path:
    from PIL import Image

    rows = []
    for i, (name, colour) in enumerate(list({"red": (220, 30, 30), "blue": (30, 30, 220)}.items()) * (n // 2)):
        Image.new("RGB", (48, 40), colour).save(folder / f"{i}.png")
        turns = [{"role": "user", "content": f"<image>{QUESTION}"}, {"role": "assistant", "content": name}]
        rows.append({"messages": turns, "images": [f"{i}.png"]})
    data = folder / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


def test_held_out_image_rows_become_prompts_with_their_pictures(tmp_path: Path, tiny_vlm: Path) -> None:
    from jobs.data.loading import load_data
    from jobs.train.before_after import pick_prompts
    from jobs.train.sample_images import keeper

    spec = JobSpec.from_dict({"model": str(tiny_vlm), "dataset": str(image_rows(tmp_path)), "eval_split": 2,
                              "sample_count": 2})  # fmt: skip
    held_out = load_data(spec).eval
    prompts, source = pick_prompts(spec, held_out, keeper(tmp_path / "run"))
    assert source == "the first prompts of the held-out (eval) rows" and len(prompts) == 1  # both ask the same
    (prompt,) = prompts
    assert prompt.text == QUESTION and prompt.messages == (("user", f"<image>{QUESTION}"),)
    (picture,) = prompt.images
    assert Path(picture).parent == tmp_path / "run" / "samples" and Path(picture).is_file()
    assert pick_prompts(spec, held_out)[1] == "tunedeck's built-in prompts"  # nowhere to keep pictures: skipped


def test_the_base_model_answers_the_picture_through_its_processor(tmp_path: Path, tiny_vlm: Path) -> None:
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from jobs.data.loading import load_data
    from jobs.train.before_after import _prompts_of, greedy, read_samples, record_before, rows, samples_path
    from jobs.train.sample_images import picture_inputs

    spec = JobSpec.from_dict({"model": str(tiny_vlm), "dataset": str(image_rows(tmp_path)), "eval_split": 2,
                              "sample_count": 1, "sample_new_tokens": 6})  # fmt: skip
    model = LlavaForConditionalGeneration.from_pretrained(tiny_vlm)
    processor = AutoProcessor.from_pretrained(tiny_vlm)
    record_before(tmp_path / "run", spec, model, processor, load_data(spec).eval)
    data = read_samples(samples_path(tmp_path / "run"))
    assert data is not None and data["errors"] == [], data
    (prompt,) = data["prompts"]
    assert len(prompt["images"]) == 1 and rows(data)[0][0] == f"[image] {QUESTION}"
    inputs = picture_inputs(processor, [("user", f"<image>{QUESTION}")], prompt["images"])
    image_token = processor.tokenizer.convert_tokens_to_ids("<image>")
    assert tuple(inputs["pixel_values"].shape) == (1, 3, 32, 32)
    assert inputs["input_ids"][0].tolist().count(image_token) == 16  # the picture's tokens, not a literal <image>
    ids = model.generate(**inputs, max_new_tokens=6, do_sample=False, pad_token_id=processor.tokenizer.pad_token_id)
    expected = processor.tokenizer.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True).strip()
    assert data["before"] == [expected]
    (_, logits) = greedy(model, processor.tokenizer, _prompts_of(data), 1, with_logits=True, processor=processor)
    assert logits[0].shape[1] == inputs["input_ids"].shape[1]  # the prompt the model read held the picture
