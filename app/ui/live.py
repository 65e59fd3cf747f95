"""What a live dashboard page is sent, and only when it changed: the feed behind `/tunedeck/live`.

A page opens one event stream (`app.ui.live_route`) naming the views it shows now, its *topics*:
`run=N` (the Run tab shows run N), `gpu=1` (the GPU panel is open and on screen; `device=` its
picked device's label), `runs=1` (the Runs tab is shown). Each tick the feed asks the store's change
stamps (`storage.store_watch`: one SELECT of indexed lookups) whether anything those views show may
have moved, and sends:
- `{"kind": "charts", "charts": {elem_id: {"meta", "set", "drop"}}}`: chart points for the page's
  canvas charts (`app/ui/static/live.js`), only the series that changed, from the first x that
  changed (`series_delta`): a live run ships its new points, a finished run nothing;
- `{"kind": "run"}`, `{"kind": "runs"}`, `{"kind": "devices"}`: the run page's text, the runs table
  or the GPU panel's device line may have changed; the page then asks Gradio for that view once.
A feed whose every topic can no longer change (a finished run, drawn) says `done`, and the stream
ends: a finished run's page makes no more requests.

The charts reuse the run page's series caches (`app.ui.series`: rollups, spikes kept), shared by
every page of the server, so a tick after one new metric row reads one row per series.
"""

from __future__ import annotations

import math
import re
import time
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.ui import charts, gpu
from app.ui.run import GRAPHS, RunPageData
from app.ui.series import Row
from jobs.spec.evaluation import task_series
from jobs.spec.rewards import reward_series
from jobs.spec.stored import spec_of
from storage.models import RunStatus
from storage.roles_dashboard import LiveFeed

RUN_TICK_S = 0.25  # a live run's page: a new point is on screen ~0.13 s (0.25 s at most) after its write, plus the draw
SLOW_TICK_S = 1.0  # the GPU panel, the runs table and a page with nothing live
DEVICES_TICK_S = 5.0  # the GPU panel's device line: a worker that starts or stops shows within this
GPU_BUCKET_S = 1.0  # the GPU panel's buckets, aligned on whole seconds so each tick changes only the newest
Points = list[list[float]]
_DEVICE_LABEL = re.compile(r"^[\w .:/()@#+-]{1,200}$")


@dataclass(frozen=True)
class Topics:
    """The views a page shows now, from the stream's query string."""

    run_id: int | None = None
    gpu: bool = False
    device: str | None = None  # the GPU panel's picked device, as its label reads
    runs: bool = False

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> Topics:
        """Parse `run=N&gpu=1&device=LABEL&runs=1`; ValueError naming the parameter, the problem and the fix."""
        unknown = sorted(set(query) - {"run", "gpu", "device", "runs"})
        if unknown:
            raise ValueError(f"unknown parameter {unknown[0]!r}: use run=N, gpu=1, device=LABEL, runs=1")
        run = query.get("run", "").strip()
        if run and not run.isdigit():
            raise ValueError(f"run={run[:40]!r} is not a run id: pass a whole number (run=12)")
        device = query.get("device") or None
        if device is not None and not _DEVICE_LABEL.match(device):
            raise ValueError("device: not a device label: pass the GPU panel's device choice as shown")
        flags = {}
        for name in ("gpu", "runs"):
            value = query.get(name, "0")
            if value not in ("0", "1"):
                raise ValueError(f"{name}={value[:20]!r}: pass {name}=1 or leave it out")
            flags[name] = value == "1"
        return cls(int(run) if run else None, flags["gpu"], device, flags["runs"])

    @property
    def empty(self) -> bool:
        return self.run_id is None and not self.gpu and not self.runs


# ---------------------------------------------------------------------- chart payloads (pure)
def chart_meta(chart: charts.Chart, relative_window_s: float | None = None) -> dict[str, Any]:
    """How the page's canvas chart draws `chart`: titles, limits, kind; `relative_window_s`: x is a
    clock time drawn as seconds before the newest message, over that window (the GPU panel)."""
    meta: dict[str, Any] = {
        "label": chart.label,
        "x_title": chart.x_title,
        "y_title": chart.y_title,
        "kind": chart.kind,
        "legend": chart.legend,
        "x_lim": list(chart.x_lim) if chart.x_lim else None,
        "y_lim": list(chart.y_lim) if chart.y_lim else None,
        "y_exp": bool(chart.y_format and chart.y_format.endswith("e")),
    }
    if relative_window_s is not None:
        meta["relative_window_s"] = relative_window_s
        meta["x_lim"] = [-relative_window_s, 0.0]
    return meta


