"""Memory by phase: the row builder, the probe's one-shot hook, `phases.json` and the tables that show it.

The unit tests are fast; one integration test trains the tiny model for two steps through the
training child and reads back what it recorded.
"""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Any

import pytest
import torch
from training_helpers import tiny_spec

from jobs.train.phases import PHASES, PhaseRow, load_phases, phase_notes, phase_rows, record, table_lines

MIB = 1024**2


def prediction(kind: str = "cpu", **phases: int) -> dict[str, Any]:
    """A saved prediction as `jobs.memory.predict.Prediction.to_dict` writes it, with phase figures."""
    data: dict[str, Any] = {"total_bytes": 900 * MIB, "device": {"kind": kind}, "cuda_context_bytes": 0}
    if kind == "cuda":
        data["cuda_context_bytes"] = 600 * MIB
    if phases:
        data["phases"] = phases
    return data


def measured(source: str = "rss", **peaks: int) -> dict[str, Any]:
    return {
        "source": source,
        "device": "cuda" if source == "torch" else "cpu",
        "phases": {name: {"bytes": peak - MIB, "peak_bytes": peak} for name, peak in peaks.items()},
    }


# ---------------------------------------------------------------------- the row builder
def test_rows_compare_each_phase_with_its_peak() -> None:
    rows = phase_rows(
        prediction(load=110 * MIB, forward=200 * MIB, backward=300 * MIB, optimizer=250 * MIB),
        measured(load=100 * MIB, forward=250 * MIB, backward=300 * MIB, optimizer=200 * MIB),
    )
    assert [r.phase for r in rows] == list(PHASES)
    assert [r.measured for r in rows] == [100 * MIB, 250 * MIB, 300 * MIB, 200 * MIB]  # the peaks, not the levels
    assert [round(r.error, 3) for r in rows] == [0.1, -0.2, 0.0, 0.25]  # + over-predicted, - under
    assert rows[0].cells() == ("load", "110.0 MiB", "100.0 MiB", "+10%")
    assert rows[1].summary() == "-20% (200.0 MiB predicted, 250.0 MiB measured)"


def test_rows_on_cuda_leave_the_context_out_of_the_prediction() -> None:
    rows = phase_rows(
        prediction("cuda", load=1600 * MIB, forward=2600 * MIB, backward=3600 * MIB, optimizer=2000 * MIB),
        measured("torch", load=1000 * MIB, forward=2000 * MIB, backward=2500 * MIB, optimizer=1400 * MIB),
    )
    assert [r.predicted for r in rows] == [1000 * MIB, 2000 * MIB, 3000 * MIB, 1400 * MIB]
    assert [round(r.error, 2) for r in rows] == [0.0, 0.0, 0.2, 0.0]


def test_rows_keep_missing_phases_missing() -> None:
    old_prediction = prediction()  # saved before phases were predicted
    partial = measured(load=100 * MIB, forward=120 * MIB)  # the run stopped inside its first step
    rows = phase_rows(old_prediction, partial)
    assert [(r.predicted, r.measured) for r in rows] == [
        (None, 100 * MIB),
        (None, 120 * MIB),
        (None, None),
        (None, None),
    ]
    assert all(r.error is None for r in rows) and rows[0].cells()[1:] == ("-", "100.0 MiB", "-")
    assert rows[2].summary() == "" and rows[0].summary() == "100.0 MiB measured (no phase prediction)"
    assert phase_rows(old_prediction, None) == [] and phase_rows(None, None) == []
    # predicted only (a queued run): the CUDA context comes out by the device predicted for
    (load, *_) = phase_rows(prediction("cuda", load=1600 * MIB), None)
    assert (load.predicted, load.measured, load.error) == (1000 * MIB, None, None)
    notes = phase_notes(old_prediction, partial, finished=True)
    assert any("no phase figures" in n for n in notes)
    assert any(n.startswith("not reached: backward, optimizer") for n in notes)
    assert phase_notes(None, None, finished=False) == []
    assert phase_notes(None, None, finished=True)[0].startswith("not recorded")


def test_table_lines_align_under_the_header() -> None:
    lines = table_lines([PhaseRow("load", 110 * MIB, 100 * MIB), PhaseRow("forward", None, 2 * 1024**3)])
    assert lines[0].split() == ["phase", "predicted", "measured", "(peak)", "error"]
    assert lines[1].split() == ["load", "110.0", "MiB", "100.0", "MiB", "+10%"]
    assert lines[2].split() == ["forward", "-", "2.0", "GiB", "-"]
    assert {line.index(cell) for line, cell in zip(lines, ("measured", "100.0", "2.0"))} == {lines[0].index("measured")}


