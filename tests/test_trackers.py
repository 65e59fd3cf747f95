"""report_to: one tiny run trained through the worker mirrors its metrics to W&B, MLflow, TensorBoard and trackio.

Each tracker runs in its own local mode (W&B offline files, MLflow's default store with no MLFLOW_TRACKING_URI,
which tunedeck puts at sqlite:///$TUNEDECK_HOME/mlflow.db, TensorBoard event files, trackio's local SQLite store)
and is read back with its own reader; each must hold the very rows the store holds, the spec as config and the
run's tunedeck address. The run is trained once for the module. What would keep a tracker from starting is
refused at submit (issue 48): a file store MLflow 3 keeps off, a database store without alembic or its driver,
a tracking server that does not answer, W&B online without a key.
"""

from __future__ import annotations

import glob
import json
import math
import socket
import struct
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from training_helpers import tiny_spec

from jobs.checks.pipeline import check
from jobs.checks.trackers import tracker_problems
from jobs.spec.job import JobSpec, SpecError
from jobs.spec.trackers import PACKAGES, Tracker

URL = "http://dash.example:7860"


# ---------------------------------------------------------------------- fast: the field and the submit check
def test_report_to_reads_lists_words_and_none() -> None:
    assert JobSpec.from_dict({"report_to": ["wandb", "mlflow", "wandb"]}).tracker_list == [
        Tracker.WANDB,
        Tracker.MLFLOW,
    ]
    assert JobSpec.from_dict({"report_to": "tensorboard, trackio"}).report_to == "tensorboard,trackio"
    assert JobSpec.from_dict({"report_to": "none"}).tracker_list == []
    with pytest.raises(SpecError) as err:
        JobSpec.from_dict({"report_to": "wandb,comet"})
    (problem,) = err.value.problems
    assert (problem.field, problem.problem) == ("report_to", "`comet` is not a tracker tunedeck reports to")
    assert "wandb, mlflow, tensorboard, trackio" in problem.fix


def test_missing_tracker_package_is_refused_at_submit(monkeypatch: pytest.MonkeyPatch, tiny_model: Path) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B's key is another check's
    spec = tiny_spec(tiny_model, report_to="wandb,tensorboard")
    assert tracker_problems(spec) == []  # both installed with the test extras
    monkeypatch.setitem(PACKAGES, Tracker.WANDB, ("tunedeck_no_such_wandb", "wandb==0.31.0"))
    problems = [p for p in check(spec).problems if p.field == "report_to"]
    assert len(problems) == 1 and "`wandb` needs the `tunedeck_no_such_wandb` package" in problems[0].problem
    assert "pip install 'wandb==0.31.0'" in problems[0].fix and "remove wandb from report_to" in problems[0].fix


