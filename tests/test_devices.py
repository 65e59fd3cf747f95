"""The worker's device, not the UI's (issue 8 item 8): facts detected, published, and used by the checks.
The training child's runtime baseline (issue 21): measured once per host, cached, published with the facts."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import training_helpers

from jobs.devices import probe
from jobs.devices.facts import DeviceFacts, RuntimeBaseline
from jobs.devices.probe import detect
from jobs.devices.target import target
from jobs.spec.job import JobSpec, SpecError
from jobs.spec.stored import spec_of
from storage.store import Store


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This module tests the runtime cache itself: a folder of its own, not the session's shared one,
    and no facts an earlier test of this process remembered (`local_facts` reads the cache once)."""
    from jobs.devices import probe

    monkeypatch.setenv("TUNEDECK_CACHE_DIR", str(tmp_path / "cache"))
    probe.local_facts.cache_clear()
    yield tmp_path / "cache"
    probe.local_facts.cache_clear()


H200 = DeviceFacts(
    kind="cuda",
    name="NVIDIA H200",
    total_bytes=150_000_000_000,
    compute_capability="9.0",
    bf16=True,
    fp16=True,
    driver="580.65",
    host="gpu-box",
    index=0,
)
T4 = DeviceFacts(
    kind="cuda",
    name="Tesla T4",
    total_bytes=16_000_000_000,
    compute_capability="7.5",
    bf16=False,
    fp16=True,
    host="old-box",
    index=0,
)


def publish_live(store: Store, worker_id: str, facts: DeviceFacts) -> None:
    store.publish_device(worker_id, facts.host, facts.to_dict())
    store.worker_beat(worker_id, 4242, facts.host)


def test_facts_round_trip_through_json_and_ignore_unknown_keys() -> None:
    assert DeviceFacts.from_json(H200.to_json()) == H200
    assert DeviceFacts.from_dict({**H200.to_dict(), "added_later": 1}) == H200
    assert H200.device().cuda and H200.device().compute_capability == (9, 0)


def test_facts_round_trip_with_and_without_the_runtime_baseline() -> None:
    cpu = DeviceFacts(kind="cpu", name="cpu", total_bytes=25 * 1024**3, host="box", runtime_bytes=1181116006)
    assert DeviceFacts.from_json(cpu.to_json()) == cpu and cpu.to_dict()["runtime_bytes"] == 1181116006
    stored_before = {k: v for k, v in cpu.to_dict().items() if k != "runtime_bytes"}  # published by an older worker
    assert DeviceFacts.from_dict(stored_before) == replace(cpu, runtime_bytes=0)
    assert cpu.summary() == "cpu on box, 25.0 GiB RAM, runtime 1.1 GiB"
    assert replace(cpu, runtime_bytes=0).summary() == "cpu on box, 25.0 GiB RAM"  # unknown: not shown


def test_detect_on_this_machine_without_gpu_gives_cpu_facts() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    facts = detect()
    assert facts.kind == "cpu" and facts.name == "cpu" and facts.total_bytes > 1024**3
    assert not facts.fp16 and facts.host


@pytest.mark.gpu
def test_detect_on_a_gpu_matches_torch() -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    facts = detect(0)
    props = torch.cuda.get_device_properties(0)
    assert facts.kind == "cuda" and facts.name == props.name and facts.total_bytes == props.total_memory
    assert facts.compute_capability == f"{props.major}.{props.minor}"
    assert facts.bf16 == torch.cuda.is_bf16_supported()


def test_submit_checks_fp16_against_the_published_cuda_worker_not_this_machine(store: Store, tiny_model: Path) -> None:
    from jobs.checks.pipeline import check
    from jobs.queue.submit import submit

    spec = training_helpers.tiny_spec(tiny_model, precision="fp16")
    local = check(spec).problems
    if not detect().cuda:  # this machine alone refuses fp16 ...
        assert [p.field for p in local] == ["precision"]
        with pytest.raises(SpecError, match="fp16 needs CUDA") as refused:
            submit(store, spec)  # ... and so does submit while no worker has published a device, saying so
        assert "no worker has published its device yet" in refused.value.problems[0].fix
    publish_live(store, "gpu-box:7", H200)
    run_id = submit(store, spec)  # accepted: the worker that will run it has CUDA
    assert spec_of(store.get_run(run_id)).precision.value == "fp16"
    chosen = target(store)
    assert chosen.facts == H200 and chosen.worker_id == "gpu-box:7" and "NVIDIA H200" in chosen.note


