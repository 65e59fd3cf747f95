"""Before/after samples: a few held-out prompts answered greedily by the base model and by the run's result.

    prompts, source = pick_prompts(spec, eval_ds)      # spec's sample_prompts, else held-out rows, else BUILT_IN
    texts = greedy_texts(model, tokenizer, prompts, spec.sample_new_tokens)
    record_before(run_dir, spec, model, tokenizer, eval_ds)    # before training; a resumed run keeps its file
    samples = record_after(store, run_id, spec, model, tokenizer)  # after; recorded as artifact kind "samples"

The run folder's `samples.json` holds the prompts, the base model's answers ("before"), the result's
answers ("after"), how they were decoded, and any reason there are none (a reward model does not
generate; `sample_count: 0`) or error met while answering. Sampling never fails a run: an error is
logged and written into the file, and training goes on.

Prompts come from the spec (`sample_prompts`), else from the eval data (the prompt side of chat,
prompt/completion, preference or KTO rows: held-out rows, never training rows), else from a small
built-in set. A prompt with chat turns (and every typed prompt) is sent through the tokenizer's chat
template; a plain-text prompt of prompt/completion rows is continued as the run trained on it.
"""

from __future__ import annotations

import html
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from jobs.spec.job import JobSpec
from jobs.spec.trainer_records import record_for
from jobs.train.artifacts import LOAD_PROMPT, sha256_of
from jobs.train.prompt_ids import Prompt, as_prompt, encode
from jobs.train.sample_images import IMAGE_TOKEN, flat_turns, keeper, picture_inputs
from storage.roles import RunArtifacts

log = logging.getLogger("jobs.train.before_after")

SAMPLES_FILE = "samples.json"
# The export's check prompts too; the first is the one the bundle's load snippet asks.
BUILT_IN_PROMPTS = (
    LOAD_PROMPT,
    "What do you know about the moon?",
    "Give me one tip for learning to cook.",
    "Why is the sky blue?",
    "Write one sentence about rivers.",
)


def _turns(messages: Any) -> tuple[tuple[str, str], ...] | None:
    """Chat turns up to (not including) the last assistant turn (image parts as `<image>`); None when there is no
    user turn before it."""
    turns = flat_turns(messages) if isinstance(messages, list) else None
    if turns is None:
        return None
    last = max((i for i, (role, _) in enumerate(turns) if role == "assistant"), default=len(turns))
    turns = turns[:last]
    return tuple(turns) if any(role == "user" for role, _ in turns) else None


def row_prompt(row: dict[str, Any], keep: Callable[[Any], str] | None = None) -> Prompt | None:
    """The prompt side of one data row (chat, prompt/completion, preference, KTO); None for text rows. An image
    row's pictures are kept by `keep` (None: the row is skipped)."""
    if "messages" in row:
        turns = _turns(row["messages"])
    elif isinstance(row.get("prompt"), list):
        turns = _turns(row["prompt"] + [{"role": "assistant", "content": ""}])
    else:
        prompt = row.get("prompt")
        return Prompt(prompt, None) if isinstance(prompt, str) and prompt.strip() else None
    if not turns:
        return None
    shown = next(c for r, c in reversed(turns) if r == "user").replace(IMAGE_TOKEN, "").strip()
    places = sum(c.count(IMAGE_TOKEN) for _, c in turns)
    if not places:
        return Prompt(shown, turns)
    pictures = list(row.get("images") or [])[:places]  # the prompt's pictures come first in the row's list
    if keep is None or len(pictures) != places:
        return None
    return Prompt(shown, turns, tuple(keep(p) for p in pictures))


def pick_prompts(spec: JobSpec, eval_ds: Any, keep: Callable[[Any], str] | None = None) -> tuple[list[Prompt], str]:
    """The prompts to answer and where they came from, in words; `keep` saves an image row's pictures."""
    typed = spec.sample_prompt_list
    if typed:
        return [Prompt.typed(t) for t in typed][: spec.sample_count], "the spec's sample_prompts"
    if eval_ds is not None:
        seen: dict[str, Prompt] = {}
        for row in eval_ds:
            prompt = row_prompt(row, keep)
            if prompt is not None and prompt.text.strip() and prompt.text not in seen:
                seen[prompt.text] = prompt
            if len(seen) >= spec.sample_count:
                break
        if seen:
            return list(seen.values()), "the first prompts of the held-out (eval) rows"
    return [Prompt.typed(t) for t in BUILT_IN_PROMPTS[: spec.sample_count]], "tunedeck's built-in prompts"


# ---------------------------------------------------------------------- greedy answers
def _inputs(tokenizer: Any, processor: Any, prompt: Prompt) -> dict[str, Any]:
    if not prompt.images:
        return dict(encode(tokenizer, prompt))
    if processor is None or prompt.messages is None:
        raise ValueError(f"the prompt {prompt.text!r} has pictures, and this model has no processor to read them")
    return picture_inputs(processor, prompt.messages, prompt.images)


