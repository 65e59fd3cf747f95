"""Reading the rows an audit compares: each source of `dataset` and `eval_dataset`, read as the checks read it.

Each source is read with `jobs.data.inspection.inspect_dataset` (the same reading, `dataset_columns` and
Alpaca/ShareGPT conversion as `jobs.data.loading`), and cut to its `max_rows` as the mixing cuts it. The eval data
is the spec's `eval_dataset`, or a sample's own eval split, as training reads it; none with `eval_split`.
The rows stream: each is added to the tally (`jobs.data.audit.scanned.AuditData`) as the checks validate it, in
that one pass, and let go; no list of a source's rows is made.

    data = read_rows(spec)           # AuditData: len(.train), len(.eval), .refs per field, the findings' tallies
"""

from __future__ import annotations

from typing import Any

from jobs.data.audit.rows import make_row
from jobs.data.audit.scanned import AuditData
from jobs.data.row_formats import RowFormat
from jobs.spec.enums import Trainer
from jobs.spec.evaluation import default_eval_ref
from jobs.spec.job import JobSpec
from jobs.spec.mixture import DataSource


def _eval_ref(spec: JobSpec) -> str | None:
    if spec.eval_dataset and spec.eval_dataset.strip():
        return spec.eval_dataset.strip()
    return default_eval_ref(spec) if spec.eval_split is None else None


def read_rows(spec: JobSpec) -> AuditData:
    """Every source's rows of `spec`'s training and eval data; DataError as the checks raise it."""
    from jobs.data.mixing import sources_of

    data = AuditData(eval_split=spec.eval_split is not None)
    for field_name, ref in (("dataset", spec.dataset), ("eval_dataset", _eval_ref(spec))):
        if not ref:
            continue
        sources = sources_of(ref, field_name)
        data.refs[field_name] = [s.ref for s in sources]
        counts = data.per_source.setdefault(field_name, [])
        for i, source in enumerate(sources):
            counts.append(_read_source(data, spec, field_name, i, source))
    return data


def _read_source(data: AuditData, spec: JobSpec, field_name: str, index: int, source: DataSource) -> int:
    """The rows of one source added to `data`, up to its `max_rows`: how many."""
    from jobs.data.inspection import inspect_dataset
    from jobs.data.mixing import columns_for
    from jobs.data.thinking import has_thinking

    added = 0

    def visit(number: int, row: dict[str, Any], fmt: RowFormat, extra: list[str]) -> None:
        nonlocal added
        if source.max_rows is not None and added >= source.max_rows:
            return
        seen = make_row(field_name, index, number, row, fmt, extra)
        data.add(seen, field_name == "dataset" and has_thinking(seen.answers))
        added += 1

    checked = inspect_dataset(source.ref, Trainer(spec.trainer), field_name, 5, columns_for(source, spec.column_map), visit=visit)  # fmt: skip
    data.format = data.format or checked.info.format
    return added
