"""Helpers for the Chromium tests: start `tunedeck serve` on a free port, launch Debian's Chromium.

Chromium flags for a machine without internet (measured on the dev machines): offline, no sandbox, host lookups of anything but
127.0.0.1 fail, so a request leaving the machine would show up as an error, never as traffic.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
]
REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tunedeck_command() -> list[str]:
    exe = Path(sys.executable).with_name("tunedeck")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "app.cli.main"]


def serve_command(port: int) -> list[str]:
    return tunedeck_command() + ["serve", "--host", "127.0.0.1", "--port", str(port)]


def start_server(
    home: Path,
    port: int,
    log: Path,
    timeout: float = 300.0,
    extra_env: dict[str, str] | None = None,
    args: list[str] | None = None,
) -> subprocess.Popen:
    """Start the dashboard + worker (`args=["--no-worker"]`: the dashboard only); raise with its output when it
    does not come up in time."""
    env = {
        **os.environ,
        "TUNEDECK_HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "GRADIO_ANALYTICS_ENABLED": "False",
        "PYTHONUNBUFFERED": "1",
        **(extra_env or {}),
    }
    env.pop("TUNEDECK_DATABASE_URL", None)
    fh = log.open("wb")
    proc = subprocess.Popen(
        serve_command(port) + (args or []),
        cwd=REPO,
        env=env,
        stdout=fh,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            break
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).read()
            return proc
        except OSError:
            time.sleep(0.3)
    stop_server(proc)
    raise RuntimeError(f"tunedeck serve did not come up on port {port}; its output:\n{log.read_text()[-8000:]}")


def wait_for_route(port: int, path: str, proc: subprocess.Popen, post: bool = False, timeout: float = 300.0) -> None:
    """Until `path` answers anything but 404: `serve` answers its page before it adds its routes (/v1, /mcp) beside it.

    `post` sends an empty JSON body (a Streamable HTTP endpoint answers a GET with a stream that never ends).
    """
    deadline = time.monotonic() + timeout
    data = b"{}" if post else None
    while True:
        assert proc.poll() is None, f"the server exited ({proc.poll()}) before {path} came up"
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data)
        if post:
            request.add_header("Content-Type", "application/json")
        try:
            urllib.request.urlopen(request, timeout=30).read()
            return
        except urllib.error.HTTPError as err:
            if err.code != 404:
                return  # the route is there: it answered something other than "no such route"
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{path} never came up on port {port}"
        time.sleep(0.2)


def stop_server(proc: subprocess.Popen) -> None:
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextmanager
def served(home: Path) -> Iterator[str]:
    """`tunedeck serve` with TUNEDECK_HOME=home on a free port while the block runs; yields its URL."""
    port = free_port()
    proc = start_server(home, port, home / "server.log")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_server(proc)


@contextmanager
def chromium() -> Iterator[Any]:
    """Debian's Chromium through playwright, with the offline flags above."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
