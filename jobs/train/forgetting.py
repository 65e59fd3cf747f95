"""The forgetting meter: did the fine-tune make the model worse at ordinary text?

    record(sinks, 0, model, tokenizer, eval_ds)       # the base, before training (step 0)
    record(sinks, step, model, tokenizer, eval_ds)    # the result, after training (its last step)
    meter = read(store, run_id)   # Forgetting(general_before, general_after, task_before, task_after)
    meter.text()                  # "general perplexity +4% while eval loss fell 31%"

The general text ships with tunedeck (`jobs/resources/general/`: a few hundred short sentences of general
knowledge and everyday language, and a few general prompts with short answers, written for it). Its mean
token loss is measured on the base before training and on the result after, as metric rows
`general_loss`; beside it, `task_loss` is the same measure over (at most MAX_TASK_ROWS) held-out eval rows:
the job's own text. The rows go to the run's metrics sinks (`jobs.train.sinks`: the store, then each
`report_to` tracker) and live with the run's other metrics, so the training doctor reads them
(`jobs.doctor.rules.forgetting`: a finding when the general perplexity rose past FORGET_RISE) and every view
reads one home. Costs two forward passes over ~1,500 tokens (GENERAL_SAMPLE sentences, the prompts, the eval rows),
BATCH rows at a time, and little memory whatever the vocabulary (issue #49): the logits are never a batch's
whole [batch, seq, vocab] but at most LOGIT_BUDGET at once (`mean_loss`), so the meter, which runs before
training and which the memory prediction does not count, stays below a training step's peak.
Never fails a run: an error is logged and the meter is left out.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from jobs.train.sinks import MetricsSink, Rows
from storage.records import MetricPoint

log = logging.getLogger(__name__)

GENERAL = "general_loss"  # metric rows: mean token loss on the shipped general text
TASK = "task_loss"  # ... and on the run's held-out eval rows, measured the same way
RESOURCES = Path(__file__).resolve().parents[1] / "resources" / "general"
GENERAL_SAMPLE = 64  # the sentences measured: an evenly spaced, fixed choice of them (seconds on a CPU)
MAX_TASK_ROWS = 16  # the eval rows measured (the first ones)
MAX_TOKENS = 96  # each text is cut to this many tokens
BATCH = 32
LOGIT_BUDGET = 2**20  # the most logits (elements) the meter holds at once: 4 MiB in fp32, whatever the vocabulary


@lru_cache(maxsize=1)
def general_sentences() -> tuple[str, ...]:
    return tuple(s for s in (RESOURCES / "sentences.txt").read_text(encoding="utf-8").splitlines() if s.strip())


@lru_cache(maxsize=1)
def general_prompts() -> tuple[tuple[str, str], ...]:
    lines = (RESOURCES / "prompts.jsonl").read_text(encoding="utf-8").splitlines()
    return tuple((row["prompt"], row["answer"]) for row in map(json.loads, filter(str.strip, lines)))


def _chat(tokenizer: Any, turns: list[dict[str, str]]) -> str:
    """A conversation as the model reads it: its chat template, else the turns' text on their own lines."""
    if getattr(tokenizer, "chat_template", None):
        return str(tokenizer.apply_chat_template(turns, tokenize=False))
    return "\n".join(t["content"] for t in turns)


