"""The worker: takes queued runs (one at a time, or several sharing its device) and runs each in its own training process.

    tunedeck worker            # serve the queue until SIGTERM / Ctrl-C
    tunedeck worker --burst    # drain the queue, then exit (tests, benchmarks)

One device, one running run (unless runs share it): a worker claims (`Store.claim_next_on_device`, one transaction)
only while no other run holds its device (`device`, default TUNEDECK_DEVICE or "0"), so two workers and two launches
at once give one running run and one queued; the queue is FIFO unless reordered (`Store.move_queued`). Each run gets
`python -m jobs.train.child --run-id N` in its own session (process group), its output in `runs/<id>/train.log`. The
child marks its run succeeded or failed itself; the worker records what the child cannot: a child that dies while its
run is still `running` fails the run with the signal or exit code and the end of the log. Cancel: SIGTERM to the
group, SIGKILL after `grace_period`, then `cancelled`. At start, and every `stale_after / 2` s while it waits, the
worker marks runs interrupted whose heartbeat is stale or whose worker process on this host is dead, so a run of a
SIGKILLed worker is taken over by another. SIGTERM/SIGINT stop it warm: no new runs, SIGTERM forwarded to the child,
wait, exit. At start it publishes its device facts (`jobs.devices.facts`) with the training child's runtime baseline,
measured once per host and cached (`jobs.worker.runtime`). A child that exits with `jobs.train.oom.EXIT_OOM_RECOVER`
has recorded an out-of-memory recovery: a fresh child continues the run. The watch runs the training doctor over new
metric rows (`jobs.doctor.watch`). The child as a process is `jobs.worker.processes`, leases `jobs.worker.leases`, a
run's end `jobs.worker.outcome`; `share` (`--share N`): `jobs.worker.share`, `jobs.worker.pool`; exports, pushes, chat
turns asked through the store: `jobs.worker.services`.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Sequence

from jobs.devices.facts import DeviceFacts, RuntimeBaseline
from jobs.devices.sampler import GpuProbe, Sampler
from jobs.doctor.watch import Doctor
from jobs.queue.saved_prediction import add_runtime
from jobs.spec.stored import read_spec, spec_problem, stored_spec
from jobs.train.oom import EXIT_OOM_RECOVER, MAX_RECOVERIES
from jobs.train.share_cap import EXIT_OUTGREW_SHARE, MEMORY_FRACTION_ENV
from jobs.worker import leases, processes, runtime
from jobs.worker.fit import FitGate
from jobs.worker.outcome import first_line, quietly, record_end, run_status, saving_checkpoint
from jobs.worker.pool import RunPool
from jobs.worker.processes import WATCH_TICK, killpg, open_pidfd, pid_alive, wait_exit, wait_group_gone
from jobs.worker.services import Factory, Place, any_pending, shared_data, start_all, stop_all
from jobs.worker.share import SharePolicy, requeue_alone
from storage.errors import StorageError
from storage.models import RunStatus
from storage.roles_worker import Working
from storage.settings import data_dir, stop_graces
from storage.store import RunFolderError, RunRecord

log = logging.getLogger(__name__)

_RESTART = object()  # _execute_once: the child asked to be started again (OOM recovery)


class Worker:
    """Runs queued runs one at a time in child processes; see the module docstring."""

    def __init__(
        self,
        store: Working,
        worker_id: str | None = None,
        poll_interval: float = 1.0,
        heartbeat_interval: float = 2.0,
        stale_after: float = 30.0,
        grace_period: float = 20.0,
        *,
        child_argv: Callable[[int], list[str]] | None = None,
        baseline_argv: list[str] | None = None,
        sample: bool = True,
        exit_with_parent: int | None = None,
        device: str | None = None,
        save_grace: float | None = None,
        share: SharePolicy | None = None,
        services: Sequence[Factory] = (),
    ) -> None:
        self.store = store
        self.host = socket.gethostname()
        self.worker_id = worker_id or f"{self.host}:{os.getpid()}"
        self.poll_interval = poll_interval
        self.heartbeat_interval = heartbeat_interval
        self.stale_after = stale_after
        # How long a stopping child gets after SIGTERM, and how much longer to finish a checkpoint it has begun.
        self.grace_period, self.save_grace = stop_graces(grace_period, save_grace)
        self.child_argv = child_argv or processes.default_child_argv  # tests swap in a fake child
        # The runtime baseline is the real training child's: a stand-in child (tests) has none
        # unless the caller gives the command that measures one (it prints {"runtime_bytes": N, "trainer_bytes": {}}).
        self.measured: RuntimeBaseline | None = None  # this host's runtime baseline once publish_device has measured it
        self.trains_on_cpu = False  # known once publish_device has probed the device
        self._baseline: threading.Thread | None = None  # the runtime baseline's measurement, while it runs
        self.baseline_argv = baseline_argv or (None if child_argv else processes.baseline_argv())
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
        self._beat_lock = threading.Lock()
        self._children: dict[int, int] = {}  # run id -> child pid of every run training now (heartbeats)
        self.share = share or SharePolicy()
        self.fit = FitGate(store, self.worker_id, self.share)  # what this device cannot hold is passed over
        self.services = list(services)  # what the worker carries out beside training (`jobs.worker.services`)
        self.pool: RunPool | None = None  # set by publish_device when `share` lets runs share the device
        # stop() writes a byte here so a watch asleep in select() wakes at once (see wait_exit).
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        weakref.finalize(self, processes.close_fds, self._wake_r, self._wake_w)

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
        handlers = processes.install_stop_handlers(self.stop)
        if self.sample:
            self.sampler = Sampler(
                self.store, GpuProbe(visible=self.device if self.pinned else None), worker_id=self.worker_id
            )
            self.sampler.start()
        done, delay, running = 0, 0.0, []  # delay: backoff while the database fails; running: services
        try:
            self.publish_device()
            running = start_all(self.place(), self.services)  # exports, pushes, chat turns asked through the store
            next_cleanup = 0.0
            while not self._stop.is_set() and not (self.pool and stop_after in self.pool.finished):
                try:
                    if time.monotonic() >= next_cleanup:  # the device may be held by a dead worker's run
                        next_cleanup = time.monotonic() + self.stale_after / 2
                        self.cleanup_stale()
                        # a dead worker's lease of our device, once its run's processes are gone
                        leases.take_over_device(self.store, self.device, self.worker_id, self.host, self.grace_period)
                    self._beat()
                    if self.exit_with_parent and not pid_alive(self.exit_with_parent):
                        log.info("parent process %s is gone; stopping", self.exit_with_parent)
                        self.stop("the parent process is gone")  # shared runs still training stop too
                        break
                    run = None if self.pool is not None and self.pool.full() else self._claim()
                    if run is None:
                        idle = self.pool is None or not self.pool.active
                        if burst and idle and not self.fit.any_queued() and not any_pending(running):
                            break  # no run left, and no export, push or chat turn this worker can carry out
                        delay = 0.0
                        self._stop.wait(self.poll_interval) if idle else self.pool.wait_slot(self.poll_interval)  # type: ignore[union-attr]
                        continue
                    problem = spec_problem(run.spec_json)
                    if problem is not None:  # another version's spec, or edited by hand: fail it, go on
                        self.store.mark_failed(run.id, problem[:2000], problem)
                        self.store.release_device(self.device, self.worker_id, host=self.host, run_id=run.id)
                        continue
                    delay = 0.0
                except StorageError as exc:  # the database is down or locked: wait, log, go on
                    delay = min(max(2 * delay, self.poll_interval), self.db_retry_max_s)
                    log.error(
                        "worker %s: database error (%s); retrying in %.1f s", self.worker_id, first_line(exc), delay
                    )
                    self._stop.wait(delay)
                    continue
                done += 1
                if self.pool is not None:
                    self.pool.start(run, self.execute, self.stop)
                    continue
                self.execute(run)
                if stop_after is not None and run.id == stop_after:
                    break
        except BaseException:
            self.stop("the worker failed")  # the shared runs' children are stopped, not left behind
            raise
        finally:
            stop_all(running)
            if self.pool is not None:
                self.pool.join()
            if not self._stop.is_set():
                self.baseline_known()  # a burst worker on an empty queue still publishes its runtime
            if self.sampler is not None:
                self.sampler.stop()
            quietly(self.store.worker_gone, self.worker_id)
            processes.restore_handlers(handlers)
        return done

    def publish_device(self) -> None:
        """Tell the store what this worker trains on (checks and the GPU panel read it, not their own device).

        The facts go out at once; the runtime baseline (cached, else measured in a child like the training
        one: seconds) is measured meanwhile and published with them when known, so the worker is live and
        claiming from its first second. A run waits for the figure before it starts (`execute`)."""
        from jobs.devices.probe import detect

        facts = detect(int(self.device) if self.device.isdigit() else 0)
        self.trains_on_cpu = facts.kind != "cuda"  # the children's allocator setting follows (child_env)
        self.fit.facts = facts
        if self.share.enabled and self.pool is None:  # published once more (a bench): the same pool
            self.pool = RunPool(self.share, facts.total_bytes)
        self._publish(facts)
        if self.baseline_argv is None:
            return
        argv, env = self.baseline_argv, self.child_env()

        def measure() -> None:
            self.measured = runtime.baseline(argv, env)
            if self.measured is not None:
                self._publish(facts.with_baseline(self.measured))

        self._baseline = threading.Thread(target=measure, name="runtime-baseline", daemon=True)
        self._baseline.start()

    def place(self) -> Place:
        """Where this worker is, for the services (`jobs.worker.services`)."""
        return Place(self.store, self.worker_id, self.host, self.device, self.trains_on_cpu, shared_data())

    def _publish(self, facts: DeviceFacts) -> None:
        try:
            self.store.publish_device(self.worker_id, self.host, facts.to_dict())
        except Exception:  # bookkeeping: the worker trains without it (checks fall back to this machine)
            log.exception("could not publish this worker's device facts")
        log.info("worker %s device: %s", self.worker_id, facts.summary())

    def baseline_known(self) -> None:
        """Wait for the runtime baseline's measurement (started by publish_device), if one is under way."""
        if self._baseline is not None:
            self._baseline.join()

    def cleanup_stale(self) -> list[int]:
        """Mark running runs interrupted whose worker is gone; kill their orphaned children."""
        return leases.cleanup_stale(self.store, self.host, self.stale_after, self.grace_period)

    # ------------------------------------------------------------------ one run
    def execute(self, run: RunRecord) -> RunStatus:
        """Run one claimed run in a child process and record how it ended.

        A child that ran out of memory and recorded a recovery (`jobs.train.oom`) exits with
        EXIT_OOM_RECOVER: the run is still ours and running, so a fresh child continues it."""
        self.baseline_known()
        trainer = stored_spec(run.spec_json).trainer  # whose own trl classes the runtime part adds
        if self.measured is not None and add_runtime(self.store, run.id, self.measured, trainer, self.worker_id):
            log.info("run %s: its prediction now counts this host's runtime baseline", run.id)
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
        return run_status(self.store, run.id)

    def _execute_once(self, run: RunRecord, may_restart: bool = False) -> RunStatus | object:
        try:
            log_path = self.store.run_dir(run.id) / "train.log"
        except RunFolderError as exc:
            self.store.mark_failed(run.id, str(exc))
            self._release(run.id)
            return run_status(self.store, run.id)
        try:
            child = processes.spawn(self.child_argv(run.id), log_path, self.child_env(run.id))
        except OSError as exc:
            self.store.mark_failed(run.id, f"could not start the training process: {exc}")
            self._release(run.id)
            return run_status(self.store, run.id)
        log.info("run %s: started child pid %s, log %s", run.id, child.pid, log_path)
        try:
            self._children[run.id] = child.pid
            quietly(self.store.set_child, run.id, child.pid, str(log_path))
            if self.sampler is not None:
                self.sampler.set_run(run.id, child.pid)  # sharing: the newest run (per-run telemetry is to come)
            returncode, why = self._watch(run.id, child, Doctor(self.store, run.id, read_spec(run.spec_json)))
        finally:
            killpg(child.pid, signal.SIGKILL)  # nothing of the group outlives its run
            wait_group_gone(child.pid, self.grace_period)
            self._children.pop(run.id, None)
            if self.sampler is not None:
                self.sampler.set_run(*next(iter(self._children.items()), (None, None)))
        if returncode == EXIT_OOM_RECOVER and why is None and may_restart:
            return _RESTART  # the same run goes on in a fresh child: the device stays leased
        try:
            if returncode == EXIT_OUTGREW_SHARE and why is None and requeue_alone(self.store, run.id):
                return run_status(self.store, run.id)
            return record_end(self.store, run.id, returncode, why, log_path)
        finally:
            self._release(run.id)  # the group is gone: the device (or this run's share of it) is free

    def _watch(self, run_id: int, child: subprocess.Popen, doctor: Doctor) -> tuple[int, str | None]:
        """Wait for the child, heartbeating, running the doctor; returns (returncode, 'cancel'|'stop'|None)."""
        pidfd = open_pidfd(child.pid)
        try:
            return self._watch_loop(run_id, child, pidfd, doctor)
        finally:
            if pidfd is not None:
                os.close(pidfd)
            quietly(doctor.check, True)  # the rows the child wrote last (its NaN's, its end's)

    def _watch_loop(self, run_id: int, child: subprocess.Popen, fd: int | None, doc: Doctor) -> tuple[int, str | None]:
        next_check = 0.0
        while True:
            now = time.monotonic()
            returncode = wait_exit(child, max(0.0, next_check - now), self._wake_r, fd)
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
                    if doc.due():  # the new rows (jobs.doctor.watch); a doctor_stop_on finding asks for a cancel
                        doc.check()
                    current = self.store.run_control(run_id)
                except StorageError as exc:  # bookkeeping failed: the training goes on
                    log.error("run %s: database error while watching (%s); training goes on", run_id, first_line(exc))
                    time.sleep(WATCH_TICK)
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
        saving = (lambda: saving_checkpoint(self.store, run_id)) if run_id is not None else None
        return processes.terminate(child, self.grace_period, self.save_grace, saving, what=f"run {run_id}")

    # ------------------------------------------------------------------ helpers
    def _claim(self) -> RunRecord | None:
        """The next run this device has room for: alone, or next to the runs sharing it (`jobs.worker.pool`)."""
        skip = self.fit.passed_over(self.host, self.device, list(self._children.values()))
        if self.pool is not None:
            return self.pool.claim(self.store, self.worker_id, self.device, os.getpid(), self.host, skip)
        return self.store.claim_next_on_device(self.worker_id, self.device, os.getpid(), host=self.host, skip=skip)

    def child_env(self, run_id: int | None = None) -> dict[str, str]:
        """The environment of a training child (and of the runtime baseline, measured like one).

        A shared run on a CUDA device gets its memory cap (`jobs.train.share_cap`)."""
        env = dict(
            os.environ,
            TUNEDECK_HOME=str(data_dir()),
            TUNEDECK_DATABASE_URL=self.store.url,
            PYTHONUNBUFFERED="1",
            TUNEDECK_DEVICE=self.device,
            TUNEDECK_WORKER_ID=self.worker_id,
        )
        if self.trains_on_cpu:  # the run's spec picks the allocator
            env.update(processes.run_allocator_env(env, self.store.get_run(run_id) if run_id is not None else None))
        if self.pinned:
            # A GPU index or UUID pins the child to that GPU; any other name (a CPU stand-in) hides them all.
            env["CUDA_VISIBLE_DEVICES"] = self.device if processes.is_gpu_id(self.device) else ""
        fraction = self.pool.fraction(run_id) if self.pool is not None and run_id is not None else None
        if fraction is not None and not self.trains_on_cpu:
            env[MEMORY_FRACTION_ENV] = f"{fraction:.6f}"
        return env

    def _release(self, run_id: int) -> None:
        """Free this run's hold on the device, retrying while the database is unreachable (or stopping)."""
        waits = (self.poll_interval, self.db_retry_max_s)
        leases.release_device(self.store, self.device, self.worker_id, self.host, self._stop, *waits, run_id)

    def _beat(self, run_id: int | None = None) -> None:
        """The worker's presence and the heartbeat of every run it trains (sharing: all of them at once)."""
        with self._beat_lock:
            now = time.monotonic()
            if now - self._last_beat < self.heartbeat_interval:
                return
            self._last_beat = now
        shared = self.pool.active if self.pool is not None else []  # claimed, maybe not started yet
        runs = {*self._children, *shared, *([run_id] if run_id is not None else [])}
        self.store.worker_beat(self.worker_id, os.getpid(), self.host, sorted(runs))
