"""Unit tests of the dashboard's pure parts: form values -> spec, downsampling."""

from __future__ import annotations

from typing import Any

import pytest
from series_reference import downsample_minmax, same_buckets

from app.ui import form as ui_form
from app.ui import series
from jobs.spec.field_info import field_infos
from jobs.spec.job import JobSpec, SpecError
from storage.store import MemoryPoint, MetricPoint


def _defaults() -> dict:
    return dict(zip(ui_form.NAMES, ui_form.form_values(JobSpec())))


def test_form_values_round_trip_to_the_same_spec():
    assert ui_form.spec_from_form(_defaults()) == JobSpec()


def test_empty_optional_inputs_mean_none():
    values = {**_defaults(), "run_name": "  ", "eval_dataset": "", "max_train_samples": None}
    spec = ui_form.spec_from_form(values)
    assert spec.run_name is None and spec.eval_dataset is None and spec.max_train_samples is None


def test_every_problem_is_reported_at_once():
    values = {**_defaults(), "learning_rate": 0, "lora_r": 0, "max_length": None}
    with pytest.raises(SpecError) as exc:
        ui_form.spec_from_form(values)
    fields = {p.field for p in exc.value.problems}
    assert {"learning_rate", "lora_r", "max_length"} <= fields
    text = ui_form.problems_markdown(exc.value.problems)
    assert "**learning_rate**" in text and "Fix:" in text


def test_form_is_generated_from_every_spec_field():
    assert ui_form.NAMES == [f.name for f in field_infos()]


def test_downsampling_in_sql_keeps_a_spike_and_bounds_points(store):
    run_id = store.create_run(JobSpec())
    n = 50_000
    points = [MetricPoint(i, "loss", 1.0 + (i % 7) * 0.01, float(i)) for i in range(n)]
    points[31_337] = MetricPoint(31_337, "loss", 99.0, 31_337.0)
    points[40_001] = MetricPoint(40_001, "loss", -5.0, 40_001.0)
    store.add_metrics(run_id, points)
    cache = series.MetricSeriesCache(store, max_points=2000)
    buckets = cache.get(run_id, "loss")
    assert len(buckets) <= 1000
    assert max(b.max for b in buckets) == 99.0 and min(b.min for b in buckets) == -5.0
    assert sum(b.count for b in buckets) == n
    assert same_buckets(buckets, downsample_minmax([(p.step, p.value) for p in points], 2000))
    frame = series.metric_frame({"train": buckets})
    assert len(frame) <= 2000 and frame["value"].max() == 99.0


def test_incremental_refresh_equals_a_cold_query(store):
    run_id = store.create_run(JobSpec())
    warm = series.MetricSeriesCache(store, max_points=100)
    for start in range(0, 5000, 700):
        store.add_metrics(
            run_id,
            [MetricPoint(i, "loss", float((i * 37) % 101), float(i)) for i in range(start, min(start + 700, 5000))],
        )
        warm.get(run_id, "loss")
    cold = series.MetricSeriesCache(store, max_points=100)
    assert warm.get(run_id, "loss") == cold.get(run_id, "loss")
    assert len(cold.get(run_id, "loss")) <= 50


def test_memory_series_keeps_the_peak(store):
    run_id = store.create_run(JobSpec())
    samples = [
        MemoryPoint(time=1000.0 + i * 0.1, source="host", run_id=run_id, process_rss=1 << 30) for i in range(20_000)
    ]
    samples[12_345] = MemoryPoint(time=1000.0 + 12_345 * 0.1, source="host", run_id=run_id, process_rss=9 << 30)
    store.add_memory_samples(samples)
    origin, buckets = series.MemorySeriesCache(store, max_points=500).get(run_id)
    assert origin == 1000.0 and len(buckets) <= 251
    frame = series.memory_frame(buckets, origin)
    assert frame["GiB"].max() == 9.0


def test_last_metric_values_per_run(store):
    a, b = store.create_run(JobSpec()), store.create_run(JobSpec())
    store.add_metrics(a, [MetricPoint(1, "loss", 3.0, 1.0), MetricPoint(2, "loss", 2.0, 2.0)])
    store.add_metrics(b, [MetricPoint(1, "loss", 5.0, 1.0)])
    assert store.last_metric_values([a, b], "loss") == {a: 2.0, b: 5.0}


def test_build_ui_builds(store):
    from app.ui.dashboard import build_ui

    demo = build_ui(store)
    labels = {c.get("props", {}).get("label") for c in demo.get_config_file()["components"]}
    assert {"Learning rate (learning_rate)", "Model (model)", "Training data (dataset)", "run id"} <= labels


