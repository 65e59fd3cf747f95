"""A zip of one data file and its images, used as a data set: unpacked once, read like the file inside.

`dataset: photos.zip` (a path, or the form's upload) is unpacked under the cache folder
(`$TUNEDECK_HOME/cache/zips/<key>/`, the key from the zip's path, size and modification time, so a changed
zip is unpacked again) and the one data file in it (.jsonl, .json, .csv, .parquet, gzipped JSON too) is
what the checks and the training read; image paths in its rows are relative to that file's folder, as
for any data file. Refused with the reason: a zip that is not one, entries that would land outside the
folder (absolute paths, `..`), an entry that unpacks to over `MAX_RATIO` times its packed size (a zip bomb),
more than `TUNEDECK_MAX_UNPACKED_GB` (default 8) unpacked in all, and no data file or several. The sizes in the
zip's headers are checked first, and what is written is counted while unpacking (headers may lie); a zip
refused halfway leaves nothing behind. Entries are written as plain files (a link in a zip is not followed).

    path = unpacked_data_file(Path("photos.zip"), "dataset", is_data)   # .../cache/zips/ab12.../train.jsonl
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from jobs.errors import Problem, ProblemError

MAX_UNPACKED_ENV = "TUNEDECK_MAX_UNPACKED_GB"
DEFAULT_MAX_UNPACKED_GB = 8.0  # a bound on zip bombs, far above a real image data set
MAX_RATIO = 200  # an entry may unpack to at most this many times its packed size (images: ~1x, text: ~10x)
RATIO_FROM = 2**20  # ... once it unpacks to more than this (a tiny file's ratio means nothing)
CHUNK = 1 << 20
SKIPPED = ("__MACOSX/", ".DS_Store")


class ZipProblem(ProblemError):
    """A zip that cannot be used as a data set (the caller wraps it into its DataError)."""


def max_unpacked_bytes() -> int:
    """Bytes one zip may unpack to in all (`TUNEDECK_MAX_UNPACKED_GB`, default 8)."""
    raw = os.environ.get(MAX_UNPACKED_ENV, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_MAX_UNPACKED_GB
    except ValueError:
        raise ValueError(f"{MAX_UNPACKED_ENV}={raw!r} is not a number of GB: set it to e.g. 8, or unset it") from None
    if not value > 0:
        raise ValueError(f"{MAX_UNPACKED_ENV}={raw!r} must be above 0 GB: set it to e.g. 8, or unset it")
    return int(value * 2**30)


def _problem(field_name: str, ref: str, problem: str, fix: str) -> ZipProblem:
    return ZipProblem([Problem(field_name, f"`{ref}` {problem}", fix)])


def _too_big(field_name: str, ref: str, total: int, limit: int) -> ZipProblem:
    return _problem(
        field_name,
        ref,
        f"would unpack to {total / 2**30:.2f} GiB or more, over the {limit / 2**30:g} GiB limit ({MAX_UNPACKED_ENV})",
        f"shrink the images, unpack it yourself and point dataset at the data file inside, or raise "
        f"{MAX_UNPACKED_ENV} on the server",
    )


def _bomb(field_name: str, ref: str, member: zipfile.ZipInfo) -> ZipProblem:
    return _problem(
        field_name,
        ref,
        f"has an entry ({member.filename}) that unpacks to over {MAX_RATIO} times its packed size "
        f"({member.compress_size} bytes to {member.file_size}): refused as a zip bomb",
        "zip the data file and its images as they are (images barely compress), or give the data file itself",
    )


def _members(archive: zipfile.ZipFile, ref: str, field_name: str) -> list[zipfile.ZipInfo]:
    """The entries to unpack, checked: none outside the folder, none a zip bomb, the total within the limit."""
    members = [m for m in archive.infolist() if not m.is_dir() and not any(s in m.filename for s in SKIPPED)]
    for member in members:
        parts = PurePosixPath(member.filename.replace("\\", "/")).parts
        if member.filename.startswith(("/", "\\")) or ".." in parts or (parts and ":" in parts[0]):
            raise _problem(
                field_name,
                ref,
                f"has an entry outside its folder ({member.filename})",
                "zip the data file and images with relative paths",
            )
        if member.file_size > RATIO_FROM and member.file_size > MAX_RATIO * max(member.compress_size, 1):
            raise _bomb(field_name, ref, member)
    total, limit = sum(m.file_size for m in members), max_unpacked_bytes()
    if total > limit:
        raise _too_big(field_name, ref, total, limit)
    return members


def _unpack(archive: zipfile.ZipFile, members: list[zipfile.ZipInfo], folder: Path, ref: str, field_name: str) -> None:
    """Each entry written under `folder` in chunks, counting what comes out (a header's sizes may lie)."""
    limit, written = max_unpacked_bytes(), 0
    for member in members:
        target = folder / PurePosixPath(member.filename.replace("\\", "/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        out = 0
        with archive.open(member) as reader, target.open("wb") as writer:
            while chunk := reader.read(CHUNK):
                out, written = out + len(chunk), written + len(chunk)
                if written > limit:
                    raise _too_big(field_name, ref, written, limit)
                if out > RATIO_FROM and out > MAX_RATIO * max(member.compress_size, 1):
                    raise _bomb(field_name, ref, member)
                writer.write(chunk)


def _data_file(members: list[zipfile.ZipInfo], ref: str, field_name: str, is_data: Callable[[Path], bool]) -> str:
    found = [m.filename for m in members if is_data(Path(m.filename))]
    if len(found) != 1:
        names = ", ".join(found[:5]) if found else "none"
        raise _problem(
            field_name,
            ref,
            f"holds {len(found)} data files ({names}); it needs exactly one",
            "zip one data file (.jsonl, .json, .csv or .parquet) with its images, their paths relative to that file",
        )
    return found[0]


def _sweep(root: Path, stale_s: float = 3600) -> None:
    """Remove the half-unpacked folders of a killed process (untouched for `stale_s`)."""
    now = time.time()
    for entry in root.glob(".unpack-*"):
        try:
            if entry.is_dir() and now - entry.stat().st_mtime > stale_s:
                shutil.rmtree(entry, ignore_errors=True)
        except FileNotFoundError:
            continue


def _key(path: Path) -> str:
    stat = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]


def unpacked_data_file(path: Path, field_name: str, is_data: Callable[[Path], bool], root: Path | None = None) -> Path:
    """The data file inside zip `path` (the one entry `is_data`), unpacked once under `root` (default: the cache
    folder's `zips`); ZipProblem when the zip cannot be used."""
    if root is None:
        from storage.settings import cache_dir

        root = cache_dir() / "zips"
    ref = path.name
    try:
        with zipfile.ZipFile(path) as archive:
            members = _members(archive, ref, field_name)
            inside = _data_file(members, ref, field_name, is_data)
            dest = root / _key(path)
            if not (dest / inside).is_file():
                root.mkdir(parents=True, exist_ok=True)
                _sweep(root)
                tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=root))
                try:
                    _unpack(archive, members, tmp, ref, field_name)
                    if dest.exists():  # unpacked by another process meanwhile
                        shutil.rmtree(tmp)
                    else:
                        os.rename(tmp, dest)
                except BaseException:
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as exc:
        raise _problem(field_name, ref, f"is not a readable zip file ({exc})", "zip it again") from exc
    return dest / inside
