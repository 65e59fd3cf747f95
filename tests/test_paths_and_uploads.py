"""Issue 48: every path a restricted user names lies under the data folders (one message whether the file
exists or not), and uploads are streamed, capped and never left half-written; zips are bounded."""

from __future__ import annotations

import json
import os
import time
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import gradio as gr
import pytest

from jobs.checks.access import AccessPolicy
from jobs.checks.pipeline import check
from jobs.spec.job import JobSpec
from storage.data_folders import reading_only_under, under_folders
from storage.settings import uploads_dir

OUTSIDE_WORDS = "outside this shared server's data folders"


def draw(path: Path) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (16, 16), (200, 30, 30)).save(path)
    return path


def image_rows(path: Path, image: str, n: int = 4) -> Path:
    row = {
        "messages": [{"role": "user", "content": "<image>What colour?"}, {"role": "assistant", "content": "red"}],
        "images": [image],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(row) for _ in range(n)) + "\n")
    return path


@pytest.fixture
def login(data_home: Path, monkeypatch: pytest.MonkeyPatch) -> AccessPolicy:
    monkeypatch.delenv("TUNEDECK_DATA_DIRS", raising=False)
    return AccessPolicy.for_server(login=True)


@pytest.fixture
def outside(tmp_path: Path) -> dict[str, Path]:
    """An outside folder with a picture, a file that is no picture, and a name that does not exist."""
    folder = tmp_path / "elsewhere"
    (folder / "notes.txt").parent.mkdir(parents=True, exist_ok=True)
    (folder / "notes.txt").write_text("a secret, not an image")
    return {"image": draw(folder / "secret.png"), "text": folder / "notes.txt", "missing": folder / "nothing.png"}


def spell(how: str, target: Path) -> str:
    """An image reference in a row of a file in the uploads folder naming `target`."""
    if how == "file-url":
        return target.as_uri()
    if how == "relative":
        return os.path.relpath(target, uploads_dir())
    if how == "absolute":
        return str(target)
    link = uploads_dir() / "pics" / f"link-{target.name}"  # a link inside, pointing out (dangling when missing)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return f"pics/{link.name}"


def preview_of(image: str, policy: AccessPolicy) -> tuple[str, Any]:
    from app.ui.data import preview_dataset

    data = image_rows(uploads_dir() / "rows.jsonl", image)  # one name: the texts compare whole
    return preview_dataset(str(data), "sft", policy=policy)


@pytest.mark.parametrize("how", ["file-url", "relative", "absolute", "symlink"])
def test_an_image_outside_the_data_folders_reads_the_same_whether_it_exists_or_not(
    login: AccessPolicy, outside: dict[str, Path], how: str
) -> None:
    """Before: the preview showed the outside picture as a thumbnail, a non-image gave "not a readable image"
    and a missing one "does not exist"."""
    texts, problems = {}, {}
    for kind, target in outside.items():
        text, rows = preview_of(spell(how, target), login)
        assert OUTSIDE_WORDS in text and "upload the images with the data" in text, (kind, text)
        assert rows.empty and "<img" not in text, kind
        texts[kind] = text
        # The launch check says the same, before anything is opened.
        found = check(JobSpec(dataset=str(uploads_dir() / "rows.jsonl")), policy=login).problems
        problems[kind] = [(p.field, p.problem, p.fix) for p in found]
    assert texts["image"] == texts["text"] == texts["missing"]
    assert problems["image"] == problems["text"] == problems["missing"]
    assert OUTSIDE_WORDS in problems["image"][0][1]


def test_an_image_inside_the_data_folders_still_shows(login: AccessPolicy, outside: dict[str, Path]) -> None:
    draw(uploads_dir() / "pics" / "red.png")
    text, rows = preview_of("pics/red.png", login)
    assert text.startswith("Detected format") and '<img src="data:image/png' in rows.iloc[0]["images"]
    text, rows = preview_of(str(outside["image"]), AccessPolicy.for_server(login=False))  # no login: every path
    assert text.startswith("Detected format") and "<img" in rows.iloc[0]["images"]


def test_a_link_inside_pointing_inside_is_read(login: AccessPolicy) -> None:
    real = draw(uploads_dir() / "store" / "red.png")
    (uploads_dir() / "pics").mkdir(parents=True, exist_ok=True)
    (uploads_dir() / "pics" / "alias.png").symlink_to(real)
    text, _ = preview_of("pics/alias.png", login)
    assert text.startswith("Detected format"), text


