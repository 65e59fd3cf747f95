"""Files the dashboard serves or reads for a run, only ever from inside the data directory.

    inside_data_dir(path)       # the resolved path, or None when it lies outside TUNEDECK_HOME (never served)
    bundle_path(store, 7)       # run 7's zip bundle, if recorded and inside the data directory
    log_tail(run)               # the last lines of its train.log

The run page (`app.ui.run`), the export tab and the HTTP API (`app.api`) use them.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pandas as pd

from jobs.units import human_bytes
from storage.roles import RunArtifacts
from storage.settings import data_dir
from storage.store import RunRecord

LOG_LINES = 50


def inside_data_dir(path: str | Path | None) -> Path | None:
    """The resolved path when it lies inside the data directory, else None (never serve others)."""
    if not path:
        return None
    p = Path(path).resolve()
    return p if p.is_relative_to(data_dir()) and p.is_file() else None


def log_tail(run: RunRecord, lines: int = LOG_LINES) -> str:
    """The last lines of the run's train.log (only a log inside the data directory is read)."""
    from storage.run_files import log_tail as tail_of

    return tail_of(inside_data_dir(run.log_path), lines) or ""


def bundle_path(store: RunArtifacts, run_id: int) -> Path | None:
    """The run's zip bundle (adapter or model), if recorded and inside the data directory."""
    from jobs.train.artifacts import bundle_of

    return inside_data_dir(bundle_of(store, run_id))


def unreachable_files_note(store: RunArtifacts, run_id: int) -> str:
    """Why a finished run's recorded bundle cannot be downloaded from this dashboard ("" when it can).

    Artifact paths are stored as absolute paths: on many hosts the data folder must be one shared
    volume mounted at the same path everywhere (docs/deployment.md, "Several GPUs, several hosts").
    """
    from jobs.train.artifacts import bundle_of

    recorded = bundle_of(store, run_id)
    if not recorded or inside_data_dir(recorded) is not None:
        return ""
    where = (
        "is not inside this dashboard's data folder"
        if not Path(recorded).resolve().is_relative_to(data_dir())
        else "is missing on this host"
    )
    return (
        f"### Files not reachable from this host\nRun {run_id}'s bundle was written to `{recorded}`, which "
        f"{where} (`{data_dir()}`). Fix: mount the shared data folder at the same path on every host and "
        "set the same `TUNEDECK_HOME` for the dashboard and the workers."
    )


def bundle_files(path: Path) -> pd.DataFrame:
    with zipfile.ZipFile(path) as zf:
        rows = [[i.filename, human_bytes(i.file_size)] for i in zf.infolist() if not i.is_dir()]
    return pd.DataFrame(rows, columns=["file", "size"])
