"""Template pitfalls read from the tokens trl builds (the masks step's rows, `jobs.checks.masks`): warnings.

- a chat template that is not the model's own: it writes turn markers (`<|im_start|>`, `<start_of_turn>`, ...)
  that are not tokens of the model's tokenizer, so each is split into pieces of text the model has never seen as
  one marker (a base model's folder given another family's template);
- a template that silently drops the system prompt or earlier turns: a row's turn whose text is not among the
  tokens built from the row (templates that keep only the last turns, or none of the system prompt).

A pad token equal to the stop token is no pitfall with trl 1.16: its collators pad the labels with -100 by
length (`DataCollatorForLanguageModeling.torch_call`: `pad(labels, padding_value=-100)`), never by comparing
token ids with the pad id, so a trained EOS stays trained (tests/test_template_fit.py holds that).

    warnings = foreign_markers(spec, tok) + dropped_turns(viewed, refs, tok, checked)
"""

from __future__ import annotations

import re
from typing import Any

from jobs.data.row_numbers import origins_text
from jobs.spec.job import JobSpec

MARKER = re.compile(r"<\|[^<>|\s]{1,40}\|>|<(?:start_of_turn|end_of_turn|eot_id|start_header_id|end_header_id)>")
SAMPLE = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello there."},
    {"role": "assistant", "content": "Hi, how can I help?"},
    {"role": "user", "content": "Tell me a joke."},
    {"role": "assistant", "content": "Why did the chicken cross the road?"},
]
THINK = re.compile(r"<think>.*?</think>", re.S)
SHOWN = 40  # characters of a turn looked for among the tokens


def foreign_markers(spec: JobSpec, tok: Any) -> list[str]:
    """A warning when the chat template writes turn markers its tokenizer does not have as tokens."""
    if not getattr(tok, "chat_template", None):
        return []
    try:
        rendered = tok.apply_chat_template(SAMPLE, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that refuses a system turn is the template check's business
        return []
    vocab = tok.get_vocab()
    missing = sorted({m for m in MARKER.findall(rendered) if m not in vocab})
    if not missing:
        return []
    pieces = len(tok.tokenize(missing[0]))
    return [
        f"{spec.model}'s chat template writes {', '.join(repr(m) for m in missing)}, which "
        f"{'is' if len(missing) == 1 else 'are'} not a token of its tokenizer ({missing[0]!r} becomes {pieces} "
        "pieces): the template is another model family's, and the trained model learns those markers as plain "
        "text. Fix: set model: to the model this template belongs to (its instruct version), or use a model "
        "folder whose chat_template.jinja is the tokenizer's own"
    ]


def _squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text)


def dropped_turns(viewed: Any, refs: list[str], tok: Any, checked: int) -> list[str]:
    """A warning naming the chat rows whose system prompt or earlier turns are not among the tokens built."""
    system: list[tuple[int, int]] = []
    earlier: list[tuple[int, int]] = []
    for row, view, origin in zip(viewed.rows, viewed.views, viewed.origins):
        messages = row.get("messages")
        if not isinstance(messages, list) or not view.sequences:
            continue
        built = _squeezed(" ".join(tok.decode([t.id for t in seq.tokens]) for seq in view.sequences))
        for i, m in enumerate(messages):
            text = _squeezed(THINK.sub("", m.get("content") or ""))[:SHOWN]
            if not text or text in built:
                continue
            if m.get("role") == "system":
                system.append(origin)
            elif i < len(messages) - 2:  # not the last exchange: an earlier turn
                earlier.append(origin)
            break
    out = []
    for rows, what in ((system, "the system prompt"), (earlier, "earlier turns")):
        if rows:
            out.append(
                f"{origins_text(rows, refs)}, {len(rows)} of the first {checked} training rows, lose {what}: the "
                f"chat template leaves {what} out of the tokens, and the model is trained without them. Fix: set "
                "model: to one whose chat template keeps every turn, or fold that text into the rows' first user "
                "turn (dataset); `tunedeck data show SPEC --row N` shows the tokens"
            )
    return out
