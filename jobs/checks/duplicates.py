"""The duplicates step of the checks: repeated training rows and training rows also in the eval data, as warnings.

A run on such data still trains, so these are warnings, not refusals: the rows repeated weigh more than the
others, and eval rows that are also training rows make the eval loss measure memory. Found by the data audit
(`jobs.data.audit.duplicates`) on the rows the data step has checked; each warning names the count, the first
rows and the fix, `dedupe: true`. Nothing is said when the spec sets `dedupe: true` (training drops them), or
for image rows (not compared).

    warnings = duplicate_warnings(spec, infos)     # infos: what the data step read, by field

The warnings are remembered in this process for the fields that choose the rows and the files' sizes and times
(`MEMO_SIZE` specs): a trick sweep or a plan checks many variants of one spec, and the audit reads every row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobs.spec.job import JobSpec

if TYPE_CHECKING:
    from jobs.data.inspection import DatasetInfo

CODES = ("duplicate-rows", "near-duplicate-rows", "eval-overlap")
ROW_FIELDS = ("dataset", "eval_dataset", "dataset_columns", "trainer", "eval_split")  # what chooses the rows read
MEMO_SIZE = 8
_MEMO: dict[tuple[object, ...], list[str]] = {}


def _memo_key(spec: JobSpec) -> tuple[object, ...]:
    """The fields that choose the rows, and each local data file's size and modification time."""
    from pathlib import Path

    from jobs.data.mixing import sources_of

    files = []
    for text in (spec.dataset, spec.eval_dataset):
        for source in sources_of(text) if text and text.strip() else []:
            path = Path(source.ref)
            if path.is_file():
                stat = path.stat()
                files.append((str(path.resolve()), stat.st_size, stat.st_mtime_ns))
    return (*(repr(getattr(spec, f)) for f in ROW_FIELDS), tuple(files))


def duplicate_warnings(spec: JobSpec, infos: dict[str, DatasetInfo]) -> list[str]:
    """One warning per duplicate finding; [] when the data step found problems or `dedupe` is set."""
    from jobs.data.audit.duplicates import duplicate_findings
    from jobs.data.audit.reading import read_rows
    from jobs.data.sources import DataError

    info = infos.get("dataset")
    if spec.dedupe or info is None or info.images.count:
        return []
    key = _memo_key(spec)
    if key in _MEMO:
        return list(_MEMO[key])
    try:
        data = read_rows(spec)
    except DataError:  # the data step named the problem (an eval set it could not read)
        return []
    out = []
    for found in duplicate_findings(data):
        if found.code in CODES:
            out.append(f"{found.problem} ({found.where(data.refs)}); fix: {found.fix}")
    if len(_MEMO) >= MEMO_SIZE:
        _MEMO.pop(next(iter(_MEMO)))
    _MEMO[key] = out
    return list(out)
