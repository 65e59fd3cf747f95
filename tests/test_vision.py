"""Vision-language fine-tuning: image chat rows (their formats and what is refused, with row numbers), the
image checks before queueing, the LoRA mapping that leaves the vision side alone, and a tiny LLaVA run
through `tunedeck run` whose bundle reloads with AutoProcessor (images drawn here with PIL)."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.spec.job import JobSpec

COLOURS = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 200, 30)}


def draw(path: Path, colour: tuple[int, int, int], size: tuple[int, int] = (64, 64)) -> Path:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", size, colour)
    ImageDraw.Draw(image).rectangle((8, 8, 24, 24), fill=(255, 255, 255))
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def parts_rows(folder: Path, n: int = 6) -> list[dict]:
    """Chat rows with image content parts (paths relative to the data file), one coloured square each."""
    rows = []
    for i in range(n):
        name, colour = list(COLOURS.items())[i % len(COLOURS)]
        draw(folder / "pics" / f"{i}.png", colour)
        question = [{"type": "image", "image": f"pics/{i}.png"}, {"type": "text", "text": "What colour is it?"}]
        rows.append({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": name}]})
    return rows


def placeholder_rows(folder: Path, n: int = 6) -> list[dict]:
    """LLaMA-Factory's multimodal rows: `<image>` in the text, the files in `images`."""
    rows = []
    for i in range(n):
        name, colour = list(COLOURS.items())[i % len(COLOURS)]
        draw(folder / "pics" / f"{i}.png", colour)
        turns = [{"role": "user", "content": "<image>What colour is it?"}, {"role": "assistant", "content": name}]
        rows.append({"messages": turns, "images": [f"pics/{i}.png"]})
    return rows


def problems_of(path: Path) -> list[str]:
    from jobs.data.loading import check_sources
    from jobs.data.sources import DataError

    with pytest.raises(DataError) as caught:
        check_sources(str(path), "sft")
    return [f"{p.field}: {p.problem} -> {p.fix}" for p in caught.value.problems]


# ---------------------------------------------------------------------- formats
@pytest.mark.parametrize("rows_of", [parts_rows, placeholder_rows])
def test_image_rows_become_messages_with_image_parts_and_an_images_column(tmp_path: Path, rows_of) -> None:
    from jobs.data.loading import load_data

    data = write_rows(tmp_path / "train.jsonl", rows_of(tmp_path))
    loaded = load_data(JobSpec(model="tiny-llama", dataset=str(data)))
    assert loaded.train_info.images.count == 6 and loaded.train_info.images.rows == 6
    assert loaded.train_info.conversion and "image chat" in loaded.train_info.conversion
    row = loaded.train[0]
    assert [p["type"] for p in row["messages"][0]["content"]] == ["image", "text"]
    assert row["messages"][1]["content"] == [{"type": "text", "text": "red"}]
    assert row["images"][0].size == (64, 64)
    assert row["images"][0].getpixel((40, 40)) == COLOURS["red"]


def test_openai_image_url_parts_read_file_and_data_urls(tmp_path: Path) -> None:
    from jobs.data.loading import load_data

    picture = draw(tmp_path / "elsewhere" / "blue.png", COLOURS["blue"])
    buffer = io.BytesIO()
    draw(tmp_path / "green.png", COLOURS["green"]).open("rb")
    from PIL import Image

    Image.open(tmp_path / "green.png").save(buffer, format="PNG")
    data_url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    rows = [
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}],
                },
                {"role": "assistant", "content": [{"type": "text", "text": name}]},
            ]
        }
        for url, name in ((picture.as_uri(), "blue"), (data_url, "green"))
    ]
    loaded = load_data(JobSpec(model="tiny-llama", dataset=str(write_rows(tmp_path / "d.jsonl", rows))))
    colours = [loaded.train[i]["images"][0].getpixel((40, 40)) for i in range(2)]
    assert colours == [COLOURS["blue"], COLOURS["green"]]


# ---------------------------------------------------------------------- refused, with row numbers
def test_missing_unreadable_and_miscounted_images_are_refused_with_their_rows(tmp_path: Path) -> None:
    rows = placeholder_rows(tmp_path, 6)
    rows[1]["images"] = ["pics/nope.png"]
    (tmp_path / "pics" / "broken.png").write_bytes(b"not a png at all")
    rows[3]["images"] = ["pics/broken.png"]
    rows[4]["images"] = ["pics/4.png", "pics/0.png"]  # one <image> in the text, two images
    rows[5]["images"] = ["https://example.com/cat.png"]
    found = problems_of(write_rows(tmp_path / "bad.jsonl", rows))
    text = "\n".join(found)
    assert "row 2: `images` names an image file that does not exist" in text, text
    assert "relative to its folder" in text
    assert "row 4: `images` has an image file that is not a readable image" in text, text
    assert "row 5: has 1 `<image>` placeholder(s) in its turns but 2 image(s) in `images`" in text, text
    assert "row 6: `images` has a web image URL, which is never fetched" in text, text


