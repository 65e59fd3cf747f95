"""`tunedeck push`: a finished run's bundle to a hub repository; offline and unreachable hubs give a
clear message at once, the token is never stored or printed (jobs.export.push, app.cli.push)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from app.cli.main import main
from jobs.export.push import PushError, check_repo_id, push, push_folder
from jobs.spec.job import JobSpec

SECRET = "hf_SECRETtokenThatMustNeverBeWritten"


@pytest.fixture
def finished_run(store: Any, tmp_path: Path) -> int:
    run_id = store.create_run(JobSpec())
    store.claim_next_on_device("test", "0")
    bundle = store.run_dir(run_id) / "bundle"
    bundle.mkdir(parents=True)
    (bundle / "adapter_config.json").write_text("{}")
    (bundle / "README.md").write_text("# card\n")
    store.add_artifact(run_id, "adapter", str(bundle), 10, "0" * 64)
    store.mark_succeeded(run_id, {"train_loss": 1.0})
    return run_id


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


@pytest.fixture
def refusing_hub() -> Iterator[tuple[str, list[str]]]:
    """A local stand-in for the hub that answers every request 401; yields its address and the requests seen."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def _refuse(self) -> None:
            seen.append(f"{self.command} {self.path}")
            body = json.dumps({"error": "Invalid credentials in Authorization header"}).encode()
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = _refuse

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def test_offline_mode_is_refused_with_a_clear_message(
    finished_run: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_TOKEN", SECRET)
    assert main(["push", str(finished_run), "--repo", "alice/tag-adapter"]) == 2
    err = capsys.readouterr().err
    assert "hub: the hub is switched off here (HF_HUB_OFFLINE=1); nothing was uploaded" in err
    assert "unset HF_HUB_OFFLINE" in err and SECRET not in err


def test_an_unreachable_hub_is_refused_with_a_clear_message(
    finished_run: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    port = closed_port()
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_TOKEN", SECRET)
    assert main(["push", str(finished_run), "--repo", "alice/tag-adapter"]) == 2
    out = capsys.readouterr()
    assert f"hub: cannot reach http://127.0.0.1:{port} within 5 s" in out.err and "nothing was uploaded" in out.err
    assert SECRET not in out.err + out.out


def test_a_refused_token_is_reported_and_never_stored(
    finished_run: int,
    store: Any,
    data_home: Path,
    refusing_hub: tuple[str, list[str]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    address, seen = refusing_hub
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", address)
    monkeypatch.setenv("HF_HOME", str(data_home / "hf-home"))  # where the hub library would keep a token
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # read once, when first imported
    caplog.set_level("DEBUG")
    with pytest.raises(PushError) as err:
        push(store, finished_run, "alice/tag-adapter", SECRET)
    text = str(err.value)
    assert "the hub refused the push (401" in text and "check the token" in text and SECRET not in text
    assert seen and seen[0].startswith("POST /api/repos/create")  # it did talk to the (stand-in) hub
    assert SECRET not in caplog.text
    assert not store.run_events(finished_run)  # nothing recorded for a push that did not happen
    for path in data_home.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def test_what_to_push_and_where_are_checked_before_any_token(
    store: Any, finished_run: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    assert push_folder(store, finished_run, "bundle").name == "bundle"
    with pytest.raises(PushError, match=f"run `tunedeck export {finished_run} --merged` first"):
        push_folder(store, finished_run, "merged")
    for bad in ("alice", "alice/", "/x", "a/b/c", "al ice/x"):
        with pytest.raises(PushError, match="is not a hub repository id"):
            check_repo_id(bad)
    assert check_repo_id("alice/tag-adapter.v2") == "alice/tag-adapter.v2"
    queued = store.create_run(JobSpec())
    with pytest.raises(PushError, match="is queued; only a finished run has a result to push"):
        push_folder(store, queued, "bundle")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["push", "999", "--repo", "alice/x"]) == 2
    assert "run 999 does not exist" in capsys.readouterr().err


def test_a_hub_that_stops_answering_ends_the_push_with_an_error(
    finished_run: int, store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It accepts the connection and never answers: the command's bounded client gives up (no hang)."""
    import huggingface_hub.constants
    from huggingface_hub.utils import _http

    from app.cli.push import bound_hub_timeouts

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
    bound_hub_timeouts(connect_s=1.0, io_s=1.0)
    try:
        with pytest.raises(PushError, match="failed during the push") as err:
            push(store, finished_run, "alice/tag-adapter", SECRET)
        assert SECRET not in str(err.value)
    finally:
        _http.set_client_factory(_http.default_client_factory)
        silent.close()
    assert not store.run_events(finished_run)
