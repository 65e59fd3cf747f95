"""The live stream (app.ui.live, app.ui.live_route): deltas, what each tick sends, when it ends, who may read it.

The browser side (app/ui/static/live.js) is checked in Chromium by tests/test_charts_browser.py; here
`apply` replays what the page does with a delta, so a delta that would draw the wrong points fails.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from app.ui import charts
from app.ui.live import ChartState, Feed, Topics, row_points, series_delta
from app.ui.run import RunPageData
from jobs.spec.job import JobSpec
from storage.store import MemoryPoint, MetricPoint, Store


def apply(page: dict[str, list[list[float]]], delta: dict[str, Any]) -> dict[str, list[list[float]]]:
    """What live.js does with a delta: drop series, cut each set series at from_x, append its points."""
    out = {k: list(v) for k, v in page.items() if k not in delta.get("drop", [])}
    for label, part in delta.get("set", {}).items():
        kept = [] if part["from_x"] is None else [p for p in out.get(label, []) if p[0] < part["from_x"]]
        out[label] = kept + part["points"]
    return out


# ---------------------------------------------------------------------- deltas (pure)
def test_a_growing_series_sends_its_new_points_only() -> None:
    old = {"train": [[1.0, 2.0], [2.0, 1.5]]}
    new = {"train": [[1.0, 2.0], [2.0, 1.5], [3.0, 1.2]]}
    delta = series_delta(old, new)
    assert delta == {"set": {"train": {"from_x": 3.0, "points": [[3.0, 1.2]]}}}
    assert apply(old, delta) == new
    assert series_delta(new, new) == {}  # nothing changed: nothing to send


def test_a_reread_last_bucket_and_a_merge_and_a_dropped_series_turn_old_into_new() -> None:
    # A bucket drawn as min and max at the same x grew: both points at that x are sent again.
    old = {"train": [[1.0, 2.0], [2.5, 1.0], [2.5, 1.4]], "eval": [[2.0, 1.9]]}
    new = {"train": [[1.0, 2.0], [2.5, 0.9], [2.5, 1.4], [4.0, 1.1]]}
    delta = series_delta(old, new)
    assert delta["drop"] == ["eval"] and delta["set"]["train"]["from_x"] == 2.5
    assert apply(old, delta) == new
    merged = {"train": [[1.5, 1.0], [1.5, 2.0], [3.5, 0.9], [3.5, 1.4]]}  # the buckets doubled in width
    assert apply(new, series_delta(new, merged)) == merged


def test_random_histories_always_replay_to_the_new_points() -> None:
    rng = random.Random(7)
    for _ in range(300):
        old: dict[str, list[list[float]]] = {}
        for label in rng.sample(["a", "b", "c"], rng.randint(0, 3)):
            xs = sorted(rng.choice([0.0, 0.5, 1.0, 1.5, 2.0, 3.0]) for _ in range(rng.randint(0, 6)))
            old[label] = [[x, float(rng.randint(0, 3))] for x in xs]
        new = {k: [list(p) for p in v] for k, v in old.items() if rng.random() < 0.8}
        for pts in new.values():
            cut = rng.randint(0, len(pts))
            tail = sorted(rng.choice([2.0, 3.0, 4.0, 5.0]) for _ in range(rng.randint(0, 3)))
            pts[cut:] = [
                *pts[cut:cut],
                *[[x, float(rng.randint(0, 3))] for x in tail if not pts[:cut] or x >= pts[cut - 1][0]],
            ]
        assert apply(old, series_delta(old, new)) == new, (old, new)


def test_a_chart_sends_its_meta_once_then_only_changes() -> None:
    state = ChartState(charts.RUN_LOSS, {"label": "Loss"})
    rows = [(1.0, 2.0, "train"), (2.0, 1.0, "train"), (2.0, 3.0, "eval")]
    first = state.update(rows)
    assert first is not None and first["meta"] == {"label": "Loss"}
    assert first["colors"] == {"train": charts.SERIES_COLORS["train"], "eval": charts.SERIES_COLORS["eval"]}
    assert state.update(rows) is None
    assert row_points([(2.0, 1.0, "a"), (1.0, float("nan"), "a"), (0.5, 3.0, "a")]) == {"a": [[0.5, 3.0], [2.0, 1.0]]}
    empty = ChartState(charts.RUN_LR, {}).update([])
    assert empty is not None and empty["set"] == {}  # a chart with no data yet still gets its titles


def test_topics_name_the_parameter_the_problem_and_the_fix() -> None:
    assert Topics.from_query({"run": "12", "gpu": "1"}) == Topics(run_id=12, gpu=True)
    assert Topics.from_query({}).empty
    for query, words in (
        ({"run": "x"}, "run='x' is not a run id"),
        ({"gpu": "yes"}, "gpu='yes': pass gpu=1"),
        ({"page": "1"}, "unknown parameter 'page'"),
        ({"device": "<script>"}, "device: not a device label"),
    ):
        with pytest.raises(ValueError, match=words):
            Topics.from_query(query)


# ---------------------------------------------------------------------- the feed
def _running(store: Store, steps: int = 3) -> int:
    run_id = store.create_run(JobSpec(run_name="live"))
    assert store.claim_next_on_device("w", "0") is not None
    store.add_metrics(run_id, [MetricPoint(s, "loss", 2.0 - s / 10, time.time()) for s in range(1, steps + 1)])
    return run_id


def _kinds(messages: list[dict[str, Any]]) -> list[str]:
    return [m["kind"] for m in messages]


def test_a_live_run_sends_new_points_and_nothing_when_nothing_changed(store: Store) -> None:
    run_id = _running(store)
    feed = Feed(store, Topics(run_id=run_id), RunPageData(store))
    first = feed.poll()
    assert _kinds(first) == ["run", "charts"]
    loss = first[1]["charts"]["run-loss-plot"]
    assert loss["meta"]["y_title"] == "loss" and len(loss["set"]["train"]["points"]) == 3
    assert feed.poll() == [] and not feed.done  # nothing moved: nothing sent
    store.add_metrics(run_id, [MetricPoint(4, "loss", 1.5, time.time())])
    (charts_msg,) = feed.poll()
    assert charts_msg["charts"] == {
        "run-loss-plot": {"set": {"train": {"from_x": 4.0, "points": [[4.0, 1.5]]}}, "colors": {"train": "#4e79a7"}}
    }
    store.set_progress(run_id, 4)
    (moved,) = feed.poll()  # the text moved, the charts did not; the message carries the bar's step
    assert moved["kind"] == "run" and moved["step"] == 4 and moved["status"] == "running"
    other = _running(store)  # another run's rows move the store's stamp, not this page's charts
    store.add_metrics(other, [MetricPoint(9, "loss", 1.0, time.time())])
    assert feed.poll() == []
    assert feed.interval < 1.0


def test_a_finished_run_is_sent_once_then_the_stream_is_done(store: Store) -> None:
    run_id = _running(store)
    store.mark_succeeded(run_id, {})
    feed = Feed(store, Topics(run_id=run_id), RunPageData(store))
    assert _kinds(feed.poll()) == ["run", "charts"] and feed.done
    assert feed.poll() == []
    missing = Feed(store, Topics(run_id=999), RunPageData(store))
    assert _kinds(missing.poll()) == ["run"] and missing.done  # the page's text says "No run 999."
    assert Feed(store, Topics(), RunPageData(store)).done


def test_the_runs_table_and_gpu_panel_hear_of_changes_at_the_slow_tick(store: Store, monkeypatch: Any) -> None:
    from app.ui import live

    monkeypatch.setattr(live, "SLOW_TICK_S", 0.0)
    feed = Feed(store, Topics(gpu=True, runs=True), RunPageData(store))
    first = feed.poll(now=1000.0)
    assert _kinds(first) == ["devices", "charts", "runs"] and not feed.done
    assert first[1]["now"] == 1000.0 and first[1]["charts"]["gpu-memory-plot"]["meta"]["x_lim"] == [-300.0, 0.0]
    assert feed.poll(now=1000.0) == []
    store.add_memory_samples([MemoryPoint(time=999.5, source="host", used_bytes=2 * 1024**3, process_rss=2 * 1024**3)])
    (msg,) = feed.poll(now=1000.0)
    assert msg["charts"]["gpu-memory-plot"]["set"] == {"host RSS": {"from_x": None, "points": [[999.5, 2.0]]}}
    store.create_run(JobSpec(run_name="new"))
    assert _kinds(feed.poll(now=1000.0)) == ["runs"]


# ---------------------------------------------------------------------- the route
def _client(store: Store, auth: Any = None) -> Any:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from app.ui.live_route import add_live_route

    app = FastAPI()
    app.auth, app.auth_dependency = auth, None  # type: ignore[attr-defined]
    app.cookie_id, app.tokens = "c", {"good": "ada"}  # type: ignore[attr-defined]
    add_live_route(app, store)
    return TestClient(app)


def test_the_stream_of_a_finished_run_ends_and_bad_or_anonymous_requests_are_refused(store: Store) -> None:
    run_id = _running(store)
    store.mark_succeeded(run_id, {})
    response = _client(store).get(f"/tunedeck/live?run={run_id}")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    data = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith('data: {"')]
    assert [d["kind"] for d in data] == ["run", "charts"] and response.text.rstrip().endswith("event: end\ndata: {}")
    bad = _client(store).get("/tunedeck/live?run=abc")
    assert bad.status_code == 400 and "not a run id" in bad.json()["error"]
    locked = _client(store, auth=[("ada", "pw")])
    assert locked.get(f"/tunedeck/live?run={run_id}").status_code == 401
    locked.cookies.set("access-token-c", "good")
    assert locked.get(f"/tunedeck/live?run={run_id}").status_code == 200


# ---------------------------------------------------------------------- the run page's text
def test_a_refresh_sends_only_the_outputs_that_changed(store: Store) -> None:
    import gradio as gr

    from app.ui.run import OUTPUTS

    run_id = _running(store)
    page = RunPageData(store)
    first = page.refresh(run_id, None)
    assert len(first) == OUTPUTS and not any(v is gr.skip() or isinstance(v, dict) and not v for v in first[:-1])
    again = page.refresh(run_id, first[-1])
    skipped = [type(v).__name__ for v in again[:-1] if not _is_skip(v)]
    assert skipped == [], skipped  # nothing moved: every output skipped
    store.set_progress(run_id, 3, 10)
    moved = page.refresh(run_id, again[-1])
    assert [i for i, v in enumerate(moved[:-1]) if not _is_skip(v)] == [1]  # the progress bar only
    store.add_metrics(run_id, [MetricPoint(4, "loss", 0.25, time.time())])
    header = page.refresh(run_id, moved[-1])
    assert not _is_skip(header[0]) and "0.25" in header[0] and _is_skip(header[9])  # the header; not the spec


def _is_skip(value: Any) -> bool:
    return isinstance(value, dict) and value.get("__type__") == "update" and len(value) == 1


def test_the_idle_queue_is_slowed_on_the_gradio_we_run() -> None:
    import gradio as gr

    from app.server import QUEUE_IDLE_POLL_S, QUEUE_PROGRESS_POLL_S, quiet_queue

    with gr.Blocks() as demo:
        gr.Markdown("x")
    demo.queue()
    assert demo._queue.sleep_when_free < QUEUE_IDLE_POLL_S  # what gradio does by default: the cost
    quiet_queue(demo)
    assert demo._queue.sleep_when_free == QUEUE_IDLE_POLL_S
    assert demo._queue.progress_update_sleep_when_free == QUEUE_PROGRESS_POLL_S
    # The progress loop polls once a second because no handler reports gr.Progress; one that did would
    # see its bar move once a second (then lower QUEUE_PROGRESS_POLL_S).
    app = Path(__file__).resolve().parents[1] / "app"
    assert not [p for p in app.rglob("*.py") if "gr.Progress(" in p.read_text()]
    demo._queue = object()
    with pytest.raises(RuntimeError, match="sleep_when_free"):
        quiet_queue(demo)


def test_the_main_thread_waits_without_waking_and_stops_the_server_on_ctrl_c(monkeypatch: pytest.MonkeyPatch) -> None:
    import app.server as server

    class Demo:
        def __init__(self) -> None:
            self.is_running, self.closed = True, 0
            self.server = self

        def close(self) -> None:
            self.closed += 1

    sleeps: list[float] = []
    demo = Demo()

    def sleep(s: float) -> None:  # the server closes from another thread after two polls
        sleeps.append(s)
        demo.is_running = len(sleeps) < 2

    monkeypatch.setattr(server.time, "sleep", sleep)
    server.wait_until_stopped(demo)
    assert sleeps == [5.0, 5.0] and demo.closed == 0  # two wake-ups in 10 s, not 100

    def interrupted(s: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(server.time, "sleep", interrupted)
    demo.is_running = True
    with pytest.raises(KeyboardInterrupt):
        server.wait_until_stopped(demo)
    assert demo.closed == 1
