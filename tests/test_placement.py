"""One worker per GPU: device pinning, the (host, device) lease, heartbeats, placement, database errors."""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from jobs.spec.job import JobSpec
from storage.models import RunStatus
from storage.store import Store

BACKENDS = ("sqlite", "postgresql")  # each `store` test runs on both databases (tests/conftest.py)

from test_worker import make_worker  # noqa: E402
from training_helpers import wait_for  # noqa: E402

SPEC = JobSpec(model="tiny-llama", max_steps=5)
ENV = "print('CVD=' + repr(os.environ.get('CUDA_VISIBLE_DEVICES')), 'DEV=' + os.environ['TUNEDECK_DEVICE'])"


@pytest.mark.parametrize(("device", "seen"), [("1", "'1'"), ("GPU-5f3c", "'GPU-5f3c'"), ("cpu-a", "''")])
def test_device_pins_the_children(store: Store, device: str, seen: str) -> None:
    run_id = store.create_run(SPEC)
    make_worker(store, ENV, device=device).work(burst=True)
    text = Path(store.get_run(run_id).log_path).read_text()
    assert f"CVD={seen} DEV={device}" in text


def test_without_a_device_the_environment_is_left_alone(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUNEDECK_DEVICE", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    worker = make_worker(store, ENV)
    assert (worker.device, worker.pinned) == ("3", False)
    run_id = store.create_run(SPEC)
    worker.work(burst=True)
    assert "CVD='3' DEV=3" in Path(store.get_run(run_id).log_path).read_text()


def test_the_lease_is_held_until_the_process_group_is_gone(store: Store, tmp_path: Path) -> None:
    """The run reports success, but its process still lives: no other run may start on that GPU."""
    go = tmp_path / "go"
    code = f"""
    from storage.store import Store
    Store().mark_succeeded(run_id, {{}})
    while not os.path.exists({str(go)!r}):
        time.sleep(0.05)
    """
    first = store.create_run(SPEC)
    second = store.create_run(SPEC)
    worker = make_worker(store, code, device="7")
    thread = threading.Thread(target=worker.work, kwargs={"stop_after": first})
    thread.start()
    try:
        wait_for(lambda: store.get_run(first).status is RunStatus.SUCCEEDED, what="run 1 reported success")
        assert store.device_lease("7")["run_id"] == first
        assert store.claim_next_on_device("another-worker", "7") is None
        assert store.get_run(second).status is RunStatus.QUEUED
    finally:
        go.write_text("")
        thread.join(60)
    assert store.device_lease("7") == {}
    assert store.claim_next_on_device("another-worker", "7").id == second


def test_only_the_worker_beats_and_staleness_uses_the_database_clock(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = store.create_run(SPEC)
    store.claim_next_on_device("w", "0")
    beat = store.get_run(run_id).heartbeat_at
    store.set_progress(run_id, 3, 5)  # what the training child writes
    run = store.get_run(run_id)
    assert run.heartbeat_at == beat and run.progress_at is not None and run.current_step == 3
    # A host whose clock runs an hour ahead must not see a fresh run as stale.
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    store.heartbeat(run_id)
    assert store.stale_running(30) == []
    monkeypatch.setattr(time, "time", real)
    assert [r.id for r in store.stale_running(-60)] == [run_id]  # "older than -60 s": every running run


def test_runs_pinned_to_a_host_or_device_wait_for_it(store: Store) -> None:
    here = socket.gethostname()
    elsewhere = store.create_run(SPEC.replace(pin_host="some-other-host"))
    on_one = store.create_run(SPEC.replace(pin_device="1"))
    anywhere = store.create_run(SPEC)
    assert store.get_run(on_one).pin_device == "1"
    assert store.claim_next_on_device("w0", "0").id == anywhere  # skips both pinned runs
    assert store.claim_next_on_device("w1", "1").id == on_one
    assert store.claim_next_on_device("w2", "2") is None
    assert store.claim_next_on_device("w3", "3", host="some-other-host").id == elsewhere
    assert store.get_run(elsewhere).worker_id == "w3" and here != "some-other-host"


def test_the_worker_loop_survives_database_errors(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    run_id = store.create_run(SPEC)
    worker = make_worker(store, "pass", poll_interval=0.05)
    real = store.claim_next_on_device
    failures = iter([True, True, True])

    def flaky(*args, **kwargs):
        if next(failures, False):  # the driver's error inside the store's session: it leaves as DatabaseUnavailable
            with store._tx():
                raise OperationalError("SELECT 1", {}, Exception("server closed the connection unexpectedly"))
        return real(*args, **kwargs)

    store.claim_next_on_device = flaky  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="jobs.worker.loop"):
        assert worker.work(burst=True) == 1
    assert store.get_run(run_id).status is RunStatus.FAILED  # "pass" reports nothing: failed, but it ran
    assert sum("database error" in r.message for r in caplog.records) == 3