def test_unknown_content_part_is_refused(tmp_path: Path) -> None:
    rows = parts_rows(tmp_path, 3)
    rows[2]["messages"][0]["content"].append({"type": "audio", "audio": "a.wav"})
    found = problems_of(write_rows(tmp_path / "bad.jsonl", rows))
    assert any("row 3: `messages` has a content part of type `audio`" in p for p in found), found


def refused(path: Path, trainer: str) -> str:
    from jobs.data.loading import check_sources
    from jobs.data.sources import DataError

    with pytest.raises(DataError) as caught:
        check_sources(str(path), trainer)
    return "\n".join(f"{p.field}: {p.problem} -> {p.fix}" for p in caught.value.problems)


def test_images_where_they_are_not_read_are_refused_not_dropped(tmp_path: Path) -> None:
    """Images in rows that do not read them would be dropped (and `<image>` read as text): a run failed after
    queueing ("Found 1 <image> tokens in the text but no images were passed"). Refused first."""
    draw(tmp_path / "red.png", COLOURS["red"])
    pairs = [{"prompt": "<image>What colour?", "images": ["red.png"], "chosen": "red", "rejected": "blue"}] * 3
    text = refused(write_rows(tmp_path / "orpo.jsonl", pairs), "orpo")  # dpo reads them: tests/test_vision_dpo.py
    assert "dataset: the rows have an `images` column that is not read as image chat" in text, text
    assert "orpo does not train on images yet (sft and dpo do): remove the `images` column" in text
    completions = [{"prompt": "<image>What colour?", "completion": "red", "images": ["red.png"]}] * 3
    text = refused(write_rows(tmp_path / "pc.jsonl", completions), "sft")
    assert "write the rows as chat turns: `messages` with one `<image>` per image and an `images` list" in text
    single = [{"messages": row["messages"], "image": row["images"][0]} for row in placeholder_rows(tmp_path, 3)]
    text = refused(write_rows(tmp_path / "single.jsonl", single), "sft")
    assert "an `image` column" in text and "map it with dataset_columns `images=image`" in text, text
    question = [{"type": "image", "image": "red.png"}, {"type": "text", "text": "What colour?"}]
    parts = {"prompt": [{"role": "user", "content": question}], "completion": [{"role": "assistant", "content": "red"}]}
    text = refused(write_rows(tmp_path / "kto.jsonl", [{**parts, "label": True}] * 3), "kto")
    assert "rows 1, 2, 3: `prompt` has an image content part, which is not read here" in text, text
    assert "not yet in kto, orpo, cpo, reward or grpo rows" in text
    late = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}] * 20
    late.append(parts_rows(tmp_path, 1)[0])  # image chat is told from the first 20 rows
    text = refused(write_rows(tmp_path / "late.jsonl", late), "sft")
    assert "row 21: `messages` has an image content part" in text, text
    assert "put a row with an image among the data's first 20 rows" in text


def check_problems(spec: JobSpec) -> list[str]:
    from jobs.checks.datasets import dataset_problems

    problems, _ = dataset_problems(spec, tokenizer=lambda: None)
    return [f"{p.field}: {p.problem} -> {p.fix}" for p in problems]


def test_text_only_model_given_images_is_refused_before_queueing(tmp_path: Path, tiny_model: Path) -> None:
    data = write_rows(tmp_path / "train.jsonl", parts_rows(tmp_path, 3))
    found = check_problems(JobSpec(model=str(tiny_model), dataset=str(data)))
    assert len(found) == 1 and found[0].startswith("model: "), found
    assert "is a text-only model, but" in found[0] and "3 image(s) in 3 row(s)" in found[0]
    assert "pick a vision-language model" in found[0]


def test_image_far_above_the_processors_size_is_refused_with_its_row(tmp_path: Path, tiny_vlm: Path) -> None:
    rows = parts_rows(tmp_path, 4)
    draw(tmp_path / "pics" / "2.png", COLOURS["red"], size=(512, 384))  # the tiny processor works at 32x32
    data = write_rows(tmp_path / "train.jsonl", rows)
    found = check_problems(JobSpec(model=str(tiny_vlm), dataset=str(data)))
    assert len(found) == 1, found
    assert found[0].startswith("dataset: row 3: 1 image(s) far above what the model's processor works at")
    assert "largest 512x384" in found[0] and "shrink the images" in found[0]
    rows_ok = write_rows(tmp_path / "ok.jsonl", parts_rows(tmp_path, 4))
    assert check_problems(JobSpec(model=str(tiny_vlm), dataset=str(rows_ok))) == []


