"""The worker's task service: carries out the exports, pushes, benchmarks and judgings asked for through the store (`jobs.worker.tasks`).

    Worker(store, services=[task_service])     # `tunedeck worker` does this (app.cli.main)

One thread per worker takes queued tasks whose run's weights it can reach (`weights_here`; a run no
worker trained, e.g. an imported one, when its folder is here), oldest first, one at a time, and runs
each as a child process: `tunedeck export ...` / `tunedeck push ...`, the command a user would type,
in its own session, its output in `runs/<id>/tasks/<task>-<kind>.log` (a file, never a pipe). The
service tails that file into the task's log in the store and beats its heartbeat about every second;
a crash of the child is the task's failure, with the command's own error, never the worker's.

GPU work respects the device: on a GPU worker a merged or GGUF export first takes the worker's device
lease (`Store.hold_device_for_task`) under a holder id of its own. While a training run holds it the
task waits, saying "waiting for run N to finish with GPU 0"; while the export holds it the worker's
training claims wait. A push loads no model and takes no lease. On a CPU worker nothing is leased.

Cancel (`Store.cancel_task`): SIGTERM to the child's group, SIGKILL after `grace_period`. A worker
that stops fails the task it is carrying out ("request it again"); one that dies leaves a stale
heartbeat, and any worker's service fails that task within `stale_after` seconds.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from jobs.train.parent_watch import STOP_WITH_PARENT_ENV
from jobs.worker import processes
from jobs.worker.outcome import first_line
from jobs.worker.services import Place, run_host, weights_here
from jobs.worker.tasks import TaskKind, cli_args, describe
from storage.errors import StorageError
from storage.models import TaskStatus
from storage.roles import RunFolders
from storage.roles_tasks import TaskServing
from storage.settings import data_dir
from storage.store import TaskRecord

log = logging.getLogger(__name__)

CLI = [sys.executable, "-m", "app.cli.main"]
FILE_KINDS = ("export", "merged", "gguf")  # the artifacts an export records (each with its sha256)
ERROR_LINES = 6  # the end of the command's output kept as the task's error when it fails


KINDS = tuple(k.value for k in TaskKind)  # every kind of task this service carries out


def default_argv(task: TaskRecord) -> list[str]:
    return CLI + cli_args(task)


class TaskService:
    """See the module docstring. `argv_of` builds a task's command (tests swap in a fake one)."""

    name = "tasks"

    def __init__(
        self,
        place: Place,
        *,
        poll_interval: float = 1.0,
        beat_interval: float = 1.0,
        stale_after: float = 30.0,
        grace_period: float = 10.0,
        argv_of: Callable[[TaskRecord], list[str]] = default_argv,
    ) -> None:
        self.place = place
        self.store: TaskServing = place.store
        self.poll_interval = poll_interval
        self.beat_interval = beat_interval
        self.stale_after = stale_after
        self.grace_period = grace_period
        self.argv_of = argv_of
        self.holder = f"{place.worker_id}#task"[:128]  # the device lease's holder while a GPU task runs
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.done: list[int] = []  # ids of the tasks this service carried out (tests, logs)
        self._looking = False  # between looking for a task and the end of the one it took

    # ------------------------------------------------------------------ Service
    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="worker-tasks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.grace_period + 10)

    def pending(self) -> bool:
        if self._looking:
            return True
        return any(self.reachable(t.run_id) for t in self.store.queued_tasks(KINDS))

    def _serve(self) -> None:
        delay = self.poll_interval
        while not self._stop.is_set():
            try:
                self.store.fail_stale_tasks(self.stale_after)
                self._looking = True  # a task claimed is no longer queued: pending() still sees it
                try:
                    task = self.take()
                    if task is not None:
                        self.carry_out(task)
                finally:
                    self._looking = False
                if task is None:
                    self._stop.wait(self.poll_interval)
                    continue
                delay = self.poll_interval
            except StorageError as exc:  # the database is down: wait and go on (the worker does too)
                log.error("tasks: database error (%s); retrying in %.1f s", first_line(exc), delay)
                self._stop.wait(delay)
                delay = min(2 * delay, 30.0)
            except Exception:  # a bug in one task's bookkeeping must not end the service for the others
                log.exception("tasks: carrying out a task failed")
                self._stop.wait(self.poll_interval)

    # ------------------------------------------------------------------ one task
    def reachable(self, run_id: int | None) -> bool:
        if run_id is None:  # a task on a spec (try rewards): any worker can load its base and data
            return True
        run = self.store.get_run(run_id)
        if run is None:
            return False
        if run_host(run) is None:  # no worker trained it (imported): its folder is where it lives
            return self.store.run_path(run_id).is_dir()
        return weights_here(run, self.place)

    def take(self) -> TaskRecord | None:
        """Claim the oldest queued task this worker can carry out; None when there is none."""
        for task in self.store.queued_tasks(KINDS):
            if self._stop.is_set():  # a stopping worker takes nothing more (a burst worker stops at once)
                return None
            if self.reachable(task.run_id):
                claimed = self.store.claim_task(task.id, self.place.worker_id)
                if claimed is not None:
                    return claimed
        return None

    def carry_out(self, task: TaskRecord) -> TaskStatus:
        """Run one claimed task's child, following it into the store; returns how it ended."""
        gpu = TaskKind(task.kind).uses_gpu and not self.place.on_cpu
        try:
            if gpu and not self._hold_device(task):
                return self._status(task.id)
            return self._run_child(task, self._release if gpu else lambda: None)
        except BaseException as exc:  # recorded on the task (not left to go stale), then raised to the service's log
            self.store.finish_task(task.id, TaskStatus.FAILED, error=f"the worker's task service failed: {exc!r}")
            raise
        finally:
            if gpu:
                self._release()  # again, for a task that ended before its child (a no-op when already free)
            self.done.append(task.id)

    def _release(self) -> None:
        self.store.release_device(self.place.device, self.holder, host=self.place.host)

    def _hold_device(self, task: TaskRecord) -> bool:
        """Take the worker's device lease for `task`, waiting while a training run holds it; False if it ended."""
        shown = None
        while True:
            held = self.store.hold_device_for_task(
                self.place.device, self.holder, self.place.host, task.run_id, task.id, os.getpid()
            )
            if not held:
                return True
            runs = [str(r.get("run_id")) for r in held.get("runs", [])] or [str(held.get("run_id"))]
            blocking = f"waiting for run {', '.join(runs)} to finish with GPU {self.place.device}"
            control = self.store.task_progress(task.id, [blocking] if blocking != shown else [])
            shown = blocking
            if control is None or control.status is not TaskStatus.RUNNING:
                return False
            if control.cancel_requested:
                self.store.finish_task(task.id, TaskStatus.CANCELLED, error="cancelled while waiting for the GPU")
                return False
            if self._stop.wait(self.poll_interval):
                self.store.finish_task(task.id, TaskStatus.FAILED, error=self._stopped_reason("waited for the GPU"))
                return False

    def _run_child(self, task: TaskRecord, release: Callable[[], None]) -> TaskStatus:
        """Spawn the task's command and follow it; `release` frees the GPU once its group is gone, before the
        end is recorded (a task shown finished no longer holds the device)."""
        log_path = task_file(self.store, task, "log")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = self.argv_of(task)
        begun = time.time()
        self.store.task_progress(task.id, [f"$ tunedeck {' '.join(cli_args(task))}   (on {self.place.worker_id})"])
        try:
            child = processes.spawn(argv, log_path, self._child_env())
        except OSError as exc:
            self.store.finish_task(task.id, TaskStatus.FAILED, error=f"could not start `{argv[0]}`: {exc}")
            return TaskStatus.FAILED
        log.info(
            "task %s (%s of run %s): child pid %s, log %s", task.id, describe(task), task.run_id, child.pid, log_path
        )
        tail = _Tail(log_path)
        why = None
        try:
            while True:
                code = _wait(child, self.beat_interval)
                control = self.store.task_progress(task.id, tail.read())
                if code is not None:
                    break
                if self._stop.is_set():
                    why = "stop"
                elif control is None or control.status is not TaskStatus.RUNNING:
                    why = "gone"
                elif control.cancel_requested:
                    why = "cancel"
                if why:
                    log.info("task %s: %s; SIGTERM to process group %s", task.id, why, child.pid)
                    code = processes.terminate(child, self.grace_period, what=f"task {task.id}")
                    self.store.task_progress(task.id, tail.read(final=True))
                    break
        finally:
            processes.killpg(child.pid, signal.SIGKILL)  # nothing of the group outlives its task
            processes.wait_group_gone(child.pid, self.grace_period)
            release()
        return self._record_end(task, code, why, tail, begun)

    def _record_end(self, task: TaskRecord, code: int, why: str | None, tail: _Tail, begun: float) -> TaskStatus:
        self.store.task_progress(task.id, tail.read(final=True))
        if why == "cancel":
            kept = "the export's partial files were not kept" if task.kind in FILE_KINDS else "nothing was stored"
            self.store.finish_task(task.id, TaskStatus.CANCELLED, error=f"cancelled; {kept}")
        elif why == "stop":
            self.store.finish_task(task.id, TaskStatus.FAILED, error=self._stopped_reason("ran"))
        elif why is None and code == 0:
            self.store.finish_task(task.id, TaskStatus.SUCCEEDED, result=self.result(task, begun))
        elif why is None:
            self.store.finish_task(
                task.id, TaskStatus.FAILED, error=f"{exit_words(code)}: {' '.join(tail.last(ERROR_LINES))}"
            )
        return self._status(task.id)

    def result(self, task: TaskRecord, begun: float) -> dict:
        """What the task made: the files its command recorded (path, size, sha256), or the hub address of a push."""
        if task.run_id is None:  # a task on a spec: the result its command wrote next to its log
            path = task_file(self.store, task, "json")
            return json.loads(path.read_text()) if path.is_file() else {}
        if TaskKind(task.kind) is TaskKind.PUSH:
            pushes = [e for e in self.store.run_events(task.run_id) if e["kind"] == "push" and e["time"] >= begun]
            data = pushes[-1]["data"] if pushes else {}
            return {"url": data.get("url"), "repo": data.get("repo"), "what": data.get("what")}
        files = [
            {"kind": a.kind, "path": a.path, "size": a.size, "sha256": a.sha256}
            for a in self.store.artifacts(task.run_id)
            if a.kind in FILE_KINDS and a.created_at >= begun
        ]
        return {"files": files}

    def _status(self, task_id: int) -> TaskStatus:
        task = self.store.get_task(task_id)
        return task.status if task is not None else TaskStatus.CANCELLED

    def _stopped_reason(self, what: str) -> str:
        return f"worker {self.place.worker_id} stopped while the task {what}; request it again"

    def _child_env(self) -> dict[str, str]:
        env = dict(
            os.environ,
            TUNEDECK_HOME=str(data_dir()),
            TUNEDECK_DATABASE_URL=self.store.url,
            PYTHONUNBUFFERED="1",
        )
        env[STOP_WITH_PARENT_ENV] = str(os.getpid())  # a SIGKILLed worker's export stops too (jobs.train.parent_watch)
        if self.place.on_cpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        elif processes.is_gpu_id(self.place.device):
            env["CUDA_VISIBLE_DEVICES"] = self.place.device  # the GPU whose lease it holds, and no other
        return env


