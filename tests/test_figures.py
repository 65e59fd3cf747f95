"""One definition per figure: tokens/s, step time, peak memory and loss read the same everywhere.

Also the chart data that follows the device (host RSS alone on CPU, NVML + torch on a GPU) and
the colours that tell runs apart (app/ui/charts.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jobs.spec.job import JobSpec
from jobs.spec.stored import spec_of
from jobs.train import figures
from storage.store import MemoryBucket, MemoryPoint, MetricPoint

GIB = 1024**3
FIGURES_DOC = Path(__file__).resolve().parents[1] / "docs" / "results-export-chat.md"  # the figures table


@pytest.fixture
def measured_run(store):
    """A run whose last tokens/s (1100) and step time (0.2) differ from their means."""
    run_id = store.create_run(JobSpec(run_name="measured"))
    assert store.claim_next_on_device("w", "0") is not None
    now = time.time()
    rows = [MetricPoint(s, "tokens_per_second", v, now) for s, v in ((1, 1000.0), (2, 1300.0), (3, 1100.0))]
    rows += [MetricPoint(s, "step_time", v, now) for s, v in ((1, 0.5), (2, 0.3), (3, 0.2))]
    rows += [MetricPoint(s, "loss", v, now) for s, v in ((1, 3.0), (2, 2.0), (3, 1.25))]
    store.add_metrics(run_id, rows)
    store.set_peak_memory(run_id, int(1.5 * GIB), "host")
    store.mark_succeeded(run_id, {"train_runtime": 3.0})
    return run_id


def test_figures_are_means_of_the_rows_and_the_last_loss(store, measured_run):
    f = figures.run_figures(store, store.get_run(measured_run))
    assert f.tokens_per_second == pytest.approx(3400 / 3)
    assert f.step_time == pytest.approx(1.0 / 3)
    assert (f.loss, f.peak_memory_bytes, f.peak_memory_source) == (1.25, int(1.5 * GIB), "host")
    assert [f.text(x) for x in figures.FIGURES] == ["1,133 tokens/s", "0.333 s", "1.50 GiB (host)", "1.2500"]
    assert f.metrics() == {
        "tokens_per_second": pytest.approx(3400 / 3),
        "step_time": pytest.approx(1 / 3),
        "peak_memory_bytes": float(int(1.5 * GIB)),
        "loss": 1.25,
    }


def test_every_surface_shows_the_same_text(store, measured_run):
    """Runs table, run page header, Compare, `tunedeck show` and the model card print one text per figure."""
    from app.cli import show as cli
    from app.ui import compare as ui_compare
    from app.ui import run as ui_run
    from app.ui import runs as ui_runs
    from jobs.train.artifacts import model_card

    run = store.get_run(measured_run)
    f = figures.run_figures(store, run)
    texts = {x.label: f.text(x) for x in figures.FIGURES}
    table = ui_runs.runs_frame(store)
    for x in ui_runs.FIGURE_COLUMNS:
        assert table[x.label].iloc[0] == texts[x.label], x.label  # the table used to show the last rate, 1100
    summary = ui_compare.summarize_run(store, run)
    compare = ui_compare.compare_table([run], [summary])
    cells = dict(zip(compare["field"], compare.iloc[:, 1]))
    for x in ui_compare.FIGURE_ROWS:
        assert cells[x.label] == texts[x.label], x.label
    header = ui_run.header_markdown(run, f)
    shown = cli.show_text(store, run)
    card = model_card(spec_of(run), f.metrics())
    for x in figures.FIGURES:
        assert texts[x.label] in header, x.label
        assert texts[x.label] in shown, x.label
        assert figures.format_figure(x, f.metrics()[x.key]) in card, x.label


def test_many_runs_at_once_match_one_run_at_a_time(store, measured_run):
    other = store.create_run(JobSpec(run_name="quiet"))  # nothing measured
    runs = [store.get_run(measured_run), store.get_run(other)]
    many = figures.figures_of_runs(store, runs)
    assert many[measured_run] == figures.run_figures(store, runs[0])
    assert many[other] == figures.RunFigures()
    assert many[other].text(figures.TOKENS_PER_SECOND) == ""


def test_sampled_peak_is_the_highest_nvml_or_host_sample(store):
    run_id = store.create_run(JobSpec())
    store.add_memory_samples(
        [MemoryPoint(time=100.0 + i, source="nvml", run_id=run_id, used_bytes=(i + 1) * GIB) for i in range(5)]
        + [MemoryPoint(time=101.0, source="torch", run_id=run_id, torch_reserved=9 * GIB)]
    )
    assert figures.sampled_peak(store, run_id) == (5 * GIB, "nvml")
    assert figures.sampled_peak(store, store.create_run(JobSpec())) is None


def test_docs_define_every_figure_as_the_code_does():
    assert figures.markdown_table() in FIGURES_DOC.read_text(), (
        "docs/results-export-chat.md's figure table differs from jobs/train/figures.py"
    )


# ---------------------------------------------------------------------- chart data
def _bucket(source: str, **values) -> MemoryBucket:
    fields = dict(
        used_min=None,
        used_max=None,
        total_max=None,
        utilization_max=None,
        torch_allocated_max=None,
        torch_reserved_max=None,
        rss_min=None,
        rss_max=None,
    )
    return MemoryBucket(source, 10.0, 10.0, **{**fields, **values}, count=1)


def test_memory_graph_follows_the_device():
    from app.ui import series

    cpu = series.memory_frame([_bucket("host", used_min=GIB, used_max=GIB, rss_min=GIB, rss_max=GIB)], 0.0)
    assert set(cpu["series"]) == {"host RSS"}  # no "GPU used (NVML)" line on a machine without one
    gpu = series.memory_frame(
        [
            _bucket("nvml", used_min=3 * GIB, used_max=3 * GIB, rss_min=GIB, rss_max=GIB),
            _bucket("torch", torch_allocated_max=GIB, torch_reserved_max=2 * GIB),
        ],
        0.0,
    )
    assert dict(zip(gpu["series"], gpu["GiB"])) == {
        "GPU used (NVML)": 3.0,
        "torch allocated": 1.0,
        "torch reserved": 2.0,
    }


def test_runs_sharing_a_name_get_their_own_colour_and_label():
    from app.ui import charts
    from app.ui import compare as ui_compare

    labels = [ui_compare.run_label(i, "lora") for i in range(1, 6)]
    colours = charts.color_map(labels)
    assert list(colours) == labels and len(set(colours.values())) == 5
    assert charts.color_map(["train", "eval"]) == {
        "train": charts.SERIES_COLORS["train"],
        "eval": charts.SERIES_COLORS["eval"],
    }


@pytest.mark.parametrize("value, top", [(0.0, 1.0), (0.93, 1.0), (1.01, 1.2), (3.3, 4.0), (27_576.0, 30_000.0)])
def test_axis_tops_are_round_numbers_past_the_data(value, top):
    from app.ui.charts import round_up

    assert round_up(value) == pytest.approx(top)


def test_a_single_logged_value_still_draws_a_line():
    """A run's one final eval loss: a line plot draws nothing for one vertex, so it gets two."""
    from app.ui import series
    from storage.store import MetricBucket

    frame = series.metric_frame(
        {
            "eval": [MetricBucket(40, 40, 1.5, 1.5, 1.5, 1)],
            "train": [MetricBucket(s, s, 2.0, 2.0, 2.0, 1) for s in (1, 2)],
        }
    )
    assert frame[frame["series"] == "eval"][["step", "value"]].values.tolist() == [[39.5, 1.5], [40.5, 1.5]]
    assert frame[frame["series"] == "train"]["step"].tolist() == [1.0, 2.0]


def test_every_dashboard_plot_has_a_browser_check(store):
    """A new chart must come with a check in tests/test_charts_browser.py (issue 15: charts that draw)."""
    import gradio as gr
    from chart_scene import CHECKED_CHARTS

    from app.ui.dashboard import build_ui

    demo = build_ui(store)
    plots = {b.elem_id for b in demo.blocks.values() if isinstance(b, (gr.LinePlot, gr.ScatterPlot, gr.BarPlot))}
    assert None not in plots, "a plot without elem_id cannot be found by the browser tests"
    assert plots <= CHECKED_CHARTS, f"plots without a browser check: {sorted(plots - CHECKED_CHARTS)}"
