"""The four figures tunedeck reports for a run, each defined and computed once, here.

Tokens/s, step time, peak memory and loss mean the same thing wherever they appear: the Runs
table, the run page, Compare, `tunedeck show`, the bundle's metrics.json and its model card all
call `run_figures` (or format what it returned) and print with `format_figure`. The
"Figures and charts" section of docs/results-export-chat.md holds each `definition` word for word
(tests/test_figures.py checks).

    figures = run_figures(store, store.get_run(run_id))
    format_figure(TOKENS_PER_SECOND, figures.tokens_per_second)   # '1,074 tokens/s'

The rows behind them are written by `jobs.train.callbacks.StoreCallback` (one `tokens_per_second` and
one `step_time` row per training log, one `loss` row from trl) and the peak by the sampler and
the training process (`Store.set_peak_memory` keeps the larger). Means are read from the store's
coarsest rollups, so a figure costs one small query however long the run is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from storage.roles import MetricReader

_GIB = 1024**3


@dataclass(frozen=True)
class Figure:
    """A reported number: its key (metrics.json, final metrics), its label, unit and meaning."""

    key: str
    label: str
    unit: str
    definition: str


TOKENS_PER_SECOND = Figure(
    "tokens_per_second",
    "tokens/s",
    "tokens/s",
    "Mean training throughput over the run so far: the mean of the rates logged at each training log, "
    "each rate being the tokens trl counted in that logging interval (padding excluded) divided by the "
    "wall-clock seconds between the interval's optimizer-step ends. With logging_steps 1 it is the mean "
    "over optimizer steps.",
)
STEP_TIME = Figure(
    "step_time",
    "step time",
    "s",
    "Mean wall-clock seconds per optimizer step over the run so far (gradient accumulation included): "
    "the mean of the per-interval step times logged with each training log.",
)
PEAK_MEMORY = Figure(
    "peak_memory_bytes",
    "peak memory",
    "GiB",
    "The most memory the run held: on a GPU the larger of NVML's device memory used (sampled every "
    "second) and torch's peak reserved memory; without a GPU the peak resident memory (RSS) of the "
    "training process tree. Shown in GiB (1024^3 bytes; MiB below 0.1 GiB), stored in bytes, with its "
    "source (nvml, torch or host).",
)
LOSS = Figure(
    "loss",
    "loss",
    "",
    "The last training loss trl logged (the mean over the last logging interval's steps), not trl's "
    "run-average train_loss.",
)
FIGURES = (TOKENS_PER_SECOND, STEP_TIME, PEAK_MEMORY, LOSS)


@dataclass(frozen=True)
class RunFigures:
    """A run's figures; None where it has not measured one (yet)."""

    tokens_per_second: float | None = None
    step_time: float | None = None
    peak_memory_bytes: int | None = None
    peak_memory_source: str | None = None
    loss: float | None = None

    def metrics(self) -> dict[str, float]:
        """{key: value} of the measured figures, for metrics.json and the final metrics."""
        values = {
            TOKENS_PER_SECOND.key: self.tokens_per_second,
            STEP_TIME.key: self.step_time,
            PEAK_MEMORY.key: self.peak_memory_bytes,
            LOSS.key: self.loss,
        }
        return {k: float(v) for k, v in values.items() if v is not None}

    def text(self, figure: Figure) -> str:
        """One figure as the UI and CLI print it ('' when not measured)."""
        value = self.metrics().get(figure.key)
        out = format_figure(figure, value)
        if figure is PEAK_MEMORY and out and self.peak_memory_source:
            out += f" ({self.peak_memory_source})"
        return out


def format_figure(figure: Figure, value: float | None) -> str:
    """'1,074 tokens/s', '0.250 s', '0.88 GiB' (MiB below 0.1 GiB), '1.2345'; '' for None."""
    if value is None:
        return ""
    if figure is TOKENS_PER_SECOND:
        return f"{value:,.0f} tokens/s"
    if figure is STEP_TIME:
        return f"{value:.3f} s"
    if figure is PEAK_MEMORY:
        return f"{value / _GIB:.2f} GiB" if value >= 0.1 * _GIB else f"{value / 2**20:.1f} MiB"
    return f"{value:.4f}"


def sampled_peak(store: MetricReader, run_id: int) -> tuple[int, str] | None:
    """(bytes, source) of the highest NVML-used or host-RSS sample stored for a run, from the rollups."""
    buckets = store.memory_series(run_id, float(1 << 16) / 16)  # one bucket per ~68 minutes
    best = max(((b.used_max, b.source) for b in buckets if b.source in ("nvml", "host") and b.used_max), default=None)
    return (int(best[0]), best[1]) if best else None


def run_figures(store: MetricReader, run: Any) -> RunFigures:
    """The figures of one run (a `RunRecord`), from its metric rows and its peak."""
    return figures_of_runs(store, [run])[run.id]


def figures_of_runs(store: MetricReader, runs: Sequence[Any]) -> dict[int, RunFigures]:
    """The figures of several runs in three queries (the Runs table asks for 200 every 2 s)."""
    ids = [r.id for r in runs]
    tps = store.metric_means(ids, "tokens_per_second")
    step = store.metric_means(ids, "step_time")
    loss = store.last_metric_values(ids, "loss")
    return {
        r.id: RunFigures(tps.get(r.id), step.get(r.id), r.peak_memory_bytes, r.peak_memory_source, loss.get(r.id))
        for r in runs
    }


def markdown_table() -> str:
    """The figures table of docs/results-export-chat.md (tests/test_figures.py keeps the page equal to it)."""
    rows = [f"| {f.label} | `{f.key}` | {f.unit or '-'} | {f.definition} |" for f in FIGURES]
    return "\n".join(["| figure | key | unit | what it measures |", "|---|---|---|---|", *rows])
