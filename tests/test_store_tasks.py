"""Store tasks (exports and pushes asked of a worker): one claim wins, logs keep their newest lines, stale tasks fail,
cancels, and a GPU task's hold on the device lease against training claims."""

from __future__ import annotations

import threading

from sqlalchemy import update

from jobs.spec.job import JobSpec
from storage import models as m
from storage.models import RunStatus, TaskStatus
from storage.store import Store
from storage.store_tasks import TASK_LOG_LINES

BACKENDS = ("sqlite", "postgresql")  # each `store` test runs on both databases (tests/conftest.py)

SPEC = JobSpec(model="tiny-llama", max_steps=5, run_name="tasks")


def test_a_task_is_claimed_by_one_worker_only(store: Store) -> None:
    run_id = store.create_run(SPEC)
    task_id = store.create_task(run_id, "merged", {"dtype": "fp32"})
    (queued,) = store.queued_tasks(["merged", "gguf"])
    assert (queued.id, queued.kind, queued.args, queued.status) == (
        task_id,
        "merged",
        {"dtype": "fp32"},
        TaskStatus.QUEUED,
    )
    assert store.queued_tasks(["push"]) == []
    other = Store(store.url)  # a second worker's store: its own engines and connections
    winners: list[str] = []
    barrier = threading.Barrier(8)

    def claim(i: int) -> None:
        s = store if i % 2 else other
        barrier.wait()
        if s.claim_task(task_id, f"host:{i}") is not None:
            winners.append(f"host:{i}")

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    other.dispose()
    assert len(winners) == 1
    task = store.get_task(task_id)
    assert task.status is TaskStatus.RUNNING and task.worker_id == winners[0] and task.started_at
    assert store.queued_tasks(["merged"]) == []


def test_the_log_keeps_its_newest_lines_and_counts_all(store: Store) -> None:
    task_id = store.create_task(store.create_run(SPEC), "gguf", {"gguf_type": "f16"})
    assert store.claim_task(task_id, "w")
    control = store.task_progress(task_id, [f"line {i}" for i in range(TASK_LOG_LINES + 50)])
    assert control.status is TaskStatus.RUNNING and not control.cancel_requested
    store.task_progress(task_id, ["last"])
    task = store.get_task(task_id)
    assert len(task.log) == TASK_LOG_LINES and task.log[-1] == "last" and task.log[0] == "line 51"
    assert task.log_count == TASK_LOG_LINES + 51
    assert store.task_progress(task_id + 99, ["x"]) is None


def test_a_task_whose_worker_stopped_beating_is_failed_with_that_reason(store: Store) -> None:
    run_id = store.create_run(SPEC)
    alive, dead = store.create_task(run_id, "merged"), store.create_task(run_id, "gguf")
    store.claim_task(alive, "gpu-a:1")
    store.claim_task(dead, "gpu-b:2")
    with store._tx() as s:  # its last heartbeat was long ago (the database's clock)
        s.execute(update(m.Task).where(m.Task.id == dead).values(heartbeat_at=1.0))
    assert store.fail_stale_tasks(30.0) == [dead]
    task = store.get_task(dead)
    assert task.status is TaskStatus.FAILED and "gpu-b:2 stopped sending heartbeats" in task.error
    assert store.get_task(alive).status is TaskStatus.RUNNING
    assert not store.finish_task(dead, TaskStatus.SUCCEEDED)  # ended once: a late word from the worker loses


def test_cancel_a_queued_task_at_once_and_a_running_one_through_its_worker(store: Store) -> None:
    run_id = store.create_run(SPEC)
    queued, running = store.create_task(run_id, "merged"), store.create_task(run_id, "push", {"repo": "a/b"})
    store.claim_task(running, "w")
    assert store.cancel_task(queued) is TaskStatus.CANCELLED
    assert store.claim_task(queued, "w") is None
    assert store.cancel_task(running) is TaskStatus.RUNNING
    assert store.task_progress(running).cancel_requested
    assert store.finish_task(running, TaskStatus.CANCELLED, error="cancelled")
    assert [t.id for t in store.run_tasks(run_id)] == [running, queued]  # newest first
    assert [t.id for t in store.tasks_of([queued, running, 999])] == [queued, running]