def task_file(store: RunFolders, task: TaskRecord, suffix: str) -> Path:
    """A task's file (its log, a spec task's result): in its run's folder, or the data folder's `tasks/` for a
    task on a spec (no run yet)."""
    folder = store.run_dir(task.run_id) / "tasks" if task.run_id is not None else data_dir() / "tasks"
    return folder / f"{task.id}-{task.kind}.{suffix}"


def task_service(place: Place) -> TaskService:
    """The factory `Worker(services=...)` takes."""
    return TaskService(place)


def exit_words(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _wait(child: subprocess.Popen, timeout: float) -> int | None:
    """The child's exit code, or None when it still runs after `timeout` seconds."""
    try:
        return child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


class _Tail:
    """The new complete lines of a growing log file, read incrementally; the last lines kept for the error."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.recent: list[str] = []

    def read(self, final: bool = False) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        chunks = (self.partial + data).split(b"\n")
        self.partial = b"" if final else chunks.pop()  # a line still being written waits for its newline
        # A progress bar redraws its line with carriage returns: its newest state is the line.
        lines = [c.decode("utf-8", "replace").rstrip().rsplit("\r", 1)[-1] for c in chunks]
        lines = [line for line in lines if line.strip()]
        self.recent = (self.recent + lines)[-ERROR_LINES:]
        return lines

    def last(self, n: int) -> list[str]:
        return [line.strip() for line in self.recent[-n:]]
