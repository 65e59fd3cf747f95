"""A worker claims only what fits its own device, and memory other processes hold counts (issue 32).

On SQLite and PostgreSQL: the claim passes over the runs a worker names (`skip`); a burst worker with a
24 GiB card trains the run that fits, leaves the 30 GiB one queued with an event saying why, and a worker
with an 80 GiB card then takes it. The free-memory verdict is judged with injected device facts (a fake
NVML room): another tenant's 20 GiB is named, tunedeck's own processes are not counted against it.
"""

from __future__ import annotations

import json
import sys

import pytest

from jobs.devices.facts import DeviceFacts
from jobs.devices.room import DeviceRoom, Holder
from jobs.spec.job import JobSpec
from jobs.worker.fit import FitGate, fit_problem, needed_bytes
from jobs.worker.loop import Worker
from jobs.worker.share import SharePolicy
from storage.models import RunStatus
from storage.store import Store

BACKENDS = ("sqlite", "postgresql")  # each `store` test runs on both databases (tests/conftest.py)
GIB = 1024**3
CARD24 = DeviceFacts(kind="cuda", name="RTX 4090", total_bytes=24 * GIB, index=0)
CARD80 = DeviceFacts(kind="cuda", name="H100", total_bytes=80 * GIB, index=1)


def queue(store: Store, peak_gib: float, kind: str = "cuda", **spec: object) -> int:
    """A queued run whose saved prediction (made for a `kind` device) peaks at `peak_gib`."""
    run_id = store.create_run(JobSpec(model="tiny-llama", max_steps=1, **spec))  # type: ignore[arg-type]
    peak = int(peak_gib * GIB)
    saved = {"total_bytes": peak, "data_bytes": peak, "device": {"kind": kind}}
    (store.run_dir(run_id) / "prediction.json").write_text(json.dumps(saved))
    return run_id


def test_the_claim_passes_over_the_runs_named_and_leaves_them_queued(store: Store) -> None:
    big, small = queue(store, 30), queue(store, 10)
    claimed = store.claim_next_on_device("w-small", "0", host="h1", skip={big})
    assert claimed is not None and claimed.id == small
    assert store.get_run(big).status is RunStatus.QUEUED
    assert store.claim_next_on_device("w-small2", "1", host="h1", skip={big}) is None  # nothing else for it
    taken = store.claim_next_on_device("w-large", "2", host="h1")
    assert taken is not None and taken.id == big


