"""The dispatcher: claims queued runs from the store and hands each to a cluster's scheduler (an `Engine`).

    tunedeck worker --executor slurm --partition gpu --max-jobs 8     # serve the queue until SIGTERM
    Dispatcher(store, SlurmEngine(...), max_jobs=2).work(burst=True)  # tests: until nothing is left

It claims (`Store.claim_for_engine`: no device lease, the cluster hands out the GPUs) while fewer
than `max_jobs` of its runs are on the cluster, and submits each as `python -m
jobs.worker.engine_job --run-id N`, the command that runs a claimed run on the node exactly as a
local worker runs it (training child, heartbeats, memory samples, cancel, OOM recovery), with the
store URL and the data folder in its environment and its output in `runs/<id>/engine.log`. It
then follows every job's state (`Engine.state`), writes it to the run (`engine_state`, shown on
the run page) with a run event per change, and heartbeats the runs while they wait on the cluster.

GPU types (`jobs.cluster.gpu_types`): with sized types (`--gpu-type t4=16GiB,a100=80GiB`) the dispatcher
publishes the largest as its device, so submit checks and predicts against a GPU of the cluster, and
asks for each run the smallest type its saved prediction fits, saying which and why in the run's
"submitted" event (a prediction made on the CPU, before the dispatcher published its GPU, is made again
for each type's GPU: the CPU's fp32 and resident figure is larger); one unsized type is asked for every run.

Cancel: a queued-on-the-cluster (PENDING) job is cancelled at once and its run marked cancelled;
a running one gets TERM from the engine (the job's worker has seen the store's cancel flag too and
stops the training child warm), and KILL when it is still there after `grace_period + save_grace`.

How a run ended is decided here, once its job has ended, from the engine's state (the job's own
side may have marked the run interrupted or cancelled on the engine's SIGTERM: `Store.settle_engine_run`
replaces that): a run that succeeded or failed by itself keeps its status; a cancel asked for in
tunedeck ends cancelled; a preempted or node-failed job (REQUEUE) marks the run interrupted with the
engine's reason and puts it at the head of the queue, so it is submitted again and resumes from
its last checkpoint; any other end fails it with the engine's reason ("Slurm: TIMEOUT (time limit
00:01:00)", "cancelled outside tunedeck (Slurm: CANCELLED)"); a run its job's worker already failed
(a killed training child) gains the engine's reason in front of its own ("Slurm: OUT_OF_MEMORY ...;
training process killed by signal SIGKILL (9)"). A submission the engine refuses fails its run with
the engine's own message.

Stopping the dispatcher leaves its jobs running. A dispatcher that starts (and, every
`stale_after / 2` s, one that runs) adopts the running runs of its engine whose dispatcher is gone
(`Store.engine_runs`), following their jobs instead of submitting them again; a run claimed but
never submitted (its dispatcher died in between) goes back to the queue.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from jobs.cluster.engine import Engine, EngineError, JobState, Phase, Submission
from jobs.cluster.gpu_types import Pick, facts_of, parse_gpu_types, pick, predicted_on
from jobs.queue.saved_prediction import load_prediction, predicted_bytes
from jobs.spec.stored import read_spec, spec_problem
from storage.errors import StorageError
from storage.models import RunStatus
from storage.records import RunControl
from storage.roles_worker import Dispatching
from storage.run_files import log_tail
from storage.settings import CANCEL_GRACE_ENV, SAVE_GRACE_ENV, data_dir, stop_graces
from storage.store import RunFolderError, RunRecord

log = logging.getLogger(__name__)

JOB_MODULE = "jobs.worker.engine_job"  # what a cluster job runs (a module of jobs.worker, above this package)
EVENT_KIND = "engine"
LOG_NAME = "engine.log"


def job_argv(run_id: int) -> list[str]:
    """The command a cluster job runs: the same interpreter (a shared install on the cluster's nodes)."""
    return [sys.executable, "-m", JOB_MODULE, "--run-id", str(run_id)]


@dataclass
class Tracked:
    """One run this dispatcher follows on the cluster."""

    run_id: int
    job_id: str
    state: JobState | None = None
    term_at: float | None = None  # when the engine was asked to TERM it (a cancel)
    killed: bool = False


class Dispatcher:
    """Hands queued runs to an engine and follows them; see the module docstring."""

    def __init__(
        self,
        store: Dispatching,
        engine: Engine,
        *,
        worker_id: str | None = None,
        max_jobs: int = 4,
        gpu_type: str | None = None,
        poll_interval: float = 2.0,
        heartbeat_interval: float = 5.0,
        stale_after: float = 30.0,
        grace_period: float = 20.0,
        save_grace: float | None = None,
        argv: Callable[[int], list[str]] = job_argv,
    ) -> None:
        self.store = store
        self.engine = engine
        self.label = engine.name.capitalize()  # "Slurm", "Ray": how messages name it
        self.host = socket.gethostname()
        self.worker_id = worker_id or f"{engine.name}-dispatcher@{self.host}:{os.getpid()}"
        self.max_jobs = max_jobs
        self.gpu_types = parse_gpu_types(gpu_type)  # `--gpu-type`'s value (GpuTypeError when it is wrong)
        self.poll_interval = poll_interval
        self.heartbeat_interval = heartbeat_interval
        self.stale_after = stale_after
        # How long a stopping child gets after SIGTERM, and how much longer to finish a checkpoint it has begun.
        self.grace_period, self.save_grace = stop_graces(grace_period, save_grace)
        self.argv = argv
        self.tracked: dict[int, Tracked] = {}
        self._stop = threading.Event()
        self._last_beat = 0.0

    # ------------------------------------------------------------------ the loop
    def stop(self, reason: str = "dispatcher stopped") -> None:
        """No new submissions; the jobs on the cluster go on (a restarted dispatcher adopts them)."""
        log.info("%s: %s; %d job(s) stay on the cluster", self.worker_id, reason, len(self.tracked))
        self._stop.set()

    def work(self, burst: bool = False) -> int:
        """Serve the queue (burst: until no run is queued and none of ours is on the cluster). Returns runs submitted."""
        handlers = self._install_handlers()
        self.publish_device()
        submitted, next_adopt, delay = 0, 0.0, 0.0
        try:
            while not self._stop.is_set():
                try:
                    if time.monotonic() >= next_adopt:
                        next_adopt = time.monotonic() + self.stale_after / 2
                        self.adopt()
                    self.poll()
                    self._beat()
                    while len(self.tracked) < self.max_jobs and not self._stop.is_set() and self.submit_next():
                        submitted += 1
                    if burst and not self.tracked:  # and nothing left to claim: the loop above took all it could
                        break
                    delay = 0.0
                except StorageError as exc:  # the database is down or locked: wait, log, go on
                    delay = min(max(2 * delay, self.poll_interval), 30.0)
                    log.error("%s: database error (%s); retrying in %.1f s", self.worker_id, exc, delay)
                    self._stop.wait(delay)
                    continue
                self._stop.wait(self.poll_interval)
        finally:
            try:
                self.store.worker_gone(self.worker_id)
            except StorageError:
                log.exception("could not remove this dispatcher's presence row")
            for sig, handler in handlers.items():
                signal.signal(sig, handler)  # type: ignore[arg-type]
        return submitted

    def publish_device(self) -> None:
        """With sized GPU types, the largest as this dispatcher's device: what submit checks and predicts against."""
        facts = facts_of(self.gpu_types, self.host)
        if facts is not None:
            self.store.publish_device(self.worker_id, self.host, facts.to_dict())

    def _install_handlers(self) -> dict[int, object]:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def handle(signum: int, _frame: FrameType | None) -> None:
            self.stop(f"dispatcher received {signal.Signals(signum).name}")

        return {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}

    def _beat(self) -> None:
        """The dispatcher's presence, and the heartbeat of its runs (waiting on the cluster or running there)."""
        now = time.monotonic()
        if now - self._last_beat >= self.heartbeat_interval:
            self._last_beat = now
            self.store.worker_beat(self.worker_id, os.getpid(), self.host, sorted(self.tracked))

    # ------------------------------------------------------------------ submit
    def submit_next(self) -> bool:
        """Claim the next queued run and submit it; False when nothing is queued."""
        run = self.store.claim_for_engine(self.worker_id, self.engine.name)
        if run is None:
            return False
        problem = spec_problem(run.spec_json)
        if problem is not None:  # another version's spec, or edited by hand: fail it, go on
            self.store.mark_failed(run.id, problem[:2000], problem)
            return True
        try:
            log_path = self.store.run_dir(run.id) / LOG_NAME
        except RunFolderError as exc:
            self.store.mark_failed(run.id, str(exc))
            return True
        env = {
            "TUNEDECK_DATABASE_URL": self.store.url,
            "TUNEDECK_HOME": str(data_dir()),
            CANCEL_GRACE_ENV: f"{self.grace_period:g}",
            SAVE_GRACE_ENV: f"{self.save_grace:g}",
            "TUNEDECK_ENGINE": self.engine.name,
            "PYTHONUNBUFFERED": "1",
        }
        chosen = self.gpu_type_of(run)
        gpu_type = chosen.gpu.name if chosen else None
        job = Submission(
            run_id=run.id,
            name=f"tunedeck-run-{run.id}",
            argv=self.argv(run.id),
            env=env,
            log_path=log_path,
            gpu_type=gpu_type,
            node=run.pin_host,
        )
        try:
            job_id = self.engine.submit(job)
        except EngineError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.store.mark_failed(run.id, f"{self.label}: {first}", str(exc))
            self.store.set_engine_state(run.id, "submission refused")
            log.error("run %s: %s", run.id, exc)
            return True
        self.store.set_engine_job(run.id, job_id, "submitted")
        self.store.add_run_event(
            run.id,
            EVENT_KIND,
            f"submitted to {self.label} as job {job_id}{_for_type(chosen)}",
            data={**self._data(job_id, None), "gpu_type": gpu_type},
        )
        self.tracked[run.id] = Tracked(run.id, job_id)
        log.info("run %s: %s job %s (log %s)", run.id, self.label, job_id, log_path)
        return True

    def gpu_type_of(self, run: RunRecord) -> Pick | None:
        """The GPU type `run` asks for: from its saved prediction when that was made for a GPU, else (made on
        the dashboard's CPU before this dispatcher published its GPU, or none saved) predicted again per type."""
        saved = load_prediction(self.store, run.id)
        if not self.gpu_types or self.gpu_types[-1].total_bytes is None or _made_on_gpu(saved):
            return pick(self.gpu_types, predicted_bytes(saved))
        try:
            on = predicted_on(read_spec(run.spec_json))
            return pick(self.gpu_types, predicted_bytes(saved), on)
        except Exception:  # a predictor bug must not stop the dispatching: the saved (larger) figure stands
            log.exception("run %s: predicting its peak per GPU type failed; its saved prediction decides", run.id)
            return pick(self.gpu_types, predicted_bytes(saved))

    def _data(self, job_id: str, state: JobState | None) -> dict[str, str | None]:
        data: dict[str, str | None] = {"engine": self.engine.name, "job_id": job_id}
        if state is not None:
            data |= {"state": state.raw, "phase": state.phase.value, "reason": state.reason, "node": state.node}
        return data

    # ------------------------------------------------------------------ follow
    def adopt(self) -> list[int]:
        """Follow the running runs of this engine whose dispatcher is gone; returns their ids."""
        live = {w.get("worker_id") for w in self.store.live_workers(within_s=self.stale_after)} - {self.worker_id}
        adopted = []
        for run in self.store.engine_runs(self.engine.name):
            if run.id in self.tracked or run.worker_id in live:
                continue
            if not run.engine_job_id:  # claimed, never submitted: its dispatcher died in between
                if self.store.mark_interrupted(run.id, f"its dispatcher {run.worker_id} stopped before submitting it"):
                    self.store.requeue(run.id)
                    log.warning("run %s: claimed by %s but never submitted; queued again", run.id, run.worker_id)
                continue
            if self.store.adopt_engine_run(run.id, self.worker_id):
                self.tracked[run.id] = Tracked(run.id, run.engine_job_id)
                message = f"{self.label} job {run.engine_job_id} adopted by dispatcher {self.worker_id}"
                self.store.add_run_event(run.id, EVENT_KIND, message, data=self._data(run.engine_job_id, None))
                log.info("run %s: %s", run.id, message)
                adopted.append(run.id)
        return adopted

    def poll(self) -> None:
        """Read every followed job's state once and act on it."""
        for tracked in list(self.tracked.values()):
            try:
                state = self.engine.state(tracked.job_id)
            except EngineError as exc:  # the engine is unreachable: the job is asked again next time
                log.error("run %s: could not read %s job %s: %s", tracked.run_id, self.label, tracked.job_id, exc)
                continue
            self._follow(tracked, state)

    def _follow(self, tracked: Tracked, state: JobState) -> None:
        run_id, job_id = tracked.run_id, tracked.job_id
        if tracked.state is None or state.describe() != tracked.state.describe():
            text = state.describe()
            self.store.set_engine_state(run_id, text)
            message = f"{self.label} job {job_id}: {text}"
            self.store.add_run_event(run_id, EVENT_KIND, message, data=self._data(job_id, state))
            log.info("run %s: %s", run_id, message)
        tracked.state = state
        control = self.store.run_control(run_id)
        if control is None:  # the run was deleted: nothing is left to train for
            if not state.phase.ended:
                self.engine.cancel(job_id, "KILL")
            del self.tracked[run_id]
            return
        if state.phase.ended:
            self.settle(tracked, state, control)
            del self.tracked[run_id]
            return
        if control.cancel_requested:
            self._cancel(tracked, state)

    def _cancel(self, tracked: Tracked, state: JobState) -> None:
        """A cancel asked for in tunedeck: at once while the job waits, warm (TERM, then KILL) once it runs."""
        if state.phase is Phase.PENDING:
            self.engine.cancel(tracked.job_id, "KILL")
            self.store.mark_cancelled(tracked.run_id)
            self.store.set_engine_state(tracked.run_id, f"{state.describe()}, cancelled before it started")
            self.store.add_run_event(
                tracked.run_id, EVENT_KIND, f"{self.label} job {tracked.job_id} cancelled before it started"
            )
            del self.tracked[tracked.run_id]
            return
        now = time.monotonic()
        if tracked.term_at is None:
            log.info("run %s: cancel requested; TERM to %s job %s", tracked.run_id, self.label, tracked.job_id)
            self.engine.cancel(tracked.job_id, "TERM")
            tracked.term_at = now
        elif not tracked.killed and now - tracked.term_at > self.grace_period + self.save_grace:
            log.warning("run %s: %s job %s still there after TERM; KILL", tracked.run_id, self.label, tracked.job_id)
            self.engine.cancel(tracked.job_id, "KILL")
            tracked.killed = True

    def settle(self, tracked: Tracked, state: JobState, control: RunControl) -> RunStatus | None:
        """The run's final word once its job has ended (see the module docstring); None when it keeps its own."""
        run_id, text = tracked.run_id, f"{self.label}: {state.describe()}"
        if control.cancel_requested:
            done = self.store.settle_engine_run(run_id, RunStatus.CANCELLED, None)
            return RunStatus.CANCELLED if done else None
        if state.phase is Phase.REQUEUE:
            if not self.store.settle_engine_run(run_id, RunStatus.INTERRUPTED, text):
                return None  # it finished first (succeeded, failed by itself)
            self.store.requeue(run_id)
            self.store.move_queued(run_id, 0)  # it already waited its turn
            message = f"{text}: queued again; it resumes from its last checkpoint"
            self.store.add_run_event(run_id, EVENT_KIND, message, data=self._data(tracked.job_id, state))
            log.warning("run %s: %s", run_id, message)
            return RunStatus.QUEUED
        if state.phase is Phase.CANCELLED:
            summary = f"cancelled outside tunedeck ({text}, e.g. scancel)"
        elif state.phase is Phase.SUCCEEDED:
            if control.status is not RunStatus.RUNNING:
                return None  # it ended in the store (interrupted by its worker's stop, say): that stands
            summary = f"{text}: the job ended without the run reporting a result"
        else:
            summary = text
        detail = None
        try:
            detail = log_tail(self.store.run_path(run_id) / LOG_NAME)
        except RunFolderError:
            pass
        if self.store.settle_engine_run(run_id, RunStatus.FAILED, summary, detail):
            log.error("run %s failed: %s", run_id, summary)
            return RunStatus.FAILED
        killed = state.phase is Phase.FAILED and state.raw != "FAILED"  # not the job's own failure: OUT_OF_MEMORY, ...
        if killed and control.status is RunStatus.FAILED and self.store.add_engine_reason(run_id, text):
            # The job's worker saw only a killed child (an OOM kill, say); the engine knows why.
            log.error("run %s failed: %s", run_id, text)
        return None


def _made_on_gpu(saved: dict | None) -> bool:
    """Whether a saved prediction was made for a GPU (the dispatcher's published one), not the dashboard's CPU."""
    device = (saved or {}).get("device") or {}
    return device.get("kind") == "cuda"


def _for_type(chosen: Pick | None) -> str:
    """' for GPU type a100 (80.0 GiB): predicted 21.0 GiB; t4 (16.0 GiB) leaves too little', or ''."""
    if chosen is None:
        return ""
    return f" for GPU type {chosen.gpu}" + (f": {chosen.why}" if chosen.why else "")
