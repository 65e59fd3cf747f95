"""Checks of a spec against its model's chat template, before queueing.

- `template_refusal`: the data check (jobs.data.validation) only sees the rows: two user (or two
  assistant) turns in a row are fine for most chat templates (ChatML, SmolLM2, Qwen) and refused by
  strict ones (Llama 2, Mistral: "Conversation roles must alternate user/assistant/..."), which
  would only fail when training starts. The rows the data check kept aside are rendered with the
  model's template here, and the rows it refuses become a problem naming them.
- tool-calling rows need a template that renders tools: `jobs.checks.tool_template`.
- `assistant_only_problems`: assistant_only_loss needs conversational rows and a template whose
  assistant turns trl can tell apart (`{% generation %}` markers).

Both take the tokenizer the pipeline loaded once from this machine's files
(`jobs.models.tokenizer.local_tokenizer`; None when the files are not here: trl's own checks still
run at train time), and the data facts its data check found. Nothing here reads a file itself.

    problem = template_refusal("mistralai/Mistral-7B-Instruct-v0.3", "dataset", info.repeated_turns, tokenizer)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jobs.data.row_formats import RowFormat
from jobs.errors import Problem
from jobs.spec.job import JobSpec
from jobs.spec.trainer_records import record_for

if TYPE_CHECKING:
    from jobs.data.inspection import DatasetInfo  # imports `datasets` (seconds): for the types only


def template_refusal(
    model: str, field: str, rows: list[tuple[int, list[dict[str, Any]]]], tokenizer: Any
) -> Problem | None:
    """A problem naming the rows the model's chat template refuses; None when it accepts them or is unknown."""
    if not rows or tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return None
    from jinja2 import TemplateError

    refused: list[int] = []
    reason = ""
    for number, conversation in rows:
        try:
            tokenizer.apply_chat_template(conversation, tokenize=False)
        # A refusal is the template's raise_exception (transformers raises jinja2's TemplateError
        # for it; UndefinedError is a subclass). Anything else is a bug and must not become a refusal.
        except TemplateError as exc:
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


def template_problem(chat_template: str | dict[str, str] | None, tokenizer: Any = None) -> Problem | None:
    """Why this chat template cannot mask the assistant turns for assistant_only_loss (None: it can)."""
    from jinja2 import TemplateError
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
        # trl raises ValueError for a template it has no training version of, and its tool-call probes
        # let jinja2's TemplateError through for templates that refuse a tool turn: no swap, so no markers
        except (ValueError, TemplateError):
            pass
    return Problem(
        "assistant_only_loss",
        "the model's chat template has no `{% generation %}` markers, so trl cannot tell the assistant tokens apart",
        fix,
    )


def data_format_problem(spec: JobSpec, info: DatasetInfo) -> Problem | None:
    """assistant_only_loss needs chat `messages` rows."""
    conversational = info.format is RowFormat.MESSAGES or (
        info.format is RowFormat.PROMPT_COMPLETION
        and bool(info.preview)
        and isinstance(info.preview[0].get("prompt"), list)
    )
    if conversational:
        return None
    # trl: "You set `assistant_only_loss=True`, but the dataset is not conversational."
    return Problem(
        "assistant_only_loss",
        f"needs chat `messages` rows; {spec.dataset} has {info.format.value} rows",
        "use a messages data set, or completion_only_loss for prompt/completion rows, "
        "or set assistant_only_loss: false",
    )


def assistant_only_problems(spec: JobSpec, info: DatasetInfo | None, tokenizer: Callable[[], Any]) -> list[Problem]:
    """What the data rows (`info`: the checked training set; None when it did not check out) and the
    model's template (`tokenizer()`, asked only for this option) show against assistant_only_loss."""
    from jobs.models.registry import BUILTIN_MODELS

    if not spec.assistant_only_loss or "assistant_only_loss" not in record_for(spec.trainer).kwargs:
        return []
    out = [p for p in (data_format_problem(spec, info) if info is not None else None,) if p]
    # tunedeck's built-in models ship templates with generation markers: no tokenizer to load for them
    loaded = tokenizer() if spec.model not in BUILTIN_MODELS else None
    if loaded is not None:
        problem = template_problem(loaded.chat_template, loaded)
        if problem:
            out.append(problem)
    return out
