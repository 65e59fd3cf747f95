"""Whether a model takes images, and how large an image its processor works at, from its files alone.

A vision-language model is told by its config: a `vision_config` (LLaVA, Qwen2-VL, Idefics3/SmolVLM,
Gemma 3, Llama 3.2 Vision...). The pixel limit is read from the image processor's settings
(`processor_config.json` or `preprocessor_config.json`): `max_pixels` where the processor has one
(Qwen2-VL), else the size every image is resized to (`longest_edge`, `height` x `width`, a crop or
`shortest_edge`). Nothing is downloaded: files not on this machine mean "unknown" (None).

    is_vision_config(json.loads(Path("m/config.json").read_text()))   # True for a LLaVA folder
    vision_model("data/models/tiny-llava")                            # True / False / None (unknown)
    pixel_limit("data/models/tiny-llava")                             # 1024 (32 x 32), or None
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from storage.data_folders import readable

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
# Text configs inside a vision-language config: the language model's shape for the memory estimate.
TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config")


def is_vision_config(config: dict[str, Any] | Any) -> bool:
    """Whether a model config (a dict or a transformers config) describes a vision-language model."""
    if isinstance(config, dict):
        return isinstance(config.get("vision_config"), dict)
    return getattr(config, "vision_config", None) is not None


def _local_file(model: str, name: str) -> Path | None:
    """`name` from the model's folder (a built-in model's, a local one) or the Hugging Face cache; None if absent."""
    from jobs.models.tokenizer import tokenizer_folder

    ref = (model or "").strip()
    folder = Path(ref).expanduser()
    if not (readable(folder) and folder.is_dir()):  # a restricted user's check: only the data folders
        found = tokenizer_folder(ref)
        if found is None:
            return None
        folder = found
    path = folder / name
    return path if path.is_file() else None


def _read_json(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def vision_model(model: str) -> bool | None:
    """True when the model's local config is a vision-language one, False for a text-only one, None when
    its config is not on this machine."""
    from jobs.models.registry import BUILTIN_MODELS

    if (model or "").strip() in BUILTIN_MODELS:
        return False  # the built-in models are text-only
    config = _read_json(_local_file(model, "config.json"))
    return None if config is None else is_vision_config(config)


def image_processor_settings(model: str) -> dict[str, Any] | None:
    """The image processor's saved settings, when the model's processor files are on this machine."""
    for name in PROCESSOR_FILES:
        data = _read_json(_local_file(model, name))
        if data is None:
            continue
        return data.get("image_processor", data) if isinstance(data.get("image_processor"), dict) else data
    return None


def has_pixel_budget(settings: dict[str, Any]) -> bool:
    """Whether an image processor resizes each image within a pixel budget (Qwen2-VL's patches merged
    merge_size x merge_size) rather than to one size."""
    return "merge_size" in settings and "patch_size" in settings


def with_budget(settings: dict[str, Any], low: int | None, high: int | None) -> dict[str, Any]:
    """Image processor settings with the spec's image_min_pixels/image_max_pixels in place (None: kept)."""
    if (low is None and high is None) or not has_pixel_budget(settings):
        return settings
    size = dict(settings["size"]) if isinstance(settings.get("size"), dict) else {}
    out = {k: v for k, v in settings.items() if k not in ("min_pixels", "max_pixels")}
    low = low if low is not None else settings.get("min_pixels") or size.get("shortest_edge")
    high = high if high is not None else settings.get("max_pixels") or size.get("longest_edge")
    return {**out, "size": {**size, "shortest_edge": low, "longest_edge": high}}


def apply_budget(processor: Any, low: int | None, high: int | None) -> None:
    """Set the spec's pixel budget on a loaded processor's image processor (one with a budget)."""
    image = getattr(processor, "image_processor", None)
    if image is None or (low is None and high is None):
        return
    settings = with_budget(image.to_dict(), low, high)
    if settings.get("size") is not None and has_pixel_budget(settings):
        image.size = settings["size"]
        for name in ("min_pixels", "max_pixels"):
            if getattr(image, name, None) is not None:
                setattr(image, name, settings["size"]["shortest_edge" if name == "min_pixels" else "longest_edge"])


