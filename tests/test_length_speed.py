"""The shortcuts that make measuring and re-reading the rows' lengths cheap, each checked against what it stands
for: the piece-by-piece token count against the tokenizer's own count, the direct chat-template call against
apply_chat_template, and the length cache's hit against the data file and tokenizer it must not touch
(`bench/prediction_speed.py` measures the time they save)."""

from __future__ import annotations

import json
import logging
import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import training_helpers

from jobs.data import digests
from jobs.data.tokens.measurement import measure
from jobs.data.tokens.shortcuts import LLAMA3_SPLIT, PieceCounter, Shortcuts, template_renderer
from jobs.spec.enums import Trainer
from jobs.spec.job import JobSpec

TRICKY = [
    "hello world",
    "a  b",
    " leading space",
    "trailing space ",
    "x \ty",
    "x\t y",
    "tab\there and there",
    "new\nline and more",
    "paragraph.\n\nNext one starts here",
    "don't you'll I'M we'd",
    "numbers 12345 678 9,000.50",
    "héllo wörld ça va",
    "日本語 テキスト です",
    "emoji 😀 ok 👍🏽",
    "a\u00a0 b",
    "a \u3000b",
    "x<|im_end|>y z",
    "mixed\r\n lines\r\nhere",
    "   ",
    "",
    "a",
    "!!! ??? ... -- (x) [y]",
    "can't-won't",
    "a \x1cb",
    "a\x1c b",
    "'s 's x 's",
]


def fuzz(n: int, seed: int = 0) -> list[str]:
    """Random strings over the characters where pre-tokenizers disagree most: spaces next to other whitespace,
    apostrophes, digits, non-ASCII letters and marks, and the chat template's special tokens."""
    rng = random.Random(seed)
    alphabet = list("ab  'sSdl1 2\t\n\r,.é😀\u00a0\u3000ß") + ["<|im_end|>", "<|im_start|>", " the", "ing"]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(n)]


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model: Path) -> Any:
    from jobs.models.tokenizer import local_tokenizer

    return local_tokenizer(str(tiny_model))


def library_counts(tokenizer: Any, texts: list[str], add_special_tokens: bool) -> list[int]:
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]]


@pytest.mark.parametrize("add_special_tokens", [False, True])
def test_piece_counts_are_the_tokenizers_own_counts(tiny_tokenizer: Any, add_special_tokens: bool) -> None:
    counter = PieceCounter.of(tiny_tokenizer)
    assert counter is not None  # a byte-level BPE with the GPT-2 split: a known shape
    texts = TRICKY + fuzz(3000) + [" ".join(fuzz(30, seed=i)) for i in range(50)]
    twice = counter.counts(texts, add_special_tokens) + counter.counts(texts, add_special_tokens)  # learned, then read
    assert twice == library_counts(tiny_tokenizer, texts, add_special_tokens) * 2


def _llama3_style(corpus: list[str]) -> Any:
    """A byte-level BPE behind Llama 3's split, trained on `corpus`: merges for whitespace runs like "  \\n",
    which Llama 3's split keeps in one pre-token (the tiny model's vocabulary has too few merges to tell)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|im_end|>"]
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_piece_counts_hold_for_the_llama3_split_and_refuse_unknown_shapes() -> None:
    from tokenizers import normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    texts = TRICKY + fuzz(3000, seed=1)
    llama3 = _llama3_style(texts * 3)
    counter = PieceCounter.of(llama3)
    assert counter is not None
    assert counter.counts(texts, False) == library_counts(llama3, texts, False)

    backend = llama3.backend_tokenizer
    backend.normalizer = normalizers.Lowercase()  # a normalizer may rewrite spaces: not a known shape
    assert PieceCounter.of(PreTrainedTokenizerFast(tokenizer_object=backend)) is None
    backend.normalizer = None
    backend.pre_tokenizer = pre_tokenizers.Metaspace()  # SentencePiece-style: no spaces left to cut at
    assert PieceCounter.of(PreTrainedTokenizerFast(tokenizer_object=backend)) is None


def test_the_direct_template_call_renders_what_apply_chat_template_renders(tiny_tokenizer: Any) -> None:
    render = template_renderer(tiny_tokenizer)
    assert render is not None
    rng = random.Random(2)
    for text in TRICKY + fuzz(200, seed=3):
        roles = rng.sample(["system", "user", "assistant"], k=rng.randint(1, 3))
        messages = [{"role": r, "content": text} for r in roles]
        assert render(messages) == tiny_tokenizer.apply_chat_template(messages, tokenize=False)
        prompt = render(messages, True)  # a prompt: the assistant's header follows
        assert prompt == tiny_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert prompt != render(messages)
    odd = [{"role": "user", "content": "hi", "name": "x"}]  # not plain {role, content}: the library's way
    assert render(odd) == tiny_tokenizer.apply_chat_template(odd, tokenize=False)


def rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Chat rows (user and assistant turns of fuzzed text, never empty: the data check refuses empty turns)."""
    rng = random.Random(seed)
    texts = fuzz(n, seed=seed)
    return [
        {
            "messages": [
                {"role": "user", "content": "q " + t},
                {"role": "assistant", "content": "a " + rng.choice(texts)},
            ]
        }
        for t in texts
    ]


