"""Chat rows with images: the shapes people bring, converted to one `messages` + `images` row, each image checked.

Two shapes are read (detected from the columns and the first rows):

- content parts: `messages` whose `content` is a list of parts, `{"type": "text", "text": ...}`,
  `{"type": "image", "image": "pics/1.png"}` or OpenAI's `{"type": "image_url", "image_url": {"url": ...}}`;
- LLaMA-Factory's multimodal rows: `messages` (or ShareGPT `conversations`) whose text holds one `<image>`
  placeholder per entry of the row's `images` list.

A converted row keeps each turn's text with an `<image>` where its image goes (what the row checks and the
preview read), `images` (each a resolved path or a `data:` URL) and `image_sizes` ([width, height] of each, read
from the file's header). Paths are read relative to the data file's folder; `file://` URLs and `data:` URLs are
accepted, web URLs are not fetched; for a restricted user (a dashboard with a login) a path is read only from
the data folders (`storage.data_folders.readable`, asked before the file is opened: `OUTSIDE`). `trl_row` turns a converted row into what trl's vision collator reads:
content parts with `{"type": "image"}` placeholders and the images as the `images` column.

    conversion = image_conversion(columns, first_rows, Path("data"))   # None: no images in these rows
    row, problems = conversion.convert(row)
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from jobs.data.embedded_images import embedded_url
from jobs.data.image_parts import IMAGE_PART_TYPES, shows_image
from jobs.data.turns import Conversion, ProblemList, chat_turns, with_system
from jobs.errors import Problem
from jobs.spec.trainer_records import record_for
from storage.data_folders import readable

IMAGE_TOKEN = "<image>"
CHAT_COLUMNS = ("messages", "conversations")
PARTS_FIX = (
    'write each image as {"type": "image", "image": "path/next/to/the/data.png"} or '
    '{"type": "image_url", "image_url": {"url": "file or data: URL"}}, and text as {"type": "text", "text": "..."}'
)
MISSING_FIX = "put the image files next to the data file (paths are read relative to its folder), or fix the paths"
OUTSIDE = (
    "names an image outside this shared server's data folders (a `file://` URL, an absolute or `../` path, "
    "or a link that leads out)",
    "upload the images with the data (a .zip of the data file and its images, their paths relative to it), "
    "or ask the administrator to put them under a data folder (TUNEDECK_DATA_DIRS)",
)


@dataclass(frozen=True)
class ImageRows:
    """The images a data set's rows hold: how many, in how many rows, and each one's size."""

    count: int = 0
    rows: int = 0
    sizes: tuple[tuple[int, int, int], ...] = ()  # (row number, width, height) of each image

    @classmethod
    def of(cls, sizes: Iterable[tuple[int, int, int]]) -> ImageRows:
        """From each image's (row number, width, height)."""
        found = tuple(sizes)
        return cls(len(found), len({number for number, _, _ in found}), found)


def image_size(ref: str) -> tuple[tuple[int, int] | None, tuple[str, str] | None]:
    """((width, height), None) of a resolved image reference (a path or a `data:` URL); (None, (problem, fix))
    when it is missing or not an image PIL can read."""
    from PIL import Image

    if ref.startswith("data:"):
        try:
            source: Any = io.BytesIO(base64.b64decode(ref.split(",", 1)[1], validate=True))
        except (IndexError, binascii.Error, ValueError):
            return None, ("has a `data:` image URL that is not base64", "write it as data:image/png;base64,<bytes>")
    else:
        if not Path(ref).is_file():
            return None, ("names an image file that does not exist", MISSING_FIX)
        source = ref
    try:
        with Image.open(source) as image:
            size = image.size
            image.verify()  # reads the whole file: a truncated or corrupt image fails here, not mid-training
    except Image.DecompressionBombError:
        return None, (
            "has an image of over 178 million pixels (PIL refuses to open it)",
            "shrink the image to a few megapixels before training",
        )
    except (OSError, ValueError, SyntaxError):  # PIL: UnidentifiedImageError (an OSError), broken chunks
        return None, ("has an image file that is not a readable image", "replace it with a PNG, JPEG or WebP image")
    return (int(size[0]), int(size[1])), None


def resolve_image(value: Any, base: Path | None) -> tuple[str | None, tuple[str, str] | None]:
    """An image reference as a path (relative ones read from `base`) or a `data:` URL (images held in the data
    itself become one: `jobs.data.embedded_images`); (None, problem) otherwise."""
    if isinstance(value, dict) and value.get("bytes") is None and isinstance(value.get("path"), str):
        value = value["path"]  # an Arrow image struct naming a file
    embedded = embedded_url(value)
    if embedded is not None:
        return embedded, None
    if not isinstance(value, str) or not value.strip():
        return None, ("has an image that is not a path or URL", PARTS_FIX)
    value = value.strip()
    if value.startswith("data:"):
        return value, None
    if value.startswith("file://"):
        value = unquote(urlparse(value).path)
    elif "://" in value:
        return None, (
            "has a web image URL, which is never fetched",
            "download the image next to the data file and name its path",
        )
    path = Path(value).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    if not readable(path):  # asked before anything is opened: the same answer for a missing and an existing file
        return None, OUTSIDE
    return str(path.resolve()), None


