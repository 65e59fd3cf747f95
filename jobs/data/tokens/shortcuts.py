"""Faster ways to the tokenizer's own counts, each used only where it is known to give the same answer.

`Shortcuts.of(tokenizer)` holds the two (None: neither applies; `jobs.data.tokens.measurement` then
counts the library's way, and with them still checks a spread of rows the library's way):

- `PieceCounter`: a text's count as the sum of its space-separated pieces' counts, each distinct
  piece tokenized once (~6x faster than the tokenizer on such data);
- `template_renderer`: the compiled chat template called directly (~1.5x faster than
  `apply_chat_template` on plain {role, content} messages).

Counting a data set's tokens is the length measurement's main cost: 100k rows of ~200 tokens are 20M
tokens, and the library's pre-tokenizer (a regular expression run by Oniguruma) needs ~25 s of one
core for them. Most of that work repeats: the same words come back millions of times. For the
byte-level BPE tokenizers (GPT-2, SmolLM2, Llama 3, Qwen2) a text's count is the sum of the counts of
its space-separated pieces, so each distinct piece goes through the library once and every other
occurrence is a dict lookup (`PieceCounter.counts`).

Why the sum is exact. With no normalizer, the library (1) cuts the text at its added tokens, (2)
splits each part into pre-tokens with a regular expression and (3) runs BPE on each pre-token
alone. Take a single space with a non-whitespace character on both sides. In each pattern below, a
pre-token that holds a space either starts with it or is all whitespace, so a pre-token ends just
before that space; none of the patterns looks behind, and a whitespace run's look-ahead stays
inside its piece (a piece never ends in whitespace), so the text from that space up to the next
such space splits the same alone as in place. No added token may hold whitespace or strip it
(`lstrip`/`rstrip`), so none crosses a piece either. Steps 1-3 on the pieces one by one therefore
give the same pre-tokens, and the same token count, as on the whole text.

Where that argument does not hold the library counts the whole text, as before: a text with a
double space, a space at either end or whitespace next to a space (`_safe`; Llama 3's split keeps
"  \n" in one pre-token), and every tokenizer whose `tokenizer.json` is not one of the known shapes
(`PieceCounter.of` is None: SentencePiece-style Llama 2 / Mistral / Gemma tokenizers, WordPiece, a
normalizer, BPE dropout). `jobs.data.tokens.measurement` also measures a spread of rows the library's way
and drops the shortcut if one differs. Memory: one dict entry per distinct piece (a few hundred
thousand for 100k rows of English text, tens of MB), for one measurement.

    counter = PieceCounter.of(tokenizer)           # None: count with the library
    counter.counts(["some text", ...], add_special_tokens=False)   # [2, ...]
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from typing import Any

# The library's own GPT-2 split (tokenizers' ByteLevel pre-tokenizer with use_regex: true), and the
# Split patterns of Llama 3 and Qwen2 (ahead of a ByteLevel with use_regex: false), as their
# tokenizer.json files spell them. Each keeps spaces at the start of a pre-token or in whitespace runs.
LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
KNOWN_SPLITS = frozenset({LLAMA3_SPLIT, QWEN2_SPLIT})
ASCII_WHITESPACE = "\t\n\r\x0b\x0c"
# Python's \s holds every character Oniguruma's \s does (and a few more): a conservative test of non-ASCII text.
_SPACE_NEXT_TO_WHITESPACE = re.compile(r"\s | \s")


def _known_pre_tokenizer(pre: Any) -> bool:
    if not isinstance(pre, dict):
        return False
    if pre.get("type") == "ByteLevel":
        return pre.get("use_regex", True) is True and pre.get("add_prefix_space") is False
    if pre.get("type") != "Sequence" or len(pre.get("pretokenizers") or ()) != 2:
        return False
    split, byte_level = pre["pretokenizers"]
    return (
        split.get("type") == "Split"
        and (split.get("pattern") or {}).get("Regex") in KNOWN_SPLITS
        and split.get("behavior") == "Isolated"
        and split.get("invert") is False
        and byte_level.get("type") == "ByteLevel"
        and byte_level.get("use_regex") is False
        and byte_level.get("add_prefix_space") is False
    )


def _safe(text: str) -> bool:
    """Whether every space of `text` has a non-whitespace character on both sides (then its pieces add up)."""
    if not text or text[0] == " " or text[-1] == " " or "  " in text:
        return False
    if text.isascii():
        for w in ASCII_WHITESPACE:  # substring tests run at C speed; most texts hold one or two of these
            if w in text and (" " + w in text or w + " " in text):
                return False
        return True
    return _SPACE_NEXT_TO_WHITESPACE.search(text) is None


class PieceCounter:
    """Token counts of texts for one tokenizer: each distinct space-separated piece counted once, by the library."""

    def __init__(self, backend: Any, specials_added: int) -> None:
        self._backend = backend  # a tokenizers.Tokenizer
        self._specials_added = specials_added  # what add_special_tokens=True adds (BOS, EOS) to one text
        self._first: dict[str, int] = {}  # a text's first piece -> its count
        self._rest: dict[str, int] = {}  # a later piece (without its space) -> the count of " " + piece

    @classmethod
    def of(cls, tokenizer: Any) -> PieceCounter | None:
        """A counter for a transformers fast tokenizer of a known shape; None for any other."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or getattr(tokenizer, "split_special_tokens", False):
            return None
        try:
            text = backend.to_str()
            data = json.loads(text)
        except (TypeError, ValueError):  # a backend that cannot describe itself: not a known shape
            return None
        model = data.get("model") or {}
        added = data.get("added_tokens") or []
        if (
            data.get("normalizer") is not None
            or not _known_pre_tokenizer(data.get("pre_tokenizer"))
            or model.get("type") != "BPE"
            or model.get("dropout") not in (None, 0.0)
            or any(t.get("lstrip") or t.get("rstrip") or re.search(r"\s", t.get("content", "")) for t in added)
        ):
            return None
        if data.get("padding") is not None or data.get("truncation") is not None or backend.encode_special_tokens:
            from tokenizers import Tokenizer

            # A copy without them (~0.3 s): the caller's tokenizer is not touched.
            backend = Tokenizer.from_str(text)
            backend.no_padding()
            backend.no_truncation()
            backend.encode_special_tokens = False
        post = backend.post_processor
        return cls(backend, post.num_special_tokens_to_add(False) if post is not None else 0)

    def counts(self, texts: list[str], add_special_tokens: bool) -> list[int]:
        """The token count of each text, as the library's `tokenizer(texts, add_special_tokens=...)` gives it."""
        extra = self._specials_added if add_special_tokens else 0
        first, rest = self._first, self._rest
        out = [0] * len(texts)
        unknown: list[tuple[int, list[str]]] = []  # texts with a piece not counted yet
        whole: list[int] = []  # texts the library counts whole
        for i, text in enumerate(texts):
            if not _safe(text):
                whole.append(i)
                continue
            pieces = text.split(" ")
            try:
                out[i] = extra + first[pieces[0]] + sum(map(rest.__getitem__, islice(pieces, 1, None)))
            except KeyError:
                unknown.append((i, pieces))
        if unknown:
            self._learn(
                {p[0] for _, p in unknown} - first.keys(),
                set().union(*(islice(p, 1, None) for _, p in unknown)) - rest.keys(),
            )
            for i, pieces in unknown:
                out[i] = extra + first[pieces[0]] + sum(map(rest.__getitem__, islice(pieces, 1, None)))
        for i, n in zip(whole, self._library([texts[i] for i in whole])):
            out[i] = extra + n
        return out

    def _learn(self, firsts: set[str], rests: set[str]) -> None:
        ordered_first, ordered_rest = list(firsts), list(rests)
        self._first.update(zip(ordered_first, self._library(ordered_first)))
        self._rest.update(zip(ordered_rest, self._library([" " + p for p in ordered_rest])))

    def _library(self, texts: list[str]) -> list[int]:
        """The library's counts, without the post-processor's tokens (added once per whole text)."""
        if not texts:
            return []
        return [len(e.ids) for e in self._backend.encode_batch_fast(texts, add_special_tokens=False)]


