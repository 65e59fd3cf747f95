"""Image content parts in chat turns (`{"type": "image", ...}`, OpenAI's `image_url`): told apart here, with
nothing imported, for the row checks and the image conversions alike."""

from __future__ import annotations

from typing import Any

IMAGE_PART_TYPES = ("image", "image_url")


def shows_image(turns: Any) -> bool:
    """Whether chat turns hold an image content part (a file or a place for one)."""
    return isinstance(turns, list) and any(
        isinstance(p, dict) and p.get("type") in IMAGE_PART_TYPES
        for t in turns
        if isinstance(t, dict) and isinstance(t.get("content"), list)
        for p in t["content"]
    )
