"""`tunedeck serve`: the Gradio dashboard, with a worker in a separate process.

The dashboard and the worker only share the database (STYLE.md "data path"): the worker runs
as a subprocess (`python -m app.cli worker`, the same as `tunedeck worker`) so a crash or a
GPU hang in training never takes the web server down, and it exits with the server. Binding
a non-loopback address prints a warning: the dashboard has no login.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
from types import FrameType
from typing import Any

from storage.store import Store

LOOPBACK_NAMES = {"localhost", "ip6-localhost"}
WORKER_STOP_TIMEOUT_S = 30.0


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, port: int) -> str | None:
    """A warning when the dashboard would be reachable from other machines."""
    if is_loopback(host):
        return None
    return (f"WARNING: binding {host}:{port} makes the dashboard reachable from other machines. It has no "
            "login: anyone who can reach it can start training runs, read your data and download adapters. "
            "Use --host 127.0.0.1 (default) with an SSH tunnel, or put it behind an authenticating proxy.")


def start_worker() -> subprocess.Popen:
    """`tunedeck worker` as a child that exits when this process does."""
    argv = [sys.executable, "-m", "app.cli", "worker", "--exit-with-parent", str(os.getpid())]
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


def serve(host: str = "127.0.0.1", port: int = 7860, with_worker: bool = True, **launch_kwargs: Any) -> int:
    """Run the dashboard until interrupted; returns an exit code."""
    from app.ui import build_ui

    warning = exposure_warning(host, port)
    if warning:
        print(warning, file=sys.stderr)
    store = Store()
    worker = start_worker() if with_worker else None
    # SIGTERM (docker stop, systemd) ends the server like Ctrl-C, so the worker is stopped warm.
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        demo = build_ui(store)
        demo.launch(server_name=host, server_port=port, show_error=True, **launch_kwargs)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        if worker is not None:
            stop_worker(worker)
        store.dispose()
    return 0


def _raise_keyboard_interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
