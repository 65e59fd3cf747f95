"""An uploaded file kept in the uploads folder: streamed in 1 MiB chunks, capped, never left half-written.

    kept = keep_upload(Path("/tmp/gradio/ab/train.jsonl"), uploads_dir(), "train", ".jsonl", 1024 * 2**20)
    # uploads/train-3f2a9c01de.jsonl (named by its content's SHA-256), or UploadRefused naming the limit

The copy is written to a `.partial-*` file beside its final name and renamed into place once whole, so a
reader never sees half a file; any failure (the cap, a full disk, the process stopped) removes it, and
partial files left by a killed process (ours, or the temp files of Gradio's own upload parser, which keeps
a cut upload's part) are swept when the dashboard starts (`app.server.serve`) and at the next upload, once
untouched for `STALE_S`. Memory stays at one chunk whatever the file's size.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

CHUNK = 1 << 20
PARTIAL_PREFIX = ".partial-"
STALE_S = 15 * 60  # a partial file nobody has written to for this long belongs to a killed upload
MAX_UPLOAD_ENV = "TUNEDECK_MAX_UPLOAD_MB"


class UploadRefused(ValueError):
    """The upload was not kept; the message names the limit and how to change it. Nothing was left behind."""


def too_big(name: str, size: int, limit_bytes: int) -> UploadRefused:
    return UploadRefused(
        f"{name} is {size / 2**20:.0f} MB or more, over the {limit_bytes / 2**20:.0f} MB upload limit. "
        f"Fix: raise {MAX_UPLOAD_ENV} on the server, or point the dataset field at the file's path on the server"
    )


def keep_upload(src: Path, folder: Path, stem: str, suffix: str, limit_bytes: int) -> Path:
    """`src` copied into `folder` as `<stem>-<first 10 hex of its SHA-256><suffix>` (kept as is when already there)."""
    size = src.stat().st_size
    if size > limit_bytes:  # refused before a byte is copied
        raise too_big(src.name, size, limit_bytes)
    with src.open("rb") as reader:
        return keep_stream(reader, folder, stem, suffix, limit_bytes, src.name)


def keep_stream(reader: BinaryIO, folder: Path, stem: str, suffix: str, limit_bytes: int, name: str) -> Path:
    """What `reader` gives, kept as `keep_upload` keeps a file (`name`: the file's name in a refusal)."""
    sweep_partials(folder)
    digest = hashlib.sha256()
    fd, partial_name = tempfile.mkstemp(prefix=PARTIAL_PREFIX, dir=folder)
    partial = Path(partial_name)
    try:
        copied = 0
        with os.fdopen(fd, "wb") as writer:
            while chunk := reader.read(CHUNK):
                copied += len(chunk)
                if copied > limit_bytes:  # the file grew while it was read, or a stream ran past the cap
                    raise too_big(name, copied, limit_bytes)
                digest.update(chunk)
                writer.write(chunk)
        dest = folder / f"{stem}-{digest.hexdigest()[:10]}{suffix}"
        if dest.exists():
            partial.unlink()
        else:
            os.replace(partial, dest)
        return dest
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def sweep_partials(*folders: Path, stale_s: float = STALE_S) -> list[Path]:
    """Remove the partial files of killed uploads in `folders` (and Gradio's upload folder) untouched for
    `stale_s`; the paths removed."""
    now, removed = time.time(), []
    for folder in (*folders, gradio_upload_dir()):
        if folder is None or not folder.is_dir():
            continue
        for entry in folder.iterdir():
            if not _partial_name(entry.name, folder in folders):
                continue
            try:
                if entry.is_file() and not entry.is_symlink() and now - entry.stat().st_mtime > stale_s:
                    entry.unlink()
                    removed.append(entry)
            except FileNotFoundError:  # finished or swept by another process meanwhile
                continue
    return removed


def _partial_name(name: str, ours: bool) -> bool:
    """Ours start `.partial-`; Gradio's upload parser writes each part to a `tmp*` file directly in its folder
    (a whole upload is moved into a subfolder, so one left at the top is a cut one)."""
    return name.startswith(PARTIAL_PREFIX) if ours else name.startswith("tmp")


def gradio_upload_dir() -> Path | None:
    """Where Gradio's upload parser writes (`GRADIO_TEMP_DIR`, else `<tmp>/gradio`); None when it does not exist."""
    raw = os.environ.get("GRADIO_TEMP_DIR", "").strip()
    folder = Path(raw) if raw else Path(tempfile.gettempdir()) / "gradio"
    return folder if folder.is_dir() else None