def test_a_run_link_opens_the_run_without_waiting_for_the_launch_form(store):
    """`?run=N` selects the run in a load event of its own: the Launch form's first memory prediction
    and data preview (cold imports, tens of seconds on a loaded machine) must not hold the run page back."""
    import gradio as gr

    from app.ui.dashboard import build_ui

    demo = build_ui(store)
    loads = [fn for fn in demo.fns.values() if any(event == "load" for _, event in fn.targets)]
    opens = [fn for fn in loads if any(getattr(c, "label", None) == "run id" for c in fn.outputs)]
    assert len(opens) == 1, [fn.name for fn in loads]
    assert {type(c) for c in opens[0].outputs} == {gr.Number, gr.Tabs}, opens[0].outputs
    assert all(fn.concurrency_id != opens[0].concurrency_id for fn in loads if fn is not opens[0])


def test_method_choice_shows_each_methods_description_and_budget_survives_new_methods():
    import gradio as gr

    from app.ui import form as ui_form
    from jobs.spec.enums import METHOD_DESCRIPTIONS, Method

    with gr.Blocks():
        dropdown = ui_form.make_component(ui_form.info("method"))
    labels = {value: label for label, value in dropdown.choices}
    assert set(labels) == {m.value for m in Method}
    assert labels["mora"] == f"mora: {METHOD_DESCRIPTIONS[Method.MORA]}"
    values = dict(zip(ui_form.NAMES, ui_form.form_values(JobSpec(method="lokr"))))
    text = ui_form.budget_text(*[values[n] for n in ui_form.NAMES])
    assert "effective batch size" in text


def test_eta_of_a_resumed_run_uses_the_whole_runs_step_time(store, tiny_model):
    """Resumed at step 50 of 100, 10 s into the new attempt, with 2 s steps measured before the
    resume: 50 steps left take ~100 s, not the 10 s that 10 s over 50 steps would claim."""
    import time
    from dataclasses import replace

    import training_helpers

    from app.ui.run_text import eta_text
    from jobs.train import figures
    from storage.models import RunStatus

    rid = store.create_run(training_helpers.tiny_spec(tiny_model))
    store.add_metrics(rid, [MetricPoint(step, "step_time", 2.0, float(step)) for step in range(5, 55, 5)])
    now = time.time()
    run = replace(store.get_run(rid), status=RunStatus.RUNNING, started_at=now - 10.0, current_step=50, total_steps=100)
    measured = figures.run_figures(store, run)
    assert measured.step_time == pytest.approx(2.0)
    assert eta_text(run, now=now, step_time=measured.step_time) == " · ETA 1m 40s"
    assert eta_text(run, now=now) == " · ETA 0m 10s"  # no measured step time yet: this attempt's rate
    assert eta_text(replace(run, status=RunStatus.SUCCEEDED), now=now, step_time=2.0) == ""


def test_a_bundle_written_under_another_mount_is_explained_not_hidden(store, tiny_model, tmp_path):
    """Many hosts: a worker whose data folder was mounted elsewhere recorded a path this dashboard
    cannot serve. The run page says so and how to fix it, instead of silently showing no download."""
    import training_helpers

    from app.ui.served_files import bundle_path, unreachable_files_note

    rid = store.create_run(training_helpers.tiny_spec(tiny_model))
    elsewhere = tmp_path / "other-mount" / "run.zip"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"zip")
    store.add_artifact(rid, "bundle", str(elsewhere), 3, "0" * 64)
    assert bundle_path(store, rid) is None
    note = unreachable_files_note(store, rid)
    assert str(elsewhere) in note and "not inside this dashboard's data folder" in note and "same path" in note
    inside = store.run_dir(rid) / "gone.zip"  # recorded inside the data folder, but not on this host's disk
    store.add_artifact(rid, "bundle", str(inside), 3, "0" * 64)
    assert "is missing on this host" in unreachable_files_note(store, rid)
    inside.write_bytes(b"zip")
    assert unreachable_files_note(store, rid) == "" and bundle_path(store, rid) == inside.resolve()


@pytest.mark.parametrize("panel", ["chat", "export", "evaluate"])
def test_a_panels_events_run_one_at_a_time_in_the_order_made(store, panel: str) -> None:
    """A run picked (or opened) and at once Clear, Send or Export: the pick's drawing must not land after the
    button's, putting back older columns or dropping the tasks the panel follows."""
    import gradio as gr

    from app.ui import chat
    from app.ui import evaluate as ui_evaluate
    from app.ui import export as ui_export

    with gr.Blocks() as demo:
        if panel == "chat":
            module: Any = chat
            view: Any = chat.build()
            chat.wire(view, store)
        else:
            module = ui_export if panel == "export" else ui_evaluate
            run_id = gr.Number()
            view = module.build()
            module.wire(view, store, run_id)
    mine = {c._id for c in vars(view).values()}
    fns = [fn for fn in demo.fns.values() if mine & {c._id for c in (*fn.inputs, *fn.outputs)}]
    assert len(fns) >= 4, [fn.name for fn in fns]
    assert {(fn.concurrency_id, fn.concurrency_limit) for fn in fns} == {(module.EVENTS, 1)}