def greedy(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Prompt | str],
    max_new_tokens: int,
    with_logits: bool = False,
    processor: Any = None,
) -> tuple[list[list[int]], list[Any]]:
    """Greedy answer token ids per prompt, and (with_logits) the logits of each prompt's positions; a prompt with
    pictures goes through `processor` (a vision-language run's)."""
    import torch

    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    training = model.training
    model.eval()
    ids, logits = [], []
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    try:
        for prompt in prompts:
            inputs = _inputs(tokenizer, processor, as_prompt(prompt))
            inputs = {k: v.to(device, dtype) if v.is_floating_point() else v.to(device) for k, v in inputs.items()}
            with torch.no_grad():
                if with_logits:
                    logits.append(model(**inputs).logits.float().cpu())
                out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
            ids.append(out[0, inputs["input_ids"].shape[1] :].tolist())
    finally:
        model.train(training)
    return ids, logits


def greedy_texts(model: Any, tokenizer: Any, prompts: Sequence[Prompt | str], max_new_tokens: int) -> list[str]:
    """Greedy answers, decoded without special tokens (a vision-language model's processor: text-only prompts
    through its tokenizer)."""
    from transformers import ProcessorMixin

    processor = tokenizer if isinstance(tokenizer, ProcessorMixin) else None
    tokenizer = tokenizer.tokenizer if processor is not None else tokenizer
    ids, _ = greedy(model, tokenizer, prompts, max_new_tokens, processor=processor)
    return [tokenizer.decode(a, skip_special_tokens=True).strip() for a in ids]


# ---------------------------------------------------------------------- the run's file
def samples_path(run_dir: Path) -> Path:
    return Path(run_dir) / SAMPLES_FILE


def read_samples(path: Path | None) -> dict[str, Any] | None:
    """The samples file's content, or None when there is none (or it cannot be read)."""
    if path is None or not Path(path).is_file():
        return None
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False))
    tmp.replace(path)


def skip_reason(spec: JobSpec) -> str | None:
    if record_for(spec.trainer).score_head:
        return "a reward model scores text and does not generate it: no answers to compare"
    if spec.sample_count == 0:
        return "sample_count is 0"
    return None


