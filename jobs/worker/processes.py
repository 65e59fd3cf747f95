"""The training child as an operating-system process: its command line, spawning, waiting, signals.

    child = spawn(default_child_argv(7), log_path, env)   # own session (process group), output to a file
    code = wait_exit(child, 5.0, wake_fd, open_pidfd(child.pid))   # None while it still runs
    code = terminate(child, grace_period=20.0)            # SIGTERM to the group, SIGKILL after the grace

Nothing here touches the store; `jobs.worker.loop` decides what to do with what happens here.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

log = logging.getLogger(__name__)

WATCH_TICK = 0.1  # how often a child is polled where it cannot be waited for (no pidfd); waits for a group
CHILD_MODULE = "jobs.train.child"  # the training entry point; also how an orphan is told from a reused pid
BASELINE_MODULE = "jobs.train.baseline"  # the child's runtime baseline (`jobs.worker.runtime`)

# On a CPU worker the memory graph is the training process's RSS. glibc's malloc raises its mmap
# threshold after the first large free (up to 32 MiB), so later activation-sized tensors come from
# the heap and stay resident after they are freed: the RSS climbs each step by fragmentation, not by
# live tensors (the form's default job: 2.9 GiB peak against 2.4 GiB live, 2.5 GiB with the fixed
# threshold). A fixed threshold gives every tensor over 128 KiB its own mapping, returned when freed,
# so the curve shows what is alive and the real peak is lower (SmolLM2 LoRA: 0.84x); it costs speed
# (0.78-0.84x tokens/s, `bench/overhead.py --sides bare,bare-malloc`). So it is a memory trick the spec
# asks for (`cpu_return_freed_memory`, off by default; Fit to GPU turns it on when the job needs it) and the
# prediction counts glibc's retained heap when it is off. TUNEDECK_CPU_ALLOCATOR=exact|glibc on the worker
# overrides every run's choice; a MALLOC_MMAP_THRESHOLD_ the user set wins over both.
CPU_ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def cpu_allocator_env(env: dict[str, str], wanted: bool = False) -> dict[str, str]:
    """The allocator settings a CPU training child gets on top of `env` (its environment so far);
    `wanted`: the run's spec asks for the fixed threshold (`cpu_return_freed_memory`)."""
    if "MALLOC_MMAP_THRESHOLD_" in env:
        return {}
    choice = env.get("TUNEDECK_CPU_ALLOCATOR", "").strip().lower()
    if choice not in ("", "exact", "glibc"):
        log.warning("TUNEDECK_CPU_ALLOCATOR=%r is neither 'exact' nor 'glibc': the run's spec decides", choice)
        choice = ""
    on = wanted if choice == "" else choice == "exact"
    return dict(CPU_ALLOCATOR_ENV) if on else {}


def run_allocator_env(env: dict[str, str], run: Any) -> dict[str, str]:
    """`cpu_allocator_env` for a run's child (its stored spec's `cpu_return_freed_memory`); none: the baseline's."""
    from jobs.spec.stored import stored_spec

    return cpu_allocator_env(env, run is not None and stored_spec(run.spec_json).cpu_return_freed_memory)


def default_child_argv(run_id: int) -> list[str]:
    """The training child's command line."""
    return [sys.executable, "-m", CHILD_MODULE, "--run-id", str(run_id)]


def baseline_argv() -> list[str]:
    """The command line that measures the training child's runtime baseline: the same interpreter."""
    return [sys.executable, "-m", BASELINE_MODULE]


def is_training_child(pid: int, run_id: int) -> bool:
    """Whether process `pid` is the training child of run `run_id` (guards against pid reuse)."""
    try:
        cmdline = psutil.Process(pid).cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return CHILD_MODULE in cmdline and str(run_id) in cmdline


def is_gpu_id(device: str) -> bool:
    """A CUDA device as CUDA_VISIBLE_DEVICES names one: an index, or a GPU-/MIG- UUID."""
    return device.isdigit() or device.startswith(("GPU-", "MIG-"))


def spawn(argv: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start the child in a new session (its own process group), stdout and stderr appended to `log_path`.

    Never a pipe: nobody would read it, and a full pipe hangs the training."""
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    out = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) == pgid:
                out.append(p.pid)
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            pass
    return out


def wait_group_gone(pgid: int, timeout: float) -> bool:
    """Wait until no process of the group is left (after SIGKILL: reaped or zombie); True when none is."""
    deadline = time.monotonic() + timeout
    while group_members(pgid):
        if time.monotonic() >= deadline:
            log.error("process group %s still has members %s after %g s", pgid, group_members(pgid), timeout)
            return False
        time.sleep(WATCH_TICK)
    return True


def wait_exit(
    child: subprocess.Popen, timeout: float, wake_fd: int | None = None, pidfd: int | None = None
) -> int | None:
    """The child's exit code once it has exited, else None after at most `timeout` seconds.

    With a pidfd (`os.pidfd_open`, Linux 5.3+) the caller sleeps in select() until the child
    exits, `wake_fd` turns readable (the worker is asked to stop) or the timeout passes: no
    wake-ups while training runs, on a core training may need. Without one it polls every
    WATCH_TICK."""
    returncode = child.poll()
    if returncode is not None or timeout <= 0:
        return returncode
    if pidfd is None:
        time.sleep(min(timeout, WATCH_TICK))
    else:
        select.select([pidfd] + ([wake_fd] if wake_fd is not None else []), [], [], timeout)
    return child.poll()


def open_pidfd(pid: int) -> int | None:
    """A file descriptor that turns readable when process `pid` exits (None where the OS has none)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def terminate(
    child: subprocess.Popen,
    grace_period: float,
    save_grace: float = 0.0,
    saving: Callable[[], bool] | None = None,
    what: str = "",
) -> int:
    """SIGTERM the child's group; SIGKILL it after the grace period. Returns the exit code.

    When `saving()` says a checkpoint is being written as the grace period ends, the child gets
    up to `save_grace` more seconds to finish it (`what` names the run in the log)."""
    killpg(child.pid, signal.SIGTERM)
    start = time.monotonic()
    deadline, extended = start + grace_period, False
    while child.poll() is None:
        now = time.monotonic()
        if now >= deadline:
            if not extended and saving is not None and saving():
                extended, deadline = True, start + grace_period + save_grace
                log.info("%s: a checkpoint is being written; waiting up to %g s more", what, save_grace)
                continue
            break
        time.sleep(WATCH_TICK)
    if child.poll() is None:
        log.warning("child %s ignored SIGTERM for %.0f s; SIGKILL", child.pid, time.monotonic() - start)
        killpg(child.pid, signal.SIGKILL)
    return child.wait()


def end_group(pgid: int, grace_period: float) -> None:
    """SIGTERM a process group (warm: a training child saves a checkpoint at its next step), SIGKILL after the grace."""
    killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_period
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(WATCH_TICK)
    killpg(pgid, signal.SIGKILL)


def killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def close_fds(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def install_stop_handlers(stop: Callable[[str], None]) -> dict[int, object]:
    """SIGTERM and SIGINT call `stop(reason)` (main thread only); returns the handlers they replaced."""
    if threading.current_thread() is not threading.main_thread():
        return {}  # signals are only delivered to the main thread; the caller uses stop()

    def handle(signum: int, _frame: FrameType | None) -> None:
        stop(f"worker received {signal.Signals(signum).name}")

    old: dict[int, object] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        old[sig] = signal.signal(sig, handle)
    return old


def restore_handlers(old: dict[int, object]) -> None:
    for sig, handler in old.items():
        signal.signal(sig, handler)  # type: ignore[arg-type]
