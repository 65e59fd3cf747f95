"""Images attached to chat turns: kept as files in the run's folder, read back as the model's content parts.

    path = keep_image(store.run_dir(run_id), "/tmp/gradio/upload.png")   # the run's chat/ folder, a PNG
    turn = user_turn("What colour is it?", path)  # {"role": "user", "content": [image part, text part]}
    has_images(turns)                              # True: the turns need a vision-language run
    images_of(turns)                               # [PIL.Image]: the turns' images, in order

An image is decoded and written again as a PNG named by its content hash (the same picture twice is one
file), so what the model reads is a checked, readable image, never a file the user can still change.
Vision-language runs get the image as a content part (`{"type": "image", "image": path}`) that the run's
chat template turns into its image token; the processor makes the pixels of the same images.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from jobs.errors import Problem

MAX_IMAGE_BYTES = 20 * 1024 * 1024  # an attached image file larger than this is refused
MAX_IMAGE_PIXELS = 40_000_000  # an image whose header says more pixels than this is refused, never decoded
CHAT_IMAGES = "chat"  # the folder of a run's chat images, inside the run's folder


def image_problem(source: str | Path | IO[bytes]) -> Problem | None:
    """Why the image at `source` (a file, or bytes sent with a request) cannot go with a turn (missing, too
    large, not an image), or None."""
    from PIL import Image, UnidentifiedImageError

    fix = "attach a PNG, JPEG or WebP picture"
    if isinstance(source, (str, Path)):
        path = Path(source)
        name, size = path.name, path.stat().st_size if path.is_file() else None
        if size is None:
            return Problem("image", f"{name} is not a file here (the upload went away?)", "attach it again")
    else:
        name, size = "the image", source.seek(0, 2)
        source.seek(0)
    if size > MAX_IMAGE_BYTES:
        return Problem("image", f"{name} is over {MAX_IMAGE_BYTES // 2**20} MiB", f"{fix} of a smaller size")
    try:
        with Image.open(source) as image:  # reads the header only: the size is known before any pixel is decoded
            width, height = image.size
            if width * height > MAX_IMAGE_PIXELS:
                return too_many_pixels(name, f"{width}x{height}")
            image.verify()
    except Image.DecompressionBombError as exc:  # PIL's own guard, past twice its MAX_IMAGE_PIXELS
        return too_many_pixels(name, bomb_size(exc))
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        return Problem("image", f"{name} is not a readable image ({type(exc).__name__})", fix)
    finally:
        if not isinstance(source, (str, Path)):
            source.seek(0)
    return None


def bomb_size(exc: Exception) -> str:
    """The size PIL's DecompressionBombError names, e.g. "2,500,000,000 pixels"."""
    found = re.search(r"\((\d+) pixels\)", str(exc))
    return f"{int(found.group(1)):,} pixels" if found else "too large"


def too_many_pixels(name: str, size: str) -> Problem:
    """An image over MAX_IMAGE_PIXELS, refused with its size (`size`: e.g. "50000x50000")."""
    return Problem(
        "image",
        f"{name} is {size}, over the limit of {MAX_IMAGE_PIXELS:,} pixels (a picture that large is refused unread)",
        "attach a smaller picture (e.g. 2048x2048 or less)",
    )


def keep_image(folder: Path, source: str | Path | IO[bytes]) -> str:
    """Copy the image at `source` (a file, or bytes) into `folder`/chat as a PNG named by its content; its path."""
    from jobs.data.embedded_images import stored_png

    return stored_png(Path(folder) / CHAT_IMAGES, source)


def user_turn(text: str, image: str | None) -> dict[str, Any]:
    """A user message: plain text, or an image part then a text part when an image is attached."""
    if not image:
        return {"role": "user", "content": text}
    return {"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": text}]}


def _parts(turns: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for t in turns if isinstance(t.get("content"), list) for p in t["content"] if isinstance(p, dict)]


def has_images(turns: Any) -> bool:
    """Whether a conversation (a prompt, or turns) has an image part."""
    return not isinstance(turns, str) and any(p.get("type") == "image" for p in _parts(turns))


def images_of(turns: Sequence[dict[str, Any]]) -> list[Any]:
    """The conversation's images as RGB PIL images, in the order their parts appear."""
    from PIL import Image

    out = []
    for part in _parts(turns):
        if part.get("type") == "image":
            with Image.open(part["image"]) as image:
                out.append(image.convert("RGB"))
    return out


def text_of(content: Any) -> str:
    """A message's text: the string itself, or its text parts joined (image parts left out)."""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
