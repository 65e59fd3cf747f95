"""Preference pairs with images, for dpo with a vision-language model: one `prompt` that shows the images, and
the `chosen` and `rejected` answers (text), converted like image chat rows (`jobs.data.images`).

The prompt is `prompt` (text or turns), or LLaMA-Factory's `conversations` (ShareGPT turns) or `messages`; a
turn's content is text with `<image>` where each image goes, or content parts: an image part with its file
(`{"type": "image", "image": "pics/1.png"}`, OpenAI's `image_url`) or without one (`{"type": "image"}`, trl's
shape), whose file is the next entry of the row's `images` list. Every entry of `images` must have its place.
`chosen` and `rejected` are text, one answer turn or a list of them, without images.

    conversion = pair_image_conversion(columns, first_rows, Path("data"))  # None: not image pairs
    row, problems = conversion.convert(row)   # prompt turns with `<image>`, the answers, images, image_sizes
    trl_pair_row(row)                         # what trl's vision preference collator reads
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from jobs.data.image_parts import shows_image
from jobs.data.images import (
    IMAGE_TOKEN,
    checked_images,
    fill_places,
    flatten_content,
    flatten_turns,
    image_features,
    trl_row,
)
from jobs.data.turns import Conversion, ProblemList, answer_turns, chat_turns

PAIR_COLUMNS = ("prompt", "chosen", "rejected")
PROMPT_COLUMNS = ("prompt", "conversations", "messages")  # the first one found holds the prompt
PLACE_FIX = f"write one `{IMAGE_TOKEN}` (or an image part) in `prompt` for each entry of `images`, where it goes"
ANSWER_FIX = "write `chosen` and `rejected` as text, or as assistant turns of text (the images go in the prompt)"


def pair_image_conversion(columns: Iterable[str], rows: list[dict[str, Any]], base: Path | None) -> Conversion | None:
    """The conversion of preference rows with images (an `images` column, or image parts in the first rows'
    prompts); None otherwise."""
    cols = set(columns)
    column = next((c for c in PROMPT_COLUMNS if c in cols), None)
    if column is None or not {"chosen", "rejected"} <= cols:
        return None
    if "images" not in cols and not any(shows_image(r.get(column)) for r in rows):
        return None
    return Conversion(
        "images",
        f"`{column}` with images, `chosen` and `rejected` read as image preference pairs",
        lambda row: pair_row(row, column, base),
        (*PAIR_COLUMNS, "images"),
        (column, "chosen", "rejected", "images"),
    )


def pair_row(row: dict[str, Any], column: str, base: Path | None) -> tuple[dict[str, Any] | None, ProblemList]:
    """One pair: the prompt as turns with `<image>` placeholders, the answers as assistant turns, the checked
    images in their order; None and the problems otherwise."""
    listed = row.get("images")
    listed = [listed] if isinstance(listed, (str, dict)) else [] if listed is None else listed
    if not isinstance(listed, list):
        return None, [("`images` is not a list of image paths", 'write `images` as ["pics/1.png", ...]')]
    prompt, refs, problems = _prompt(row.get(column), column, listed)
    if prompt is None:
        return None, problems
    answers = {}
    for side in ("chosen", "rejected"):
        turns, problems = _answer(row.get(side), side)
        if turns is None:
            return None, problems
        answers[side] = turns
    checked, problems = checked_images(refs, base)
    if checked is None:
        return None, [(f"`images` {p}", fix) for p, fix in problems]
    return {"prompt": prompt, **answers, **checked}, []


def _prompt(value: Any, column: str, listed: list[Any]) -> tuple[list[dict[str, Any]] | None, list[Any], ProblemList]:
    """The prompt's turns (text with `<image>`) and its images in order: parts' own files, and `listed` for each
    `<image>` and each image part without a file."""
    turns, problems = (
        ([{"role": "user", "content": value}], []) if isinstance(value, str) else chat_turns(value, column)
    )
    if turns is None:
        return None, [], problems
    out, refs, problems = flatten_turns(turns, column)
    if out is None:
        return None, [], problems
    places, owned = len(refs), sum(1 for r in refs if r is not None)
    if places - owned != len(listed):
        found = f"has {places} image place(s) in `{column}` but {owned + len(listed)} image(s)"
        return None, [], [(found, PLACE_FIX.replace("`prompt`", f"`{column}`"))]
    return out, fill_places(refs, listed), []


def _answer(value: Any, column: str) -> tuple[list[dict[str, Any]] | None, ProblemList]:
    """An answer as assistant turns of text."""
    turns, problems = answer_turns(value, column)
    if turns is None:
        return None, problems
    out = []
    for turn in turns:
        text, images, problems = flatten_content(turn.get("content"))
        if text is None or images or IMAGE_TOKEN in text:
            found = [(f"`{column}` {p}", fix) for p, fix in problems]
            return None, found or [(f"`{column}` has an image: only the prompt shows images", ANSWER_FIX)]
        out.append({"role": turn.get("role"), "content": text})
    return out, []


def trl_pair_row(row: dict[str, Any]) -> dict[str, Any]:
    """A converted pair as trl's vision preference collator reads it: each turn's content as parts (an image
    part where each `<image>` was), and the images (a path, or a data URL's bytes) for the `images` column."""
    prompt = trl_row({"messages": row["prompt"], "images": row["images"]})
    answers = {c: trl_row({"messages": row[c]})["messages"] for c in ("chosen", "rejected")}
    return {"prompt": prompt["messages"], **answers, "images": prompt["images"]}


def pair_features() -> Any:
    """The `datasets` features of `trl_pair_row`'s rows."""
    import datasets

    message = image_features()["messages"]
    return datasets.Features({**{c: message for c in PAIR_COLUMNS}, "images": image_features()["images"]})
