"""The run page's export panel: the adapter merged into its base model, GGUF files, and pushes to the hub,
carried out by a worker.

"Export" writes one task per file kind to the store (`jobs.worker.tasks.request_export`: the merged
model, then each GGUF type) and follows them; a worker that can reach the run's weights carries them
out as `tunedeck export RUN --merged --dtype D` / `--gguf T` child processes
(`jobs.worker.task_service`), so no model is ever loaded in the dashboard's process, which may run
without a GPU or base weights. The worker's progress lines (loading, answering the check prompts,
merging, writing, checking; "waiting for run N to finish with GPU 0" while a training run has the
GPU) come back through the task's log in the store. When no running worker can reach the weights,
the panel says where to start one and queues nothing.

Following is a `gr.Timer` that is active only while this page's tasks are unfinished: an idle panel
costs nothing, a busy one one primary-key read a second, and nothing is sent when nothing moved.
When the tasks end, the run's export files (recorded with their sha256 by `jobs.export.merged` /
`jobs.export.gguf`, listed from the run's artifacts) are offered for download. The checks are the
command's: a merged model whose answers differ from the adapter's, or a GGUF file that does not
load back with the same answers, is refused and not kept. "Stop" cancels (SIGTERM to the child).

"Push" queues a `tunedeck push RUN --repo R --what bundle|merged [--private]` task
(`jobs.worker.tasks.request_push`: the repository id and that there is something to push are checked
first, nothing is queued otherwise). It uploads with the *worker's* `HF_TOKEN`: no token is ever typed
into, stored by or sent through the dashboard. Its ending line is the repository's address. Tasks asked
for while others run are followed together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from jobs.checks.access import AccessPolicy, loading_problem
from jobs.errors import Problem
from jobs.export.merged import DTYPES
from jobs.export.push import WHAT as PUSH_WHAT
from jobs.export.push import PushError
from jobs.spec.stored import finished_problem, spec_of
from jobs.worker.tasks import (
    EVALUATION_KINDS,
    GGUF_TYPES,
    TaskKind,
    describe,
    reach_problem,
    request_export,
    request_push,
)
from storage.models import TaskStatus
from storage.roles import ArtifactReader, RunReader
from storage.roles_tasks import ExportOnWorker, ExportTasks, RunTasks, TaskFollowing, TaskReach
from storage.store import RunRecord, TaskRecord

EXPORT_KINDS = ("export", "gguf")  # what the server serves of an export (app.server.SERVED_ARTIFACTS)
LOG_LINES = 30
TICK_S = 1.0  # how often a page following unfinished tasks reads them
EVENTS = "export-panel"  # the concurrency group of every event of the panel (see `wire`)


@dataclass
class ExportPanel:
    merged: gr.Checkbox
    dtype: gr.Radio
    gguf: gr.CheckboxGroup
    imatrix: gr.Checkbox
    start: gr.Button
    stop: gr.Button
    log: gr.Textbox
    files: gr.File
    repo: gr.Textbox
    what: gr.Radio
    private: gr.Checkbox
    push: gr.Button
    tasks: gr.State  # the ids of the tasks this page follows
    timer: gr.Timer  # active only while they are unfinished


def build() -> ExportPanel:
    """Lay out the panel; call inside the run tab."""
    with gr.Accordion("Export: merged model, GGUF, push to the hub", open=False, elem_id="export-panel"):
        gr.Markdown(
            "Merge the run's adapter into its base model (safetensors, for transformers and vLLM) and/or "
            "write GGUF files (llama.cpp, Ollama, LM Studio). A worker where the run's weights are does it; "
            "each file is checked against the run's own answers before it is kept. Prompt, prefix and "
            "P-tuning runs cannot merge; a full fine-tune is already a whole model (GGUF still works)."
        )
        with gr.Row():
            merged = gr.Checkbox(label="Merged model (--merged)", value=True, elem_id="export-merged")
            dtype = gr.Radio(list(DTYPES), value="bf16", label="Merged dtype (--dtype)", elem_id="export-dtype")
            gguf = gr.CheckboxGroup(list(GGUF_TYPES), value=[], label="GGUF (--gguf)", elem_id="export-gguf")
            imatrix = gr.Checkbox(
                label="K-quants with an importance matrix of the training rows (--imatrix)",
                value=False,
                elem_id="export-imatrix",
            )
            start = gr.Button("Export", variant="primary", scale=0, elem_id="export-start")
            stop = gr.Button("Stop", variant="stop", scale=0, elem_id="export-stop")
        with gr.Row():
            repo = gr.Textbox(
                label="Hub repository (--repo)", placeholder="OWNER/NAME, e.g. alice/smollm2-tag-adapter", scale=3
            )
            what = gr.Radio(list(PUSH_WHAT), value="bundle", label="What to push (--what)", elem_id="push-what")
            private = gr.Checkbox(label="Private repository (--private)", value=True, elem_id="push-private")
            push = gr.Button("Push", scale=0, elem_id="push-start")
        gr.Markdown(
            "A push uploads with the worker's own `HF_TOKEN` (set it where `tunedeck worker` runs); the "
            "dashboard never asks for a token. `bundle` is the adapter with its card, `merged` the newest "
            "merged export."
        )
        log = gr.Textbox(label="progress", lines=8, max_lines=LOG_LINES, interactive=False, elem_id="export-log")
        files = gr.File(
            label="export files", file_count="multiple", interactive=False, visible=False, elem_id="export-files"
        )
        tasks = gr.State([])
        timer = gr.Timer(TICK_S, active=False)
    return ExportPanel(merged, dtype, gguf, imatrix, start, stop, log, files, repo, what, private, push, tasks, timer)


def export_files(store: ArtifactReader, run_id: int) -> list[str]:
    """The run's recorded export files that exist inside the data folder (the ones the server serves)."""
    from app.ui.served_files import inside_data_dir

    found = [inside_data_dir(a.path) for a in store.artifacts(run_id) if a.kind in EXPORT_KINDS]
    return list(dict.fromkeys(str(p) for p in found if p is not None))


