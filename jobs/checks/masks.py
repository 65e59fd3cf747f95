"""The masks step of the checks: what the first training rows teach, read from the tokens trl builds.

The first `CHECKED_ROWS` training rows (file order) go through the token view (`jobs.data.tokens.view`:
trl's own dataset preparation and collator, tokenizer only), and two pitfalls are named with their rows:

- answers that do not end with a token generation stops at (the tokenizer's EOS and the model's
  generation_config.json `eos_token_id`s; trl adds the tokenizer's EOS to the trained model's generation
  config): the model never learns to stop, and the exported model rambles on. A warning, with the token
  the answers end with and the fix. Answers cut by max_length are left to the answers step.
- rows whose reasoning (`<think>` blocks, reasoning fields) the chat template leaves out while `thinking` is
  unset: a warning (the user most likely meant it trained).
- the template pitfalls of `jobs.checks.template_fit` (another family's template, a system prompt or earlier
  turns the template drops): warnings.
- rows with no token in the loss: trl refuses the run when assistant_only_loss finds a row without
  assistant tokens (refused here, before queueing); otherwise refused when every checked row is so,
  a warning when some are.

The cost is bounded by `CHECKED_ROWS` (a few trl `Dataset.map` passes over them), not by the data's size,
and paid once per data, tokenizer and mask fields: the findings are cached like the token lengths.

    problems, warnings = mask_findings(spec, tokenizer)     # tokenizer: the pipeline's LocalTokenizer
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobs.data.row_numbers import origins_text
from jobs.errors import Problem
from jobs.spec.enums import Trainer
from jobs.spec.job import JobSpec
from jobs.spec.trainer_records import record_for

CHECKED_ROWS = 200
# The views with tokens in the loss: grpo's shows the prompt only (its loss is on the sampled completions), the
# reward trainer's trains no token; orpo's and cpo's always train each answer and end it with the EOS trl appends
# (`tokenize_row`), so their rows have nothing for these findings.
LOSS_VIEWS = frozenset(("sft", "dpo", "kto"))
CACHE_VERSION = "3"  # bump when what the findings say changes
# Problems with these fields leave nothing sound to build tokens from: the step waits for their fix.
BLOCKING_FIELDS = frozenset(("model", "dataset", "assistant_only_loss", "completion_only_loss", "packing", "trainer"))


def mask_findings(spec: JobSpec, tokenizer: Callable[[], Any]) -> tuple[list[Problem], list[str]]:
    """([problems], [warnings]) about the loss masks of the first training rows; nothing when the trainer is
    not one whose token view shows trained tokens, or the tokenizer or the data is not here (the other steps say why).
    Kept in the cache beside the token lengths, under the same key plus the fields that shape the masks: a
    second check of the same data, tokenizer and masks reads a small file."""
    if record_for(Trainer(spec.trainer)).token_view not in LOSS_VIEWS:
        return [], []
    path = _cache_path(spec)
    if path is not None and path.is_file():
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            return [Problem(*p) for p in saved["problems"]], list(saved["warnings"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # unreadable: found again below
    found = _findings(spec, tokenizer)
    if path is not None and found is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".tmp")
        saved_problems = [[p.field, p.problem, p.fix] for p in found[0]]
        partial.write_text(json.dumps({"problems": saved_problems, "warnings": found[1]}), encoding="utf-8")
        partial.replace(path)
    return found if found is not None else ([], [])


def _cache_path(spec: JobSpec) -> Path | None:
    """Where this spec's findings are kept: the lengths' key (data contents, row fields, tokenizer files)
    with the mask fields and the model's generation config; None when the data or tokenizer is not here."""
    from jobs.data.tokens.measurement import cache_key
    from jobs.data.tokens.view import data_kwargs
    from jobs.models.tokenizer import tokenizer_folder
    from storage.settings import cache_dir

    folder = tokenizer_folder(spec.model)
    key = cache_key(spec, folder) if folder is not None else None
    if key is None or folder is None:
        return None
    config = folder / "generation_config.json"
    more = f"{CACHE_VERSION};{CHECKED_ROWS};{sorted(data_kwargs(spec).items())!r};"
    more += config.read_text(encoding="utf-8", errors="replace") if config.is_file() else ""
    return cache_dir() / "masks" / f"{key}-{hashlib.sha256(more.encode()).hexdigest()[:16]}.json"


def _findings(spec: JobSpec, tokenizer: Callable[[], Any]) -> tuple[list[Problem], list[str]] | None:
    from jobs.checks.template_fit import dropped_turns, foreign_markers
    from jobs.data.loading import load_data
    from jobs.data.sources import DataError
    from jobs.data.tokens.view import ViewUnavailable
    from jobs.data.tokens.viewed_rows import training_views

    tok = tokenizer()
    if tok is None:
        return None
    try:
        loaded = load_data(spec)
        if loaded.train_info.images.count:  # image rows: shown by the token view, not checked here yet
            return None
        viewed = training_views(spec, loaded, tok, first=CHECKED_ROWS)
    except (DataError, ViewUnavailable):
        return None
    refs = [s.ref for s in spec.dataset_sources] or [spec.dataset]
    checked = len(viewed.views)
    problems, warnings = _untrained(spec, viewed.views, viewed.origins, refs, checked)
    warnings += _no_stop(spec, viewed.views, viewed.origins, refs, tok, checked)
    warnings += _thinking_dropped(spec, viewed, refs, tok, checked)
    warnings += foreign_markers(spec, tok) + dropped_turns(viewed, refs, tok, checked)
    return problems, warnings


