"""Where tunedeck keeps its data: one data directory, one database URL.

`TUNEDECK_HOME` (default `./data`) holds the database, run folders, uploads and the model
cache. `TUNEDECK_DATABASE_URL` overrides the database (default SQLite at
`$TUNEDECK_HOME/tunedeck.db`). `TUNEDECK_MODELS_DIR` overrides the model cache (so tests and
several data directories can share one converted SmolLM2).
"""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """The data directory, created on first use."""
    path = Path(os.environ.get("TUNEDECK_HOME", "data")).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def database_url() -> str:
    url = os.environ.get("TUNEDECK_DATABASE_URL")
    return url or f"sqlite:///{data_dir() / 'tunedeck.db'}"


def runs_dir() -> Path:
    path = data_dir() / "runs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_path(run_id: int) -> Path:
    """A run's folder, without creating it."""
    return runs_dir() / f"{int(run_id):06d}"


def run_dir(run_id: int) -> Path:
    """A run's folder, created on first use."""
    path = run_path(run_id)
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir() -> Path:
    """Model cache (built-in models, downloads); `TUNEDECK_MODELS_DIR` overrides `$TUNEDECK_HOME/models`."""
    override = os.environ.get("TUNEDECK_MODELS_DIR")
    path = Path(override).expanduser().resolve() if override else data_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def uploads_dir() -> Path:
    path = data_dir() / "uploads"
    path.mkdir(parents=True, exist_ok=True)
    return path
