"""The answers step of the checks: data that cannot teach under `max_length` is refused before queueing.

trl truncates each sequence's end at `max_length` (keep_start), so a row whose prompt alone fills
`max_length` keeps no token of its answer (completion, assistant turns, chosen/rejected): dpo drops
such rows, sft trains on their prompt only. The reward trainer drops every pair with a sequence
longer than `max_length`. Counted from the training rows' measured lengths (`jobs.data.tokens.measurement`,
the same measurement the memory step reads; prompts measured with them), never tokenized again:

- most rows (over `REFUSE_SHARE`) lose their answer: a `max_length` problem naming the rows, their
  count and the max_length that keeps 95% of those rows whole;
- some do: a warning with the same figures.

The rows are named as the user's files number them ("rows 2, 5 of `a.jsonl` and row 1 of `b.jsonl`",
`jobs.data.row_numbers`), though training sees them mixed and shuffled: the lengths keep each row's
origin (`RowLengths.origins`).

    problems, warnings = answer_problems(spec, lengths)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobs.data.row_numbers import origins_text
from jobs.errors import Problem
from jobs.spec.job import JobSpec
from jobs.spec.trainer_records import record_for

if TYPE_CHECKING:
    from jobs.data.tokens.lengths import RowLengths

REFUSE_SHARE = 0.5  # refused when more than this share of the training rows keep no answer


def answer_problems(spec: JobSpec, lengths: RowLengths | None) -> tuple[list[Problem], list[str]]:
    """([a max_length problem] when most rows lose their whole answer, [a warning] when some do); nothing
    when the lengths are unknown or the trainer keeps prompts whole (grpo)."""
    if lengths is None or not lengths.rows or record_for(spec.trainer).generates:
        return [], []
    reward = record_for(spec.trainer).drops_long_rows
    cut = lengths.answers_cut(spec.max_length, dropped_when_long=reward)
    lost = len(cut.lost)
    if not lost:
        return [], []
    one = lost == 1
    if reward:
        what = (
            f"{'has' if one else 'have'} a sequence longer than max_length {spec.max_length} tokens, and the reward "
            f"trainer drops {'it' if one else 'them'}"
        )
    else:
        what = (
            f"{'has' if one else 'have'} a prompt of max_length {spec.max_length} tokens or more, so truncation cuts "
            f"away {'its' if one else 'their'} whole answer: the model learns none of "
            f"{'it' if one else 'their answers'}"
        )
    if cut.origins:  # 'rows 2, 5 of `a.jsonl`, 2 of the 40 training rows, have ...'
        head = f"{origins_text(cut.origins, [s.ref for s in spec.dataset_sources])}, {lost} of the {cut.rows} "
        head += f"training rows, {what}"
    else:
        head = f"{lost} of {cut.rows} training rows {what}"
    keeps = f"max_length: {cut.keeps}" if cut.keeps else "a longer max_length"
    if lost > REFUSE_SHARE * cut.rows:
        return [
            Problem(
                "max_length",
                head,
                f"set {keeps} (keeps 95% of those rows whole), or shorten the prompts (system prompt, earlier turns)",
            )
        ], []
    return [], [f"{head}; {keeps} keeps 95% of those rows whole"]