@pytest.fixture
def tracker_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No tracker settings at all, a fresh data folder and an empty netrc; returns the data folder."""
    for key in (
        "MLFLOW_TRACKING_URI",
        "MLFLOW_ALLOW_FILE_STORE",
        "WANDB_MODE",
        "WANDB_DISABLED",
        "WANDB_API_KEY",
        "WANDB_BASE_URL",
    ):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TUNEDECK_DATABASE_URL", raising=False)
    return tmp_path / "home"


def _refusals(report_to: str) -> list[tuple[str, str]]:
    problems = tracker_problems(JobSpec(report_to=report_to))
    assert all(p.field == "report_to" for p in problems)
    return [(p.problem, p.fix) for p in problems]


def test_mlflow_defaults_to_a_sqlite_store_in_the_data_folder_and_needs_alembic(
    tracker_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs.checks import trackers

    assert trackers.mlflow_tracking_uri() == f"sqlite:///{tracker_env / 'mlflow.db'}"
    assert _refusals("mlflow") == []
    monkeypatch.setattr(trackers, "MLFLOW_DB_MODULES", ("sqlalchemy", "tunedeck_no_such_alembic"))
    ((problem, fix),) = _refusals("mlflow")
    assert "needs `tunedeck_no_such_alembic`, not installed here" in problem and "mlflow.db" in problem
    assert "pip install tunedeck_no_such_alembic" in fix


@pytest.mark.parametrize("where", ["file:{tmp}/mlruns", "{tmp}/mlruns"])
def test_an_mlflow_file_store_needs_mlflow_allow_file_store(
    tracker_env: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", where.format(tmp=tracker_env.parent))
    ((problem, fix),) = _refusals("mlflow")
    assert "file store" in problem and "MLFLOW_ALLOW_FILE_STORE=true" in problem
    assert "set MLFLOW_ALLOW_FILE_STORE=true" in fix and "unset MLFLOW_TRACKING_URI" in fix
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert _refusals("mlflow") == []


def test_an_mlflow_database_store_needs_its_driver_and_its_password_is_never_shown(
    tracker_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql+psycopg2://ml:hunter2@127.0.0.1:5432/mlflow")  # not installed
    ((problem, fix),) = _refusals("mlflow")
    assert "needs the driver `psycopg2`" in problem and "hunter2" not in problem + fix
    assert "postgresql+psycopg2://***@127.0.0.1:5432/mlflow" in problem and "DIALECT+DRIVER" in fix
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql+psycopg://ml:hunter2@127.0.0.1:5432/mlflow")
    assert _refusals("mlflow") == []  # an installed driver: nothing is connected to at submit


class _Answers(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(404 if self.path != "/health" else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_an_mlflow_tracking_server_must_answer(tracker_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    ((problem, fix),) = _refusals("mlflow")
    assert f"the MLflow tracking server http://127.0.0.1:{port} does not answer" in problem
    assert "`mlflow server`" in fix
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{server.server_address[1]}/")
        assert _refusals("mlflow") == []
    finally:
        server.shutdown()
        server.server_close()


def test_wandb_online_needs_a_key_or_a_netrc_entry(tracker_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ((problem, fix),) = _refusals("wandb")
    assert "W&B logs online here (WANDB_MODE is unset) and has no key" in problem and "api.wandb.ai" in problem
    assert "WANDB_API_KEY" in fix and "WANDB_MODE=offline" in fix
    for mode in ("offline", "disabled"):
        monkeypatch.setenv("WANDB_MODE", mode)
        assert _refusals("wandb") == []
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert _refusals("wandb") == []
    monkeypatch.delenv("WANDB_API_KEY")
    netrc = tracker_env.parent / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    netrc.chmod(0o600)
    assert _refusals("wandb") == []
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.corp.example")  # the entry is for another host
    ((problem, _),) = _refusals("wandb")
    assert "no wandb.corp.example entry" in problem


def test_trackers_that_cannot_start_are_refused_at_submit_and_nothing_queues(
    tracker_env: Path, monkeypatch: pytest.MonkeyPatch, tiny_model: Path
) -> None:
    from jobs.queue.submit import submit
    from storage.store import Store

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tracker_env.parent / 'mlruns'}")
    store = Store()
    try:
        with pytest.raises(SpecError) as refused:
            submit(store, tiny_spec(tiny_model, report_to="mlflow,wandb"))
        problems = refused.value.problems
        assert [p.field for p in problems] == ["report_to", "report_to"]
        assert "file store" in problems[0].problem and "W&B" in problems[1].problem
        assert store.count_runs() == 0
    finally:
        store.dispose()


# ---------------------------------------------------------------------- one run, four trackers
@pytest.fixture(scope="module")
def mirrored(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[dict[str, Any]]:
    """A finished tiny run with report_to: all four, and where each tracker wrote."""
    from jobs.worker.loop import Worker
    from storage.models import RunStatus
    from storage.store import Store

    home = tmp_path_factory.mktemp("trackers-home")
    with pytest.MonkeyPatch.context() as mp:
        env = {
            "TUNEDECK_HOME": str(home),
            "TUNEDECK_URL": URL,
            "WANDB_MODE": "offline",
            "WANDB_SILENT": "true",
            "TRACKIO_DIR": str(home / "trackio"),
        }
        for key, value in env.items():
            mp.setenv(key, value)
        unset = ("TUNEDECK_DATABASE_URL", "WANDB_DIR", "WANDB_PROJECT", "MLFLOW_EXPERIMENT_NAME", "TRACKIO_PROJECT")
        for key in (*unset, "MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE"):  # MLflow's default store
            mp.delenv(key, raising=False)
        store = Store()
        spec = tiny_spec(
            tiny_model,
            max_steps=4,
            eval_split=4,  # 4 held-out rows, evaluated at steps 2 and 4: eval_loss rows too
            eval_steps=2,
            sample_count=0,
            report_to=[t.value for t in Tracker],
        )
        run_id = store.create_run(spec)
        Worker(store, poll_interval=0.1).work(burst=True)
        run = store.get_run(run_id)
        assert run.status is RunStatus.SUCCEEDED, run.error_detail
        rows = {(p.name, p.step): p.value for p in store.metrics(run_id)}
        yield {"home": home, "run_id": run_id, "run_dir": store.run_dir(run_id), "rows": rows, "spec": spec}
        store.dispose()


def _same(rows: dict[tuple[str, int], float], got: dict[tuple[str, int], float]) -> None:
    """The tracker holds each of the store's rows with its value (NaN where the store has none)."""
    assert {"loss", "eval_loss", "tokens_per_second", "step_time"} <= {name for name, _ in rows}
    missing = sorted(set(rows) - set(got))
    assert not missing, f"rows the tracker lacks: {missing[:10]}"
    for key, value in rows.items():
        assert math.isclose(got[key], value, rel_tol=1e-6) or (math.isnan(value) and math.isnan(got[key])), key


