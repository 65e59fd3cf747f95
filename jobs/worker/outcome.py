"""How a run ended, as the worker records it: what the child could not record itself.

    record_end(store, 7, returncode=-9, why=None, log_path=...)  # still 'running': failed, "killed by signal SIGKILL (9)"
    describe_exit(-9)      # 'training process killed by signal SIGKILL (9)'

The child marks its run succeeded, failed or cancelled; when it dies while its run is still
`running`, the run is marked failed with the signal or exit code and the end of its log.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from pathlib import Path

from storage.errors import StorageError
from storage.models import RunStatus
from storage.roles import RunEnding
from storage.run_files import log_tail
from storage.store import RunFolderError

log = logging.getLogger(__name__)


def describe_exit(returncode: int) -> str:
    """'training process killed by signal SIGKILL (9)' or 'training process exited with code N'."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"training process killed by signal {name} ({-returncode})"
    return f"training process exited with code {returncode}"


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (at most 300 characters), for a log line."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def quietly(fn: Callable[..., object], *args: object) -> None:
    """A bookkeeping write that must not stop the worker: logged when the database fails."""
    try:
        fn(*args)
    except StorageError as exc:
        log.error("%s failed: %s", getattr(fn, "__name__", fn), first_line(exc))


def run_status(store: RunEnding, run_id: int) -> RunStatus:
    """The run's status now (a deleted run counts as failed)."""
    current = store.get_run(run_id)
    return current.status if current else RunStatus.FAILED


def record_end(store: RunEnding, run_id: int, returncode: int, why: str | None, log_path: Path) -> RunStatus:
    """Record the child's exit: its code; `why` "cancel" marks the run cancelled; a run still running failed."""
    store.set_exit_code(run_id, returncode)
    if why == "cancel":
        store.mark_cancelled(run_id, exit_code=returncode)
    current = store.get_run(run_id)
    if current is not None and current.status is RunStatus.RUNNING:
        summary = describe_exit(returncode)
        if returncode == 0:
            summary += " without reporting a result"
        store.mark_failed(run_id, summary, log_tail(log_path), exit_code=returncode)
    status = run_status(store, run_id)
    log.info("run %s: %s (%s)", run_id, status.value if status else "deleted", describe_exit(returncode))
    return status


def saving_checkpoint(store: RunEnding, run_id: int) -> bool:
    """Whether the run has a checkpoint folder that is not complete yet (being written)."""
    from storage.checkpoints import checkpoint_dirs, is_complete

    try:
        return any(not is_complete(path) for _, path in checkpoint_dirs(store.run_dir(run_id) / "output"))
    except (OSError, RunFolderError):
        return False
