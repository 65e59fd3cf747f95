"""Trick sweeps in the dashboard: queue one from the run page, read its table in the Compare tab.

The run page gets a small "Trick sweep" accordion (tricks, steps, a button) that queues probe
runs of the open run's submitted spec (`jobs.queue.sweep.queue_sweep`); the Compare tab gets a section
with the chosen sweep's table: peak memory and seconds per step per trick, relative to the
baseline. Handlers only parse, call jobs/store, and return.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from jobs.queue.sweep import DEFAULT_STEPS, DEFAULT_TRICKS, queue_sweep, sweep_table
from jobs.spec.job import SpecError
from jobs.spec.stored import spec_of
from jobs.spec.tricks.registry import TRICK_HELP, Trick
from storage.roles import Sweeps

COLUMNS = ["trick", "run", "status", "peak memory (GiB)", "memory vs baseline", "s/step", "time vs baseline", "change"]


def table_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    def num(x: float | None, digits: int) -> float | None:
        return round(x, digits) if x is not None else None

    return pd.DataFrame(
        [
            [
                r["trick"],
                r["run_id"],
                r["status"],
                num(r["peak_bytes"] / 1024**3, 3) if r["peak_bytes"] else None,
                num(r["memory_vs_baseline"], 2),
                num(r["step_time"], 4),
                num(r["time_vs_baseline"], 2),
                r["change"],
            ]
            for r in rows
        ],
        columns=COLUMNS,
    )


@dataclass
class SweepControls:
    """On the run page: which tricks, how many steps, and the button."""

    tricks: gr.CheckboxGroup
    steps: gr.Number
    queue: gr.Button
    result: gr.Markdown


@dataclass
class SweepSection:
    """In the Compare tab: pick a sweep, see its table."""

    sweep: gr.Dropdown
    refresh: gr.Button
    table: gr.Dataframe


def build_controls() -> SweepControls:
    with gr.Accordion(
        "Trick sweep: short probe runs of this spec, one memory trick each", open=False, elem_id="trick-sweep"
    ):
        tricks = gr.CheckboxGroup(
            [(f"{t.value} ({TRICK_HELP[t]})", t.value) for t in Trick],
            value=[t.value for t in DEFAULT_TRICKS],
            label="Tricks (those that do not apply are skipped)",
        )
        with gr.Row():
            steps = gr.Number(DEFAULT_STEPS, precision=0, minimum=1, label="Optimizer steps per probe", scale=1)
            queue = gr.Button("Queue trick sweep", elem_id="queue-sweep", scale=0)
        result = gr.Markdown(elem_id="sweep-result")
    return SweepControls(tricks, steps, queue, result)


def build_section() -> SweepSection:
    gr.Markdown(
        "### Trick sweeps\nPeak memory and time per optimizer step of each trick, relative to the baseline probe."
    )
    with gr.Row():
        sweep = gr.Dropdown([], label="Sweep", elem_id="sweep-choice", scale=3)
        refresh = gr.Button("Refresh sweeps", scale=0)
    table = gr.Dataframe(headers=COLUMNS, interactive=False, elem_id="sweep-table")
    return SweepSection(sweep, refresh, table)


def queue_from_run(store: Sweeps, run_id: float | None, chosen: list[str], steps: float | None) -> str:
    """Queue a sweep of the open run's submitted spec; returns what was queued and skipped."""
    run = store.get_run(int(run_id)) if run_id is not None else None
    if run is None:
        raise gr.Error("Open a run first.")
    try:
        queued = queue_sweep(store, spec_of(run), [Trick(t) for t in chosen or []], int(steps or DEFAULT_STEPS))
    except SpecError as exc:
        raise gr.Error("; ".join(str(p) for p in exc.problems)) from None  # the problems are the answer
    lines = [
        f"Sweep {queued.sweep_id}: queued runs {', '.join(map(str, queued.run_ids))}; its table is in the Compare tab."
    ]
    lines += [f"- skipped {trick}: {why}" for trick, why in queued.skipped]
    return "\n".join(lines)


def wire(
    controls: SweepControls, section: SweepSection, store: Sweeps, run_id: gr.Number, compare_tab: gr.Tab | None = None
) -> None:
    def choices() -> Any:
        ids = store.sweep_ids()
        return gr.Dropdown([(f"sweep {i}", i) for i in ids], value=ids[0] if ids else None)

    def table(sweep_id: int | None) -> pd.DataFrame:
        return table_frame(sweep_table(store, int(sweep_id))) if sweep_id is not None else pd.DataFrame(columns=COLUMNS)

    controls.queue.click(
        lambda rid, chosen, steps: queue_from_run(store, rid, chosen, steps),
        [run_id, controls.tricks, controls.steps],
        controls.result,
        api_visibility="private",
    )
    opens = [section.refresh.click] + ([compare_tab.select] if compare_tab is not None else [])
    for event in opens:
        event(choices, None, section.sweep, show_progress="hidden", api_visibility="private").then(
            table, section.sweep, section.table, show_progress="hidden", api_visibility="private"
        )
    section.sweep.input(table, section.sweep, section.table, show_progress="hidden", api_visibility="private")
