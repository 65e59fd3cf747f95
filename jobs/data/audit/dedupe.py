"""`dedupe: true`: the training rows without their duplicates, before training (`jobs.data.loading`).

Drops what the audit's duplicate findings name (`jobs.data.audit.duplicates`): every later exact copy of a
training row, the later rows of each near-duplicate group, and every training row also in the eval data
(exactly or nearly), keeping the first of each in file order (a mixture's rows are compared in the order of
`dataset`'s sources and their rows, not in the shuffled order). Rows are compared as trl reads them (`rows.row_key`), so the
audit and the training drop the same rows. Image rows are kept as they are (two rows with the same words may
hold different pictures). Logs how many rows were dropped, and why.

    train = deduped(train, eval_ds, RowFormat.MESSAGES, origins_of(train))
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from jobs.data.audit.copies import find
from jobs.data.audit.rows import key_of, trl_columns, words_of
from jobs.data.row_formats import COLUMNS, RowFormat

if TYPE_CHECKING:
    import datasets

log = logging.getLogger(__name__)


def _keys_and_texts(ds: datasets.Dataset, fmt: RowFormat, extra: Sequence[str]) -> tuple[list[bytes], list[str]]:
    columns = [c for c in (*COLUMNS[fmt], "tools") if c in ds.column_names]
    extra = [c for c in extra if c in ds.column_names]
    keys, texts = [], []
    for row in ds.select_columns(columns + extra):
        trl = trl_columns(row, fmt, extra)
        keys.append(key_of(trl))
        texts.append(words_of(trl, fmt, extra))
    return keys, texts


def _file_order(n: int, origins: np.ndarray | None) -> list[int]:
    """The rows' indices by (source, row number) when their origins are known (`jobs.data.mixing`), else as is."""
    if origins is None:
        return list(range(n))
    return [int(i) for i in np.lexsort((origins[:, 1], origins[:, 0]))]


def deduped(
    train: datasets.Dataset,
    eval_ds: datasets.Dataset | None,
    fmt: RowFormat,
    origins: np.ndarray | None = None,
    extra: Sequence[str] = (),
) -> datasets.Dataset:
    """`train` without its duplicates and without the rows also in `eval_ds`; `origins`: each training row's
    (source index, row number), `jobs.data.mixing.origins_of`; `extra`: grpo's reward columns, compared too."""
    if "images" in train.column_names:
        log.info("dedupe: image rows are kept as they are (not compared)")
        return train
    keys, texts = _keys_and_texts(train, fmt, extra)
    eval_keys, eval_texts = _keys_and_texts(eval_ds, fmt, extra) if eval_ds is not None and len(eval_ds) else ([], [])
    order = _file_order(
        len(train), origins
    )  # the first of each in the files, as the audit names them, not in the mixed order
    found = find([keys[i] for i in order], [texts[i] for i in order], eval_keys, eval_texts)
    dropped = sorted(order[i] for i in found.dropped())
    near = len({i for group in found.near for i in group[1:]} - set(found.exact))
    log.info(
        "dedupe: dropped %d of %d training rows (%d exact copies, %d near copies, %d also in the eval data)",
        len(dropped),
        len(train),
        len(found.exact),
        near,
        len(set(found.overlap) | set(found.near_overlap)),
    )
    if not dropped:
        return train
    gone = set(dropped)
    return train.select([i for i in range(len(train)) if i not in gone])
