"""Files uploaded through the OpenAI-style `/v1/files` API, kept in the uploads folder.

    kept = keep_api_file(reader, "train.jsonl", "fine-tune", limit_bytes)   # ApiFile, or UploadRefused
    api_file("file-3f2a9c01de")      # ApiFile or None
    api_files()                      # newest first

A file is `uploads/api-files/file-<first 10 hex of its SHA-256>.jsonl` (streamed, capped and never left
half-written by `storage.uploads.keep_stream`), its id is that name's stem, and a `.json` beside it keeps
the name the client gave and when it came. The uploads folder is one of the data folders a shared
dashboard reads from (`jobs.checks.access`), so a job can train on the file by its path.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from storage.settings import uploads_dir
from storage.uploads import keep_stream

FOLDER = "api-files"
SUFFIX = ".jsonl"
_ID = re.compile(r"file-[0-9a-f]{10}")


@dataclass(frozen=True)
class ApiFile:
    """One uploaded file: its id, the name it was sent with, its size, when it came and what for."""

    id: str
    filename: str
    bytes: int
    created_at: int
    purpose: str
    path: Path


def files_dir() -> Path:
    path = uploads_dir() / FOLDER
    path.mkdir(parents=True, exist_ok=True)
    return path


def keep_api_file(reader: BinaryIO, filename: str, purpose: str, limit_bytes: int) -> ApiFile:
    """Keep what `reader` gives (UploadRefused past `limit_bytes`); the same content sent again is the same file."""
    path = keep_stream(reader, files_dir(), "file", SUFFIX, limit_bytes, filename)
    meta = path.with_suffix(".json")
    if not meta.exists():
        meta.write_text(json.dumps({"filename": filename, "purpose": purpose, "created_at": int(time.time())}))
    found = api_file(path.stem)
    assert found is not None
    return found


def api_file(file_id: str) -> ApiFile | None:
    """The file of that id, or None (an id not of our form never reaches the disk)."""
    if not isinstance(file_id, str) or not _ID.fullmatch(file_id):
        return None
    path = files_dir() / f"{file_id}{SUFFIX}"
    try:
        meta = json.loads(path.with_suffix(".json").read_text())
        size = path.stat().st_size
    except (OSError, ValueError):
        return None
    return ApiFile(file_id, str(meta["filename"]), size, int(meta["created_at"]), str(meta["purpose"]), path)


def api_files() -> list[ApiFile]:
    """Every kept file, newest first."""
    found = [api_file(p.stem) for p in files_dir().glob(f"file-*{SUFFIX}")]
    return sorted((f for f in found if f is not None), key=lambda f: (f.created_at, f.id), reverse=True)


def delete_api_file(file_id: str) -> bool:
    """Remove the file and its note; False when there was none."""
    found = api_file(file_id)
    if found is None:
        return False
    found.path.unlink(missing_ok=True)
    found.path.with_suffix(".json").unlink(missing_ok=True)
    return True


def file_id_of(ref: str | None) -> str | None:
    """The id of the kept file `ref` (a data set reference) is, or None when it is no such file."""
    path = Path(ref or "")
    if path.suffix != SUFFIX or not _ID.fullmatch(path.stem):
        return None
    return path.stem if path.parent == files_dir() else None