def row_points(rows: list[Row]) -> dict[str, Points]:
    """{series label: [[x, y], ...] sorted by x}, missing and non-finite values left out (a gap, as the plots drew them)."""
    out: dict[str, Points] = {}
    for x, y, label in rows:
        points = out.setdefault(str(label), [])
        if y is not None and math.isfinite(x) and math.isfinite(y):
            points.append([float(x), float(y)])
    for points in out.values():
        points.sort(key=lambda p: p[0])  # stable: a bucket's min stays before its max
    return out


def series_delta(old: Mapping[str, Points], new: Mapping[str, Points]) -> dict[str, Any]:
    """What turns `old` into `new` on the page: {"set": {label: {"from_x", "points"}}, "drop": [labels]}.

    The page drops a series' points with x >= from_x and appends `points` (from_x None: replaces them
    all). So a series that only grew sends its new points, and one whose last bucket was re-read sends
    that bucket on. Empty dict: nothing changed."""
    out: dict[str, Any] = {}
    dropped = [label for label in old if label not in new]
    changed: dict[str, Any] = {}
    for label, pts in new.items():
        before = old.get(label)
        if before == pts:
            continue
        k = _common_prefix(before or [], pts)
        if not before or k == 0:
            changed[label] = {"from_x": None, "points": pts}
            continue
        # The first x that differs; the page drops every point from there (equal x values before the
        # change too), so send every new point from the first one at that x.
        from_x = min(before[k][0] if k < len(before) else math.inf, pts[k][0] if k < len(pts) else math.inf)
        start = next((i for i, p in enumerate(pts) if p[0] >= from_x), len(pts))
        changed[label] = {"from_x": from_x, "points": pts[start:]}
    if changed:
        out["set"] = changed
    if dropped:
        out["drop"] = dropped
    return out


def _x(point: list[float]) -> float:
    return point[0]


def _common_prefix(a: Points, b: Points) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ChartState:
    """What one page was sent of one chart; `update` gives the next payload, or None when nothing changed."""

    def __init__(self, chart: charts.Chart, meta: dict[str, Any]):
        self.chart, self.meta = chart, meta
        self.sent: dict[str, Points] = {}
        self.meta_sent = False

    def update(self, rows: list[Row], cut: float | None = None, start: float | None = None) -> dict[str, Any] | None:
        """The payload that turns what the page has into `rows`, or None.

        A sliding window (the GPU panel) passes `cut`, where the page drops older points itself (live.js,
        charts with `relative_window_s`): both sides forget them. With `start`, `rows` are only the points
        with x >= start, and those before it are as last sent: a tick reads and compares its newest
        buckets, not the whole window."""
        points = row_points(rows)
        if start is not None:
            older = {label: pts[: bisect_left(pts, start, key=_x)] for label, pts in self.sent.items()}
            labels = [*older, *(label for label in points if label not in older)]
            points = {label: older.get(label, []) + points.get(label, []) for label in labels}
        if cut is not None:
            self.sent = {label: pts[bisect_left(pts, cut, key=_x) :] for label, pts in self.sent.items()}
            points = {label: kept for label, pts in points.items() if (kept := pts[bisect_left(pts, cut, key=_x) :])}
        delta = series_delta(self.sent, points)
        if not delta and self.meta_sent:
            return None
        self.sent = points
        payload: dict[str, Any] = {**delta, "colors": charts.color_map(list(points))}
        if not self.meta_sent:
            payload["meta"], self.meta_sent = self.meta, True
            payload.setdefault("set", {})
        return payload


