"""A zip of one data file and its images, used as a data set: unpacked once, read like the file inside.

`dataset: photos.zip` (a path, or the form's upload) is unpacked under the cache folder
(`$TUNEDECK_HOME/cache/zips/<key>/`, the key from the zip's path, size and modification time, so a changed
zip is unpacked again) and the one data file in it (.jsonl, .json, .csv, .parquet, gzipped JSON too) is
what the checks and the training read; image paths in its rows are relative to that file's folder, as
for any data file. Refused with the reason: a zip that is not one, entries that would land outside the
folder (absolute paths, `..`), more than `MAX_UNPACKED` bytes unpacked, and no data file or several.

    path = unpacked_data_file(Path("photos.zip"), "dataset", is_data)   # .../cache/zips/ab12.../train.jsonl
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from jobs.errors import Problem, ProblemError

MAX_UNPACKED = 8 * 2**30  # bytes a zip may unpack to: a bound on zip bombs, far above a real image data set
SKIPPED = ("__MACOSX/", ".DS_Store")


class ZipProblem(ProblemError):
    """A zip that cannot be used as a data set (the caller wraps it into its DataError)."""


def _problem(field_name: str, ref: str, problem: str, fix: str) -> ZipProblem:
    return ZipProblem([Problem(field_name, f"`{ref}` {problem}", fix)])


def _members(archive: zipfile.ZipFile, ref: str, field_name: str) -> list[zipfile.ZipInfo]:
    """The entries to unpack, checked: none outside the folder, the total within MAX_UNPACKED."""
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
    total = sum(m.file_size for m in members)
    if total > MAX_UNPACKED:
        raise _problem(
            field_name,
            ref,
            f"would unpack to {total / 2**30:.1f} GiB, over the {MAX_UNPACKED / 2**30:.0f} GiB limit",
            "shrink the images, or unpack it yourself and point dataset at the data file inside",
        )
    return members


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
                tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=root))
                try:
                    for member in members:
                        archive.extract(member, tmp)
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
