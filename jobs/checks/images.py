"""The image step of the data checks: image rows need a vision-language model, and images near its size.

`jobs.data.images` already refused missing, unreadable and miscounted images row by row while the data was
read; what needs the model is here: a text-only model given image rows (fix: a vision-language model), and
images far above the size the model's processor works at (`jobs.models.vision.pixel_limit`), which are decoded
at full size on every step only to be shrunk. Models whose files are not on this machine are not judged.

    problems = image_problems(spec.model, "dataset", info)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobs.errors import Problem

if TYPE_CHECKING:
    from jobs.data.dataset_info import DatasetInfo

FAR_ABOVE = 16  # an image with over this many times the processor's pixels is refused
SHOWN = 5


def image_problems(model: str, field: str, info: DatasetInfo) -> list[Problem]:
    """Problems of `info`'s images for `model` (none when the rows hold no images)."""
    from jobs.data.row_numbers import rows_text
    from jobs.models.vision import pixel_limit, vision_model

    if not info.images.count:
        return []
    takes_images = vision_model(model)
    if takes_images is False:
        return [
            Problem(
                "model",
                f"{model!r} is a text-only model, but `{info.ref}` holds {info.images.count} image(s) in "
                f"{info.images.rows} row(s)",
                "pick a vision-language model (e.g. a LLaVA, Qwen2.5-VL, SmolVLM or Gemma 3 folder), "
                "or use data without images",
            )
        ]
    limit = pixel_limit(model) if takes_images else None
    if not limit:
        return []
    big = [(row, w, h) for row, w, h in info.images.sizes if w * h > FAR_ABOVE * limit]
    if not big:
        return []
    rows = sorted({row for row, _, _ in big})
    _, w, h = max(big, key=lambda s: s[1] * s[2])
    return [
        Problem(
            field,
            f"{rows_text(rows[:SHOWN], len(rows))}: {len(big)} image(s) far above what the model's processor works "
            f"at (largest {w}x{h}, {w * h / 1e6:.1f} MP; the processor shrinks each image to about "
            f"{limit / 1e6:.2f} MP, and more than {FAR_ABOVE}x that is refused)",
            f"shrink the images to at most {FAR_ABOVE * limit / 1e6:.2f} MP before training (they are decoded at "
            "full size on every step only to be shrunk)",
        )
    ]