def files_update(store: ArtifactReader, run_id: Any) -> Any:
    paths = export_files(store, int(run_id)) if run_id is not None else []
    return gr.File(value=paths or None, visible=bool(paths))


def finished_run(store: RunReader, run_id: Any, doing: str) -> tuple[RunRecord | None, str | None]:
    """(the run, None) when it has a result to `doing`; else (None, why): none picked, no such run, not finished
    (the command's own check, `finished_problem`)."""
    if run_id is None:
        return None, "Pick a run first (Runs tab, or type its id above)."
    run = store.get_run(int(run_id))
    problem = finished_problem(run, int(run_id), doing)
    if problem is not None:
        return None, f"{problem[0]}. Fix: {problem[1]}"
    return run, None


def words(problem: Problem | None) -> str | None:
    return f"{problem.problem}. Fix: {problem.fix}" if problem else None


def refusal(store: TaskReach, run_id: Any, merged: bool, gguf: list[str], policy: AccessPolicy | None) -> str | None:
    """Why the export cannot be asked for (in words, with the fix), or None."""
    run, refused = finished_run(store, run_id, "export")
    if run is None:
        return refused
    if not merged and not gguf:
        return "Nothing chosen. Fix: tick 'Merged model' and/or a GGUF type."
    return words(loading_problem(spec_of(run), run.id, policy, "export it") or reach_problem(store, run))


def request(
    store: ExportOnWorker,
    policy: AccessPolicy | None,
    run_id: Any,
    merged: bool,
    dtype: str,
    gguf: list[str],
    imatrix: bool = False,
) -> tuple[str, list[int]]:
    """Queue the export's tasks for a worker: (what the log shows now, their ids); ([]: refused, and why)."""
    refused = refusal(store, run_id, merged, gguf or [], policy)
    if refused:
        return refused, []
    ids = request_export(store, int(run_id), merged, dtype, gguf or [], bool(imatrix))
    return progress_text(store.tasks_of(ids)), ids


def request_push_of(store: ExportOnWorker, run_id: Any, repo: str, what: str, private: bool) -> tuple[str, list[int]]:
    """Queue a push for a worker: (what the log shows now, [its id]); ([]: refused, and why, naming the field)."""
    run, refused = finished_run(store, run_id, "push")
    if run is not None:
        refused = words(reach_problem(store, run))
    if run is None or refused:
        return refused or "", []
    try:
        task_id = request_push(store, run.id, repo, what, bool(private))
    except PushError as exc:
        return "\n".join(f"{p.field}: {p.problem}. Fix: {p.fix}" for p in exc.problems), []
    return progress_text(store.tasks_of([task_id])), [task_id]


def ending(task: TaskRecord) -> str | None:
    """The line that says how a finished task ended (its files and their sha256), or None while it runs."""
    what = describe(task)
    if task.status is TaskStatus.SUCCEEDED and task.kind in EVALUATION_KINDS:
        return f"{what}: done; the scores are on this page and in the bundle's card"
    if task.status is TaskStatus.SUCCEEDED and task.kind == TaskKind.PUSH.value:
        return f"{what}: done: {(task.result or {}).get('url')}"
    if task.status is TaskStatus.SUCCEEDED:
        files = (task.result or {}).get("files") or []
        shown = [f"  {f['path']}  sha256 {f['sha256']}" for f in files if f.get("kind") in EXPORT_KINDS]
        return "\n".join([f"{what}: done, checked; the files are listed below", *shown])
    if task.status is TaskStatus.FAILED:
        kept = (
            ""
            if task.kind == TaskKind.PUSH.value or task.kind in EVALUATION_KINDS
            else " Nothing failing its check was kept."
        )
        return f"{what}: failed: {task.error}.{kept}"
    if task.status is TaskStatus.CANCELLED:
        return f"{what}: cancelled ({task.error or 'stopped'})"
    return None


