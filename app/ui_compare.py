"""Compare runs: spec differences side by side, measured cost, time vs memory, loss curves overlaid.

Pick several runs; the view shows
- one table: a row per spec field whose value differs between the picked runs, then the
  measured results (status, peak memory and its source, mean tokens/s, mean step time, final
  train/eval loss, trainable parameters, runtime), one column per run;
- a scatter of peak memory (GiB) against tokens/s, one point per run: the time vs memory
  trade-off of each choice, measured on this machine;
- the runs' training loss curves overlaid, downsampled by the store's bucket methods.

The table and frames are pure functions of store reads (`compare_table`, `summarize_run`,
`tradeoff_frame`, `loss_frame`), tested in tests/test_compare.py; the handlers only call them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import gradio as gr
import pandas as pd

from app import series
from jobs.memory import human_bytes, human_count
from storage.store import RunRecord, Store

_GIB = 1024 ** 3
# One bucket covers every step of a run below 2**20, read from the level-16 rollups (cheap).
_WHOLE_RUN_WIDTH = 1 << 20
RESULT_ROWS = ["status", "peak memory", "predicted peak (error)", "mean tokens/s", "mean step time", "final train loss",
               "final eval loss", "trainable params", "runtime"]
FIELD = "field"


@dataclass(frozen=True)
class RunSummary:
    """The measured results of one run, as the compare view shows them (None = not measured)."""

    run_id: int
    name: str
    status: str
    peak_memory_bytes: int | None
    peak_memory_source: str | None
    tokens_per_second: float | None
    step_time: float | None
    train_loss: float | None
    eval_loss: float | None
    trainable_params: int | None
    total_params: int | None
    runtime_s: float | None

    @property
    def label(self) -> str:
        return run_label(self.run_id, self.name)


def run_label(run_id: int, name: str) -> str:
    """The column / legend name of a run: '#3 smollm2-lora-sft'."""
    return f"#{run_id} {name}"


def run_choice(run: RunRecord) -> tuple[str, int]:
    """A (label, value) dropdown choice: 'id · name · status' -> run id."""
    return f"{run.id} · {run.name} · {run.status.value}", run.id


# ---------------------------------------------------------------------- pure parts
def spec_differences(runs: Sequence[RunRecord]) -> list[tuple[str, list[Any]]]:
    """(field, value per run) for every spec field whose value is not the same in all runs."""
    specs = [r.spec.to_dict() for r in runs]
    if len(specs) < 2:
        return []
    return [(name, [s[name] for s in specs]) for name in specs[0] if len({repr(s[name]) for s in specs}) > 1]


def metric_mean(store: Store, run_id: int, name: str) -> float | None:
    """Mean of every logged value of one metric of a run, from the rollup buckets (no row scan)."""
    buckets = store.metric_series(run_id, name, _WHOLE_RUN_WIDTH)
    count = sum(b.count for b in buckets)
    return sum(b.total for b in buckets) / count if count else None


def _final(run: RunRecord, key: str) -> float | None:
    value = run.final_metrics.get(key)
    return float(value) if isinstance(value, (int, float)) else None


def summarize_run(store: Store, run: RunRecord, now: float | None = None) -> RunSummary:
    """Measured results of `run`: final metrics where the run finished, else what its rows say so far."""
    tps = _final(run, "tokens_per_second_mean") or metric_mean(store, run.id, "tokens_per_second") \
        or _final(run, "tokens_per_second")
    last_loss = store.last_metric(run.id, "loss")
    last_eval = store.last_metric(run.id, "eval_loss")
    eval_loss = _final(run, "eval_loss") if _final(run, "eval_loss") is not None else (
        last_eval.value if last_eval else None)
    trainable = _final(run, "trainable_params") or run.resolved_config.get("trainable_params")
    total = _final(run, "total_params") or run.resolved_config.get("total_params")
    runtime = _final(run, "train_runtime")
    if runtime is None and run.started_at is not None:
        end = run.finished_at or (time.time() if now is None else now)
        runtime = max(0.0, end - run.started_at)
    return RunSummary(run.id, run.name, run.status.value, run.peak_memory_bytes, run.peak_memory_source,
                      tps, metric_mean(store, run.id, "step_time"), last_loss.value if last_loss else None,
                      eval_loss, int(trainable) if trainable is not None else None,
                      int(total) if total is not None else None, runtime)


def _num(x: float | None, fmt: str) -> str:
    return "" if x is None else format(x, fmt)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m {secs:02d}s" if minutes else f"{seconds:.1f}s"


def result_values(s: RunSummary) -> list[str]:
    """The RESULT_ROWS cells of one run, as text."""
    peak = f"{human_bytes(s.peak_memory_bytes)} ({s.peak_memory_source})" if s.peak_memory_bytes else ""
    params = ""
    if s.trainable_params is not None:
        params = human_count(s.trainable_params)
        if s.total_params:
            params += f" ({100 * s.trainable_params / s.total_params:.2f}%)"
    from jobs.memory import prediction_error_text
    from jobs.submit import load_prediction

    predicted = prediction_error_text(load_prediction(s.run_id), s.peak_memory_bytes, s.peak_memory_source)
    return [s.status, peak, predicted, _num(s.tokens_per_second, ".0f"),
            f"{s.step_time:.3f}s" if s.step_time is not None else "",
            _num(s.train_loss, ".4f"), _num(s.eval_loss, ".4f"), params, _duration(s.runtime_s)]


def compare_table(runs: Sequence[RunRecord], summaries: Sequence[RunSummary]) -> pd.DataFrame:
    """Differing spec fields, then the measured results: one row each, one column per run."""
    columns = [FIELD] + [run_label(r.id, r.name) for r in runs]
    rows: list[list[Any]] = [[name, *("" if v is None else str(v) for v in values)]
                             for name, values in spec_differences(runs)]
    per_run = [result_values(s) for s in summaries]
    rows += [[name, *(cells[i] for cells in per_run)] for i, name in enumerate(RESULT_ROWS)]
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
    """Columns tokens/s, peak GiB, run: one point per run that has both measurements."""
    rows = [(s.tokens_per_second, s.peak_memory_bytes / _GIB, s.label) for s in summaries
            if s.tokens_per_second is not None and s.peak_memory_bytes]
    return pd.DataFrame(rows, columns=["tokens/s", "peak GiB", "run"])


def loss_frame(cache: series.MetricSeriesCache, runs: Sequence[RunRecord]) -> pd.DataFrame:
    """Columns step, value, series: each run's training loss, <= ~2000 points per run."""
    return series.metric_frame({run_label(r.id, r.name): cache.get(r.id, "loss") for r in runs})


