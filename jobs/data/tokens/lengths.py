"""What the training rows' token lengths say: the worst micro-batch they can form, and their spread.

The memory predictor (`jobs.memory.predict`) sizes activations and logits by the tokens of one
micro-batch. trl pads each batch only to its longest row, so the peak of a real job is set by its
longest rows, not by `max_length`: 300-token rows under `max_length: 4096` need a tenth of the
worst-case figure. `RowLengths` holds each row's untruncated lengths, per sequence the trainer builds
from it, and its prompt's (measured once by `jobs.data.tokens.measurement`), so truncation at any
`max_length` and any batch size is applied here without tokenizing again.

    lengths.stats(spec.max_length)                # LengthStats: longest, p50, p95, truncated rows
    lengths.worst_batch(spec)                     # TokenBatch(sequences=8, length=57, ...)
    lengths.answers_cut(spec.max_length)          # AnswersCut: rows whose prompt fills max_length
    worst_case_batch(spec)                        # the bound without data: every row max_length long

Nothing here imports `datasets` or a tokenizer: the memory package reads `RowLengths`/`TokenBatch` as
plain values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jobs.spec.job import JobSpec
from jobs.spec.trainer_records import record_for

# The spec fields `RowLengths.worst_batch` reads; how many figures one RowLengths remembers.
BATCH_FIELDS = ("per_device_train_batch_size", "trainer", "max_length", "packing", "padding_free")
MEMO_SIZE = 64


@dataclass(frozen=True)
class TokenBatch:
    """One micro-batch as the model sees it: `sequences` rows padded to `length` tokens (padding-free:
    one row of every token)."""

    sequences: int
    length: int
    basis: str  # how it was found, in words

    @property
    def tokens(self) -> int:
        return self.sequences * self.length


@dataclass(frozen=True)
class LengthStats:
    """The rows' lengths after truncation at `max_length` (per row: its longest sequence)."""

    rows: int
    longest: int
    p50: int
    p95: int
    mean: float
    truncated: int  # rows with a sequence longer than max_length
    max_length: int | None
    longest_untruncated: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "longest": self.longest,
            "p50": self.p50,
            "p95": self.p95,
            "mean": round(self.mean, 1),
            "truncated": self.truncated,
            "max_length": self.max_length,
            "longest_untruncated": self.longest_untruncated,
        }

    def summary(self) -> str:
        """'longest row 57 tokens; p50 41, p95 55 over 200 rows'."""
        cut = f"; {self.truncated} cut at max_length {self.max_length}" if self.truncated else ""
        return f"longest row {self.longest} tokens; p50 {self.p50}, p95 {self.p95} over {self.rows} rows{cut}"


@dataclass(frozen=True)
class AnswersCut:
    """The rows (0-based, in training order) that keep no answer token under one max_length, and the
    max_length that keeps 95% of them whole (the p95 of their untruncated lengths); `origins`: where each of
    those rows comes from, (source index in `dataset`, row number there), None when not known."""

    rows: int
    lost: tuple[int, ...]
    keeps: int | None
    origins: tuple[tuple[int, int], ...] | None = None


