"""Pictures in the before/after samples of a vision-language run: a held-out image row's prompt keeps its
pictures (saved as PNGs in the run's `samples/` folder) and both models answer it with them.

    keep = keeper(run_dir)                     # a PIL image -> the path of its PNG in run_dir/samples
    flat = flat_turns(messages)                # content parts as text with `<image>` where each picture was
    inputs = picture_inputs(processor, turns, paths)   # the processor's chat template and pixels
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

IMAGE_TOKEN = "<image>"
SAMPLES_DIR = "samples"


def flat_turns(messages: Sequence[Any]) -> list[tuple[str, str]] | None:
    """(role, text) per turn, a content-parts turn as its text with `<image>` where each picture was; None when a
    turn is neither."""
    out = []
    for m in messages:
        if not isinstance(m, dict):
            return None
        content = m.get("content", "")
        if isinstance(content, list):
            pieces = [IMAGE_TOKEN if p.get("type") == "image" else p.get("text") or "" for p in content]
            content = "".join(pieces)
        if not isinstance(content, str):
            return None
        out.append((str(m.get("role", "")), content))
    return out


def keeper(run_dir: Path) -> Callable[[Any], str]:
    """A function saving a picture (PIL) as a PNG named by its content in run_dir/samples; it returns the path."""
    from jobs.data.embedded_images import stored_png

    return lambda picture: stored_png(Path(run_dir) / SAMPLES_DIR, picture)


def picture_inputs(processor: Any, turns: Sequence[tuple[str, str]], paths: Sequence[str]) -> dict[str, Any]:
    """The model inputs of chat turns with pictures: each `<image>` an image part, through the processor."""
    from PIL import Image

    messages = []
    for role, text in turns:
        parts: list[dict[str, Any]] = []
        for i, piece in enumerate(text.split(IMAGE_TOKEN)):
            if i:
                parts.append({"type": "image"})
            if piece:
                parts.append({"type": "text", "text": piece})
        messages.append({"role": role, "content": parts})
    pictures = []
    for path in paths:
        with Image.open(path) as picture:
            pictures.append(picture.convert("RGB"))
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    return dict(processor(images=pictures, text=text, return_tensors="pt"))
