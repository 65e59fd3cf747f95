"""The run page's Evaluate panel: benchmark tasks and a judge asked of a worker through the store, by the task
`tunedeck evaluate|judge --on-worker` queues; refusals name the problem (rows of a task file, a worker that
cannot reach the weights) and the fix, and nothing is queued then."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from training_helpers import tiny_spec

from app.ui import evaluate as ui_evaluate
from app.ui import export as ui_export
from jobs.checks.access import AccessPolicy
from jobs.worker.tasks import cli_args
from storage.models import TaskStatus
from storage.store import Store

BACKENDS = ("sqlite",)  # the panel only reads and queues through the store; its backends are tested elsewhere
HOST = socket.gethostname()


def finished_run(store: Store, model: Path, host: str = HOST) -> int:
    run_id = store.create_run(tiny_spec(model))
    assert store.claim_next_on_device(f"{host}:1", "0", host=host).id == run_id
    store.mark_succeeded(run_id, {})
    store.release_device("0", f"{host}:1", host=host)
    return run_id


def questions(path: Path, rows: list[object]) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_refusals_name_the_run_the_rows_and_the_worker(
    store: Store, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TUNEDECK_SHARED_DATA", raising=False)
    good = questions(tmp_path / "qa.jsonl", [{"question": "2+2?", "answer": "4"}])
    bad = questions(tmp_path / "bad.jsonl", [{"question": "2+2?", "answer": "4"}, {"question": "3+3?"}])
    assert "Pick a run" in ui_evaluate.request_tasks(store, None, None, good)[0]
    run_id = finished_run(store, tiny_model, host="gpu-b")
    queued = store.create_run(tiny_spec(tiny_model))
    text, ids = ui_evaluate.request_tasks(store, None, queued, good)
    assert f"run {queued} is queued; only a finished run has a result to evaluate" in text and ids == []
    text, ids = ui_evaluate.request_tasks(store, None, run_id, good)
    assert ids == [] and "no worker is running" in text and "start `tunedeck worker` on host gpu-b" in text
    store.worker_beat("gpu-b:3", 3, "gpu-b")
    text, ids = ui_evaluate.request_tasks(store, None, run_id, bad)
    assert ids == [] and f"eval_tasks: {bad} row 2: has no `answer`" in text and "Fix: give the expected" in text
    text, ids = ui_evaluate.request_judging(store, None, run_id, "tiny-llama")
    assert ids == [] and "no before/after samples" in text and "sample_count" in text
    assert store.run_tasks(run_id) == []  # nothing was queued by any refusal
    text, (task_id,) = ui_evaluate.request_tasks(store, None, run_id, good)
    assert f"benchmarks {good}: queued, waiting for a worker that can reach run {run_id}'s weights" in text
    (task,) = store.tasks_of([task_id])
    assert cli_args(task) == ["evaluate", str(run_id), "--tasks", good]  # what `--on-worker` asks a worker to run


def test_a_shared_dashboard_evaluates_only_files_in_its_data_folders(
    store: Store, tiny_model: Path, tmp_path: Path, data_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNEDECK_SHARED_DATA", "1")
    run_id = finished_run(store, tiny_model)
    store.worker_beat(f"{HOST}:5", 5, HOST)
    outside = questions(tmp_path / "qa.jsonl", [{"question": "2+2?", "answer": "4"}])
    text, ids = ui_evaluate.request_tasks(store, AccessPolicy.for_server(login=True), run_id, outside)
    assert ids == [] and "reads data files only from its data folders" in text and store.run_tasks(run_id) == []


def test_each_panel_follows_its_own_tasks_and_says_how_an_evaluation_ended(
    store: Store, tiny_model: Path, tmp_path: Path
) -> None:
    run_id = finished_run(store, tiny_model)
    store.worker_beat(f"{HOST}:5", 5, HOST)
    good = questions(tmp_path / "qa.jsonl", [{"question": "2+2?", "answer": "4"}])
    _, (evaluate,) = ui_evaluate.request_tasks(store, None, run_id, good)
    _, (merged,) = ui_export.request(store, AccessPolicy.open(), run_id, True, "fp32", [])
    store.claim_task(evaluate, f"{HOST}:5")
    store.task_progress(evaluate, [f"$ tunedeck evaluate {run_id} --tasks {good}", "scoring the base model"])
    store.finish_task(evaluate, TaskStatus.SUCCEEDED, result={})
    (done,) = store.tasks_of([evaluate])
    assert ui_export.progress_text([done]).splitlines()[-2:] == [
        "scoring the base model",
        f"benchmarks {good}: done; the scores are on this page and in the bundle's card",
    ]
    _, (judge,) = ui_evaluate.request_tasks(store, None, run_id, good)
    assert [t.id for t in ui_export.unfinished_exports(store, run_id)] == [merged]  # a reopened page follows
    assert [t.id for t in ui_evaluate.unfinished_evaluations(store, run_id)] == [judge]  # each its own, unfinished
