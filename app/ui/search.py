"""The Search tab: start a hyperparameter search from a run's spec, and read a search's page.

A search's page: its summary (state, objective, best so far), the trials table (values, objective, state:
complete, pruned, infeasible with the reason, ...), Optuna's parameter importances and a parallel-coordinates
view, both drawn with the dashboard's own charts (`app.ui.charts`), and "Launch the best settings in full".
Handlers only parse, call jobs/store, and return (`jobs.search`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from app.ui import charts
from jobs.checks.access import AccessPolicy
from jobs.errors import ProblemError
from jobs.search.report import SearchReport
from jobs.spec.stored import spec_of
from storage.roles_queue import SearchPages

GROUP = "search-page"  # the concurrency group of every event that draws the search page's plots
IMPORTANCE = charts.Chart(  # one bar per parameter: a line from 0 up to its importance, at x = 1, 2, ...
    "search-importance",
    "Parameter importance (Optuna, fANOVA)",
    "parameter",
    "importance",
    "parameter (see the legend)",
    "importance (sums to 1)",
    x_lim=(0.0, None),
    y_lim=(0.0, 1.0),
    x_format="d",
)
PARALLEL = charts.Chart(
    "search-parallel",
    "Parallel coordinates: each trial's values and objective, each axis scaled 0-1",
    "axis",
    "scaled",
    "axis (in the summary's order)",
    "value, scaled 0-1",
    y_lim=(0.0, 1.0),
)
COLUMNS = ["trial", "state", "run", "objective", "values", "note"]


@dataclass
class SearchPage:
    search: gr.Dropdown
    refresh: gr.Button
    summary: gr.Markdown
    table: gr.Dataframe
    importance: Any
    parallel: Any
    styles: gr.State
    launch_best: gr.Button
    launched: gr.Markdown
    compare: gr.Button
    start_run: gr.Number
    space: gr.Textbox
    trials: gr.Number
    objective: gr.Textbox
    parallel_trials: gr.Number
    steps: gr.Number
    start: gr.Button
    started: gr.Markdown


def build() -> SearchPage:
    gr.Markdown("### Start a search\nVary fields of a run's spec; a worker runs the trials as runs tagged `search-N`.")
    with gr.Row():
        start_run = gr.Number(None, precision=0, label="Base spec: run id", scale=1, elem_id="search-base-run")
        space = gr.Textbox(
            "learning_rate=loguniform(1e-5,1e-3)\nlora_r=[8,16,32]",
            lines=3,
            label="Search space, one FIELD=VALUES a line",
            scale=3,
            elem_id="search-space",
        )
    with gr.Row():
        trials = gr.Number(8, precision=0, minimum=1, label="Trials", scale=1)
        objective = gr.Textbox("eval_loss", label="Objective (a metric as stored)", scale=1)
        parallel_trials = gr.Number(1, precision=0, minimum=1, label="Trials at once", scale=1)
        steps = gr.Number(None, precision=0, label="Steps per trial (0: the spec's)", scale=1)
        start = gr.Button("Start search", elem_id="search-start", scale=0)
    started = gr.Markdown(elem_id="search-started")
    gr.Markdown("### Searches")
    with gr.Row():
        search = gr.Dropdown([], label="Search", elem_id="search-choice", scale=3)
        refresh = gr.Button("Refresh", elem_id="search-refresh", scale=0)
    summary = gr.Markdown(elem_id="search-summary")
    table = gr.Dataframe(headers=COLUMNS, interactive=False, elem_id="search-trials", wrap=True)
    with gr.Row():
        importance = IMPORTANCE.build()
        parallel = PARALLEL.build()
    styles = gr.State({})
    with gr.Row():
        launch_best = gr.Button("Launch the best settings in full", elem_id="search-launch-best", scale=0)
        compare = gr.Button("Compare the trials", elem_id="search-compare", scale=0)
        launched = gr.Markdown(elem_id="search-launched")
    return SearchPage(
        search, refresh, summary, table, importance, parallel, styles, launch_best, launched, compare,
        start_run, space, trials, objective, parallel_trials, steps, start, started,
    )  # fmt: skip


def summary_markdown(report: SearchReport) -> str:
    plan = report.plan
    lines = [
        f"**Search {report.search_id}** ({report.state}): {report.name}",
        f"{plan.direction} `{plan.objective}` over {plan.space.describe()}; "
        f"{len(report.rows)} of {plan.trials} trials, {plan.parallel} at once",
    ]
    best = report.best
    if best is not None:
        values = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in best["params"].items())
        lines.append(f"**Best so far:** trial {best['trial']} (run {best['run_id']}): {best['value']:.4g}; {values}")
    else:
        lines.append("**Best so far:** no trial has finished yet")
    lines.append("Parallel-coordinates axes: " + " · ".join(plan.space.fields + [plan.objective]))
    return "\n\n".join(lines)


def table_frame(report: SearchReport) -> pd.DataFrame:
    def fmt(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    rows = [
        [
            r["trial"],
            r["state"],
            r["run_id"],
            round(r["value"], 5) if r["value"] is not None else None,
            ", ".join(f"{k}={fmt(v)}" for k, v in r["params"].items()),
            r["reason"] or "",
        ]
        for r in report.rows
    ]
    return pd.DataFrame(rows, columns=COLUMNS)


def importance_frame(report: SearchReport) -> pd.DataFrame:
    bars = enumerate(report.importances.items(), start=1)
    return IMPORTANCE.frame(row for i, (name, value) in bars for row in ((i, 0.0, name), (i, value, name)))


def parallel_frame(report: SearchReport) -> pd.DataFrame:
    """Each finished trial as a line over the space's fields and the objective, each axis scaled to 0-1
    (choices by their position in the list)."""
    done = [r for r in report.rows if r["value"] is not None and r["state"] in ("complete", "pruned")]
    axes: list[list[float]] = []
    for d in report.plan.space.dimensions:
        if d.kind == "choice":
            axes.append([d.choices.index(r["params"][d.field]) / max(1, len(d.choices) - 1) for r in done])
        else:
            axes.append([float(r["params"][d.field]) for r in done])
    axes.append([float(r["value"]) for r in done])
    scaled = []
    for values in axes:
        low, high = (min(values), max(values)) if values else (0.0, 1.0)
        scaled.append([(v - low) / (high - low) if high > low else 0.5 for v in values])
    return PARALLEL.frame(
        (axis, scaled[axis][i], f"trial {r['trial']} ({r['state']})")
        for i, r in enumerate(done)
        for axis in range(len(scaled))
    )


def draw(store: SearchPages, search_id: int | None) -> tuple[Any, ...]:
    from jobs.search.report import search_report

    if search_id is None:
        empty = (IMPORTANCE.frame([]), PARALLEL.frame([]))
        return (
            "No search yet.",
            pd.DataFrame(columns=COLUMNS),
            *(c.update(f) for c, f in zip((IMPORTANCE, PARALLEL), empty)),
            {},
        )
    report = search_report(store, int(search_id))
    imp, par = importance_frame(report), parallel_frame(report)
    styles = {IMPORTANCE.elem_id: IMPORTANCE.style(imp), PARALLEL.elem_id: PARALLEL.style(par)}
    return summary_markdown(report), table_frame(report), IMPORTANCE.update(imp), PARALLEL.update(par), styles


def trial_runs(store: SearchPages, search_id: Any) -> list[int]:
    """The run ids of a search's queued trials, in trial order (what Compare shows side by side)."""
    from jobs.search.report import search_report

    if search_id in (None, ""):
        return []
    return [r["run_id"] for r in search_report(store, int(search_id), importance=False).rows if r["run_id"]]


