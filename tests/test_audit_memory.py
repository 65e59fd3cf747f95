"""The data audit and the token view stream (issue 43, part 4: the dashboard's memory stays bounded): auditing
twice the rows costs about a kilobyte more per row, not the rows themselves; showing a file's first rows or row N
costs the same whatever the file's size. Measured with tracemalloc (Python's and numpy's allocations), so the
bounds hold on any machine, however loaded."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

from jobs.data.audit.report import audit
from jobs.spec.job import JobSpec


def write(path: Path, n: int) -> int:
    """`n` distinct chat rows of about 8 KB each (no finding among them); the file's size."""
    with path.open("w") as fh:
        for i in range(n):
            answer = " ".join(f"w{i}x{k}" for k in range(900))
            row = {"messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": answer}]}
            fh.write(json.dumps(row) + "\n")
    return path.stat().st_size


def peak_of(spec: JobSpec) -> int:
    tracemalloc.start()
    try:
        assert audit(spec).findings == []
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def view_peak(spec: JobSpec, row: int) -> int:
    from jobs.checks.shown_data import tokens_record

    tracemalloc.start()
    try:
        shown = tokens_record(spec, [row] if row else ())
        assert [r["row"] for r in shown["rows"]] == ([row] if row else [1, 2, 3])
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_audit_holds_no_row(tmp_path: Path) -> None:
    write(tmp_path / "warm.jsonl", 3)
    audit(JobSpec(dataset=str(tmp_path / "warm.jsonl")))  # the imports, outside the measure
    small, large = tmp_path / "small.jsonl", tmp_path / "large.jsonl"
    grown = write(large, 600) - write(small, 300)  # ~2.4 MB more
    more = peak_of(JobSpec(dataset=str(large))) - peak_of(JobSpec(dataset=str(small)))
    # Holding the rows (as read, or their text) grows the peak by the file's growth or more; the tally of a
    # streamed row is its key, place, length and MinHash signature: under 1 KB of each 8 KB row.
    assert more < grown / 4, f"the peak grew {more / 2**20:.1f} MiB for {grown / 2**20:.1f} MiB more rows"


def test_the_token_view_reads_only_the_rows_shown(tmp_path: Path, tiny_model: Path) -> None:
    small, large = tmp_path / "small.jsonl", tmp_path / "large.jsonl"
    grown = write(large, 400) - write(small, 200)  # ~1.5 MB more
    spec = {"model": str(tiny_model), "max_length": 64}
    from jobs.checks.shown_data import tokens_record

    tokens_record(JobSpec(dataset=str(small), **spec))  # the imports, outside the measure
    for row in (0, 150):  # the first rows, and a row by its number
        more = view_peak(JobSpec(dataset=str(large), **spec), row) - view_peak(JobSpec(dataset=str(small), **spec), row)
        # loading the data set (`load_data`) holds every row; the file is only validated row by row here
        assert more < grown / 4, (
            f"row {row}: the peak grew {more / 2**20:.1f} MiB for {grown / 2**20:.1f} MiB more rows"
        )
