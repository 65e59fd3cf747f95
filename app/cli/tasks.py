"""`--on-worker`: ask a worker for an export or a push through the store and follow it, as the dashboard does.

    tunedeck export 7 --merged --gguf f16 --on-worker   # carried out by a worker where run 7's weights are
    tunedeck push 7 --repo alice/tag --on-worker         # pushed by a worker, with the worker's HF_TOKEN

Without the flag both commands run where they are typed (and load the model here). With it the
command queues the tasks (`jobs.worker.tasks`), prints the worker's progress lines as they come,
and exits 0 when every task succeeded (1 when one failed or was cancelled); Ctrl-C cancels them.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from app.cli.usage import EXIT_OK, EXIT_RUN_FAILED, UsageError
from jobs.errors import Problem

if TYPE_CHECKING:  # the store (its database driver) loads only when a command follows tasks: the parser stays light
    from storage.roles_tasks import TaskFollowing, TaskReach

POLL_S = 0.5


def add_flag(parser) -> None:
    parser.add_argument(
        "--on-worker",
        action="store_true",
        help="ask a running worker that can reach the run's weights to do it (through the store), "
        "and follow its progress here",
    )


def check_reachable(store: TaskReach, run_id: int) -> None:
    """UsageError when the run does not exist or no running worker can reach its weights."""
    from jobs.worker.tasks import reach_problem

    run = store.get_run(run_id)
    if run is None:
        raise UsageError([Problem("run_id", f"no run {run_id}", "see `tunedeck list` for the runs' ids")])
    problem = reach_problem(store, run)
    if problem is not None:
        raise UsageError([problem])


def follow(store: TaskFollowing, task_ids: list[int], poll_s: float = POLL_S) -> int:
    """Print the tasks' new log lines until they end; the exit code (0: all succeeded)."""
    from jobs.worker.tasks import describe
    from storage.models import TaskStatus

    printed = {i: 0 for i in task_ids}
    try:
        while True:
            tasks = store.tasks_of(task_ids)
            for task in tasks:
                new = task.log_count - printed[task.id]
                for line in task.log[-new:] if new > 0 else []:
                    print(line, flush=True)
                printed[task.id] = task.log_count
            if all(t.status.finished for t in tasks):
                break
            time.sleep(poll_s)
    except KeyboardInterrupt:
        for task_id in task_ids:
            store.cancel_task(task_id)
        print("cancelled: the worker stops the tasks", flush=True)
        return EXIT_RUN_FAILED
    code = EXIT_OK
    for task in tasks:
        if task.status is TaskStatus.SUCCEEDED:
            result = task.result or {}
            for f in result.get("files") or []:
                print(f"{describe(task)}: {f['path']}  sha256 {f['sha256']}")
            if result.get("url"):
                print(f"pushed: {result['url']}")
        else:
            print(f"{describe(task)}: {task.status.value}: {task.error}")
            code = EXIT_RUN_FAILED
    return code
