"""The worker's task service with stand-in commands (fast): progress streamed into the store, results with their
sha256, the command's own error, cancel, a worker stopping, the GPU lease respected, and who may take what."""

from __future__ import annotations

import hashlib
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from training_helpers import wait_for

from jobs.spec.job import JobSpec
from jobs.worker.services import Place
from jobs.worker.task_service import TaskService
from jobs.worker.tasks import cli_args, reach_problem, request_export, request_push
from storage.models import TaskStatus
from storage.store import Store, TaskRecord

BACKENDS = ("sqlite",)  # the store's SQL is tested on both databases in test_store_tasks.py
HOST = socket.gethostname()
SPEC = JobSpec(model="tiny-llama", max_steps=5, run_name="tasks")

# A stand-in for `tunedeck export`: two progress lines, a file recorded as an artifact (with its sha256) through
# the store the service points the child at (TUNEDECK_DATABASE_URL), then exit 0.
RECORDING = """
import hashlib, os, sys
from storage.store import Store
print("loading base", flush=True)
print("stops with", os.environ.get("TUNEDECK_STOP_WITH_PARENT"), flush=True)
store = Store()
path = os.path.join(os.environ["TUNEDECK_HOME"], "out-%s.gguf" % sys.argv[1])
open(path, "wb").write(b"GGUF" * 10)
store.add_artifact(int(sys.argv[1]), "gguf", path, 40, hashlib.sha256(b"GGUF" * 10).hexdigest())
print("wrote", path, flush=True)
"""
FAILING = "import sys; print('loading'); print('tunedeck: 1 problem(s):', file=sys.stderr); \
print('  model: cannot write GGUF. Fix: use the merged export', file=sys.stderr); sys.exit(2)"
WAITING = "import os, sys, time\nprint('started', flush=True)\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.02)"


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def trained_run(store: Store, worker_id: str = f"{HOST}:1") -> int:
    """A run the store says `worker_id` trained (so its weights are on that host)."""
    run_id = store.create_run(SPEC)
    run = store.claim_next_on_device(worker_id, "train", host=worker_id.rsplit(":", 1)[0])
    assert run is not None and run.id == run_id
    store.mark_succeeded(run_id, {})
    store.release_device("train", worker_id, host=worker_id.rsplit(":", 1)[0])
    return run_id


def service(store: Store, argv_of: Callable[[TaskRecord], list[str]], **place: object) -> TaskService:
    where = dict(store=store, worker_id=f"{HOST}:99", host=HOST, device="cpu", on_cpu=True, shared_data=False)
    where.update(place)
    return TaskService(Place(**where), poll_interval=0.05, beat_interval=0.05, grace_period=2, argv_of=argv_of)  # type: ignore[arg-type]


def test_a_task_runs_as_a_child_its_lines_and_files_come_back(store: Store) -> None:
    run_id = trained_run(store)
    (task_id,) = request_export(store, run_id, merged=False, dtype="bf16", gguf=["f16"])
    tasks = service(store, lambda t: python(RECORDING, str(t.run_id)))
    task = tasks.take()
    assert task is not None and task.id == task_id and tasks.take() is None
    assert tasks.carry_out(task) is TaskStatus.SUCCEEDED
    done = store.get_task(task_id)
    assert done.log[0].startswith(f"$ tunedeck export {run_id} --gguf f16") and "loading base" in done.log
    assert f"stops with {os.getpid()}" in done.log  # a SIGKILLed worker's child ends too (test_parent_watch)
    ((kind, path, sha),) = [(f["kind"], f["path"], f["sha256"]) for f in done.result["files"]]
    assert kind == "gguf" and Path(path).read_bytes() == b"GGUF" * 10
    assert sha == hashlib.sha256(b"GGUF" * 10).hexdigest()
    log_file = store.run_path(run_id) / "tasks" / f"{task_id}-gguf.log"
    assert "wrote" in log_file.read_text()  # the child's output went to a file, not a pipe