def _part_image(part: dict[str, Any]) -> Any:
    if part.get("type") == "image_url":
        url = part.get("image_url")
        return url.get("url") if isinstance(url, dict) else url
    return part.get("image", part.get("url", part.get("path")))


def flatten_content(content: Any) -> tuple[str | None, list[Any], ProblemList]:
    """A content-parts list as (text with `<image>` where each image goes, the images' raw references)."""
    if isinstance(content, str):
        return content, [], []
    if not isinstance(content, list) or not all(isinstance(p, dict) for p in content):
        return None, [], [("has a turn whose `content` is neither text nor a list of parts", PARTS_FIX)]
    text, images = "", []
    for part in content:
        kind = part.get("type")
        if kind in IMAGE_PART_TYPES:
            text += IMAGE_TOKEN
            images.append(_part_image(part))
        elif kind == "text" and isinstance(part.get("text"), str):
            text += part["text"]
        else:
            return None, [], [(f"has a content part of type `{kind}`, which is neither text nor an image", PARTS_FIX)]
    return text, images, []


def flatten_turns(
    turns: list[dict[str, Any]], column: str
) -> tuple[list[dict[str, Any]] | None, list[Any], ProblemList]:
    """Turns as text with `<image>` where each image goes, and each image's reference in order: a part's own
    file, or None for a place the row's `images` list fills (an `<image>` in the text, a part without a file)."""
    out, refs = [], []
    for turn in turns:
        content = turn.get("content")
        text, own, problems = flatten_content(content)
        if text is None:
            return None, [], [(f"`{column}` {p}", fix) for p, fix in problems]
        if isinstance(content, str):
            own = [None] * text.count(IMAGE_TOKEN)
        refs += own
        out.append({**turn, "content": text})
    return out, refs, []


def fill_places(refs: list[Any], listed: list[Any]) -> list[Any]:
    """`flatten_turns`' references with each place (None) filled from `listed` in order (as many as places)."""
    queue = iter(listed)
    return [ref if ref is not None else next(queue) for ref in refs]


def checked_images(refs: list[Any], base: Path | None) -> tuple[dict[str, Any] | None, ProblemList]:
    """{"images": resolved references, "image_sizes": [[w, h], ...]}, or None and the problems."""
    resolved, sizes, problems = [], [], []
    for value in refs:
        ref, problem = resolve_image(value, base)
        if problem is None and ref is not None:
            size, problem = image_size(ref)
            if size is not None:
                resolved.append(ref)
                sizes.append(list(size))
        if problem is not None and problem not in problems:
            problems.append(problem)
    if problems:
        return None, problems
    return {"images": resolved, "image_sizes": sizes}, []


def parts_row(row: dict[str, Any], base: Path | None) -> tuple[dict[str, Any] | None, ProblemList]:
    """A `messages` row with content parts as text turns with `<image>` placeholders plus its checked images."""
    turns = row.get("messages")
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        return None, [("`messages` is not a list of {role, content}", PARTS_FIX)]
    messages, refs = [], []
    for turn in turns:
        text, images, problems = flatten_content(turn.get("content"))
        if text is None:
            return None, [(f"`messages` {p}", fix) for p, fix in problems]
        messages.append({"role": turn.get("role"), "content": text})
        refs += images
    checked, problems = checked_images(refs, base)
    if checked is None:
        return None, [(f"`messages` {p}", fix) for p, fix in problems]
    return {"messages": messages, **checked}, []


def placeholder_row(row: dict[str, Any], column: str, base: Path | None) -> tuple[dict[str, Any] | None, ProblemList]:
    """A LLaMA-Factory multimodal row: turns with `<image>` placeholders, one per entry of `images`."""
    images = row.get("images")
    images = [images] if isinstance(images, (str, dict)) else images  # one file, or one stored picture
    if images is not None and not isinstance(images, list):
        return None, [("`images` is not a list of image paths", 'write `images` as ["pics/1.png", ...]')]
    messages, problems = chat_turns(row.get(column), column)
    if messages is None:
        return None, problems
    messages, problems = with_system(messages, row)
    if messages is None:
        return None, problems
    messages, refs, problems = flatten_turns(messages, column)  # trl's file-less image parts are places too
    if messages is None:
        return None, problems
    marks = sum(1 for ref in refs if ref is None)
    if marks != len(images or []):
        return None, [
            (
                f"has {marks} `{IMAGE_TOKEN}` placeholder(s) in its turns but {len(images or [])} image(s) in `images`",
                f"write one `{IMAGE_TOKEN}` in the text for each entry of `images`, where the image goes",
            )
        ]
    checked, problems = checked_images(fill_places(refs, list(images or [])), base)
    if checked is None:
        return None, [(f"`images` {p}", fix) for p, fix in problems]
    return {"messages": messages, **checked}, []


