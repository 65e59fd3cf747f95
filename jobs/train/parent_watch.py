"""A child that stops when the process that started it dies: a cluster job's training child, a worker's
export or push (`tunedeck export|push` started by `jobs.worker.task_service`)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from types import FrameType

STOP_WITH_PARENT_ENV = "TUNEDECK_STOP_WITH_PARENT"  # "<pid>": stop when that process (the job, the worker) dies


def stop_with_parent(on_sigterm: Callable[[int, FrameType | None], None]) -> None:
    """Under a cluster job (`jobs.worker.engine_job`) no local worker reaps an orphaned child: when the job's
    process dies (SIGKILLed by the engine, the OOM killer), the kernel sends this child SIGTERM
    (PR_SET_PDEATHSIG), and it stops at the next step as on a cancel. A worker's export or push child is
    told the same when its worker is SIGKILLed (no other worker would end it: it would go on holding the
    GPU and writing files nobody records). The setting is for this process only: its own children do not
    inherit it. Linux only; elsewhere a no-op."""
    parent = os.environ.pop(STOP_WITH_PARENT_ENV, "").strip()
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != int(parent):  # the job died before the call above: nobody would signal us
        on_sigterm(signal.SIGTERM, None)
