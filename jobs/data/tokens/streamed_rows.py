"""The rows a token view shows, read without loading the data set: the memory of a view of a big file is the
rows shown, not the file.

Where a spec trains its one source's rows in the file's order (no `eval_split`, no `dedupe`: a single source is
never shuffled, `max_rows` and `max_train_samples` keep its first rows), the training rows are a prefix of the
file: the first rows shown are its first rows, and row N is trained when it lies within that prefix. The file is
then validated as the checks validate it, one row at a time (a DataError as `load_data` raises it, the eval data's
included), and only the rows up to the last one shown are read again and shaped as `load_data` shapes them
(`jobs.data.loading`: trl's columns and types, `thinking` applied). Any other spec: None, and the caller loads the
data (`views_of` does both).

    picked = streamed_rows(spec, numbers=[12])       # Picked: rows, origins, total; or None
    viewed = views_of(spec, tokenizer, first=3)      # viewed_rows.ViewedRows, the data loaded only where it must be
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jobs.data.tokens.view import token_views
from jobs.data.tokens.viewed_rows import ViewedRows, not_trained, training_views
from jobs.spec.job import JobSpec


@dataclass(frozen=True)
class Picked:
    rows: list[dict[str, Any]]  # as trl reads them
    origins: list[tuple[int, int]]  # (source index, row number) of each
    total: int  # training rows in all


def streams(spec: JobSpec) -> bool:
    """Whether `spec`'s training rows are its one source's first rows, in the file's order."""
    from jobs.data.mixing import sources_of

    return spec.eval_split is None and not spec.dedupe and len(sources_of(spec.dataset, "dataset")) == 1


def streamed_rows(spec: JobSpec, numbers: Sequence[int] | None = None, first: int = 3) -> Picked | None:
    """The training rows `numbers` (row numbers of the file) or the first `first`; None when the spec needs the
    whole data set loaded (`streams`). DataError as `load_data` raises it, or when a row is not trained on."""
    from jobs.data.inspection import inspect_dataset
    from jobs.data.loading import check_sources, eval_ref_of, shaped, with_thinking
    from jobs.data.mixing import capped, columns_for

    if not streams(spec):
        return None
    ((source, info),) = check_sources(spec.dataset, spec.trainer, spec.column_map)  # every row validated, none kept
    eval_ref = eval_ref_of(spec)
    if eval_ref:
        check_sources(eval_ref, spec.trainer, spec.column_map, field="eval_dataset")
    total = capped(info.n_rows, source)
    if spec.max_train_samples is not None:
        total = min(total, spec.max_train_samples)
    wanted = list(numbers or [])
    limit = max(wanted) if wanted else max(first, 1)  # row N is at most the file's N-th row
    read = inspect_dataset(source.ref, spec.trainer, "dataset", 5, columns_for(source, spec.column_map), True, limit)
    read.info = info  # what the whole file holds (tool schemas, reward columns): the columns trl is given
    ds, _, found = shaped(read, "dataset")
    ds = with_thinking(spec, ds)  # its problems first, as load_data raises them
    numbers_read = found if found is not None else list(range(1, len(ds) + 1))
    position = {n: i for i, n in enumerate(numbers_read) if i < total}
    if wanted:
        missing = [k for k in wanted if k not in position]
        if missing:
            from jobs.data.sources import DataError

            raise DataError([not_trained(spec, missing, total)])
        picked = [position[k] for k in wanted]
    else:
        picked = list(range(min(max(first, 0), total, len(ds))))
    rows = ds.select(picked).to_list() if picked else []
    return Picked(rows, [(0, numbers_read[i]) for i in picked], total)


def views_of(spec: JobSpec, tokenizer: Any, *, numbers: Sequence[int] | None = None, first: int = 3) -> ViewedRows:
    """`training_views` of `spec`'s data: the rows shown read alone where the spec allows it
    (`jobs.data.tokens.streamed_rows`: a big file is not loaded to show three rows), else from `load_data(spec)`."""
    from jobs.data.loading import load_data

    picked = streamed_rows(spec, numbers, first)
    if picked is None:
        return training_views(spec, load_data(spec), tokenizer, numbers=numbers, first=first)
    return ViewedRows(token_views(spec, picked.rows, tokenizer), picked.origins, picked.total, tokenizer, picked.rows)
