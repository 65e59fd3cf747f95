"""The deployment split, for real, as processes: one dashboard, two workers on two devices, PostgreSQL.

CPU stand-ins for the GPUs (`--device cpu-a`, `--device cpu-b`): each worker holds its own
device lease, so four queued runs go two at a time, never two on one device.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import training_helpers
from browser_helpers import REPO, free_port, stop_server

from storage.models import RunStatus
from storage.store import Store

BACKENDS = ("postgresql",)  # the split is what PostgreSQL is for (tests/conftest.py)

CLI = [sys.executable, "-c", "import sys; from app.cli.main import main; sys.exit(main(sys.argv[1:]))"]


def _start(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
    env.pop("TUNEDECK_DEVICE", None)
    return subprocess.Popen(
        CLI + args, cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )


@pytest.mark.integration
@pytest.mark.slow
def test_dashboard_two_workers_postgresql_four_runs(
    store: Store, data_home: Path, tiny_model: Path, tmp_path: Path
) -> None:
    spec = training_helpers.tiny_spec(tiny_model, max_steps=2, max_length=48, max_train_samples=8)
    ids = [store.create_run(spec.replace(run_name=f"split {i}")) for i in range(4)]
    port = free_port()
    procs = {
        "ui": _start(["serve", "--no-worker", "--host", "127.0.0.1", "--port", str(port)], tmp_path / "ui.log"),
        "cpu-a": _start(["worker", "--device", "cpu-a"], tmp_path / "a.log"),
        "cpu-b": _start(["worker", "--device", "cpu-b"], tmp_path / "b.log"),
    }
    try:
        training_helpers.wait_for(
            lambda: all(store.get_run(i).status.finished for i in ids),
            timeout=900,
            interval=1.0,
            what="all four runs finished",
        )
        page = training_helpers.wait_for(
            lambda: _get(f"http://127.0.0.1:{port}/"), timeout=120, interval=1.0, what="the dashboard answering"
        )
        assert "tunedeck" in page.lower()
        for i in ids:  # the dashboard, a process apart from the workers that wrote them, serves every bundle
            recorded = [a for a in store.artifacts(i) if a.kind == "bundle"][-1]
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/gradio_api/file={recorded.path}", timeout=30).read()
            assert hashlib.sha256(body).hexdigest() == recorded.sha256, i
    finally:
        for proc in procs.values():
            stop_server(proc)
    runs = [store.get_run(i) for i in ids]
    assert all(r.status is RunStatus.SUCCEEDED for r in runs), [(r.id, r.status, r.error_summary) for r in runs]
    device_of = {f"{proc_host()}:{procs[d].pid}": d for d in ("cpu-a", "cpu-b")}
    by_device: dict[str, list] = {}
    for r in runs:
        by_device.setdefault(device_of[r.worker_id], []).append(r)
    for device, done in by_device.items():  # one device, one run at a time
        spans = sorted((r.started_at, r.finished_at) for r in done)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), (device, spans)
    assert set(by_device) == {"cpu-a", "cpu-b"}, "both workers took runs"
    for r in runs:  # each run's memory samples are its own, stamped with the worker whose device it ran on
        samples = store.memory_samples(r.id)
        assert samples and all(p.run_id == r.id for p in samples)
        assert {p.worker_id for p in samples} == {r.worker_id}
    from app.ui.gpu import live_rows

    window = time.time() - min(r.created_at for r in runs) + 60
    for worker, device in device_of.items():  # each device's graph in the GPU panel draws its own samples only
        own = [p for p in store.memory_samples() if p.worker_id == worker and p.used_bytes is not None]
        gibs = [gib for _, gib, _ in live_rows(store, worker, time.time(), window_s=window)[0]]
        assert own and gibs, device
        assert max(gibs) == pytest.approx(max(p.used_bytes for p in own) / 1024**3), device


def _get(url: str) -> str | None:
    try:
        return urllib.request.urlopen(url, timeout=5).read().decode("utf-8", "replace")
    except OSError:
        return None


def proc_host() -> str:
    import socket

    return socket.gethostname()
