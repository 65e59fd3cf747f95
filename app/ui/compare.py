"""Compare runs: spec differences side by side, measured cost, time vs memory, loss curves overlaid.

Pick several runs; the view shows
- one table: a row per spec field whose value differs between the picked runs, then the
  measured results (status, the training doctor's findings, the figures of jobs.train.figures: peak memory and its source, tokens/s,
  step time, loss; the memory prediction's error, for the whole run and per phase where the run
  recorded its phases (jobs.train.phases); then final eval loss, trainable parameters, runtime; then
  each benchmark and judge score a run has, the run's beside its base's: jobs.evaluate), one column per run;
- a scatter of peak memory (GiB) against tokens/s, one point per run: the time vs memory
  trade-off of each choice, measured on this machine;
- the runs' training loss curves overlaid, downsampled by the store's bucket methods.

The table and frames are pure functions of store reads (`compare_table`, `summarize_run`,
`tradeoff_frame`, `loss_frame`), tested in tests/test_compare.py; the handlers only call them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from app.ui import charts, series
from app.ui.findings_view import icon_text
from jobs.spec.stored import spec_of
from jobs.train import figures
from jobs.train.phases import PHASES, PhaseRow, load_phases, phase_rows
from jobs.units import human_count
from storage.roles_pages import RunReport
from storage.store import RunRecord

_GIB = 1024**3
FIGURE_ROWS = (figures.PEAK_MEMORY, figures.TOKENS_PER_SECOND, figures.STEP_TIME, figures.LOSS)
RESULT_ROWS = [
    "status",
    "doctor",
    *(f.label for f in FIGURE_ROWS),
    "predicted peak (error)",
    *(f"{name} memory (error)" for name in PHASES),
    "final eval loss",
    "trainable params",
    "runtime",
]
FIELD = "field"
GRAPHS = "compare-graphs"  # the concurrency group of the events that draw the plots (charts.redraw_after)


@dataclass(frozen=True)
class RunSummary:
    """The measured results of one run, as the compare view shows them (None = not measured)."""

    run_id: int
    name: str
    status: str
    figures: figures.RunFigures
    eval_loss: float | None
    trainable_params: int | None
    total_params: int | None
    runtime_s: float | None
    predicted: str = ""  # the memory prediction saved at submit against the measured peak (jobs.memory.predict)
    phases: tuple[PhaseRow, ...] = ()  # per phase, predicted against measured (jobs.train.phases); () unrecorded
    scores: tuple[tuple[str, str], ...] = ()  # ("task: metric", "run ± stderr (base ...)") per benchmark score
    findings: str = ""  # the training doctor's findings: "⚠️ loss_spike@40" (app.ui.findings_view.icon_text)

    @property
    def label(self) -> str:
        return run_label(self.run_id, self.name)

    @property
    def tokens_per_second(self) -> float | None:
        return self.figures.tokens_per_second

    @property
    def peak_memory_bytes(self) -> int | None:
        return self.figures.peak_memory_bytes


def run_label(run_id: int, name: str) -> str:
    """The column / legend name of a run: '#3 smollm2-lora-sft'."""
    return f"#{run_id} {name}"


def run_choice(run: RunRecord) -> tuple[str, int]:
    """A (label, value) dropdown choice: 'id · name · status' -> run id."""
    return f"{run.id} · {run.name} · {run.status.value}", run.id


# ---------------------------------------------------------------------- pure parts
def spec_differences(runs: Sequence[RunRecord]) -> list[tuple[str, list[Any]]]:
    """(field, value per run) for every spec field whose value is not the same in all runs."""
    specs = [spec_of(r).to_dict() for r in runs]
    if len(specs) < 2:
        return []
    return [(name, [s[name] for s in specs]) for name in specs[0] if len({repr(s[name]) for s in specs}) > 1]


def _final(run: RunRecord, key: str) -> float | None:
    value = run.final_metrics.get(key)
    return float(value) if isinstance(value, (int, float)) else None


def summarize_run(store: RunReport, run: RunRecord, now: float | None = None) -> RunSummary:
    """Measured results of `run`: its figures (jobs.train.figures), then final metrics or what its rows say so far."""
    last_eval = store.last_metric(run.id, "eval_loss")
    eval_loss = (
        _final(run, "eval_loss") if _final(run, "eval_loss") is not None else (last_eval.value if last_eval else None)
    )
    trainable = _final(run, "trainable_params") or run.resolved_config.get("trainable_params")
    total = _final(run, "total_params") or run.resolved_config.get("total_params")
    runtime = _final(run, "train_runtime")
    if runtime is None and run.started_at is not None:
        end = run.finished_at or (time.time() if now is None else now)
        runtime = max(0.0, end - run.started_at)
    from jobs.memory.breakdown import prediction_error_text
    from jobs.queue.saved_prediction import load_prediction

    saved = load_prediction(store, run.id)
    predicted = prediction_error_text(saved, run.peak_memory_bytes, run.peak_memory_source, run.current_step)
    return RunSummary(
        run.id,
        run.name,
        run.status.value,
        figures.run_figures(store, run),
        eval_loss,
        int(trainable) if trainable is not None else None,
        int(total) if total is not None else None,
        runtime,
        predicted,
        tuple(phase_rows(saved, load_phases(store, run.id))),
        score_cells(store, run.id),
        icon_text(store.run_events(run.id)),
    )


def score_cells(store: RunReport, run_id: int) -> tuple[tuple[str, str], ...]:
    """The run's benchmark and judge scores as compare rows: the run's value, its base's beside it."""
    from jobs.evaluate.card import scores_rows

    return tuple(
        (f"{task}: {metric}", run + (f" (base {base})" if base != "-" else ""))
        for task, metric, base, run, _change in scores_rows(store.scores(run_id))
    )