def record_before(run_dir: Path, spec: JobSpec, model: Any, tokenizer: Any, eval_ds: Any) -> None:
    """Answer the prompts with the base model into the run's samples.json; a resumed run keeps its answers.

    Never raises: an error is logged and recorded in the file."""
    path = samples_path(run_dir)
    if (read_samples(path) or {}).get("before") is not None:
        log.info("before/after samples: keeping the base model's answers from the first attempt")
        return
    data: dict[str, Any] = {
        "version": 1,
        "decoding": "greedy",
        "max_new_tokens": spec.sample_new_tokens,
        "prompts": [],
        "before": None,
        "after": None,
        "skipped": skip_reason(spec),
        "errors": [],
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if data["skipped"] is None:
            prompts, data["source"] = pick_prompts(spec, eval_ds, keeper(run_dir))
            data["prompts"] = [asdict(p) for p in prompts]
            started = time.monotonic()
            data["before"] = greedy_texts(model, tokenizer, prompts, spec.sample_new_tokens)
            log.info(
                "before/after samples: the base model answered %d prompts (%s) in %.1f s",
                len(prompts),
                data["source"],
                time.monotonic() - started,
            )
        else:
            log.info("before/after samples: none (%s)", data["skipped"])
    # Broad, logged with its traceback and written into the file: the samples are a display, and an
    # error in generating them (any of the model's or tokenizer's) must never fail the training run.
    except Exception as exc:
        log.exception("before/after samples: the base model's answers failed; training goes on")
        data["errors"].append(f"before: {type(exc).__name__}: {exc}")
    try:
        _write(path, data)
    except OSError:
        log.exception("before/after samples: could not write %s", path)


def _prompts_of(data: dict[str, Any]) -> list[Prompt]:
    return [
        Prompt(
            p["text"],
            tuple(tuple(t) for t in p["messages"]) if p.get("messages") is not None else None,
            tuple(p.get("images") or ()),
        )
        for p in data.get("prompts") or []
    ]


def record_after(store: RunArtifacts, run_id: int, spec: JobSpec, model: Any, tokenizer: Any) -> dict[str, Any] | None:
    """Answer the stored prompts with the trained result, save and record the file; its content, or None.

    Never raises: an error is logged and recorded in the file."""
    path = samples_path(store.run_dir(run_id))
    try:
        data = read_samples(path)
        if data is None:  # no "before" step ran (a caller without one): the prompts are chosen now
            data = {
                "version": 1,
                "decoding": "greedy",
                "max_new_tokens": spec.sample_new_tokens,
                "prompts": [],
                "before": None,
                "after": None,
                "skipped": skip_reason(spec),
                "errors": [],
            }
            if data["skipped"] is None:
                prompts, data["source"] = pick_prompts(spec, None)
                data["prompts"] = [asdict(p) for p in prompts]
        if data.get("skipped") is None and data.get("prompts"):
            started = time.monotonic()
            data["after"] = greedy_texts(model, tokenizer, _prompts_of(data), int(data["max_new_tokens"]))
            log.info(
                "before/after samples: the result answered %d prompts in %.1f s",
                len(data["after"]),
                time.monotonic() - started,
            )
    # Broad, logged and recorded in the file, as for the "before" answers: a display must not fail the run.
    except Exception as exc:
        log.exception("before/after samples: the result's answers failed; the run goes on")
        data = (
            data
            if isinstance(data, dict)
            else {"version": 1, "prompts": [], "before": None, "after": None, "skipped": None, "errors": []}
        )
        data.setdefault("errors", []).append(f"after: {type(exc).__name__}: {exc}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(path, data)
        store.add_artifact(run_id, "samples", str(path), path.stat().st_size, sha256_of(path))
    except Exception:  # nor may recording it (a file error, the store's): logged with its traceback
        log.exception("before/after samples: could not save %s", path)
    return data


def samples_of(store: RunArtifacts, run_id: int) -> dict[str, Any] | None:
    """A run's samples file (the recorded artifact, else the file of an unfinished run), or None."""
    recorded = [a.path for a in store.artifacts(run_id) if a.kind == "samples"]
    return read_samples(Path(recorded[-1]) if recorded else samples_path(store.run_dir(run_id)))


# ---------------------------------------------------------------------- tables
def rows(data: dict[str, Any]) -> list[tuple[str, str | None, str | None]]:
    """(prompt, base answer, result answer) per prompt; None where that answer is missing."""
    before, after = data.get("before") or [], data.get("after") or []
    return [
        (_shown(p), before[i] if i < len(before) else None, after[i] if i < len(after) else None)
        for i, p in enumerate(data.get("prompts") or [])
    ]


def _shown(prompt: dict[str, Any]) -> str:
    """A prompt's text, marked `[image]` once per picture that went with it."""
    return "[image] " * len(prompt.get("images") or ()) + prompt.get("text", "")


def _cell(text: str | None) -> str:
    """A table cell: escaped so model output cannot break the table or format itself."""
    if text is None:
        return "—"
    if not text:
        return "(empty)"
    for ch in "\\`*_[]":
        text = text.replace(ch, "\\" + ch)
    return html.escape(text, quote=False).replace("|", "&#124;").replace("\n", "<br>")


def table_markdown(data: dict[str, Any], result_label: str = "this run", judged: dict[str, str] | None = None) -> str:
    """A markdown table prompt | base | result, with a line on how the answers were made; `judged` (prompt ->
    the judge's verdicts) adds a column beside the answers."""
    if judged is not None:
        lines = [f"| prompt | base | {result_label} | judge (run shown first, then second) |", "|---|---|---|---|"]
        lines += [f"| {_cell(p)} | {_cell(b)} | {_cell(a)} | {judged.get(p, '—')} |" for p, b, a in rows(data)]
    else:
        lines = [f"| prompt | base | {result_label} |", "|---|---|---|"]
        lines += [f"| {_cell(p)} | {_cell(b)} | {_cell(a)} |" for p, b, a in rows(data)]
    how = f"Greedy decoding, at most {data.get('max_new_tokens')} new tokens; prompts: {data.get('source', 'unknown')}."
    return how + "\n\n" + "\n".join(lines)


def status_line(data: dict[str, Any] | None, finished: bool) -> str | None:
    """Why a run shows no (or only half a) before/after table; None when it has both columns."""
    if data is None:
        return (
            "This run has no before/after samples (runs before this feature, and runs that failed before "
            "training started, have none)."
            if finished
            else "The base model's answers appear once training starts."
        )
    if data.get("skipped"):
        return f"No before/after samples: {data['skipped']}."
    errors = "; ".join(data.get("errors") or [])
    if data.get("before") is None and data.get("after") is None:
        return f"No before/after samples: {errors or 'none were taken'}."
    if data.get("after") is None:
        why = errors or ("the run did not finish" if finished else "the result answers when training ends")
        return f"Only the base model's answers: {why}."
    return f"Sampling errors: {errors}." if errors else None


def card_section(data: dict[str, Any] | None) -> str:
    """The model card's "Before / after" section (empty without samples)."""
    if not data or data.get("skipped") or data.get("after") is None:
        return ""
    return f"\n## Before / after\n{table_markdown(data, 'fine-tuned')}\n"


def bundle_parts(data: dict[str, Any] | None) -> dict[str, Any]:
    """`write_artifacts` keywords that put the samples into the bundle: samples.json and the card's table."""
    if data is None:
        return {}
    return {
        "extra_files": {SAMPLES_FILE: json.dumps(data, indent=2, ensure_ascii=False)},
        "card_extra": card_section(data),
    }
