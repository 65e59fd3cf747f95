"""Finding copies in a stream of rows: exact copies by key, near copies by MinHash, and the eval rows in both.

Each training row, then each eval row, is added with its key (`jobs.data.audit.rows.key_of`) and its words; a
row is not held: its key goes into a 16-byte slot (and a dict of the first row of each key), the words of a
distinct row into a chunk that is signed (`jobs.data.audit.near.Signatures`) once `CHUNK` rows or
`CHUNK_CHARS` characters are waiting.
Exact copies share their key; near copies are found among the distinct training rows and the eval rows. A
training row whose key (or, nearly, whose words) is also an eval row's is in both: the eval loss then measures
memory. `Duplicates.dropped` is what `dedupe: true` removes: every later copy, exact or near, and every training
row also in the eval data, keeping the first of each.

    scan = CopyScan()
    for key, text in train: scan.add_train(key, text)
    for key, text in evals: scan.add_eval(key, text)     # after every training row
    found = scan.result()                                 # Duplicates: indices into the training (and eval) rows
    found = find(train_keys, train_texts, eval_keys, eval_texts)   # the same, from lists
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass

from jobs.data.audit.near import CHUNK, CHUNK_CHARS, THRESHOLD, Signatures, signed_groups

KEY = 16  # bytes of a row's key (`jobs.data.audit.rows.key_of`)


@dataclass(frozen=True)
class Duplicates:
    """Indices into the training rows (and the eval rows): what repeats, and what to drop."""

    exact: list[int]  # training rows that repeat an earlier training row exactly
    near: list[list[int]]  # groups of distinct training rows that are near-identical
    overlap: list[int]  # training rows whose exact copy is in the eval data
    near_overlap: list[int]  # training rows nearly identical to an eval row
    eval_rows: list[int]  # the eval rows in either overlap

    def dropped(self) -> list[int]:
        later = [i for group in self.near for i in group[1:]]
        return sorted(set(self.exact) | set(later) | set(self.overlap) | set(self.near_overlap))


class CopyScan:
    """The keys and signatures of a stream of rows: training rows first, then eval rows."""

    def __init__(self) -> None:
        self.first: dict[bytes, int] = {}  # each training key's first row
        self.exact: list[int] = []
        self._train_keys = bytearray()
        self._eval_keys = bytearray()
        self._eval_set: set[bytes] = set()
        self._distinct = array("q")  # the training rows signed, in order
        self._waiting: list[str] = []
        self._waiting_chars = 0
        self._signed = Signatures()
        self._evals_begun = False

    @property
    def train_rows(self) -> int:
        return len(self._train_keys) // KEY

    def train_key(self, index: int) -> bytes:
        return bytes(self._train_keys[index * KEY : (index + 1) * KEY])

    def add_train(self, key: bytes, text: str) -> None:
        if self._evals_begun:
            raise RuntimeError("training rows are added before the eval rows")
        if len(key) != KEY:
            raise ValueError(f"a row key is {KEY} bytes, not {len(key)}")
        index = self.train_rows
        self._train_keys += key
        if key in self.first:
            self.exact.append(index)
            return
        self.first[key] = index
        self._distinct.append(index)
        self._wait(text)

    def add_eval(self, key: bytes, text: str) -> None:
        if not self._evals_begun:
            self._flush()
            self._evals_begun = True
        if len(key) != KEY:
            raise ValueError(f"a row key is {KEY} bytes, not {len(key)}")
        self._eval_keys += key
        self._eval_set.add(key)
        self._wait(text)

    def _wait(self, text: str) -> None:
        self._waiting.append(text)
        self._waiting_chars += len(text)
        if len(self._waiting) >= CHUNK or self._waiting_chars >= CHUNK_CHARS:
            self._flush()

    def _flush(self) -> None:
        self._signed.add(self._waiting)
        self._waiting, self._waiting_chars = [], 0

    def result(self, threshold: float = THRESHOLD) -> Duplicates:
        """The duplicates among the training rows, and between them and the eval rows."""
        self._flush()
        in_eval, keys = self._eval_set, self._train_keys
        overlap = [i for i in range(self.train_rows) if in_eval and bytes(keys[i * KEY : (i + 1) * KEY]) in in_eval]
        evals = self._eval_keys
        eval_hit = {j for j in range(len(evals) // KEY) if bytes(evals[j * KEY : (j + 1) * KEY]) in self.first}
        distinct = self._distinct
        near: list[list[int]] = []
        near_overlap: set[int] = set()
        for group in signed_groups(self._signed, threshold):
            train = [distinct[k] for k in group if k < len(distinct)]
            found = [k - len(distinct) for k in group if k >= len(distinct)]
            if len(train) > 1:
                near.append(train)
            if found and train:
                near_overlap.update(i for i in train if self.train_key(i) not in in_eval)
                eval_hit.update(found)
        return Duplicates(list(self.exact), near, overlap, sorted(near_overlap), sorted(eval_hit))


def find(
    train_keys: Iterable[bytes],
    train_texts: Iterable[str],
    eval_keys: Iterable[bytes] = (),
    eval_texts: Iterable[str] = (),
    threshold: float = THRESHOLD,
) -> Duplicates:
    """The duplicates among the training rows, and between them and the eval rows."""
    scan = CopyScan()
    for key, text in zip(train_keys, train_texts, strict=True):
        scan.add_train(key, text)
    for key, text in zip(eval_keys, eval_texts, strict=True):
        scan.add_eval(key, text)
    return scan.result(threshold)
