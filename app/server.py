"""`tunedeck serve`: the Gradio dashboard, with a worker in a separate process.

The dashboard and the worker only share the database (STYLE.md "data path"): the worker runs
as a subprocess (`python -m app.cli.main worker`, the same as `tunedeck worker`) so a crash or a
GPU hang in training never takes the web server down, and it exits with the server.

Safe serving:
- binds 127.0.0.1 by default; every request passes `app.guard.Guard` (Host allowlist, no
  cross-site state change, the access token when there is one) and `app.login_limit.LoginLimiter`
  (one rate limit for the login form, `/v1` passwords and the token, per client address);
- the client address comes from `X-Forwarded-For` only on connections from the proxies named in
  TUNEDECK_TRUSTED_PROXIES (none by default: uvicorn would trust loopback's otherwise);
- a non-loopback address without a login gets a random access token (printed once as a URL, only
  its hash kept); `--insecure-no-login` serves it open, with a loud warning;
- optional login (`TUNEDECK_AUTH=user:password` or `--auth-file`, see app.auth);
- remote code and custom reward functions only with `--allow-remote-code` / `--allow-reward-function`
  (jobs.checks.access);
- Gradio may serve only the runs' bundle zips (`bundle_allow_list`, re-read from the store at
  each check) plus its own upload/cache folder, which lives under `uploads_dir()`; the
  database, logs, checkpoints, model cache and `.env` files are on its blocked list;
- uploads are capped at `TUNEDECK_MAX_UPLOAD_MB` (default 1024).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from jobs.checks.access import AccessPolicy
from jobs.errors import Problem, ProblemError
from storage.roles_dashboard import BundlePaths
from storage.settings import data_dir, max_upload_mb, models_dir, runs_dir, uploads_dir
from storage.store import Store
from storage.uploads import sweep_partials

LOOPBACK_NAMES = {"localhost", "ip6-localhost"}
WORKER_STOP_TIMEOUT_S = 30.0
TOKEN_ENV = "TUNEDECK_TOKEN"
TRUSTED_PROXIES_ENV = "TUNEDECK_TRUSTED_PROXIES"


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, port: int, has_login: bool = False) -> str | None:
    """A warning when the dashboard would be reachable from other machines without a login."""
    if is_loopback(host) or has_login:
        return None
    return (
        f"WARNING: --insecure-no-login: binding {host}:{port} makes the dashboard reachable from other "
        "machines and it has no login and no token: anyone who can reach it can start training runs, read "
        "your data and download adapters. Use --host 127.0.0.1 (default) with an SSH tunnel, set "
        "TUNEDECK_AUTH=user:password or --auth-file FILE (see `tunedeck hash-password`), or put it behind "
        "an authenticating proxy."
    )


def access_token(host: str, has_login: bool, insecure_no_login: bool = False) -> str | None:
    """The access token a non-loopback bind without a login needs (TUNEDECK_TOKEN, else a fresh random
    one); None on loopback, with a login, or with --insecure-no-login."""
    if is_loopback(host) or has_login or insecure_no_login:
        return None
    return os.environ.get(TOKEN_ENV, "").strip() or secrets.token_urlsafe(32)


def token_notice(host: str, port: int, token: str) -> str:
    """What `serve` prints once: the URL that lets a browser in (Jupyter style)."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    shown = f"[{shown}]" if ":" in shown else shown
    where = "the token in TUNEDECK_TOKEN" if os.environ.get(TOKEN_ENV, "").strip() else "a new random token"
    return (
        f"tunedeck: no login is configured and {host}:{port} is reachable from other machines, so the "
        f"dashboard needs an access token ({where}). Open it with:\n"
        f"    http://{shown}:{port}/?token={token}\n"
        "(scripts: `Authorization: Bearer TOKEN`). To use a login instead see docs/deployment.md#security."
    )


def trusted_proxies(value: str | None = None) -> str:
    """uvicorn's `forwarded_allow_ips`: the addresses and networks in TUNEDECK_TRUSTED_PROXIES (comma- or
    space-separated), "" (trust no one's X-Forwarded-For) when unset; ProblemError naming a bad entry."""
    raw = os.environ.get(TRUSTED_PROXIES_ENV, "") if value is None else value
    entries = raw.replace(",", " ").split()
    bad = []
    for entry in entries:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            bad.append(entry)
    if bad:
        problem = Problem(
            TRUSTED_PROXIES_ENV,
            f"{', '.join(repr(b) for b in bad)} is not an IP address or network",
            "list your reverse proxies' addresses, e.g. TUNEDECK_TRUSTED_PROXIES=127.0.0.1,10.0.0.0/8 (or leave it unset)",
        )
        raise ProblemError([problem])
    return ",".join(entries)


def guard_middleware(host: str, allowed_hosts: list[str] | None, token: str | None) -> list[Any]:
    """The app's own middleware, outermost first: the login limiter, then the Host/Origin/token guard."""
    from starlette.middleware import Middleware

    from app.guard import Guard, GuardSettings, configured_hosts, token_hash
    from app.login_limit import LoginLimiter

    settings = GuardSettings(
        hosts=configured_hosts(allowed_hosts or ()),
        bind=host,
        token_sha256=token_hash(token) if token else None,
    )
    return [Middleware(Guard, settings=settings), Middleware(LoginLimiter)]


