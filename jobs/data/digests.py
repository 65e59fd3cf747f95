"""Content digests of files (data sets, tokenizer files), hashed once per version of the file.

The length cache (`jobs.data.tokens.measurement`) is keyed by the contents of the data file, and hashing a
100k-row JSONL file (~100 MB) takes ~0.2-0.4 s, longer than everything else a cache hit does. So each
digest is remembered next to the file's stat: device, inode, size, mtime_ns and ctime_ns, in
the cache folder's `digests/` (`storage.settings.cache_dir`; one small JSON file per path) and in this process. While all five
are unchanged the file is taken to hold the same bytes and is not read again.

The trade-off: a change the stat does not show is missed. Every write moves mtime and ctime, and no
user process can set ctime back (`touch -d` and `os.utime` set mtime only); but the kernel stamps
files with a coarse clock (a few ms), so a same-size rewrite within one tick of the write before it
keeps both. As in git's "racy" index check, a digest is therefore remembered only for a file last
changed more than RACY_NS ago: a later rewrite, however quick, gets a later tick. What is left is a
file system that does not keep ctime (some network or FUSE mounts). Copying or replacing a file
gives it a new inode or ctime: hashed again.

    digest = file_digest(path)       # bytes: sha256 of the contents
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

RACY_NS = 2_000_000_000  # a file changed more recently than this is hashed again at every look
_MEMO: dict[tuple[str, tuple[int, ...]], bytes] = {}


def _stat_key(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def file_digest(path: Path, memo_dir: Path | None = None) -> bytes:
    """sha256 of the file's bytes; read only when the file's stat changed since the last digest.
    `memo_dir`: where digests are remembered across processes (default: `digests/` in `storage.settings.cache_dir()`)."""
    path = Path(path).resolve()
    stat = _stat_key(path.stat())
    key = (str(path), stat)
    if key in _MEMO:
        return _MEMO[key]
    folder = memo_dir if memo_dir is not None else _memo_dir()
    note = folder / f"{hashlib.sha256(str(path).encode()).hexdigest()[:32]}.json"
    digest = _remembered(note, str(path), stat)
    if digest is not None:
        _MEMO[key] = digest
        return digest
    digest = hash_file(path)
    settled = time.time_ns() - max(stat[3], stat[4]) > RACY_NS
    if settled and _stat_key(path.stat()) == stat:  # old enough, and not written while it was read
        _remember(note, str(path), stat, digest)
        _MEMO[key] = digest
    return digest


def hash_file(path: Path) -> bytes:
    """sha256 of the file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.digest()


def _remembered(note: Path, path: str, stat: tuple[int, ...]) -> bytes | None:
    try:
        data = json.loads(note.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        log.warning("unreadable digest note %s: hashing again", note, exc_info=True)
        return None
    if not isinstance(data, dict) or data.get("path") != path or data.get("stat") != list(stat):
        return None
    try:
        return bytes.fromhex(data["sha256"])
    except (KeyError, TypeError, ValueError):
        return None


def _remember(note: Path, path: str, stat: tuple[int, ...], digest: bytes) -> None:
    note.parent.mkdir(parents=True, exist_ok=True)
    partial = note.with_name(f"{note.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps({"path": path, "stat": list(stat), "sha256": digest.hex()}))
    partial.replace(note)  # whole or not at all: another process may read it at the same time


def _memo_dir() -> Path:
    from storage.settings import cache_dir

    return cache_dir() / "digests"