def test_bf16_is_refused_when_the_only_worker_has_an_old_gpu(store: Store, tiny_model: Path) -> None:
    from jobs.queue.submit import submit

    publish_live(store, "old-box:1", T4)
    with pytest.raises(SpecError, match=r"this GPU \(Tesla T4\) does not support bf16"):
        submit(store, training_helpers.tiny_spec(tiny_model, precision="bf16"))


def test_target_prefers_live_workers_then_the_last_published_then_this_machine(store: Store) -> None:
    local = target(store)
    assert local.worker_id is None and local.note.startswith("no worker has published its device yet")
    store.publish_device("gone:1", "gone", T4.to_dict())  # published once, not beating now
    assert target(store).facts == T4 and "not running now" in target(store).note
    publish_live(store, "gpu-box:7", H200)
    publish_live(store, "old-box:1", T4)
    assert target(store).facts == H200  # the largest live GPU


def fake_baseline(runs: Path, runtime_bytes: int = 512 * 1024**2, trainer_bytes: dict | None = None) -> list[str]:
    """A stand-in for `python -m jobs.train.baseline`: logs a line, prints its figures last (`trainer_bytes`
    only when given), and appends the environment it got to `runs` (one line a run), so a test can count the spawns."""
    printed: dict[str, Any] = {"runtime_bytes": runtime_bytes}
    if trainer_bytes is not None:
        printed["trainer_bytes"] = trainer_bytes
    code = (
        "import json, os, sys\n"
        f"open({str(runs)!r}, 'a').write(json.dumps(dict(os.environ)) + '\\n')\n"
        "print('INFO jobs.train.child: a log line before the figure')\n"
        f"print({json.dumps(printed)!r})\n"
    )
    return [sys.executable, "-c", code]


def spawns(runs: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in runs.read_text().splitlines()] if runs.exists() else []


def published_facts(store: Store, worker_id: str) -> DeviceFacts:
    (facts,) = [DeviceFacts.from_dict(p["facts"]) for p in store.published_devices() if p["worker_id"] == worker_id]
    return facts


def test_worker_publishes_its_device_and_runtime_when_it_starts(store: Store, tmp_path: Path) -> None:
    from jobs.worker.loop import Worker

    runs = tmp_path / "runs.jsonl"
    Worker(store, worker_id="w-devices", sample=False, baseline_argv=fake_baseline(runs)).work(burst=True)
    (published,) = store.published_devices()
    assert published["worker_id"] == "w-devices"
    assert DeviceFacts.from_dict(published["facts"]) == replace(detect(), runtime_bytes=512 * 1024**2)
    (env,) = spawns(runs)  # measured with the environment a training child of this worker gets
    assert env["TUNEDECK_WORKER_ID"] == "w-devices" and env["TUNEDECK_DATABASE_URL"] == store.url
    # measured with glibc's own allocator, like a run that leaves cpu_return_freed_memory off (the default)
    assert env.get("MALLOC_MMAP_THRESHOLD_") == os.environ.get("MALLOC_MMAP_THRESHOLD_")


def test_cpu_children_get_glibcs_allocator_unless_the_spec_or_the_worker_asks() -> None:
    from jobs.worker.processes import CPU_ALLOCATOR_ENV, cpu_allocator_env

    assert cpu_allocator_env({}) == {}  # cpu_return_freed_memory is off by default (tests/test_tricks.py: the table)
    assert cpu_allocator_env({}, wanted=True) == CPU_ALLOCATOR_ENV
    assert cpu_allocator_env({"TUNEDECK_CPU_ALLOCATOR": "exact"}) == CPU_ALLOCATOR_ENV


