"""The duplicate findings: training rows repeated exactly or nearly, and training rows also in the eval data.

Exact copies share their key (`jobs.data.audit.rows.row_key`: the row as trl reads it); near copies are found
among the distinct training rows by `jobs.data.audit.near`, both as the rows stream past
(`jobs.data.audit.copies.CopyScan`, fed by `jobs.data.audit.scanned.AuditData`). A row of the eval data whose key (or, nearly, whose
text) is also a training row's is in both: the eval loss then measures memory. `drop` is what `dedupe: true`
removes: every later copy, exact or near, and every training row also in the eval data, keeping the first of each.

    findings = duplicate_findings(data)
    dropped = find(train_keys, train_texts, eval_keys, eval_texts).dropped()   # `jobs.data.audit.copies`
"""

from __future__ import annotations

from jobs.data.audit.findings import Finding, Severity, Shown
from jobs.data.audit.near import THRESHOLD
from jobs.data.audit.scanned import AuditData

FIX = "set dedupe: true (keeps the first of each, drops the rest before training)"
OVERLAP_FIX = "set dedupe: true (drops those training rows), or take them out of one of the files"


def duplicate_findings(data: AuditData) -> list[Finding]:
    """Duplicate rows, near-duplicates and eval overlap as findings naming their rows."""
    found = data.copies.result()
    out: list[Finding] = []
    n = len(data.train)
    if found.exact:
        split = "; with eval_split, copies can land on both sides of the split" if data.eval_split else ""
        copy = found.exact[0]
        first = data.copies.first[data.copies.train_key(copy)]
        example = f"e.g. {_name(data, copy)} repeats {_name(data, first)}{split}"
        out.append(_finding("duplicate-rows", found.exact, data, f"training rows repeat an earlier row ({example})"))
    if found.near:
        later = sorted(i for group in found.near for i in group[1:])
        group = found.near[0]
        example = f"e.g. {_name(data, group[1])} and {_name(data, group[0])}"
        out.append(
            _finding(
                "near-duplicate-rows",
                later,
                data,
                f"training rows nearly repeat an earlier row (about {THRESHOLD:.0%} of their word pairs or more "
                f"shared; {len(found.near)} groups; {example})",
            )
        )
    if found.overlap or found.near_overlap:
        rows = sorted(set(found.overlap) | set(found.near_overlap))
        hits = _shown(data, "dataset", rows)
        for j in found.eval_rows:
            hits.add(*data.place("eval_dataset", j))
        what = f"{len(found.overlap)} exactly, {len(found.near_overlap)} nearly" if found.near_overlap else "exactly"
        out.append(
            Finding(
                "eval-overlap",
                Severity.WARNING,
                len(rows),
                hits.rows(),
                f"{len(rows)} of {n} training rows are also in the eval data ({what}; {len(found.eval_rows)} eval "
                "rows): the eval loss measures what was learned by heart",
                OVERLAP_FIX,
            )
        )
    return out


def _shown(data: AuditData, field_name: str, indices: list[int]) -> Shown:
    shown = Shown()
    for i in indices:
        shown.add(*data.place(field_name, i))
    return shown


def _name(data: AuditData, index: int) -> str:
    """'row 7', or 'row 7 of `b.jsonl`' in a mixture: a training row by its index."""
    source, number = data.train.at(index)
    refs = data.refs.get("dataset", [])
    return f"row {number}" + (f" of `{refs[source]}`" if len(refs) > 1 else "")


def _finding(code: str, indices: list[int], data: AuditData, what: str) -> Finding:
    n = len(data.train)
    rows = _shown(data, "dataset", indices).rows()
    return Finding(code, Severity.WARNING, len(indices), rows, f"{len(indices)} of {n} {what}", FIX)
