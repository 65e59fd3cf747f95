"""Every dashboard chart in one place: axes, units, height, and the colour of each series.

    chart = charts.RUN_LOSS
    plot = chart.build()                                  # inside gr.Blocks
    frame = chart.frame(rows)                             # typed, also when empty
    return chart.update(frame), {chart.elem_id: chart.style(frame)}   # from a handler: data, styles
    charts.redraw_after(event, [(chart, plot)], styles, "group")  # then the styles (colour map, limits);
                                                          # `event` registered with concurrency_id="group"

Why a frame is never handed to a plot bare: gradio 6.31's native plots embed their Vega-Lite spec
once, from the first value they receive, and later values only replace the data. Column types
(quantitative or nominal) and the colour domain (which series exist) are frozen at that first
embed. An empty frame has object columns, so a plot first drawn empty kept discrete axes for good
(the Compare scatter became a 30 px strip with ticks like `9851.0279689081`, the loss overlay a
frame millions of pixels tall), and series that appeared later were not drawn. So here:
- every frame is typed (float x and y, string series), empty ones included;
- every update is followed by a colour map of exactly the series in its frame. When the set of
  series changes the map changes, and gradio embeds the plot again with the new domain and
  legend (data first, then the map: see `redraw_after`).

Adding a series to a chart (a predicted peak, say) is one entry in `SERIES_COLORS` (optional: it
fixes the colour) plus its rows in the frame that chart's handler builds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import cycle
from typing import Any, Literal

import gradio as gr
import pandas as pd

from app.ui.series import typed_frame

SERIES = "series"
# Tableau 10: distinct on white and in the dark theme; runs in Compare take them in order.
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")
# Series whose colour means something across charts (the same line is the same colour everywhere).
SERIES_COLORS = {
    "GPU used (NVML)": "#4e79a7",
    "torch allocated": "#59a14f",
    "torch reserved": "#f28e2b",
    "host RSS": "#b07aa1",
    "train": "#4e79a7",
    "eval": "#f28e2b",
}
MARK, MARK_COLOR = "doctor: ", "#d62728"  # a training doctor's finding marked on a curve (app.ui.findings_view)


@dataclass(frozen=True)
class Chart:
    """One plot: what its axes show (with units), its height, and how its series are coloured."""

    elem_id: str
    label: str
    x: str
    y: str
    x_title: str
    y_title: str
    kind: Literal["line", "point"] = "line"
    legend: bool = True
    # None: Vega-Lite's fixed default plot height, and the block grows to hold the legend; a set
    # height in gradio 6.31 fits the plot *and* legend into it and clips the legend below the x axis.
    height: int | None = None
    x_lim: tuple[float | None, float | None] | None = None
    y_lim: tuple[float | None, float | None] | None = None
    y_format: str | None = None
    x_format: str | None = None
    tooltip: tuple[str, ...] | None = None

    @property
    def columns(self) -> list[str]:
        return [self.x, self.y, SERIES]

    def build(self, **layout: Any) -> gr.LinePlot | gr.ScatterPlot:
        """The gradio component; `layout` passes scale, visible, ... through."""
        kwargs: dict[str, Any] = dict(
            x=self.x,
            y=self.y,
            color=SERIES,
            color_title="",
            x_title=self.x_title,
            y_title=self.y_title,
            label=self.label,
            elem_id=self.elem_id,
            height=self.height,
            x_lim=list(self.x_lim) if self.x_lim else None,
            y_lim=list(self.y_lim) if self.y_lim else None,
            x_axis_format=self.x_format,
            y_axis_format=self.y_format,
            value=self.frame([]),
            colors_in_legend=None if self.legend else [],
        )
        if self.tooltip is not None:
            kwargs["tooltip"] = list(self.tooltip)
        return self._cls(**kwargs, **layout)

    def live(self, **layout: Any) -> gr.HTML:
        """A container the page draws this chart into from the live stream (`app.ui.live`; the canvas
        chart of app/ui/static/live.js): nothing is re-sent or re-drawn unless a point changed."""
        return gr.HTML(
            f'<div class="td-chart" data-chart="{self.elem_id}"><div class="td-chart-title">{self.label}</div>'
            '<div class="td-chart-empty">no data yet</div></div>',
            elem_id=self.elem_id,
            elem_classes=["td-chart-block"],
            js_on_load=None,
            **layout,
        )

    def frame(self, rows: Iterable[tuple[Any, ...]]) -> pd.DataFrame:
        """A typed frame from (x, y, series) rows: float x and y, string series."""
        return typed_frame(rows, self.columns)

    def update(self, frame: pd.DataFrame) -> gr.LinePlot | gr.ScatterPlot:
        """The plot's new data (step 1 of a redraw; `style` and `restyle` are step 2)."""
        return self._cls(value=frame)

    def style(self, frame: pd.DataFrame) -> dict[str, Any]:
        """The properties that go with `frame`: its colour map, and the top of an axis that starts at 0
        (a round number past the largest value, so it changes seldom and every mark stays inside)."""
        out: dict[str, Any] = {"color_map": color_map(list(dict.fromkeys(frame[SERIES].dropna().tolist())))}
        for axis, column, lim in (("x_lim", self.x, self.x_lim), ("y_lim", self.y, self.y_lim)):
            if lim == (0.0, None):
                out[axis] = [0.0, round_up(float(frame[column].max()) * 1.1 if len(frame) else 0.0)]
        return out

    def restyle(self, style: dict[str, Any] | None) -> Any:
        """The properties from `style` (step 2 of a redraw): a changed colour map or limit re-embeds the
        plot, which then takes the data step 1 already delivered."""
        return self._cls(**style) if style else gr.skip()

    @property
    def _cls(self) -> type:
        return gr.ScatterPlot if self.kind == "point" else gr.LinePlot


