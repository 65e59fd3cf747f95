"""The worker: takes queued runs one at a time and runs each in its own training process.

    tunedeck worker            # serve the queue until SIGTERM / Ctrl-C
    tunedeck worker --burst    # drain the queue, then exit (tests, benchmarks)

One device, one running run: a worker claims (`Store.claim_next_on_device`, one transaction)
only while no other run holds its device (`device`, default TUNEDECK_DEVICE or "0"), so two
workers and two launches at the same moment give one running run and one queued; the queue is
FIFO unless reordered (`Store.move_queued`). For each run it claims it spawns
`python -m jobs.train.child --run-id N` in a new session (its own process group), with stdout and
stderr going to `runs/<id>/train.log` (never a pipe nobody reads). The child marks its run
succeeded or failed itself; the worker records what the child cannot: when the child dies while
its run is still `running`, the run is marked failed with the signal or exit code and the end of
the log. Cancel: SIGTERM to the group, SIGKILL after `grace_period`, then `cancelled`. At start
the worker marks runs interrupted whose heartbeat is stale or whose worker process on this host
is dead (rq's StartedJobRegistry.cleanup), and again every `stale_after / 2` s while it waits
for the device, so a run of a SIGKILLed worker is taken over by another. SIGTERM/SIGINT to the worker stop it warm: no new
runs, SIGTERM forwarded to the child, wait, then exit. At start the worker publishes its device
facts (`jobs.devices.facts`) to the store. A child that exits with `jobs.train.oom.EXIT_OOM_RECOVER` has
recorded an out-of-memory recovery: the worker starts a fresh child for the same run.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import psutil
from sqlalchemy.exc import SQLAlchemyError

from jobs.devices.sampler import GpuProbe, Sampler
from jobs.spec.stored import spec_problem
from jobs.train.oom import EXIT_OOM_RECOVER, MAX_RECOVERIES
from storage.models import RunStatus
from storage.settings import data_dir
from storage.store import RunFolderError, RunRecord, Store

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 40
_WATCH_TICK = 0.1  # how often a child is polled where it cannot be waited for (no pidfd); waits for a group
_RESTART = object()  # _execute_once: the child asked to be started again (OOM recovery)


def default_child_argv(run_id: int) -> list[str]:
    """The training child's command line."""
    return [sys.executable, "-m", "jobs.train.child", "--run-id", str(run_id)]


def describe_exit(returncode: int) -> str:
    """'training process killed by signal SIGKILL (9)' or 'training process exited with code N'."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"training process killed by signal {name} ({-returncode})"
    return f"training process exited with code {returncode}"


def log_tail(path: Path | str | None, lines: int = LOG_TAIL_LINES) -> str | None:
    """The last lines of a log file (reads at most the last 64 KiB)."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    return "\n".join(text.splitlines()[-lines:]) or None


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
        time.sleep(_WATCH_TICK)
    return True


def wait_exit(
    child: subprocess.Popen, timeout: float, wake_fd: int | None = None, pidfd: int | None = None
) -> int | None:
    """The child's exit code once it has exited, else None after at most `timeout` seconds.

    With a pidfd (`os.pidfd_open`, Linux 5.3+) the caller sleeps in select() until the child
    exits, `wake_fd` turns readable (the worker is asked to stop) or the timeout passes: no
    wake-ups while training runs, on a core training may need. Without one it polls every
    _WATCH_TICK."""
    returncode = child.poll()
    if returncode is not None or timeout <= 0:
        return returncode
    if pidfd is None:
        time.sleep(min(timeout, _WATCH_TICK))
    else:
        select.select([pidfd] + ([wake_fd] if wake_fd is not None else []), [], [], timeout)
    return child.poll()