def _num(x: float | None, fmt: str) -> str:
    return "" if x is None else format(x, fmt)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m {secs:02d}s" if minutes else f"{seconds:.1f}s"


def result_values(s: RunSummary) -> list[str]:
    """The RESULT_ROWS cells of one run, as text."""
    params = ""
    if s.trainable_params is not None:
        params = human_count(s.trainable_params)
        if s.total_params:
            params += f" ({100 * s.trainable_params / s.total_params:.2f}%)"
    return [
        s.status,
        s.findings,
        *(s.figures.text(f) for f in FIGURE_ROWS),
        s.predicted,
        *(r.summary() for r in s.phases or [PhaseRow(name, None, None) for name in PHASES]),
        _num(s.eval_loss, ".4f"),
        params,
        _duration(s.runtime_s),
    ]


def compare_table(runs: Sequence[RunRecord], summaries: Sequence[RunSummary]) -> pd.DataFrame:
    """Differing spec fields, then the measured results: one row each, one column per run."""
    columns = [FIELD] + [run_label(r.id, r.name) for r in runs]
    rows: list[list[Any]] = [
        [name, *("" if v is None else str(v) for v in values)] for name, values in spec_differences(runs)
    ]
    per_run = [result_values(s) for s in summaries]
    rows += [[name, *(cells[i] for cells in per_run)] for i, name in enumerate(RESULT_ROWS)]
    labels = list(dict.fromkeys(label for s in summaries for label, _ in s.scores))  # each run's scores lined up
    rows += [[label, *(dict(s.scores).get(label, "") for s in summaries)] for label in labels]
    return pd.DataFrame(rows, columns=_unique(columns))


def _unique(columns: list[str]) -> list[str]:
    """Column names made unique (a run picked twice would otherwise break the frame)."""
    seen: dict[str, int] = {}
    out = []
    for c in columns:
        seen[c] = seen.get(c, 0) + 1
        out.append(c if seen[c] == 1 else f"{c} ({seen[c]})")
    return out


def tradeoff_frame(summaries: Sequence[RunSummary]) -> pd.DataFrame:
    """Columns tokens/s (whole), peak GiB (3 decimals), series (the run): one point per measured run."""
    rows = [
        (round(s.tokens_per_second), round(s.peak_memory_bytes / _GIB, 3), s.label)
        for s in summaries
        if s.tokens_per_second is not None and s.peak_memory_bytes
    ]
    return charts.COMPARE_TRADEOFF.frame(rows)