# ---------------------------------------------------------------------- models and mapping
@pytest.mark.parametrize(
    "settings, limit",
    [
        ({"max_pixels": 12845056, "min_pixels": 3136}, 12845056),  # Qwen2-VL
        ({"size": {"longest_edge": 1536}}, 1536 * 1536),  # Idefics3 / SmolVLM
        ({"size": {"shortest_edge": 336}, "crop_size": {"height": 336, "width": 336}}, 336 * 336),  # LLaVA / CLIP
        ({"size": {"height": 896, "width": 896}}, 896 * 896),  # Gemma 3 / SigLIP
        ({"do_resize": False}, None),
    ],
)
def test_pixel_limit_of_each_family(settings: dict, limit: int | None) -> None:
    from jobs.models.vision import limit_of

    assert limit_of(settings) == limit


def test_tiny_vlm_is_told_apart_from_a_text_model(tiny_vlm: Path, tiny_model: Path) -> None:
    from jobs.models.vision import pixel_limit, vision_model

    assert vision_model(str(tiny_vlm)) is True
    assert vision_model(str(tiny_model)) is False
    assert vision_model("tiny-llama") is False
    assert pixel_limit(str(tiny_vlm)) == 32 * 32


NAMES = {
    "llava tower": "model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj",
    "llava projector": "model.multi_modal_projector.linear_1",
    "qwen tower": "model.visual.blocks.0.attn.qkv",
    "qwen projector": "model.visual.merger.mlp.0",
    "idefics tower": "model.vision_model.encoder.layers.0.mlp.fc1",
    "idefics projector": "model.connector.modality_projection.proj",
    "language q": "model.language_model.layers.0.self_attn.q_proj",
    "language down": "model.language_model.layers.0.mlp.down_proj",
}


@pytest.mark.parametrize(
    "vision_train, frozen",
    [
        ("language", {"llava tower", "llava projector", "qwen tower", "qwen projector", "idefics tower", "idefics projector"}),
        ("language+projector", {"llava tower", "qwen tower", "idefics tower"}),
        ("language+projector+vision", set()),
    ],
)  # fmt: skip
def test_vision_train_picks_what_lora_leaves_out(vision_train: str, frozen: set[str]) -> None:
    import re

    from jobs.config.peft import frozen_vision, peft_kwargs

    spec = JobSpec.from_dict({"model": "tiny-llama", "dataset": "sample:chat-format", "vision_train": vision_train})
    kwargs = peft_kwargs(spec, "llava", vision=True)[1]  # type: ignore[index]
    assert kwargs.get("exclude_modules") == frozen_vision(spec) and kwargs["target_modules"] == "all-linear"
    assert "exclude_modules" not in peft_kwargs(spec, "llama")[1]  # type: ignore[index]
    pattern = kwargs.get("exclude_modules") or "(?!)"
    assert {label for label, name in NAMES.items() if re.fullmatch(pattern, name)} == frozen


# ---------------------------------------------------------------------- training end to end
def weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(next(folder.glob("*.safetensors"))))


@pytest.mark.integration
def test_tunedeck_run_trains_the_tiny_vlm_and_the_bundle_reloads_with_its_processor(
    data_home: Path, tmp_path: Path, tiny_vlm: Path
) -> None:
    import torch
    from peft import PeftModel
    from PIL import Image
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from app.cli.main import main
    from storage.models import RunStatus
    from storage.store import Store

    data = write_rows(tmp_path / "train.jsonl", placeholder_rows(tmp_path, 6))
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"model: {tiny_vlm}\ndataset: {data}\nmax_steps: 3\nper_device_train_batch_size: 2\n"
        "learning_rate: 0.01\nlogging_steps: 1\nsample_count: 1\nsample_new_tokens: 4\n"
    )
    assert main(["run", str(spec)]) == 0
    store = Store()
    try:
        run = store.get_run(1)
        assert run.status is RunStatus.SUCCEEDED, run.error_detail
        losses = [p.step for p in store.metrics(1, ["loss"])]
        assert losses == [1, 2, 3], losses  # the live graphs read these rows
    finally:
        store.dispose()
    bundle = next(data_home.glob("runs/*/000001/bundle"))
    assert (bundle / "processor_config.json").is_file() and (bundle / "adapter_model.safetensors").is_file()
    adapter = json.loads((bundle / "adapter_config.json").read_text())
    assert "vision_tower" in adapter["exclude_modules"]
    assert not [k for k in weights(bundle) if "vision_tower" in k or "multi_modal_projector" in k]
    processor = AutoProcessor.from_pretrained(bundle)
    base = LlavaForConditionalGeneration.from_pretrained(tiny_vlm)
    image = Image.open(tmp_path / "pics" / "0.png")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is it?"}]}]
    inputs = processor(
        images=[image], text=processor.apply_chat_template(messages, add_generation_prompt=True), return_tensors="pt"
    )
    assert inputs["pixel_values"].shape == (1, 3, 32, 32)
    with torch.no_grad():
        before = base(**inputs).logits
        after = PeftModel.from_pretrained(base, bundle)(**inputs).logits
    assert not torch.allclose(before, after), "the trained adapter did not change the answer to an image"
    card = (bundle / "README.md").read_text()
    snippet = card.split("```python\n", 1)[1].split("```", 1)[0]
    assert "AutoProcessor" in snippet and "AutoModelForImageTextToText" in snippet
    ran = subprocess.run([sys.executable, "-c", snippet], cwd=bundle, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]


