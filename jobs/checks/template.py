"""Does the model's own chat template accept the conversations? Checked before queueing.

The data check (jobs.data.rows) only sees the rows: two user (or two assistant) turns in a row are
fine for most chat templates (ChatML, SmolLM2, Qwen) and refused by strict ones (Llama 2, Mistral:
"Conversation roles must alternate user/assistant/user/assistant/..."), which would only fail when
training starts. When the model's tokenizer files are on disk (a local folder, the Hugging Face
cache, or a built-in model already converted), the rows the data check kept aside are rendered
with the model's template here, and the rows it refuses become a problem naming them.

    problem = template_refusal("mistralai/Mistral-7B-Instruct-v0.3", "dataset", info.repeated_turns)
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from jobs.errors import Problem

log = logging.getLogger(__name__)


TOKENIZER_FILES = ("tokenizer_config.json", "chat_template.jinja", "chat_template.json")


def tokenizer_files(model: str) -> dict[str, Path | None] | None:
    """The model's tokenizer/chat-template files found on this machine (a built-in model's folder, a
    local folder or the Hugging Face cache; never downloads), None per missing file; None when the
    reference cannot be looked up at all."""
    from jobs.models.registry import BUILTIN_MODELS

    ref = (model or "").strip()
    folder = Path(ref).expanduser()
    if ref in BUILTIN_MODELS:
        from storage.settings import models_dir

        folder = models_dir() / ref
    if ref in BUILTIN_MODELS or folder.is_dir():
        return {name: folder / name if (folder / name).is_file() else None for name in TOKENIZER_FILES}
    try:
        from huggingface_hub import try_to_load_from_cache

        hits = {name: try_to_load_from_cache(ref, name) for name in TOKENIZER_FILES}
    except Exception:  # not a repo id, no cache: unknown
        return None
    return {name: Path(hit) if isinstance(hit, str) else None for name, hit in hits.items()}


def tokenizer_folder(model: str) -> Path | None:
    """The folder holding the model's tokenizer_config.json, when it is on this machine."""
    config = (tokenizer_files(model) or {}).get("tokenizer_config.json")
    return config.parent if config is not None else None


def template_refusal(
    model: str, field: str, rows: list[tuple[int, list[dict[str, Any]]]], trust_remote_code: bool = False
) -> Problem | None:
    """A problem naming the rows the model's chat template refuses; None when it accepts them or is unknown."""
    if not rows:
        return None
    folder = tokenizer_folder(model)
    if folder is None:
        return None
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(
            str(folder), local_files_only=True, trust_remote_code=trust_remote_code
        )
    except Exception as exc:  # the model check reports unreadable tokenizers; here it only means "unknown"
        log.info("chat template check skipped: the tokenizer in %s did not load (%s)", folder, exc)
        return None
    if not getattr(tokenizer, "chat_template", None):
        return None
    refused: list[int] = []
    reason = ""
    for number, conversation in rows:
        try:
            tokenizer.apply_chat_template(conversation, tokenize=False)
        except Exception as exc:  # jinja2's TemplateError from the template's raise_exception, or similar
            refused.append(number)
            reason = reason or str(exc).strip().splitlines()[0][:200]
    if not refused:
        return None
    where = ", ".join(map(str, refused))
    return Problem(
        field,
        f"rows {where} have two turns of one role in a row, which {model}'s chat template refuses ({reason})",
        "merge consecutive turns of the same role into one turn (or drop those rows), or pick a model "
        "whose chat template accepts them",
    )