# ---------------------------------------------------------------------- the feed
class Feed:
    """One page's stream: call `poll()` every `interval` seconds; stop when `done`."""

    def __init__(self, store: LiveFeed, topics: Topics, page_data: RunPageData):
        self.store, self.topics, self.page_data = store, topics, page_data
        self.done = topics.empty
        self._run_stamp: Any = object()
        self._run_series: Any = object()
        self._run_finished = False
        self._trainer: str | None = None
        self._watched: dict[str, str] = {}  # a task score early stopping watches, charted with the trainer's metrics
        self._run_charts = {chart.elem_id: ChartState(chart, chart_meta(chart)) for chart in GRAPHS}
        self._gpu_charts = {
            chart.elem_id: ChartState(chart, chart_meta(chart, charts.GPU_WINDOW_S))
            for chart in (charts.GPU_MEMORY, charts.GPU_UTILIZATION)
        }
        self._slow_at = -math.inf
        self._gpu_series: Any = object()
        self._devices: Any = object()
        self._devices_at = -math.inf
        # Whose samples the GPU panel draws (`_worker`), made again when the devices move.
        self._gpu_window: gpu.LiveWindow | None = None
        self._runs: Any = object()

    @property
    def interval(self) -> float:
        live_run = self.topics.run_id is not None and not self._run_finished
        return RUN_TICK_S if live_run else SLOW_TICK_S

    def poll(self, now: float | None = None) -> list[dict[str, Any]]:
        """The messages this tick has to send ([] when nothing changed)."""
        if self.done:
            return []
        now = time.time() if now is None else now
        out: list[dict[str, Any]] = []
        run_id = self.topics.run_id if not self._run_finished else None
        stamp, series = self.store.live_stamps(run_id)  # one SELECT a tick
        if run_id is not None:
            out += self._poll_run(run_id, stamp, series)
        if (self.topics.gpu or self.topics.runs) and time.monotonic() - self._slow_at >= SLOW_TICK_S * 0.9:
            self._slow_at = time.monotonic()
            if self.topics.gpu:
                out += self._poll_gpu(series, now)
            if self.topics.runs:
                stamp = self.store.runs_stamp()
                if stamp != self._runs:
                    self._runs = stamp
                    out.append({"kind": "runs"})
        self.done = not self.topics.gpu and not self.topics.runs and self._run_finished
        return out

    def _poll_run(self, run_id: int, stamp: tuple[Any, ...] | None, series: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if stamp != self._run_stamp:
            self._run_stamp = stamp
            message: dict[str, Any] = {"kind": "run", "run_id": run_id, "status": stamp[0] if stamp else None}
            if stamp:  # the progress bar's step moves with every message; the rest of the text every few seconds
                message["step"], message["total"] = stamp[1], stamp[2]
            out.append(message)
        if stamp is None:  # no such run: the page's text says so
            self._run_finished = True
            return out
        if series != self._run_series or out:
            self._run_series = series
            if self._trainer is None:  # a run's spec never changes: read once
                run = self.store.get_run(run_id)
                if run is None:
                    return out
                spec = spec_of(run)
                self._trainer = spec.trainer.value
                self._watched = {**task_series(spec.metric_for_best_model), **reward_series(spec.declared_rewards)}
            rows = self.page_data.rows(run_id, self._trainer, self._watched)
            payload = {
                chart.elem_id: update
                for chart, chart_rows in zip(GRAPHS, rows)
                if (update := self._run_charts[chart.elem_id].update(chart_rows)) is not None
            }
            if payload:
                out.append({"kind": "charts", "charts": payload})
            # Read after the status: a finished run's last rows were written before it was marked.
            self._run_finished = RunStatus(stamp[0]).finished
        return out

    def _poll_gpu(self, series: Any, now: float) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if time.monotonic() - self._devices_at >= DEVICES_TICK_S:  # workers come and go seldom
            self._devices_at = time.monotonic()
            devices = (self.store.devices_stamp(), tuple(sorted(w["worker_id"] for w in self.store.live_workers())))
            if devices != self._devices:
                self._devices = devices
                # The devices moved: pick the graph's worker again (and read its window afresh).
                self._gpu_window = gpu.LiveWindow(self.store, self._worker(), charts.GPU_WINDOW_S, GPU_BUCKET_S)
                out.append({"kind": "devices"})
        memory = series[1]  # the panel draws memory samples only: a metric row moves nothing here
        if self._gpu_window is None or (memory == self._gpu_series and not out):
            return out
        self._gpu_series = memory
        start, *rows = self._gpu_window.read(now)
        cut = now - charts.GPU_WINDOW_S  # what the page keeps (live.js: relative_window_s before `now`)
        payload = {
            chart_id: update
            for (chart_id, state), chart_rows in zip(self._gpu_charts.items(), rows)
            if (update := state.update(chart_rows, cut, start)) is not None
        }
        if payload:
            out.append({"kind": "charts", "charts": payload, "now": now})
        return out

    def _worker(self) -> str | None:
        """The picked device's worker (by its label); else, with several, the first the picker offers;
        with one or none, None: every sample (also those written before workers stamped theirs)."""
        choices = gpu.device_choices(self.store)
        for label, worker in choices:
            if label == self.topics.device:
                return worker
        return choices[0][1] if len(choices) > 1 else None
