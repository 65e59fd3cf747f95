"""The runs table: one row per run with its status, progress and figures (jobs.train.figures).

The "doctor" column shows the training doctor's findings (the gravest one's icon, then code@step).
Selecting a row opens that run's page (wired in app.ui.dashboard); a status filter and a search box (name,
tags or note) narrow the list. Each row shows the run's tags and disk use; a line below the
table gives the disk use of all runs (re-measured at most every TOTAL_EVERY_S seconds).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import gradio as gr
import pandas as pd

from app.ui.findings_view import icon_text
from jobs.doctor.findings import EVENT_KIND
from jobs.spec.stored import spec_of
from jobs.train import figures
from jobs.units import human_bytes
from storage.models import RunStatus
from storage.roles_pages import RunCounts
from storage.run_files import DiskUsage, total_bytes
from storage.store import RunRecord

ALL = "all"
STATUS_FILTER = [ALL] + [s.value for s in RunStatus]
FIGURE_COLUMNS = (figures.PEAK_MEMORY, figures.TOKENS_PER_SECOND, figures.LOSS)
COLUMNS = [
    "id",
    "name",
    "model",
    "method",
    "status",
    "doctor",
    "progress",
    "tags",
    "disk",
    *(f.label for f in FIGURE_COLUMNS),
    "created",
]
TOTAL_EVERY_S = 30.0


def progress_text(run: RunRecord) -> str:
    if run.total_steps:
        return f"{run.current_step}/{run.total_steps} ({100 * run.current_step / run.total_steps:.0f}%)"
    return f"{run.current_step}" if run.current_step else ""


def runs_frame(
    store: RunCounts, status: str = ALL, limit: int = 200, search: str = "", disk: DiskUsage | None = None
) -> pd.DataFrame:
    """The table's rows, newest first."""
    runs = store.list_runs(None if status in (ALL, "", None) else RunStatus(status), limit=limit, search=search or None)
    disk = disk or DiskUsage(store)
    measured = figures.figures_of_runs(store, runs)
    found = store.events_of_runs([r.id for r in runs], EVENT_KIND)  # one read for the doctor column
    rows = [
        [
            r.id,
            r.name,
            spec_of(r).model,
            spec_of(r).method.value,
            r.status.value,
            icon_text(found.get(r.id, [])),
            progress_text(r),
            ", ".join(r.tags),
            human_bytes(disk.of(r)),
            *(measured[r.id].text(f) for f in FIGURE_COLUMNS),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.created_at)),
        ]
        for r in runs
    ]
    return pd.DataFrame(rows, columns=COLUMNS)


class TotalDisk:
    """The runs folder's size, measured again only after `every_s` seconds (it walks every file)."""

    def __init__(self, every_s: float = TOTAL_EVERY_S):
        self.every_s = every_s
        self._at, self._bytes = -math.inf, 0

    def text(self, store: RunCounts) -> str:
        now = time.monotonic()
        if now - self._at >= self.every_s:
            self._at, self._bytes = now, total_bytes(store)
        return f"All {store.count_runs()} run(s) use **{human_bytes(self._bytes)}** on disk."


@dataclass
class RunsView:
    status: gr.Dropdown
    search: gr.Textbox
    refresh: gr.Button
    table: gr.Dataframe
    total: gr.Markdown


def build() -> RunsView:
    """Lay out the runs tab; call inside a gr.Blocks context."""
    with gr.Row():
        status = gr.Dropdown(STATUS_FILTER, value=ALL, label="status filter", scale=1)
        search = gr.Textbox(
            label="search (name, tags, note)", placeholder="e.g. baseline", scale=2, elem_id="runs-search", max_lines=1
        )
        refresh = gr.Button("Refresh", scale=0, elem_id="runs-refresh")  # also pressed by the live stream
    table = gr.Dataframe(headers=COLUMNS, interactive=False, elem_id="runs-table", max_height=600)
    total = gr.Markdown(elem_id="runs-disk-total")
    return RunsView(status, search, refresh, table, total)


def wire(view: RunsView, store: RunCounts) -> None:
    """The table is read on a filter change, on Refresh, and when the page's live stream says a run
    was added or moved (it presses Refresh; only while the Runs tab is shown: `app.ui.live`)."""
    disk, total = DiskUsage(store), TotalDisk()

    def load(status: str, search: str) -> tuple[pd.DataFrame, str]:
        return runs_frame(store, status, search=search, disk=disk), total.text(store)

    for event in (view.status.change, view.search.submit, view.search.change, view.refresh.click):
        event(
            load, [view.status, view.search], [view.table, view.total], show_progress="hidden", api_visibility="private"
        )