def test_a_small_card_trains_what_fits_and_leaves_the_rest_queued_saying_why(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    import jobs.devices.probe as probe

    big, small = queue(store, 30), queue(store, 10)
    monkeypatch.setattr(probe, "detect", lambda index=0: CARD24)
    child = lambda run_id: [sys.executable, "-c", "pass"]  # noqa: E731 (a stand-in trainer)
    worker = Worker(store, "w24", poll_interval=0.1, heartbeat_interval=0.2, child_argv=child, sample=False)
    worker.fit.room = lambda: DeviceRoom(24 * GIB, 24 * GIB)
    assert worker.work(burst=True) == 1  # ends: the run left is not one it could take
    assert store.get_run(small).worker_id == "w24"  # claimed and trained (by a stand-in: its end does not matter)
    assert store.get_run(big).status is RunStatus.QUEUED
    (event,) = [e for e in store.run_events(big) if e["kind"] == "waiting"]
    assert "w24" in event["message"] and "30.0 GiB" in event["message"] and "larger device" in event["message"]
    monkeypatch.setattr(probe, "detect", lambda index=0: CARD80)
    large = Worker(store, "w80", poll_interval=0.1, heartbeat_interval=0.2, child_argv=child, sample=False)
    large.fit.room = lambda: DeviceRoom(80 * GIB, 80 * GIB)
    assert large.work(burst=True) == 1
    assert store.get_run(big).worker_id == "w80" and store.get_run(big).status is not RunStatus.QUEUED


def test_memory_other_processes_hold_keeps_a_run_queued_and_is_named(store: Store) -> None:
    run_id = queue(store, 70)
    rooms = [DeviceRoom(80 * GIB, 58 * GIB, (Holder(4242, "python3", 20 * GIB), Holder(77, "Xorg", 2 * GIB)))]
    gate = FitGate(store, "w80", facts=CARD80, room=lambda: rooms[0])
    assert gate.passed_over("h1", "0") == {run_id}
    assert gate.passed_over("h1", "0") == {run_id}  # asked again: still waiting, told once
    (event,) = [e for e in store.run_events(run_id) if e["kind"] == "waiting"]
    assert "pid 4242 (python3) 20.0 GiB" in event["message"] and "58.0 GiB" in event["message"]
    assert gate.passed_over("h1", "0", children=[4242]) == set()  # 4242 is one of our own runs: not a tenant
    rooms[0] = DeviceRoom(80 * GIB, 78 * GIB, (Holder(77, "Xorg", 2 * GIB),))  # the tenant left
    assert gate.passed_over("h1", "0") == set()
    assert store.claim_next_on_device("w80", "0", host="h1", skip=gate.passed).id == run_id


def test_fit_rules() -> None:
    assert fit_problem(24 * GIB, CARD24, None) is None  # exactly the card: a "tight" run starts as before
    assert "larger device" in (fit_problem(24 * GIB + 1, CARD24, None) or "")
    unknown = DeviceRoom(80 * GIB, 30 * GIB, (Holder(5, "not visible here", None),))  # NVML gives no figures
    assert "30.0 GiB" in (fit_problem(40 * GIB, CARD80, unknown) or "")
    assert "pid 5 (not visible here)" in (fit_problem(40 * GIB, CARD80, unknown) or "")
    assert fit_problem(40 * GIB, CARD80, DeviceRoom(80 * GIB, 80 * GIB)) is None
    saved = {"total_bytes": 5 * GIB, "data_bytes": None, "device": {"kind": "cpu"}}
    assert needed_bytes(saved, CARD80) is None  # a CPU prediction says nothing of a GPU
    assert needed_bytes({**saved, "device": {"kind": "cuda"}}, CARD80) == 5 * GIB
    assert needed_bytes(None, CARD80) is None


def test_a_sharing_run_needs_its_margin_too(store: Store) -> None:
    alone, shared = queue(store, 22), queue(store, 22, share_device=True)
    gate = FitGate(store, "w24", SharePolicy(limit=2, margin_fraction=0.1), facts=CARD24, room=lambda: None)
    assert gate.passed_over("h1", "0") == {shared}  # 22 GiB + 10% > 24 GiB; alone it fits
    assert alone not in gate.passed


def test_at_submit_memory_other_processes_hold_is_a_warning_naming_them(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket
    from types import SimpleNamespace

    import jobs.devices.room as room
    from jobs.checks.memory import taken_memory_warning

    here = DeviceFacts(kind="cuda", name="H100", total_bytes=80 * GIB, index=0, host=socket.gethostname())
    tenant = DeviceRoom(80 * GIB, 50 * GIB, (Holder(4242, "python3", 30 * GIB),))
    monkeypatch.setattr(room, "read_room", lambda index: tenant)
    prediction = SimpleNamespace(total_bytes=60 * GIB)
    warning = taken_memory_warning(prediction, here, store)
    assert warning and "pid 4242 (python3) 30.0 GiB" in warning and "50.0 GiB free" in warning
    assert taken_memory_warning(SimpleNamespace(total_bytes=40 * GIB), here, store) is None  # fits beside it
    elsewhere = DeviceFacts(kind="cuda", name="H100", total_bytes=80 * GIB, index=0, host="another-host")
    assert taken_memory_warning(prediction, elsewhere, store) is None  # another host's GPU: NVML cannot tell
    ours = store.create_run(JobSpec(model="tiny-llama", max_steps=1))
    store.claim_next_on_device("w1", "0")
    store.set_child(ours, 4242)
    assert taken_memory_warning(prediction, here, store) is None  # 4242 is tunedeck's own run
