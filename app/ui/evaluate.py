"""The run page's Evaluate panel: more benchmark tasks, or a judge, on a finished run, carried out by a worker.

"Evaluate" queues the `evaluate` task `tunedeck evaluate RUN --tasks T --on-worker` queues
(`jobs.worker.tasks.request_evaluate`: the run must have a result, the task files are read and checked
row by row first, and nothing is queued while one has a problem); "Judge" queues its `judge` task
(`request_judge`). A worker where the run's weights are carries each out as that same command, in a
child process, so no model is loaded in the dashboard. When no running worker can reach the weights,
the panel says where to start one and queues nothing. Progress and endings come back through the
task's log (`app.ui.export.progress_text`, followed by a timer active only while the tasks run);
when they end, the run page redraws, and its Benchmarks table, the judge's column beside the
samples and the bundle's card show the new scores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gradio as gr

from app.ui.export import TICK_S, cancel_unfinished, finished_run, progress_text, unfinished, words
from jobs.checks.access import AccessPolicy, loading_problem
from jobs.errors import ProblemError
from jobs.spec.job import JobSpec
from jobs.spec.stored import spec_of
from jobs.worker.tasks import EVALUATION_KINDS, reach_problem, request_evaluate, request_judge
from storage.roles_tasks import EvaluationOnWorker, EvaluationTasks, RunTasks, TaskOnWorker
from storage.store import TaskRecord

EVENTS = "evaluate-panel"  # the concurrency group of the panel's events (as the export panel's)


@dataclass
class EvaluatePanel:
    tasks: gr.Textbox
    start: gr.Button
    judge: gr.Textbox
    judge_start: gr.Button
    stop: gr.Button
    log: gr.Textbox
    following: gr.State  # the ids of the tasks this page follows
    timer: gr.Timer  # active only while they are unfinished
    ended: gr.State  # set when the followed tasks end: the run page redraws its scores


def build() -> EvaluatePanel:
    """Lay out the panel; call inside the run tab."""
    with gr.Accordion("Evaluate: benchmark tasks and a judge, base vs this run", open=False, elem_id="evaluate-panel"):
        gr.Markdown(
            "Score the run and its base model on more tasks (lm-evaluation-harness, zero-shot, same settings): "
            "a `.jsonl` of questions (`question` with `choices` and `answer` for multiple choice; `question` "
            "with `answer` and/or `regex` for a generated answer), an lm-eval task `.yaml`, or a task name "
            "where the hub is reachable. A judge compares the before/after answers in both orders. A worker "
            "where the run's weights are does it; the scores appear on this page and in the bundle's card."
        )
        with gr.Row():
            tasks = gr.Textbox(
                label="Tasks (eval_tasks)", placeholder="e.g. /data/qa.jsonl, arc_easy", scale=4, elem_id="eval-tasks"
            )
            start = gr.Button("Evaluate", variant="primary", scale=0, elem_id="eval-start")
        with gr.Row():
            judge = gr.Textbox(
                label="Judge (--judge)",
                placeholder="a built-in model, a folder, run:N, or URL#MODEL (key: the worker's OPENAI_API_KEY, trusted endpoints only)",
                scale=4,
                elem_id="eval-judge",
            )
            judge_start = gr.Button("Judge", scale=0, elem_id="judge-start")
            stop = gr.Button("Stop", variant="stop", scale=0, elem_id="eval-stop")
        log = gr.Textbox(label="progress", lines=6, max_lines=30, interactive=False, elem_id="eval-log")
        following = gr.State([])
        timer = gr.Timer(TICK_S, active=False)
    return EvaluatePanel(tasks, start, judge, judge_start, stop, log, following, timer, gr.State(None))


def _queue(
    store: TaskOnWorker, policy: AccessPolicy | None, run_id: Any, asked: JobSpec, request: Callable[[int], int]
) -> tuple[str, list[int]]:
    """Queue one task through `request` (run id -> task id): (what the log shows now, [its id]); ([]: why not)."""
    run, refused = finished_run(store, run_id, "evaluate")
    if run is None:
        return refused or "", []
    problems = (policy.problems(asked) if policy else []) + [
        p for p in (loading_problem(spec_of(run), run.id, policy, "evaluate it"), reach_problem(store, run)) if p
    ]
    if problems:
        return "\n".join(words(p) or "" for p in problems), []
    try:
        task_id = request(run.id)
    except ProblemError as exc:
        return "\n".join(f"{p.field}: {p.problem}. Fix: {p.fix}" for p in exc.problems), []
    return progress_text(store.tasks_of([task_id])), [task_id]


def request_tasks(
    store: EvaluationOnWorker, policy: AccessPolicy | None, run_id: Any, tasks: str
) -> tuple[str, list[int]]:
    """Queue benchmark tasks on the run and its base (`tunedeck evaluate --on-worker`'s task)."""
    tasks = (tasks or "").strip()
    return _queue(store, policy, run_id, JobSpec(eval_tasks=tasks), lambda rid: request_evaluate(store, rid, tasks))


def request_judging(
    store: EvaluationOnWorker, policy: AccessPolicy | None, run_id: Any, judge: str
) -> tuple[str, list[int]]:
    """Queue a judge's win rate of the run against its base (`tunedeck judge --on-worker`'s task)."""
    judge = (judge or "").strip()
    if not judge:
        return "judge: none named. Fix: name a built-in model, a folder, run:N or URL#MODEL.", []
    return _queue(store, policy, run_id, JobSpec(judge=judge), lambda rid: request_judge(store, rid, judge))


def unfinished_evaluations(store: RunTasks, run_id: Any) -> list[TaskRecord]:
    """The run's unfinished benchmark and judge tasks, oldest first (what a reopened page follows again)."""
    tasks = store.run_tasks(int(run_id)) if run_id is not None else []
    return [t for t in reversed(tasks) if t.kind in EVALUATION_KINDS and not t.status.finished]


def wire(panel: EvaluatePanel, store: EvaluationTasks, run_id: gr.Number, policy: AccessPolicy | None = None) -> None:
    def opened(rid: Any) -> tuple[Any, ...]:
        """A run opened: its unfinished evaluations followed again (a reload mid-evaluation)."""
        following = unfinished_evaluations(store, rid)
        return (
            [t.id for t in following],
            progress_text(following) if following else "",
            gr.Timer(active=bool(following)),
        )

    def followed(current: list[int], text: str, ids: list[int]) -> tuple[Any, ...]:
        if not ids:
            return text, gr.skip(), gr.skip()
        new = set(ids)
        tasks = [t for t in store.tasks_of([*current, *ids]) if t.id in new or not t.status.finished]
        return progress_text(tasks), [t.id for t in tasks], gr.Timer(active=True)

    def started(current: list[int], rid: Any, tasks: str) -> tuple[Any, ...]:
        return followed(current, *request_tasks(store, policy, rid, tasks))

    def judged(current: list[int], rid: Any, judge: str) -> tuple[Any, ...]:
        return followed(current, *request_judging(store, policy, rid, judge))

    def ticked(ids: list[int], shown: str) -> tuple[Any, ...]:
        tasks = store.tasks_of(ids)
        text = progress_text(tasks)
        update = text if text != shown else gr.skip()
        if unfinished(tasks):
            return update, gr.skip(), gr.skip()
        return update, gr.Timer(active=False), ids  # `ended` changes: the run page redraws its scores

    def stopped(ids: list[int]) -> None:
        cancel_unfinished(store, ids)

    quiet: dict[str, Any] = {
        "show_progress": "hidden",
        "api_visibility": "private",
        "concurrency_id": EVENTS,
        "concurrency_limit": 1,
    }
    following = [panel.log, panel.following, panel.timer]
    run_id.change(opened, run_id, [panel.following, panel.log, panel.timer], **quiet)
    panel.start.click(started, [panel.following, run_id, panel.tasks], following, **quiet)
    panel.judge_start.click(judged, [panel.following, run_id, panel.judge], following, **quiet)
    panel.timer.tick(ticked, [panel.following, panel.log], [panel.log, panel.timer, panel.ended], **quiet)
    panel.stop.click(stopped, panel.following, None, **quiet)
