"""What a dashboard chart drew, read from its SVG or its canvas chart's scene in the browser (Chromium tests).

The run page's and GPU panel's charts are canvas charts fed by the live stream (app/ui/static/live.js):
each publishes what it drew as JSON in its `data-scene` attribute, in the shape read here (axes in
the words Vega uses, one line per series with its vertex count). The Compare charts are Gradio's:
gradio 6.31 draws `gr.LinePlot` / `gr.ScatterPlot` with Vega-Lite through vega-embed and the
`svg` renderer, so the scene is plain DOM: Vega writes each mark as an element with a class
`role-mark` and an aria-label naming its fields ("step: 3; loss: 1.2; series: #4 lora"), each axis
as a group whose aria-label states its scale and domain ("Y-axis titled 'loss' for a linear scale
with values from 0.5 to 3.0"), and each legend entry as a `role-legend-label` text. Gradio's line
plots add an invisible `hover` point layer: it is not counted.

    scene = read_scene(page, "run-loss-plot")
    scene.lines_by_series()        # {"train": [vertex count], ...}
    scene.axis("Y").covers(0.5, 3.0)
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Every chart the Chromium tests check (tests/test_charts_browser.py). tests/test_figures.py fails when
# the dashboard has a plot that is not listed here: a new chart needs its browser check.
CHECKED_CHARTS = frozenset(
    {
        "gpu-memory-plot",
        "gpu-utilization-plot",
        "run-memory-plot",
        "run-loss-plot",
        "run-lr-plot",
        "run-tps-plot",
        "run-trainer-plot",
        "compare-tradeoff",
        "compare-loss",
        "search-importance",  # tests/test_search_browser.py
        "search-parallel",
    }
)

_JS = """(id) => {
  const root = document.getElementById(id);
  const live = root && root.querySelector('.td-chart[data-scene]');
  if (live) return JSON.parse(live.dataset.scene);  // a canvas chart (app/ui/static/live.js) says what it drew
  const svg = root && root.querySelector('svg.marks');
  if (!svg) return null;
  const label = (e) => e.getAttribute('aria-label') || '';
  const marks = (kind) => [...svg.querySelectorAll(`g.mark-${kind}.role-mark`)]
    .filter(g => !g.classList.contains('hover_marks'))
    .flatMap(g => [...g.querySelectorAll(':scope > path')]);
  return {
    width: svg.getBoundingClientRect().width,
    height: svg.getBoundingClientRect().height,
    block_height: root.getBoundingClientRect().height,
    axes: [...svg.querySelectorAll('g.role-axis[aria-label]')].map(label),
    lines: marks('line').map(p => ({label: label(p), d: p.getAttribute('d') || '', stroke: p.getAttribute('stroke')})),
    points: marks('symbol').map(p => ({label: label(p), d: p.getAttribute('d') || ''})),
    legend: [...svg.querySelectorAll('g.role-legend-label text')].map(t => t.textContent),
    // Legend labels a reader cannot see: outside the plot's block (clipped) or of zero size.
    legend_clipped: [...svg.querySelectorAll('g.role-legend-label text')].filter(t => {
      const r = t.getBoundingClientRect(), b = root.getBoundingClientRect();
      return r.height === 0 || r.bottom > b.bottom + 1 || r.top < b.top - 1;
    }).map(t => t.textContent),
  };
}"""

_AXIS = re.compile(r"^(?P<axis>[XY])-axis titled '(?P<title>.*)' for a (?P<scale>\w+) scale with (?P<rest>.*)$")
_RANGE = re.compile(r"values from (?P<lo>\S+) to (?P<hi>\S+)$")


def number(text: str) -> float:
    """A number as Vega formats it: unicode minus, thousands commas, 'Infinity'."""
    return float(text.replace("\u2212", "-").replace(",", "").strip())


@dataclass(frozen=True)
class Axis:
    axis: str
    title: str
    scale: str
    lo: float | None
    hi: float | None

    def covers(self, lo: float, hi: float, rel: float = 1e-6) -> bool:
        """Whether the axis is continuous and its domain contains [lo, hi]."""
        if self.scale not in ("linear", "log", "pow", "sqrt", "time", "utc") or self.lo is None or self.hi is None:
            return False
        slack = rel * max(1.0, abs(lo), abs(hi))
        return self.lo <= lo + slack and self.hi >= hi - slack


def parse_axis(label: str) -> Axis | None:
    m = _AXIS.match(label)
    if not m:
        return None
    r = _RANGE.search(m["rest"])
    lo = hi = None
    if r:
        try:
            lo, hi = number(r["lo"]), number(r["hi"])
        except ValueError:
            pass
    return Axis(m["axis"], m["title"], m["scale"], lo, hi)


def fields(label: str) -> dict[str, str]:
    """'step: 3; loss: 1.2; series: #4 lora' -> {'step': '3', 'loss': '1.2', 'series': '#4 lora'}."""
    out = {}
    for part in label.split("; "):
        key, sep, value = part.partition(": ")
        if sep:
            out[key] = value
    return out


def vertices(d: str) -> int:
    """Vertices of an SVG path drawn by Vega's line mark (M/L commands)."""
    return len(re.findall(r"[ML]", d))


@dataclass
class Scene:
    width: float
    height: float
    block_height: float
    axes: list[str]
    lines: list[dict[str, Any]]
    points: list[dict[str, Any]]
    legend: list[str]
    legend_clipped: list[str]

    def axis(self, name: str) -> Axis:
        found = [a for a in (parse_axis(x) for x in self.axes) if a is not None and a.axis == name]
        assert found, f"no {name} axis drawn; axes: {self.axes}"
        return found[0]

    def lines_by_series(self, key: str = "series") -> dict[str, list[int]]:
        """Series -> vertex count of each line path drawn for it (paths of one vertex draw nothing)."""
        out: dict[str, list[int]] = {}
        for line in self.lines:
            count = line["vertices"] if "vertices" in line else vertices(line["d"])
            out.setdefault(fields(line["label"]).get(key, ""), []).append(count)
        return out

    def drawn_lines(self) -> dict[str, int]:
        """Series -> vertices of its longest line, for lines with more than one vertex."""
        return {s: max(v) for s, v in self.lines_by_series().items() if max(v) > 1}

    def point_fields(self) -> list[dict[str, str]]:
        return [fields(p["label"]) for p in self.points]

    def describe(self) -> str:
        return (
            f"{self.width:.0f}x{self.height:.0f}px (block {self.block_height:.0f}px), axes {self.axes}, "
            f"legend {self.legend} (clipped: {self.legend_clipped}), "
            f"lines {self.lines_by_series()}, {len(self.points)} points"
        )


def read_scene(page: Any, elem_id: str) -> Scene | None:
    raw = page.evaluate(_JS, elem_id)
    return Scene(**raw) if raw else None


def wait_scene(page: Any, elem_id: str, ready: Callable[[Scene], bool], timeout: float = 30.0) -> Scene:
    """Poll the chart until `ready(scene)`; fail with what it last drew."""
    deadline = time.time() + timeout
    scene = None
    while time.time() < deadline:
        scene = read_scene(page, elem_id)
        if scene is not None:
            try:
                if ready(scene):
                    return scene
            except (AssertionError, KeyError, ValueError):
                pass
        time.sleep(0.25)
    raise AssertionError(
        f"#{elem_id} never drew what was expected; last scene: {scene.describe() if scene else 'no svg'}"
    )