def limit_of(settings: dict[str, Any]) -> int | None:
    """The most pixels one image is worked at by an image processor with these settings; None if unknown."""
    if isinstance(settings.get("max_pixels"), int):
        return int(settings["max_pixels"])
    size = settings.get("size")
    if has_pixel_budget(settings) and isinstance(size, dict) and isinstance(size.get("longest_edge"), int):
        return int(size["longest_edge"])  # Qwen2-VL: longest_edge counts pixels
    for key in ("size", "crop_size"):
        size = settings.get(key)
        if isinstance(size, int):
            return size * size
        if not isinstance(size, dict):
            continue
        if "max_pixels" in size:
            return int(size["max_pixels"])
        if "longest_edge" in size:
            return int(size["longest_edge"]) ** 2
        if "height" in size and "width" in size:
            return int(size["height"]) * int(size["width"])
        if "shortest_edge" in size and key == "size" and not isinstance(settings.get("crop_size"), dict):
            return int(size["shortest_edge"]) ** 2
    return None


def pixel_limit(model: str) -> int | None:
    """The most pixels the model's processor works one image at, when its files are here; None otherwise."""
    settings = image_processor_settings(model)
    return limit_of(settings) if settings is not None else None


def freeze_matching(model: Any, pattern: str) -> int:
    """Stop gradients to the parameters whose names fully match `pattern` (a vision-language model's parts that
    stay frozen: `jobs.config.peft.frozen_vision`); the number of parameters frozen."""
    import re

    compiled, frozen = re.compile(pattern), 0
    for name, param in model.named_parameters():
        if compiled.fullmatch(name):
            param.requires_grad_(False)
            frozen += param.numel()
    return frozen


def processor_settings(model: str) -> dict[str, Any] | None:
    """The processor's saved settings as written (`image_processor` nested in them where the processor
    saved one file), when its files are on this machine."""
    for name in PROCESSOR_FILES:
        data = _read_json(_local_file(model, name))
        if data is not None:
            return data
    return None


def _qwen_tokens(image: dict[str, Any], width: int, height: int) -> int:
    """Qwen2-VL's count: the image resized to multiples of patch x merge within [min_pixels, max_pixels],
    cut into patches, merge x merge patches per token."""
    import math

    patch, merge = int(image["patch_size"]), int(image["merge_size"])
    size: dict[str, Any] = image["size"] if isinstance(image.get("size"), dict) else {}
    low = int(image.get("min_pixels") or size.get("shortest_edge") or 56 * 56)
    high = int(image.get("max_pixels") or size.get("longest_edge") or 28 * 28 * 1280)
    f = patch * merge
    h, w = max(f, round(height / f) * f), max(f, round(width / f) * f)
    if h * w > high:
        beta = math.sqrt(height * width / high)
        h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
    elif h * w < low:
        beta = math.sqrt(low / (height * width))
        h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    return (h // patch) * (w // patch) // (merge * merge)


def image_tokens(settings: dict[str, Any], width: int, height: int) -> int | None:
    """The tokens one width x height image becomes in the language model's sequence, from the processor's
    saved settings (Qwen2-VL's resized patches; LLaVA's fixed crop in patches; Gemma 3's fixed count); None
    for a processor not modelled here."""
    image = settings.get("image_processor", settings)
    if not isinstance(image, dict):
        return None
    if "merge_size" in image and "patch_size" in image:
        return _qwen_tokens(image, width, height)
    if settings.get("processor_class") == "Gemma3Processor" and isinstance(settings.get("image_seq_length"), int):
        # Gemma 3: its image tokens wrapped in begin/end-of-image and a blank line each side (one token each
        # in Gemma's tokenizer); pan-and-scan crops, when turned on, are not counted
        return int(settings["image_seq_length"]) + 4
    patch = settings.get("patch_size")
    crop = image.get("crop_size") if isinstance(image.get("crop_size"), dict) else image.get("size")
    if isinstance(patch, int) and isinstance(crop, dict) and "height" in crop and "width" in crop:
        n = (int(crop["height"]) // patch) * (int(crop["width"]) // patch)
        full = settings.get("vision_feature_select_strategy") == "full"
        return n + (int(settings.get("num_additional_image_tokens", 0)) if full else 0)
    return None


def local_processing_class(
    model: str, trust_remote_code: bool = False, low: int | None = None, high: int | None = None
) -> Any | None:
    """What training tokenizes the model's rows with: a vision-language model's processor (its pixel budget,
    `image_min_pixels`/`image_max_pixels`, set as training sets it), else the tokenizer (`local_tokenizer`);
    None when the files are not here or will not load."""
    from jobs.models.tokenizer import local_tokenizer, tokenizer_folder

    folder = tokenizer_folder(model)
    if not vision_model(model) or folder is None:
        return local_tokenizer(model, trust_remote_code)
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(
            str(folder), local_files_only=True, trust_remote_code=trust_remote_code
        )
    except Exception:  # noqa: BLE001 - any processor class's own load error: "not here", as local_tokenizer says it
        return None
    apply_budget(processor, low, high)
    return processor
