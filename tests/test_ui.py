"""Unit tests of the dashboard's pure parts: form values -> spec, budget arithmetic, downsampling."""

from __future__ import annotations

import pytest

from app import budget, series, ui_form
from app.budget import SMOLLM2_135M, Arch
from jobs.spec import JobSpec, Method, Optim, Precision, SpecError
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
    assert ui_form.NAMES == [f.name for f in __import__("jobs.spec", fromlist=["x"]).field_infos()]


def test_smollm2_parameter_count_matches_the_published_model():
    assert SMOLLM2_135M.params == 134_515_008


def test_lora_trainable_params_and_bytes():
    arch = Arch(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=512)
    spec = JobSpec(method=Method.LORA, lora_r=8, lora_target_modules="q_proj,v_proj", precision=Precision.FP32)
    # q: 8*(64+64), v: 8*(64+32) per layer, two layers
    assert budget.trainable_params(arch, spec) == 2 * (8 * 128 + 8 * 96)
    b = budget.estimate(arch, spec, cuda=False)
    p = b.trainable_params
    assert b.gradients_bytes == 4 * p and b.optimizer_bytes == 8 * p
    assert b.weights_bytes == 4 * arch.params + 4 * p


def test_full_finetune_mixed_precision_is_18_bytes_per_param():
    spec = JobSpec(method=Method.FULL, precision=Precision.BF16, learning_rate=1e-5)
    b = budget.estimate(SMOLLM2_135M, spec, cuda=True)
    assert b.total_bytes == pytest.approx(18 * SMOLLM2_135M.params)


def test_qlora_base_and_8bit_optimizer():
    spec = JobSpec(method=Method.QLORA, optim=Optim.ADAMW_8BIT)
    b = budget.estimate(SMOLLM2_135M, spec, cuda=True)
    p = b.trainable_params
    assert b.optimizer_bytes == 2 * p
    assert b.weights_bytes == pytest.approx(0.516 * SMOLLM2_135M.params + 4 * p)
    assert b.effective_batch_size == spec.effective_batch_size


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
    assert series.same_buckets(buckets, series.downsample_minmax([(p.step, p.value) for p in points], 2000))
    frame = series.metric_frame({"train": buckets})
    assert len(frame) <= 2000 and frame["value"].max() == 99.0


def test_incremental_refresh_equals_a_cold_query(store):
    run_id = store.create_run(JobSpec())
    warm = series.MetricSeriesCache(store, max_points=100)
    for start in range(0, 5000, 700):
        store.add_metrics(run_id, [MetricPoint(i, "loss", float((i * 37) % 101), float(i))
                                   for i in range(start, min(start + 700, 5000))])
        warm.get(run_id, "loss")
    cold = series.MetricSeriesCache(store, max_points=100)
    assert warm.get(run_id, "loss") == cold.get(run_id, "loss")
    assert len(cold.get(run_id, "loss")) <= 50


def test_memory_series_keeps_the_peak(store):
    run_id = store.create_run(JobSpec())
    samples = [MemoryPoint(time=1000.0 + i * 0.1, source="host", run_id=run_id, process_rss=1 << 30)
               for i in range(20_000)]
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
    from app.ui import build_ui

    demo = build_ui(store)
    labels = {c.get("props", {}).get("label") for c in demo.get_config_file()["components"]}
    assert {"Learning rate (learning_rate)", "Model (model)", "Training data (dataset)", "run id"} <= labels


def test_method_choice_shows_each_methods_description_and_budget_survives_new_methods():
    import gradio as gr

    from app import ui_form
    from jobs.spec import METHOD_DESCRIPTIONS, Method

    with gr.Blocks():
        dropdown = ui_form.make_component(ui_form._info("method"))
    labels = {value: label for label, value in dropdown.choices}
    assert set(labels) == {m.value for m in Method}
    assert labels["mora"] == f"mora: {METHOD_DESCRIPTIONS[Method.MORA]}"
    values = dict(zip(ui_form.NAMES, ui_form.form_values(JobSpec(method="lokr"))))
    text = ui_form.budget_text(*[values[n] for n in ui_form.NAMES])
    assert "effective batch size" in text
