"""Small pictures of image rows for the launch form's data preview, and the model's image support in words.

    thumbnail_html("/data/pics/1.png")        # '<img src="data:image/png;base64,..." ...>' (48 px), '' if unreadable
    with_thumbnails(rows)                     # the preview rows' `images` cells as thumbnails
    preview_table(rows)                       # a gr.Dataframe update whose `images` column renders as HTML
    model_images_line("data/models/tiny-llava")   # "\n- model ...: a vision-language model: takes images"

A converted image row holds each image as a resolved path or a `data:` URL (`jobs.data.images`); each is
read here, shrunk to `THUMBNAIL_PX` on its longer side and written back as a PNG data URL, so the browser
gets the small picture inline and never a path on the server. Within a restricted user's preview
(`AccessPolicy.reading`) a path outside the data folders is not opened (`storage.data_folders.readable`):
the rows' check refused it already, this is the second lock.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any, Literal

import pandas as pd

THUMBNAIL_PX = 48
IMAGES_COLUMN = "images"


def thumbnail_html(ref: str) -> str:
    """One image (a path or a `data:` URL) as an inline 48-pixel `<img>`; '' when it cannot be read."""
    from PIL import Image

    from jobs.data.inspection import own_folders
    from storage.data_folders import readable

    # A restricted user's preview: the data folders only (and a sample's or an unpacked zip's own folder).
    if not ref.startswith("data:") and not readable(ref) and not own_folders(Path(ref)):
        return ""
    try:
        source: Any = io.BytesIO(base64.b64decode(ref.split(",", 1)[1])) if ref.startswith("data:") else ref
        with Image.open(source) as image:
            image.thumbnail((THUMBNAIL_PX, THUMBNAIL_PX))
            buffer = io.BytesIO()
            image.convert("RGB").save(buffer, format="PNG")
    except (OSError, ValueError, IndexError, SyntaxError):  # unreadable: the row checks name it
        return ""
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    title = html.escape(ref if not ref.startswith("data:") else "inline image", quote=True)
    return f'<img src="{url}" alt="{title}" title="{title}" style="max-height:{THUMBNAIL_PX}px">'


def with_thumbnails(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The preview rows with each `images` list shown as thumbnails (other rows and columns unchanged)."""
    out = []
    for row in rows:
        images = row.get(IMAGES_COLUMN)
        if isinstance(images, list) and all(isinstance(i, str) for i in images):
            row = {**row, IMAGES_COLUMN: " ".join(thumbnail_html(i) for i in images)}
        out.append(row)
    return out


def preview_table(rows: pd.DataFrame) -> Any:
    """The form's preview table: the `images` column rendered as HTML (the thumbnails), every other as text."""
    import gradio as gr

    types: list[Literal["str", "html"]] = ["html" if c == IMAGES_COLUMN else "str" for c in rows.columns]
    return gr.Dataframe(value=rows, datatype=types or "str")


def model_images_line(model: str | None) -> str:
    """A line saying whether the picked model takes images; '' when its config is not on this machine."""
    from jobs.models.vision import vision_model

    if not model or not model.strip():
        return ""
    takes = vision_model(model.strip())
    if takes is None:
        return ""
    if takes:
        return f"\n- model `{model.strip()}`: a vision-language model, takes images in the data"
    return f"\n- model `{model.strip()}`: text-only, does not take images"
