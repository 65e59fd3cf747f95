"""Queue "try rewards" on a grpo spec: a worker samples the base model and scores the samples with the spec's
rewards (`jobs.train.reward_trial`, `tunedeck grpo try --task ID`), before any run exists.

    task_id = request_try_rewards(store, spec_or_values, prompts=4, policy=AccessPolicy.dashboard())

Checked as a submit checks it (`jobs.checks.pipeline.check`: the access policy, so a code reward stays refused
on the dashboard while declared rewards pass; fields, model, data, device), and refused unless the spec's
trainer generates. The task has no run (`run_id` NULL): its spec and prompt count are its args.
"""

from __future__ import annotations

from typing import Any

from jobs.checks.access import AccessPolicy
from jobs.checks.pipeline import check
from jobs.errors import Problem
from jobs.spec.grpo import TRIAL_PROMPTS_MAX, TRY_REWARDS_TASK
from jobs.spec.job import SpecError
from jobs.spec.trainer_records import record_for
from storage.roles_queue import CheckTasks


def request_try_rewards(store: CheckTasks, spec: Any, prompts: int, policy: AccessPolicy | None = None) -> int:
    """Queue the task for `spec` (a JobSpec or values to parse); SpecError with every problem when it cannot run."""
    if not isinstance(prompts, int) or isinstance(prompts, bool) or not 1 <= prompts <= TRIAL_PROMPTS_MAX:
        raise SpecError(
            [Problem("prompts", f"{prompts!r} is not a whole number from 1 to {TRIAL_PROMPTS_MAX}", "pick 4")]
        )
    checked = check(spec, policy=policy, store=store).accepted()
    if not record_for(checked.trainer).generates:
        raise SpecError(
            [
                Problem(
                    "trainer", f"{checked.trainer.value} has no rewards to try", "set trainer: grpo and declare rewards"
                )
            ]
        )
    return store.create_task(None, TRY_REWARDS_TASK, {"spec": checked.to_dict(), "prompts": prompts})
