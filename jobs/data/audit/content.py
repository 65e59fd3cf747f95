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

    findings = content_findings(data, spec)
"""

from __future__ import annotations

import re
from collections import defaultdict

from jobs.data.audit.findings import Finding, Severity, first_rows
from jobs.data.audit.rows import AuditData, Row
from jobs.spec.enums import Thinking
from jobs.spec.job import JobSpec

SHORT_ANSWER = 3  # characters: answers shorter than this are named (info)
REPEATED_ANSWER = 20  # characters: shorter answers ("Yes") may well answer several prompts
REPEATED_PROMPTS = 5  # prompts one answer is given to: fewer are often paraphrases of one question
KTO_RATIO = 4 / 3
KTO_LOW = 0.9  # trl's lower bound is 1: a row or two short of even is no finding
WORD = re.compile(r"[^\W_]")  # a letter or digit: an answer without one ("", "...", "-") says nothing
NOT_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")


def content_findings(data: AuditData, spec: JobSpec) -> list[Finding]:
    rows = data.train
    out = _answer_findings(rows) + _repeated_answers(rows) + _preference_findings(rows)
    out += _kto_findings(rows, spec) + _not_text(rows + data.eval) + _shares(data) + _thinking(rows, spec)
    return out


def _thinking(rows: list[Row], spec: JobSpec) -> list[Finding]:
    """How many rows carry reasoning, and what `thinking` makes of it."""
    from jobs.data.thinking import has_thinking

    found = [r for r in rows if has_thinking(r.answers)]
    if not found:
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
            len(found),
            first_rows(found),
            f"{len(found)} of {len(rows)} training rows carry reasoning (<think> blocks or a reasoning field): {trained}",
            "" if choice else "set thinking: train, answer_only (masked) or strip to choose what is trained",
        )
    ]


def _answer_findings(rows: list[Row]) -> list[Finding]:
    empty = [r for r in rows if any(not WORD.search(a) for a in r.answers)]
    blank = {id(r) for r in empty}
    short = [r for r in rows if id(r) not in blank and r.answers and min(map(_size, r.answers)) < SHORT_ANSWER]
    out = []
    if empty:
        out.append(
            Finding(
                "empty-answers",
                Severity.WARNING,
                len(empty),
                first_rows(empty),
                f"{len(empty)} of {len(rows)} training rows have an answer without a letter or digit: the model learns "
                "to say nothing",
                "fill in or remove those rows (a chat row: its assistant turns)",
            )
        )
    if short:
        out.append(
            Finding(
                "short-answers",
                Severity.INFO,
                len(short),
                first_rows(short),
                f"{len(short)} of {len(rows)} training rows have an answer under {SHORT_ANSWER} characters",
                "check that those answers are whole (a cut-off export looks like this)",
            )
        )
    return out


def _size(answer: str) -> int:
    return len(answer.strip())


def _repeated_answers(rows: list[Row]) -> list[Finding]:
    prompts: dict[str, set[bytes]] = defaultdict(set)
    holders: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        for a in dict.fromkeys(r.answers):
            if _size(a) >= REPEATED_ANSWER and r.prompt:
                prompts[a].add(r.prompt)
                holders[a].append(r)
    repeated = [a for a, ps in prompts.items() if len(ps) >= REPEATED_PROMPTS]
    if not repeated:
        return []
    hit = sorted({id(r): r for a in repeated for r in holders[a]}.values(), key=lambda r: (r.source, r.number))
    top = max(repeated, key=lambda a: len(prompts[a]))
    return [
        Finding(
            "repeated-answers",
            Severity.WARNING,
            len(hit),
            first_rows(hit),
            f"{len(hit)} of {len(rows)} training rows give one of {len(repeated)} answers that also answer other "
            f"prompts (the most: {len(prompts[top])} prompts, {top[:60]!r})",
            "check that the answer fits each prompt (a canned or mis-joined answer teaches the model to repeat it)",
        )
    ]


def _preference_findings(rows: list[Row]) -> list[Finding]:
    same = [r for r in rows if len(r.answers) == 2 and r.label is None and r.answers[0] == r.answers[1]]
    if not same:
        return []
    return [
        Finding(
            "chosen-equals-rejected",
            Severity.WARNING,
            len(same),
            first_rows(same),
            f"{len(same)} of {len(rows)} preference rows have chosen identical to rejected: nothing to learn from them",
            "give each pair two different answers, or remove those rows",
        )
    ]


def _kto_findings(rows: list[Row], spec: JobSpec) -> list[Finding]:
    labelled = [r for r in rows if r.label is not None]
    if not labelled:
        return []
    good = sum(1 for r in labelled if r.label)
    bad = len(labelled) - good
    if not good or not bad:
        kind = "desirable (true)" if not good else "undesirable (false)"
        return [
            Finding(
                "kto-labels",
                Severity.WARNING,
                len(labelled),
                (),
                f"all {len(labelled)} kto rows have one label: no {kind} rows to learn from",
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
            len(labelled),
            (),
            f"{good} desirable and {bad} undesirable kto rows (weighted ratio {ratio:.2f}; trl advises 1 to 4/3)",
            f"set {weight}: {target} (or balance the rows)",
        )
    ]


def _not_text(rows: list[Row]) -> list[Finding]:
    bad = [r for r in rows if NOT_TEXT.search(r.text)]
    if not bad:
        return []
    broken = sum(1 for r in bad if "\ufffd" in r.text)
    return [
        Finding(
            "not-text",
            Severity.WARNING,
            len(bad),
            first_rows(bad),
            f"{len(bad)} rows hold control characters or U+FFFD ({broken} with U+FFFD, the mark of a broken "
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