def test_measuring_with_the_shortcuts_gives_the_librarys_lengths(tiny_tokenizer: Any) -> None:
    chat = rows(600)
    text = [{"text": t} for t in TRICKY + fuzz(600, seed=4)]
    for data in (chat, text):
        fast = measure(data, tiny_tokenizer, Trainer.SFT)
        slow = measure(data, _Plain(tiny_tokenizer), Trainer.SFT)  # no shortcuts: every row the library's way
        assert fast.lengths.tolist() == slow.lengths.tolist()


class _Plain:
    """The tokenizer with nothing a shortcut could use: the library's way for everything."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self.eos_token, self.chat_template = tokenizer.eos_token, tokenizer.chat_template

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._tok(*args, **kwargs)

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        return self._tok.apply_chat_template(*args, **kwargs)


def test_a_shortcut_that_disagrees_is_dropped_for_the_librarys_way(
    tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    data = [{"text": t} for t in fuzz(1000, seed=5)]
    want = measure(data, _Plain(tiny_tokenizer), Trainer.SFT).lengths.tolist()
    real = PieceCounter.counts
    monkeypatch.setattr(PieceCounter, "counts", lambda self, texts, flag: [n + 1 for n in real(self, texts, flag)])
    assert Shortcuts.of(tiny_tokenizer) is not None
    with caplog.at_level(logging.WARNING, logger="jobs.data.tokens.measurement"):
        got = measure(data, tiny_tokenizer, Trainer.SFT).lengths.tolist()
    assert got == want and "disagreed with the tokenizer" in caplog.text


def _lengths(spec: JobSpec, calls: Counter, cache: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The check's measured lengths (`jobs.checks.memory.measured_lengths`), counting row loads and tokenizer loads."""
    from jobs.checks.memory import measured_lengths
    from jobs.data import loading
    from jobs.models.tokenizer import local_tokenizer

    real = getattr(loading.load_data, "unwrapped", loading.load_data)  # a second call wraps the real one again

    def read_rows(spec: JobSpec) -> Any:
        calls["rows"] += 1
        return real(spec)

    def tokenizer() -> Any:
        calls["tokenizer"] += 1
        return local_tokenizer(spec.model)

    read_rows.unwrapped = real  # type: ignore[attr-defined]
    monkeypatch.setattr(loading, "load_data", read_rows)
    monkeypatch.setenv("TUNEDECK_CACHE_DIR", str(cache))
    return measured_lengths(spec, tokenizer)


