"""Reading the rows an audit compares: each source of `dataset` and `eval_dataset`, read as the checks read it.

Each source is read with `jobs.data.inspection.inspect_dataset` (the same reading, `dataset_columns` and
Alpaca/ShareGPT conversion as `jobs.data.loading`), and cut to its `max_rows` as the mixing cuts it. The eval data
is the spec's `eval_dataset`, or a sample's own eval split, as training reads it; none with `eval_split`.

    data = read_rows(spec)           # AuditData: .train, .eval (lists of Row), .refs per field
"""

from __future__ import annotations

from jobs.data.audit.rows import AuditData, make_row
from jobs.spec.enums import Trainer
from jobs.spec.evaluation import default_eval_ref
from jobs.spec.job import JobSpec


def _eval_ref(spec: JobSpec) -> str | None:
    if spec.eval_dataset and spec.eval_dataset.strip():
        return spec.eval_dataset.strip()
    return default_eval_ref(spec) if spec.eval_split is None else None


def read_rows(spec: JobSpec) -> AuditData:
    """Every source's rows of `spec`'s training and eval data; DataError as the checks raise it."""
    from jobs.data.inspection import inspect_dataset
    from jobs.data.mixing import capped, columns_for, sources_of

    data = AuditData(eval_split=spec.eval_split is not None)
    for field_name, ref in (("dataset", spec.dataset), ("eval_dataset", _eval_ref(spec))):
        if not ref:
            continue
        sources = sources_of(ref, field_name)
        data.refs[field_name] = [s.ref for s in sources]
        counts = data.per_source.setdefault(field_name, [])
        out = data.train if field_name == "dataset" else data.eval
        for i, source in enumerate(sources):
            mapping = columns_for(source, spec.column_map)
            checked = inspect_dataset(source.ref, Trainer(spec.trainer), field_name, 5, mapping, keep_rows=True)
            fmt = checked.info.format
            data.format = data.format or fmt
            limit = capped(checked.info.n_rows, source)
            before = len(out)
            for number, row in checked.rows():
                if len(out) - before >= limit:
                    break
                out.append(make_row(field_name, i, number, row, fmt, checked.info.reward_columns))
            counts.append(len(out) - before)
    return data
