"""Faults injected for real (issue 5): one device / one run, cancel, killed child, killed worker,
resume, killed dashboard, non-finite loss, full disk, CUDA OOM.

Training runs use the tiny offline Llama (few steps, short rows); processes are real
(`python -m jobs.train.child`, `python -m app.cli.main worker|serve`) and are killed with real signals.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
import training_helpers
from training_helpers import LONG, wait_for
from transformers import TrainerCallback

from jobs.spec.job import JobSpec
from jobs.train.callbacks import STOP_REQUESTED
from jobs.worker.loop import Worker
from jobs.worker.processes import group_members, pid_alive
from storage.checkpoints import COMPLETE_MARKER, checkpoint_dirs, is_complete, last_complete
from storage.models import RunStatus
from storage.store import MetricPoint, Store

pytestmark = pytest.mark.slow  # real fault injections around real training: the slow tier
BACKENDS = ("sqlite", "postgresql")  # each `store` test runs on both databases (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _clear_stop_flag():
    STOP_REQUESTED.clear()
    yield
    STOP_REQUESTED.clear()


def tiny_spec(model: Path, **changes: Any) -> JobSpec:
    return training_helpers.tiny_spec(model, **{"max_steps": 8, "max_length": 64, **changes})


def run_processes(run_id: int, home: Path) -> list[psutil.Process]:
    """Live `jobs.train.child` processes of this run (whatever their group); `home` tells them from other tests'."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = p.info["cmdline"] or []
            if (
                p.info["status"] != psutil.STATUS_ZOMBIE
                and "jobs.train.child" in cmd
                and cmd[-1] == str(run_id)
                and p.environ().get("TUNEDECK_HOME") == str(home)
            ):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return out


def loss_steps(store: Store, run_id: int) -> list[int]:
    return [p.step for p in store.metrics(run_id, ["loss"])]


def child_env(data_home: Path, store: Store) -> dict[str, str]:
    return dict(os.environ, TUNEDECK_HOME=str(data_home), TUNEDECK_DATABASE_URL=store.url, PYTHONUNBUFFERED="1")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


class AtStep(TrainerCallback):
    """Calls `action(model, state, control)` once, at the end of optimizer step `step`."""

    def __init__(self, step: int, action):
        self.step, self.action, self.done = step, action, False

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.step and not self.done:
            self.done = True
            self.action(model, state, control)


# ---------------------------------------------------------------------- 1. one device, one run
FAKE_WORKER = """
import sys
import jobs.worker.processes as w
w.default_child_argv = lambda run_id: [sys.executable, "-c", '''
import sys, time
from storage.store import Store
time.sleep(%(secs)s)
Store().mark_succeeded(int(sys.argv[1]), {"train_loss": 1.0})
''', str(run_id)]
from app.cli.main import main
sys.exit(main(["worker"]))
"""


