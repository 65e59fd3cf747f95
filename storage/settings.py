"""Where tunedeck keeps its data: one data directory, one database URL.

`TUNEDECK_HOME` holds the database, run folders, uploads and the model cache; unset or empty, it is
the platform's per-user data folder (`$XDG_DATA_HOME/tunedeck`, else `~/.local/share/tunedeck` on
Linux; `~/Library/Application Support/tunedeck` on macOS; `%LOCALAPPDATA%/tunedeck` on Windows), so
every command finds the same runs wherever it is typed. A `./data` folder of an earlier version is
found by `storage.data_home` and its move offered (`tunedeck migrate-data`). `TUNEDECK_DATABASE_URL` overrides the database (default SQLite at
`$TUNEDECK_HOME/tunedeck.db`). `TUNEDECK_MODELS_DIR` overrides the model cache (so tests and
several data directories can share one converted SmolLM2). `TUNEDECK_CACHE_DIR` overrides
`$TUNEDECK_HOME/cache` (measured facts that can be recomputed: row token lengths, the runtime baseline). `TUNEDECK_IDLE_MEMORY_RETENTION_H`
(default 24) is how long memory samples taken while no run trains are kept at full rate; older
ones are thinned to one a minute (samples of runs are kept with their run).
"""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "TUNEDECK_HOME"


def user_data_dir() -> Path:
    """The platform's per-user data folder for tunedeck (not created here)."""
    from platformdirs import user_data_dir as platform_user_data_dir

    return Path(platform_user_data_dir("tunedeck", appauthor=False)).expanduser().resolve()


def home_setting() -> Path | None:
    """The folder `TUNEDECK_HOME` names, or None when it is unset or empty (blank counts as unset)."""
    raw = os.environ.get(HOME_ENV, "").strip()
    return Path(raw).expanduser().resolve() if raw else None


def data_dir() -> Path:
    """The data directory (`TUNEDECK_HOME`, else the per-user data folder), created on first use."""
    path = home_setting() or user_data_dir()
    path.mkdir(parents=True, exist_ok=True)
    return path


def database_url() -> str:
    url = os.environ.get("TUNEDECK_DATABASE_URL")
    return url or f"sqlite:///{data_dir() / DATABASE_FILE}"


DATABASE_FILE = "tunedeck.db"


def sqlite_database_file() -> Path | None:
    """The default database's file (`$TUNEDECK_HOME/tunedeck.db`); None when TUNEDECK_DATABASE_URL names another."""
    return None if os.environ.get("TUNEDECK_DATABASE_URL") else data_dir() / DATABASE_FILE


def missing_sqlite_database(url: str) -> bool:
    """True when `url` names an SQLite database whose file does not exist (an in-memory one counts as missing)."""
    from sqlalchemy.engine import make_url  # lazily: a command that needs no store stays light

    parsed = make_url(url)
    return parsed.get_backend_name() == "sqlite" and not (parsed.database and Path(parsed.database).is_file())


def database_url_problem(url: str) -> tuple[str, str] | None:
    """Why SQLAlchemy cannot open `url` (another program's database too, such as MLflow's store): ("url", why) when
    it cannot read the URL, ("driver", module) when the driver is not installed; None when both are fine."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        make_url(url).get_dialect().import_dbapi()
    except (ArgumentError, NoSuchModuleError, ValueError) as exc:
        return "url", str(exc)
    except ImportError as exc:
        return "driver", getattr(exc, "name", None) or str(exc)
    return None


def runs_dir() -> Path:
    """Where run folders live: `runs/<database id>/<run>/` (`Store.run_dir`, `storage.identity`)."""
    path = data_dir() / "runs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir() -> Path:
    """Model cache (built-in models, downloads); `TUNEDECK_MODELS_DIR` overrides `$TUNEDECK_HOME/models`."""
    override = os.environ.get("TUNEDECK_MODELS_DIR")
    path = Path(override).expanduser().resolve() if override else data_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir() -> Path:
    """Recomputable measurements (`TUNEDECK_CACHE_DIR`, default `$TUNEDECK_HOME/cache`), created on first use."""
    override = os.environ.get("TUNEDECK_CACHE_DIR")
    path = Path(override).expanduser().resolve() if override else data_dir() / "cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


def uploads_dir() -> Path:
    path = data_dir() / "uploads"
    path.mkdir(parents=True, exist_ok=True)
    return path


def idle_memory_retention_s() -> float:
    """Seconds idle memory samples are kept at full rate (`TUNEDECK_IDLE_MEMORY_RETENTION_H`, default 24 h)."""
    raw = os.environ.get("TUNEDECK_IDLE_MEMORY_RETENTION_H", "").strip()
    try:
        hours = float(raw) if raw else 24.0
    except ValueError:
        raise ValueError(
            f"TUNEDECK_IDLE_MEMORY_RETENTION_H={raw!r} is not a number of hours: set it to e.g. 24, or unset it"
        ) from None
    if not hours > 0:
        raise ValueError(f"TUNEDECK_IDLE_MEMORY_RETENTION_H={raw!r} must be above 0 hours: set it to e.g. 24")
    return hours * 3600.0


DEFAULT_MAX_UPLOAD_MB = 1024


def max_upload_mb() -> int:
    """The upload size limit in MB (`TUNEDECK_MAX_UPLOAD_MB`, default 1024)."""
    raw = os.environ.get("TUNEDECK_MAX_UPLOAD_MB", "").strip()
    try:
        value = int(raw) if raw else DEFAULT_MAX_UPLOAD_MB
    except ValueError:
        raise ValueError(f"TUNEDECK_MAX_UPLOAD_MB={raw!r} is not a whole number of megabytes") from None
    if value < 1:
        raise ValueError(f"TUNEDECK_MAX_UPLOAD_MB={raw!r} must be at least 1")
    return value


CANCEL_GRACE_ENV = "TUNEDECK_CANCEL_GRACE_S"
SAVE_GRACE_ENV = "TUNEDECK_SAVE_GRACE_S"


def stop_graces(grace_period: float, save_grace: float | None = None) -> tuple[float, float]:
    """(grace, save grace) in seconds for stopping a training child: how long after SIGTERM until SIGKILL
    (TUNEDECK_CANCEL_GRACE_S, else `grace_period`), and how much longer a checkpoint it has begun may take
    (`save_grace`, else TUNEDECK_SAVE_GRACE_S, else 300). The worker and the cluster dispatcher read them here."""
    grace = float(os.environ.get(CANCEL_GRACE_ENV) or grace_period)
    save = float(save_grace if save_grace is not None else os.environ.get(SAVE_GRACE_ENV) or 300.0)
    return grace, save
