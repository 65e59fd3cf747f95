"""The duplicate findings: training rows repeated exactly or nearly, and training rows also in the eval data.

Exact copies share their key (`jobs.data.audit.rows.row_key`: the row as trl reads it); near copies are found
among the distinct training rows by `jobs.data.audit.near`. A row of the eval data whose key (or, nearly, whose
text) is also a training row's is in both: the eval loss then measures memory. `drop` is what `dedupe: true`
removes: every later copy, exact or near, and every training row also in the eval data, keeping the first of each.

    findings = duplicate_findings(data)
    dropped = drop(train_keys, train_texts, eval_keys, eval_texts)     # indices into the training rows
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jobs.data.audit.findings import Finding, Severity, first_rows
from jobs.data.audit.near import THRESHOLD, near_groups
from jobs.data.audit.rows import AuditData, Row

FIX = "set dedupe: true (keeps the first of each, drops the rest before training)"
OVERLAP_FIX = "set dedupe: true (drops those training rows), or take them out of one of the files"


@dataclass(frozen=True)
class Duplicates:
    """Indices into the training rows (and the eval rows): what repeats, and what to drop."""

    exact: list[int]  # training rows that repeat an earlier training row exactly
    near: list[list[int]]  # groups of distinct training rows that are near-identical
    overlap: list[int]  # training rows whose exact copy is in the eval data
    near_overlap: list[int]  # training rows nearly identical to an eval row
    eval_rows: list[int]  # the eval rows in either overlap

    def dropped(self) -> list[int]:
        later = [i for group in self.near for i in group[1:]]
        return sorted(set(self.exact) | set(later) | set(self.overlap) | set(self.near_overlap))


def find(
    train_keys: Sequence[bytes],
    train_texts: Sequence[str],
    eval_keys: Sequence[bytes] = (),
    eval_texts: Sequence[str] = (),
    threshold: float = THRESHOLD,
) -> Duplicates:
    """The duplicates among the training rows, and between them and the eval rows."""
    seen: set[bytes] = set()
    exact: list[int] = []
    distinct: list[int] = []
    for i, key in enumerate(train_keys):
        (exact if key in seen else distinct).append(i)
        seen.add(key)
    in_eval = set(eval_keys)
    overlap = [i for i, key in enumerate(train_keys) if key in in_eval]
    eval_hit = {j for j, key in enumerate(eval_keys) if key in seen}
    texts = [train_texts[i] for i in distinct] + list(eval_texts)
    near: list[list[int]] = []
    near_overlap: set[int] = set()
    for group in near_groups(texts, threshold):
        train = [distinct[k] for k in group if k < len(distinct)]
        evals = [k - len(distinct) for k in group if k >= len(distinct)]
        if len(train) > 1:
            near.append(train)
        if evals and train:
            near_overlap.update(i for i in train if train_keys[i] not in in_eval)
            eval_hit.update(evals)
    return Duplicates(exact, near, overlap, sorted(near_overlap), sorted(eval_hit))


def duplicate_findings(data: AuditData) -> list[Finding]:
    """Duplicate rows, near-duplicates and eval overlap as findings naming their rows."""
    train, evals = data.train, data.eval
    found = find([r.key for r in train], [r.text for r in train], [r.key for r in evals], [r.text for r in evals])
    out: list[Finding] = []
    n = len(train)
    if found.exact:
        split = "; with eval_split, copies can land on both sides of the split" if data.eval_split else ""
        copy = train[found.exact[0]]
        first = next(r for r in train if r.key == copy.key)
        example = f"e.g. {_name(copy, data)} repeats {_name(first, data)}{split}"
        out.append(
            _finding("duplicate-rows", found.exact, train, f"training rows repeat an earlier row ({example})", n)
        )
    if found.near:
        later = sorted(i for group in found.near for i in group[1:])
        group = found.near[0]
        example = f"e.g. {_name(train[group[1]], data)} and {_name(train[group[0]], data)}"
        out.append(
            _finding(
                "near-duplicate-rows",
                later,
                train,
                f"training rows nearly repeat an earlier row (about {THRESHOLD:.0%} of their word pairs or more "
                f"shared; {len(found.near)} groups; {example})",
                n,
            )
        )
    if found.overlap or found.near_overlap:
        rows = sorted(set(found.overlap) | set(found.near_overlap))
        hits = [train[i] for i in rows] + [evals[j] for j in found.eval_rows]
        what = f"{len(found.overlap)} exactly, {len(found.near_overlap)} nearly" if found.near_overlap else "exactly"
        out.append(
            Finding(
                "eval-overlap",
                Severity.WARNING,
                len(rows),
                first_rows(hits),
                f"{len(rows)} of {n} training rows are also in the eval data ({what}; {len(found.eval_rows)} eval "
                "rows): the eval loss measures what was learned by heart",
                OVERLAP_FIX,
            )
        )
    return out


def _name(row: Row, data: AuditData) -> str:
    """'row 7', or 'row 7 of `b.jsonl`' in a mixture."""
    refs = data.refs.get(row.field, [])
    return f"row {row.number}" + (f" of `{refs[row.source]}`" if len(refs) > 1 else "")


def _finding(code: str, indices: list[int], rows: list[Row], what: str, n: int) -> Finding:
    return Finding(
        code, Severity.WARNING, len(indices), first_rows(rows[i] for i in indices), f"{len(indices)} of {n} {what}", FIX
    )