def _wandb_records(path: str) -> Iterator[Any]:
    """The records of a W&B offline run file (LevelDB-log framing: 7-byte header, then 32 KiB blocks of chunks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    pos, block, parts = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        parts += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


@pytest.mark.integration
def test_wandb_offline_files_hold_the_run(mirrored: dict[str, Any]) -> None:
    (path,) = glob.glob(str(mirrored["run_dir"] / "wandb" / "offline-run-*" / "run-*.wandb"))
    got: dict[tuple[str, int], float] = {}
    config: dict[str, Any] = {}
    notes = ""
    for record in _wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            step = int(row.pop("_step", record.history.step.num))
            got |= {(name, step): float(v) for name, v in row.items() if not name.startswith("_")}
        elif kind == "run":
            notes = record.run.notes
            config |= {item.key: json.loads(item.value_json) for item in record.run.config.update}
    _same(mirrored["rows"], got)
    run_url = f"{URL}/?run={mirrored['run_id']}"
    assert notes == run_url and config["tunedeck_url"] == run_url
    assert config["report_to"] == "wandb,mlflow,tensorboard,trackio" and config["max_steps"] == 4


@pytest.mark.integration
def test_mlflow_default_store_in_the_data_folder_holds_the_run(mirrored: dict[str, Any]) -> None:
    """No MLFLOW_TRACKING_URI: the run's metrics are in $TUNEDECK_HOME/mlflow.db (the run failed at start before,
    "No module named 'alembic'", or wrote a mlflow.db wherever the worker was started)."""
    from mlflow.tracking import MlflowClient

    assert (mirrored["home"] / "mlflow.db").is_file()
    client = MlflowClient(f"sqlite:///{mirrored['home'] / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tunedeck")
    (run,) = client.search_runs([experiment.experiment_id])
    got = {
        (name, m.step): m.value for name in run.data.metrics for m in client.get_metric_history(run.info.run_id, name)
    }
    _same(mirrored["rows"], got)
    assert run.info.status == "FINISHED"
    assert run.data.tags["tunedeck.url"] == f"{URL}/?run={mirrored['run_id']}"
    assert run.data.params["model"] == mirrored["spec"].model and run.data.params["max_steps"] == "4"


@pytest.mark.integration
def test_tensorboard_event_files_hold_the_run(mirrored: dict[str, Any]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(mirrored["run_dir"] / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    got = {(tag, e.step): e.value for tag in events.Tags()["scalars"] for e in events.Scalars(tag)}
    _same(mirrored["rows"], {key: float(v) for key, v in got.items()})
    texts = {tag: events.Tensors(tag)[0].tensor_proto.string_val[0].decode() for tag in events.Tags()["tensors"]}
    assert texts["tunedeck_url/text_summary"] == f"{URL}/?run={mirrored['run_id']}"
    assert "max_steps: 4" in texts["spec/text_summary"] and texts["status/text_summary"] == "succeeded"


@pytest.mark.integration
def test_trackio_local_store_holds_the_run(mirrored: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from trackio import sqlite_storage

    monkeypatch.setattr(sqlite_storage, "TRACKIO_DIR", mirrored["home"] / "trackio")  # read at trackio's import
    (name,) = sqlite_storage.SQLiteStorage.get_runs("tunedeck")
    got = {
        (key, int(row["step"])): float(value)
        for row in sqlite_storage.SQLiteStorage.get_logs("tunedeck", name)
        for key, value in row.items()
        if key not in ("step", "timestamp") and value is not None
    }
    rows = {key: value for key, value in mirrored["rows"].items() if not math.isnan(value)}  # JSON keeps no NaN
    _same(rows, got)
    config = sqlite_storage.SQLiteStorage.get_run_config("tunedeck", name)
    assert config["tunedeck_url"] == f"{URL}/?run={mirrored['run_id']}" and config["max_steps"] == 4
