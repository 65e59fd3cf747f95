"""The worker with fake training children (exit codes, signals, cancel, stale runs) and the real one."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from training_helpers import LONG, wait_for

from jobs.devices.sampler import GpuProbe, ProcessTree, Sampler
from jobs.spec.job import JobSpec
from jobs.worker.loop import Worker
from jobs.worker.outcome import describe_exit
from jobs.worker.processes import group_members
from storage.models import RunStatus
from storage.store import Store

BACKENDS = ("sqlite", "postgresql")  # each `store` test runs on both databases (tests/conftest.py)

SPEC = JobSpec(model="tiny-llama", max_steps=5)


def fake_child(code: str):
    """A child_argv hook running a Python snippet; `run_id` and `store` are available in it."""
    prelude = "import os, sys, time, signal\nrun_id = int(sys.argv[1])\n"
    script = prelude + textwrap.dedent(code)
    return lambda run_id: [sys.executable, "-c", script, str(run_id)]


def make_worker(store: Store, code: str, **kw) -> Worker:
    kw.setdefault("poll_interval", 0.1)
    kw.setdefault("heartbeat_interval", 0.2)
    kw.setdefault("grace_period", 2.0)
    return Worker(store, child_argv=fake_child(code), sample=kw.pop("sample", False), **kw)


def test_describe_exit() -> None:
    assert describe_exit(-9) == "training process killed by signal SIGKILL (9)"
    assert describe_exit(3) == "training process exited with code 3"


def test_child_exit_code_marks_failed_with_code_and_log(store: Store) -> None:
    run_id = store.create_run(SPEC)
    worker = make_worker(store, "print('loading model'); print('boom: bad thing', flush=True); sys.exit(3)")
    assert worker.work(burst=True) == 1
    run = store.get_run(run_id)
    assert run.status is RunStatus.FAILED
    assert run.exit_code == 3
    assert run.error_summary == "training process exited with code 3"
    assert "boom: bad thing" in run.error_detail
    assert run.log_path and Path(run.log_path).name == "train.log"
    assert run.child_pid is not None


def test_child_that_reports_itself_keeps_its_status(store: Store) -> None:
    run_id = store.create_run(SPEC)
    code = """
    from storage.store import Store
    Store().mark_succeeded(run_id, {"train_loss": 1.5})
    """
    make_worker(store, code).work(burst=True)
    run = store.get_run(run_id)
    assert run.status is RunStatus.SUCCEEDED, run.error_summary
    assert run.final_metrics == {"train_loss": 1.5}
    assert run.exit_code == 0


def test_child_env_carries_home_and_database(store: Store, data_home: Path) -> None:
    run_id = store.create_run(SPEC)
    code = "print('HOME=' + os.environ['TUNEDECK_HOME']); print('DB=' + os.environ['TUNEDECK_DATABASE_URL'])"
    make_worker(store, code).work(burst=True)
    text = Path(store.get_run(run_id).log_path).read_text()
    assert f"HOME={data_home}" in text
    assert f"DB={store.url}" in text


def test_sigkilled_child_fails_and_worker_takes_next_run(store: Store) -> None:
    first = store.create_run(SPEC)
    second = store.create_run(SPEC)
    code = f"""
    if run_id == {first}:
        print('step 1', flush=True)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    print('fine')
    """
    worker = make_worker(store, code)
    assert worker.work(burst=True) == 2
    run = store.get_run(first)
    assert run.status is RunStatus.FAILED
    assert run.error_summary == "training process killed by signal SIGKILL (9)"
    assert "SIGKILL" in run.error_summary
    assert run.exit_code == -9
    assert "step 1" in run.error_detail
    # The second child exited 0 without reporting: failed, but it ran.
    nxt = store.get_run(second)
    assert nxt.status is RunStatus.FAILED
    assert nxt.error_summary == "training process exited with code 0 without reporting a result"


def test_cancel_running_run_terminates_whole_group(store: Store, tmp_path: Path) -> None:
    run_id = store.create_run(SPEC)
    marker = tmp_path / "got-sigterm"
    # The child starts a grandchild (same process group), ignores SIGTERM after noting it:
    # the worker must escalate to SIGKILL and leave nothing of the group behind.
    code = f"""
    import subprocess
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    def on_term(signum, frame):
        open({str(marker)!r}, "w").write("yes")
    signal.signal(signal.SIGTERM, on_term)
    print("grandchild", grandchild.pid, flush=True)
    while True:
        time.sleep(0.05)
    """
    worker = make_worker(store, code, grace_period=1.0)
    thread = threading.Thread(target=worker.work, kwargs={"burst": True})
    thread.start()
    run = wait_for(
        lambda: (r := store.get_run(run_id)).child_pid and "grandchild" in Path(r.log_path).read_text() and r
    )
    pgid = run.child_pid
    assert len(group_members(pgid)) == 2
    assert store.request_cancel(run_id) is RunStatus.RUNNING
    thread.join(timeout=60)
    assert not thread.is_alive()
    run = store.get_run(run_id)
    assert run.status is RunStatus.CANCELLED
    assert marker.read_text() == "yes"  # SIGTERM came first
    assert run.exit_code == -9  # then SIGKILL after the grace period
    assert group_members(pgid) == []


def test_cancel_with_cooperative_child_needs_no_sigkill(store: Store) -> None:
    run_id = store.create_run(SPEC)
    worker = make_worker(store, "print('up', flush=True); time.sleep(600)", grace_period=10.0)
    thread = threading.Thread(target=worker.work, kwargs={"burst": True})
    thread.start()
    wait_for(lambda: store.get_run(run_id).child_pid)
    store.request_cancel(run_id)
    thread.join(timeout=30)
    run = store.get_run(run_id)
    assert run.status is RunStatus.CANCELLED
    assert run.exit_code == -signal.SIGTERM


def test_stop_interrupts_running_run(store: Store) -> None:
    run_id = store.create_run(SPEC)
    queued = store.create_run(SPEC)
    worker = make_worker(store, "time.sleep(600)")
    thread = threading.Thread(target=worker.work)
    thread.start()
    wait_for(lambda: store.get_run(run_id).child_pid)
    worker.stop("worker received SIGTERM")
    thread.join(timeout=60)
    run = store.get_run(run_id)
    assert run.status is RunStatus.INTERRUPTED
    assert "SIGTERM" in run.error_summary
    assert store.get_run(queued).status is RunStatus.QUEUED  # not taken after the stop


def test_stale_run_at_start_is_interrupted(store: Store) -> None:
    stale = store.create_run(SPEC)
    store.claim_next_on_device("otherhost:123", "0", worker_pid=123)
    with store._tx() as s:  # age its heartbeat (test-only shortcut into the store's session)
        from sqlalchemy import update

        from storage import models as m

        s.execute(update(m.Run).where(m.Run.id == stale).values(heartbeat_at=time.time() - 3600))
    fresh = store.create_run(SPEC)
    store.claim_next_on_device("otherhost:456", "1", worker_pid=456)  # fresh heartbeat, other host: left alone
    worker = make_worker(store, "pass")
    assert worker.cleanup_stale() == [stale]
    run = store.get_run(stale)
    assert run.status is RunStatus.INTERRUPTED
    assert "heartbeat" in run.error_summary
    assert store.get_run(fresh).status is RunStatus.RUNNING


def test_run_of_dead_local_worker_is_interrupted(store: Store) -> None:
    import socket
    import subprocess

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run_id = store.create_run(SPEC)
    store.claim_next_on_device(f"{socket.gethostname()}:{dead.pid}", "0", worker_pid=dead.pid)
    make_worker(store, "pass").work(burst=True)
    run = store.get_run(run_id)
    assert run.status is RunStatus.INTERRUPTED
    assert "no longer running" in run.error_summary


def test_dead_local_worker_is_named_as_dead_even_when_its_heartbeat_is_stale_too(store: Store) -> None:
    """Both checks see it; the exact one (its process is gone) is what the run says, not the suspicion."""
    import socket
    import subprocess

    from sqlalchemy import update

    from storage import models as m

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run_id = store.create_run(SPEC)
    store.claim_next_on_device(f"{socket.gethostname()}:{dead.pid}", "0", worker_pid=dead.pid)
    with store._tx() as s:  # age its heartbeat (test-only shortcut into the store's session)
        s.execute(update(m.Run).where(m.Run.id == run_id).values(heartbeat_at=time.time() - 3600))
    assert make_worker(store, "pass").cleanup_stale() == [run_id]
    assert f"(pid {dead.pid}) is no longer running" in store.get_run(run_id).error_summary


def test_idle_worker_takes_over_the_device_of_a_dead_workers_run(store: Store) -> None:
    """A worker waiting for the device notices (within stale_after / 2) that the run holding it
    belongs to a worker that died, marks it interrupted and takes the next queued run."""
    import socket
    import subprocess

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    worker = make_worker(store, "pass", stale_after=1.0)
    thread = threading.Thread(target=worker.work)
    thread.start()
    try:
        time.sleep(0.3)  # past the worker's start-up cleanup: only the periodic one can help now
        held = store.create_run(SPEC)
        assert store.claim_next_on_device(f"{socket.gethostname()}:{dead.pid}", worker.device, dead.pid).id == held
        waiting = store.create_run(SPEC)
        wait_for(lambda: store.get_run(waiting).status.finished, timeout=30)
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert store.get_run(held).status is RunStatus.INTERRUPTED
    assert "no longer running" in store.get_run(held).error_summary


def test_worker_announces_itself(store: Store) -> None:
    worker = make_worker(store, "pass", worker_id="test-worker")
    seen = []
    worker.execute = lambda run: seen.append(store.live_workers())  # type: ignore[method-assign]
    store.create_run(SPEC)
    worker.work(burst=True)
    assert seen and seen[0][0]["worker_id"] == "test-worker"
    assert store.live_workers() == []  # gone after work() returns


def test_sampler_writes_host_samples_with_rss(store: Store) -> None:
    probe = GpuProbe()
    if probe.has_gpu:
        pytest.skip("host sampling is the no-GPU path")
    assert probe.reason and probe.reason.startswith("no NVIDIA GPU")
    assert "NVIDIA" in probe.device_info().summary()
    run_id = store.create_run(SPEC)
    assert ProcessTree(os.getpid()).rss() > 0
    sampler = Sampler(store, probe, interval=0.05, batch_size=2)
    sampler.set_run(run_id, os.getpid())
    sampler.start()
    wait_for(lambda: len(store.memory_samples(run_id)) >= 4, timeout=30)
    sampler.set_run(None)
    sampler.stop()
    samples = store.memory_samples(run_id)
    assert all(s.source == "host" and s.used_bytes > 0 and s.process_rss > 0 for s in samples)
    assert all(s.total_bytes and s.total_bytes >= s.used_bytes for s in samples)
    run = store.get_run(run_id)
    assert run.peak_memory_source == "host"
    assert run.peak_memory_bytes == max(s.used_bytes for s in samples)


def test_worker_samples_child_memory(store: Store) -> None:
    run_id = store.create_run(SPEC)
    worker = make_worker(store, "x = bytearray(50 * 2**20); time.sleep(2.5)", sample=True)
    worker.work(burst=True)
    samples = store.memory_samples(run_id)
    assert samples and all(s.process_rss and s.process_rss > 0 for s in samples)
    assert store.get_run(run_id).peak_memory_bytes >= 50 * 2**20


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.sqlite_only  # the training child's behaviour; its SQL is tested on both databases
def test_real_training_child_sigkilled_then_next_run(store: Store, tiny_model: Path) -> None:
    """The real `python -m jobs.train.child` child, killed mid-run; the next run still trains."""
    pytest.importorskip("jobs.train.child")
    spec = JobSpec(model=str(tiny_model), max_steps=LONG, max_length=64, per_device_train_batch_size=2, logging_steps=1)
    first = store.create_run(spec)
    second = store.create_run(spec.replace(max_steps=3))
    worker = Worker(store, poll_interval=0.2, heartbeat_interval=0.5, grace_period=5.0)
    thread = threading.Thread(target=worker.work, kwargs={"burst": True})
    thread.start()
    run = wait_for(
        lambda: (r := store.get_run(first)).current_step >= 2 and len(store.metrics(first, ["loss"])) >= 2 and r,
        timeout=180,
        interval=0.2,
    )
    os.killpg(run.child_pid, signal.SIGKILL)
    before = store.metrics(first)  # every row written before the kill
    # The timeout only guards a hang: that the parent itself marked the run (not the stale-heartbeat
    # sweep) shows in the signal and exit code it recorded, asserted below.
    wait_for(lambda: store.get_run(first).status is RunStatus.FAILED, timeout=30, interval=0.05)
    thread.join(timeout=300)
    assert not thread.is_alive()
    run = store.get_run(first)
    assert run.status is RunStatus.FAILED
    assert "SIGKILL" in run.error_summary and run.exit_code == -9
    assert store.metrics(first) == before  # kept, and nothing written after the kill
    nxt = store.get_run(second)
    assert nxt.status is RunStatus.SUCCEEDED, (nxt.error_summary, nxt.error_detail)
    assert store.memory_samples(second)


COOPERATIVE = """
from storage.store import Store
def on_term(signum, frame):
    Store().mark_cancelled(run_id, exit_code=0)   # what jobs.train.child does on SIGTERM
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print('up', flush=True)
time.sleep(600)
"""


def test_worker_shutdown_is_interrupted_even_if_child_says_cancelled(store: Store) -> None:
    run_id = store.create_run(SPEC)
    # A generous grace: the child opens a store in its SIGTERM handler (seconds on a loaded machine, on
    # PostgreSQL); it exits as soon as it is done, so the grace costs nothing unless it hangs.
    worker = make_worker(store, COOPERATIVE, grace_period=60.0)
    thread = threading.Thread(target=worker.work)
    thread.start()
    wait_for(
        lambda: (
            "up" in Path(store.get_run(run_id).log_path or "/nonexistent").read_text()
            if store.get_run(run_id).log_path
            else False
        )
    )
    worker.stop("worker received SIGTERM")
    thread.join(timeout=60)
    run = store.get_run(run_id)
    assert run.status is RunStatus.INTERRUPTED and run.exit_code == 0


def test_user_cancel_with_cooperative_child(store: Store) -> None:
    run_id = store.create_run(SPEC)
    worker = make_worker(store, COOPERATIVE)
    thread = threading.Thread(target=worker.work, kwargs={"burst": True})
    thread.start()
    wait_for(
        lambda: (
            "up" in Path(store.get_run(run_id).log_path or "/nonexistent").read_text()
            if store.get_run(run_id).log_path
            else False
        )
    )
    store.request_cancel(run_id)
    thread.join(timeout=60)
    run = store.get_run(run_id)
    assert run.status is RunStatus.CANCELLED and run.exit_code == 0


def test_worker_process_sigterm_stops_child(data_home: Path, store: Store, tmp_path: Path) -> None:
    """The real `tunedeck worker` process: SIGTERM forwarded to the child's group, then it exits."""
    import subprocess

    run_id = store.create_run(SPEC)
    env = dict(os.environ, TUNEDECK_HOME=str(data_home))
    # Run the worker with a fake child (and runtime baseline) by patching processes in a tiny launcher.
    launcher = tmp_path / "launch.py"
    launcher.write_text(
        textwrap.dedent("""
        import sys
        import jobs.worker.processes as w
        w.default_child_argv = lambda run_id: [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"]
        w.baseline_argv = lambda: [sys.executable, "-c", "import json; print(json.dumps(dict(runtime_bytes=1)))"]
        from app.cli.main import main
        sys.exit(main(["worker"]))
    """)
    )
    proc = subprocess.Popen([sys.executable, str(launcher)], env=env)
    try:
        run = wait_for(lambda: (r := store.get_run(run_id)).child_pid and r, timeout=60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        run = store.get_run(run_id)
        assert run.status is RunStatus.INTERRUPTED and "SIGTERM" in run.error_summary
        assert group_members(run.child_pid) == []
    finally:
        if proc.poll() is None:
            proc.kill()
