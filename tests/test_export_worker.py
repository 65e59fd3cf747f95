"""A merged and a GGUF export asked for the way the dashboard asks (the panel's `request`), carried out by a worker
(`Worker` with the task service, as `tunedeck worker` runs it) on the session's trained tag runs (conftest
`tag_store`): the files come back listed with their sha256, and the panel shows how each ended."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from app.ui import export as ui_export
from jobs.checks.access import AccessPolicy
from jobs.train.artifacts import sha256_of
from jobs.worker.loop import Worker
from jobs.worker.task_service import TaskService
from storage.models import TaskStatus

pytestmark = pytest.mark.integration


def test_the_worker_carries_out_a_merged_and_a_gguf_export_asked_for_through_the_store(tag_store) -> None:
    _, store, ids = tag_store
    run_id = ids["lora"]
    worker = Worker(
        store,
        poll_interval=0.1,
        sample=False,
        services=[lambda place: TaskService(place, poll_interval=0.1, beat_interval=0.2)],
    )
    thread = threading.Thread(target=worker.work, name="test-worker", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not store.live_workers() and time.monotonic() < deadline:  # the panel asks only a live worker
            time.sleep(0.05)
        text, task_ids = ui_export.request(store, AccessPolicy.open(), run_id, True, "fp32", ["f16"])
        assert len(task_ids) == 2, text
        deadline = time.monotonic() + 600
        while ui_export.unfinished(store.tasks_of(task_ids)) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        worker.stop()
        thread.join(60)
    merged, gguf = store.tasks_of(task_ids)
    assert merged.status is TaskStatus.SUCCEEDED, (merged.error, merged.log[-10:])
    assert gguf.status is TaskStatus.SUCCEEDED, (gguf.error, gguf.log[-10:])
    assert merged.worker_id == worker.worker_id == gguf.worker_id
    # The command's own progress came back line by line, and its files with their sha256.
    assert any("greedy answers equal: passed" in line for line in merged.log), merged.log
    assert any(line.startswith("check (") and "): passed" in line for line in gguf.log), gguf.log
    for task, kinds in ((merged, {"export", "merged"}), (gguf, {"gguf"})):
        files = task.result["files"]
        assert {f["kind"] for f in files} >= kinds
        for f in files:
            if Path(f["path"]).is_file():
                assert sha256_of(Path(f["path"])) == f["sha256"]
    (gguf_file,) = [f for f in gguf.result["files"] if f["kind"] == "gguf"]
    assert gguf_file["path"].endswith("-f16.gguf")
    text = ui_export.progress_text([merged, gguf])
    assert "merged fp32: done, checked" in text and f"sha256 {gguf_file['sha256']}" in text
    listed = ui_export.export_files(store, run_id)
    assert {Path(p).suffix for p in listed} == {".gguf", ".zip"} and gguf_file["path"] in listed
