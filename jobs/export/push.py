"""Push a finished run's bundle (or its merged export) to a Hugging Face hub model repository.

    folder = push_folder(store, run_id, "bundle")            # what would be uploaded (PushError if nothing)
    url = push(store, run_id, "me/my-adapter", token, what="bundle", private=True)

The token is an argument only: it is handed to huggingface_hub for this one push and never written
anywhere (not to the store, the run's events, a log line, or the hub's token file). Before anything
is uploaded the hub is checked: offline mode (HF_HUB_OFFLINE=1) and an endpoint that cannot be reached
within `CONNECT_TIMEOUT_S` are refused with a clear message rather than hanging (huggingface_hub's own
HTTP client has no timeout). A successful push is recorded as a run event with the repo's address.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from jobs.errors import Problem
from jobs.spec.job import SpecError
from storage.roles import ArtifactReader, RunEvents

WHAT = ("bundle", "merged")
CONNECT_TIMEOUT_S = 5.0
DEFAULT_ENDPOINT = "https://huggingface.co"


class PushError(SpecError):
    """A push that cannot be done, with the reason and the fix."""


def _refuse(field: str, problem: str, fix: str) -> PushError:
    return PushError([Problem(field, problem, fix)])


def check_repo_id(repo: str) -> str:
    """`owner/name` as the hub spells repository ids; PushError otherwise."""
    repo = (repo or "").strip()
    owner, _, name = repo.partition("/")
    ok = (
        all(
            part and len(part) <= 96 and all(c.isalnum() or c in "-_." for c in part) and part[0] not in ".-"
            for part in (owner, name)
        )
        and "/" not in name
    )
    if not ok:
        raise _refuse(
            "repo", f"`{repo}` is not a hub repository id", "write OWNER/NAME, e.g. alice/smollm2-tag-adapter"
        )
    return repo


def push_folder(store: ArtifactReader, run_id: int, what: str = "bundle") -> Path:
    """The folder a push of `what` uploads: the run's bundle folder, or its newest merged export."""
    from jobs.spec.stored import finished_problem

    if what not in WHAT:
        raise _refuse("what", f"`{what}` is not one of {', '.join(WHAT)}", "use --what bundle or --what merged")
    problem = finished_problem(store.get_run(run_id), run_id, "push")
    if problem is not None:
        raise _refuse("run", *problem)
    kinds = ("merged",) if what == "merged" else ("adapter", "model")
    folders = [Path(a.path) for a in store.artifacts(run_id) if a.kind in kinds and Path(a.path).is_dir()]
    if not folders:
        if what == "merged":
            raise _refuse(
                "what", f"run {run_id} has no merged export", f"run `tunedeck export {run_id} --merged` first"
            )
        raise _refuse("run", f"run {run_id} has no saved bundle folder", "train it again; its bundle was not written")
    return folders[-1]


def endpoint() -> str:
    """The hub address: HF_ENDPOINT, else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def offline() -> bool:
    return (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or "").strip().upper() in {
        "1",
        "ON",
        "YES",
        "TRUE",
    }


def reachability_problem(url: str, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """Why the hub at `url` cannot be used now (offline mode, no connection within `timeout`), or None."""
    if offline():
        return "the hub is switched off here (HF_HUB_OFFLINE=1)"
    parsed = urlparse(url)
    host = parsed.hostname
    if not host:
        return f"`{url}` is not a hub address"
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"cannot reach {url} within {timeout:g} s ({type(exc).__name__}: {exc})"


class PushRecord(ArtifactReader, RunEvents, Protocol):
    """What a push reads (the run's files) and records (a `push` event, never the token)."""


def push(
    store: PushRecord,
    run_id: int,
    repo: str,
    token: str,
    what: str = "bundle",
    private: bool = False,
    timeout: float = CONNECT_TIMEOUT_S,
) -> str:
    """Create (or reuse) model repo `repo` and upload the run's folder to it; returns the repo's address."""
    repo = check_repo_id(repo)
    folder = push_folder(store, run_id, what)
    if not token or not token.strip():
        raise _refuse(
            "token",
            "no hub token was given",
            "paste a write token from huggingface.co/settings/tokens, or set HF_TOKEN",
        )
    url = endpoint()
    problem = reachability_problem(url, timeout)
    if problem:
        raise _refuse(
            "hub",
            f"{problem}; nothing was uploaded",
            "connect to the internet (and unset HF_HUB_OFFLINE), then push again; the run keeps its files",
        )
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    try:
        import httpx2

        transport_errors: tuple[type[BaseException], ...] = (OSError, httpx2.TransportError)
    except ImportError:  # an older huggingface_hub on requests: its errors are OSErrors
        transport_errors = (OSError,)
    api = HfApi(endpoint=url, token=token.strip())
    try:
        api.create_repo(repo, repo_type="model", private=private, exist_ok=True)
        commit = api.upload_folder(
            repo_id=repo, folder_path=str(folder), repo_type="model", commit_message=f"tunedeck run {run_id} ({what})"
        )
    except OfflineModeIsEnabled as exc:
        raise _refuse(
            "hub",
            "the hub is switched off here (HF_HUB_OFFLINE=1); nothing was uploaded",
            "unset HF_HUB_OFFLINE and push again",
        ) from exc
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        fix = (
            "check the token: it needs write access to the repository's owner"
            if status in (401, 403)
            else "check the repository id and the token's rights, then push again"
        )
        raise _refuse(
            "hub", f"the hub refused the push ({status or type(exc).__name__}: {str(exc).splitlines()[0]})", fix
        ) from exc
    except transport_errors as exc:  # connection dropped mid-upload
        raise _refuse(
            "hub",
            f"the connection to {url} failed during the push ({type(exc).__name__}: {exc})",
            "push again when the network is back",
        ) from exc
    address = f"{url}/{repo}"
    store.add_run_event(
        run_id,
        "push",
        f"pushed the {what} to {address}",
        data={"repo": repo, "what": what, "private": private, "url": address, "commit": getattr(commit, "oid", None)},
    )
    return address
