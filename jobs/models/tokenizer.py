"""A model's tokenizer when its files are on this machine, for the checks and the form's preview.

A built-in model's folder (once converted), a local folder, or the Hugging Face cache; nothing is
ever downloaded. The checks use it to render conversations with the model's own chat template
(`jobs.checks.template`) and the preview to count tokens (`jobs.checks.datasets`).

    folder = tokenizer_folder("mistralai/Mistral-7B-Instruct-v0.3")   # None when it is not cached
    tokenizer = local_tokenizer(str(folder))                          # None when it will not load
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from storage.data_folders import readable

log = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer_config.json", "chat_template.jinja", "chat_template.json")


def tokenizer_files(model: str) -> dict[str, Path | None] | None:
    """The model's tokenizer/chat-template files found on this machine (a built-in model's folder, a
    local folder or the Hugging Face cache; never downloads), None per missing file; None when the
    reference cannot be looked up at all (neither a folder nor a hub repo id)."""
    from jobs.models.registry import BUILTIN_MODELS

    ref = (model or "").strip()
    folder = Path(ref).expanduser()
    if ref in BUILTIN_MODELS:
        from storage.settings import models_dir

        folder = models_dir() / ref
    if ref in BUILTIN_MODELS or (readable(folder) and folder.is_dir()):  # readable: storage.data_folders
        return {name: folder / name if (folder / name).is_file() else None for name in TOKENIZER_FILES}
    from huggingface_hub import try_to_load_from_cache  # only for a hub id (~0.5 s of imports a folder skips)
    from huggingface_hub.errors import HFValidationError

    try:
        hits = {name: try_to_load_from_cache(ref, name) for name in TOKENIZER_FILES}
    except HFValidationError:  # not a repo id: unknown
        return None
    return {name: Path(hit) if isinstance(hit, str) else None for name, hit in hits.items()}


def tokenizer_folder(model: str) -> Path | None:
    """The folder holding the model's tokenizer_config.json, when it is on this machine."""
    config = (tokenizer_files(model) or {}).get("tokenizer_config.json")
    return config.parent if config is not None else None


def local_tokenizer(model: str, trust_remote_code: bool = False) -> Any | None:
    """The model's tokenizer loaded from this machine's files; None when they are not here or will not load
    (the model check reports unreadable tokenizers; for the template checks it only means "unknown")."""
    folder = tokenizer_folder(model)
    if folder is None:
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - any tokenizer class's own load error; the check is skipped, and says so
        log.info("tokenizer checks skipped: the tokenizer in %s did not load (%s)", folder, exc, exc_info=True)
        return None


class LocalTokenizer:
    """`local_tokenizer(model)` loaded on the first call and kept: one check's steps share one load."""

    def __init__(self, model: str, trust_remote_code: bool = False) -> None:
        self.model, self.trust_remote_code = model, trust_remote_code
        self._loaded = False
        self._tokenizer: Any | None = None

    def __call__(self) -> Any | None:
        if not self._loaded:
            self._tokenizer = local_tokenizer(self.model, self.trust_remote_code)
            self._loaded = True
        return self._tokenizer


def has_chat_template(model: str) -> bool | None:
    """True/False when the model's tokenizer files are on disk (folder or HF cache); None when unknown."""
    from jobs.models.registry import BUILTIN_MODELS

    if (model or "").strip() in BUILTIN_MODELS:
        return True
    files = tokenizer_files(model)
    if files is None:
        return None
    if files.get("chat_template.jinja") or files.get("chat_template.json"):
        return True
    config = files.get("tokenizer_config.json")
    if config is None:
        return None
    try:
        return bool(json.loads(config.read_text(encoding="utf-8")).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return None