def _has_parts(rows: list[dict[str, Any]]) -> bool:
    return any(shows_image(row.get("messages")) for row in rows)


def image_conversion(columns: Iterable[str], rows: list[dict[str, Any]], base: Path | None) -> Conversion | None:
    """The conversion of rows that hold images (judged by the columns and the first rows); None otherwise."""
    cols = set(columns)
    chat = next((c for c in CHAT_COLUMNS if c in cols), None)
    if chat is not None and "images" in cols:
        return Conversion(
            "images",
            f"`{chat}` with `{IMAGE_TOKEN}` placeholders and an `images` list read as image chat",
            lambda row: placeholder_row(row, chat, base),
            ("messages", "images"),
            (chat, "images", "system"),
        )
    if chat == "messages" and _has_parts(rows):
        return Conversion(
            "images",
            "`messages` with image content parts read as image chat",
            lambda row: parts_row(row, base),
            ("messages", "images"),
            ("messages",),
        )
    return None


IMAGE_COLUMNS = ("images", "image")


def unread_images_problem(columns: Iterable[str], trainer: str, field_name: str) -> Problem | None:
    """An `images` (or `image`) column in rows that are not read as image chat: its pictures would be dropped
    and each `<image>` left in the text, so the run would fail after queueing or train without the pictures."""
    cols = set(columns)
    column = next((c for c in IMAGE_COLUMNS if c in cols), None)
    if column is None:
        return None
    chat = next((c for c in CHAT_COLUMNS if c in cols), None)
    record = record_for(trainer)
    if record.image_pairs:
        fix = (
            f"write dpo's image pairs as `prompt` (with one `{IMAGE_TOKEN}` where each image goes), `chosen`, "
            f"`rejected` and `images` (docs/methods-and-data.md, Images)"
        )
    elif not record.image_chat:
        fix = (
            f"{trainer} does not train on images yet (sft and dpo do): remove the `{column}` column "
            f"(and any `{IMAGE_TOKEN}`) for a text-only {trainer} run, or train sft or dpo on image rows"
        )
    elif chat is not None:
        fix = (
            f"map it with dataset_columns `images={column}` (a picture or a list of them per row), with one "
            f"`{IMAGE_TOKEN}` in `{chat}` for each picture"
        )
    else:
        fix = (
            f"write the rows as chat turns: `messages` with one `{IMAGE_TOKEN}` per image and an `images` list, "
            f"or image content parts (docs/methods-and-data.md, Images); or remove `{column}` for a text-only run"
        )
    problem = f"the rows have an `{column}` column that is not read as image chat: its images would be dropped"
    return Problem(field_name, problem, fix)


def trl_row(row: dict[str, Any]) -> dict[str, Any]:
    """A converted image row as trl's vision collator reads it: each turn's content as parts, an image part
    where each `<image>` was, and the images (a path, or a data URL's bytes) for the `images` column."""
    messages = []
    for message in row["messages"]:
        pieces = (message.get("content") or "").split(IMAGE_TOKEN)
        parts: list[dict[str, Any]] = []
        for i, piece in enumerate(pieces):
            if i:
                parts.append({"type": "image", "text": None})
            if piece:
                parts.append({"type": "text", "text": piece})
        messages.append({"role": message["role"], "content": parts})
    images = [
        {"bytes": base64.b64decode(ref.split(",", 1)[1]), "path": None} if ref.startswith("data:") else ref
        for ref in row.get("images") or []
    ]
    return {"messages": messages, "images": images}


def text_as_image_rows(ds: Any, features: Any) -> Any:
    """Text chat rows (or dpo pairs) in the shape of image rows with `features`, to be mixed with them: each turn's
    text as one text part, and no images (trl's collators take batches without any)."""
    turns = [c for c in ds.column_names if c in features and c != "images"]

    def convert(row: dict[str, Any]) -> dict[str, Any]:
        out = {c: row[c] for c in ds.column_names if c in features}
        for c in turns:
            if isinstance(row[c], list):
                out[c] = [{"role": t["role"], "content": [{"type": "text", "text": t["content"]}]} for t in row[c]]
        return {**out, "images": []}

    return ds.map(convert, remove_columns=ds.column_names, features=features, desc="Text rows beside image rows")


def image_features() -> Any:
    """The `datasets` features of `trl_row`'s rows."""
    import datasets

    part = {"type": datasets.Value("string"), "text": datasets.Value("string")}
    message = {"role": datasets.Value("string"), "content": datasets.List(part)}
    return datasets.Features({"messages": datasets.List(message), "images": datasets.List(datasets.Image())})
