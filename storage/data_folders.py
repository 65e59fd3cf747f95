"""The one rule for paths a restricted user names: inside the data folders, judged before anything is read.

    under_folders("/data/uploads/../../etc/passwd", [Path("/data/uploads")])   # False
    with reading_only_under(policy_folders):    # a dashboard with a login checks or previews a data set
        ...                                      # readable_folders() is those folders; elsewhere None

A path is judged after `~`, `..` and every symbolic link are resolved (a link inside that points out is
outside), and without asking whether the file exists, so the answer, and any message built on it, is the
same for a missing file and an existing one. `reading_only_under` marks the span of a check or a preview
made for a restricted user: the readers of paths named inside the data (`jobs.data.images` for the images
of rows, the preview's thumbnails) ask `readable_folders()` and refuse what lies outside, whatever the call
path that led there. None (the default: the command line, a dashboard without a login) means every path.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

_READABLE: ContextVar[tuple[Path, ...] | None] = ContextVar("tunedeck_readable_folders", default=None)


def resolved(path: str | Path) -> Path | None:
    """`path` with `~`, `..` and symbolic links resolved (a missing tail kept as written); None when it cannot be."""
    try:
        return Path(path).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):  # a link loop, a NUL byte, an unknown user's `~`
        return None


def under_folders(path: str | Path, folders: Iterable[str | Path]) -> bool:
    """Whether `path`, resolved, lies inside one of `folders` (each resolved too). Never asks whether it exists."""
    where = resolved(path)
    if where is None:
        return False
    for folder in folders:
        root = resolved(folder)
        if root is not None and where.is_relative_to(root):
            return True
    return False


def readable_folders() -> tuple[Path, ...] | None:
    """The folders paths named in data may lie in during this check or preview; None: every path."""
    return _READABLE.get()


@contextmanager
def reading_only_under(folders: Iterable[str | Path]) -> Iterator[tuple[Path, ...]]:
    """Within the block, `readable_folders()` is `folders` (resolved); none of them: nothing is readable."""
    roots = tuple(r for r in (resolved(f) for f in folders) if r is not None)
    token = _READABLE.set(roots)
    try:
        yield roots
    finally:
        _READABLE.reset(token)


@contextmanager
def also_readable(folders: Iterable[str | Path]) -> Iterator[None]:
    """Within the block, `folders` join the readable ones, when a restriction is in force (else nothing changes):
    the unpacked folder of an allowed zip, the bundled samples' folder."""
    current = _READABLE.get()
    if current is None:
        yield
        return
    extra = tuple(r for r in (resolved(f) for f in folders) if r is not None)
    token = _READABLE.set(current + extra)
    try:
        yield
    finally:
        _READABLE.reset(token)


def readable(path: str | Path) -> bool:
    """Whether `path` may be read under the restriction in force (always, without one)."""
    folders = _READABLE.get()
    return folders is None or under_folders(path, folders)