def test_two_workers_two_launches_give_one_running_one_queued(data_home: Path, store: Store, tmp_path: Path) -> None:
    launcher = tmp_path / "worker.py"
    launcher.write_text(FAKE_WORKER % {"secs": 2.5})
    env = dict(os.environ, TUNEDECK_HOME=str(data_home))
    workers = [
        subprocess.Popen(
            [sys.executable, str(launcher)], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for _ in range(2)
    ]
    try:
        wait_for(lambda: len(store.live_workers()) == 2, timeout=60, what="two workers up")
        ids: list[int] = []
        barrier = threading.Barrier(2)

        def launch() -> None:
            barrier.wait()
            ids.append(Store().create_run(JobSpec(model="tiny-llama", max_steps=5)))

        threads = [threading.Thread(target=launch) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        first, second = sorted(ids, key=lambda i: store.get_run(i).created_at)
        wait_for(lambda: store.get_run(first).status is RunStatus.RUNNING, timeout=30, what="first running")
        # While the first trains, the second waits, although a worker is idle.
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            statuses = [store.get_run(i).status for i in ids]
            assert statuses.count(RunStatus.RUNNING) <= 1, statuses
            time.sleep(0.05)
        assert store.get_run(second).status is RunStatus.QUEUED
        wait_for(
            lambda: all(store.get_run(i).status is RunStatus.SUCCEEDED for i in ids), timeout=60, what="both runs done"
        )
        a, b = store.get_run(first), store.get_run(second)
        assert b.started_at >= a.finished_at  # FIFO and never overlapping
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                stop(w)


def test_device_claim_is_exclusive_under_concurrent_claims(store: Store) -> None:
    for _ in range(4):
        store.create_run(JobSpec(model="tiny-llama", max_steps=5))
    got: list[Any] = []
    barrier = threading.Barrier(4)

    def claim(n: int) -> None:
        s = Store(store.url)
        barrier.wait()
        got.append(s.claim_next_on_device(f"w{n}", "0"))
        s.dispose()

    threads = [threading.Thread(target=claim, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    claimed = [r for r in got if r is not None]
    assert len(claimed) == 1 and claimed[0].id == 1  # FIFO: the oldest
    assert store.claim_next_on_device("other", "1") is not None  # another device is free
    store.mark_succeeded(1, {})
    holder = claimed[0].worker_id
    assert store.claim_next_on_device("w-late", "0") is None  # finished, but its worker has not let go yet
    assert not store.release_device("0", "w-late")  # only the holder releases
    assert store.release_device("0", holder)  # what the worker does once the run's processes are gone
    assert store.claim_next_on_device("w-late", "0").id == 3


def test_queued_runs_reorder_and_cancel(store: Store, data_home: Path, capsys: pytest.CaptureFixture) -> None:
    from app.cli.main import main

    ids = [store.create_run(JobSpec(model="tiny-llama", max_steps=5)) for _ in range(4)]
    assert store.move_queued(ids[3], 0)
    assert [r.id for r in store.queued()] == [ids[3], ids[0], ids[1], ids[2]]
    assert store.move_queued(ids[3], 2)
    assert [r.id for r in store.queued()] == [ids[0], ids[1], ids[3], ids[2]]
    assert main(["move", str(ids[2]), "--first"]) == 0
    assert "position 1 of 4" in capsys.readouterr().out
    assert main(["move", str(ids[0]), "--to", "4"]) == 0
    assert [r.id for r in store.queued()] == [ids[2], ids[1], ids[3], ids[0]]
    later = store.create_run(JobSpec(model="tiny-llama", max_steps=5))
    assert [r.id for r in store.queued()][-1] == later  # a new launch still queues behind
    assert main(["cancel", str(ids[1])]) == 0
    assert store.get_run(ids[1]).status is RunStatus.CANCELLED
    assert [r.id for r in store.queued()] == [ids[2], ids[3], ids[0], later]
    assert store.claim_next_on_device("w", "0").id == ids[2]
    assert not store.move_queued(ids[2], 0)  # running: not in the queue any more
    assert main(["move", str(ids[2]), "--first"]) == 2


# ---------------------------------------------------------------------- 2. cancel
@pytest.mark.integration
def test_cancel_saves_a_checkpoint_and_leaves_no_process(store: Store, tiny_model: Path, data_home: Path) -> None:
    run_id = store.create_run(tiny_spec(tiny_model, max_steps=LONG, max_length=48))
    worker = Worker(store, poll_interval=0.2, heartbeat_interval=0.5, grace_period=30.0)
    thread = threading.Thread(target=worker.work, kwargs={"burst": True})
    thread.start()
    try:
        run = wait_for(lambda: (r := store.get_run(run_id)).current_step >= 3 and r, timeout=180)
        pgid = run.child_pid
        store.request_cancel(run_id)
    finally:
        thread.join(timeout=120)
    assert not thread.is_alive()
    run = store.get_run(run_id)
    assert run.status is RunStatus.CANCELLED and run.exit_code == 0, (run.error_summary, run.error_detail)
    assert group_members(pgid) == [] and run_processes(run_id, data_home) == []
    last = last_complete(store.run_dir(run_id) / "output")
    assert last is not None and last[0] >= 3 and last[0] == run.current_step  # saved at the step it stopped
    assert "stopping after step" in Path(run.log_path).read_text()


@pytest.mark.gpu
@pytest.mark.integration
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (NVML shows the freed memory)")
def test_cancel_frees_gpu_memory(store: Store, tiny_model: Path) -> None:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)

    def ours() -> set[int]:
        return {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}

    run_id = store.create_run(tiny_spec(tiny_model, max_steps=100000, max_train_samples=None))
    worker = Worker(store, poll_interval=0.2, heartbeat_interval=0.5, grace_period=30.0)
    thread = threading.Thread(target=worker.work, kwargs={"burst": True})
    thread.start()
    run = wait_for(lambda: (r := store.get_run(run_id)).current_step >= 3 and r, timeout=180)
    assert run.child_pid in ours()
    store.request_cancel(run_id)
    thread.join(timeout=120)
    assert store.get_run(run_id).status is RunStatus.CANCELLED
    wait_for(lambda: run.child_pid not in ours(), timeout=30, what="NVML no longer lists the child")


# ---------------------------------------------------------------------- 4. worker killed (then 5. resume)
@pytest.mark.integration
def test_sigkilled_worker_run_is_interrupted_orphan_ended_then_resumed(
    data_home: Path, store: Store, tiny_model: Path
) -> None:
    from app.cli.main import main

    spec = tiny_spec(tiny_model, max_steps=LONG, max_length=48)
    run_id = store.create_run(spec)
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli.main", "worker"],
        env=child_env(data_home, store),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        run = wait_for(lambda: (r := store.get_run(run_id)).current_step >= 3 and r, timeout=180)
        proc.kill()  # SIGKILL to the worker alone: its child (own session) trains on, orphaned
        proc.wait(10)
    finally:
        stop(proc)
    assert pid_alive(run.child_pid)
    assert store.get_run(run_id).status is RunStatus.RUNNING  # nobody said otherwise yet
    # The next worker start: the run is interrupted, the orphan ended (warm: it saves a checkpoint).
    marked = Worker(store, grace_period=30.0, sample=False).cleanup_stale()
    assert marked == [run_id]
    run = store.get_run(run_id)
    assert run.status is RunStatus.INTERRUPTED and "no longer running" in run.error_summary
    assert group_members(run.child_pid) == [] and run_processes(run_id, data_home) == []
    last = last_complete(store.run_dir(run_id) / "output")
    assert last is not None, "the orphan saved no checkpoint on SIGTERM"
    # 5. Resume through the CLI, same run id; it continues from that checkpoint.
    assert main(["resume", str(run_id)]) == 0
    assert store.get_run(run_id).status is RunStatus.QUEUED
    assert main(["resume", str(run_id)]) == 2  # queued: nothing to resume
    # End soon after the resume (a test shortcut: users resume the spec they launched).
    store._set(run_id, spec_json=spec.replace(max_steps=last[0] + 3).to_json())
    Worker(store, poll_interval=0.2, sample=False).work(burst=True)
    run = store.get_run(run_id)
    assert run.status is RunStatus.SUCCEEDED, (run.error_summary, run.error_detail)
    assert run.current_step == last[0] + 3
    assert f"resuming from {last[1]} (step {last[0]})" in Path(run.log_path).read_text()
    steps = loss_steps(store, run_id)
    assert steps == list(range(1, last[0] + 4))  # each step once: nothing duplicated, nothing lost


# ---------------------------------------------------------------------- 5. resume in detail
@pytest.mark.integration
@pytest.mark.sqlite_only  # the training child's behaviour; its SQL is tested on both databases
def test_resume_continues_with_optimizer_scheduler_and_rng_state(store: Store, tiny_model: Path) -> None:
    """A run cancelled at step 3 and resumed gives the same losses as one that was never stopped;
    a half-written newer checkpoint is skipped."""
    from jobs.queue.run_actions import resume
    from jobs.train.child import run
    from jobs.train.training import train_spec

    spec = tiny_spec(tiny_model, max_steps=8, lr_scheduler_type="linear", warmup_steps=2)
    run_id = store.create_run(spec)
    store.claim_next_on_device("test", "0")
    # What the SIGTERM handler does, during step 3: training stops (and saves) after step 4.
    assert run(run_id, store, callbacks=[AtStep(3, lambda *a: STOP_REQUESTED.set())]) == 0
    STOP_REQUESTED.clear()
    record = store.get_run(run_id)
    assert record.status is RunStatus.CANCELLED and record.current_step == 4
    out = store.run_dir(run_id) / "output"
    assert [s for s, _ in checkpoint_dirs(out)] == [4] and is_complete(out / "checkpoint-4")
    # What a process killed mid-save leaves behind: a newer folder without the completeness marker.
    shutil.copytree(out / "checkpoint-4", out / "checkpoint-6")
    (out / "checkpoint-6" / COMPLETE_MARKER).unlink()
    (out / "checkpoint-6" / "optimizer.pt").write_bytes(b"truncated")
    store.add_metrics(run_id, [MetricPoint(5, "loss", 9.9, time.time())])  # logged after the checkpoint
    assert resume(store, run_id).from_step == 4
    store.claim_next_on_device("test", "0")
    assert run(run_id, store) == 0
    record = store.get_run(run_id)
    assert record.status is RunStatus.SUCCEEDED and record.current_step == 8
    assert not (out / "checkpoint-6").exists()
    resumed = store.metrics(run_id, ["loss"])
    assert [p.step for p in resumed] == list(range(1, 9))
    reference = train_spec(spec, store.run_dir(run_id) / "reference")
    ref = [e["loss"] for e in reference.log_history if "loss" in e]
    assert [p.value for p in resumed] == pytest.approx(ref, rel=1e-4, abs=1e-5)
    lrs = [p.value for p in store.metrics(run_id, ["learning_rate"])]
    ref_lrs = [e["learning_rate"] for e in reference.log_history if "learning_rate" in e]
    assert lrs == pytest.approx(ref_lrs)  # the scheduler continued, it did not restart
    # The resumed run reports over the whole run, like the run that was never stopped.
    assert record.final_metrics["train_loss"] == pytest.approx(reference.metrics["train_loss"], rel=1e-4)
    assert record.final_metrics["step_time"] > 0  # jobs.train.figures: over the stored rows of the whole run


# ---------------------------------------------------------------------- 6. dashboard killed
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.integration
def test_killed_dashboard_training_goes_on_and_a_new_dashboard_shows_it(
    data_home: Path, store: Store, tiny_model: Path
) -> None:
    from app.ui.run import RunPageData
    from app.ui.runs import runs_frame

    # Far more steps than any machine trains before the kill lands: the kill is always mid-run, and the
    # run is ended by a cancel afterwards instead of by its own end (no dependence on training speed).
    run_id = store.create_run(tiny_spec(tiny_model, max_steps=100000, max_train_samples=None, max_length=48))
    serve = subprocess.Popen(
        [sys.executable, "-m", "app.cli.main", "serve", "--port", str(_free_port())],
        env=child_env(data_home, store),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    worker_pid = None
    try:
        run = wait_for(lambda: (r := store.get_run(run_id)).current_step >= 2 and r, timeout=180)
        worker_pid = run.worker_pid
        serve.kill()  # kill -9 the dashboard: no cleanup of any kind
        serve.wait(10)
        run = store.get_run(run_id)
        assert run.status is RunStatus.RUNNING  # the kill came mid-run
        wait_for(
            lambda: store.get_run(run_id).current_step > run.current_step,
            timeout=120,
            what="training goes on after the dashboard died",
        )
        # A new dashboard (its data functions; no browser needed) shows the live run.
        frame = runs_frame(store)
        row = frame[frame.iloc[:, 0] == run_id].iloc[0]
        assert row.iloc[4] == "running"
        assert "running" in RunPageData(store).refresh(run_id, None)[0]
        # The orphaned worker still obeys the store: a cancel stops the run, with its checkpoint.
        assert store.request_cancel(run_id) is RunStatus.RUNNING
        run = wait_for(
            lambda: (r := store.get_run(run_id)).status.finished and r, timeout=120, what="the cancelled run ends"
        )
        assert run.status is RunStatus.CANCELLED and run.current_step > 2, run.error_summary
        assert "cancelled" in RunPageData(store).refresh(run_id, None)[0]
        # The orphaned worker ends its run, then exits since its parent is gone.
        wait_for(lambda: not pid_alive(worker_pid), timeout=60, what="worker exits after its run")
    finally:
        stop(serve)
        if worker_pid and pid_alive(worker_pid):
            os.kill(worker_pid, signal.SIGKILL)


# ---------------------------------------------------------------------- 7. non-finite loss
def poison(model: Any, state: Any, control: Any) -> None:
    """Real NaNs in the weights: the next forward pass gives a NaN loss."""
    with torch.no_grad():
        model.get_input_embeddings().weight.fill_(math.nan)


@pytest.mark.integration
@pytest.mark.sqlite_only  # the training child's behaviour; its SQL is tested on both databases
def test_non_finite_loss_fails_the_run_and_keeps_the_last_good_checkpoint(store: Store, tiny_model: Path) -> None:
    from jobs.train.child import run

    run_id = store.create_run(tiny_spec(tiny_model, max_steps=10, save_steps=2))
    store.claim_next_on_device("test", "0")
    assert run(run_id, store, callbacks=[AtStep(3, poison)]) == 1
    record = store.get_run(run_id)
    assert record.status is RunStatus.FAILED
    assert record.error_summary.startswith("non-finite loss at step 4"), record.error_summary
    out = store.run_dir(run_id) / "output"
    assert [s for s, _ in checkpoint_dirs(out)] == [2] and is_complete(out / "checkpoint-2")
    losses = store.metrics(run_id, ["loss"])
    assert [p.step for p in losses] == [1, 2, 3, 4]
    assert all(math.isfinite(p.value) for p in losses[:3]) and math.isnan(losses[3].value)


@pytest.mark.integration
@pytest.mark.sqlite_only  # the training child's behaviour; its SQL is tested on both databases
def test_non_finite_loss_between_logging_steps_is_never_checkpointed(store: Store, tiny_model: Path) -> None:
    """Saves every 2 steps, logs every 5: the NaN of step 4 must stop the run before checkpoint-4."""
    from jobs.train.child import run

    run_id = store.create_run(tiny_spec(tiny_model, max_steps=10, save_steps=2, logging_steps=5))
    store.claim_next_on_device("test", "0")
    assert run(run_id, store, callbacks=[AtStep(3, poison)]) == 1
    record = store.get_run(run_id)
    assert record.status is RunStatus.FAILED
    assert record.error_summary.startswith("non-finite loss at step 4"), record.error_summary
    out = store.run_dir(run_id) / "output"
    assert [s for s, _ in checkpoint_dirs(out)] == [2]
    assert last_complete(out) == (2, out / "checkpoint-2")


def test_store_keeps_non_finite_metrics_and_migrates_old_databases(data_home: Path) -> None:
    db = data_home / "tunedeck.db"
    Store().dispose()
    # An older database: metrics.value NOT NULL, schema version 2.
    con = sqlite3.connect(db)
    con.executescript("""
        DROP TABLE metrics;
        CREATE TABLE metrics (id INTEGER NOT NULL, run_id INTEGER NOT NULL, step INTEGER NOT NULL,
            name VARCHAR(128) NOT NULL, value FLOAT NOT NULL, time FLOAT NOT NULL, PRIMARY KEY (id),
            FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE);
        CREATE INDEX ix_metrics_run_name_step ON metrics (run_id, name, step);
        UPDATE meta SET value = '2' WHERE key = 'schema_version';
    """)
    con.commit()
    con.close()
    store = Store()
    try:
        assert store.schema_version >= 3
        run_id = store.create_run(JobSpec(model="tiny-llama", max_steps=5))
        store.add_metrics(
            run_id,
            [
                MetricPoint(1, "loss", 2.0, 1.0),
                MetricPoint(2, "loss", math.nan, 2.0),
                MetricPoint(3, "loss", math.inf, 3.0),
                MetricPoint(4, "loss", 1.0, 4.0),
            ],
        )
        values = [p.value for p in store.metrics(run_id, ["loss"])]
        assert values[0] == 2.0 and math.isnan(values[1]) and math.isnan(values[2]) and values[3] == 1.0
        assert store.last_metric(run_id, "loss").value == 1.0
        assert math.isnan(store.last_metric_values([run_id], "loss")[run_id]) is False
        buckets = store.metric_series(run_id, "loss", 16)
        assert [(b.min, b.max, b.count) for b in buckets] == [(1.0, 2.0, 2)]  # graphs skip the gaps
    finally:
        store.dispose()


# ---------------------------------------------------------------------- 8. disk full
@pytest.fixture
def small_disk(tmp_path: Path):
    mount = tmp_path / "small"
    mount.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {res.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill_disk(path: Path) -> None:
    """Write zeros until the file system is full."""
    chunk = b"\0" * (64 * 1024)
    with open(path / "filler.bin", "wb") as f:
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError:
            pass


@pytest.mark.integration
def test_disk_full_while_saving_fails_clearly_and_keeps_checkpoint_and_database(
    small_disk: Path, tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs.train.child import run

    monkeypatch.setenv("TUNEDECK_HOME", str(small_disk))
    db = tmp_path / "elsewhere.db"
    monkeypatch.setenv("TUNEDECK_DATABASE_URL", f"sqlite:///{db}")
    store = Store()
    hashes: dict[str, str] = {}

    class FillAfterFirstSave(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == 2:
                folder = Path(args.output_dir) / "checkpoint-2"
                hashes.update({p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()})
                fill_disk(small_disk)

    try:
        run_id = store.create_run(tiny_spec(tiny_model, max_steps=10, save_steps=2))
        store.claim_next_on_device("test", "0")
        assert run(run_id, store, callbacks=[FillAfterFirstSave()]) == 1
        record = store.get_run(run_id)
        assert record.status is RunStatus.FAILED
        out = store.run_dir(run_id) / "output"
        assert record.error_summary.startswith(
            f"disk full while saving checkpoint to {out / 'checkpoint-4'}: free space or lower save frequency"
        ), record.error_summary
        assert [s for s, _ in checkpoint_dirs(out)] == [2]  # the half-written one is gone
        folder = out / "checkpoint-2"
        assert is_complete(folder)
        assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()} == hashes
        assert loss_steps(store, run_id) == [1, 2, 3, 4]
    finally:
        store.dispose()
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    con.close()


# ---------------------------------------------------------------------- 9. CUDA out of memory
@pytest.mark.integration
@pytest.mark.sqlite_only  # the training child's behaviour; its SQL is tested on both databases
def test_out_of_memory_inside_a_training_step_names_the_tricks(store: Store, tiny_model: Path) -> None:
    from jobs.train.child import run

    class OomAtForward(TrainerCallback):
        """Raises CUDA's OOM error from the model's forward pass of step 3 (a real training step)."""

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            calls = {"n": 0}

            def hook(module, inputs):
                calls["n"] += 1
                if calls["n"] == 3:
                    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

            model.get_input_embeddings().register_forward_pre_hook(hook)

    run_id = store.create_run(tiny_spec(tiny_model, per_device_train_batch_size=4, on_oom="fail"))
    store.claim_next_on_device("test", "0")
    assert run(run_id, store, callbacks=[OomAtForward()]) == 1  # on_oom: recover is tests/test_oom.py
    record = store.get_run(run_id)
    assert record.status is RunStatus.FAILED
    assert record.error_summary.startswith("CUDA out of memory. To use less memory try:"), record.error_summary
    for trick in ("per_device_train_batch_size 4 -> 2", "gradient_checkpointing: true", "max_length (now 64)"):
        assert trick in record.error_summary
    assert "training_step" in record.error_detail  # it came from inside a step
    assert loss_steps(store, run_id) == [1, 2]


# ---------------------------------------------------------------------- 5. the Resume button
def test_resume_button_shows_for_resumable_runs_and_requeues(store: Store) -> None:
    from app.ui.run import RunPageData

    page = RunPageData(store)
    run_id = store.create_run(JobSpec(model="tiny-llama", max_steps=5))
    resume_button = lambda: page.refresh(run_id, None)[10]  # noqa: E731 - RunPage.outputs: `resume` is the 11th
    assert resume_button().visible is False  # queued
    store.claim_next_on_device("w", "0")
    store.mark_interrupted(run_id, "worker gone")
    assert resume_button().visible is True
    page.resume(run_id)
    assert store.get_run(run_id).status is RunStatus.QUEUED and store.queued()[-1].id == run_id
    store.claim_next_on_device("w", "0")
    store.mark_failed(run_id, "boom")
    assert resume_button().visible is False  # failed without a checkpoint: nothing to resume from
    folder = store.run_dir(run_id) / "output" / "checkpoint-2"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text("{}")
    from storage.checkpoints import mark_complete

    mark_complete(folder, 2)
    assert resume_button().visible is True
