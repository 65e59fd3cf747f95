"""The GPU panel's live window (app.ui.gpu.LiveWindow, app.ui.live's sliding-window deltas).

A moving 5-minute window must cost one new bucket a tick: read from the store and sent to the page.
`replay` does what live.js does with a delta on a chart with `relative_window_s` (cut at the message's
`now`, then drop, cut at from_x and append), so a delta that would draw the wrong points fails.
"""

from __future__ import annotations

import random
from typing import Any

from app.ui import charts
from app.ui.gpu import LiveWindow, live_rows
from app.ui.live import ChartState, Feed, Topics, row_points
from app.ui.run import RunPageData
from storage.store import MemoryPoint, Store

GIB = 1024**3


def replay(page: dict[str, list[list[float]]], delta: dict[str, Any], cut: float) -> dict[str, list[list[float]]]:
    out = {k: list(v) for k, v in page.items() if k not in delta.get("drop", [])}
    for label, part in delta.get("set", {}).items():
        kept = [] if part["from_x"] is None else [p for p in out.get(label, []) if p[0] < part["from_x"]]
        out[label] = kept + part["points"]
    return {k: [p for p in v if p[0] >= cut] for k, v in out.items()}


def _sample(t: float, gib: float) -> MemoryPoint:
    return MemoryPoint(time=t, source="nvml", used_bytes=int(gib * GIB), total_bytes=80 * GIB, utilization=50.0)


def test_the_window_reads_only_its_newest_buckets(store: Store) -> None:
    rng = random.Random(3)
    store.add_memory_samples([_sample(1000.0 + i, 1 + rng.random()) for i in range(400)])
    window = LiveWindow(store, None)
    before = 1400.0
    for k, now in enumerate((1400.0, 1400.3, 1401.5, 1402.0, 1410.2, 1420.0)):
        # A new sample, a late one (another writer's batch, 4 s old), and one in the bucket read last tick.
        store.add_memory_samples([_sample(now - 0.2, 5.0 + rng.random()), _sample(now - 4.1, 9.0 * rng.random())])
        start, *got = window.read(now)
        full = live_rows(store, None, now)
        want = [{label: [p for p in pts if p[0] >= start] for label, pts in row_points(rows).items()} for rows in full]
        assert [row_points(g) for g in got] == want, now
        assert start == 1100.0 if k == 0 else before - 11.0 <= start <= now - 4.1, (start, now)  # 10 s back, not 300
        before = now


def test_a_sliding_window_sends_its_new_points_and_the_page_keeps_the_rest() -> None:
    state = ChartState(charts.GPU_MEMORY, {})
    page: dict[str, list[list[float]]] = {}
    sizes = []
    for now in range(1300, 1330):
        rows = [(float(t) + 0.5, float(t % 7), "GPU used (NVML)") for t in range(now - 300, now)]
        delta = state.update(rows, now - 300.0)
        assert delta is not None
        page = replay(page, delta, now - 300.0)
        assert page == {"GPU used (NVML)": [[x, y] for x, y, _ in rows if x >= now - 300.0]}
        sizes.append(len(delta["set"]["GPU used (NVML)"]["points"]))
    assert sizes[0] == 300 and set(sizes[1:]) == {1}  # the window moved a second: one new point, not 300


def test_the_panel_ships_one_new_bucket_a_tick(store: Store, monkeypatch: Any) -> None:
    from app.ui import live

    monkeypatch.setattr(live, "SLOW_TICK_S", 0.0)
    store.add_memory_samples([_sample(699.5 + i, 2.0 + (i % 3)) for i in range(301)])
    feed = Feed(store, Topics(gpu=True), RunPageData(store))
    first = feed.poll(now=1000.0)
    memory = [m for m in first if m["kind"] == "charts"][0]["charts"]["gpu-memory-plot"]
    assert len(memory["set"]["GPU used (NVML)"]["points"]) == 300  # the one at 699.5 is out of the window
    page = replay({}, memory, 700.0)
    assert page["GPU used (NVML)"][0] == [700.5, 3.0]
    for now in (1001.0, 1002.0, 1003.0):
        store.add_memory_samples([_sample(now - 0.5, 7.0)])
        (msg,) = feed.poll(now=now)
        delta = msg["charts"]["gpu-memory-plot"]
        assert delta["set"]["GPU used (NVML)"]["points"] == [[now - 0.5, 7.0]]
        page = replay(page, delta, now - 300.0)
    assert page["GPU used (NVML)"][-1] == [1002.5, 7.0] and page["GPU used (NVML)"][0][0] >= 703.0
    assert feed.poll(now=1004.0) == []  # no new sample: nothing sent


def test_the_page_draws_what_a_full_read_draws_with_late_samples_and_a_quiet_minute(store: Store) -> None:
    rng = random.Random(5)
    store.add_memory_samples([_sample(700.0 + i + rng.random(), 4 * rng.random()) for i in range(300)])
    feed = Feed(store, Topics(gpu=True), RunPageData(store))
    page: dict[str, list[list[float]]] = {}
    now = 1000.0
    for _ in range(40):
        now += rng.choice([0.4, 1.0, 1.0, 2.5, 70.0])  # ticks close together, and a minute with no samples
        late = [_sample(now - rng.uniform(0, 9), 4 * rng.random()) for _ in range(rng.randint(0, 3))]
        store.add_memory_samples(late)
        feed._slow_at = -1e9  # every call is a slow tick
        for msg in feed.poll(now=now):
            if msg["kind"] == "charts":
                page = replay(page, msg["charts"]["gpu-memory-plot"], now - 300.0)
        full = row_points(live_rows(store, None, now)[0])
        # The page cuts its window when a message comes; what it draws is the last 300 s before `now`.
        assert _window(page, now) == _window(full, now), now


def _window(points: dict[str, list[list[float]]], now: float) -> dict[str, list[list[float]]]:
    return {k: kept for k, v in points.items() if (kept := [p for p in v if p[0] >= now - 300.0])}