def test_a_failing_command_fails_the_task_with_its_own_error(store: Store) -> None:
    run_id = trained_run(store)
    (task_id,) = request_export(store, run_id, merged=True, dtype="fp32", gguf=[])
    tasks = service(store, lambda t: python(FAILING))
    assert tasks.carry_out(tasks.take()) is TaskStatus.FAILED
    error = store.get_task(task_id).error
    assert error.startswith("exit code 2") and "cannot write GGUF. Fix: use the merged export" in error


def test_cancel_stops_the_child_and_a_stopping_worker_fails_its_task(store: Store, tmp_path: Path) -> None:
    run_id = trained_run(store)
    first, second = request_export(store, run_id, merged=True, dtype="fp32", gguf=["f16"])
    tasks = service(store, lambda t: python(WAITING, str(tmp_path / "never")))
    tasks.start()
    try:
        wait_for(lambda: "started" in store.get_task(first).log)
        assert store.cancel_task(first) is TaskStatus.RUNNING
        wait_for(lambda: store.get_task(first).status is TaskStatus.CANCELLED)
        wait_for(lambda: "started" in store.get_task(second).log)  # the next one is taken
    finally:
        tasks.stop()
    task = store.get_task(second)
    assert task.status is TaskStatus.FAILED and "stopped while the task ran; request it again" in task.error


def test_a_gpu_export_waits_for_the_training_run_and_holds_the_gpu_while_it_runs(store: Store, tmp_path: Path) -> None:
    run_id = trained_run(store)
    worker = f"{HOST}:99"
    queued = store.create_run(SPEC)
    training = store.claim_next_on_device(worker, "0", host=HOST)
    assert training.id == queued
    (task_id,) = request_export(store, run_id, merged=True, dtype="fp32", gguf=[])
    flag = tmp_path / "go"
    tasks = service(store, lambda t: python(WAITING, str(flag)), device="0", on_cpu=False)
    tasks.start()
    try:
        wait_for(lambda: f"waiting for run {queued} to finish with GPU 0" in store.get_task(task_id).log)
        assert "started" not in store.get_task(task_id).log
        store.mark_succeeded(queued, {})
        store.release_device("0", worker, host=HOST, run_id=queued)
        wait_for(lambda: "started" in store.get_task(task_id).log)
        later = store.create_run(SPEC)
        assert store.claim_next_on_device(worker, "0", host=HOST) is None  # the export has the GPU
        flag.touch()
        wait_for(lambda: store.get_task(task_id).status is TaskStatus.SUCCEEDED)
        assert store.claim_next_on_device(worker, "0", host=HOST).id == later  # and gave it back
    finally:
        tasks.stop()