@pytest.mark.integration
@pytest.mark.parametrize("vision_train", ["language", "language+projector+vision"])
def test_full_fine_tune_trains_what_vision_train_says(tmp_path: Path, tiny_vlm: Path, vision_train: str) -> None:
    import torch

    from jobs.train.training import train_spec

    data = write_rows(tmp_path / "train.jsonl", parts_rows(tmp_path, 4))
    spec = JobSpec.from_dict(
        {"model": str(tiny_vlm), "dataset": str(data), "method": "full", "max_steps": 2, "learning_rate": 1e-2,
         "per_device_train_batch_size": 2, "sample_count": 0, "vision_train": vision_train}
    )  # fmt: skip
    from transformers import LlavaForConditionalGeneration

    result = train_spec(spec, tmp_path / "out")
    before = LlavaForConditionalGeneration.from_pretrained(tiny_vlm).state_dict()
    after = result.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    tower = {k for k in before if "vision_tower" in k and k.endswith("q_proj.weight")}
    projector = {k for k in before if "multi_modal_projector" in k and k.endswith("weight")}
    language = {k for k in before if "language_model" in k and k.endswith("q_proj.weight")}
    assert tower and projector and language
    assert language <= changed
    if vision_train == "language":
        assert not changed & (tower | projector)
    else:
        assert tower | projector <= changed
    assert result.metrics["global_step"] == 2


# ---------------------------------------------------------------------- memory
@pytest.mark.parametrize(
    "settings, size, tokens",
    [
        ({"image_processor": {"crop_size": {"height": 336, "width": 336}}, "patch_size": 14}, (640, 480), 576),
        (
            {"image_processor": {"crop_size": {"height": 336, "width": 336}}, "patch_size": 14,
             "vision_feature_select_strategy": "full", "num_additional_image_tokens": 1},
            (64, 64), 577,
        ),
        ({"patch_size": 14, "merge_size": 2, "min_pixels": 3136, "max_pixels": 12845056}, (64, 64), 4),
        ({"patch_size": 14, "merge_size": 2, "min_pixels": 3136, "max_pixels": 12845056}, (1000, 800), 1044),
        ({"patch_size": 14, "merge_size": 2, "size": {"shortest_edge": 3136, "longest_edge": 200704}}, (4000, 3000), 234),  # transformers smart_resize: 364x504
        ({"image_processor": {"size": {"longest_edge": 1536}}}, (64, 64), None),
    ],
)  # fmt: skip
def test_image_tokens_from_the_processor_settings(settings: dict, size: tuple[int, int], tokens: int | None) -> None:
    from jobs.models.vision import image_tokens

    assert image_tokens(settings, *size) == tokens


def test_prediction_counts_the_vision_weights_and_each_images_tokens(
    data_home: Path, tmp_path: Path, tiny_vlm: Path
) -> None:
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from jobs.checks.memory import measured_lengths
    from jobs.data.loading import load_data
    from jobs.memory.model_config import arch_for

    model = LlavaForConditionalGeneration.from_pretrained(tiny_vlm)
    vision = sum(p.numel() for n, p in model.named_parameters() if "vision_tower" in n or "multi_modal_projector" in n)
    arch = arch_for(str(tiny_vlm))
    assert arch.vision_params == vision > 0
    assert arch.total_params == sum(p.numel() for p in model.parameters())
    spec = JobSpec(model=str(tiny_vlm), dataset=str(write_rows(tmp_path / "d.jsonl", placeholder_rows(tmp_path, 3))))
    lengths = measured_lengths(spec)
    processor = AutoProcessor.from_pretrained(tiny_vlm)
    real = []
    for row in load_data(spec).train:
        from trl.data_utils import prepare_multimodal_messages

        messages = prepare_multimodal_messages(row["messages"], images=row["images"])
        encoded = processor.apply_chat_template(messages, tokenize=True, return_dict=True)
        real.append(len(encoded["input_ids"][0]))
    assert lengths.lengths[:, 0].tolist() == real  # 16 image tokens each, where the text had one `<image>`


