"""A run's files on disk: how much room each run takes, and removing a deleted run's folder.

Everything a run writes lives in its folder (`Store.run_path`: `runs/<database id>/<id>/` under the
data directory: training log,
checkpoints, output, bundle folder and zip), so a run's disk use is that folder's size and
deleting a run removes that folder and nothing else (uploaded data sets are shared by runs and
stay). Sizes are allocated bytes, what `du` reports; symlinks are counted as links, never followed.

    usage = DiskUsage(store)
    usage.of(run)            # bytes; cached for finished runs (their folders no longer change)
    total_bytes(store)       # this database's runs folder, including folders no run row points to
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

from storage.records import RunRecord
from storage.roles import RunFolders

LOG_TAIL_LINES = 40  # what a failed run's detail and the run page show of a log


def log_tail(path: Path | str | None, lines: int = LOG_TAIL_LINES) -> str | None:
    """The last lines of a log file (a run's train.log, a cluster job's engine.log; reads at most its last 64 KiB)."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    return "\n".join(text.splitlines()[-lines:]) or None


def _entry_bytes(st: os.stat_result) -> int:
    blocks = getattr(st, "st_blocks", None)
    return blocks * 512 if blocks is not None else st.st_size


def folder_bytes(path: Path) -> int:
    """Bytes allocated to everything under `path` (0 when it does not exist)."""
    total = 0
    stack = [path]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        for entry in entries:
            try:
                total += _entry_bytes(entry.stat(follow_symlinks=False))
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
            except FileNotFoundError:  # removed while we walked (a checkpoint rotated away)
                continue
    return total


def run_bytes(store: RunFolders, run_id: int) -> int:
    return folder_bytes(store.run_path(run_id))


def total_bytes(store: RunFolders) -> int:
    """Everything under this database's runs folder."""
    return folder_bytes(store.runs_root)


def remove_run_folder(store: RunFolders, run_id: int) -> Path | None:
    """Remove the run's folder (only that folder); returns it, or None when there was none. OSError on failure."""
    path = store.run_path(run_id)
    runs_dir = store.runs_root
    if path.is_symlink():  # never follow a link out of the data directory: remove the link itself
        path.unlink()
        return path
    if not path.exists():
        return None
    if path.resolve().parent != runs_dir.resolve():
        raise OSError(f"{path} is not a run folder inside {runs_dir}; not removed")
    shutil.rmtree(path)
    return path


class DiskUsage:
    """Per-run disk use for views that refresh often: a finished run's size is measured once."""

    def __init__(self, store: RunFolders) -> None:
        self.store = store
        self._finished: dict[int, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def of(self, run: RunRecord) -> int:
        if not run.status.finished or run.finished_at is None:
            return run_bytes(self.store, run.id)
        with self._lock:
            hit = self._finished.get(run.id)
        if hit is not None and hit[0] == run.finished_at:
            return hit[1]
        size = run_bytes(self.store, run.id)
        with self._lock:
            self._finished[run.id] = (run.finished_at, size)
        return size

    def forget(self, run_id: int) -> None:
        with self._lock:
            self._finished.pop(run_id, None)
