"""Several runs on one device: the shared claim (both databases), the policy, the CUDA cap, the worker.

The real-training test runs three fitting tiny runs side by side on the CPU worker and shows a
fourth that does not fit waiting for one of them to end.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from training_helpers import tiny_spec

from jobs.devices.facts import DeviceFacts
from jobs.queue.saved_prediction import PREDICTION_FILE, predicted_bytes
from jobs.spec.job import JobSpec
from jobs.train import share_cap
from jobs.worker.loop import Worker
from jobs.worker.share import GIB, ShareError, SharePolicy, memory_fraction, reserves, wants_share
from storage.models import RunStatus
from storage.store import DeviceShare, Store

BACKENDS = ("sqlite", "postgresql")  # each `store` test runs on both databases (tests/conftest.py)

SHARED = JobSpec(model="tiny-llama", max_steps=5, share_device=True)
ALONE = JobSpec(model="tiny-llama", max_steps=5)


def predict(store: Store, run_id: int, data_bytes: int | None, total_bytes: int | None = None) -> None:
    """Save a prediction for the run as submit would (only the figures sharing reads)."""
    saved = {
        "data_bytes": data_bytes,
        "total_bytes": total_bytes or data_bytes,
        "device": {"kind": "cpu"},
        "parts": {"runtime": 1},  # counted already: the worker leaves it alone
    }
    (store.run_dir(run_id) / PREDICTION_FILE).write_text(json.dumps(saved))


# ---------------------------------------------------------------------- the claim
def test_shared_claim_admits_while_the_sum_fits_and_under_the_limit(store: Store) -> None:
    ids = [store.create_run(SHARED) for _ in range(5)]
    share = DeviceShare(limit=4, capacity_bytes=100, reserve={i: 30 for i in ids})
    claimed = [store.claim_next_on_device("w", "0", share=share) for _ in range(4)]
    assert [r.id if r else None for r in claimed] == [*ids[:3], None]  # 4 x 30 > 100: the fourth waits
    lease = store.device_lease("0")
    assert lease["run_id"] == ids[0]
    assert [(r["run_id"], r["bytes"]) for r in lease["runs"]] == [(i, 30) for i in ids[:3]]
    assert store.release_device("0", "w", run_id=ids[1])  # one ends: the next fits
    assert [r["run_id"] for r in store.device_lease("0")["runs"]] == [ids[0], ids[2]]
    assert store.claim_next_on_device("w", "0", share=share).id == ids[3]
    small = DeviceShare(limit=3, capacity_bytes=10**6, reserve={i: 1 for i in ids})
    assert store.claim_next_on_device("w", "0", share=small) is None  # three there: the limit
    for run_id in (ids[0], ids[2], ids[3]):
        store.release_device("0", "w", run_id=run_id)
    assert store.device_lease("0") == {}  # the last run gone: the device is free


def test_a_run_that_does_not_share_neither_joins_nor_is_joined(store: Store) -> None:
    alone, shared, later = store.create_run(ALONE), store.create_run(SHARED), store.create_run(SHARED)
    share = DeviceShare(limit=4, capacity_bytes=100, reserve={shared: 10, later: 10})  # `alone` not in it
    assert store.claim_next_on_device("w", "0", share=share).id == alone
    assert store.claim_next_on_device("w", "0", share=share) is None  # a lone run holds the device
    store.release_device("0", "w", run_id=alone)
    assert store.claim_next_on_device("w", "0", share=share).id == shared
    blocked = store.create_run(ALONE)
    store.move_queued(blocked, 0)
    assert store.claim_next_on_device("w", "0", share=share) is None  # FIFO: the lone head waits, `later` too
    assert store.get_run(later).status is RunStatus.QUEUED
    assert store.claim_next_on_device("other", "0", share=share) is None  # never shared across workers
    store.release_device("0", "w", run_id=shared)
    assert store.claim_next_on_device("w", "0", share=share).id == blocked


def test_the_claim_without_sharing_is_one_run_per_device(store: Store) -> None:
    first, second = store.create_run(SHARED), store.create_run(SHARED)
    assert store.claim_next_on_device("w1", "0").id == first
    assert store.claim_next_on_device("w2", "0") is None
    assert store.release_device("0", "w1")  # no run named: the whole lease
    assert store.claim_next_on_device("w2", "0").id == second
    assert store.device_lease("0")["runs"] == [{"run_id": second, "bytes": None}]


def test_requeue_alone_flags_the_run_and_puts_it_back(store: Store) -> None:
    run_id = store.create_run(SHARED)
    store.claim_next_on_device("w", "0")
    assert store.requeue_alone(run_id, "outgrew its share")
    run = store.get_run(run_id)
    assert run.status is RunStatus.QUEUED and run.run_alone and run.error_summary == "outgrew its share"
    assert not wants_share(run)
    assert not store.requeue_alone(run_id, "again")  # no longer running


# ---------------------------------------------------------------------- the policy
def test_share_policy_parses_margins_and_reserves() -> None:
    assert SharePolicy().enabled is False  # the default: one run per device
    pct = SharePolicy.parse(4, "10%")
    assert pct.enabled and pct.reserve(10 * GIB) == 11 * GIB
    assert SharePolicy.parse(2, "2GiB").reserve(GIB) == 3 * GIB
    assert SharePolicy.parse(2, "512MiB").reserve(0) == 512 * 1024**2
    assert SharePolicy.parse(2, "1.5").reserve(0) == int(1.5 * GIB)
    for bad_limit, bad_margin in ((0, "10%"), (2, "ten"), (2, "-5%"), (2, "3 parsecs")):
        with pytest.raises(ShareError) as err:
            SharePolicy.parse(bad_limit, bad_margin)
        assert err.value.flag in ("--share", "--share-margin") and err.value.fix


def test_predicted_bytes_is_the_data_figure_else_the_bound() -> None:
    assert predicted_bytes({"data_bytes": 5, "total_bytes": 9}) == 5
    assert predicted_bytes({"data_bytes": None, "total_bytes": 9}) == 9
    assert predicted_bytes(None) is None


def test_reserves_only_for_runs_that_share_and_have_a_prediction(store: Store) -> None:
    shared, alone, unpredicted = store.create_run(SHARED), store.create_run(ALONE), store.create_run(SHARED)
    predict(store, shared, 10 * GIB)
    predict(store, alone, 10 * GIB)
    assert reserves(store, store.queued(), SharePolicy.parse(4, "10%")) == {shared: 11 * GIB}
    assert unpredicted not in reserves(store, store.queued(), SharePolicy.parse(4, "0%"))


def test_stored_specs_without_share_device_still_load() -> None:
    old = json.loads(ALONE.to_json())
    old.pop("share_device", None)
    spec = JobSpec.from_dict(old)
    assert spec.share_device is False
    assert JobSpec.from_dict({**old, "share_device": True}).share_device is True


# ---------------------------------------------------------------------- the CUDA cap
class FakeCuda:
    def __init__(self, available: bool = True) -> None:
        self.available, self.calls = available, []

    def is_available(self) -> bool:
        return self.available

    def current_device(self) -> int:
        return 0

    def set_per_process_memory_fraction(self, fraction: float, device: int) -> None:
        self.calls.append((fraction, device))


def test_memory_fraction_is_the_reservation_over_the_device() -> None:
    assert memory_fraction(20 * GIB, 80 * GIB) == 0.25
    assert memory_fraction(90 * GIB, 80 * GIB) == 1.0
    with pytest.raises(ShareError):
        memory_fraction(GIB, 0)


def test_the_child_applies_the_cap_it_was_given() -> None:
    cuda = FakeCuda()
    env = {share_cap.MEMORY_FRACTION_ENV: "0.25"}
    assert share_cap.apply_cap(SimpleNamespace(cuda=cuda), env) == 0.25
    assert cuda.calls == [(0.25, 0)]
    assert share_cap.apply_cap(SimpleNamespace(cuda=FakeCuda()), {}) is None  # not shared: no cap
    cpu = FakeCuda(available=False)
    assert share_cap.apply_cap(SimpleNamespace(cuda=cpu), env) is None and cpu.calls == []
    assert share_cap.memory_fraction({share_cap.MEMORY_FRACTION_ENV: "1.5"}) is None


def fake_cuda_worker(store: Store, monkeypatch: pytest.MonkeyPatch, code: str, **kw) -> Worker:
    """A worker that believes it owns an 80 GiB GPU, with a stand-in child running `code`."""
    facts = DeviceFacts(kind="cuda", name="NVIDIA Fake", total_bytes=80 * GIB, index=0)
    monkeypatch.setattr("jobs.devices.probe.detect", lambda index=None: facts)
    script = "import os, sys\nrun_id = int(sys.argv[1])\n" + textwrap.dedent(code)
    argv = lambda run_id: [sys.executable, "-c", script, str(run_id)]  # noqa: E731
    return Worker(
        store, child_argv=argv, sample=False, poll_interval=0.1, heartbeat_interval=0.2, grace_period=2.0, **kw
    )


MARK_DONE = """
from storage.store import Store
store = Store()
(store.run_dir(run_id) / "fraction").write_text(os.environ.get("TUNEDECK_MEMORY_FRACTION", "none"))
store.mark_succeeded(run_id, {})
"""


def test_worker_gives_each_shared_cuda_run_its_cap(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    shared, alone = store.create_run(SHARED), store.create_run(ALONE)
    predict(store, shared, 20 * GIB)
    predict(store, alone, 20 * GIB)
    worker = fake_cuda_worker(store, monkeypatch, MARK_DONE, share=SharePolicy.parse(4, "0%"))
    assert worker.work(burst=True) == 2
    assert float((store.run_dir(shared) / "fraction").read_text()) == pytest.approx(0.25)
    assert (store.run_dir(alone) / "fraction").read_text() == "none"  # it runs alone: no cap
    assert store.get_run(shared).status is RunStatus.SUCCEEDED
    assert store.device_lease("0") == {}


OUTGROW = f"""
from storage.store import Store
store = Store()
if store.get_run(run_id).run_alone:
    (store.run_dir(run_id) / "alone").write_text(os.environ.get("TUNEDECK_MEMORY_FRACTION", "none"))
    store.mark_succeeded(run_id, {{}})