def zipped(path: Path, rows: str, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("data/train.jsonl", rows)
        for name, content in files.items():
            zf.writestr(name, content)
    return path


def rows_text(image: str) -> str:
    row = {
        "messages": [{"role": "user", "content": "<image>What?"}, {"role": "assistant", "content": "red"}],
        "images": [image],
    }
    return "\n".join(json.dumps(row) for _ in range(4))


def test_images_a_zip_names_outside_itself_read_the_same_whether_they_exist_or_not(
    login: AccessPolicy, outside: dict[str, Path]
) -> None:
    from app.ui.data import preview_dataset

    picture = draw(uploads_dir().parent / "scratch" / "red.png").read_bytes()
    texts = {}
    for kind, target in outside.items():
        for name, image in (("abs", str(target)), ("up", "../../../../../../../../.." + str(target))):
            archive = zipped(uploads_dir() / f"{kind}-{name}.zip", rows_text(image), {"data/pics/red.png": picture})
            text, rows = preview_dataset(str(archive), "sft", policy=login)
            assert OUTSIDE_WORDS in text and rows.empty, text
            texts[(kind, name)] = text.replace(archive.name, "ZIP")
    assert len(set(texts.values())) == 1  # existing, non-image and missing read alike, however spelled
    good = zipped(uploads_dir() / "good.zip", rows_text("pics/red.png"), {"data/pics/red.png": picture})
    text, rows = preview_dataset(str(good), "sft", policy=login)
    assert text.startswith("Detected format") and "<img" in rows.iloc[0]["images"], text


def test_a_model_folder_outside_reads_the_same_whether_it_exists_or_not(
    login: AccessPolicy, outside: dict[str, Path], tmp_path: Path
) -> None:
    """Before: `model:` with an outside folder said "not a model folder: no config.json" when it existed and
    "does not exist" when it did not."""
    from app.ui.data import preview_with_lengths

    existing = tmp_path / "models" / "private"
    existing.mkdir(parents=True)
    (existing / "config.json").write_text(json.dumps({"model_type": "llava"}))
    draw(uploads_dir() / "pics" / "red.png")
    data = str(image_rows(uploads_dir() / "rows.jsonl", "pics/red.png"))
    seen = {}
    for kind, ref in (("folder", existing), ("file", outside["text"]), ("missing", tmp_path / "models" / "gone")):
        for spelled in (
            str(ref),
            os.path.relpath(ref, Path.cwd()),
            f"{uploads_dir()}/../../../{ref.relative_to(tmp_path)}",
        ):
            problems = check(JobSpec(model=spelled, dataset=data), policy=login).problems
            assert [p.field for p in problems] == ["model"], problems
            seen[(kind, spelled)] = problems[0].problem.replace(spelled, "REF") + problems[0].fix
            text, _ = preview_with_lengths(data, "sft", spelled, 512, policy=login)
            assert "vision-language" not in text and OUTSIDE_WORDS in text
    assert len(set(seen.values())) == 1 and OUTSIDE_WORDS in next(iter(seen.values()))
    inside = uploads_dir() / "models" / "mine"
    assert login.model_problem(str(inside)) is None and login.model_problem("org/name") is None
    assert login.model_problem("tiny-llama") is None
    assert AccessPolicy.for_server(login=False).model_problem(str(existing)) is None


def test_a_hub_shaped_name_is_never_read_as_a_folder_outside(
    login: AccessPolicy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`org/name` that happens to be a folder under the server's working directory: read as a hub id for a
    restricted user, so an existing folder and a missing one give the same answer."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "etc" / "found").mkdir(parents=True)
    (tmp_path / "etc" / "found" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    answers = {
        name: [
            (p.field, p.problem.replace(name, "REF"), p.fix.replace(name, "REF"))
            for p in check(JobSpec(model=name), policy=login).problems
        ]
        for name in ("etc/found", "etc/gone")
    }
    assert answers["etc/found"] == answers["etc/gone"], answers
    assert not any("safetensors" in p for _, p, _ in answers["etc/found"])


def test_under_folders_resolves_dots_and_links_without_asking_if_the_file_exists(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "out").symlink_to(tmp_path)
    assert under_folders(root / "a" / "missing.png", [root])
    assert not under_folders(root / "a" / ".." / ".." / "x.png", [root])
    assert not under_folders(root / "out" / "x.png", [root])
    with reading_only_under([root]):
        from storage.data_folders import readable

        assert readable(root / "a" / "b.png") and not readable(tmp_path / "b.png")
    assert readable(tmp_path / "b.png")


# ---------------------------------------------------------------------- uploads
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


def test_a_hub_shaped_data_name_reads_the_same_whether_a_file_of_that_name_exists_or_not(
    login: AccessPolicy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: `team/notes` that was a file under the server's working directory was refused as outside the
    data folders, and a missing one was looked up on the hub."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "notes").write_text("a secret")
    answers = {
        name: [(p.field, p.problem.replace(name, "REF"), p.fix.replace(name, "REF")) for p in found]
        for name in ("team/notes", "team/gone")
        for found in [check(JobSpec(dataset=name), policy=login).problems]
    }
    assert answers["team/notes"] == answers["team/gone"], answers


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


def test_the_form_memory_panel_never_reads_a_model_folder_outside(login: AccessPolicy, tmp_path: Path) -> None:
    """The launch form's memory panel predicts from the model's config.json: for a restricted user an outside
    folder gives the same panel whether it exists or not (unguarded, the two differ)."""
    from app.ui import form as ui_form
    from app.ui import memory as ui_memory
    from app.ui.data import policed_specs

    existing = tmp_path / "models" / "private"
    existing.mkdir(parents=True)
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    config |= {"num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000, "max_position_embeddings": 512}
    (existing / "config.json").write_text(json.dumps(config))
    missing = tmp_path / "models" / "gone"

    def panel(read: Any, ref: Path) -> str:
        return ui_memory.memory_views(read, ui_form.NAMES, *ui_form.form_values(JobSpec(model=str(ref))))[0]

    open_panels = {ref: panel(ui_form.spec_from_form, ref) for ref in (existing, missing)}
    assert open_panels[existing] != open_panels[missing]  # what an open dashboard shows: the file is read
    guarded = policed_specs(ui_form.spec_from_form, login)
    assert panel(guarded, existing) == panel(guarded, missing)