# ---------------------------------------------------------------------- the probe (no training)
def test_probe_measures_the_first_step_only_and_removes_its_hook() -> None:
    from transformers import TrainerControl, TrainerState

    from jobs.train.phase_probe import PhaseProbe

    saved: list[dict[str, Any]] = []
    probe = PhaseProbe(cuda=False, on_record=saved.append)
    model = torch.nn.Linear(8, 8)
    state, control = TrainerState(), TrainerControl()
    probe.meter.reset()  # the load window starts here (in a child: at its start), not at earlier tests' peaks
    loading = mmap.mmap(-1, 64 * MIB)  # a peak while "loading" in fresh pages, given back before training starts
    loading.write(b"\x01" * (64 * MIB))
    loading.close()
    probe.on_train_begin(None, state, control, model=model)  # type: ignore[arg-type]
    probe.on_step_begin(None, state, control, model=model)  # type: ignore[arg-type]
    assert len(model._forward_hooks) == 1
    model(torch.ones(2, 8)).sum().backward()
    assert not model._forward_hooks  # one-shot: gone once it fired
    probe.on_pre_optimizer_step(None, state, control)  # type: ignore[arg-type]
    probe.on_optimizer_step(None, state, control)  # type: ignore[arg-type]
    assert [list(s["phases"]) for s in saved] == [list(PHASES[:i]) for i in range(1, 5)]  # saved after each phase
    assert saved[-1]["source"] == "rss" and saved[-1]["device"] == "cpu"
    for _step in range(2, 5):  # later steps: no hook, no reading, no write
        probe.on_step_begin(None, state, control, model=model)  # type: ignore[arg-type]
        probe.on_pre_optimizer_step(None, state, control)  # type: ignore[arg-type]
        probe.on_optimizer_step(None, state, control)  # type: ignore[arg-type]
    assert not model._forward_hooks and len(saved) == 4
    load = saved[-1]["phases"]["load"]
    assert load["peak_bytes"] - load["bytes"] >= 32 * MIB  # the loading peak is in the load phase...
    peak = probe.meter.run_peaks()["rss"]  # ...and stays in the run's peak though the windows reset it
    assert all(0 < p["bytes"] <= p["peak_bytes"] <= peak for p in saved[-1]["phases"].values())


def test_probe_says_when_the_peak_cannot_be_reset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from transformers import TrainerControl, TrainerState

    from jobs.train import phase_probe

    monkeypatch.setattr(phase_probe, "CLEAR_REFS", tmp_path / "missing" / "clear_refs")  # the write fails
    probe = phase_probe.PhaseProbe(cuda=False)
    probe.on_train_begin(None, TrainerState(), TrainerControl())  # type: ignore[arg-type]
    probe.on_pre_optimizer_step(None, TrainerState(), TrainerControl())  # type: ignore[arg-type]
    data = probe.record()
    assert "could not reset the peak RSS" in data["note"]
    assert data["phases"]["backward"]["peak_bytes"] == data["phases"]["backward"]["bytes"]  # the fallback: RSS


# ---------------------------------------------------------------------- phases.json and `tunedeck show`
def test_show_prints_the_phase_table_or_says_why_there_is_none(store: Any) -> None:
    from app.cli.show import show_text
    from jobs.spec.job import JobSpec

    run_id = store.create_run(JobSpec(run_name="phased"))
    assert load_phases(store, run_id) is None
    store.claim_next_on_device("w", "0")
    store.mark_succeeded(run_id, {})
    assert "memory by phase: not recorded" in show_text(store, store.get_run(run_id))
    record(store, run_id, measured(load=100 * MIB, forward=150 * MIB, backward=200 * MIB, optimizer=180 * MIB))
    assert load_phases(store, run_id)["phases"]["load"]["peak_bytes"] == 100 * MIB
    text = show_text(store, store.get_run(run_id))
    assert "memory by phase:" in text and "not recorded" not in text
    header = next(line for line in text.splitlines() if "measured (peak)" in line)
    assert header.split() == ["phase", "predicted", "measured", "(peak)", "error"]
    assert any(line.split()[:4] == ["backward", "-", "200.0", "MiB"] for line in text.splitlines())
    assert "no prediction was saved" in text


