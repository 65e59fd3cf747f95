"""The run page's management panel: tags, a note, the run's disk use, and Delete with a confirmation.

Delete asks first ("Delete run 5 ... and its 120 MiB of files?"); the confirmation deletes the
run it named, even if the page moved to another run meanwhile. A running run is refused with
the way out (cancel it, wait, delete). Checks and deletion are `app.run_summaries`'s, shared with the
CLI and the API. Laid out under the run page by app.ui.dashboard and fed by the page's run id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from jobs.errors import Problem
from jobs.queue import run_actions
from jobs.units import human_bytes
from storage.models import RunStatus
from storage.roles import RunFolders
from storage.roles_queue import RunActing
from storage.run_files import run_bytes


@dataclass
class ManagePanel:
    tags: gr.Textbox
    note: gr.Textbox
    save: gr.Button
    info: gr.Markdown
    delete: gr.Button
    confirm_box: gr.Group
    confirm_text: gr.Markdown
    confirm: gr.Button
    keep: gr.Button
    message: gr.Markdown
    asked: gr.State


def build() -> ManagePanel:
    """Lay out the panel; call inside the run tab."""
    with gr.Accordion("Tags, note and deletion", open=True):
        with gr.Row():
            tags = gr.Textbox(
                label="tags",
                info="separated by commas or spaces, e.g. baseline, lr-sweep",
                scale=2,
                max_lines=1,
                elem_id="run-tags",
            )
            note = gr.Textbox(label="note", lines=2, scale=3, elem_id="run-note")
            save = gr.Button("Save tags and note", scale=0, elem_id="save-notes")
        with gr.Row():
            info = gr.Markdown(elem_id="run-disk")
            delete = gr.Button("Delete run…", variant="stop", scale=0, elem_id="delete-run")
        with gr.Group(visible=False) as confirm_box:
            confirm_text = gr.Markdown(elem_id="delete-question")
            with gr.Row():
                confirm = gr.Button("Yes, delete it and its files", variant="stop", elem_id="delete-confirm")
                keep = gr.Button("No, keep it", elem_id="delete-keep")
        message = gr.Markdown(elem_id="manage-message")
    return ManagePanel(
        tags, note, save, info, delete, confirm_box, confirm_text, confirm, keep, message, gr.State(None)
    )


def _problems(problems: list[Problem]) -> str:
    return "\n".join(f"- **{p.field}**: {p.problem}. Fix: {p.fix}" for p in problems)


def disk_text(store: RunFolders, run_id: int) -> str:
    return f"Files of this run: **{human_bytes(run_bytes(store, run_id))}** on disk."


def wire(panel: ManagePanel, store: RunActing, run_id: gr.Number) -> None:
    def load(rid: float | None) -> list[Any]:
        run = store.get_run(int(rid)) if rid is not None else None
        if run is None:
            return ["", "", "", gr.Group(visible=False), ""]
        return [", ".join(run.tags), run.note or "", disk_text(store, run.id), gr.Group(visible=False), ""]

    def save(rid: float | None, tags: str, note: str) -> list[Any]:
        run = store.get_run(int(rid)) if rid is not None else None
        if run is None:
            return [gr.skip(), gr.skip(), "Open a run first."]
        try:
            wanted = run_actions.parse_tags(tags)
            changed = run_actions.tag(
                store, run.id, add=wanted, remove=[t for t in run.tags if t not in wanted], note=note or "", field="run"
            )
        except run_actions.RunCommandError as exc:
            return [gr.skip(), gr.skip(), "**Not saved**\n" + _problems(exc.problems)]
        return [", ".join(changed.tags), changed.note or "", f"Saved the tags and note of run {changed.id}."]

    def ask(rid: float | None) -> list[Any]:
        run = store.get_run(int(rid)) if rid is not None else None
        if run is None:
            return [gr.Group(visible=False), "", None, "Open a run first."]
        if run.status is RunStatus.RUNNING:
            return [
                gr.Group(visible=False),
                "",
                None,
                f"Run {run.id} is running: cancel it first, wait until it shows *cancelled*, then delete it.",
            ]
        question = (
            f"**Delete run {run.id} ({run.name})** with its metrics, memory samples, log, checkpoints and "
            f"bundle, **{human_bytes(run_bytes(store, run.id))}** of files? This cannot be undone."
        )
        return [gr.Group(visible=True), question, run.id, ""]

    def confirm(asked: int | None) -> list[Any]:
        if asked is None:
            return [gr.Group(visible=False), None, ""]
        try:
            report = run_actions.delete(store, int(asked), field="run")
        except run_actions.RunCommandError as exc:
            return [gr.Group(visible=False), None, "**Not deleted**\n" + _problems(exc.problems)]
        return [gr.Group(visible=False), None, report.message[0].upper() + report.message[1:] + "."]

    run_id.change(load, run_id, [panel.tags, panel.note, panel.info, panel.confirm_box, panel.message])
    panel.save.click(save, [run_id, panel.tags, panel.note], [panel.tags, panel.note, panel.message])
    panel.delete.click(ask, run_id, [panel.confirm_box, panel.confirm_text, panel.asked, panel.message])
    panel.keep.click(lambda: (gr.Group(visible=False), None, ""), None, [panel.confirm_box, panel.asked, panel.message])
    panel.confirm.click(confirm, panel.asked, [panel.confirm_box, panel.asked, panel.message])
