"""The data step of the checks: every data set a spec names, read once, with what its rows show.

For each of `dataset` and `eval_dataset`: the rows of each source it lists are checked for the trainer
(`jobs.data.loading.check_sources`, row-numbered problems naming the source), an `eval_split` is checked against the
row count, conversations are rendered with the model's chat template where rows have one role
twice in a row, tool-calling rows need a template that renders tools (`jobs.checks.template`,
`jobs.checks.tool_template`), and chat rows need a model that has a template at all.
What the check read (`DatasetInfo`) comes back for the later steps, so no one reads the data again.

`values_problems` is the same data check for form or API values that did not parse into a spec,
so one answer still shows every problem. `length_warnings_for` is the form's preview: how many rows
`max_length` would cut, with the model's tokenizer when it is on this machine.

    problems, infos = dataset_problems(spec, tokenizer=lambda: None)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from jobs.checks.access import AccessPolicy
from jobs.checks.images import image_problems
from jobs.checks.template import template_refusal
from jobs.checks.tool_template import tools_refusal
from jobs.errors import Problem
from jobs.spec.enums import DEFAULT_TRAINER, Trainer
from jobs.spec.job import JobSpec

if TYPE_CHECKING:
    from jobs.data.inspection import DatasetInfo

DATA_FIELDS = ("dataset", "eval_dataset")


def dataset_problems(spec: JobSpec, tokenizer: Callable[[], Any]) -> tuple[list[Problem], dict[str, DatasetInfo]]:
    """(problems, {field: what its check read}) of the spec's data sets; `tokenizer()`: the model's local
    tokenizer or None, asked only when a row needs rendering."""
    # Imported here: datasets costs seconds to import and the CLI's other commands never need it.
    from jobs.data.loading import check_sources, eval_rows
    from jobs.data.mixing import combined, labelled, source_label
    from jobs.data.sources import DataError
    from jobs.models.tokenizer import has_chat_template

    out: list[Problem] = []
    infos: dict[str, DatasetInfo] = {}
    for field, ref in (("dataset", spec.dataset), ("eval_dataset", spec.eval_dataset)):
        if not ref or not ref.strip():
            continue  # no eval_dataset: the sample's own eval split, or none
        try:
            pairs = check_sources(ref, spec.trainer, spec.column_map, field=field)  # each source, then the mixture
        except DataError as exc:
            out.extend(exc.problems)
            continue
        parts = [(source_label(s, i, len(pairs)), part) for i, (s, part) in enumerate(pairs, 1)]
        infos[field] = info = combined(pairs, ref)
        if field == "dataset" and spec.eval_split is not None:
            held_out = eval_rows(info.n_rows, spec.eval_split)
            if isinstance(held_out, Problem):
                out.append(held_out)
        for label, part in parts:
            if part.repeated_turns:
                refused = template_refusal(spec.model, field, part.repeated_turns, tokenizer())
                if refused is not None:
                    out.extend(labelled([refused], label))
            tools = tools_refusal(spec, field, part, tokenizer)
            if tools is not None:
                out.extend(labelled([tools], label))
            out.extend(labelled(image_problems(spec, field, part), label))
        if is_chat(info) and has_chat_template(spec.model) is False:
            out.append(
                Problem(
                    "model",
                    f"{spec.model!r} has a tokenizer without a chat template, but `{ref}` holds "
                    "chat conversations (messages), which are rendered with the chat template",
                    "pick an instruct/chat model (e.g. smollm2-135m-instruct), add a chat_template to the "
                    "model's tokenizer_config.json, or use a text or prompt/completion data set",
                )
            )
    return out, infos


def is_chat(info: DatasetInfo) -> bool:
    """Whether a checked data set is conversational (rows rendered through the chat template)."""
    if info.format.value == "messages":
        return True
    return any(isinstance(row.get("prompt"), list) for row in info.preview or [])


def values_problems(values: Mapping[str, Any], bad: set[str], policy: AccessPolicy) -> list[Problem]:
    """The data check of values that did not parse: each data set whose own field (and the trainer) parsed,
    unless `policy` keeps users from reading it; `bad`: the fields with problems already."""
    from jobs.data.loading import check_sources
    from jobs.data.sources import DataError

    trainer = values.get("trainer", DEFAULT_TRAINER.value) if "trainer" not in bad else None
    out: list[Problem] = []
    for field in DATA_FIELDS:
        ref = values.get(field)
        if not isinstance(ref, str) or not ref.strip() or field in bad or not trainer:
            continue
        refused = policy.data_problem(ref.strip(), field)
        if refused is not None:
            out.append(refused)
            continue
        try:
            check_sources(ref.strip(), Trainer(trainer), field=field)
        except DataError as exc:
            out.extend(exc.problems)
    return out


def length_warnings_for(
    ref: str, trainer: Trainer, model: str, max_length: int, columns: str | None = None
) -> list[str]:
    """'N of M rows are longer than max_length ...' for the form's preview; [] when none are or it cannot
    tell. Uses the model's tokenizer only when it is already on this machine, so nothing is downloaded."""
    from jobs.data.loading import load_datasets
    from jobs.data.sources import DataError
    from jobs.data.tokens.measurement import length_warnings
    from jobs.models.tokenizer import local_tokenizer

    tokenizer = local_tokenizer(model)
    if tokenizer is None:
        return []
    spec = JobSpec(
        model=model, dataset=ref.strip(), trainer=trainer, max_length=max_length, dataset_columns=columns or None
    )
    try:
        train, _ = load_datasets(spec)
    except (DataError, ValueError, OSError):
        return []  # the preview above it shows the data's problems
    return length_warnings(train, tokenizer, max_length, trainer=trainer)