def test_tasks_go_with_their_run(store: Store) -> None:
    run_id = store.create_run(SPEC)
    task_id = store.create_task(run_id, "merged")
    assert store.delete_run(run_id)
    assert store.get_task(task_id) is None


def test_a_gpu_task_and_a_training_run_never_hold_one_device_together(store: Store) -> None:
    first, second = store.create_run(SPEC), store.create_run(SPEC)
    task_id = store.create_task(first, "merged")
    training = store.claim_next_on_device("host:1", "0", host="host")
    assert training.id == first
    held = store.hold_device_for_task("0", "host:1#task", "host", first, task_id, 1)
    assert held["run_id"] == first and held["worker_id"] == "host:1"  # the run has it: the task waits
    store.mark_succeeded(first, {})
    assert store.release_device("0", "host:1", host="host", run_id=first)
    assert store.hold_device_for_task("0", "host:1#task", "host", first, task_id, 1) == {}
    assert store.device_lease("0", host="host")["task_id"] == task_id
    # The worker's own training claim waits while its task holds the device ...
    assert store.claim_next_on_device("host:1", "0", host="host") is None
    assert store.get_run(second).status is RunStatus.QUEUED
    # ... and takes it once the task lets go.
    assert store.release_device("0", "host:1#task", host="host")
    assert store.claim_next_on_device("host:1", "0", host="host").id == second


def test_a_schema_12_database_gains_tasks_without_a_run(store: Store) -> None:
    """Migration 13 on SQLite (a rebuilt table, ids kept) and PostgreSQL: the tasks already there stay with their
    run; a task on a spec ("try rewards") has none."""
    from sqlalchemy import text

    run_id = store.create_run(SPEC)
    old = store.create_task(run_id, "merged", {"dtype": "fp32"})
    with store._write_engine.begin() as con:  # as schema 12 left it: every task belongs to a run
        if store.url.startswith("sqlite"):
            con.execute(text("ALTER TABLE tasks RENAME TO tasks_v12"))
            con.execute(text("DROP INDEX ix_tasks_status"))
            con.execute(text("DROP INDEX ix_tasks_run_id"))
            con.execute(text(_SCHEMA_12_SQLITE))
            con.execute(text("INSERT INTO tasks SELECT * FROM tasks_v12"))
            con.execute(text("DROP TABLE tasks_v12"))
        else:
            con.execute(text("ALTER TABLE tasks ALTER COLUMN run_id SET NOT NULL"))
        con.execute(text("UPDATE meta SET value = '12' WHERE key = 'schema_version'"))
    assert store.get_task(old).run_id == run_id
    again = Store(store.url)
    try:
        assert again.schema_version == m.SCHEMA_VERSION >= 13
        assert again.get_task(old).run_id == run_id and again.get_task(old).args == {"dtype": "fp32"}
        spec_task = again.create_task(None, "try_rewards", {"prompts": 2})
        assert again.get_task(spec_task).run_id is None and spec_task > old
        assert [t.id for t in again.run_tasks(run_id)] == [old]
    finally:
        again.dispose()


_SCHEMA_12_SQLITE = (
    "CREATE TABLE tasks (id INTEGER NOT NULL, run_id INTEGER NOT NULL, kind VARCHAR(32) NOT NULL, "
    "args_json TEXT NOT NULL, status VARCHAR(16) NOT NULL, worker_id VARCHAR(128), created_at FLOAT NOT NULL, "
    "started_at FLOAT, finished_at FLOAT, heartbeat_at FLOAT, cancel_requested INTEGER NOT NULL, "
    "log_text TEXT NOT NULL, log_count INTEGER NOT NULL, result_json TEXT, error TEXT, PRIMARY KEY (id), "
    "FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE)"
)
