"""The rewards step of the checks: each declared reward's data column is one the data hands to trl.

trl passes a grpo data set's columns besides `prompt` to every reward function (`DatasetInfo.reward_columns`,
after `dataset_columns`); a reward that reads a column (`exact`, `numeric`, `contains`, trl's accuracy
rewards: `solution` unless `column` says otherwise) needs it in every data set it scores, the training
data and the evaluation data. Found here, before queueing, instead of as a KeyError at the first step.

    problems = reward_column_problems(spec, infos)   # infos: jobs.checks.datasets.dataset_problems' second value

A judge reward's judge (kind `judge`) must resolve where the worker runs: a built-in model, a folder holding a model
(read without its weights), `run:N` a finished run with its model or adapter (with the store at hand), or an
endpoint `URL#MODEL` (its form is checked with the spec; whether this server may call it, by the access policy:
`jobs.checks.access`).

    problems = judge_reward_problems(spec, store)      # store: None skips run:N (no runs to look in)
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import TYPE_CHECKING

from jobs.errors import Problem
from jobs.spec.job import JobSpec
from jobs.spec.rewards import RewardKind

if TYPE_CHECKING:
    from jobs.data.inspection import DatasetInfo
    from storage.roles import ArtifactReader


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


def judge_reward_problems(
    spec: JobSpec, store: ArtifactReader | None, refused: Set[str] = frozenset()
) -> list[Problem]:
    """A problem per judge reward whose judge does not resolve, naming `rewards[i].judge`; the fields in `refused`
    (the access policy's: a folder this server may not read) are not looked at."""
    from jobs.models.references import check_model

    out: list[Problem] = []
    for i, reward in enumerate(spec.declared_rewards):
        ref = (reward.judge or "").strip()
        if reward.kind is not RewardKind.JUDGE or ref.lower().startswith(("http://", "https://")):
            continue
        field = f"rewards[{i}].judge"
        if field in refused:
            continue
        if ref.lower().startswith("run:"):
            from jobs.models.judge_run import run_judge_problem

            found = run_judge_problem(store, int(ref[4:])) if store is not None else None
            out += [Problem(field, *found)] if found is not None else []
        else:
            out += [Problem(field, p.problem, p.fix) for p in check_model(ref)]
    return out
