"""Image data as the hub and trl's examples store it: pictures held in a Parquet file as bytes (Arrow's image
struct), and turns whose image parts carry no file (`{"type": "image"}`) with the pictures in an `images` column.
The sft shape of trl's VLM examples (llava-instruct-mix) and the dpo shape (rlaif-v), written here with
`datasets` the way the hub writes them (no hub needed: the bytes and the layout are the same)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.spec.job import JobSpec

COLOURS = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 200, 30)}
QUESTION = "What colour is it?"


def pictures() -> list:
    from PIL import Image

    return [Image.new("RGB", (48, 40), colour) for colour in COLOURS.values()]


def parts(*items: str | None) -> list[dict]:
    """Content parts as Arrow stores them: every part has every key (None where it does not apply)."""
    return [
        {"type": "image", "text": None, "index": 0} if item is None else {"type": "text", "text": item, "index": None}
        for item in items
    ]


def sft_parquet(path: Path) -> Path:
    import datasets

    part = {"type": datasets.Value("string"), "text": datasets.Value("string"), "index": datasets.Value("int64")}
    turns = datasets.List({"role": datasets.Value("string"), "content": datasets.List(part)})
    rows = {
        "messages": [
            [{"role": "user", "content": parts(None, QUESTION)}, {"role": "assistant", "content": parts(name)}]
            for name in COLOURS
        ],
        "images": [[p] for p in pictures()],
    }
    features = datasets.Features({"messages": turns, "images": datasets.List(datasets.Image())})
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(path))
    return path


def dpo_parquet(path: Path) -> Path:
    import datasets

    part = {"type": datasets.Value("string"), "text": datasets.Value("string")}
    turns = datasets.List({"role": datasets.Value("string"), "content": datasets.List(part)})
    names = list(COLOURS)
    rows = {
        "prompt": [[{"role": "user", "content": [{"type": "image", "text": None}, {"type": "text", "text": QUESTION}]}]]
        * 3,
        "chosen": [[{"role": "assistant", "content": [{"type": "text", "text": n}]}] for n in names],
        "rejected": [[{"role": "assistant", "content": [{"type": "text", "text": n}]}] for n in names[1:] + names[:1]],
        "images": [[p] for p in pictures()],
    }
    features = datasets.Features(
        {"prompt": turns, "chosen": turns, "rejected": turns, "images": datasets.List(datasets.Image())}
    )
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(path))
    return path


def colours_of(ds) -> list:
    return [ds[i]["images"][0].getpixel((5, 5)) for i in range(len(ds))]


def test_trls_sft_shape_in_parquet_trains_from_the_bytes_it_holds(tmp_path: Path) -> None:
    from app.ui.thumbnails import with_thumbnails
    from jobs.data.loading import check_sources, load_data

    data = sft_parquet(tmp_path / "train.parquet")
    ((_, info),) = check_sources(str(data), "sft")
    assert (info.images.count, info.images.sizes[0]) == (3, (1, 48, 40))
    assert with_thumbnails(info.preview)[0]["images"].startswith('<img src="data:image/png;base64,')
    loaded = load_data(JobSpec(model="tiny-llama", dataset=str(data)))
    row = loaded.train[0]
    assert [p["type"] for p in row["messages"][0]["content"]] == ["image", "text"]
    assert row["messages"][1]["content"] == [{"type": "text", "text": "red"}]
    assert colours_of(loaded.train) == list(COLOURS.values())


def test_rlaif_v_dpo_shape_in_parquet(tmp_path: Path) -> None:
    from jobs.data.loading import load_data

    spec = JobSpec(model="tiny-llama", dataset=str(dpo_parquet(tmp_path / "pairs.parquet")), trainer="dpo")
    loaded = load_data(spec)
    assert [loaded.train[i]["chosen"][0]["content"][0]["text"] for i in range(3)] == list(COLOURS)
    assert [p["type"] for p in loaded.train[0]["prompt"][0]["content"]] == ["image", "text"]
    assert colours_of(loaded.train) == list(COLOURS.values())


def test_file_less_image_parts_in_json_take_the_images_column_in_order(tmp_path: Path) -> None:
    from jobs.data.loading import check_sources, load_data
    from jobs.data.sources import DataError

    for i, picture in enumerate(pictures()):
        picture.save(tmp_path / f"{i}.png")
    two = [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}, {"type": "text", "text": QUESTION}]
    row = {"messages": [{"role": "user", "content": two}, {"role": "assistant", "content": "red, blue"}],
           "images": ["0.png", "1.png"]}  # fmt: skip
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps(row) + "\n")
    loaded = load_data(JobSpec(model="tiny-llama", dataset=str(data)))
    assert [p["type"] for p in loaded.train[0]["messages"][0]["content"]] == ["image", "text", "image", "text"]
    assert [im.getpixel((5, 5)) for im in loaded.train[0]["images"]] == [COLOURS["red"], COLOURS["blue"]]
    data.write_text(json.dumps({**row, "images": ["0.png", "1.png", "2.png"]}) + "\n")
    with pytest.raises(DataError) as caught:
        check_sources(str(data), "sft")
    assert "row 1: has 2 `<image>` placeholder(s) in its turns but 3 image(s) in `images`" in str(caught.value)


def test_text_chat_beside_image_chat_is_mixed_as_image_rows_without_images(tmp_path: Path, tiny_vlm: Path) -> None:
    """LLaVA's own data mixes text-only chat into image chat: the text rows take the image rows' shape (each turn
    a text part, no images); trl's vision collator takes a batch of them (no pixels) and a mixed one."""
    from transformers import AutoProcessor
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from jobs.data.loading import load_data

    images = sft_parquet(tmp_path / "images.parquet")
    loaded = load_data(JobSpec(model=str(tiny_vlm), dataset=f"{images}, sample:chat-format [max_rows=5]"))
    assert len(loaded.train) == 8 and set(loaded.train.column_names) == {"messages", "images"}
    rows = [dict(r) for r in loaded.train]
    text = [r for r in rows if not r["images"]]
    assert len(text) == 5 and all(t["content"][0]["type"] == "text" for r in text for t in r["messages"])
    collate = DataCollatorForVisionLanguageModeling(AutoProcessor.from_pretrained(tiny_vlm))
    assert "pixel_values" not in collate(text[:2])
    mixed = collate([text[0], next(r for r in rows if r["images"])])
    assert tuple(mixed["pixel_values"].shape) == (1, 3, 32, 32)