def _thinking_dropped(spec: JobSpec, viewed: Any, refs: list[str], tok: Any, checked: int) -> list[str]:
    """Rows whose reasoning the chat template leaves out of the tokens (templates that drop `<think>` blocks
    of some turns), while `thinking` is unset: the user most likely meant it trained."""
    from jobs.data.thinking import reasoning_texts

    if spec.thinking is not None:
        return []
    dropped = []
    for row, view, origin in zip(viewed.rows, viewed.views, viewed.origins):
        built = " ".join(tok.decode([t.id for t in seq.tokens]) for seq in view.sequences)
        if any(text[:40] not in built for text in reasoning_texts(row)):
            dropped.append(origin)
    if not dropped:
        return []
    return [
        f"{origins_text(dropped, refs)}, {len(dropped)} of the first {checked} training rows, carry reasoning "
        f"(<think> blocks or a reasoning field) that {spec.model}'s chat template leaves out of what is trained "
        "(`tunedeck data show SPEC --row N` shows it). Fix: set thinking: strip to train the answers alone on "
        "purpose, thinking: answer_only with prompt/completion rows to keep the reasoning in view but masked, or "
        "use a chat template that keeps each assistant turn's reasoning"
    ]


def _untrained(spec: JobSpec, views: list[Any], origins: list[Any], refs: list[str], checked: int):
    refused = [o for v, o in zip(views, origins) if v.untrained and v.notes]
    if refused:  # trl raises for any such row (assistant_only_loss)
        return [
            Problem(
                "assistant_only_loss",
                f"{origins_text(refused, refs)} {'has' if len(refused) == 1 else 'have'} no token that the chat "
                "template marks as the assistant's, so assistant_only_loss trains on nothing there, and trl refuses "
                "the run when any row has none",
                "use a chat template whose `{% generation %}` block holds every assistant turn's content, drop "
                "those rows, or set assistant_only_loss: false",
            )
        ], []
    empty = [o for v, o in zip(views, origins) if v.untrained]
    if not empty:
        return [], []
    head = f"{origins_text(empty, refs)}, {len(empty)} of the first {checked} training rows,"
    what = f"{head} {'has' if len(empty) == 1 else 'have'} no token in the loss: the masks hide every token"
    fix = _mask_fix(spec)
    if len(empty) == checked:
        return [Problem("dataset", what + ", so training learns nothing", fix)], []
    return [], [f"{what}; {fix}"]


def _mask_fix(spec: JobSpec) -> str:
    if spec.assistant_only_loss:
        return "check that those rows' assistant turns have content, or set assistant_only_loss: false"
    return "give those rows a non-empty answer (completion, chosen/rejected), or drop them"


def _no_stop(spec: JobSpec, views: list[Any], origins: list[Any], refs: list[str], tok: Any, checked: int):
    stops = stop_ids(spec.model, tok)
    if not stops:
        return []
    ending: dict[str, list[tuple[int, int]]] = {}
    for view, origin in zip(views, origins):
        for seq in view.sequences:
            if view.untrained or seq.cut_count:
                continue
            last = _last_trained(seq.kept)
            if last is not None and last.id not in stops:
                ending.setdefault(last.text, []).append(origin)
                break
    if not ending:
        return []
    rows = sorted({o for found in ending.values() for o in found})
    token, _ = max(ending.items(), key=lambda kv: len(kv[1]))
    names = ", ".join(f"{tok.convert_ids_to_tokens(i)!r} (id {i})" for i in sorted(stops))
    return [
        f"{origins_text(rows, refs)}, {len(rows)} of the first {checked} training rows, train answers that end with "
        f"{token!r}, not with a token generation stops at ({names}): the model does not learn to stop and the "
        f"trained model rambles on after its answer. Fix: {_stop_fix(spec, tok, token, stops)} "
        "(`tunedeck data show SPEC --row N` shows each token and whether it is trained)"
    ]


def _last_trained(tokens: list[Any]) -> Any:
    """The last trained token that is more than white space (templates add a newline after the end-of-turn)."""
    for token in reversed(tokens):
        if token.trained and (token.special or token.text.strip()):
            return token
    return None


def _stop_fix(spec: JobSpec, tok: Any, token: str, stops: set[int]) -> str:
    if token in (getattr(tok, "all_special_tokens", None) or []):
        return (
            f"{token!r} ends the template's turns but generation does not stop at it: add its id to eos_token_id "
            f"in {spec.model}'s generation_config.json, or use a chat template that ends turns with "
            f"{tok.eos_token!r}"
        )
    if spec.assistant_only_loss:
        return (
            "the end-of-turn token is outside the chat template's `{% generation %}` block: move it inside, or set "
            "assistant_only_loss: false"
        )
    return f"end each answer with {tok.eos_token!r}, or use the model's own chat template"


def stop_ids(model: str, tok: Any) -> set[int]:
    """The token ids generation stops at: the tokenizer's EOS and generation_config.json's `eos_token_id`s."""
    from jobs.models.tokenizer import tokenizer_folder

    found = {tok.eos_token_id} if getattr(tok, "eos_token_id", None) is not None else set()
    folder = tokenizer_folder(model)
    config = folder / "generation_config.json" if folder is not None else None
    if config is not None and config.is_file():
        try:
            eos = json.loads(config.read_text(encoding="utf-8")).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            eos = None
        found |= {int(i) for i in (eos if isinstance(eos, list) else [eos]) if isinstance(i, int)}
    return found
