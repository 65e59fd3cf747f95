"""A cluster job's training child stops when the job's process is SIGKILLed (jobs.train.parent_watch)."""

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
