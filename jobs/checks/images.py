"""The image step of the data checks: image rows need a vision-language model, and images near its size.

`jobs.data.images` already refused missing, unreadable and miscounted images row by row while the data was
read; what needs the model is here: a text-only model given image rows (fix: a vision-language model), and
images far above the size the model's processor works at (`jobs.models.vision.pixel_limit`), which are decoded
at full size on every step only to be shrunk (the spec's image_max_pixels is that size where the processor
has a pixel budget; setting it for a processor that resizes every image to one size is refused). Models whose
files are not on this machine are not judged.

    problems = image_problems(spec, "dataset", info)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobs.errors import Problem
from jobs.spec.job import JobSpec

if TYPE_CHECKING:
    from jobs.data.dataset_info import DatasetInfo

FAR_ABOVE = 16  # an image with over this many times the processor's pixels is refused
SHOWN = 5


def budget_problem(spec: JobSpec, settings: dict[str, Any] | None) -> Problem | None:
    """image_min_pixels/image_max_pixels set for a model whose processor resizes every image to one size."""
    from jobs.models.vision import has_pixel_budget

    chosen = [n for n in ("image_max_pixels", "image_min_pixels") if getattr(spec, n) is not None]
    if not chosen or settings is None or has_pixel_budget(settings):
        return None
    return Problem(
        chosen[0],
        f"is set, but the image processor of {spec.model!r} resizes every image to one size (it has no pixel budget)",
        f"leave {' and '.join(chosen)} empty for this model, or pick one with a pixel budget (Qwen2-VL, Qwen2.5-VL)",
    )


def image_problems(spec: JobSpec, field: str, info: DatasetInfo) -> list[Problem]:
    """Problems of `info`'s images for the spec's model (none when the rows hold no images)."""
    from jobs.data.row_numbers import rows_text
    from jobs.models.vision import image_processor_settings, limit_of, vision_model, with_budget

    if not info.images.count:
        return []
    model = spec.model
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
    settings = image_processor_settings(model) if takes_images else None
    budget = budget_problem(spec, settings)
    if budget is not None:
        return [budget]
    limit = limit_of(with_budget(settings, spec.image_min_pixels, spec.image_max_pixels)) if settings else None
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
