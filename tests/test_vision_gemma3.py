"""A second vision-language family, Gemma 3 (its processor builds offline without torchvision): the image-token
count the memory prediction uses equals the processor's real input_ids length, and a LoRA run trains it
through the same path as the tiny LLaVA (`jobs.models.tiny_gemma3`, images drawn with PIL)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_vision import COLOURS, draw, parts_rows, write_rows

from jobs.spec.job import JobSpec


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from jobs.models.tiny_gemma3 import build_tiny_gemma3

    return build_tiny_gemma3(tmp_path_factory.mktemp("tiny-gemma3") / "tiny-gemma3")


def image_rows(folder: Path) -> Path:
    """3 image chat rows: a square, a tall picture, and a row with two images."""
    rows = parts_rows(folder, 3)
    draw(folder / "pics" / "1.png", COLOURS["blue"], size=(40, 90))
    rows[2]["messages"][0]["content"].insert(0, {"type": "image", "image": "pics/0.png"})
    return write_rows(folder / "train.jsonl", rows)


def test_gemma3_image_tokens_counted_as_its_processor_makes_them(
    data_home: Path, tmp_path: Path, tiny_gemma3: Path
) -> None:
    from transformers import AutoProcessor
    from trl.data_utils import prepare_multimodal_messages

    from jobs.checks.memory import measured_lengths
    from jobs.data.loading import load_data
    from jobs.models.vision import pixel_limit, vision_model

    assert vision_model(str(tiny_gemma3)) is True and pixel_limit(str(tiny_gemma3)) == 32 * 32
    spec = JobSpec(model=str(tiny_gemma3), dataset=str(image_rows(tmp_path)))
    processor = AutoProcessor.from_pretrained(tiny_gemma3)
    real = []
    for row in load_data(spec).train:
        messages = prepare_multimodal_messages(row["messages"], images=row["images"])
        real.append(len(processor.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"][0]))
    assert measured_lengths(spec).lengths[:, 0].tolist() == real


@pytest.mark.integration
def test_gemma3_lora_run_trains_the_language_model_only(tmp_path: Path, tiny_gemma3: Path) -> None:
    from jobs.train.training import train_spec

    spec = JobSpec.from_dict(
        {"model": str(tiny_gemma3), "dataset": str(image_rows(tmp_path)), "max_steps": 2, "learning_rate": 1e-2,
         "per_device_train_batch_size": 2, "sample_count": 0}
    )  # fmt: skip
    result = train_spec(spec, tmp_path / "out")
    assert result.metrics["global_step"] == 2
    trainable = [n for n, p in result.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert any("language_model" in n for n in trainable)
    assert not [n for n in trainable if "vision_tower" in n or "multi_modal_projector" in n]