def general_texts(tokenizer: Any) -> list[str]:
    """GENERAL_SAMPLE of the sentences (the same ones every time), then each general prompt and its answer as a
    conversation."""
    chats = [
        _chat(tokenizer, [{"role": "user", "content": p}, {"role": "assistant", "content": a}])
        for p, a in general_prompts()
    ]
    sentences = general_sentences()
    stride = max(1, len(sentences) // GENERAL_SAMPLE)
    return [*sentences[::stride][:GENERAL_SAMPLE], *chats]


def row_text(row: dict[str, Any], tokenizer: Any) -> str | None:
    """An eval row's text: chat turns through the template, prompt + completion, or plain text; None otherwise."""
    messages = row.get("messages")
    if isinstance(messages, list) and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
        return _chat(tokenizer, messages)
    prompt, completion = row.get("prompt"), row.get("completion")
    if isinstance(prompt, str) and isinstance(completion, str):
        return prompt + completion
    text = row.get("text")
    return text if isinstance(text, str) else None


def task_texts(eval_ds: Any, tokenizer: Any) -> list[str]:
    if eval_ds is None:
        return []
    rows = (eval_ds[i] for i in range(min(len(eval_ds), MAX_TASK_ROWS)))
    return [t for t in (row_text(r, tokenizer) for r in rows) if t]


def mean_loss(model: Any, tokenizer: Any, texts: list[str]) -> float:
    """The mean next-token loss (nats per token) of `model` over `texts`, every token counted once.

    Bounded memory (issue #49): full [batch, seq, vocab] logits are never kept. The LM head (the module
    `get_output_embeddings()` returns) is given only the last position in the model's forward, and is applied
    here to the tokens' hidden states LOGIT_BUDGET logits at a time (`_head_losses`), with what the forward does
    after the head where the config says (a scale, Gemma's soft-cap: `_logit_map`), checked against the
    forward's own logits at one position. A model that fails the check is read through its forward instead, in
    batches of at most LOGIT_BUDGET logits (one row at least: MAX_TOKENS x vocab)."""
    import torch

    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    total, count, through_head = 0.0, 0, True
    encoded = sorted(
        (x for x in (tokenizer(t, add_special_tokens=False)["input_ids"][:MAX_TOKENS] for t in texts) if len(x) >= 2),
        key=len,
    )  # by length: each batch pads little
    try:
        with torch.no_grad():
            for ids in _batches(encoded, BATCH):
                width = max(map(len, ids))
                input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids], device=device)
                mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids], device=device)
                nll = _head_losses(model, input_ids, mask) if through_head else None
                if nll is None:  # the head's check failed (for this model: every later batch too, so it is not
                    through_head = False  # tried again): the forward's own logits, a few rows at a time
                    nll = _forward_losses(model, input_ids, mask)
                total += float(nll.sum())
                count += int(nll.numel())
    finally:
        model.train(was_training)
    return total / count if count else math.nan


def _batches(encoded: list[list[int]], rows: int) -> list[list[list[int]]]:
    return [encoded[start : start + rows] for start in range(0, len(encoded), rows)]


def _text_config(model: Any) -> Any:
    config: Any = getattr(model, "config", None)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _number(config: Any, name: str) -> float | None:
    value = getattr(config, name, None)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value else None


def _logit_map(model: Any) -> Any:
    """What the model's forward does to its head's output, where its config says (Cohere's logit_scale, Granite's
    logits_scaling, Gemma 2/3's final_logit_softcapping), in the forward's order; `_head_losses` checks it."""
    import torch

    config = _text_config(model)
    scale, divisor, cap = (_number(config, n) for n in ("logit_scale", "logits_scaling", "final_logit_softcapping"))

    def apply(logits: Any) -> Any:
        if scale is not None:
            logits = logits * scale
        if divisor is not None:
            logits = logits / divisor
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    return apply


