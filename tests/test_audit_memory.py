"""The data audit streams (issue 43, part 4: the dashboard's memory stays bounded): auditing twice the rows costs
about a kilobyte more per row, not the rows themselves. Measured with tracemalloc (Python's and numpy's
allocations), so the bound holds on any machine, however loaded."""

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


def test_the_audit_holds_no_row(tmp_path: Path) -> None:
    write(tmp_path / "warm.jsonl", 3)
    audit(JobSpec(dataset=str(tmp_path / "warm.jsonl")))  # the imports, outside the measure
    small, large = tmp_path / "small.jsonl", tmp_path / "large.jsonl"
    grown = write(large, 1200) - write(small, 600)  # ~5 MB more
    more = peak_of(JobSpec(dataset=str(large))) - peak_of(JobSpec(dataset=str(small)))
    # Holding the rows (as read, or their text) grows the peak by the file's growth or more; the tally of a
    # streamed row is its key, place, length and MinHash signature: under 1 KB of each 8 KB row.
    assert more < grown / 4, f"the peak grew {more / 2**20:.1f} MiB for {grown / 2**20:.1f} MiB more rows"