def test_a_prediction_made_before_the_runtime_was_measured_counts_it_once_a_worker_claims_the_run(
    store: Store, tiny_model: Path, tmp_path: Path
) -> None:
    from jobs.queue.saved_prediction import load_prediction
    from jobs.queue.submit import submit
    from jobs.worker.loop import Worker

    run_id = submit(store, training_helpers.tiny_spec(tiny_model, max_steps=1))  # no worker yet: runtime unknown
    before = load_prediction(store, run_id)
    assert before is not None and before["parts"]["runtime"] == 0
    child = "import sys; sys.exit(0)"
    worker = Worker(
        store,
        worker_id="w-claims",
        sample=False,
        child_argv=lambda rid: [sys.executable, "-c", child],
        baseline_argv=fake_baseline(tmp_path / "runs.jsonl"),
        poll_interval=0.1,
    )
    worker.work(burst=True)
    after = load_prediction(store, run_id)
    assert after is not None and after["parts"]["runtime"] == 512 * 1024**2
    assert after["total_bytes"] == before["total_bytes"] + 512 * 1024**2
    assert after["worst_case_bytes"] == before["worst_case_bytes"] + 512 * 1024**2
    assert all(after["phases"][k] == v + 512 * 1024**2 for k, v in before["phases"].items())
    assert any("w-claims" in note for note in after["notes"])


def start(worker: Any) -> None:
    """What a worker does as it starts: publish its device, then its runtime baseline once measured."""
    worker.publish_device()
    worker.baseline_known()