# ---------------------------------------------------------------------- a zip of data and images
def test_a_zip_of_data_and_images_is_a_data_set(data_home: Path, tmp_path: Path) -> None:
    import zipfile

    from jobs.data.loading import load_data

    folder = tmp_path / "src"
    folder.mkdir()
    write_rows(folder / "train.jsonl", placeholder_rows(folder, 3))
    archive = tmp_path / "photos.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                zf.write(path, path.relative_to(folder).as_posix())
    loaded = load_data(JobSpec(model="tiny-llama", dataset=str(archive)))
    assert len(loaded.train) == 3 and loaded.train[2]["images"][0].getpixel((40, 40)) == COLOURS["green"]
    with zipfile.ZipFile(tmp_path / "two.zip", "w") as zf:
        zf.write(folder / "train.jsonl", "a.jsonl")
        zf.write(folder / "train.jsonl", "b.jsonl")
    with zipfile.ZipFile(tmp_path / "escape.zip", "w") as zf:
        zf.write(folder / "train.jsonl", "train.jsonl")
        zf.writestr("../outside.png", b"x")
    found = problems_of(tmp_path / "two.zip") + problems_of(tmp_path / "escape.zip")
    assert "`two.zip` holds 2 data files (a.jsonl, b.jsonl); it needs exactly one" in found[0], found
    assert "`escape.zip` has an entry outside its folder (../outside.png)" in found[1], found
    assert not (tmp_path / "outside.png").exists()


def test_the_forms_upload_takes_a_zip_and_previews_its_image_rows(data_home: Path, tmp_path: Path) -> None:
    import zipfile

    from app.ui.data import preview_dataset, store_upload, uploaded_files

    write_rows(tmp_path / "train.jsonl", parts_rows(tmp_path, 3))
    archive = tmp_path / "upload.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in [tmp_path / "train.jsonl", *sorted((tmp_path / "pics").iterdir())]:
            zf.write(path, path.relative_to(tmp_path).as_posix())
    stored = store_upload(str(archive))
    assert str(stored) in uploaded_files()
    summary, rows = preview_dataset(str(stored), "sft")
    assert "3 rows" in summary and "image chat" in summary, summary
    assert len(rows) == 3


# ---------------------------------------------------------------------- the pixel budget
def test_pixel_budget_counts_the_tokens_the_real_processor_makes() -> None:
    from types import SimpleNamespace

    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from jobs.models.vision import apply_budget, image_tokens, limit_of, with_budget

    holder = SimpleNamespace(image_processor=Qwen2VLImageProcessorPil())
    before = image_tokens({"image_processor": holder.image_processor.to_dict()}, 1000, 800)
    apply_budget(holder, None, 200704)
    grid = holder.image_processor(images=[Image.new("RGB", (1000, 800))], return_tensors="pt")["image_grid_thw"]
    made = int(grid.prod()) // 4  # merge_size 2: 2x2 patches a token
    settings = with_budget(Qwen2VLImageProcessorPil().to_dict(), None, 200704)
    assert image_tokens({"image_processor": settings}, 1000, 800) == made < before == 1044
    assert limit_of(settings) == 200704


def test_pixel_budget_is_refused_for_a_fixed_size_processor_and_must_be_ordered(tmp_path: Path, tiny_vlm: Path) -> None:
    data = write_rows(tmp_path / "train.jsonl", parts_rows(tmp_path, 2))
    found = check_problems(JobSpec(model=str(tiny_vlm), dataset=str(data), image_max_pixels=4096))
    assert len(found) == 1 and found[0].startswith("image_max_pixels: is set, but the image processor of"), found
    assert "resizes every image to one size" in found[0]
    from jobs.spec.job import SpecError

    with pytest.raises(SpecError) as caught:
        JobSpec.from_dict(
            {"model": str(tiny_vlm), "dataset": str(data), "image_min_pixels": 9000, "image_max_pixels": 4096}
        )
    assert [p.field for p in caught.value.problems] == ["image_min_pixels"]
