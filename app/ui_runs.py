"""The runs table: one row per run with its status, progress, peak memory and last metrics.

Selecting a row opens that run's page (wired in app.ui); a status filter narrows the list.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import gradio as gr
import pandas as pd

from jobs.memory import human_bytes
from storage.models import RunStatus
from storage.store import RunRecord, Store

ALL = "all"
STATUS_FILTER = [ALL] + [s.value for s in RunStatus]
COLUMNS = ["id", "name", "model", "method", "status", "progress", "peak memory", "tokens/s", "last loss", "created"]


def progress_text(run: RunRecord) -> str:
    if run.total_steps:
        return f"{run.current_step}/{run.total_steps} ({100 * run.current_step / run.total_steps:.0f}%)"
    return f"{run.current_step}" if run.current_step else ""


def runs_frame(store: Store, status: str = ALL, limit: int = 200) -> pd.DataFrame:
    """The table's rows, newest first."""
    runs = store.list_runs(None if status in (ALL, "", None) else RunStatus(status), limit=limit)
    ids = [r.id for r in runs]
    loss = store.last_metric_values(ids, "loss")
    tps = store.last_metric_values(ids, "tokens_per_second")
    rows = [[r.id, r.name, r.spec.model, r.spec.method.value, r.status.value, progress_text(r),
             human_bytes(r.peak_memory_bytes) + (f" ({r.peak_memory_source})" if r.peak_memory_source else "")
             if r.peak_memory_bytes else "",
             f"{tps[r.id]:.0f}" if r.id in tps else "", f"{loss[r.id]:.4f}" if r.id in loss else "",
             time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.created_at))] for r in runs]
    return pd.DataFrame(rows, columns=COLUMNS)


@dataclass
class RunsView:
    status: gr.Dropdown
    refresh: gr.Button
    table: gr.Dataframe


def build() -> RunsView:
    """Lay out the runs tab; call inside a gr.Blocks context."""
    with gr.Row():
        status = gr.Dropdown(STATUS_FILTER, value=ALL, label="status filter", scale=1)
        refresh = gr.Button("Refresh", scale=0)
    table = gr.Dataframe(headers=COLUMNS, interactive=False, elem_id="runs-table", max_height=600)
    return RunsView(status, refresh, table)


def wire(view: RunsView, store: Store, timer: gr.Timer) -> None:
    def load(status: str) -> pd.DataFrame:
        return runs_frame(store, status)

    for event in (view.status.change, view.refresh.click, timer.tick):
        event(load, view.status, view.table, show_progress="hidden", api_visibility="private")