else:
    sys.exit({share_cap.EXIT_OUTGREW_SHARE})
"""


def test_a_run_that_outgrows_its_share_runs_again_alone(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = store.create_run(SHARED)
    predict(store, run_id, 10 * GIB)
    worker = fake_cuda_worker(store, monkeypatch, OUTGROW, share=SharePolicy.parse(2, "10%"))
    assert worker.work(burst=True) == 2  # claimed twice: shared, then alone
    run = store.get_run(run_id)
    assert run.status is RunStatus.SUCCEEDED and run.run_alone
    assert (store.run_dir(run_id) / "alone").read_text() == "none"  # the second time uncapped


def test_a_worker_that_does_not_share_ignores_the_opt_in(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = store.create_run(SHARED)
    predict(store, run_id, 20 * GIB)
    worker = fake_cuda_worker(store, monkeypatch, MARK_DONE)
    assert worker.work(burst=True) == 1
    assert (store.run_dir(run_id) / "fraction").read_text() == "none"


# ---------------------------------------------------------------------- real runs side by side
@pytest.mark.integration
@pytest.mark.sqlite_only  # ~60 s of real runs; the claim's SQL is tested on both databases above
def test_three_fitting_runs_train_together_and_a_fourth_waits(store: Store, tiny_model: Path) -> None:
    """Four real tiny runs sharing a CPU worker, each predicted at 30% of its memory: three fit at once."""
    from jobs.devices.probe import detect

    total = detect().total_bytes
    spec = tiny_spec(tiny_model, max_steps=12, max_length=48, sample_count=0, share_device=True)
    ids = [store.create_run(spec) for _ in range(4)]
    for run_id in ids:
        predict(store, run_id, int(0.3 * total))
    worker = Worker(store, poll_interval=0.2, heartbeat_interval=0.5, grace_period=5.0, sample=False)
    worker.share = SharePolicy.parse(4, "0%")  # the limit is not what stops the fourth: memory is
    assert worker.work(burst=True) == 4
    runs = [store.get_run(i) for i in ids]
    assert all(r.status is RunStatus.SUCCEEDED for r in runs), [(r.status, r.error_summary) for r in runs]
    first_three, fourth = runs[:3], runs[3]
    t0 = min(r.started_at for r in runs)
    print("spans (s from the first claim):", [(r.id, r.started_at - t0, r.finished_at - t0) for r in runs])
    # The three were on the device together: each was claimed and started before any of them ended. (How far
    # each got before the first ended depends on the machine's load: a starved one may not have logged a step.)
    assert max(r.started_at for r in first_three) < min(r.finished_at for r in first_three)
    # The fourth did not fit next to them: it started only once one of them had ended.
    assert fourth.started_at >= min(r.finished_at for r in first_three)


SLEEP_UNTIL_TERM = """
import signal
from storage.store import Store
store = Store()
signal.signal(signal.SIGTERM, lambda *_: (store.mark_cancelled(run_id, exit_code=0), sys.exit(0)))
(store.run_dir(run_id) / "started").write_text("yes")
while not (store.run_dir(run_id) / "finish").exists():
    import time
    time.sleep(0.05)
