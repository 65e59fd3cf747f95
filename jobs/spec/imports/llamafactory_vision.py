"""LLaMA-Factory's multimodal keys as spec fields: the pixel budget, and which parts of a vision-language model
train (`vision_train`). Video and audio keys are listed as not carried over (tunedeck reads images only).

    map_vision(reader)   # image_max_pixels/image_min_pixels copied; freeze_* -> vision_train; the rest listed
"""

from __future__ import annotations

from jobs.spec.imports.base import Reader

MEDIA = "tunedeck trains on images, not videos or audio"
PREFIXES = ("image_", "video_", "audio_")
NOT_CARRIED = {
    "crop_to_patches": "the model's own processor decides how an image is cut into crops",
    "use_audio_in_video": MEDIA,
}
LANGUAGE_ALWAYS = "tunedeck always trains the language model of a vision-language run"


def map_vision(r: Reader) -> None:
    """The multimodal keys of a LLaMA-Factory config (LLaMA-Factory's defaults: the vision tower and the projector
    frozen, the language model trained, which is tunedeck's `vision_train: language`)."""
    r.copy("image_max_pixels", "image_max_pixels")
    r.copy("image_min_pixels", "image_min_pixels")
    tower = r.has("freeze_vision_tower") and not r.true("freeze_vision_tower")
    projector = r.has("freeze_multi_modal_projector") and not r.true("freeze_multi_modal_projector")
    if tower:  # tunedeck trains the projector with the tower (no tower-only choice)
        r.put("vision_train", "language+projector+vision", "freeze_vision_tower")
    elif projector:
        r.put("vision_train", "language+projector", "freeze_multi_modal_projector")
    r.take("freeze_vision_tower")
    r.take("freeze_multi_modal_projector")
    for key in ("freeze_language_model", "train_mm_proj_only"):
        if r.true(key):
            r.fail(key, "is true, which tunedeck cannot do", f"remove {key}: {LANGUAGE_ALWAYS}")
    media_dir = r.take("media_dir")
    if media_dir is not None:
        r.note("media_dir", f"`{media_dir}`: image paths are read relative to the data file's folder (move them there)")
    r.drop_all(NOT_CARRIED)
    for key in list(r.data):
        if key.startswith(PREFIXES) and key not in ("image_max_pixels", "image_min_pixels"):
            r.drop(key, MEDIA if not key.startswith("image_") else "an image option tunedeck has no equivalent of")
