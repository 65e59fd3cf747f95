"""The compare view's pure parts: spec differences, measured results, trade-off and loss frames."""

from __future__ import annotations

import time

import pytest

from app.ui import compare as ui_compare
from app.ui import series
from jobs.spec.enums import Method, Optim
from jobs.spec.job import JobSpec
from jobs.train import figures
from storage.store import MetricPoint, Store

GIB = 1024**3


def _finished_run(
    store: Store,
    spec: JobSpec,
    *,
    losses: list[float],
    tps: list[float],
    step_time: float,
    peak: int,
    final: dict[str, float],
) -> int:
    """A run that trained: metrics rows written as StoreCallback writes them, then marked succeeded."""
    run_id = store.create_run(spec)
    assert store.claim_next_on_device("w1", "0") is not None
    now = time.time()
    points = [MetricPoint(i + 1, "loss", v, now) for i, v in enumerate(losses)]
    points += [MetricPoint(i + 1, "tokens_per_second", v, now) for i, v in enumerate(tps)]
    points += [MetricPoint(i + 1, "step_time", step_time, now) for i in range(len(losses))]
    store.add_metrics(run_id, points)
    store.add_metrics(run_id, [MetricPoint(len(losses), "eval_loss", losses[-1] + 0.5, now)])
    store.set_peak_memory(run_id, peak, "torch")
    store.mark_succeeded(run_id, final)
    return run_id


@pytest.fixture
def two_runs(store: Store) -> tuple[int, int]:
    lora = _finished_run(
        store,
        JobSpec(run_name="lora", method=Method.LORA, per_device_train_batch_size=8),
        losses=[3.0, 2.5, 2.0],
        tps=[1000.0, 1200.0, 1100.0],
        step_time=0.5,
        peak=6 * GIB,
        final={"train_runtime": 75.0, "trainable_params": 1_000_000, "total_params": 100_000_000, "eval_loss": 2.4},
    )
    full = _finished_run(
        store,
        JobSpec(
            run_name="full",
            method=Method.FULL,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=4,
            optim=Optim.ADAMW_8BIT,
            learning_rate=1e-5,
        ),
        losses=[3.0, 1.5],
        tps=[800.0, 600.0],
        step_time=1.25,
        peak=12 * GIB,
        final={"train_runtime": 5.0, "trainable_params": 100_000_000, "total_params": 100_000_000},
    )
    return lora, full


def test_only_differing_fields_are_listed(store, two_runs):
    runs = [store.get_run(i) for i in two_runs]
    diff = dict(ui_compare.spec_differences(runs))
    assert set(diff) == {
        "run_name",
        "method",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "optim",
        "learning_rate",
    }
    assert diff["method"] == ["lora", "full"]
    assert diff["gradient_accumulation_steps"] == [1, 4]
    assert ui_compare.spec_differences(runs[:1]) == []  # one run: nothing to compare


def test_summary_reads_final_metrics_and_metric_rows(store, two_runs):
    lora, full = (store.get_run(i) for i in two_runs)
    s = ui_compare.summarize_run(store, lora)
    assert s.status == "succeeded"
    assert s.peak_memory_bytes == 6 * GIB and s.figures.peak_memory_source == "torch"
    assert s.tokens_per_second == pytest.approx(1100.0)  # mean of the rows
    assert s.figures.step_time == pytest.approx(0.5)
    assert s.figures.loss == 2.0  # the last logged loss, not trl's average train_loss
    assert s.eval_loss == 2.4  # final metrics win over rows
    assert (s.trainable_params, s.total_params, s.runtime_s) == (1_000_000, 100_000_000, 75.0)
    f = ui_compare.summarize_run(store, full)
    assert f.eval_loss == pytest.approx(2.0)  # no final eval_loss: the last eval row
    assert f.tokens_per_second == pytest.approx(700.0)


def test_tokens_per_second_is_the_one_figure_not_a_final_metric(store):
    """An older run's final metrics held another tokens/s (trl's runtime); the figure comes from the rows."""
    run_id = _finished_run(
        store,
        JobSpec(run_name="x"),
        losses=[1.0],
        tps=[10.0],
        step_time=1.0,
        peak=GIB,
        final={"tokens_per_second_mean": 42.0, "tokens_per_second": 41.0},
    )
    assert ui_compare.summarize_run(store, store.get_run(run_id)).tokens_per_second == 10.0