def start_from_run(store: SearchPages, policy: AccessPolicy, run_id: Any, space: str, *numbers: Any) -> str:
    from jobs.search.driver import start_search
    from jobs.search.plan import SearchPlan

    trials, objective, parallel, steps = numbers
    run = store.get_run(int(run_id)) if run_id is not None else None
    if run is None:
        raise gr.Error("Give the id of a run whose spec the search starts from.")
    lines = [line.strip() for line in (space or "").splitlines() if line.strip()]
    try:
        plan = SearchPlan.build(
            spec_of(run),
            lines,
            objective=objective or "eval_loss",
            trials=int(trials or 8),
            parallel=int(parallel or 1),
            steps=int(steps) if steps else None,
        )
        search = start_search(store, plan, policy=policy)
    except ProblemError as exc:
        return "\n".join(f"- **{p.field}**: {p.problem}. Fix: {p.fix}" for p in exc.problems)
    return f"Search {search.id} started: a worker runs its trials (pick it below and Refresh)."


def launch_best(store: SearchPages, policy: AccessPolicy, search_id: Any) -> str:
    from jobs.queue.submit import submit
    from jobs.search.report import best_spec

    if search_id is None:
        raise gr.Error("Pick a search first.")
    try:
        run_id = submit(store, best_spec(store, int(search_id)), policy)
    except ProblemError as exc:
        return "\n".join(f"- **{p.field}**: {p.problem}. Fix: {p.fix}" for p in exc.problems)
    return f"Queued run {run_id}: the best settings of search {search_id}, trained in full."


def wire(page: SearchPage, store: SearchPages, policy: AccessPolicy, tab: gr.Tab | None = None) -> None:
    hidden: dict[str, Any] = {"show_progress": "hidden", "api_visibility": "private"}
    outputs = [page.summary, page.table, page.importance, page.parallel, page.styles]
    plots = [(IMPORTANCE, page.importance), (PARALLEL, page.parallel)]

    def choices() -> Any:
        found = store.list_searches()
        return gr.Dropdown([(f"search {s.id} ({s.state})", s.id) for s in found], value=found[0].id if found else None)

    def redraw(search_id: int | None) -> tuple[Any, ...]:
        return draw(store, search_id)

    opens = [page.refresh.click] + ([tab.select] if tab is not None else [])
    for event in opens:
        shown = event(choices, None, page.search, **hidden).then(
            redraw, page.search, outputs, concurrency_id=GROUP, concurrency_limit=1, **hidden
        )
        charts.redraw_after(shown, plots, page.styles, GROUP)
    picked = page.search.input(redraw, page.search, outputs, concurrency_id=GROUP, concurrency_limit=1, **hidden)
    charts.redraw_after(picked, plots, page.styles, GROUP)
    page.launch_best.click(lambda sid: launch_best(store, policy, sid), page.search, page.launched, **hidden)
    page.start.click(
        lambda *args: start_from_run(store, policy, *args),
        [page.start_run, page.space, page.trials, page.objective, page.parallel_trials, page.steps],
        page.started,
        api_visibility="private",
    )