# ---------------------------------------------------------------------- a real tiny run (CPU)
@pytest.mark.integration
def test_a_tiny_run_records_all_four_phases(tiny_model: Path, store: Any) -> None:
    import psutil

    from app.cli.show import show_text
    from jobs.train.child import run
    from storage.models import RunStatus

    run_id = store.create_run(tiny_spec(tiny_model, max_steps=2, gradient_accumulation_steps=2, sample_count=0))
    store.claim_next_on_device("test", "0")
    assert run(run_id, store) == 0
    finished = store.get_run(run_id)
    assert finished.status is RunStatus.SUCCEEDED, finished.error_summary
    data = load_phases(store, run_id)
    assert data is not None and (data["source"], data["device"]) == ("rss", "cpu")
    assert list(data["phases"]) == list(PHASES)
    ram = psutil.virtual_memory().total
    for name, reading in data["phases"].items():
        # a Python process with torch loaded holds tens of MiB; no phase holds more than the machine
        assert 20 * MIB < reading["bytes"] <= reading["peak_bytes"] < ram, (name, reading)
        # the probe's resets must not hide a phase's peak from the run's (whole-run) peak
        assert reading["peak_bytes"] <= finished.peak_memory_bytes, (name, reading, finished.peak_memory_bytes)
    text = show_text(store, finished)
    assert "memory by phase:" in text
    table = [line.split() for line in text.splitlines() if line.split()[:1] and line.split()[0] in PHASES]
    assert [row[0] for row in table] == list(PHASES)


def _finished_run_with_phases(store: Any, *, predicted: bool) -> int:
    """A succeeded run with a phases.json and (when `predicted`) a saved prediction with phase figures."""
    import json

    from jobs.queue.saved_prediction import PREDICTION_FILE
    from jobs.spec.job import JobSpec

    run_id = store.create_run(JobSpec(run_name="phased"))
    store.claim_next_on_device("w", "0")
    store.mark_succeeded(run_id, {})
    if predicted:
        saved = prediction(load=110 * MIB, forward=200 * MIB, backward=300 * MIB, optimizer=250 * MIB)
        (store.run_dir(run_id) / PREDICTION_FILE).write_text(json.dumps(saved))
    record(store, run_id, measured(load=100 * MIB, forward=250 * MIB, backward=300 * MIB, optimizer=200 * MIB))
    return run_id


def test_run_page_shows_the_phase_table(store: Any) -> None:
    from app.ui.run import OUTPUTS, RunPageData
    from jobs.spec.job import JobSpec

    run_id = _finished_run_with_phases(store, predicted=True)
    page = RunPageData(store).refresh(run_id, None)
    assert len(page) == OUTPUTS
    section = next(v for v in page if isinstance(v, str) and v.startswith("### Memory by phase"))
    assert "| phase | predicted | measured (peak) | error |" in section
    assert (
        "| load | 110.0 MiB | 100.0 MiB | +10% |" in section and "| forward | 200.0 MiB | 250.0 MiB | -20% |" in section
    )
    assert "peak RSS" in section  # says what was measured
    unrecorded = store.create_run(JobSpec(run_name="failed early"))
    store.claim_next_on_device("w", "0")
    store.mark_failed(unrecorded, "boom", "", exit_code=1)
    page = RunPageData(store).refresh(unrecorded, None)
    assert any(isinstance(v, str) and "Memory by phase" in v and "not recorded" in v for v in page)


def test_compare_lists_each_runs_memory_error_per_phase(store: Any) -> None:
    from app.ui import compare as ui_compare

    with_prediction = _finished_run_with_phases(store, predicted=True)
    measured_only = _finished_run_with_phases(store, predicted=False)
    runs = [store.get_run(i) for i in (with_prediction, measured_only)]
    table = ui_compare.compare_table(runs, [ui_compare.summarize_run(store, r) for r in runs])
    rows = {row[0]: list(row[1:]) for row in table.itertuples(index=False)}
    assert rows["load memory (error)"] == [
        "+10% (110.0 MiB predicted, 100.0 MiB measured)",
        "100.0 MiB measured (no phase prediction)",
    ]
    assert rows["optimizer memory (error)"][0] == "+25% (250.0 MiB predicted, 200.0 MiB measured)"


@pytest.mark.gpu
@pytest.mark.integration
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_run_records_torchs_figures_per_phase(tiny_model: Path, store: Any) -> None:
    from jobs.train.child import run

    run_id = store.create_run(tiny_spec(tiny_model, max_steps=2, sample_count=0))
    store.claim_next_on_device("test", "0")
    assert run(run_id, store) == 0
    finished = store.get_run(run_id)
    data = load_phases(store, run_id)
    assert data is not None and (data["source"], data["device"]) == ("torch", "cuda")
    assert list(data["phases"]) == list(PHASES)
    for name, r in data["phases"].items():
        # allocated never exceeds reserved, nor a level its window's peak
        assert 0 < r["allocated_bytes"] <= r["bytes"] <= r["peak_bytes"], (name, r)
        assert r["allocated_bytes"] <= r["peak_allocated_bytes"] <= r["peak_bytes"], (name, r)
        assert r["peak_bytes"] <= finished.final_metrics["peak_torch_reserved_bytes"], (name, r)
