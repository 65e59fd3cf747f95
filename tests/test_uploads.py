"""Issue 48: uploads streamed to disk in chunks, capped (TUNEDECK_MAX_UPLOAD_MB), never left half-written
(partial files removed on failure, swept at start-up and the next upload); zips bounded per entry (a ratio)
and in all (TUNEDECK_MAX_UNPACKED_GB); the preview of a big file reads only its first rows."""

from __future__ import annotations

import json
import os
import time
import tracemalloc
import zipfile
from pathlib import Path

import gradio as gr
import pytest

from jobs.checks.pipeline import check
from jobs.spec.job import JobSpec
from storage.settings import uploads_dir
from tests.path_helpers import image_rows, rows_text, zipped


def test_an_upload_over_the_cap_is_refused_and_leaves_no_file(
    data_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.ui.data import store_upload

    monkeypatch.setenv("TUNEDECK_MAX_UPLOAD_MB", "1")
    big = tmp_path / "big.jsonl"
    big.write_bytes(b"x" * (2 * 2**20))
    with pytest.raises(gr.Error) as err:
        store_upload(str(big))
    assert "TUNEDECK_MAX_UPLOAD_MB" in str(err.value.message) and "1 MB upload limit" in str(err.value.message)
    assert list(uploads_dir().iterdir()) == []


def test_an_upload_that_grows_past_the_cap_while_copied_is_refused_and_leaves_no_file(
    data_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The size is counted as the copy streams, not only asked of the file first: a pipe says 0 bytes."""
    import threading

    from app.ui.data import store_upload

    monkeypatch.setenv("TUNEDECK_MAX_UPLOAD_MB", "1")
    pipe = tmp_path / "growing.jsonl"
    os.mkfifo(pipe)

    def write() -> None:
        try:
            with pipe.open("wb") as fh:
                for _ in range(3):
                    fh.write(b"z" * 2**20)
        except BrokenPipeError:  # the copy stopped reading at the cap
            pass

    writer = threading.Thread(target=write, daemon=True)  # never left blocking the run if nothing opens the pipe
    writer.start()
    try:
        with pytest.raises(gr.Error) as err:
            store_upload(str(pipe))
    finally:
        writer.join(60)
    assert "TUNEDECK_MAX_UPLOAD_MB" in str(err.value.message)
    assert list(uploads_dir().iterdir()) == []


def test_a_failed_copy_leaves_no_partial_file(data_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.ui.data import store_upload

    src = image_rows(tmp_path / "rows.jsonl", "x.png")

    def full_disk(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("storage.uploads.os.replace", full_disk)
    with pytest.raises(OSError):
        store_upload(str(src))
    assert list(uploads_dir().iterdir()) == []


def test_partial_files_of_killed_uploads_are_swept_at_the_next_upload(
    data_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.ui.data import store_upload

    gradio_dir = tmp_path / "gradio"
    gradio_dir.mkdir()
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(gradio_dir))
    hour_ago = time.time() - 3600
    stale = [uploads_dir() / ".partial-killed", gradio_dir / "tmpkilled"]
    fresh = [uploads_dir() / ".partial-writing", gradio_dir / "tmpwriting"]
    for path in stale + fresh:
        path.write_bytes(b"half")
    for path in stale:
        os.utime(path, (hour_ago, hour_ago))
    kept = store_upload(str(image_rows(tmp_path / "rows.jsonl", "x.png")))
    assert kept.is_file() and kept.parent == uploads_dir()
    assert not any(p.exists() for p in stale) and all(p.exists() for p in fresh)


def test_the_save_path_streams_a_big_upload(data_home: Path, tmp_path: Path) -> None:
    """Before: `src.read_bytes()` held the whole file (50 MiB here) to hash it."""
    from app.ui.data import store_upload

    src = tmp_path / "big.jsonl"
    line = json.dumps({"text": "y" * 1000}) + "\n"
    with src.open("w") as fh:
        for _ in range(50 * 2**20 // len(line)):
            fh.write(line)
    tracemalloc.start()
    try:
        kept = store_upload(str(src))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert kept.stat().st_size == src.stat().st_size
    assert peak < 4 * 2**20, f"peak {peak / 2**20:.1f} MiB"


def test_the_preview_of_a_big_file_reads_only_its_first_rows(data_home: Path) -> None:
    from app.ui.data import PARTLY_READ, PREVIEW_ROWS, preview_dataset

    row = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
    path = uploads_dir() / "many.jsonl"
    path.write_text((row + "\n") * (PREVIEW_ROWS + 500) + "{ a broken last line\n")
    text, rows = preview_dataset(str(path), "sft")
    assert text.startswith("Detected format") and PARTLY_READ in text and len(rows) == 5, text
    assert f"{PREVIEW_ROWS} rows" in text
    problems = check(JobSpec(dataset=str(path))).problems  # the launch reads every row
    assert any("not valid JSON" in p.problem for p in problems), problems


def bomb(path: Path, zeros: int) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("data/train.jsonl", rows_text("pics/zeros.png"))
        with zf.open("data/pics/zeros.png", "w") as entry:
            block = bytes(2**20)
            for _ in range(zeros // 2**20):
                entry.write(block)
    return path


def test_a_zip_bomb_is_refused_and_leaves_nothing(
    data_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.ui.data import preview_dataset, store_upload
    from storage.settings import cache_dir

    monkeypatch.setenv("TUNEDECK_CACHE_DIR", str(tmp_path / "cache"))
    archive = bomb(tmp_path / "bomb.zip", 64 * 2**20)
    assert archive.stat().st_size < 2**20
    kept = store_upload(str(archive))
    text, rows = preview_dataset(str(kept), "sft")
    assert "zip bomb" in text and rows.empty, text
    assert not any((cache_dir() / "zips").rglob("*"))


def test_a_zip_over_the_unpacked_quota_is_refused_naming_the_variable(
    data_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.ui.data import preview_dataset
    from storage.settings import cache_dir

    monkeypatch.setenv("TUNEDECK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TUNEDECK_MAX_UNPACKED_GB", "0.001")  # about 1 MiB
    noise = os.urandom(2 * 2**20)  # incompressible: no ratio problem, only the total
    archive = zipped(uploads_dir() / "big.zip", rows_text("pics/noise.png"), {"data/pics/noise.png": noise})
    text, rows = preview_dataset(str(archive), "sft")
    assert "TUNEDECK_MAX_UNPACKED_GB" in text and rows.empty, text
    assert not any((cache_dir() / "zips").rglob("*"))


def test_a_cut_upload_to_a_real_dashboard_leaves_a_temp_file_that_the_next_start_sweeps(tmp_path: Path) -> None:
    """Gradio's upload parser keeps the part of an upload whose client went away; such a file, untouched for
    longer than `storage.uploads.STALE_S`, is removed when the dashboard starts (and at each upload)."""
    import socket
    import urllib.parse

    from tests.test_security import _start, _stop

    home = tmp_path / "home"
    home.mkdir()
    incoming = home / "uploads" / "incoming"  # the dashboard's GRADIO_TEMP_DIR (app.server.gradio_temp_dir)
    proc, base, _ = _start(home, tmp_path)
    try:
        port = urllib.parse.urlsplit(base).port
        assert port is not None
        head = (
            b'--XyZ\r\nContent-Disposition: form-data; name="files"; filename="big.jsonl"\r\n'
            b"Content-Type: application/octet-stream\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(
                b"POST /gradio_api/upload HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: multipart/form-data; boundary=XyZ\r\nContent-Length: 104857600\r\n\r\n"
                + head
                + b"x" * 2**18
            )
            deadline = time.monotonic() + 60
            while not any(p.is_file() and p.name.startswith("tmp") for p in incoming.glob("*")):
                assert time.monotonic() < deadline, "the upload never reached the server"
                time.sleep(0.1)
        # the client is gone: the half-written part stays behind
        left = [p for p in incoming.glob("tmp*") if p.is_file()]
        assert left
    finally:
        _stop(proc)
    assert all(p.exists() for p in left)
    hour_ago = time.time() - 3600
    for path in left:
        os.utime(path, (hour_ago, hour_ago))
    proc, _, _ = _start(home, tmp_path)
    _stop(proc)
    assert not any(p.exists() for p in left)