def redraw_after(event: Any, plots: list[tuple[Chart, gr.components.Component]], styles: gr.State, group: str) -> None:
    """Chain step 2 of a redraw to `event`, whose handler put {elem_id: style} into `styles`.

    Two steps because gradio 6.31 applies data and properties in one update out of order: a plot
    re-embedded for a new colour map took the previous data (seen in Chromium: the Compare scatter
    drew the run picked before). Data first, then properties, draws the data just sent.
    `group`: the concurrency id shared by every event that writes these plots (pass it to them too).
    One at a time, so a step 2 never reaches the browser before the data its styles were made for
    (a timer tick's step 2 read styles a concurrent event had stored, and re-embedded an empty plot)."""

    def step2(value: dict[str, Any] | None) -> list[Any]:
        return [chart.restyle((value or {}).get(chart.elem_id)) for chart, _ in plots]

    event.then(
        step2,
        styles,
        [plot for _, plot in plots],
        show_progress="hidden",
        api_visibility="private",
        concurrency_id=group,
        concurrency_limit=1,
    )


def color_map(names: list[str]) -> dict[str, str]:
    """A colour per series: fixed ones from SERIES_COLORS, the others from PALETTE in order."""
    taken = {SERIES_COLORS[n] for n in names if n in SERIES_COLORS}
    free = cycle([c for c in PALETTE if c not in taken] or PALETTE)
    return {name: SERIES_COLORS.get(name) or (MARK_COLOR if name.startswith(MARK) else next(free)) for name in names}


def round_up(x: float) -> float:
    """The smallest of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 times a power of ten that is >= x (1.0 for x <= 0)."""
    if not x > 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(x))
    return next(
        (m * power for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if m * power >= x * (1 - 1e-12)), 10 * power
    )


# ---------------------------------------------------------------------- the dashboard's charts
GIB_FORMAT = ",.2~f"  # 0.53, 12.4, 139.5: two decimals at most, trailing zeros dropped

GPU_WINDOW_S = 300.0
GPU_MEMORY = Chart(
    "gpu-memory-plot",
    "Memory, last 5 minutes",
    "seconds",
    "GiB",
    "seconds ago",
    "memory (GiB)",
    x_lim=(-GPU_WINDOW_S, 0.0),
    y_lim=(0.0, None),
    y_format=GIB_FORMAT,
)
GPU_UTILIZATION = Chart(
    "gpu-utilization-plot",
    "GPU utilization",
    "seconds",
    "percent",
    "seconds ago",
    "utilization (%)",
    legend=False,
    x_lim=(-GPU_WINDOW_S, 0.0),
    y_lim=(0.0, 100.0),
)
RUN_MEMORY = Chart(
    "run-memory-plot",
    "Memory",
    "seconds",
    "GiB",
    "seconds since the first sample",
    "memory (GiB)",
    y_lim=(0.0, None),
    y_format=GIB_FORMAT,
)
RUN_LOSS = Chart("run-loss-plot", "Loss (train, eval)", "step", "value", "optimizer step", "loss")
RUN_LR = Chart(
    "run-lr-plot", "Learning rate", "step", "value", "optimizer step", "learning rate", legend=False, y_format=".2~e"
)
RUN_TOKENS = Chart(
    "run-tps-plot",
    "Tokens/s (per logging interval)",
    "step",
    "value",
    "optimizer step",
    "tokens/s",
    legend=False,
    y_format=",.0f",
)
RUN_TRAINER = Chart(
    "run-trainer-plot", "Trainer metrics (eval perplexity, rewards)", "step", "value", "optimizer step", "value"
)
COMPARE_TRADEOFF = Chart(
    "compare-tradeoff",
    "Time vs memory: peak memory against tokens/s",
    "tokens/s",
    "peak GiB",
    "tokens/s (mean)",
    "peak memory (GiB)",
    kind="point",
    x_lim=(0.0, None),
    y_lim=(0.0, None),
    x_format=",.0f",
    y_format=GIB_FORMAT,
    tooltip=(SERIES, "tokens/s", "peak GiB"),
)
COMPARE_LOSS = Chart("compare-loss", "Training loss", "step", "loss", "optimizer step", "training loss")