def progress_text(tasks: list[TaskRecord]) -> str:
    """The tasks' logs and endings, newest lines last, at most LOG_LINES lines."""
    lines: list[str] = []
    for task in tasks:
        if task.status is TaskStatus.QUEUED:
            lines.append(f"{describe(task)}: queued, waiting for a worker that can reach run {task.run_id}'s weights")
            continue
        lines += task.log
        end = ending(task)
        if end:
            lines += end.split("\n")
    return "\n".join(lines[-LOG_LINES:])


def cancel_unfinished(store: TaskFollowing, ids: list[int]) -> None:
    """Stop: cancel the followed tasks that have not ended (the export and evaluate panels' Stop)."""
    for task in store.tasks_of(ids):
        if not task.status.finished:
            store.cancel_task(task.id)


def unfinished(tasks: list[TaskRecord]) -> bool:
    return any(not t.status.finished for t in tasks)


def unfinished_exports(store: RunTasks, run_id: Any) -> list[TaskRecord]:
    """The run's unfinished exports and pushes, oldest first (the Evaluate panel follows the evaluations)."""
    tasks = store.run_tasks(int(run_id)) if run_id is not None else []
    return [t for t in reversed(tasks) if t.kind not in EVALUATION_KINDS and not t.status.finished]


def wire(panel: ExportPanel, store: ExportTasks, run_id: gr.Number, policy: AccessPolicy | None = None) -> None:
    def opened(rid: Any) -> tuple[Any, ...]:
        """A run opened: its files, and its unfinished tasks followed again (a reload mid-export)."""
        following = unfinished_exports(store, rid)
        text = progress_text(following) if following else ""
        return files_update(store, rid), [t.id for t in following], text, gr.Timer(active=bool(following))

    def followed(current: list[int], text: str, ids: list[int]) -> tuple[Any, ...]:
        """New tasks followed beside the unfinished ones already followed; a refusal leaves those as they are."""
        if not ids:
            return text, gr.skip(), gr.skip()
        new = set(ids)
        tasks = [t for t in store.tasks_of([*current, *ids]) if t.id in new or not t.status.finished]
        return progress_text(tasks), [t.id for t in tasks], gr.Timer(active=True)

    def started(
        current: list[int], rid: Any, merged: bool, dtype: str, gguf: list[str], imatrix: bool = False
    ) -> tuple[Any, ...]:
        return followed(current, *request(store, policy, rid, merged, dtype, gguf, imatrix))

    def pushed(current: list[int], rid: Any, repo: str, what: str, private: bool) -> tuple[Any, ...]:
        return followed(current, *request_push_of(store, rid, repo, what, private))

    def ticked(ids: list[int], shown: str) -> tuple[Any, ...]:
        tasks = store.tasks_of(ids)
        text = progress_text(tasks)
        update = text if text != shown else gr.skip()  # nothing moved: nothing sent
        if unfinished(tasks):
            return update, gr.skip(), gr.skip()
        return update, gr.Timer(active=False), files_update(store, tasks[0].run_id if tasks else None)

    def stopped(ids: list[int]) -> None:
        cancel_unfinished(store, ids)

    # One queue for the panel's events, first come first served: a run's opening still being read would
    # otherwise land after an Export pressed just after it and drop the new tasks it follows (as the Chat tab).
    quiet: dict[str, Any] = {
        "show_progress": "hidden",
        "api_visibility": "private",
        "concurrency_id": EVENTS,
        "concurrency_limit": 1,
    }
    run_id.change(opened, run_id, [panel.files, panel.tasks, panel.log, panel.timer], **quiet)
    following = [panel.log, panel.tasks, panel.timer]
    chosen = [panel.tasks, run_id, panel.merged, panel.dtype, panel.gguf, panel.imatrix]
    panel.start.click(started, chosen, following, **quiet)
    panel.push.click(pushed, [panel.tasks, run_id, panel.repo, panel.what, panel.private], following, **quiet)
    panel.timer.tick(ticked, [panel.tasks, panel.log], [panel.log, panel.timer, panel.files], **quiet)
    panel.stop.click(stopped, panel.tasks, None, **quiet)