def open_pidfd(pid: int) -> int | None:
    """A file descriptor that turns readable when process `pid` exits (None where the OS has none)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _is_gpu_id(device: str) -> bool:
    """A CUDA device as CUDA_VISIBLE_DEVICES names one: an index, or a GPU-/MIG- UUID."""
    return device.isdigit() or device.startswith(("GPU-", "MIG-"))


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def _close_fds(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Worker:
    """Runs queued runs one at a time in child processes; see the module docstring."""

    def __init__(
        self,
        store: Store,
        worker_id: str | None = None,
        poll_interval: float = 1.0,
        heartbeat_interval: float = 2.0,
        stale_after: float = 30.0,
        grace_period: float = 20.0,
        *,
        child_argv: Callable[[int], list[str]] | None = None,
        sample: bool = True,
        exit_with_parent: int | None = None,
        device: str | None = None,
        save_grace: float | None = None,
    ) -> None:
        self.store = store
        self.host = socket.gethostname()
        self.worker_id = worker_id or f"{self.host}:{os.getpid()}"
        self.poll_interval = poll_interval
        self.heartbeat_interval = heartbeat_interval
        self.stale_after = stale_after
        self.grace_period = float(os.environ.get("TUNEDECK_CANCEL_GRACE_S") or grace_period)
        # How long a stopping child may go on writing the checkpoint it has begun, past grace_period.
        self.save_grace = float(
            save_grace if save_grace is not None else os.environ.get("TUNEDECK_SAVE_GRACE_S") or 300.0
        )
        self.child_argv = child_argv or default_child_argv  # tests swap in a fake child
        self.sample = sample
        self.exit_with_parent = exit_with_parent
        # An explicit device (argument or TUNEDECK_DEVICE) pins the children to it; otherwise the
        # device is named after what this process already sees, and the environment is left alone.
        explicit = device or os.environ.get("TUNEDECK_DEVICE")
        self.pinned = bool(explicit)
        self.device = str(explicit or os.environ.get("CUDA_VISIBLE_DEVICES") or "0")
        self.db_retry_max_s = 30.0  # the longest wait between tries while the database is unreachable
        self.sampler: Sampler | None = None
        self._stop = threading.Event()
        self._stop_reason = "worker stopped"
        self._last_beat = 0.0
        # stop() writes a byte here so a watch asleep in select() wakes at once (see wait_exit).
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        weakref.finalize(self, _close_fds, self._wake_r, self._wake_w)

    # ------------------------------------------------------------------ public
    def stop(self, reason: str = "worker stopped") -> None:
        """Ask the loop to stop: no new runs; a running child gets SIGTERM, then SIGKILL."""
        self._stop_reason = reason
        self._stop.set()
        try:
            os.write(self._wake_w, b"x")
        except OSError:  # the pipe is full: a wake-up is already waiting
            pass

    def work(self, burst: bool = False, stop_after: int | None = None) -> int:
        """Serve the queue (burst: until it is empty; stop_after: until that run is done). Returns runs done."""
        handlers = self._install_signal_handlers()
        if self.sample:
            self.sampler = Sampler(
                self.store, GpuProbe(visible=self.device if self.pinned else None), worker_id=self.worker_id
            )
            self.sampler.start()
        done = 0
        delay = 0.0  # backoff while the database fails
        try:
            self.publish_device()
            next_cleanup = 0.0
            while not self._stop.is_set():
                try:
                    if time.monotonic() >= next_cleanup:  # the device may be held by a dead worker's run
                        next_cleanup = time.monotonic() + self.stale_after / 2
                        self.cleanup_stale()
                        self._take_over_device()
                    self._beat()
                    if self.exit_with_parent and not pid_alive(self.exit_with_parent):
                        log.info("parent process %s is gone; stopping", self.exit_with_parent)
                        break
                    run = self.store.claim_next_on_device(self.worker_id, self.device, os.getpid(), host=self.host)
                    if run is None:
                        if burst and not self.store.queued():
                            break
                        delay = 0.0
                        self._stop.wait(self.poll_interval)
                        continue
                    problem = spec_problem(run.spec_json)
                    if problem is not None:  # another version's spec, or edited by hand: fail it, go on
                        self.store.mark_failed(run.id, problem[:2000], problem)
                        self.store.release_device(self.device, self.worker_id, host=self.host)
                        continue
                    delay = 0.0
                except SQLAlchemyError as exc:  # the database is down or locked: wait, log, go on
                    delay = min(max(2 * delay, self.poll_interval), self.db_retry_max_s)
                    log.error(
                        "worker %s: database error (%s); retrying in %.1f s", self.worker_id, _first_line(exc), delay
                    )
                    self._stop.wait(delay)
                    continue
                self.execute(run)
                done += 1
                if stop_after is not None and run.id == stop_after:
                    break
        finally:
            if self.sampler is not None:
                self.sampler.stop()
            self._quietly(self.store.worker_gone, self.worker_id)
            self._restore_signal_handlers(handlers)
        return done

    def publish_device(self) -> None:
        """Tell the store what this worker trains on (checks and the GPU panel read it, not their own device)."""
        from jobs.devices.probe import detect

        facts = detect(int(self.device) if self.device.isdigit() else 0)
        try:
            self.store.publish_device(self.worker_id, self.host, facts.to_dict())
        except Exception:  # bookkeeping: the worker trains without it (checks fall back to this machine)
            log.exception("could not publish this worker's device facts")
        log.info("worker %s device: %s", self.worker_id, facts.summary())

    def cleanup_stale(self) -> list[int]:
        """Mark running runs interrupted whose worker is gone; kill their orphaned children."""
        marked = []
        stale = {r.id: r for r in self.store.stale_running(self.stale_after)}
        for run in self.store.list_runs(status=RunStatus.RUNNING, limit=10_000):
            if run.id in stale:
                reason = f"worker {run.worker_id} stopped sending heartbeats (none for {self.stale_after:g} s)"
            elif self._dead_local_worker(run):
                reason = f"worker {run.worker_id} (pid {run.worker_pid}) is no longer running"
            else:
                continue
            # Marked first: the orphan answers SIGTERM by saving a checkpoint and marking its run
            # cancelled, which must not win over 'interrupted'.
            if self.store.mark_interrupted(run.id, reason):
                log.warning("run %s interrupted: %s", run.id, reason)
                marked.append(run.id)
            self._kill_orphan(run)
        return marked

    # ------------------------------------------------------------------ one run
    def execute(self, run: RunRecord) -> RunStatus:
        """Run one claimed run in a child process and record how it ended.

        A child that ran out of memory and recorded a recovery (`jobs.train.oom`) exits with
        EXIT_OOM_RECOVER: the run is still ours and running, so a fresh child continues it."""
        for attempt in range(MAX_RECOVERIES + 1):
            status = self._execute_once(run, may_restart=attempt < MAX_RECOVERIES)
            if status is not _RESTART:
                return status  # type: ignore[return-value]
            current = self.store.get_run(run.id)
            if current is None or current.status is not RunStatus.RUNNING:
                break
            if self._stop.is_set():
                self.store.mark_interrupted(
                    run.id,
                    f"{self._stop_reason} while the run was recovering from out of memory; queue it again to retry",
                )
                break
            log.warning("run %s: out-of-memory recovery recorded; starting a fresh training process", run.id)
        return self._status(run.id)

    def _execute_once(self, run: RunRecord, may_restart: bool = False) -> RunStatus | object:
        try:
            log_path = self.store.run_dir(run.id) / "train.log"
        except RunFolderError as exc:
            self.store.mark_failed(run.id, str(exc))
            self._release()
            return self._status(run.id)
        env = dict(
            os.environ,
            TUNEDECK_HOME=str(data_dir()),
            TUNEDECK_DATABASE_URL=self.store.url,
            PYTHONUNBUFFERED="1",
            TUNEDECK_DEVICE=self.device,
            TUNEDECK_WORKER_ID=self.worker_id,
        )
        if self.pinned:
            # A GPU index or UUID pins the child to that GPU; any other name (a CPU stand-in) hides them all.
            env["CUDA_VISIBLE_DEVICES"] = self.device if _is_gpu_id(self.device) else ""
        try:
            with open(log_path, "ab") as out:
                child = subprocess.Popen(
                    self.child_argv(run.id),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
        except OSError as exc:
            self.store.mark_failed(run.id, f"could not start the training process: {exc}")
            self._release()
            return self._status(run.id)
        log.info("run %s: started child pid %s, log %s", run.id, child.pid, log_path)
        try:
            self._quietly(self.store.set_child, run.id, child.pid, str(log_path))
            if self.sampler is not None:
                self.sampler.set_run(run.id, child.pid)
            returncode, why = self._watch(run.id, child)
        finally:
            _killpg(child.pid, signal.SIGKILL)  # nothing of the group outlives its run
            wait_group_gone(child.pid, self.grace_period)
            if self.sampler is not None:
                self.sampler.set_run(None)
        if returncode == EXIT_OOM_RECOVER and why is None and may_restart:
            return _RESTART  # the same run goes on in a fresh child: the device stays leased
        try:
            return self._record_end(run.id, returncode, why, log_path)
        finally:
            self._release()  # the group is gone: the device is free for the next run

    def _watch(self, run_id: int, child: subprocess.Popen) -> tuple[int, str | None]:
        """Wait for the child, heartbeating; returns (returncode, 'cancel'|'stop'|None)."""
        pidfd = open_pidfd(child.pid)
        try:
            return self._watch_loop(run_id, child, pidfd)
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def _watch_loop(self, run_id: int, child: subprocess.Popen, pidfd: int | None) -> tuple[int, str | None]:
        next_check = 0.0
        while True:
            now = time.monotonic()
            returncode = wait_exit(child, max(0.0, next_check - now), self._wake_r, pidfd)
            if returncode is not None:
                return returncode, None
            now = time.monotonic()
            if self._stop.is_set():
                # Marked first: the child answers SIGTERM by marking its run cancelled, but a
                # worker shutdown is not the user's cancel.
                self.store.mark_interrupted(
                    run_id, f"{self._stop_reason} while the run was running; queue it again to retry"
                )
                return self._terminate(child, run_id), "stop"
            if now >= next_check:
                next_check = now + self.poll_interval
                try:
                    self._beat(run_id)
                    current = self.store.run_control(run_id)
                except SQLAlchemyError as exc:  # bookkeeping failed: the training goes on
                    log.error("run %s: database error while watching (%s); training goes on", run_id, _first_line(exc))
                    time.sleep(_WATCH_TICK)
                    continue
                if current is not None and current.cancel_requested and current.status is RunStatus.RUNNING:
                    log.info("run %s: cancel requested; SIGTERM to process group %s", run_id, child.pid)
                    return self._terminate(child, run_id), "cancel"
                if current is None or current.status in (RunStatus.CANCELLED, RunStatus.INTERRUPTED):
                    # Deleted or ended by someone else: the child has no business left.
                    return self._terminate(child), "gone"

    def _terminate(self, child: subprocess.Popen, run_id: int | None = None) -> int:
        """SIGTERM the group; SIGKILL it after the grace period. Returns the exit code.

        A child still writing a checkpoint when the grace period ends (a `checkpoint-N` folder
        without its completeness marker) gets up to `save_grace` more seconds to finish it.
        """
        _killpg(child.pid, signal.SIGTERM)
        start = time.monotonic()
        deadline, extended = start + self.grace_period, False
        while child.poll() is None:
            now = time.monotonic()
            if now >= deadline:
                if not extended and run_id is not None and self._saving(run_id):
                    extended, deadline = True, start + self.grace_period + self.save_grace
                    log.info("run %s: a checkpoint is being written; waiting up to %g s more", run_id, self.save_grace)
                    continue
                break
            time.sleep(_WATCH_TICK)
        if child.poll() is None:
            log.warning("child %s ignored SIGTERM for %.0f s; SIGKILL", child.pid, time.monotonic() - start)
            _killpg(child.pid, signal.SIGKILL)
        return child.wait()

    def _saving(self, run_id: int) -> bool:
        """Whether the run has a checkpoint folder that is not complete yet (being written)."""
        from jobs.train.checkpoints import checkpoint_dirs, is_complete

        try:
            return any(not is_complete(path) for _, path in checkpoint_dirs(self.store.run_dir(run_id) / "output"))
        except (OSError, RunFolderError):
            return False

    def _record_end(self, run_id: int, returncode: int, why: str | None, log_path: Path) -> RunStatus:
        self.store.set_exit_code(run_id, returncode)
        if why == "cancel":
            self.store.mark_cancelled(run_id, exit_code=returncode)
        current = self.store.get_run(run_id)
        if current is not None and current.status is RunStatus.RUNNING:
            summary = describe_exit(returncode)
            if returncode == 0:
                summary += " without reporting a result"
            self.store.mark_failed(run_id, summary, log_tail(log_path), exit_code=returncode)
        status = self._status(run_id)
        log.info("run %s: %s (%s)", run_id, status.value if status else "deleted", describe_exit(returncode))
        return status

    # ------------------------------------------------------------------ helpers
    def _release(self) -> None:
        """Free this worker's device lease, retrying while the database is unreachable (or stopping)."""
        delay = self.poll_interval
        while True:
            try:
                self.store.release_device(self.device, self.worker_id, host=self.host)
                return
            except SQLAlchemyError as exc:
                log.error(
                    "worker %s: could not release device %s (%s); retrying in %.1f s",
                    self.worker_id,
                    self.device,
                    _first_line(exc),
                    delay,
                )
                if self._stop.wait(delay):
                    return  # a restarted worker on this host takes the lease over
                delay = min(2 * delay, self.db_retry_max_s)

    def _take_over_device(self) -> None:
        """Free this host's lease of our device when the worker holding it is dead and its run's processes are gone."""
        lease = self.store.device_lease(self.device, host=self.host)
        holder, pid = lease.get("worker_id"), lease.get("pid")
        if not holder or holder == self.worker_id or pid_alive(pid):
            return
        run = self.store.get_run(lease["run_id"]) if lease.get("run_id") is not None else None
        if run is not None:
            if run.status is RunStatus.RUNNING and self.store.mark_interrupted(
                run.id, f"worker {holder} (pid {pid}) is no longer running"
            ):
                log.warning("run %s interrupted: its worker %s is gone", run.id, holder)
            self._kill_orphan(run)
            if run.child_pid and group_members(run.child_pid):
                return  # still ending; the lease waits for it
        if self.store.release_device(self.device, holder, host=self.host):
            log.info("device %s: lease of dead worker %s released", self.device, holder)

    def _quietly(self, fn: Callable[..., object], *args: object) -> None:
        """A bookkeeping write that must not stop the worker: logged when the database fails."""
        try:
            fn(*args)
        except SQLAlchemyError as exc:
            log.error("%s failed: %s", getattr(fn, "__name__", fn), _first_line(exc))

    def _status(self, run_id: int) -> RunStatus:
        current = self.store.get_run(run_id)
        return current.status if current else RunStatus.FAILED

    def _beat(self, run_id: int | None = None) -> None:
        now = time.monotonic()
        if now - self._last_beat < self.heartbeat_interval:
            return
        self._last_beat = now
        self.store.worker_beat(self.worker_id, os.getpid(), self.host, run_id)

    def _dead_local_worker(self, run: RunRecord) -> bool:
        wid = run.worker_id or ""
        if not wid.startswith(f"{self.host}:") or run.worker_pid is None:
            return False
        return run.worker_pid != os.getpid() and not pid_alive(run.worker_pid)

    def _kill_orphan(self, run: RunRecord) -> None:
        """A training child whose worker died keeps the GPU busy: end it (only if it is ours)."""
        wid = run.worker_id or ""
        if not run.child_pid or not wid.startswith(f"{self.host}:"):
            return
        try:
            cmdline = psutil.Process(run.child_pid).cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return
        if "jobs.train.child" in cmdline and str(run.id) in cmdline:  # guard against pid reuse
            log.warning("run %s: ending orphaned training process group %s", run.id, run.child_pid)
            _killpg(run.child_pid, signal.SIGTERM)  # warm: it saves a checkpoint at the next step
            deadline = time.monotonic() + self.grace_period
            while group_members(run.child_pid) and time.monotonic() < deadline:
                time.sleep(_WATCH_TICK)
            _killpg(run.child_pid, signal.SIGKILL)

    def _install_signal_handlers(self) -> dict[int, object]:
        if threading.current_thread() is not threading.main_thread():
            return {}  # signals are only delivered to the main thread; the caller uses stop()

        def handle(signum: int, _frame: FrameType | None) -> None:
            self.stop(f"worker received {signal.Signals(signum).name}")

        old = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            old[sig] = signal.signal(sig, handle)
        return old

    @staticmethod
    def _restore_signal_handlers(old: dict[int, object]) -> None:
        for sig, handler in old.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
