"""Start a real dashboard, `tunedeck serve --no-worker`, on a free port for a test module, and stop it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from browser_helpers import REPO, free_port


def serve_dashboard(home: Path, log: Path, host: str = "127.0.0.1", args: tuple[str, ...] = (), **env: str):
    """`tunedeck serve --no-worker` on a free port; (process, port) once its page answers."""
    port = free_port()
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNEDECK_", "GRADIO_"))}
    full_env.update(
        TUNEDECK_HOME=str(home), HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", PYTHONPATH=str(REPO), **env
    )
    command = [sys.executable, "-m", "app.cli.main", "serve", "--no-worker", "--host", host, "--port", str(port)]
    proc = subprocess.Popen([*command, *args], cwd=home, env=full_env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/", timeout=2).status_code in (200, 401):
                return proc, port
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    pytest.fail(f"server did not come up in 180 s:\n{log.read_text()}")


def stop_dashboard(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