class CountMismatch(Exception):
    """A shortcut's count of a sequence differs from the one the tokenizer itself gives."""


@dataclass(frozen=True)
class Shortcuts:
    """Faster ways to the library's own counts, each None where it is not known to give the same answer:
    `counter` sums the counts of a text's pieces (`PieceCounter`: ~6x faster than the tokenizer),
    `render` calls the compiled chat template directly (`template_renderer`: ~1.5x faster)."""

    counter: PieceCounter | None
    render: Callable[..., str] | None

    @classmethod
    def of(cls, tokenizer: Any) -> Shortcuts | None:
        found = cls(PieceCounter.of(tokenizer), template_renderer(tokenizer))
        return found if found.counter is not None or found.render is not None else None


def template_renderer(tokenizer: Any) -> Callable[..., str] | None:
    """The tokenizer's chat template as `apply_chat_template(messages, tokenize=False, add_generation_prompt=...)`
    renders it, called directly (`render(messages)`, or `render(messages, True)` with the generation prompt).

    For messages that are plain {role, content} strings (every row `jobs.data.loading` builds),
    apply_chat_template's per-call work (copying the messages into plain data, dropping None values, aliasing
    reasoning fields) changes nothing and is a third of the rendering time; the compiled template gets the same
    variables (the special tokens, no tools or documents). Any other message, a template
    chosen by name (a dict) or a tokenizer class with its own apply_chat_template takes the library's way.
    None without transformers' template compiler."""
    template = getattr(tokenizer, "chat_template", None)
    if "transformers" not in sys.modules or not isinstance(template, str):
        return None  # not a transformers tokenizer (it would have imported transformers), or templates by name
    from transformers import PreTrainedTokenizerBase

    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:  # a transformers version without it: the library's way
        return None
    if type(tokenizer).apply_chat_template is not PreTrainedTokenizerBase.apply_chat_template:
        return None
    compiled = _compile_jinja_template(template)
    variables = {**tokenizer.special_tokens_map, "tools": None, "documents": None}

    def render(messages: list[dict[str, Any]], generation: bool = False, tools: list[Any] | None = None) -> str:
        if not tools and all(
            type(m) is dict and m.keys() == _PLAIN and type(m["role"]) is type(m["content"]) is str for m in messages
        ):
            return compiled.render(messages=messages, add_generation_prompt=generation, **variables)
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation, tools=tools or None
        )

    return render


_PLAIN = {"role", "content"}