@dataclass(frozen=True)
class RowLengths:
    """Untruncated token lengths of each training row's sequences: an (rows, k) int array, k = 1 or 2
    (a pair's chosen and rejected); `prompts`: each row's prompt length (0: no prompt, or not measured);
    `origins`: each row's (source index in `dataset`, row number in that source), an (rows, 2) int array
    (`jobs.data.mixing.origins_of`), None when not known."""

    lengths: np.ndarray
    prompts: np.ndarray | None = None
    origins: np.ndarray | None = None
    # Figures already worked out, by their arguments: the planner predicts ~50 variants of one spec, and on
    # 100k rows each figure is a pass over the array. Sound because the array is made read-only here.
    _memo: dict[tuple[Any, ...], Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for array in (self.lengths, self.prompts, self.origins):
            if array is not None:
                array.flags.writeable = False
        if self.origins is not None and self.origins.shape != (self.rows, 2):
            raise ValueError(f"origins of shape {self.origins.shape} for {self.rows} rows")

    def _remembered(self, key: tuple[Any, ...], work: Callable[[], Any]) -> Any:
        if key not in self._memo:
            if len(self._memo) > MEMO_SIZE:  # each new max_length adds entries: keep the latest only
                self._memo.clear()
            self._memo[key] = work()
        return self._memo[key]

    @classmethod
    def of(
        cls,
        rows: Iterable[Sequence[int]],
        prompts: Sequence[int] | None = None,
        origins: Sequence[tuple[int, int]] | np.ndarray | None = None,
    ) -> RowLengths:
        data = [tuple(int(x) for x in row) for row in rows]
        width = max((len(r) for r in data), default=1)
        array = np.zeros((len(data), width), dtype=np.int64)
        for i, row in enumerate(data):
            array[i, : len(row)] = row
        found = np.asarray(origins, dtype=np.int64).reshape(-1, 2) if origins is not None else None
        return cls(array, np.asarray(prompts, dtype=np.int64) if prompts is not None else None, found)

    def prompt_lengths(self) -> np.ndarray:
        """Each row's prompt length (zeros when the prompts were not measured)."""
        return self.prompts if self.prompts is not None else np.zeros(self.rows, dtype=np.int64)

    def answers_cut(self, max_length: int | None, *, dropped_when_long: bool = False) -> AnswersCut:
        """The rows whose whole answer `max_length` cuts away: the prompt alone fills it (trl truncates the end).
        `dropped_when_long`: the trainer drops every row with a sequence over max_length instead (reward)."""
        return self._remembered(
            ("answers", max_length, dropped_when_long), lambda: self._answers_cut(max_length, dropped_when_long)
        )

    def _answers_cut(self, max_length: int | None, dropped_when_long: bool) -> AnswersCut:
        if not max_length or not self.rows:
            return AnswersCut(self.rows, (), None)
        full = self.lengths.max(axis=1)
        lost = full > max_length if dropped_when_long else self.prompt_lengths() >= max_length
        where = np.flatnonzero(lost)
        keeps = int(np.percentile(full[where], 95, method="higher")) if where.size else None
        origins = None if self.origins is None else tuple((s, n) for s, n in self.origins[where].tolist())
        return AnswersCut(self.rows, tuple(int(i) for i in where), keeps, origins)

    @property
    def rows(self) -> int:
        return int(self.lengths.shape[0])

    def _cut(self, max_length: int | None) -> np.ndarray:
        if not max_length:
            return self.lengths
        return self._remembered(("cut", max_length), lambda: np.minimum(self.lengths, max_length))

    def stats(self, max_length: int | None) -> LengthStats:
        return self._remembered(("stats", max_length), lambda: self._stats(max_length))

    def _stats(self, max_length: int | None) -> LengthStats:
        longest_per_row = self._cut(max_length).max(axis=1) if self.rows else np.zeros(1, dtype=np.int64)
        raw = self.lengths.max(axis=1) if self.rows else np.zeros(1, dtype=np.int64)
        return LengthStats(
            rows=self.rows,
            longest=int(longest_per_row.max()),
            p50=int(np.percentile(longest_per_row, 50, method="higher")),
            p95=int(np.percentile(longest_per_row, 95, method="higher")),
            mean=float(longest_per_row.mean()),
            truncated=int((raw > max_length).sum()) if max_length else 0,
            max_length=max_length,
            longest_untruncated=int(raw.max()),
        )

    def worst_batch(self, spec: JobSpec) -> TokenBatch:
        """The largest micro-batch `spec`'s trainer can form from these rows (the most tokens at once)."""
        key = ("batch", *(getattr(spec, f) for f in BATCH_FIELDS))
        return self._remembered(key, lambda: self._worst_batch(spec))

    def _worst_batch(self, spec: JobSpec) -> TokenBatch:
        b = spec.per_device_train_batch_size
        record = record_for(spec.trainer)
        if record.generates:  # prompts kept whole; each completion up to max_completion_length
            longest = int(self.lengths.max()) if self.rows else 0
            return TokenBatch(b, longest, f"longest prompt {longest} tokens (grpo keeps prompts whole)")
        cut = self._cut(spec.max_length)
        if "packing" in record.kwargs and spec.packing:
            # Packing fills blocks of max_length from the rows (flattened, padding-free): at most
            # b blocks, at most every token there is.
            total = int(cut.sum())
            tokens = min(b * spec.max_length, total)
            return TokenBatch(1, tokens, f"packing: {b} blocks of up to max_length {spec.max_length}")
        per_row = cut.max(axis=1)
        k = 2 if record.paired else 1  # chosen and rejected in one padded batch
        if spec.padding_free:  # one flat row of the batch's tokens: the b rows with the most tokens
            tokens = int(np.sort(cut.sum(axis=1))[-b:].sum())
            return TokenBatch(1, tokens, f"padding-free: the {b} longest rows' {tokens} tokens")
        longest = int(per_row.max()) if self.rows else 0
        rows = min(b, self.rows) if self.rows else b
        what = "chosen and rejected of the longest pairs" if k == 2 else "the longest rows"
        return TokenBatch(rows * k, longest, f"{what}, padded to the longest ({longest} tokens)")


def worst_case_batch(spec: JobSpec) -> TokenBatch:
    """The bound any data up to max_length can reach: every row max_length tokens long."""
    record = record_for(spec.trainer)
    k = 2 if record.paired else 1  # chosen and rejected in one padded batch
    b = spec.per_device_train_batch_size
    if record.generates:
        return TokenBatch(b, spec.max_length, f"prompts taken as max_length {spec.max_length} tokens")
    if spec.padding_free or ("packing" in record.kwargs and spec.packing):
        return TokenBatch(1, b * spec.max_length, f"{b} rows of max_length {spec.max_length}, flattened")
    return TokenBatch(b * k, spec.max_length, f"every row max_length {spec.max_length} tokens")
