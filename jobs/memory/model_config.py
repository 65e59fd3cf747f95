"""Find a model's config.json without its weights, for the memory prediction.

A local folder, a built-in model (converted or not: their published configs are written here),
or a hub id already in the local Hugging Face cache. Nothing is downloaded.

    config, source = model_config("smollm2-135m-instruct")
    arch = arch_for("smollm2-135m-instruct")          # jobs.memory.parts.Arch, or None
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

# The built-in models' architectures (SmolLM2-135M's published config.json; jobs.models.tiny's model),
# so a prediction needs neither the GGUF download nor the conversion.
BUILTIN_CONFIGS: dict[str, dict[str, Any]] = {
    "smollm2-135m-instruct": dict(
        model_type="llama",
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
    ),
    "tiny-llama": dict(
        model_type="llama",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        tie_word_embeddings=True,
        max_position_embeddings=1024,
    ),
}


def model_config(ref: str) -> tuple[dict[str, Any] | None, str]:
    """(config.json as a dict, where it came from), or (None, "") when it is not readable here."""
    from storage.settings import models_dir

    ref = (ref or "").strip()
    if not ref:
        return None, ""
    for folder in (Path(ref).expanduser(), models_dir() / ref):
        cfg = folder / "config.json"
        if cfg.is_file():
            try:
                return json.loads(cfg.read_text()), str(cfg)
            except (OSError, ValueError):
                return None, ""
    if ref in BUILTIN_CONFIGS:
        return dict(BUILTIN_CONFIGS[ref]), f"{ref}'s published config"
    if "/" in ref:
        try:
            from huggingface_hub import try_to_load_from_cache

            hit = try_to_load_from_cache(ref, "config.json")
            if isinstance(hit, str):
                return json.loads(Path(hit).read_text()), f"{ref} (HF cache)"
        except Exception:  # invalid repo id, unreadable cache: no prediction rather than an error
            pass
    return None, ""


@functools.lru_cache(maxsize=16)
def _arch_from_text(text: str) -> Any:
    from jobs.memory.parts import arch_from_config

    return arch_from_config(json.loads(text))


def _built_from_config(ref: str, build: Any) -> Any:
    """`build(config JSON)` for a model ref, or None when its config is missing or transformers cannot
    build it (an unknown or custom architecture simply has no prediction)."""
    config, _ = model_config(ref)
    if config is None or "model_type" not in config:
        return None
    try:
        return build(json.dumps(config, sort_keys=True))
    except Exception:  # noqa: BLE001 - see the docstring
        return None


def arch_for(ref: str) -> Any:
    """The `Arch` of a model ref, or None."""
    return _built_from_config(ref, _arch_from_text)


def model_shape_for(ref: str) -> Any:
    """The `jobs.memory.params.ModelShape` of a model ref (layer shapes on the meta device), or None."""
    return _built_from_config(ref, _shape_from_text)


@functools.lru_cache(maxsize=16)
def _shape_from_text(text: str) -> Any:
    from jobs.memory.params import model_shape

    return model_shape(json.loads(text))
