"""The audit of a spec's data: every finding at once, and the training rows' lengths for a histogram.

found = audit(spec)                        # DataError when the data does not read (the checks name why)
for line in found.lines(): print(line)     # one line per finding, warnings first
found.histogram()                          # [(upper bound, rows)] of the training rows' characters
jobs.checks.shown_data.token_lengths(found, spec).histogram()   # ... of their tokens, once measured
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jobs.data.audit.content import content_findings
from jobs.data.audit.duplicates import duplicate_findings
from jobs.data.audit.findings import Finding, Severity
from jobs.data.audit.reading import read_rows
from jobs.data.audit.scanned import AuditData
from jobs.spec.job import JobSpec


@dataclass
class Audit:
    findings: list[Finding]
    data: AuditData
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # per training row
    unit: str = "characters"  # or "tokens" when the checks measured them (`jobs.data.tokens.measurement`)

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.WARNING]

    def lines(self) -> list[str]:
        return [f.text(self.data.refs) for f in self.findings]

    def record(self) -> dict[str, Any]:
        return {
            "train_rows": len(self.data.train),
            "eval_rows": len(self.data.eval),
            "findings": [f.record(self.data.refs) for f in self.findings],
        }

    def histogram(self, bins: int = 10, edge: int | None = None) -> list[tuple[int, int]]:
        """[(upper bound, rows above the previous bound up to it)] over the training rows' lengths, in `unit`;
        `edge` (max_length) is one of the bounds when it falls among the lengths."""
        if not len(self.lengths):
            return []
        low, high = int(self.lengths.min()), int(self.lengths.max())
        bounds = np.unique(np.ceil(np.linspace(low, high, min(bins, high - low + 1) + 1)).astype(np.int64))
        if edge is not None and low < edge < high:
            bounds = np.unique(np.append(bounds, edge))
        if len(bounds) == 1:  # every row as long
            return [(int(bounds[0]), len(self.lengths))]
        counts = np.bincount(np.searchsorted(bounds, self.lengths, side="left"), minlength=len(bounds))
        counts[1] += counts[0]  # the shortest rows join the first bin
        return list(zip(bounds[1:].tolist(), counts[1:].tolist(), strict=True))


def audit(spec: JobSpec, data: AuditData | None = None) -> Audit:
    """Every finding on `spec`'s rows (warnings first); `data`: rows already read."""
    data = data if data is not None else read_rows(spec)
    found = duplicate_findings(data) + content_findings(data, spec)
    found.sort(key=lambda f: f.severity is not Severity.WARNING)
    return Audit(found, data, data.lengths())
