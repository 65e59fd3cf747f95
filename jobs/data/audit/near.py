"""Near-duplicate rows: MinHash signatures of each row's word pairs, grouped by LSH bands.

A row's text is lowercased and split into words; its shingles are its word pairs (a one-word row: the word).
Two rows whose shingle sets overlap by `THRESHOLD` (Jaccard) or more are near-duplicates: one word changed in a
30-word answer keeps about 87% of the pairs. The MinHash signature (`NUM_PERM` hashes) estimates that overlap;
LSH bands find the candidate pairs without comparing every pair, each candidate is then kept only when its
signatures agree on at least `THRESHOLD` of the hashes, and the kept pairs join into groups.

datasketch's `MinHashLSH` chooses the bands (the split of the signature), weighted to miss few pairs: at 87%
overlap 99% of the pairs become candidates, and the false candidates are dropped by the check above. The signatures and the banding are computed here with numpy over all rows
at once: datasketch's per-row `MinHash.update_batch` and `MinHashLSH.insert` measured 0.3 ms and 0.07 ms per row
on this machine, 39 s for 100k rows where the audit's goal is under 10 s for all its findings.

    groups = near_groups(texts)      # [[0, 7], [3, 4, 9]]: indices of near-identical texts (empty texts: never)
    signed = Signatures(); signed.add(chunk); ...; signed_groups(signed)   # the same, a chunk of rows at a time
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import numpy as np

NUM_PERM = 64
THRESHOLD = 0.8
CHUNK = 4096  # rows hashed per numpy pass (memory: about 40 bytes per character of the chunk)
CHUNK_CHARS = 1 << 20  # characters per pass at most: a stream of long rows is signed ~40 MB at a time
_P = np.uint64(1099511628211)  # odd: invertible modulo 2**64
_P_INV = np.uint64(pow(1099511628211, -1, 2**64))
_PAIR = np.uint64(0x9E3779B97F4A7C15)


@cache
def bands(threshold: float = THRESHOLD, num_perm: int = NUM_PERM) -> tuple[int, int]:
    """(bands, rows per band) datasketch's LSH picks for `threshold`, missing few pairs: candidates are verified."""
    from datasketch import MinHashLSH

    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm, weights=(0.1, 0.9))
    return lsh.b, lsh.r