store.mark_succeeded(run_id, {})
"""


def test_cancelling_one_shared_run_leaves_its_neighbour_training(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from training_helpers import wait_for

    from app.cli.show import runs_table, show_text

    first, second = store.create_run(SHARED), store.create_run(SHARED)
    for run_id in (first, second):
        predict(store, run_id, 10 * GIB)
    worker = fake_cuda_worker(store, monkeypatch, SLEEP_UNTIL_TERM, share=SharePolicy.parse(2, "10%"))
    thread = threading.Thread(target=worker.work, kwargs={"burst": True})
    thread.start()
    try:
        wait_for(lambda: all((store.run_dir(i) / "started").exists() for i in (first, second)), what="both started")
        assert [r["run_id"] for r in store.device_lease("0")["runs"]] == [first, second]
        table = runs_table(store, store.list_runs())
        assert "SHARES" in table and f"with {second}" in table
        assert f"shared with run(s) {second}" in show_text(store, store.get_run(first))
        store.request_cancel(first)
        wait_for(lambda: store.get_run(first).status is RunStatus.CANCELLED, what="first cancelled")
        assert store.get_run(second).status is RunStatus.RUNNING
        wait_for(lambda: [r["run_id"] for r in store.device_lease("0").get("runs", [])] == [second], what="release")
        (store.run_dir(second) / "finish").write_text("go")
        thread.join(timeout=60)
    finally:
        worker.stop()
        thread.join(timeout=60)
    assert store.get_run(second).status is RunStatus.SUCCEEDED
    assert "SHARES" not in runs_table(store, store.list_runs())  # nothing shares now: today's columns
    assert store.device_lease("0") == {}


@pytest.mark.integration
@pytest.mark.sqlite_only
def test_the_child_out_of_memory_within_its_cap_asks_to_run_alone(
    store: Store, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real training child, in-process, capped (as a shared CUDA child is) and out of memory with no
    recovery left: it exits EXIT_OUTGREW_SHARE and leaves the run running for the worker to re-queue."""
    import torch
    from transformers import TrainerCallback

    from jobs.train import child

    class OomAtOnce(TrainerCallback):
        def on_step_begin(self, *args, **kwargs):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    run_id = store.create_run(tiny_spec(tiny_model, max_steps=3, on_oom="fail", sample_count=0, share_device=True))
    store.claim_next_on_device("w", "0")
    monkeypatch.setenv(share_cap.MEMORY_FRACTION_ENV, "0.25")
    assert child.run(run_id, store, callbacks=[OomAtOnce()]) == share_cap.EXIT_OUTGREW_SHARE
    assert store.get_run(run_id).status is RunStatus.RUNNING  # not failed: the worker queues it to run alone
    monkeypatch.delenv(share_cap.MEMORY_FRACTION_ENV)
    alone = store.create_run(tiny_spec(tiny_model, max_steps=3, on_oom="fail", sample_count=0))
    store.release_device("0", "w")
    store.claim_next_on_device("w", "0")
    assert child.run(alone, store, callbacks=[OomAtOnce()]) == 1  # uncapped: an OOM fails the run as before
    assert store.get_run(alone).status is RunStatus.FAILED