def test_a_worker_takes_only_the_tasks_of_runs_whose_weights_it_can_reach(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = trained_run(store, "gpu-b:7")
    (task_id,) = request_export(store, elsewhere, merged=True, dtype="fp32", gguf=[])
    assert service(store, lambda t: python("pass")).take() is None
    assert service(store, lambda t: python("pass"), shared_data=True).take().id == task_id
    # What the panel says when nobody can reach them.
    monkeypatch.delenv("TUNEDECK_SHARED_DATA", raising=False)
    run = store.get_run(elsewhere)
    assert "no worker is running" in reach_problem(store, run).problem
    store.worker_beat(f"{HOST}:5", 5, HOST)
    problem = reach_problem(store, run)
    assert "no worker on host gpu-b is running" in problem.problem and "TUNEDECK_SHARED_DATA=1" in problem.fix
    store.worker_beat("gpu-b:8", 8, "gpu-b")
    assert reach_problem(store, run) is None
    monkeypatch.setenv("TUNEDECK_SHARED_DATA", "1")
    store.worker_gone("gpu-b:8")
    assert reach_problem(store, run) is None


def test_requests_map_to_the_commands_a_user_would_type(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.export.merged import ExportError
    from jobs.export.push import PushError

    run_id = trained_run(store)
    ids = request_export(store, run_id, merged=True, dtype="bf16", gguf=["q8_0", "f16"])
    assert [cli_args(t) for t in store.tasks_of(ids)] == [
        ["export", str(run_id), "--merged", "--dtype", "bf16"],
        ["export", str(run_id), "--gguf", "f16"],
        ["export", str(run_id), "--gguf", "q8_0"],
    ]
    with pytest.raises(ExportError) as err:
        request_export(store, run_id, merged=True, dtype="int3", gguf=["q2"])
    assert [p.field for p in err.value.problems] == ["dtype", "gguf"]
    with pytest.raises(PushError):
        request_push(store, run_id, "not a repo")
    monkeypatch.setattr("jobs.export.push.push_folder", lambda store, run_id, what: Path("."))
    task = store.get_task(request_push(store, run_id, "alice/tag", what="bundle", private=True))
    assert cli_args(task) == ["push", str(run_id), "--repo", "alice/tag", "--what", "bundle", "--private"]


def test_tunedeck_worker_carries_out_tasks(monkeypatch: pytest.MonkeyPatch, data_home: Path) -> None:
    from app.cli.main import main
    from jobs.worker import loop
    from jobs.worker.task_service import task_service

    seen = {}

    class Recorder:
        def __init__(self, store, **kw):
            seen.update(kw)

        def work(self, burst=False):
            return 0

    monkeypatch.setattr(loop, "Worker", Recorder)
    assert main(["worker", "--burst"]) == 0
    assert task_service in seen["services"]


def test_a_burst_worker_drains_the_tasks_it_can_carry_out_then_exits(store: Store) -> None:
    """`tunedeck worker --burst` with no run queued still carries out the tasks it can reach, then returns;
    a task of another host's run is left queued for that host's worker."""
    from jobs.worker.loop import Worker

    here, there = trained_run(store), trained_run(store, "gpu-b:7")
    mine = request_export(store, here, merged=True, dtype="bf16", gguf=["f16"])  # two tasks, one after the other
    (theirs,) = request_export(store, there, merged=False, dtype="bf16", gguf=["f16"])
    slow = "import time; time.sleep(0.5); print('written', flush=True)"
    worker = Worker(
        store,
        poll_interval=0.05,
        sample=False,
        child_argv=lambda run_id: python("pass"),  # a stand-in trainer: no runtime baseline to measure
        services=[lambda p: TaskService(p, poll_interval=0.05, argv_of=lambda t: python(slow))],
    )
    assert worker.work(burst=True) == 0  # no training run
    assert [(t.status, t.log[-1]) for t in store.tasks_of(mine)] == [(TaskStatus.SUCCEEDED, "written")] * 2
    assert store.get_task(theirs).status is TaskStatus.QUEUED


PUSHING = """
import sys
from storage.store import Store
print("uploading", flush=True)
Store().add_run_event(int(sys.argv[1]), "push", "pushed", data={"repo": "alice/tag", "url": "https://hub/alice/tag"})
"""


def test_the_cli_asks_a_worker_and_follows_it(
    store: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from app.cli.main import main

    run_id = trained_run(store)
    assert main(["export", str(run_id), "--merged", "--on-worker"]) == 2  # no worker: nothing queued
    assert "no worker is running" in capsys.readouterr().err and store.run_tasks(run_id) == []
    store.worker_beat(f"{HOST}:99", 99, HOST)
    monkeypatch.setattr("jobs.export.merged.finished_spec", lambda store, run_id: None)
    monkeypatch.setattr("jobs.export.push.push_folder", lambda store, run_id, what: Path("."))
    code = {"push": PUSHING, "export": RECORDING}
    tasks = service(store, lambda t: python(code[cli_args(t)[0]], str(t.run_id)))
    tasks.start()
    try:
        assert main(["export", str(run_id), "--gguf", "f16", "--on-worker"]) == 0
        out = capsys.readouterr().out
        gguf = Path(os.environ["TUNEDECK_HOME"]) / f"out-{run_id}.gguf"
        assert "loading base" in out and f"GGUF f16: {gguf}  sha256 {hashlib.sha256(b'GGUF' * 10).hexdigest()}" in out
        assert main(["push", str(run_id), "--repo", "alice/tag", "--on-worker"]) == 0
        out = capsys.readouterr().out
        assert "uploading" in out and "pushed: https://hub/alice/tag" in out
    finally:
        tasks.stop()
    (push, export) = store.run_tasks(run_id)
    assert push.result == {"url": "https://hub/alice/tag", "repo": "alice/tag", "what": None}
