"""A cluster job's training child stops when the job's process is SIGKILLed, and a worker's export or push
command when the worker is (jobs.train.parent_watch)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from training_helpers import wait_for

CHILD = textwrap.dedent(
    """
    import signal, sys, time
    from pathlib import Path
    from jobs.train.parent_watch import stop_with_parent
    out = Path(sys.argv[1])
    def on_sigterm(signum, frame):  # as jobs.train.child's: installed first, then the watch
        out.write_text(signal.Signals(signum).name)
    signal.signal(signal.SIGTERM, on_sigterm)
    stop_with_parent(on_sigterm)
    out.with_suffix(".ready").write_text("ready")
    time.sleep(60)
    """
)
PARENT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    env = dict(os.environ, TUNEDECK_STOP_WITH_PARENT=str(os.getpid()) if sys.argv[2] == "watch" else "")
    subprocess.Popen([sys.executable, "-c", sys.argv[3], sys.argv[1]], env=env, start_new_session=True)
    time.sleep(60)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("mode", ["watch", "off"])
def test_the_child_is_told_to_stop_when_its_job_is_killed(tmp_path: Path, mode: str) -> None:
    out = tmp_path / "signal.txt"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(out), mode, CHILD], env=dict(os.environ))
    try:
        wait_for(lambda: out.with_suffix(".ready").exists(), timeout=60, what="the child to start")
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        if mode == "watch":
            wait_for(out.exists, timeout=30, what="the child's SIGTERM")
            assert out.read_text() == "SIGTERM"
        else:  # without the setting (a local worker's child) nothing is sent: that worker's cleanup ends it
            time.sleep(2)
            assert not out.exists()
    finally:
        subprocess.run(["pkill", "-f", str(out)], check=False)


COMMAND = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from app.cli.main import watch_parent
    watch_parent()  # what `tunedeck export|push` does first (no handler: SIGTERM ends it)
    assert "TUNEDECK_STOP_WITH_PARENT" not in os.environ  # its own children are not told
    Path(sys.argv[1]).with_suffix(".ready").write_text(str(os.getpid()))
    time.sleep(60)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_workers_task_command_ends_when_the_worker_is_killed(tmp_path: Path) -> None:
    """The worker sets TUNEDECK_STOP_WITH_PARENT for its task commands (test_task_service); the command heeds it."""
    import psutil

    out = tmp_path / "command.txt"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(out), "watch", COMMAND], env=dict(os.environ))
    ready = out.with_suffix(".ready")
    try:
        wait_for(lambda: ready.exists() and ready.read_text(), timeout=60, what="the command to start")
        pid = int(ready.read_text())
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        wait_for(
            lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE,
            timeout=30,
            what="the command to end",
        )
    finally:
        subprocess.run(["pkill", "-f", str(out)], check=False)
