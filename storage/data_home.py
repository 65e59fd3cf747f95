"""The `./data` folder of an earlier version: found, and moved into the per-user data folder on request.

    legacy_data_dir()        # ./data when it holds a tunedeck database and TUNEDECK_HOME is unset, else None
    migration_hint(legacy)   # what the command line prints: the two ways on, each an exact command
    migrate_data(src, dst)   # move it; `tunedeck migrate-data` (app.cli.manage) calls this

Before, the data folder defaulted to `data` under the current directory (`storage.settings`). Such a
folder is never deleted or ignored silently: every command typed next to it prints the hint, and
the move keeps everything. Artifact and log paths are stored as absolute paths, so the move rewrites
those that pointed into the old folder, and leaves a link in its place for any other (a spec's
dataset path under `data/uploads/`).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from storage.settings import DATABASE_FILE, HOME_ENV, home_setting, user_data_dir

LEGACY_NAME = "data"


class MigrateError(Exception):
    """The move was refused; the message says why and what to do instead. Nothing was changed."""


@dataclass(frozen=True)
class Migrated:
    source: Path
    target: Path
    paths_rewritten: int
    set_aside: Path | None  # a fresh, run-less folder that stood at the target, moved aside
    linked: bool  # a link at the old place points at the new one


def legacy_data_dir(cwd: Path | None = None) -> Path | None:
    """`./data` when it holds a tunedeck database, TUNEDECK_HOME is unset and it is not the user folder itself."""
    if home_setting() is not None:
        return None
    folder = (cwd or Path.cwd()) / LEGACY_NAME
    if folder.is_symlink() or not (folder / DATABASE_FILE).is_file():
        return None  # a link is what a finished move leaves behind
    return None if folder.resolve() == user_data_dir() else folder.resolve()


def migration_hint(legacy: Path) -> str:
    """Two exact commands: move the old folder into the user folder, or keep using it where it is."""
    return (
        f"tunedeck: found the data folder of an earlier version at {legacy}; tunedeck now keeps its data in "
        f"{user_data_dir()} (the runs there are not the ones in {legacy}).\n"
        f"  move it there (keeps every run, file and setting):  tunedeck migrate-data\n"
        f"  or keep using it where it is:  export {HOME_ENV}={shlex.quote(str(legacy))}"
    )


def run_count(folder: Path) -> int:
    """Runs recorded in the folder's SQLite database (0 without one)."""
    db = folder / DATABASE_FILE
    if not db.is_file():
        return 0
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        try:
            return int(conn.execute("SELECT count(*) FROM runs").fetchone()[0])
        except sqlite3.OperationalError:  # no runs table yet
            return 0


def _has_run_files(folder: Path) -> bool:
    return any(p.is_file() for sub in ("runs", "uploads") for p in (folder / sub).rglob("*"))


def migrate_data(source: Path, target: Path | None = None) -> Migrated:
    """Move `source` (an earlier version's ./data) to `target` (default: the user data folder).

    A target that already holds runs is never touched: MigrateError, and nothing moves. A target with a
    database but no runs (a command typed before the move created it) is renamed aside, not deleted.
    """
    source, target = source.resolve(), (target or user_data_dir()).resolve()
    if not (source / DATABASE_FILE).is_file():
        raise MigrateError(f"{source} holds no {DATABASE_FILE}: nothing to move")
    if target == source or target.is_relative_to(source) or source.is_relative_to(target):
        raise MigrateError(f"{source} and {target} overlap: choose another target")
    set_aside = None
    if target.exists() and any(target.iterdir()):
        if run_count(target) or _has_run_files(target):
            raise MigrateError(
                f"{target} already holds runs ({run_count(target)} in its database): nothing was moved. Fix: keep "
                f"using the old folder (export {HOME_ENV}={shlex.quote(str(source))}), or move {target} aside first"
            )
        set_aside = target.with_name(f"{target.name}-before-migrate-{time.strftime('%Y%m%d-%H%M%S')}")
        target.rename(set_aside)
    elif target.exists():
        target.rmdir()
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(source), str(target))
    rewritten = _rewrite_paths(target / DATABASE_FILE, str(source), str(target))
    try:
        os.symlink(target, source, target_is_directory=True)
        linked = True
    except OSError:  # e.g. Windows without the privilege: the rewritten paths still hold
        linked = False
    return Migrated(source, target, rewritten, set_aside, linked)


def _rewrite_paths(db: Path, old: str, new: str) -> int:
    """Point stored absolute paths (run logs, artifacts) that lay inside `old` at `new`; how many changed."""
    changed = 0
    with closing(sqlite3.connect(db)) as conn, conn:
        for table, column in (("runs", "log_path"), ("artifacts", "path")):
            try:
                cur = conn.execute(
                    f"UPDATE {table} SET {column} = ? || substr({column}, ?) "  # fixed names, no input
                    f"WHERE {column} = ? OR substr({column}, 1, ?) = ?",
                    (new, len(old) + 1, old, len(old) + 1, old + os.sep),
                )
            except sqlite3.OperationalError:  # an empty database without the table
                continue
            changed += cur.rowcount
    return changed
