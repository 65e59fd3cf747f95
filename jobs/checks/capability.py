"""Checks of a spec against its model's chat template and its data's row format, before queueing.

`jobs.config.mapping.capability_problems` calls `probe_problems(spec)` only for options whose validity
depends on those files (today: `assistant_only_loss`). It reads a tokenizer and a few data rows,
never model weights, and answers within a second or two for local models and data.

    problems = probe_problems(spec)      # [] when nothing the probe can see is wrong
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobs.errors import Problem
from jobs.spec.enums import Trainer
from jobs.spec.job import JobSpec


def template_problem(chat_template: str | dict[str, str] | None, tokenizer: Any = None) -> Problem | None:
    """Why this chat template cannot mask the assistant turns for assistant_only_loss (None: it can)."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    fix = (
        "add `{% generation %}` ... `{% endgeneration %}` around the assistant content in the model's chat "
        "template (tokenizer_config.json or chat_template.jinja), or set assistant_only_loss: false"
    )
    if not chat_template:
        return Problem("assistant_only_loss", "the model's tokenizer has no chat template", fix)
    if has_generation_markers(chat_template):
        return None
    if tokenizer is not None:
        try:  # trl ships training versions of some well-known templates and swaps them in itself
            if get_training_chat_template(tokenizer):
                return None
        except Exception:  # noqa: BLE001 - trl raises for templates it does not know
            pass
    return Problem(
        "assistant_only_loss",
        "the model's chat template has no `{% generation %}` markers, so trl cannot tell the assistant tokens apart",
        fix,
    )


def _local_tokenizer(spec: JobSpec) -> Any | None:
    """The spec's tokenizer when it is on this machine without fetching anything; None otherwise."""
    from transformers import AutoTokenizer

    from jobs.models.registry import BUILTIN_MODELS

    if spec.model in BUILTIN_MODELS:
        return None  # tunedeck's built-in models ship templates with generation markers
    folder = Path(spec.model).expanduser()
    try:
        if folder.is_dir():
            return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=spec.trust_remote_code)
        return AutoTokenizer.from_pretrained(
            spec.model, local_files_only=True, trust_remote_code=spec.trust_remote_code
        )
    except Exception:  # noqa: BLE001 - not available here: trl's own check still runs at train time
        return None


def data_format_problem(spec: JobSpec) -> Problem | None:
    """assistant_only_loss needs chat `messages` rows."""
    from jobs.data.rows import RowFormat
    from jobs.data.sources import DataError, check_dataset

    try:
        info = check_dataset(spec.dataset, spec.trainer, column_map=spec.column_map)
    except DataError:
        return None  # the data check reports it itself
    conversational = info.format is RowFormat.MESSAGES or (
        info.format is RowFormat.PROMPT_COMPLETION
        and bool(info.preview)
        and isinstance(info.preview[0].get("prompt"), list)
    )
    if not conversational:
        # trl: "You set `assistant_only_loss=True`, but the dataset is not conversational."
        return Problem(
            "assistant_only_loss",
            f"needs chat `messages` rows; {spec.dataset} has {info.format.value} rows",
            "use a messages data set, or completion_only_loss for prompt/completion rows, "
            "or set assistant_only_loss: false",
        )
    return None


def probe_problems(spec: JobSpec) -> list[Problem]:
    """Problems only the model's tokenizer or the data rows can show (assistant_only_loss)."""
    if not spec.assistant_only_loss or spec.trainer is not Trainer.SFT:
        return []
    out = [p for p in (data_format_problem(spec),) if p]
    tokenizer = _local_tokenizer(spec)
    if tokenizer is not None:
        problem = template_problem(tokenizer.chat_template, tokenizer)
        if problem:
            out.append(problem)
    return out