def loss_frame(cache: series.MetricSeriesCache, runs: Sequence[RunRecord]) -> pd.DataFrame:
    """Columns step, loss, series: each run's training loss, <= ~2000 points per run."""
    frame = series.metric_frame({run_label(r.id, r.name): cache.get(r.id, "loss") for r in runs})
    return frame.rename(columns={"value": charts.COMPARE_LOSS.y})


# ---------------------------------------------------------------------- layout and handlers
@dataclass
class CompareView:
    runs: gr.Dropdown
    refresh: gr.Button
    table: gr.Dataframe
    tradeoff: gr.ScatterPlot
    loss: gr.LinePlot
    styles: gr.State

    @property
    def outputs(self) -> list[gr.Component]:
        return [self.table, self.tradeoff, self.loss, self.styles]

    @property
    def plots(self) -> list[tuple[charts.Chart, gr.components.Component]]:
        return [(charts.COMPARE_TRADEOFF, self.tradeoff), (charts.COMPARE_LOSS, self.loss)]


def build() -> CompareView:
    """Lay out the compare tab; call inside a gr.Blocks context."""
    with gr.Row():
        runs = gr.Dropdown(
            [],
            value=[],
            multiselect=True,
            label="runs to compare (id · name · status)",
            elem_id="compare-runs",
            scale=4,
        )
        refresh = gr.Button("Refresh", scale=0)
    table = gr.Dataframe(
        label="Spec differences and measured results", interactive=False, elem_id="compare-table", wrap=True
    )
    with gr.Row():
        tradeoff = charts.COMPARE_TRADEOFF.build()
        loss = charts.COMPARE_LOSS.build()
    assert isinstance(tradeoff, gr.ScatterPlot) and isinstance(loss, gr.LinePlot)
    return CompareView(runs, refresh, table, tradeoff, loss, gr.State({}))


class CompareData:
    """The view's values from the store."""

    def __init__(self, store: RunReport, limit: int = 200):
        self.store = store
        self.limit = limit
        self.metrics = series.MetricSeriesCache(store)

    def choices(self) -> Any:
        """The dropdown with every run (newest first); the selection is left as it is."""
        return gr.Dropdown(choices=[run_choice(r) for r in self.store.list_runs(limit=self.limit)])

    def compare(self, selected: Sequence[int | str] | None) -> list[Any]:
        """(table, scatter data, loss overlay data, their styles) for the picked runs; a run picked twice
        counts once."""
        ids = dict.fromkeys(int(i) for i in selected or [])
        runs = [r for r in (self.store.get_run(i) for i in ids) if r is not None]
        summaries = [summarize_run(self.store, r) for r in runs]
        tradeoff, loss = tradeoff_frame(summaries), loss_frame(self.metrics, runs)
        styles = {
            charts.COMPARE_TRADEOFF.elem_id: charts.COMPARE_TRADEOFF.style(tradeoff),
            charts.COMPARE_LOSS.elem_id: charts.COMPARE_LOSS.style(loss),
        }
        return [
            compare_table(runs, summaries),
            charts.COMPARE_TRADEOFF.update(tradeoff),
            charts.COMPARE_LOSS.update(loss),
            styles,
        ]


def wire(view: CompareView, store: RunReport, tab: gr.Tab | None = None) -> CompareData:
    """Fill the choices on refresh (and when the tab opens); redraw on every change of selection."""
    data = CompareData(store)
    opens = [view.refresh.click] + ([tab.select] if tab is not None else [])
    for event in opens:
        drawn = event(data.choices, None, view.runs, show_progress="hidden", api_visibility="private").then(
            data.compare,
            view.runs,
            view.outputs,
            show_progress="hidden",
            api_visibility="private",
            concurrency_id=GRAPHS,
            concurrency_limit=1,
        )
        charts.redraw_after(drawn, view.plots, view.styles, GRAPHS)
    # input, not change: a refresh re-sets the value and already redraws through .then above.
    # always_last: a pick made while the previous one is drawn is drawn next (the default, once, drops it).
    picked = view.runs.input(
        data.compare,
        view.runs,
        view.outputs,
        show_progress="hidden",
        api_visibility="private",
        concurrency_id=GRAPHS,
        concurrency_limit=1,
        trigger_mode="always_last",
    )
    charts.redraw_after(picked, view.plots, view.styles, GRAPHS)
    return data