# ---------------------------------------------------------------------- bench/share_gpu.py (no GPU here)
def test_share_bench_imports_plans_and_summarizes(capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import share_gpu

    with pytest.raises(SystemExit) as done:
        share_gpu.main(["--help"])
    assert done.value.code == 0 and "--counts" in capsys.readouterr().out
    assert share_gpu.main(["--plan", "--counts", "1,2,4"]) == 0
    assert "fit on" in capsys.readouterr().out

    def run(i: int, start: float, end: float) -> dict:
        return {
            "run_id": i,
            "status": "succeeded",
            "started_at": start,
            "finished_at": end,
            "tokens_per_second": 100.0,
            "predicted_bytes": GIB,
            "measured_peak_bytes": GIB,
            "peak_source": "torch",
            "cap_fraction": 0.1,
            "tokens": 1000,
        }

    sequential = {"runs": [run(1, 0, 10), run(2, 10, 20)], "wall_s": 20.0}
    shared = [{"count": 2, "wall_s": 12.0, "runs": [run(3, 0, 12), run(4, 1, 11)]}]
    (row,) = share_gpu.summarize(sequential, shared)
    assert row["sequential_wall_s"] == 20 and row["speedup"] == pytest.approx(1.67) and row["overlapped"]
    assert row["summed_tokens_per_second"] == 200
    assert not share_gpu.overlapped([run(1, 0, 10), run(2, 10, 20)])
    assert "speed-up" in share_gpu.table([row])


# ---------------------------------------------------------------------- stopping, flags, the schema
def test_stopping_a_sharing_worker_interrupts_every_run_and_frees_the_device(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from training_helpers import wait_for

    ids = [store.create_run(SHARED) for _ in range(3)]
    for run_id in ids:
        predict(store, run_id, 10 * GIB)
    worker = fake_cuda_worker(store, monkeypatch, SLEEP_UNTIL_TERM, share=SharePolicy.parse(3, "10%"))
    thread = threading.Thread(target=worker.work)
    thread.start()
    try:
        wait_for(lambda: all((store.run_dir(i) / "started").exists() for i in ids), what="all three started")
        assert len(store.device_lease("0")["runs"]) == 3
    finally:
        worker.stop("test stop")
        thread.join(timeout=60)
    assert not thread.is_alive()
    runs = [store.get_run(i) for i in ids]
    assert all(r.status is RunStatus.INTERRUPTED and "test stop" in r.error_summary for r in runs)
    assert store.device_lease("0") == {}


def test_worker_refuses_bad_share_flags(data_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli.main import main

    assert main(["worker", "--burst", "--share", "0"]) == 2
    assert "--share" in capsys.readouterr().err
    assert main(["worker", "--burst", "--share", "2", "--share-margin", "lots"]) == 2
    assert "--share-margin" in capsys.readouterr().err


def test_a_database_of_schema_8_gains_run_alone(data_home: Path) -> None:
    import sqlite3

    path = data_home / "old.db"
    Store(f"sqlite:///{path}").dispose()
    with sqlite3.connect(path) as con:
        con.execute("ALTER TABLE runs DROP COLUMN run_alone")
        con.execute("UPDATE meta SET value = '8' WHERE key = 'schema_version'")
        con.execute(
            "INSERT INTO runs (name, spec_json, status, created_at, queue_order, cancel_requested, current_step)"
            " VALUES ('old', ?, 'queued', 1.0, 1.0, 0, 0)",
            (ALONE.to_json(),),
        )
    con.close()
    store = Store(f"sqlite:///{path}")
    (run,) = store.queued()
    assert run.run_alone is False and store.schema_version >= 9
    assert store.claim_next_on_device("w", "0").id == run.id
    store.dispose()


def test_a_dead_workers_shared_lease_is_taken_over_with_every_run(store: Store) -> None:
    import socket
    import subprocess

    from jobs.worker.leases import take_over_device

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    holder = f"{socket.gethostname()}:{dead.pid}"
    ids = [store.create_run(SHARED) for _ in range(2)]
    share = DeviceShare(limit=2, capacity_bytes=100, reserve={i: 10 for i in ids})
    for _ in ids:
        assert store.claim_next_on_device(holder, "0", worker_pid=dead.pid, share=share) is not None
    take_over_device(store, "0", "me:1", socket.gethostname(), grace_period=1.0)
    assert all(store.get_run(i).status is RunStatus.INTERRUPTED for i in ids)
    assert store.device_lease("0") == {}
