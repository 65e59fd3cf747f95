"""The duplicates step of the checks: repeated training rows and training rows also in the eval data, as warnings.

A run on such data still trains, so these are warnings, not refusals: the rows repeated weigh more than the
others, and eval rows that are also training rows make the eval loss measure memory. Found by the data audit
(`jobs.data.audit.duplicates`) on the rows the data step has checked; each warning names the count, the first
rows and the fix, `dedupe: true`. Nothing is said when the spec sets `dedupe: true` (training drops them), or
for image rows (not compared).

    warnings = duplicate_warnings(spec, infos)     # infos: what the data step read, by field
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobs.spec.job import JobSpec

if TYPE_CHECKING:
    from jobs.data.inspection import DatasetInfo

CODES = ("duplicate-rows", "near-duplicate-rows", "eval-overlap")


def duplicate_warnings(spec: JobSpec, infos: dict[str, DatasetInfo]) -> list[str]:
    """One warning per duplicate finding; [] when the data step found problems or `dedupe` is set."""
    from jobs.data.audit.duplicates import duplicate_findings
    from jobs.data.audit.reading import read_rows
    from jobs.data.sources import DataError

    info = infos.get("dataset")
    if spec.dedupe or info is None or info.images.count:
        return []
    try:
        data = read_rows(spec)
    except DataError:  # the data step named the problem (an eval set it could not read)
        return []
    out = []
    for found in duplicate_findings(data):
        if found.code in CODES:
            out.append(f"{found.problem} ({found.where(data.refs)}); fix: {found.fix}")
    return out