def gradio_temp_dir() -> Path:
    """Gradio's upload and download cache: inside the data directory, never the shared /tmp/gradio."""
    path = uploads_dir() / "incoming"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


class LiveList(list):
    """A list whose items are recomputed by `compute()` each time Gradio reads it.

    Gradio reads `blocks.allowed_paths` / `blocked_paths` at every file request (iterating them
    or adding them to another list), so runs and bundles made after start-up are covered.
    """

    def __init__(self, compute: Any):
        super().__init__()
        self.compute = compute

    def __iter__(self) -> Iterator[str]:
        return iter(self.compute())

    def __len__(self) -> int:
        return len(self.compute())

    def __bool__(self) -> bool:  # truthy even when empty, so launch() keeps it instead of GRADIO_*_PATHS
        return True

    def __contains__(self, item: object) -> bool:
        return item in self.compute()

    def __getitem__(self, index: Any) -> Any:
        return self.compute()[index]

    def __add__(self, other: Any) -> list[str]:  # type: ignore[override]
        return list(self.compute()) + list(other)

    def __radd__(self, other: Any) -> list[str]:
        return list(other) + list(self.compute())

    def __repr__(self) -> str:
        return f"LiveList({self.compute()!r})"


# Artifact kinds the dashboard may serve, with the one file suffix each may have.
SERVED_ARTIFACTS = {"bundle": ".zip", "export": ".zip", "gguf": ".gguf"}


def bundle_files(store: BundlePaths) -> list[str]:
    """The recorded bundle and export zips and GGUF files that are real files inside the data directory (no symlinks),
    and the preference sets made in the Chat tab."""
    root = data_dir()
    out = []
    for kind, suffix in SERVED_ARTIFACTS.items():
        for raw in store.artifact_paths(kind):
            path = Path(raw)
            if path.suffix != suffix or path.is_symlink() or not path.is_file():
                continue
            resolved = path.resolve()
            if _inside(resolved, root) and resolved.suffix == suffix:
                out.append(str(resolved))
    from jobs.data.preferences import files as preference_files

    return out + [p for p in preference_files() if not Path(p).is_symlink()]  # the Chat tab's sets, downloadable


def blocked_paths() -> list[str]:
    """What Gradio must never serve or copy: the database, secrets, model cache and run internals."""
    root = data_dir()
    blocked = [root / name for name in ("tunedeck.db", "tunedeck.db-wal", "tunedeck.db-shm", ".env")]
    blocked += [
        models_dir(),
        Path.cwd() / ".env",
        Path.home() / ".cache" / "huggingface",
        Path.home() / ".huggingface",
        Path.home() / ".ssh",
    ]
    # runs/<database id>/<run>/ (and the flat runs/<run>/ of databases older than their ids)
    for run in sorted(p for pattern in ("[0-9]*", "*/[0-9]*") for p in runs_dir().glob(pattern) if p.is_dir()):
        blocked += [run / "train.log", run / "output", run / "bundle", run / "checkpoints", run / "export"]
    return [str(p) for p in blocked]


def bundle_allow_list(store: BundlePaths) -> LiveList:
    """Gradio's `allowed_paths`: only the runs' bundle zips, re-read from the store at each check."""
    return LiveList(lambda: bundle_files(store))


def launch_options(store: BundlePaths, auth_file: str | None = None) -> dict[str, Any]:
    """Gradio launch() keyword arguments for safe serving (login, file access, upload cap) and page CSS."""
    from app.auth import gradio_auth, load_credentials
    from app.ui.form import FORM_CSS

    users = load_credentials(auth_file)
    return {
        "allowed_paths": bundle_allow_list(store),
        "blocked_paths": LiveList(blocked_paths),
        "css": FORM_CSS,
        "max_file_size": f"{max_upload_mb()}mb",
        "auth": gradio_auth(users) if users else None,
        "auth_message": "tunedeck: log in" if users else None,
    }


def start_worker() -> subprocess.Popen:
    """`tunedeck worker` as a child that exits when this process does."""
    argv = [sys.executable, "-m", "app.cli.main", "worker", "--exit-with-parent", str(os.getpid())]
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL)


