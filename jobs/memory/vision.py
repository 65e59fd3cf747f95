"""A vision-language model in the memory prediction: the vision side's weights and the image tokens.

The language model's arithmetic is the text model's (`jobs.memory.parts.Arch` built from the config's
`text_config`); to it come the vision tower's and projector's weights (frozen: counted in the weights part,
`Arch.vision_params`, from the model built on the meta device) and, in the measured row lengths, the tokens
each image becomes in the language model's sequence (`jobs.models.vision.image_tokens`, from the processor's
settings and each image's real size) in place of its one placeholder token. Not modelled: the vision
tower's own activations (small next to the language model's for one image a row).

    arch = vision_arch(config, text_arch)                         # text Arch + the vision side's weights
    lengths = with_image_tokens(lengths, loaded, "path/to/model")   # each row + its images' tokens
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from typing import Any

import numpy as np

from jobs.config.peft import VISION_MODULES


@functools.lru_cache(maxsize=8)
def _vision_model(text: str) -> tuple[int, bool]:
    """(the vision tower's and projector's parameters, whether `model.base_model` is the backbone) of the
    image-text-to-text model a vision-language config builds on the meta device (what training loads)."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    data = json.loads(text)
    config = AutoConfig.for_model(data.pop("model_type"), **data)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    pattern = re.compile(VISION_MODULES)
    backbone = getattr(model, model.base_model_prefix, None) is not None
    return sum(p.numel() for name, p in model.named_parameters() if pattern.fullmatch(name)), backbone


def vision_params(config: dict[str, Any]) -> int:
    """Parameters of a vision-language config's vision tower and projector (built on the meta device)."""
    return _vision_model(json.dumps(config, sort_keys=True))[0]


def text_config(config: dict[str, Any]) -> dict[str, Any] | None:
    """The language model's config inside a vision-language config.json, with its model_type."""
    from jobs.models.vision import TEXT_CONFIG_KEYS

    text = next((config[k] for k in TEXT_CONFIG_KEYS if isinstance(config.get(k), dict)), None)
    return dict(text) if text is not None and isinstance(text.get("model_type"), str) else None


def vision_arch(config: dict[str, Any], text_arch: Any) -> Any:
    """The text model's Arch with the vision side's weights added (frozen: in `total_params`), and its shape's
    `backbone` the vision-language model's (the model training loads; Mllama's text model alone names none)."""
    extra, backbone = _vision_model(json.dumps(config, sort_keys=True))
    shape = dataclasses.replace(text_arch.shape, backbone=backbone)
    return dataclasses.replace(text_arch, total_params=text_arch.total_params + extra, vision_params=extra, shape=shape)


def budgeted_settings(model: str, low: int | None, high: int | None) -> dict[str, Any] | None:
    """The model's processor settings with the spec's pixel budget in place (`jobs.models.vision.with_budget`)."""
    from jobs.models.vision import processor_settings, with_budget

    settings = processor_settings(model)
    if settings is None:
        return None
    if isinstance(settings.get("image_processor"), dict):
        return {**settings, "image_processor": with_budget(settings["image_processor"], low, high)}
    return with_budget(settings, low, high)


def with_image_tokens(
    lengths: Any, loaded: Any, model: str, budget: tuple[int | None, int | None] = (None, None)
) -> Any:
    """`lengths` (`jobs.data.tokens.lengths.RowLengths` of `loaded.train`) with each row's image tokens in
    place of its `<image>` placeholders; unchanged when the rows hold no images or the processor is not
    modelled (`jobs.models.vision.image_tokens`). `budget`: the spec's (image_min_pixels, image_max_pixels)."""
    from jobs.data.tokens.lengths import RowLengths
    from jobs.models.vision import image_tokens

    info = loaded.train_info
    settings = budgeted_settings(model, *budget)
    if not info.images.count or settings is None or lengths.origins is None:
        return lengths
    by_row: dict[tuple[int, int], int] = {}  # (source index, row number): the row's image tokens less placeholders
    for source, part in enumerate(info.parts or [info]):
        for row, w, h in part.images.sizes:
            n = image_tokens(settings, w, h)
            if n is None:
                return lengths
            by_row[(source, row)] = by_row.get((source, row), 0) + n - 1
    extra = np.array([by_row.get((int(src), int(row)), 0) for src, row in lengths.origins], dtype=lengths.lengths.dtype)
    prompts = lengths.prompts + extra if lengths.prompts is not None else None
    return RowLengths(lengths.lengths + extra[:, None], prompts, lengths.origins)
