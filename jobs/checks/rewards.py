"""The rewards step of the checks: each declared reward's data column is one the data hands to trl.

trl passes a grpo data set's columns besides `prompt` to every reward function (`DatasetInfo.reward_columns`,
after `dataset_columns`); a reward that reads a column (`exact`, `numeric`, `contains`, trl's accuracy
rewards: `solution` unless `column` says otherwise) needs it in every data set it scores, the training
data and the evaluation data. Found here, before queueing, instead of as a KeyError at the first step.

    problems = reward_column_problems(spec, infos)   # infos: jobs.checks.datasets.dataset_problems' second value
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from jobs.errors import Problem
from jobs.spec.job import JobSpec

if TYPE_CHECKING:
    from jobs.data.inspection import DatasetInfo


def reward_column_problems(spec: JobSpec, infos: Mapping[str, DatasetInfo]) -> list[Problem]:
    """A problem per declared reward whose column a checked data set lacks, naming `rewards[i].column`."""
    out: list[Problem] = []
    for i, reward in enumerate(spec.declared_rewards):
        column = reward.reference_column
        if column is None:
            continue
        for field, info in infos.items():
            if column in info.reward_columns:
                continue
            has = ", ".join(f"`{c}`" for c in info.reward_columns) or "none besides the prompt"
            out.append(
                Problem(
                    f"rewards[{i}].column",
                    f"{reward.kind.value} reads the column `{column}`, which {field} `{info.ref}` lacks (its "
                    f"columns for rewards: {has})",
                    f"set column: to one of those, or add `{column}` (the reference answers) to every row",
                )
            )
    return out
