"""A model reference checked and resolved: a built-in name, a local folder or a hub id.

`check_model` is the cheap form check (no weights, no downloads of built-ins); `resolve_model`
fetches/converts built-ins (`ensure_builtin`) and gives the folder or hub id to load
(`jobs.models.loading`). Which references exist is said in `jobs.models.registry`.

    problems = check_model("org/name")                      # [] when it can be used
    resolved = resolve_model("smollm2-135m-instruct")       # ResolvedModel, or ModelError
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

from jobs.errors import Problem
from jobs.models.embedded import ensure_smollm2
from jobs.models.hub import hub_config, read_config
from jobs.models.registry import (
    BUILTIN_MODELS,
    SMOLLM2,
    TINY_LLAMA,
    ModelError,
    ModelSource,
    ResolvedModel,
    model_error,
)
from jobs.models.tiny import build_tiny_model
from storage import settings
from storage.data_folders import readable

TRUST_FIX = "tick trust_remote_code for this run if you trust the code"
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def ensure_builtin(name: str) -> Path:
    """The local folder of built-in model `name`, built or fetched on first use."""
    if name == TINY_LLAMA:
        return build_tiny_model(settings.models_dir() / TINY_LLAMA)
    if name == SMOLLM2:
        return ensure_smollm2()
    raise model_error(f"{name!r} is not a built-in model", f"use one of: {', '.join(BUILTIN_MODELS)}")


def _config_problems(ref: str, config: dict[str, Any], trust_remote_code: bool) -> list[Problem]:
    """Problems visible in a model's config: custom code, unknown architecture, no safetensors."""
    from jobs.models.library import knows_model_type, transformers_version

    problems: list[Problem] = []
    model_type = config.get("model_type")
    if config.get("auto_map") and not trust_remote_code:
        problems.append(
            Problem("trust_remote_code", f"{ref!r} ships its own Python code (config.json has auto_map)", TRUST_FIX)
        )
    elif model_type and not knows_model_type(model_type) and not trust_remote_code:
        problems.append(
            Problem(
                "trust_remote_code",
                f"{ref!r} has model_type {model_type!r}, unknown to "
                f"transformers {transformers_version()}, so it needs the model's own code",
                TRUST_FIX,
            )
        )
    elif not model_type and not config.get("auto_map"):
        problems.append(
            Problem(
                "model",
                f"{ref!r} has no model_type in its config.json",
                "use a transformers model folder (saved with save_pretrained)",
            )
        )
    files = config.get("_tunedeck_hub_files")
    if files is not None and not any(f.endswith(".safetensors") for f in files):
        problems.append(
            Problem(
                "model",
                f"{ref!r} has no safetensors weights on the hub",
                "pick a model that publishes .safetensors files (tunedeck never loads pickled .bin weights)",
            )
        )
    return problems


def _folder_problems(ref: str, folder: Path, trust_remote_code: bool) -> list[Problem]:
    """Problems of a local model folder, without loading weights."""
    if not (folder / "config.json").is_file():
        return [
            Problem(
                "model",
                f"{ref!r} is not a model folder: no config.json",
                "point model at a folder written by save_pretrained (config.json, *.safetensors, tokenizer files)",
            )
        ]
    try:
        problems = _config_problems(ref, read_config(folder / "config.json"), trust_remote_code)
    except ModelError as exc:
        return exc.problems
    if not any(folder.glob("*.safetensors")):
        problems.append(
            Problem(
                "model",
                f"{ref!r} has no .safetensors weights",
                "save the model with save_pretrained(..., safe_serialization=True); "
                "pickled .bin weights are never loaded",
            )
        )
    return problems


def _unknown_ref(ref: str) -> ModelError:
    """The error for a reference that is neither built-in, folder nor hub id."""
    close = difflib.get_close_matches(ref.lower(), list(BUILTIN_MODELS), n=1)
    hint = f"did you mean `{close[0]}`? " if close else ""
    return model_error(
        f"{ref!r} is neither a built-in model name, an existing folder nor a hub id (org/name)",
        f"{hint}use a built-in model ({', '.join(BUILTIN_MODELS)}), a local model folder, "
        "or a Hugging Face id such as HuggingFaceTB/SmolLM2-135M-Instruct",
    )


def _local_folder(ref: str) -> Path | None:
    """The folder `ref` names, if it exists on disk."""
    path = Path(ref).expanduser()
    if not readable(path):  # a restricted user's check: a folder outside the data folders is not looked at
        return None
    return path.resolve() if path.exists() else None


def _looks_like_path(ref: str) -> bool:
    """True for references that can only mean a path (absolute, ./, ../, ~)."""
    return ref.startswith(("/", "./", "../", "~", ".\\")) or ref in {".", ".."}


def check_model(ref: str, trust_remote_code: bool = False) -> list[Problem]:
    """Cheap checks of a model reference: no weights loaded, built-ins not fetched."""
    ref = (ref or "").strip()
    if not ref:
        return [Problem("model", "is empty", f"use `{SMOLLM2}`, a hub id such as org/name, or a local folder")]
    if ref in BUILTIN_MODELS:
        return []
    folder = _local_folder(ref)
    if folder is not None:
        if not folder.is_dir():
            return [
                Problem(
                    "model",
                    f"{ref!r} is not a model folder: no config.json",
                    "point model at the folder that holds config.json, not at a file",
                )
            ]
        return _folder_problems(ref, folder, trust_remote_code)
    if _looks_like_path(ref):
        return [
            Problem("model", f"folder {ref!r} does not exist", "check the path (it is read on the worker's machine)")
        ]
    if _HUB_ID.match(ref):
        try:
            return _config_problems(ref, hub_config(ref), trust_remote_code)
        except ModelError as exc:
            return exc.problems
    return _unknown_ref(ref).problems


def resolve_model(ref: str, *, trust_remote_code: bool = False) -> ResolvedModel:
    """Turn a model reference into a loadable folder or hub id; fetches built-ins on first use."""
    problems = check_model(ref, trust_remote_code=trust_remote_code)
    if problems:
        raise ModelError(problems)
    ref = ref.strip()
    if ref in BUILTIN_MODELS:
        return ResolvedModel(ref, str(ensure_builtin(ref)), ModelSource.BUILTIN)
    folder = _local_folder(ref)
    if folder is not None:
        return ResolvedModel(ref, str(folder), ModelSource.LOCAL)
    return ResolvedModel(ref, ref, ModelSource.HUB)
