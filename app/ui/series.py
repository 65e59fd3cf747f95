"""Graph series for the dashboard: SQL-bucketed metrics and memory kept up to date incrementally.

The store groups rows into buckets in SQL (min and max per bucket, so a spike survives), reading
its rollup tables (aggregates over 2**level steps, maintained on write) so a first build costs
about one row per bucket however long the run is. This module keeps those buckets per run in
memory and, on each refresh, re-reads only the last bucket and newer ones. Bucket widths are
powers of two aligned at step 0 (or time 0, in units of 1/16 s), so when a series outgrows
`max_points` neighbouring buckets merge exactly (min of mins, max of maxes) without another read.

    cache = MetricSeriesCache(store)
    buckets = cache.get(run_id, "loss")   # <= max_points // 2 buckets, two points each
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from storage.roles_pages import SeriesReader
from storage.store import MemoryBucket, MetricBucket

MAX_POINTS = 2000
_CACHE_KEYS = 128
_MEMORY_BASE_WIDTH_S = 1.0 / 16
LATE_SAMPLES_S = 10.0  # samples come in batches from two writers (sampler, training callback): re-read this far back


def merge_metric(a: MetricBucket, b: MetricBucket) -> MetricBucket:
    """Combine two buckets of the same series (exact for min, max, sum, count)."""
    return MetricBucket(
        min(a.first_step, b.first_step),
        max(a.last_step, b.last_step),
        _opt(min, a.min, b.min),  # None: a bucket of non-finite values only
        _opt(max, a.max, b.max),
        _opt(lambda x, y: x + y, a.total, b.total),
        a.count + b.count,
    )


def _opt(fn: Any, x: Any, y: Any) -> Any:
    return y if x is None else x if y is None else fn(x, y)


def merge_memory(a: MemoryBucket, b: MemoryBucket) -> MemoryBucket:
    """Combine two memory buckets of the same source."""
    return MemoryBucket(
        a.source,
        min(a.first_time, b.first_time),
        max(a.last_time, b.last_time),
        _opt(min, a.used_min, b.used_min),
        _opt(max, a.used_max, b.used_max),
        _opt(max, a.total_max, b.total_max),
        _opt(max, a.utilization_max, b.utilization_max),
        _opt(max, a.torch_allocated_max, b.torch_allocated_max),
        _opt(max, a.torch_reserved_max, b.torch_reserved_max),
        _opt(min, a.rss_min, b.rss_min),
        _opt(max, a.rss_max, b.rss_max),
        a.count + b.count,
    )


def pow2_at_least(x: float, base: float = 1.0) -> float:
    """The smallest base * 2**k (k >= 0) that is >= x."""
    width = base
    while width < x:
        width *= 2
    return width


@dataclass
class _MetricState:
    width: int
    last_step: int
    buckets: dict[int, MetricBucket] = field(default_factory=dict)


@dataclass
class _MemoryState:
    origin: float  # the run's first sample time: x = 0 on the graph (buckets are aligned at time 0)
    width: float
    last_time: float
    buckets: dict[tuple[int, str], MemoryBucket] = field(default_factory=dict)


def _memory_key(b: MemoryBucket, width: float) -> tuple[int, str]:
    return int(b.first_time // width), b.source


class MetricSeriesCache:
    """Downsampled metric series per (run, name); refreshes read only new rows."""

    def __init__(self, store: SeriesReader, max_points: int = MAX_POINTS):
        self.store = store
        self.max_buckets = max(1, max_points // 2)
        self._lock = threading.Lock()
        self._states: OrderedDict[tuple[int, str], _MetricState] = OrderedDict()

    def get(self, run_id: int, name: str) -> list[MetricBucket]:
        return self.at(run_id, name, self.store.metric_extent(run_id, name))

    def at(self, run_id: int, name: str, extent: tuple[int, int] | None) -> list[MetricBucket]:
        """`get` with the series' extent read already (`Store.run_extents`: every series of a run in one read)."""
        if extent is None:
            return []
        hi = extent[1]
        with self._lock:
            state = self._states.get((run_id, name))
            if state is None or hi < state.last_step:
                width = int(pow2_at_least((hi + 1) / self.max_buckets))
                rows = self.store.metric_series(run_id, name, width)
                state = _MetricState(width, hi, {r.first_step // width: r for r in rows})
            elif hi > state.last_step:
                # The last bucket may have grown: read it again whole, with every newer one.
                last = max(state.buckets, default=0)
                for r in self.store.metric_series(run_id, name, state.width, from_step=last * state.width):
                    state.buckets[r.first_step // state.width] = r
                state.last_step = hi
                while (hi + 1) / state.width > self.max_buckets:
                    state.width *= 2
                    merged: dict[int, MetricBucket] = {}
                    for key, b in sorted(state.buckets.items()):
                        k = key // 2
                        merged[k] = merge_metric(merged[k], b) if k in merged else b
                    state.buckets = merged
            self._states[(run_id, name)] = state
            self._states.move_to_end((run_id, name))
            while len(self._states) > _CACHE_KEYS:
                self._states.popitem(last=False)
            return [b for _, b in sorted(state.buckets.items())]


class MemorySeriesCache:
    """Downsampled memory timeline per run; refreshes read only new samples."""

    def __init__(self, store: SeriesReader, max_points: int = MAX_POINTS):
        self.store = store
        self.max_buckets = max(1, max_points // 2)
        self._lock = threading.Lock()
        self._states: OrderedDict[int, _MemoryState] = OrderedDict()

    def get(self, run_id: int) -> tuple[float, list[MemoryBucket]]:
        """(origin time, buckets in time order) for one run's samples."""
        return self.at(run_id, self.store.memory_extent(run_id))

    def at(self, run_id: int, extent: tuple[float, float] | None) -> tuple[float, list[MemoryBucket]]:
        """`get` with the samples' extent read already (`Store.run_extents`)."""
        if extent is None:
            return 0.0, []
        lo, hi = extent
        with self._lock:
            state = self._states.get(run_id)
            if state is None or lo != state.origin or hi < state.last_time:
                width = pow2_at_least((hi - lo) / self.max_buckets, _MEMORY_BASE_WIDTH_S)
                rows = self.store.memory_series(run_id, width)
                state = _MemoryState(lo, width, hi, {_memory_key(r, width): r for r in rows})
            elif hi > state.last_time:
                # Re-read whole buckets from a little before the last sample seen: samples arrive in
                # batches from two writers (sampler, training callback), not strictly in time order.
                first = (max(lo, state.last_time - LATE_SAMPLES_S)) // state.width
                for r in self.store.memory_series(run_id, state.width, from_time=first * state.width):
                    state.buckets[_memory_key(r, state.width)] = r
                state.last_time = hi
                while (hi - lo) / state.width > self.max_buckets:
                    state.width *= 2
                    merged: dict[tuple[int, str], MemoryBucket] = {}
                    for (key, src), b in sorted(state.buckets.items()):
                        k = (key // 2, src)
                        merged[k] = merge_memory(merged[k], b) if k in merged else b
                    state.buckets = merged
            self._states[run_id] = state
            self._states.move_to_end(run_id)
            while len(self._states) > _CACHE_KEYS:
                self._states.popitem(last=False)
            return lo, [b for _, b in sorted(state.buckets.items())]


# ---------------------------------------------------------------------- frames for gr.LinePlot
Row = tuple[float, float | None, str]  # (x, y, series): what a chart draws, one point


def metric_frame(series: dict[str, list[MetricBucket]]) -> pd.DataFrame:
    """Columns step, value, series (`metric_rows` as a typed frame, for Gradio's plots)."""
    return typed_frame(metric_rows(series), ["step", "value", "series"])


def metric_rows(series: dict[str, list[MetricBucket]]) -> list[Row]:
    """(step, value, series): one point per single-row bucket, else its min and max (a series of one
    row: two points, half a step either side)."""
    rows: list[Row] = []
    for label, buckets in series.items():
        if len(buckets) == 1 and buckets[0].count == 1:
            # A line needs two vertices: one logged value (a final eval loss) is drawn as a flat
            # segment half a step either side of its step, so the legend never names an invisible line.
            b = buckets[0]
            rows += [(b.first_step - 0.5, b.max, label), (b.first_step + 0.5, b.max, label)]
            continue
        for b in buckets:
            if b.count == 1 or b.min == b.max:
                rows.append((float(b.first_step), b.max, label))
            else:
                mid = (b.first_step + b.last_step) / 2
                rows.append((mid, b.min, label))
                rows.append((mid, b.max, label))
    return rows


def typed_frame(rows: Iterable[tuple[Any, ...]], columns: list[str]) -> pd.DataFrame:
    """A frame whose first two columns are float and the others strings, also when it is empty.

    A plot reads its axis types from the first frame it gets (see app.ui.charts): an untyped empty
    frame would make every axis discrete for good."""
    frame = pd.DataFrame(list(rows), columns=columns)
    return frame.astype({c: ("float64" if i < 2 else "string") for i, c in enumerate(columns)})


_GIB = 1024**3
# label -> (sample source, min attributes, max attributes; the first one set is used). The memory graphs follow the
# device through the sources the machine wrote: NVML and torch's allocator on a GPU, the training
# process tree's RSS (the sampler's "host" source) without one. A label is drawn only when its
# source has samples, so the legend never names a series this machine does not have.
MEMORY_SERIES = {
    "GPU used (NVML)": ("nvml", ("used_min",), ("used_max",)),
    "torch allocated": ("torch", (), ("torch_allocated_max",)),
    "torch reserved": ("torch", (), ("torch_reserved_max",)),
    # The sampler's host samples carry the process tree's RSS in both fields (used is 0 when idle).
    "host RSS": ("host", ("rss_min", "used_min"), ("rss_max", "used_max")),
}


def _first(bucket: MemoryBucket, attrs: tuple[str, ...]) -> int | None:
    return next((v for v in (getattr(bucket, a) for a in attrs) if v is not None), None)


# source -> its labels: a bucket is looked at only for the series its source draws (a live page's every tick).
_SERIES_OF_SOURCE: dict[str, list[tuple[str, tuple[str, ...], tuple[str, ...]]]] = {}
for _label, (_source, _lo, _hi) in MEMORY_SERIES.items():
    _SERIES_OF_SOURCE.setdefault(_source, []).append((_label, _lo, _hi))


def memory_rows(buckets: list[MemoryBucket], origin: float) -> list[Row]:
    """(seconds since origin (negative = ago), GiB, series): the max (and min) of each bucket."""
    rows: list[Row] = []
    for b in buckets:
        t = (b.first_time + b.last_time) / 2 - origin
        for label, lo_attrs, hi_attrs in _SERIES_OF_SOURCE.get(b.source, ()):
            hi = _first(b, hi_attrs)
            if hi is None:
                continue
            lo = _first(b, lo_attrs)
            if lo is not None and lo != hi:
                rows.append((t, lo / _GIB, label))
            rows.append((t, hi / _GIB, label))
    return rows


def memory_frame(buckets: list[MemoryBucket], origin: float) -> pd.DataFrame:
    """Columns seconds (since origin; negative = ago), GiB, series."""
    return typed_frame(memory_rows(buckets, origin), ["seconds", "GiB", "series"])


def utilization_rows(buckets: list[MemoryBucket], origin: float) -> list[Row]:
    """(seconds, percent, series): the GPU utilization peak per bucket (NVML samples only)."""
    return [
        ((b.first_time + b.last_time) / 2 - origin, float(b.utilization_max), "GPU utilization")
        for b in buckets
        if b.utilization_max is not None
    ]
