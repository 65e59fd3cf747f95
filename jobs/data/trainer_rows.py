"""Whether a trainer can train on rows of a format: its record's `row_formats` (`jobs.spec.trainer_records`),
and otherwise a problem naming the trainers that can and data the trainer takes.

    problem = trainer_fit(fmt, Trainer("dpo"), "dataset")    # None when the trainer can use it
"""

from __future__ import annotations

from jobs.data.row_formats import COLUMNS
from jobs.errors import Problem
from jobs.spec.enums import RowFormat, Trainer
from jobs.spec.trainer_records import RECORDS, record_for


def trainer_fit(fmt: RowFormat, trainer: Trainer, field_name: str) -> Problem | None:
    """A Problem when `trainer` cannot train on rows of `fmt`."""
    record = record_for(trainer)
    if fmt in record.row_formats:
        return None
    fits = [t.value for t, r in RECORDS.items() if fmt in r.row_formats]
    if RowFormat.TEXT in record.row_formats:  # a trainer of plain text (sft) names the data it can use
        return Problem(
            field_name,
            f"has {fmt.value} rows ({'/'.join(COLUMNS[fmt])}), which the {trainer.value} trainer cannot use",
            "set trainer: "
            + " or ".join(fits)
            + f", or use text/messages/prompt+completion data such as `{record.sample}`",
        )
    return Problem(
        field_name,
        f"has {fmt.value} rows, but the {trainer.value} trainer needs {record.rows}",
        f"use data such as `{record.sample}`, or set trainer: {' or '.join(fits)}",
    )
