"""The form's "Try rewards" panel (grpo): ask a worker to sample the base model and score its completions with
the spec's rewards, then show each completion's scores and advantage, and which prompts can teach.

    panel = build_panel()                    # inside the form's Method section; shown for trainer: grpo
    wire(panel, form_inputs, spec_of, store, policy)

The button checks the form's spec as Launch does (the dashboard's policy: declared rewards yes, a code reward
no) and queues the task (`jobs.worker.tasks.request_try_rewards`); a `gr.Timer`, active only while that task
is unfinished, reads it from the store (the dashboard never loads a model) and fills the table from its result
(`jobs.train.reward_trial.summarise`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gradio as gr

from jobs.checks.access import AccessPolicy
from jobs.spec.job import SpecError
from storage.roles_pages import RewardTrials

TICK_S = 1.0
HELP = (
    "GRPO learns only from prompts whose completions score differently. This samples num_generations completions "
    "for the first training prompts from the base model (this form's generation settings), scores each with every "
    "reward and shows the advantages training would use; a prompt whose completions all score the same teaches "
    "nothing (no learning signal)."
)


@dataclass
class TrialPanel:
    box: gr.Group
    prompts: gr.Number
    button: gr.Button
    status: gr.Markdown
    table: gr.Dataframe
    task: gr.State  # the id of the task this page follows (None: none)
    timer: gr.Timer  # active only while it is unfinished


def build_panel() -> TrialPanel:
    """Lay out the panel (hidden until the trainer is grpo); call inside the form's Blocks."""
    with gr.Group(visible=False, elem_id="try-rewards") as box:
        gr.Markdown(f"**Try rewards** before training. {HELP}")
        with gr.Row(equal_height=True):
            prompts = gr.Number(4, label="Prompts to try", precision=0, minimum=1, maximum=16, scale=0, min_width=140)
            button = gr.Button("Try rewards", size="sm", elem_id="try-rewards-btn", scale=0, min_width=140)
        status = gr.Markdown(elem_id="try-rewards-status")
        table = gr.Dataframe(
            interactive=False, wrap=True, max_height=420, show_label=False, elem_id="try-rewards-table"
        )
        task = gr.State(None)
        timer = gr.Timer(TICK_S, active=False)
    return TrialPanel(box, prompts, button, status, table, task, timer)


def table_of(result: dict[str, Any]) -> dict[str, Any]:
    """The result as a table: one row per completion (prompt, completion, each reward's score, reward, advantage,
    and the group's mean, spread and verdict on its first row)."""
    names = list(result["rewards"])
    headers = ["prompt", "completion", *names, "reward", "advantage", "group"]
    rows = []
    for n, group in enumerate(result["groups"], 1):
        verdict = f"mean {_num(group['mean'])}, spread {_num(group['spread'])}" + (
            "" if group["teaches"] else ": no learning signal"
        )
        for i, c in enumerate(group["completions"]):
            text = c["text"] + (" [cut]" if c.get("truncated") else "")
            rows.append(
                [
                    f"{n}. {group['prompt']}" if i == 0 else "",
                    text,
                    *(_num(c["scores"].get(x)) for x in names),
                    _num(c["reward"]),
                    f"{c['advantage']:.3f}",
                    verdict if i == 0 else "",
                ]
            )
    return {"headers": headers, "data": rows}


def summary_of(result: dict[str, Any]) -> str:
    """One line: how many prompts can teach, and what to change when none can."""
    total = len(result["groups"])
    line = (
        f"**{result['teaching']} of {total} prompts can teach ({result['share_teaching']:.0%})**: "
        f"num_generations {result['num_generations']}, scale_rewards {result['scale_rewards']}."
    )
    if not result["teaching"]:
        line += (
            " No group has any spread, so GRPO would learn nothing: raise temperature or num_generations, or use "
            "a reward that tells these completions apart (partial credit)."
        )
    return line


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def ask(
    store: RewardTrials, spec_of: Callable[[Sequence[Any]], Any], policy: AccessPolicy | None, prompts: Any, *form: Any
) -> tuple[str, int | None]:
    """Queue the task for the form's spec; (status markdown, task id or None)."""
    from app.ui.form_spec import problems_markdown
    from jobs.queue.trial import request_try_rewards
    from jobs.worker.tasks import WORKER_LIVE_S

    try:
        count = int(prompts) if prompts is not None else 4
        task_id = request_try_rewards(store, spec_of(form), count, policy or AccessPolicy.dashboard())
    except SpecError as exc:
        return problems_markdown(exc.problems), None
    except (TypeError, ValueError):
        return "**prompts**: not a whole number. Fix: pick 1 to 16", None
    waiting = "queued for a worker"
    if not store.live_workers(within_s=WORKER_LIVE_S):  # a spec task has no run: any live worker takes it
        waiting += " (none is running: start `tunedeck worker`)"
    return f"Trying rewards: task {task_id}, {waiting}…", task_id


def follow(store: RewardTrials, task_id: int | None) -> tuple[str, Any, bool]:
    """(status markdown, table update, whether the task is still unfinished) of the task this page follows."""
    task = store.get_task(task_id) if task_id is not None else None
    if task is None:
        return "", gr.update(), False
    if not task.status.finished:
        last = task.log[-1] if task.log else "waiting for a worker"
        return f"Trying rewards (task {task.id}, {task.status.value}): {last}", gr.update(), True
    if task.result and "groups" in task.result:
        return summary_of(task.result), gr.update(value=table_of(task.result)), False
    return f"Try rewards {task.status.value}: {task.error or 'no result'}", gr.update(), False


def wire(
    panel: TrialPanel,
    inputs: list[Any],
    trainer: Any,
    spec_of: Callable[[Sequence[Any]], Any],
    store: RewardTrials,
    policy: AccessPolicy | None,
) -> None:
    """Connect the button, the timer and the panel's visibility (grpo only); none is a public API."""
    private: dict[str, Any] = {"api_visibility": "private", "preprocess": False}

    def asked(prompts: Any, *form: Any) -> tuple[Any, ...]:
        text, task_id = ask(store, spec_of, policy, prompts, *form)
        return text, task_id, gr.Timer(active=task_id is not None)

    def ticked(task_id: int | None) -> tuple[Any, ...]:
        text, table, going = follow(store, task_id)
        return text, table, gr.Timer(active=going)

    panel.button.click(asked, [panel.prompts, *inputs], [panel.status, panel.task, panel.timer], **private)
    panel.timer.tick(ticked, panel.task, [panel.status, panel.table, panel.timer], show_progress="hidden", **private)
    trainer.change(lambda t: gr.update(visible=generates(t)), trainer, panel.box, show_progress="hidden", **private)


def generates(trainer: Any) -> bool:
    """Whether the form's trainer scores generated completions with rewards (its record says: grpo)."""
    from jobs.spec.enums import Trainer
    from jobs.spec.trainer_records import record_for

    try:
        return record_for(Trainer(str(trainer))).generates
    except ValueError:
        return False