# ---------------------------------------------------------------------- layout and handlers
@dataclass
class CompareView:
    runs: gr.Dropdown
    refresh: gr.Button
    table: gr.Dataframe
    tradeoff: gr.ScatterPlot
    loss: gr.LinePlot

    @property
    def outputs(self) -> list[gr.Component]:
        return [self.table, self.tradeoff, self.loss]


def build() -> CompareView:
    """Lay out the compare tab; call inside a gr.Blocks context."""
    with gr.Row():
        runs = gr.Dropdown([], value=[], multiselect=True, label="runs to compare (id · name · status)",
                           elem_id="compare-runs", scale=4)
        refresh = gr.Button("Refresh", scale=0)
    table = gr.Dataframe(label="Spec differences and measured results", interactive=False,
                         elem_id="compare-table", wrap=True)
    with gr.Row():
        tradeoff = gr.ScatterPlot(x="tokens/s", y="peak GiB", color="run", color_title="",
                                  tooltip=["run", "tokens/s", "peak GiB"],
                                  label="Time vs memory: peak memory against tokens/s", elem_id="compare-tradeoff")
        loss = gr.LinePlot(x="step", y="value", color="series", color_title="", label="Training loss",
                           elem_id="compare-loss")
    return CompareView(runs, refresh, table, tradeoff, loss)


class CompareData:
    """The view's values from the store."""

    def __init__(self, store: Store, limit: int = 200):
        self.store = store
        self.limit = limit
        self.metrics = series.MetricSeriesCache(store)

    def choices(self) -> Any:
        """The dropdown with every run (newest first); the selection is left as it is."""
        return gr.Dropdown(choices=[run_choice(r) for r in self.store.list_runs(limit=self.limit)])

    def compare(self, selected: Sequence[int | str] | None) -> list[Any]:
        """(table, scatter frame, loss frame) for the picked runs."""
        runs = [r for r in (self.store.get_run(int(i)) for i in selected or []) if r is not None]
        summaries = [summarize_run(self.store, r) for r in runs]
        return [compare_table(runs, summaries), tradeoff_frame(summaries), loss_frame(self.metrics, runs)]


def wire(view: CompareView, store: Store, tab: gr.Tab | None = None) -> CompareData:
    """Fill the choices on refresh (and when the tab opens); redraw on every change of selection."""
    data = CompareData(store)
    opens = [view.refresh.click] + ([tab.select] if tab is not None else [])
    for event in opens:
        event(data.choices, None, view.runs, show_progress="hidden", api_visibility="private").then(
            data.compare, view.runs, view.outputs, show_progress="hidden", api_visibility="private")
    # input, not change: a refresh re-sets the value and already redraws through .then above.
    view.runs.input(data.compare, view.runs, view.outputs, show_progress="hidden", api_visibility="private")
    return data
