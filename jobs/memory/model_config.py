"""Find a model's config.json without its weights, for the memory prediction.

A local folder, a built-in model (converted or not: their published configs are written here),
or a hub id already in the local Hugging Face cache. Nothing is downloaded.

Only the expected failures mean "no prediction": no config.json here, a reference that is not a
hub repo id, a file that is not a JSON object, an architecture transformers does not know. Anything
else is a bug and propagates, so submit fails loudly instead of skipping the memory check.

    config, source = model_config("smollm2-135m-instruct")
    arch, source = arch_with_source("smollm2-135m-instruct")   # jobs.memory.parts.Arch, or (None, "")

The Arch of a Llama-shaped family (llama, mistral, qwen2/3, gemma 1-3, olmo2, granite) is computed from
config.json's fields (`jobs.memory.dense_shape`, no torch). Any other is built from the config on torch's meta
device once per config, transformers and torch install (`jobs.memory.arch_cache`); later processes read it back
without importing either.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from storage.data_folders import readable

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
    """(config.json as a dict, where it came from), or (None, "") when it is not readable here: no such
    file, a reference that is neither a folder nor a hub repo id, or a file that is not a JSON object."""
    from storage.settings import models_dir

    ref = (ref or "").strip()
    if not ref:
        return None, ""
    for folder in (Path(ref).expanduser(), models_dir() / ref):
        cfg = folder / "config.json"
        if readable(cfg) and cfg.is_file():  # a restricted user's check: only the data folders (storage.data_folders)
            return _read_json(cfg), str(cfg)
    if ref in BUILTIN_CONFIGS:
        return dict(BUILTIN_CONFIGS[ref]), f"{ref}'s published config"
    if "/" in ref:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.errors import HFValidationError

        try:
            hit = try_to_load_from_cache(ref, "config.json")
        except HFValidationError:  # "a/b/c", "../x": not a repo id, so nothing cached under it
            return None, ""
        if isinstance(hit, str):
            return _read_json(Path(hit)), f"{ref} (HF cache)"
    return None, ""


def _read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`; None when the file cannot be read or holds no JSON object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


@functools.lru_cache(maxsize=16)
def _arch_from_text(text: str) -> Any:
    """The Arch of a config (canonical JSON): computed from its fields for the common dense families
    (`jobs.memory.dense_shape`, no torch); otherwise kept in this process by its text, and on disk
    (`jobs.memory.arch_cache`) by its text and the libraries and code that build it."""
    from jobs.memory.arch_cache import keep_arch, read_arch
    from jobs.memory.dense_shape import dense_arch
    from jobs.memory.parts import arch_from_config
    from jobs.memory.shape import transformers_config

    arch = dense_arch(json.loads(text)) or read_arch(text)
    if arch is None:
        config = transformers_config(json.loads(text))
        if config is None:  # transformers does not know it: not kept, asked again next time
            return None
        arch = arch_from_config(config)
        keep_arch(text, arch)
    return arch


def arch_with_source(ref: str) -> tuple[Any, str]:
    """(the `jobs.memory.parts.Arch` of a model ref, where its config came from), or (None, "") when its
    config is not readable here or transformers does not know its architecture. Anything else raised
    while building it is a bug and propagates: a prediction is never skipped silently."""
    config, source = model_config(ref)
    if config is None or not isinstance(config.get("model_type"), str):
        return None, ""
    if isinstance(config.get("vision_config"), dict):  # a vision-language model: its language model + vision weights
        from jobs.memory.vision import text_config, vision_arch

        text = text_config(config)
        found = _arch_from_text(json.dumps(text, sort_keys=True)) if text is not None else None
        return (vision_arch(config, found), source) if found is not None else (None, "")
    arch = _arch_from_text(json.dumps(config, sort_keys=True))
    return (arch, source) if arch is not None else (None, "")


def arch_for(ref: str) -> Any:
    """The `Arch` of a model ref (its `.shape` holds the layer shapes the method checks read), or None."""
    return arch_with_source(ref)[0]
