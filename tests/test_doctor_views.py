"""Where the training doctor's findings show: the run page's banner, list and "Clone with fix" choices, the
stretch of curve marked on its loss chart, the runs table's icon, Compare's row, and the trackers' tags
and notes (`app.ui.findings_view`, `jobs.train.mirrors.TrackerSink.note`). The findings are stored by the
worker's doctor (`jobs.doctor.watch`); the dashboard only reads them."""

from __future__ import annotations

from pathlib import Path

from test_doctor_watch import losses, running_run

from app.ui import compare as ui_compare
from app.ui import runs as ui_runs
from app.ui.run import OUTPUTS, RunPageData
from jobs.doctor.findings import findings_of
from jobs.doctor.watch import Doctor
from jobs.spec.job import JobSpec
from storage.store import Store


def spiked_run(store: Store) -> int:
    """A run whose loss spiked at step 40, its finding stored by the worker's doctor."""
    spec = JobSpec(model="tiny-llama", max_steps=100, learning_rate=2e-4)
    run_id = running_run(store, spec)
    store.add_metrics(run_id, losses(1, 60, spike_at=40))
    (found,) = Doctor(store, run_id, spec, interval_s=0.0).check()
    assert found.step == 40
    return run_id


def page_values(store: Store, run_id: int) -> dict[str, object]:
    values = RunPageData(store).refresh(run_id, None)
    assert len(values) == OUTPUTS
    names = ["header", "progress", "cancel", "download", "files", "error", "samples", "phases", "log", "spec"]
    return dict(zip([*names, "resume", "findings", "fix", "clone_fix", "drawn"], values))


def test_the_run_page_shows_a_banner_the_list_and_the_fix_to_clone_with(store: Store) -> None:
    run_id = spiked_run(store)
    shown = page_values(store, run_id)
    banner = str(shown["findings"])
    assert 'id="run-findings"' in banner and 'data-worst="warning"' in banner
    assert "Training doctor: 1 finding." in banner and 'data-code="loss_spike" data-step="40"' in banner
    assert "lower learning_rate (to 0.0001)" in banner and "`learning_rate` 0.0001" in banner
    fix = shown["fix"]
    assert fix.visible is True and fix.value == 1  # type: ignore[attr-defined]
    assert fix.choices == [("1: loss_spike at step 40: learning_rate 0.0001, max_grad_norm 1.0", 1)]  # type: ignore[attr-defined]
    assert shown["clone_fix"].visible is True  # type: ignore[attr-defined]


def test_a_run_without_findings_shows_no_banner_and_no_fix(store: Store) -> None:
    spec = JobSpec(model="tiny-llama", max_steps=100)
    run_id = running_run(store, spec)
    store.add_metrics(run_id, losses(1, 60))
    assert Doctor(store, run_id, spec, interval_s=0.0).check() == []
    shown = page_values(store, run_id)
    assert shown["findings"] == "" and shown["fix"].visible is False  # type: ignore[attr-defined]
    assert shown["clone_fix"].visible is False  # type: ignore[attr-defined]
    assert not [r for r in RunPageData(store).rows(run_id, "sft")[1] if r[2].startswith("doctor")]


def test_the_loss_chart_marks_the_stretch_of_curve_the_rule_saw(store: Store) -> None:
    run_id = spiked_run(store)
    loss_rows = RunPageData(store).rows(run_id, "sft")[1]
    marked = [(x, y) for x, y, name in loss_rows if name == "doctor: loss_spike"]
    assert (40.0, 9.0) in marked and len(marked) >= 20
    assert all(5 <= x <= 45 for x, _ in marked)  # the stretch around the spike, not the whole curve
    from app.ui import charts

    assert charts.color_map(["train", "doctor: loss_spike"])["doctor: loss_spike"] == charts.MARK_COLOR


def test_the_runs_table_and_compare_carry_the_icon(store: Store) -> None:
    spiked = spiked_run(store)
    calm = running_run(store, JobSpec(model="tiny-llama", max_steps=100, run_name="calm"))
    table = ui_runs.runs_frame(store)
    doctor = dict(zip(table["id"], table["doctor"]))
    assert doctor[spiked] == "⚠️ loss_spike@40" and doctor[calm] == ""
    runs = [r for r in (store.get_run(spiked), store.get_run(calm)) if r is not None]
    summaries = [ui_compare.summarize_run(store, r) for r in runs]
    compared = ui_compare.compare_table(runs, summaries).set_index("field")
    assert list(compared.loc["doctor"]) == ["⚠️ loss_spike@40", ""]


def test_findings_are_tensorboard_text_and_mlflow_tags(store: Store, tmp_path: Path, monkeypatch) -> None:
    """The trackers the run mirrors to get each finding (`TrackerSink.note`, called by the training recipe's cleanup)."""
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from jobs.train.mirrors import open_trackers

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    found = findings_of(store.run_events(spiked_run(store)))
    spec = JobSpec(model="tiny-llama", report_to="tensorboard,mlflow")
    for sink in open_trackers(spec, 7, tmp_path):
        sink.note(found)
        sink.close("succeeded")
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    (text,) = events.Tensors("doctor/loss_spike/text_summary")
    assert text.step == 40 and "loss_spike at step 40" in text.tensor_proto.string_val[0].decode()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tunedeck")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert "Fix: lower learning_rate" in run.data.tags["tunedeck.doctor:loss_spike"]


def test_events_of_runs_reads_one_kind_of_several_runs(store: Store) -> None:
    a, b = spiked_run(store), running_run(store, JobSpec(model="tiny-llama"))
    store.add_run_event(b, "oom", "an OOM")
    got = store.events_of_runs([a, b], "finding")
    assert list(got) == [a] and got[a][0]["data"]["code"] == "loss_spike"
    assert store.events_of_runs([], "finding") == {}


def test_no_rule_runs_in_the_dashboards_views(store: Store, monkeypatch) -> None:
    """The dashboard only reads stored findings: with every rule broken, the views still show them."""
    run_id = spiked_run(store)
    import jobs.doctor.rulebook as rulebook
    import jobs.doctor.watch as watch

    def no_rules(*args, **kwargs):
        raise AssertionError("a rule ran in the dashboard")

    monkeypatch.setattr(rulebook, "examine", no_rules)
    monkeypatch.setattr(watch, "examine", no_rules)
    for code in list(rulebook.RULES):
        monkeypatch.setitem(rulebook.RULES, code, no_rules)
    assert "loss_spike" in str(page_values(store, run_id)["findings"])
    assert RunPageData(store).rows(run_id, "sft")[1]
    assert "⚠️ loss_spike@40" in set(ui_runs.runs_frame(store)["doctor"])
    run = store.get_run(run_id)
    assert run is not None and ui_compare.summarize_run(store, run).findings == "⚠️ loss_spike@40"
