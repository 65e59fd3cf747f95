"""What the dashboard shows of a spec's data on demand: its token view and its audit, as plain JSON-ready records.

One path for the API (`app.api`: `/tokens`, `/audit`) and the launch form's panels (`app.ui.data_panels`), for a
user under an `AccessPolicy`: a data file or model folder the policy keeps from its users is refused before it
is read, images the rows name are read inside `policy.reading()`, and a model's own code runs only where the
server allows it. Nothing here runs on a hot path: a caller asks for it (a button, an API call).

    tokens_record(spec, rows=[12], policy=policy)   # {"total", "max_length", "rows": [{row, source, trained, ...}]}
    audit_record(spec, policy=policy)               # {"train_rows", "findings", "histogram": {...}}

Both raise a `ProblemError` (SpecError, DataError, ViewUnavailable) naming the field and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from jobs.checks.access import AccessPolicy
from jobs.errors import Problem, ProblemError
from jobs.spec.job import JobSpec

if TYPE_CHECKING:
    from jobs.data.audit.report import Audit

MAX_SHOWN = 20  # rows per call: each row is prepared by trl's own code


class Refused(ProblemError):
    """What the access policy keeps from this user, or what is missing on the server (the tokenizer)."""

    subject = "with the request"


def _allowed(spec: JobSpec, policy: AccessPolicy) -> None:
    refused = policy.problems(spec)
    if refused:
        raise Refused(refused)


def tokenizer_of(spec: JobSpec, policy: AccessPolicy) -> Any:
    """The model's tokenizer (a vision-language model's processor) from this machine's files; Refused when it is
    not here."""
    from jobs.models.vision import local_processing_class

    remote = spec.trust_remote_code and policy.allow_remote_code
    found = local_processing_class(spec.model, remote, spec.image_min_pixels, spec.image_max_pixels)
    if found is None:
        fix = f"fetch it once (`tunedeck setup --model {spec.model}` for a built-in, or download the model), then retry"
        raise Refused([Problem("model", f"the tokenizer of {spec.model} is not on this server", fix)])
    return found


def tokens_record(
    spec: JobSpec, rows: Sequence[int] = (), first: int = 3, policy: AccessPolicy | None = None
) -> dict[str, Any]:
    """The token view of `rows` (row numbers of the first data set, as its file numbers them) or of the first
    `first` training rows: each token with its text, id and whether it is special, trained or cut."""
    from jobs.data.tokens.streamed_rows import views_of

    policy = policy or AccessPolicy.open()
    if len(rows) > MAX_SHOWN or first > MAX_SHOWN:
        raise Refused([Problem("row", f"at most {MAX_SHOWN} rows are shown at once", "ask for fewer rows")])
    _allowed(spec, policy)
    with policy.reading():
        tokenizer = tokenizer_of(spec, policy)
        viewed = views_of(spec, tokenizer, numbers=list(rows) or None, first=first)
    refs = [s.ref for s in spec.dataset_sources] or [spec.dataset]
    out = []
    for view, (source, number) in zip(viewed.views, viewed.origins, strict=True):
        out.append(
            {
                "row": number,
                "source": refs[source] if source < len(refs) else spec.dataset,
                "trained": view.trained_count,
                "kept": sum(len(s.kept) for s in view.sequences),
                "cut": sum(s.cut_count for s in view.sequences),
                "dropped": view.dropped,
                "untrained": view.untrained,
                "notes": list(view.notes),
                "sequences": [
                    {
                        "name": seq.name,
                        "image_blocks": [list(block) for block in seq.image_blocks],
                        "tokens": [
                            {"id": t.id, "text": t.text, "special": t.special, "trained": t.trained, "cut": t.cut}
                            for t in seq.tokens
                        ],
                    }
                    for seq in view.sequences
                ],
            }
        )
    return {"total": viewed.total, "max_length": spec.max_length, "rows": out}


def audit_record(spec: JobSpec, policy: AccessPolicy | None = None) -> dict[str, Any]:
    """The audit's findings (each with its rows and fix) and the training rows' length histogram against
    max_length (tokens when the checks measured them already, else characters)."""
    from jobs.data.audit.report import audit

    policy = policy or AccessPolicy.open()
    _allowed(spec, policy)
    with policy.reading():
        found = token_lengths(audit(spec), spec)
    tokens = found.unit == "tokens"
    edge = spec.max_length if tokens else None
    record = found.record()
    record["histogram"] = {
        "unit": found.unit,
        "max_length": spec.max_length,
        "bins": [{"upto": bound, "rows": n} for bound, n in found.histogram(edge=edge)],
        "over_max_length": int((found.lengths > spec.max_length).sum()) if tokens and spec.max_length else None,
    }
    return record


def token_lengths(found: Audit, spec: JobSpec) -> Audit:
    """`found` with the training rows' token lengths when the checks measured them already (a cache read, no
    tokenizing: `jobs.data.tokens.measurement`); else as it was (characters). Shared by the API, the form and
    `tunedeck data audit`."""
    import numpy as np

    from jobs.data.audit.report import Audit
    from jobs.data.tokens.measurement import cached_lengths
    from jobs.models.tokenizer import tokenizer_folder

    measured = cached_lengths(spec, tokenizer_folder(spec.model))
    if measured is None or not measured.rows:
        return found
    return Audit(found.findings, found.data, np.asarray(measured.lengths).max(axis=1), "tokens")
