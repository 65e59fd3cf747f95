"""The submit check of `report_to`: every tracker named can start, else the run is refused before it queues.

The mirrors (`jobs.train.mirrors`) start each tracker in the training child; a tracker that cannot start
there fails the run after it waited in the queue (issue 48: MLflow's default store without `alembic`, a file
store MLflow 3 switched off). So what can be known here is checked here, each refusal naming `report_to`,
the problem and the fix:
- the tracker's package imports;
- MLflow's store (`mlflow_tracking_uri`: MLFLOW_TRACKING_URI, else tunedeck's default
  `sqlite:///$TUNEDECK_HOME/mlflow.db`, never MLflow's own `mlflow.db` in whatever folder the worker
  started in): a `file:` store needs MLFLOW_ALLOW_FILE_STORE=true; a database store needs `alembic` and
  the database's driver; an http(s) tracking server must answer (any HTTP status will do, no key is sent);
- W&B in online mode (WANDB_MODE unset or `online`) needs a key: WANDB_API_KEY or a netrc entry for its host
  (`wandb login` writes one).

The check reads this process's environment: where the run is submitted, which is where the workers run in the
usual set-up (`tunedeck serve` starts its own worker); a store's password is never shown.

    tracker_problems(spec)   # [Problem("report_to", "`wandb` is not installed ...", "pip install 'wandb==0.31.0' ...")]
"""

from __future__ import annotations

import importlib.util
import netrc
import os
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from jobs.errors import Problem
from jobs.spec.job import JobSpec
from jobs.spec.trackers import PACKAGES, Tracker

MLFLOW_DB = "mlflow.db"  # the default MLflow store's file in the data folder
MLFLOW_DB_MODULES = ("sqlalchemy", "alembic")  # what MLflow's database stores import besides the driver
DB_ENGINES = ("postgresql", "mysql", "sqlite", "mssql")  # MLflow's database schemes (mlflow.store.db.db_types)
SERVER_TIMEOUT_S = 5.0
WANDB_HOST = "https://api.wandb.ai"
_OFF = {"offline", "dryrun", "disabled"}


def mlflow_tracking_uri() -> str:
    """Where runs are mirrored in MLflow: MLFLOW_TRACKING_URI, else `sqlite:///$TUNEDECK_HOME/mlflow.db`."""
    from storage.settings import data_dir

    return os.environ.get("MLFLOW_TRACKING_URI", "").strip() or f"sqlite:///{data_dir() / MLFLOW_DB}"


def tracker_problems(spec: JobSpec) -> list[Problem]:
    """A problem for each tracker in `report_to` that could not start here."""
    out = []
    for tracker in spec.tracker_list:
        module, requirement = PACKAGES[tracker]
        if importlib.util.find_spec(module) is None:
            out.append(
                Problem(
                    "report_to",
                    f"`{tracker.value}` needs the `{module}` package, which is not installed here",
                    f"pip install '{requirement}' (on the workers too), or remove {tracker.value} from report_to",
                )
            )
        elif tracker is Tracker.MLFLOW:
            out += [p for p in (mlflow_problem(mlflow_tracking_uri()),) if p is not None]
        elif tracker is Tracker.WANDB:
            out += [p for p in (wandb_problem(),) if p is not None]
    return out


def mlflow_problem(uri: str) -> Problem | None:
    """Why MLflow could not open the store at `uri`, or None."""
    scheme = urlsplit(uri).scheme.lower()
    shown = _shown(uri)
    other = "or remove mlflow from report_to"
    if scheme in ("", "file") or (len(scheme) == 1 and scheme.isalpha()):  # a folder (C:\ is one too)
        if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").strip().lower() in ("true", "1"):
            return None
        return _problem(
            f"MLflow's file store ({shown}) is off in MLflow 3 unless MLFLOW_ALLOW_FILE_STORE=true",
            "set MLFLOW_ALLOW_FILE_STORE=true where the workers run, or unset MLFLOW_TRACKING_URI (tunedeck's "
            f"default: sqlite:///$TUNEDECK_HOME/{MLFLOW_DB}), {other}",
        )
    if scheme.split("+")[0] in DB_ENGINES:
        return _database_problem(uri, shown, other)
    if scheme in ("http", "https"):
        answered = _server_problem(uri)
        if answered is None:
            return None
        return _problem(
            f"the MLflow tracking server {shown} does not answer ({answered})",
            f"start it (`mlflow server`) or correct MLFLOW_TRACKING_URI, then submit again, {other}",
        )
    return None  # databricks, unity catalog, a plugin's scheme: MLflow's own business


def _database_problem(uri: str, shown: str, other: str) -> Problem | None:
    missing = [m for m in MLFLOW_DB_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        names = " ".join(missing)
        return _problem(
            f"MLflow's database store ({shown}) needs {', '.join(f'`{m}`' for m in missing)}, not installed here",
            f"pip install {names} (on the workers too; tunedeck's trackers extra has them), {other}",
        )
    from storage.settings import database_url_problem

    problem = database_url_problem(uri)
    if problem and problem[0] == "url":
        return _problem(
            f"MLFLOW_TRACKING_URI ({shown}) is not a database URL SQLAlchemy reads ({problem[1]})",
            f"write it as DIALECT[+DRIVER]://USER:PASSWORD@HOST/DATABASE, {other}",
        )
    if problem:
        return _problem(
            f"MLflow's database store ({shown}) needs the driver `{problem[1]}`, not installed here",
            f"pip install the driver (on the workers too), or name an installed one in the URL (DIALECT+DRIVER), "
            f"{other}",
        )
    return None


def _server_problem(uri: str) -> str | None:
    """Why the server at `uri` gives no HTTP answer within SERVER_TIMEOUT_S, or None (any status is an answer)."""
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=SERVER_TIMEOUT_S):  # noqa: S310
            return None
    except urllib.error.HTTPError:
        return None
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"{type(reason).__name__}: {reason}"


def wandb_problem() -> Problem | None:
    """Why W&B could not log online here (no key), or None (a key, or offline/disabled)."""
    mode = os.environ.get("WANDB_MODE", "").strip().lower()
    if mode in _OFF or os.environ.get("WANDB_DISABLED", "").strip().lower() in ("true", "1"):
        return None
    if os.environ.get("WANDB_API_KEY", "").strip():
        return None
    host = urlsplit(os.environ.get("WANDB_BASE_URL", "").strip() or WANDB_HOST).hostname or ""
    where = Path(os.environ.get("NETRC", "").strip() or Path.home() / ".netrc").expanduser()
    try:
        if netrc.netrc(str(where)).authenticators(host):
            return None
    except (OSError, netrc.NetrcParseError):
        pass
    return _problem(
        f"W&B logs online here (WANDB_MODE is {mode or 'unset'}) and has no key: no WANDB_API_KEY and no {host} "
        f"entry in {where}",
        "set WANDB_API_KEY where the workers run (or run `wandb login` there), set WANDB_MODE=offline to keep "
        "the W&B files in the run's folder, or remove wandb from report_to",
    )


def _problem(problem: str, fix: str) -> Problem:
    return Problem("report_to", problem, fix)


def _shown(uri: str) -> str:
    """`uri` without its user-info (a database password, a token)."""
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    return parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]).geturl()