def _permutations(num_perm: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    a = rng.integers(1, 2**63, size=num_perm, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    b = rng.integers(0, 2**63, size=num_perm, dtype=np.uint64)
    return a, b


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every bit of a word's hash reaches every bit."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def _shingles(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(each shingle's hash, its row's index in `texts`), in row order; rows without words have none."""
    joined = "\n".join(" ".join(t.lower().split()) for t in texts).encode("utf-8", "surrogatepass")
    a = np.frombuffer(joined, dtype=np.uint8)
    if not len(a):
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    word = (a != 32) & (a != 10)
    before = np.concatenate(([False], word[:-1]))
    after = np.concatenate((word[1:], [False]))
    starts = np.flatnonzero(word & ~before)
    ends = np.flatnonzero(word & ~after) + 1
    rows = np.cumsum(a == 10)[starts]
    with np.errstate(over="ignore"):
        powers = np.full(len(a) + 1, _P, dtype=np.uint64)
        powers[0] = 1
        powers = np.cumprod(powers)
        inverse = np.full(len(a) + 1, _P_INV, dtype=np.uint64)
        inverse[0] = 1
        inverse = np.cumprod(inverse)
        prefix = np.concatenate(([np.uint64(0)], np.cumsum(a.astype(np.uint64) * powers[:-1])))
        words = _mix((prefix[ends] - prefix[starts]) * inverse[starts] + (ends - starts).astype(np.uint64))
        same = rows[:-1] == rows[1:]
        pairs = words[:-1][same] * _PAIR + words[1:][same]
    counts = np.bincount(rows, minlength=len(texts))
    single = np.flatnonzero(counts == 1)
    lone = words[np.isin(rows, single)]
    hashes = np.concatenate((pairs, lone))
    owners = np.concatenate((rows[:-1][same], rows[np.isin(rows, single)]))
    order = np.argsort(owners, kind="stable")
    return hashes[order], owners[order]


def signatures(texts: Sequence[str], num_perm: int = NUM_PERM) -> tuple[np.ndarray, np.ndarray]:
    """(the (rows, num_perm) MinHash signatures, whether each row has any word)."""
    a, b = _permutations(num_perm)
    out = np.full((len(texts), num_perm), np.iinfo(np.uint64).max, dtype=np.uint64)
    has = np.zeros(len(texts), dtype=bool)
    for first in range(0, len(texts), CHUNK):
        hashes, owners = _shingles(texts[first : first + CHUNK])
        if not len(hashes):
            continue
        cuts = np.flatnonzero(np.concatenate(([True], owners[1:] != owners[:-1])))
        present = owners[cuts] + first
        has[present] = True
        with np.errstate(over="ignore"):
            for k in range(num_perm):
                out[present, k] = np.minimum.reduceat(hashes * a[k] + b[k], cuts)
    return out, has


class Signatures:
    """MinHash signatures added a chunk of texts at a time (`add`), held as those chunks: a stream of rows is
    signed as it is read, and nothing holds every row's text or a second copy of every signature."""

    def __init__(self) -> None:
        self._chunks: list[np.ndarray] = []
        self._has: list[np.ndarray] = []
        self._starts: list[int] = []
        self.rows = 0

    def add(self, texts: Sequence[str]) -> None:
        if not len(texts):
            return
        sig, has = signatures(texts)
        self._chunks.append(sig)
        self._has.append(has)
        self._starts.append(self.rows)
        self.rows += len(texts)

    def has(self) -> np.ndarray:
        """Whether each row has any word."""
        return np.concatenate(self._has) if self._has else np.zeros(0, dtype=bool)

    def columns(self, index: np.ndarray, low: int, high: int) -> np.ndarray:
        """The hashes `low` to `high` of the rows `index` (sorted)."""
        return self.take(index, slice(low, high))

    def take(self, index: np.ndarray, cols: slice = slice(None)) -> np.ndarray:
        """The signatures (columns `cols`) of the rows `index`, in that order."""
        starts = np.asarray(self._starts, dtype=np.int64)
        which = np.searchsorted(starts, index, side="right") - 1
        width = len(range(NUM_PERM)[cols])
        out = np.empty((len(index), width), dtype=np.uint64)
        for k in np.unique(which):
            picked = which == k
            out[picked] = self._chunks[k][index[picked] - starts[k], cols]
        return out


def near_groups(texts: Sequence[str], threshold: float = THRESHOLD) -> list[list[int]]:
    """Groups (two or more, sorted) of indices of `texts` whose word pairs overlap by about `threshold`."""
    signed = Signatures()
    for first in range(0, len(texts), CHUNK):
        signed.add(texts[first : first + CHUNK])
    return signed_groups(signed, threshold)


def signed_groups(signed: Signatures, threshold: float = THRESHOLD) -> list[list[int]]:
    """`near_groups` of rows signed already (`Signatures`): indices in the order they were added."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    if signed.rows < 2:
        return []
    n_bands, width = bands(threshold)
    index = np.flatnonzero(signed.has())
    if len(index) < 2:  # rows without words are never near-duplicates
        return []
    left: list[np.ndarray] = []
    right: list[np.ndarray] = []
    for band in range(n_bands):
        keys = np.zeros(len(index), dtype=np.uint64)
        with np.errstate(over="ignore"):
            for col in signed.columns(index, band * width, (band + 1) * width).T:
                keys = keys * _PAIR + col
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        starts = np.concatenate(([True], sorted_keys[1:] != sorted_keys[:-1]))
        first = order[np.maximum.accumulate(np.where(starts, np.arange(len(order)), 0))]
        member = ~starts
        left.append(index[first[member]])
        right.append(index[order[member]])
    i, j = np.concatenate(left), np.concatenate(right)
    if not len(i):
        return []
    close = (signed.take(i) == signed.take(j)).mean(axis=1) >= threshold
    i, j = i[close], j[close]
    n = signed.rows
    graph = coo_matrix((np.ones(len(i)), (i, j)), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    sizes = np.bincount(labels)
    groups: dict[int, list[int]] = {}
    for row in np.flatnonzero(sizes[labels] > 1):
        groups.setdefault(int(labels[row]), []).append(int(row))
    return sorted(groups.values())