def test_the_runtime_is_measured_once_per_host_and_again_after_an_upgrade(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs.worker.loop import Worker

    runs = tmp_path / "runs.jsonl"
    start(Worker(store, worker_id="first:1", sample=False, baseline_argv=fake_baseline(runs)))
    start(Worker(store, worker_id="restarted:2", sample=False, baseline_argv=fake_baseline(runs, 1)))
    assert len(spawns(runs)) == 1  # the restarted worker read the cache: no second measurement
    assert published_facts(store, "restarted:2").runtime_bytes == 512 * 1024**2
    cache = json.loads(probe.runtime_cache_path().read_text())
    assert [e["key"] for e in cache["entries"]] == [probe.runtime_key()]

    measured_with = probe.runtime_key
    monkeypatch.setattr(probe, "runtime_key", lambda: {**measured_with(), "torch": "99.0"})  # torch upgraded
    start(Worker(store, worker_id="upgraded:3", sample=False, baseline_argv=fake_baseline(runs, 640 * 1024**2)))
    assert len(spawns(runs)) == 2
    assert published_facts(store, "upgraded:3").runtime_bytes == 640 * 1024**2
    (entry,) = json.loads(probe.runtime_cache_path().read_text())["entries"]  # the old versions' entry replaced
    assert entry["key"]["torch"] == "99.0" and entry["runtime_bytes"] == 640 * 1024**2


def test_a_failed_runtime_measurement_is_logged_and_the_worker_still_trains(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    from jobs.worker.loop import Worker
    from storage.models import RunStatus

    run_id = store.create_run(JobSpec(model="tiny-llama", max_steps=2))
    child = "import sys; from storage.store import Store; Store().mark_succeeded(int(sys.argv[1]), {'train_loss': 1.0})"
    broken = [sys.executable, "-c", "import sys; print('ImportError: no torch here', file=sys.stderr); sys.exit(3)"]
    worker = Worker(
        store,
        worker_id="w-broken",
        sample=False,
        poll_interval=0.1,
        child_argv=lambda rid: [sys.executable, "-c", child, str(rid)],
        baseline_argv=broken,
    )
    with caplog.at_level(logging.ERROR, logger="jobs.worker.runtime"):
        assert worker.work(burst=True) == 1
    (record,) = [r for r in caplog.records if r.name == "jobs.worker.runtime"]
    assert "could not measure" in record.getMessage() and record.exc_info is not None
    assert "exited with code 3" in caplog.text and "no torch here" in caplog.text  # the traceback says why
    assert published_facts(store, "w-broken") == detect()  # published all the same, runtime_bytes 0 (unknown)
    assert store.get_run(run_id).status is RunStatus.SUCCEEDED
    assert not probe.runtime_cache_path().exists()  # nothing cached: the next start tries again


def test_checks_without_a_worker_read_the_cached_runtime_without_measuring(
    data_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError("the check path must not start a process")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    probe.local_facts.cache_clear()
    try:
        assert probe.local_facts().runtime_bytes == 0  # nothing measured on this host yet
        probe.remember_baseline(RuntimeBaseline(700 * 1024**2))
        probe.local_facts.cache_clear()
        assert probe.local_facts().runtime_bytes == 700 * 1024**2
        assert probe.local_facts() == replace(detect(), runtime_bytes=700 * 1024**2)
        probe.runtime_cache_path().write_text("{not json")  # a damaged file counts as nothing cached
        assert probe.cached_baseline() is None
    finally:
        probe.local_facts.cache_clear()  # later tests detect afresh


def test_gpu_panel_names_the_workers_gpu(store: Store) -> None:
    from app.ui.gpu import device_markdown

    publish_live(store, "gpu-box:7", H200)
    text = device_markdown(store)
    assert "NVIDIA H200" in text and "gpu-box" in text and "No NVIDIA GPU" not in text


def test_an_older_database_gains_the_event_device_and_sweep_tables(data_home: Path) -> None:
    import sqlite3

    from storage import models as m
    from storage.settings import database_url

    old = Store()
    run_id = old.create_run(JobSpec(model="tiny-llama", max_steps=2))
    old.dispose()
    path = database_url().removeprefix("sqlite:///")
    with sqlite3.connect(path) as con:
        for table in ("run_events", "worker_devices", "sweep_runs"):
            con.execute(f"DROP TABLE {table}")
        con.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    store = Store()
    try:
        assert store.schema_version == m.SCHEMA_VERSION
        assert store.get_run(run_id) is not None  # nothing stored is lost
        store.add_run_event(run_id, "oom_recovery", "OOM at step 1", step=1, data={"rung": 0})
        store.publish_device("w", "h", H200.to_dict())
        assert store.run_events(run_id)[0]["data"] == {"rung": 0}
        assert DeviceFacts.from_dict(store.published_devices()[0]["facts"]) == H200
    finally:
        store.dispose()


def test_gpu_panel_draws_each_workers_device_apart(store: Store) -> None:
    """Two workers on two hosts, both on their GPU 0: each one's graph has only its own samples."""
    import time

    from app.ui.gpu import device_choices, live_rows
    from storage.store import MemoryPoint

    publish_live(store, "gpu-box:1", H200)
    publish_live(store, "old-box:2", T4)
    now = time.time()
    gib = 1024**3
    store.add_memory_samples(
        [
            MemoryPoint(
                time=now - 30 + i,
                source="nvml",
                device_index=0,
                worker_id="gpu-box:1",
                used_bytes=80 * gib,
                total_bytes=H200.total_bytes,
            )
            for i in range(10)
        ]
        + [
            MemoryPoint(
                time=now - 30 + i,
                source="nvml",
                device_index=0,
                worker_id="old-box:2",
                used_bytes=5 * gib,
                total_bytes=T4.total_bytes,
            )
            for i in range(10)
        ]
    )
    choices = device_choices(store)
    assert [worker for _, worker in choices] == ["gpu-box:1", "old-box:2"]  # the largest GPU first
    assert "NVIDIA H200" in choices[0][0] and "Tesla T4" in choices[1][0]
    big, small, both = ({gib for _, gib, _ in live_rows(store, w, now)[0]} for w in ("gpu-box:1", "old-box:2", None))
    assert big == {80.0} and small == {5.0}  # no T4 sample in the H200's graph, nor back
    assert both == {5.0, 80.0}  # without a choice: every sample (a single worker, or older rows)