def test_queued_run_has_empty_results(store):
    run_id = store.create_run(JobSpec(run_name="waiting"))
    s = ui_compare.summarize_run(store, store.get_run(run_id))
    assert s.status == "queued"
    assert s.figures == figures.RunFigures() and (s.eval_loss, s.runtime_s) == (None, None)
    assert ui_compare.result_values(s)[1:] == [""] * (len(ui_compare.RESULT_ROWS) - 1)


def test_running_run_uses_resolved_config_and_elapsed_time(store):
    run_id = store.create_run(JobSpec(run_name="live"))
    run = store.claim_next_on_device("w1", "0")
    store.set_resolved_config(run_id, {"trainable_params": 123, "total_params": 1000})
    s = ui_compare.summarize_run(store, store.get_run(run_id), now=run.started_at + 30)
    assert (s.trainable_params, s.total_params) == (123, 1000)
    assert s.runtime_s == pytest.approx(30.0)


def test_table_has_differences_then_results_one_column_per_run(store, two_runs):
    runs = [store.get_run(i) for i in two_runs]
    table = ui_compare.compare_table(runs, [ui_compare.summarize_run(store, r) for r in runs])
    assert list(table.columns) == ["field", f"#{two_runs[0]} lora", f"#{two_runs[1]} full"]
    rows = {row[0]: list(row[1:]) for row in table.itertuples(index=False)}
    assert list(table["field"])[-len(ui_compare.RESULT_ROWS) :] == ui_compare.RESULT_ROWS
    assert rows["method"] == ["lora", "full"]
    assert rows["peak memory"] == ["6.00 GiB (torch)", "12.00 GiB (torch)"]
    assert rows["tokens/s"] == ["1,100 tokens/s", "700 tokens/s"]
    assert rows["step time"] == ["0.500 s", "1.250 s"]
    assert rows["loss"] == ["2.0000", "1.5000"]
    assert rows["trainable params"] == ["1.0M (1.00%)", "100.0M (100.00%)"]
    assert rows["runtime"] == ["1m 15s", "5.0s"]
    assert "seed" not in rows  # equal fields are left out


def test_same_run_twice_keeps_unique_columns(store, two_runs):
    run = store.get_run(two_runs[0])
    table = ui_compare.compare_table([run, run], [ui_compare.summarize_run(store, run)] * 2)
    assert len(set(table.columns)) == 3


def test_tradeoff_frame_has_one_point_per_measured_run(store, two_runs):
    queued = store.create_run(JobSpec(run_name="waiting"))
    runs = [store.get_run(i) for i in (*two_runs, queued)]
    frame = ui_compare.tradeoff_frame([ui_compare.summarize_run(store, r) for r in runs])
    assert list(frame.columns) == ["tokens/s", "peak GiB", "series"]
    assert frame.values.tolist() == [[1100.0, 6.0, f"#{two_runs[0]} lora"], [700.0, 12.0, f"#{two_runs[1]} full"]]
    assert [str(t) for t in frame.dtypes] == ["float64", "float64", "string"]


def test_plot_frames_are_typed_even_when_empty():
    """An untyped empty first frame froze the plot's axes as discrete in the browser (issue 15)."""
    for frame in (ui_compare.tradeoff_frame([]), series.metric_frame({}), series.memory_frame([], 0.0)):
        assert [str(t) for t in frame.dtypes] == ["float64", "float64", "string"]


def test_loss_frame_overlays_one_series_per_run(store, two_runs):
    runs = [store.get_run(i) for i in two_runs]
    frame = ui_compare.loss_frame(series.MetricSeriesCache(store), runs)
    assert list(frame.columns) == ["step", "loss", "series"]
    by_run = frame.groupby("series")["loss"].apply(list).to_dict()
    assert by_run == {f"#{two_runs[0]} lora": [3.0, 2.5, 2.0], f"#{two_runs[1]} full": [3.0, 1.5]}


