"""The audit of a spec's data: every finding at once, and the training rows' lengths for a histogram.

found = audit(spec)                        # DataError when the data does not read (the checks name why)
for line in found.lines(): print(line)     # one line per finding, warnings first
found.histogram()                          # [(upper bound, rows)] of the training rows' characters
token_lengths(found, spec).histogram()     # ... of their tokens, when the checks measured them already
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jobs.data.audit.content import content_findings
from jobs.data.audit.duplicates import duplicate_findings
from jobs.data.audit.findings import Finding, Severity
from jobs.data.audit.reading import read_rows
from jobs.data.audit.rows import AuditData
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

    def histogram(self, bins: int = 10) -> list[tuple[int, int]]:
        """[(upper bound, rows up to it)] over the training rows' lengths, in `unit`."""
        if not len(self.lengths):
            return []
        counts, edges = np.histogram(self.lengths, bins=min(bins, max(1, len(np.unique(self.lengths)))))
        return [(int(np.ceil(hi)), int(n)) for hi, n in zip(edges[1:], counts, strict=True)]


def audit(spec: JobSpec, data: AuditData | None = None) -> Audit:
    """Every finding on `spec`'s rows (warnings first); `data`: rows already read."""
    data = data if data is not None else read_rows(spec)
    found = duplicate_findings(data) + content_findings(data, spec)
    found.sort(key=lambda f: f.severity is not Severity.WARNING)
    lengths = np.fromiter((len(r.text) for r in data.train), dtype=np.int64, count=len(data.train))
    return Audit(found, data, lengths)
