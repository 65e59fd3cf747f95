"""The scripting API's task endpoints (`app.api`): "try rewards" on a grpo spec, and following any task.

    out = client.predict(spec_yaml=text, prompts=4, api_name="/try_rewards")   # {task_id, problems}
    client.predict(task_id=out["task_id"], api_name="/task")                  # status, log, result

No `from __future__ import annotations` here: Gradio reads the endpoints' type hints at run time.
"""

from collections.abc import Callable
from typing import Any, TypedDict

import gradio as gr

from app.spec_text import spec_values
from jobs.checks.access import AccessPolicy
from jobs.errors import Problem
from jobs.spec.job import SpecError
from storage.roles_pages import RewardTrials, TaskReader


class TrialQueued(TypedDict):
    task_id: int | None
    problems: list[dict[str, str]]


class TaskData(TypedDict):
    id: int
    run_id: int | None
    kind: str
    status: str
    log: list[str]
    result: dict[str, Any] | None
    error: str | None


def queue_trial(request: Callable[[], int]) -> TrialQueued:
    """`request()` queues the trial (`jobs.queue.trial.request_try_rewards`, checked as a submit is, under the
    dashboard's policy: declared rewards yes, code no): its task id, or every problem when it cannot run."""
    try:
        task_id = request()
    except SpecError as exc:
        problems = [{"field": p.field, "problem": p.problem, "fix": p.fix} for p in exc.problems]
        return TrialQueued(task_id=None, problems=problems)
    return TrialQueued(task_id=task_id, problems=[])


def task_data(store: TaskReader, task_id: int) -> TaskData:
    """A task as the API shows it; gr.Error naming task_id when there is none."""
    task = store.get_task(int(task_id))
    if task is None:
        problem = Problem("task_id", f"no task {task_id}", "use the task_id a request returned")
        raise gr.Error(str(problem), title="tunedeck: bad input")
    return TaskData(
        id=task.id,
        run_id=task.run_id,
        kind=task.kind,
        status=task.status.value,
        log=task.log,
        result=task.result,
        error=task.error,
    )


class TaskEndpoints:
    """The API's task endpoints (mixed into `app.api.Endpoints`, which holds `store` and `policy`)."""

    store: RewardTrials
    policy: AccessPolicy | None
    request_trial: Callable[..., int]  # `jobs.queue.trial.request_try_rewards`, handed in by `app.api.Endpoints`

    def try_rewards(self, spec_yaml: str, prompts: int = 4) -> TrialQueued:
        """Ask a worker to try a grpo spec's rewards: sample num_generations completions for the first prompts from
        the base model, score each with every reward, compute trl's advantages and flag groups with no learning signal.

        Parameters:
            spec_yaml: the grpo job spec as YAML text (checked as submit checks it; nothing is trained).
            prompts: how many training prompts to try (1 to 16).
        Returns:
            task_id: follow it with /task (its result: groups, share_teaching), or null; problems: every problem as {field, problem, fix}.
        """
        policy = self.policy or AccessPolicy.dashboard()
        return queue_trial(lambda: self.request_trial(self.store, spec_values(spec_yaml), int(prompts), policy))

    def task(self, task_id: int) -> TaskData:
        """A task's status, newest log lines, result (a finished try_rewards: its groups and share_teaching) and error.

        Parameters:
            task_id: the id a request returned (try_rewards).
        """
        return task_data(self.store, task_id)