def test_a_cache_hit_reads_neither_rows_nor_tokenizer_nor_the_data_file(
    data_home: Path, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(digests, "RACY_NS", 0)  # the files written here count as settled at once
    monkeypatch.setattr(digests, "_MEMO", {})  # earlier tests hashed the shared tiny model: noted elsewhere
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows(50)))
    spec = training_helpers.tiny_spec(tiny_model, dataset=str(data), max_train_samples=None)
    calls: Counter = Counter()
    first = _lengths(spec, calls, tmp_path / "cache", monkeypatch)
    assert first is not None and calls == Counter(rows=1, tokenizer=1)

    hashed: list[Path] = []
    real = digests.hash_file
    monkeypatch.setattr(digests, "hash_file", lambda path: hashed.append(Path(path)) or real(path))
    monkeypatch.setattr(digests, "_MEMO", {})  # a new process: only the digest notes on disk are left
    again = _lengths(
        spec.replace(max_length=32, per_device_train_batch_size=2, method="qlora"),
        calls,
        tmp_path / "cache",
        monkeypatch,
    )
    assert again is not None and again.lengths.tolist() == first.lengths.tolist()
    assert calls == Counter(rows=1, tokenizer=1)  # nothing loaded a second time
    assert hashed == []  # nor any file read: the stat matched each digest note


def test_a_file_rewritten_to_the_same_size_and_mtime_is_measured_again(
    data_home: Path, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(digests, "RACY_NS", 0)  # its first digest is remembered: only the stat can tell
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"text": w}) + "\n" for w in ("aaaa bbbb", "cc")))
    spec = training_helpers.tiny_spec(tiny_model, dataset=str(data), max_train_samples=None)
    calls: Counter = Counter()
    before = _lengths(spec, calls, tmp_path / "cache", monkeypatch)
    stat = data.stat()
    data.write_text("".join(json.dumps({"text": w}) + "\n" for w in ("a b c d e", "cc")))  # same size, other tokens
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the old mtime: only ctime tells
    assert data.stat().st_size == stat.st_size and data.stat().st_mtime_ns == stat.st_mtime_ns
    after = _lengths(spec, calls, tmp_path / "cache", monkeypatch)
    assert calls == Counter(rows=2, tokenizer=2)
    assert before is not None and after is not None and after.lengths.tolist() != before.lengths.tolist()


def test_a_digest_note_counts_only_for_its_own_file_and_stat(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("one\n")
    b.write_text("two\n")
    notes = tmp_path / "notes"
    assert digests.file_digest(a, notes) == digests.hash_file(a)
    assert digests.file_digest(b, notes) == digests.hash_file(b)
    a.write_text("three\n")
    assert digests.file_digest(a, notes) == digests.hash_file(a)


def test_a_file_changed_moments_ago_is_hashed_at_every_look(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    data = tmp_path / "fresh.jsonl"
    data.write_text("one\n")
    hashed: list[Path] = []
    real = digests.hash_file
    monkeypatch.setattr(digests, "hash_file", lambda path: hashed.append(path) or real(path))
    for _ in range(2):
        digests.file_digest(data, tmp_path / "notes")
    assert len(hashed) == 2  # within the kernel's clock tick a same-size rewrite would keep the stat
    later = time.time_ns() + 2 * digests.RACY_NS
    monkeypatch.setattr(digests.time, "time_ns", lambda: later)
    for _ in range(2):
        digests.file_digest(data, tmp_path / "notes")
    assert len(hashed) == 3  # settled: hashed once more, then remembered


def test_piece_counts_ignore_the_tokenizers_padding_and_leave_it_set(tiny_tokenizer: Any) -> None:
    from transformers import PreTrainedTokenizerFast

    backend = type(tiny_tokenizer.backend_tokenizer).from_str(tiny_tokenizer.backend_tokenizer.to_str())
    backend.enable_padding(length=64)
    backend.enable_truncation(max_length=3)
    padded = PreTrainedTokenizerFast(tokenizer_object=backend)
    counter = PieceCounter.of(padded)
    assert counter is not None
    texts = TRICKY + fuzz(500, seed=6)
    assert counter.counts(texts, False) == library_counts(tiny_tokenizer, texts, False)
    assert backend.padding is not None and backend.truncation is not None  # the caller's settings stay


def test_the_cycle_collector_comes_back_as_it_was() -> None:
    import gc

    from jobs.data.bulk import collector_paused

    assert gc.isenabled()
    with pytest.raises(KeyError), collector_paused():
        assert not gc.isenabled()
        with collector_paused():  # nested: still off after the inner block
            pass
        assert not gc.isenabled()
        raise KeyError("a loading error")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # it was off before: it stays off
    finally:
        gc.enable()