def stop_worker(proc: subprocess.Popen, timeout: float = WORKER_STOP_TIMEOUT_S) -> int:
    """SIGTERM (the worker stops its training child warm), SIGKILL after `timeout`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def import_before_threads() -> None:
    """Import transformers once, on this thread, before any request thread can: its lazy top-level module is not
    thread-safe on a first import (two request threads that import from it at once both fail with "cannot import
    name 'AutoConfig' from 'transformers'": seen when the run page's Export and Push were clicked together)."""
    import transformers  # noqa: F401


def serve(
    host: str = "127.0.0.1",
    port: int = 7860,
    with_worker: bool = True,
    auth_file: str | None = None,
    allowed_hosts: list[str] | None = None,
    insecure_no_login: bool = False,
    **launch_kwargs: Any,
) -> int:
    """Run the dashboard until interrupted; returns an exit code."""
    # Before gradio is imported: its upload folder and cache go under the data directory.
    os.environ["GRADIO_TEMP_DIR"] = str(gradio_temp_dir())
    # Gradio starts uvicorn without forwarded_allow_ips, so uvicorn reads this (its default: loopback).
    os.environ["FORWARDED_ALLOW_IPS"] = trusted_proxies()
    sweep_partials(uploads_dir())  # what uploads cut by a killed dashboard left (storage.uploads)
    import_before_threads()
    from app.mcp_route import add_mcp_route
    from app.mcp_tools import build as build_mcp
    from app.openai_api import access_rule, add_openai_routes
    from app.openai_tuning.routes import add_tuning_routes
    from app.ui.dashboard import build_ui
    from app.ui.live_route import add_live_route, logged_in, page_head_kwargs

    store = Store()
    options = launch_options(store, auth_file)
    options.update(launch_kwargs)
    has_login = options.get("auth") is not None
    token = access_token(host, has_login, insecure_no_login)
    warning = exposure_warning(host, port, has_login=has_login) if token is None else None
    if warning:
        print(warning, file=sys.stderr)
    if token is not None:
        print(token_notice(host, port, token), file=sys.stderr)
    if has_login:
        print("tunedeck: login required (TUNEDECK_AUTH / --auth-file)", file=sys.stderr)
    app_kwargs = page_head_kwargs()  # the live page's script and style, first in the page's <head>
    app_kwargs["middleware"] = guard_middleware(host, allowed_hosts, token) + app_kwargs["middleware"]
    del token  # only its hash is kept (in the guard)
    worker = start_worker() if with_worker else None
    # SIGTERM (docker stop, systemd) ends the server like Ctrl-C, so the worker is stopped warm.
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        policy = AccessPolicy.for_server(login=has_login)
        demo = build_ui(store, policy)
        app, _, _ = demo.launch(
            server_name=host,
            server_port=port,
            show_error=True,
            prevent_thread_lock=True,
            app_kwargs=app_kwargs,
            **options,
        )
        add_live_route(app, store)  # before the first page can open its stream: the page loads after this
        add_openai_routes(app, store, logged_in)  # /v1: the OpenAI-compatible API (app.openai_api)
        add_tuning_routes(app, store, access_rule(app, logged_in), policy)  # /v1/files, /v1/fine_tuning/jobs
        add_mcp_route(app, build_mcp(store, policy), logged_in)  # /mcp: the tools for agents (app.mcp_tools)
        quiet_queue(demo)
        wait_until_stopped(demo)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        if worker is not None:
            stop_worker(worker)
        store.dispose()
    return 0


# Gradio 6.31's event queue looks for work every 1 ms while it has none (and for progress updates
# every 10 ms): ~7% of a core for a dashboard nobody uses. Every wake-up of the server's event loop
# costs ~0.3 ms here, and an idle server wakes ~30 times a second (this poll, uvicorn's 10 Hz tick), so
# the poll is every 100 ms: an event starts 50 ms later on average, which nobody sees (the live charts
# come through their own stream). The progress loop only forwards gr.Progress reports, which no
# handler here makes, so once a second is enough. Measured with no page open: 7.5% -> 1.0% (50 ms,
# 1 s) -> 0.7% (100 ms, 1 s) of a core; bench/ui.py measures it with pages.
QUEUE_IDLE_POLL_S = 0.1
QUEUE_PROGRESS_POLL_S = 1.0


def wait_until_stopped(demo: Any, poll_s: float = 5.0) -> None:
    """Hold the main thread while the server runs, as Gradio's `block_thread` does, without its 10
    wake-ups a second (a few tenths of a % of a core on an idle dashboard): Ctrl-C and SIGTERM
    (`_raise_keyboard_interrupt`) interrupt the sleep at once; `poll_s` only notices a server closed
    from another thread."""
    try:
        while demo.is_running:
            time.sleep(poll_s)
    except KeyboardInterrupt:
        if demo.server:
            demo.server.close()
        raise


def quiet_queue(demo: Any) -> None:
    """Slow the launched app's idle queue polls to QUEUE_IDLE_POLL_S / QUEUE_PROGRESS_POLL_S.

    Gradio keeps them on its private queue object; a Gradio without those attributes fails here,
    loudly, rather than silently costing the idle CPU again (tests/test_live.py checks it)."""
    queue = demo._queue
    for name, value in (
        ("sleep_when_free", QUEUE_IDLE_POLL_S),
        ("progress_update_sleep_when_free", QUEUE_PROGRESS_POLL_S),
    ):
        if not hasattr(queue, name):
            raise RuntimeError(f"gradio's queue has no {name!r}: update app.server.quiet_queue for this gradio")
        setattr(queue, name, value)


def _raise_keyboard_interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
