"""Which training rows the token view shows: the spec's own training rows, named as the user's files number them.

The rows are the ones training sees (the caller's `jobs.data.loading.load_data(spec)`: columns mapped, formats converted,
eval_split held out, max_train_samples applied), put back in file order (source, row number) so that
"the first rows" are the file's first rows that training keeps, and `row N` is line N of the (first)
data file. The caller brings the model's tokenizer (`jobs.models.tokenizer.local_tokenizer`).

    viewed = training_views(spec, load_data(spec), tok, first=3)         # ViewedRows: views, origins, total
    viewed = training_views(spec, loaded, tok, numbers=[12])    # row 12 of the first data set; DataError if not trained on
    viewed = views_of(spec, tok, first=3)         # `jobs.data.tokens.streamed_rows`: without loading the data where it can
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from jobs.data.tokens.view import RowView, token_views
from jobs.errors import Problem
from jobs.spec.job import JobSpec


@dataclass(frozen=True)
class ViewedRows:
    views: list[RowView]
    origins: list[tuple[int, int]]  # each view's (source index in `dataset`, row number there)
    total: int  # training rows in all
    tokenizer: Any
    rows: list[dict[str, Any]] = field(default_factory=list)  # the training rows viewed, as trl reads them


def training_views(
    spec: JobSpec, loaded: Any, tokenizer: Any, *, numbers: Sequence[int] | None = None, first: int = 3
) -> ViewedRows:
    """The token views of `numbers` (row numbers of the first data set) or of the first `first` training rows of
    `loaded` (`jobs.data.loading.load_data(spec)`: LoadedData), tokenized by `tokenizer` (the model's). DataError when a row is not a training row."""
    from jobs.data.sources import DataError

    n = len(loaded.train)
    origins = (
        [(int(s), int(r)) for s, r in loaded.origins] if loaded.origins is not None else [(0, i + 1) for i in range(n)]
    )
    if numbers:
        where = {o: i for i, o in enumerate(origins)}
        missing = [k for k in numbers if (0, k) not in where]
        if missing:
            raise DataError([not_trained(spec, missing, n)])
        picked = [where[(0, k)] for k in numbers]
    else:
        picked = sorted(range(n), key=lambda i: origins[i])[: max(first, 0)]
    rows = loaded.train.select(picked).to_list() if picked else []
    return ViewedRows(token_views(spec, rows, tokenizer), [origins[i] for i in picked], n, tokenizer, rows)


def not_trained(spec: JobSpec, missing: Sequence[int], total: int) -> Problem:
    from jobs.data.row_numbers import rows_text

    first = spec.dataset_sources[0].ref if spec.dataset_sources else spec.dataset
    return Problem(
        "row",
        f"{rows_text(list(missing)[:5], len(missing))} of {first} {'is' if len(missing) == 1 else 'are'} not among "
        f"the {total} training rows (held out by eval_split, past max_train_samples, or not in the file)",
        "pick a row number the file has (JSON lines: its line number), or show the first rows without --row",
    )