def _head_losses(model: Any, input_ids: Any, mask: Any) -> Any:
    """Each kept target's loss through the LM head (and `_logit_map`) in chunks of LOGIT_BUDGET // vocab tokens.
    The forward runs with the head given only the first row's last position, whose logits then check the map;
    None where they differ, or the head is not called once (the caller then reads the forward's own logits)."""
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Module):
        return None
    to_logits = _logit_map(model)
    seen: list[Any] = []

    def last_only(_: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        seen.append(args[0] if args else None)  # called more than once: not a plain head (checked below)
        if len(seen) > 1 or not isinstance(args[0], torch.Tensor) or args[0].dim() != 3:
            return None
        return (args[0][:1, -1:], *args[1:])  # the first row's last position: one row of logits

    handle = head.register_forward_pre_hook(last_only)
    try:
        logits = model(input_ids=input_ids, attention_mask=mask, use_cache=False).logits  # no KV cache to keep
    except (RuntimeError, ValueError, IndexError):  # a forward that needs every row's logits: read it whole
        return None
    finally:
        handle.remove()
    hidden = seen[0] if len(seen) == 1 else None
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3 or tuple(logits.shape[:2]) != (1, 1):
        return None
    if not torch.allclose(to_logits(head(hidden[:1, -1:])).float(), logits.float(), rtol=1e-4, atol=1e-5):
        return None  # the forward does more to the head's output than `_logit_map` knows
    keep = mask[:, 1:].bool()
    states, targets = hidden[:, :-1][keep], input_ids[:, 1:][keep]
    step = max(1, LOGIT_BUDGET // max(1, int(logits.shape[-1])))
    losses = [
        torch.nn.functional.cross_entropy(
            to_logits(head(states[i : i + step])).float(), targets[i : i + step], reduction="none"
        )
        for i in range(0, len(targets), step)
    ]
    return torch.cat(losses) if losses else targets.float()


def _forward_losses(model: Any, input_ids: Any, mask: Any) -> Any:
    """Each kept target's loss from the model's own logits, in batches of at most LOGIT_BUDGET logits."""
    import torch

    vocab = getattr(_text_config(model), "vocab_size", None)
    rows = max(1, LOGIT_BUDGET // (int(input_ids.shape[1]) * vocab)) if isinstance(vocab, int) and vocab > 0 else 1
    out = []
    for start in range(0, int(input_ids.shape[0]), rows):
        ids, m = input_ids[start : start + rows], mask[start : start + rows]
        logits = model(input_ids=ids, attention_mask=m, use_cache=False).logits[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        out.append(nll[m[:, 1:].bool()])
        del logits, nll
    return torch.cat(out)


def record(sinks: Sequence[MetricsSink], step: int, model: Any, tokenizer: Any, eval_ds: Any) -> list[MetricPoint]:
    """Measure the general text (and the eval rows) on `model`; log them to each of `sinks` (the store first)
    as metric rows at `step`; the rows logged (none after an error: never raises)."""
    try:
        started = time.monotonic()
        points = [MetricPoint(step, GENERAL, mean_loss(model, tokenizer, general_texts(tokenizer)), time.time())]
        task = task_texts(eval_ds, tokenizer)
        if task:
            points.append(MetricPoint(step, TASK, mean_loss(model, tokenizer, task), time.time()))
        points = [p for p in points if math.isfinite(p.value)]
        for sink in sinks:
            sink.log(Rows(points))
        log.info("forgetting meter at step %d: %s in %.1f s", step, points, time.monotonic() - started)
        return points
    except Exception:  # noqa: BLE001 - a display: the run goes on without it
        log.exception("forgetting meter: measuring at step %d failed; the run goes on", step)
        return []


@dataclass(frozen=True)
class Forgetting:
    """The meter's figures: mean token loss before (the base) and after (the result)."""

    general_before: float
    general_after: float
    task_before: float | None = None
    task_after: float | None = None

    @property
    def general_change(self) -> float:
        """The general perplexity's relative change (+0.04 = 4% higher)."""
        return math.exp(self.general_after - self.general_before) - 1

    @property
    def task_change(self) -> float | None:
        """The eval loss's relative change (-0.31 = fell 31%)."""
        if self.task_before is None or self.task_after is None or self.task_before <= 0:
            return None
        return self.task_after / self.task_before - 1

    def text(self) -> str:
        line = f"general perplexity {100 * self.general_change:+.0f}%"
        task = self.task_change
        if task is not None:
            line += f" while eval loss {'fell' if task < 0 else 'rose'} {abs(100 * task):.0f}%"
        return line

    def detail(self) -> str:
        """The figures behind `text`: perplexities and losses."""
        out = f"general perplexity {math.exp(self.general_before):.4g} (base) -> {math.exp(self.general_after):.4g}"
        if self.task_before is not None and self.task_after is not None:
            out += f"; eval loss {self.task_before:.4g} (base) -> {self.task_after:.4g}"
        return out


def from_rows(general: list[MetricPoint], task: list[MetricPoint]) -> Forgetting | None:
    """The meter from its rows: the first (the base) and the last (the result); None before both are measured."""
    if len(general) < 2:
        return None
    task_pair = (task[0].value, task[-1].value) if len(task) >= 2 else (None, None)
    return Forgetting(general[0].value, general[-1].value, *task_pair)


def read(store: Any, run_id: int) -> Forgetting | None:
    """A run's meter (None: not measured, or not yet after training)."""
    rows = store.metrics(run_id, [GENERAL, TASK])
    return from_rows([p for p in rows if p.name == GENERAL], [p for p in rows if p.name == TASK])


def card_section(meter: Forgetting | None) -> str:
    """The model card's lines (empty without a meter)."""
    if meter is None:
        return ""
    return f"\n## Forgetting\n{meter.text()} ({meter.detail()}), on tunedeck's general text and held-out rows.\n"