def test_a_single_image_column_is_read_through_dataset_columns(tmp_path: Path) -> None:
    """Many hub sets hold one picture per row in an `image` column: `dataset_columns: images=image` reads it."""
    import datasets

    from jobs.data.loading import load_data

    rows = {
        "image": pictures(),
        "messages": [
            [{"role": "user", "content": f"<image>{QUESTION}"}, {"role": "assistant", "content": name}]
            for name in COLOURS
        ],
    }
    data = tmp_path / "one.parquet"
    datasets.Dataset.from_dict(rows).cast_column("image", datasets.Image()).to_parquet(str(data))
    spec = JobSpec(model="tiny-llama", dataset=str(data), dataset_columns="images=image")
    assert colours_of(load_data(spec).train) == list(COLOURS.values())


def test_tool_calling_rows_beside_image_rows_are_refused_before_queueing(tmp_path: Path) -> None:
    from jobs.data.loading import check_sources
    from jobs.data.sources import DataError

    images = sft_parquet(tmp_path / "images.parquet")
    tools = Path(__file__).parent / "fixtures" / "tool_calls" / "openai_tool_calls.jsonl"
    with pytest.raises(DataError) as caught:
        check_sources(f"{images}, {tools}", "sft")
    (problem,) = caught.value.problems
    assert "hold(s) tool calls, which cannot join the image rows of the other sources" in problem.problem
    assert problem.fix == "train the tool-calling rows and the image rows in separate jobs"
