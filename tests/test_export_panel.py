"""The run page's export panel: it asks a worker through the store (never loads a model), says when no worker can
reach the run's weights, and shows the tasks' progress, endings and files. The real export, asked in the panel and carried out by a separate worker process, is test_split_browser."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from training_helpers import tiny_spec

from app.ui import export as ui_export
from jobs.checks.access import AccessPolicy
from storage.models import TaskStatus
from storage.store import Store

BACKENDS = ("sqlite",)  # the panel only reads the store; the store's backends are tested elsewhere
HOST = socket.gethostname()


def finished_run(store: Store, tiny_model: Path, host: str = HOST) -> int:
    run_id = store.create_run(tiny_spec(tiny_model))
    assert store.claim_next_on_device(f"{host}:1", "0", host=host).id == run_id
    store.mark_succeeded(run_id, {})
    store.release_device("0", f"{host}:1", host=host)
    return run_id


def test_refusals_say_why_and_what_to_do(store, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.checks.access import REMOTE_CODE_ENV, loading_problem

    queued = store.create_run(tiny_spec(tiny_model))
    assert "Pick a run" in ui_export.refusal(store, None, True, [], None)
    assert "run 999 does not exist. Fix: list finished runs" in ui_export.refusal(store, 999, True, [], None)
    assert f"run {queued} is queued; only a finished run has a result to export" in ui_export.refusal(
        store, queued, True, [], None
    )
    said, ids = ui_export.request_push_of(store, queued, "alice/tag", "bundle", True)
    assert f"run {queued} is queued; only a finished run has a result to push. Fix: wait" in said and ids == []
    text, ids = ui_export.request(store, None, queued, True, "bf16", [])
    assert "only a finished run" in text and ids == []
    monkeypatch.delenv(REMOTE_CODE_ENV, raising=False)
    shared = AccessPolicy.for_server(login=True)
    problem = loading_problem(tiny_spec(tiny_model, trust_remote_code=True), 7, shared, "export it")
    assert (
        problem is not None
        and "trust_remote_code" in problem.problem
        and "export it from the command line" in problem.fix
    )
    assert loading_problem(tiny_spec(tiny_model), 7, shared, "export it") is None


def test_without_a_worker_that_reaches_the_weights_nothing_is_queued(
    store, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TUNEDECK_SHARED_DATA", raising=False)
    run_id = finished_run(store, tiny_model, host="gpu-b")
    assert "Nothing chosen" in ui_export.refusal(store, run_id, False, [], AccessPolicy.open())
    text, ids = ui_export.request(store, AccessPolicy.open(), run_id, True, "fp32", ["f16"])
    assert ids == [] and "no worker is running" in text and "start `tunedeck worker` on host gpu-b" in text
    store.worker_beat(f"{HOST}:5", 5, HOST)  # a worker, but on another host than the weights
    text, ids = ui_export.request(store, AccessPolicy.open(), run_id, True, "fp32", ["f16"])
    assert ids == [] and "no worker on host gpu-b is running" in text and "TUNEDECK_SHARED_DATA=1" in text
    assert store.run_tasks(run_id) == []
    store.worker_beat("gpu-b:3", 3, "gpu-b")
    text, ids = ui_export.request(store, AccessPolicy.open(), run_id, True, "fp32", ["f16"])
    assert len(ids) == 2 and "merged fp32: queued" in text and "GGUF f16: queued" in text


def test_the_log_shows_progress_then_how_each_task_ended(store, tiny_model: Path) -> None:
    run_id = finished_run(store, tiny_model)
    store.worker_beat(f"{HOST}:5", 5, HOST)
    _, (merged, gguf) = ui_export.request(store, AccessPolicy.open(), run_id, True, "fp32", ["q8_0"])
    store.claim_task(merged, f"{HOST}:5")
    store.task_progress(merged, ["$ tunedeck export 1 --merged --dtype fp32", "export run 1: merging"])
    tasks = store.tasks_of([merged, gguf])
    assert ui_export.unfinished(tasks)
    text = ui_export.progress_text(tasks)
    assert text.splitlines()[-2:] == [
        "export run 1: merging",
        f"GGUF q8_0: queued, waiting for a worker that can reach run {run_id}'s weights",
    ]
    files = [{"kind": "export", "path": "/d/run-merged-fp32.zip", "size": 9, "sha256": "ab" * 32}]
    store.finish_task(merged, TaskStatus.SUCCEEDED, result={"files": files})
    store.claim_task(gguf, f"{HOST}:5")
    store.finish_task(gguf, TaskStatus.FAILED, error="exit code 2: tunedeck: 1 problem(s): model: no. Fix: yes")
    tasks = store.tasks_of([merged, gguf])
    text = ui_export.progress_text(tasks)
    assert not ui_export.unfinished(tasks)
    assert "merged fp32: done, checked" in text and f"/d/run-merged-fp32.zip  sha256 {'ab' * 32}" in text
    assert "GGUF q8_0: failed: exit code 2: tunedeck: 1 problem(s): model: no. Fix: yes" in text


def test_a_push_is_checked_queued_beside_a_running_export_and_ends_with_the_address(
    store, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gradio as gr

    monkeypatch.delenv("TUNEDECK_SHARED_DATA", raising=False)
    run_id = finished_run(store, tiny_model)
    with gr.Blocks() as demo:
        page_run = gr.Number()
        panel = ui_export.build()
        ui_export.wire(panel, store, page_run)
    handlers = {fn.name: fn.fn for fn in demo.fns.values()}
    started, pushed = handlers["started"], handlers["pushed"]
    text, *kept = pushed([], run_id, "alice/tag", "bundle", True)
    assert "no worker is running" in text and kept == [gr.skip(), gr.skip()]  # nothing queued, nothing followed
    store.worker_beat(f"{HOST}:5", 5, HOST)
    text, *_ = pushed([], run_id, "alice/tag", "bundle", True)
    assert text == f"run: run {run_id} has no saved bundle folder. Fix: train it again; its bundle was not written"
    bundle = store.run_dir(run_id) / "bundle"
    bundle.mkdir(parents=True)
    (bundle / "adapter_config.json").write_text("{}")
    store.add_artifact(run_id, "adapter", str(bundle), 2, "0" * 64)
    text, *_ = pushed([], run_id, "not a repo", "bundle", True)
    assert text.startswith("repo: `not a repo` is not a hub repository id. Fix: write OWNER/NAME")
    assert store.run_tasks(run_id) == []

    _, export_ids, _ = started([], run_id, True, "fp32", [])
    text, ids, timer = pushed(export_ids, run_id, " alice/tag ", "bundle", True)
    (push_id,) = set(ids) - set(export_ids)
    assert ids == [*export_ids, push_id] and timer.active  # the export still followed, the push beside it
    assert "push bundle to alice/tag: queued" in text
    (push,) = store.tasks_of([push_id])
    assert push.args == {"repo": "alice/tag", "what": "bundle", "private": True}
    store.claim_task(push_id, f"{HOST}:5")
    store.finish_task(push_id, TaskStatus.SUCCEEDED, result={"url": "https://hub/alice/tag", "repo": "alice/tag"})
    assert "push bundle to alice/tag: done: https://hub/alice/tag" in ui_export.progress_text(store.tasks_of(ids))
