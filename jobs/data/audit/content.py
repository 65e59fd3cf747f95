"""The content findings: answers that teach little, preference rows that compare nothing, label balance,
characters that are not text, and each source's share of a mixture.

- empty answers (an assistant turn, completion, chosen or rejected without a letter or digit: "...", "-";
  the checks refuse blank ones already) teach the model to say nothing; answers under `SHORT_ANSWER` characters are named too (often meant: "4", "No");
- one answer (of `REPEATED_ANSWER` characters or more) given to `REPEATED_PROMPTS` different prompts or more: a
  canned reply or a mis-joined file (a few prompts sharing an answer are often paraphrases);
- chosen identical to rejected: the pair's loss has nothing to compare;
- KTO's labels: one kind missing, or one kind over `KTO_RATIO` times the other (trl's KTO docs advise
  desirable_weight * desirable rows / (undesirable_weight * undesirable rows) within 1 to 4/3);
- control characters (besides tab and newline) and U+FFFD, the mark a broken encoding leaves;
- a mixture: each source's share of the training rows, after its max_rows;
- rows carrying reasoning (`<think>` blocks, reasoning fields: `jobs.data.thinking`), and what `thinking` trains of them.

Each is counted as the rows stream past (`jobs.data.audit.tallies.ContentTally`); here the counts become findings.

    findings = content_findings(data, spec)
"""

from __future__ import annotations

from jobs.data.audit.findings import Finding, Severity, Shown
from jobs.data.audit.scanned import AuditData
from jobs.data.audit.tallies import REPEATED_ANSWER, REPEATED_PROMPTS, SHORT_ANSWER, ContentTally
from jobs.spec.enums import Thinking
from jobs.spec.job import JobSpec

__all__ = ["REPEATED_ANSWER", "REPEATED_PROMPTS", "SHORT_ANSWER", "content_findings"]

KTO_RATIO = 4 / 3
KTO_LOW = 0.9  # trl's lower bound is 1: a row or two short of even is no finding


def content_findings(data: AuditData, spec: JobSpec) -> list[Finding]:
    n, tally = len(data.train), data.content
    out = _answer_findings(tally, n) + _repeated_answers(data) + _preference_findings(tally, n)
    out += _kto_findings(tally, spec) + _not_text(tally) + _shares(data) + _thinking(tally, n, spec)
    return out


def _thinking(tally: ContentTally, n: int, spec: JobSpec) -> list[Finding]:
    """How many rows carry reasoning, and what `thinking` makes of it."""
    found = tally.thinking
    if not found.count:
        return []
    choice = Thinking(spec.thinking).value if spec.thinking else None
    trained = {
        None: "trained as they are (all of it; `thinking` is unset)",
        "train": "trained in full (thinking: train)",
        "answer_only": "masked: only the answers are trained (thinking: answer_only)",
        "strip": "removed before training (thinking: strip)",
    }[choice]
    return [
        Finding(
            "thinking-rows",
            Severity.INFO,
            found.count,
            found.rows(),
            f"{found.count} of {n} training rows carry reasoning (<think> blocks or a reasoning field): {trained}",
            "" if choice else "set thinking: train, answer_only (masked) or strip to choose what is trained",
        )
    ]


def _answer_findings(tally: ContentTally, n: int) -> list[Finding]:
    empty, short = tally.empty, tally.short
    out = []
    if empty.count:
        out.append(
            Finding(
                "empty-answers",
                Severity.WARNING,
                empty.count,
                empty.rows(),
                f"{empty.count} of {n} training rows have an answer without a letter or digit: the model learns "
                "to say nothing",
                "fill in or remove those rows (a chat row: its assistant turns)",
            )
        )
    if short.count:
        out.append(
            Finding(
                "short-answers",
                Severity.INFO,
                short.count,
                short.rows(),
                f"{short.count} of {n} training rows have an answer under {SHORT_ANSWER} characters",
                "check that those answers are whole (a cut-off export looks like this)",
            )
        )
    return out


def _repeated_answers(data: AuditData) -> list[Finding]:
    found = data.content.repeated()
    if found is None:
        return []
    hit = Shown()
    for i in found.rows.tolist():
        hit.add(*data.place("dataset", i))
    return [
        Finding(
            "repeated-answers",
            Severity.WARNING,
            hit.count,
            hit.rows(),
            f"{hit.count} of {len(data.train)} training rows give one of {found.answers} answers that also answer "
            f"other prompts (the most: {found.top_prompts} prompts, {found.top!r})",
            "check that the answer fits each prompt (a canned or mis-joined answer teaches the model to repeat it)",
        )
    ]


def _preference_findings(tally: ContentTally, n: int) -> list[Finding]:
    same = tally.same
    if not same.count:
        return []
    return [
        Finding(
            "chosen-equals-rejected",
            Severity.WARNING,
            same.count,
            same.rows(),
            f"{same.count} of {n} preference rows have chosen identical to rejected: nothing to learn from them",
            "give each pair two different answers, or remove those rows",
        )
    ]


def _kto_findings(tally: ContentTally, spec: JobSpec) -> list[Finding]:
    labelled, good = tally.labelled, tally.good
    if not labelled:
        return []
    bad = labelled - good
    if not good or not bad:
        kind = "desirable (true)" if not good else "undesirable (false)"
        return [
            Finding(
                "kto-labels",
                Severity.WARNING,
                labelled,
                (),
                f"all {labelled} kto rows have one label: no {kind} rows to learn from",
                f"add {kind} rows",
            )
        ]
    ratio = (spec.desirable_weight * good) / (spec.undesirable_weight * bad)
    if KTO_LOW <= ratio <= KTO_RATIO:
        return []
    if ratio < 1:  # the weight that brings the weighted ratio to 1
        weight, target = "desirable_weight", round(spec.undesirable_weight * bad / good, 2)
    else:
        weight, target = "undesirable_weight", round(spec.desirable_weight * good / bad, 2)
    return [
        Finding(
            "kto-labels",
            Severity.INFO,
            labelled,
            (),
            f"{good} desirable and {bad} undesirable kto rows (weighted ratio {ratio:.2f}; trl advises 1 to 4/3)",
            f"set {weight}: {target} (or balance the rows)",
        )
    ]


def _not_text(tally: ContentTally) -> list[Finding]:
    bad = tally.not_text
    if not bad.count:
        return []
    return [
        Finding(
            "not-text",
            Severity.WARNING,
            bad.count,
            bad.rows(),
            f"{bad.count} rows hold control characters or U+FFFD ({tally.broken} with U+FFFD, the mark of a broken "
            "encoding): the model learns them as text",
            "re-export the file as UTF-8 and strip control characters",
        )
    ]


def _shares(data: AuditData) -> list[Finding]:
    counts, refs = data.per_source.get("dataset", []), data.refs.get("dataset", [])
    if len(counts) < 2:
        return []
    total = sum(counts) or 1
    shares = ", ".join(f"`{ref}` {n} ({n / total:.0%})" for ref, n in zip(refs, counts, strict=True))
    return [
        Finding(
            "mixture-shares",
            Severity.INFO,
            total,
            (),
            f"the training rows come from {len(counts)} sources: {shares}",
            "set max_rows per source to change the shares (`a.jsonl [max_rows=500]`)",
        )
    ]