def test_loss_frame_is_downsampled_for_long_runs(store):
    run_id = store.create_run(JobSpec(run_name="long"))
    store.add_metrics(run_id, [MetricPoint(i, "loss", 1.0 / (i + 1), 0.0) for i in range(20_000)])
    frame = ui_compare.loss_frame(series.MetricSeriesCache(store), [store.get_run(run_id)])
    assert 0 < len(frame) <= series.MAX_POINTS


def test_handler_compares_picked_runs_and_lists_choices(store, two_runs):
    data = ui_compare.CompareData(store)
    # Unknown ids are skipped, a run picked twice counts once.
    table, tradeoff, loss, styles = data.compare([str(two_runs[1]), two_runs[0], 9999, two_runs[0]])
    labels = [f"#{two_runs[1]} full", f"#{two_runs[0]} lora"]
    assert list(table.columns)[1:] == labels
    assert len(tradeoff.value["data"]) == 2 and {row[2] for row in loss.value["data"]} == set(labels)
    assert list(styles["compare-loss"]["color_map"]) == labels  # one colour per run, in order
    assert len(set(styles["compare-loss"]["color_map"].values())) == 2
    assert styles["compare-tradeoff"]["x_lim"] == [0.0, 1500.0]  # 1100 tokens/s * 1.1, rounded up
    dropdown = data.choices()
    assert dropdown.choices[0] == (f"{two_runs[1]} · full · succeeded", two_runs[1])  # newest first
    empty_table, empty_scatter, empty_loss, _ = data.compare([])
    assert list(empty_table["field"]) == ui_compare.RESULT_ROWS
    assert empty_scatter.value["data"] == [] and empty_loss.value["data"] == []


def test_compare_tab_is_in_the_dashboard(store):
    from app.ui.dashboard import build_ui

    demo = build_ui(store)
    ids = {getattr(b, "elem_id", None) for b in demo.blocks.values()}
    assert {"compare-runs", "compare-table", "compare-tradeoff", "compare-loss"} <= ids


# ---------------------------------------------------------------------- in Chromium
@pytest.mark.browser
def test_compare_tab_in_chromium(tmp_path):
    """Pick two finished runs in the Compare tab: the table and both plots fill in."""
    from pathlib import Path

    from engines import engine_missing, import_or_missing

    if not Path("/usr/bin/chromium").exists():
        engine_missing("/usr/bin/chromium is missing: apt-get install -y chromium")
    sync_api = import_or_missing("playwright.sync_api")
    from browser_helpers import CHROMIUM, CHROMIUM_ARGS, free_port, start_server, stop_server

    home = tmp_path / "home"
    home.mkdir()
    seeded = Store(f"sqlite:///{home / 'tunedeck.db'}")
    # Finished before the server (and its worker) starts, so nothing is left for the worker to train.
    ids = [
        _finished_run(
            seeded,
            JobSpec(run_name=name, method=method),
            losses=[3.0, 2.0, 1.0],
            tps=[tps] * 3,
            step_time=0.5,
            peak=peak,
            final={"train_runtime": 9.0},
        )
        for name, method, tps, peak in (
            ("lora-run", Method.LORA, 900.0, 3 * GIB),
            ("full-run", Method.FULL, 500.0, 9 * GIB),
        )
    ]
    seeded.dispose()
    port = free_port()
    proc = start_server(home, port, home / "server.log")
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{port}/")
            page.get_by_role("tab", name="Compare").click()
            picker = page.locator("#compare-runs input")
            for run_id, name in zip(ids, ("lora-run", "full-run")):
                picker.click()
                page.get_by_role("option", name=f"{run_id} · {name} · succeeded").click()
            table = page.locator("#compare-table")
            # The dataframe keeps a hidden copy of its cells: look at the visible ones only.
            table.get_by_text("9.00 GiB (torch)").filter(visible=True).first.wait_for(timeout=20_000)
            assert table.get_by_text("3.00 GiB (torch)").filter(visible=True).count() > 0
            assert table.get_by_text("method", exact=True).filter(visible=True).count() > 0
            for plot in ("#compare-tradeoff", "#compare-loss"):
                page.locator(f"{plot} canvas, {plot} svg").first.wait_for(timeout=15_000)
            browser.close()
    finally:
        stop_server(proc)
