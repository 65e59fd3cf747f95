"""One lifecycle (`storage.lifecycle`): every status change of a run or a task is one of its table's moves.

- every change from every status, on SQLite and PostgreSQL: an allowed one moves the row (status and
  timestamps), a forbidden one leaves the whole row as it was and returns False;
- nothing in storage/, jobs/ or app/ but `storage/lifecycle.py` writes a run's or a task's status
  (the source is read, so a new write anywhere else fails here).
"""

from __future__ import annotations

import ast
import re

import pytest
from import_graph import ROOT, module_files
from sqlalchemy import select, update

from storage import models as m
from storage.lifecycle import (
    RUN_MOVES,
    SETTLE,
    TASK_ENDS,
    TASK_MOVES,
    RunChange,
    TaskChange,
    move_run,
    move_task,
)
from storage.models import RunStatus, TaskStatus
from storage.store import Store

BACKENDS = ("sqlite", "postgresql")  # each `store` test runs on both databases (tests/conftest.py)
SPEC_JSON = '{"model": "tiny"}'


def _row(store: Store, table: type[m.Run] | type[m.Task], row_id: int) -> dict[str, object]:
    with store._read() as s:
        row = s.execute(select(table.__table__).where(table.id == row_id)).one()
    return dict(row._mapping)


def _run_in(store: Store, status: RunStatus) -> int:
    """A run of a cluster engine (so the engine's settles may apply) put straight into `status` (test-only write)."""
    run_id = store.create_run_unchecked(SPEC_JSON)
    with store._tx() as s:
        s.execute(update(m.Run).where(m.Run.id == run_id).values(status=status.value, engine="slurm"))
    return run_id


def _task_in(store: Store, run_id: int, status: TaskStatus) -> int:
    task_id = store.create_task(run_id, "merged")
    with store._tx() as s:
        s.execute(update(m.Task).where(m.Task.id == task_id).values(status=status.value))
    return task_id


def test_every_run_change_from_every_status(store: Store) -> None:
    moved, refused = 0, 0
    for change, move in RUN_MOVES.items():
        for status in RunStatus:
            run_id = _run_in(store, status)
            before = _row(store, m.Run, run_id)
            with store._tx() as s:
                done = move_run(s, run_id, change, store._db_now(), error_summary="why")
            after = _row(store, m.Run, run_id)
            if status.value in move.from_:
                assert done, (change, status)
                assert after["status"] == move.to and after["error_summary"] == "why", (change, status)
                for column, rule in move.stamps.items():
                    assert (after[column] is None) == (rule == "cleared"), (change, status, column)
                assert all(after[column] == value for column, value in move.flags.items()), (change, status)
                moved += 1
            else:
                assert not done and after == before, (change, status)
                refused += 1
    assert moved + refused == len(RunChange) * len(RunStatus) and moved and refused
    with store._tx() as s:  # a missing run: nothing to move
        assert not move_run(s, 987_654, RunChange.FAIL, store._db_now())


def test_every_task_change_from_every_status(store: Store) -> None:
    run_id = store.create_run_unchecked(SPEC_JSON)
    for change, move in TASK_MOVES.items():
        for status in TaskStatus:
            task_id = _task_in(store, run_id, status)
            before = _row(store, m.Task, task_id)
            with store._tx() as s:
                done = move_task(s, task_id, change, store._db_now(), error="why")
            after = _row(store, m.Task, task_id)
            if status.value in move.from_:
                assert done and after["status"] == move.to and after["error"] == "why", (change, status)
                assert all(after[column] is not None for column in move.stamps), (change, status)
                assert all(after[column] == value for column, value in move.flags.items()), (change, status)
            else:
                assert not done and after == before, (change, status)


def test_the_stores_methods_follow_the_table(store: Store) -> None:
    """The public methods are the table's moves: a refused one changes nothing, whatever the caller asked."""
    succeeded = _run_in(store, RunStatus.SUCCEEDED)
    before = _row(store, m.Run, succeeded)
    assert not store.mark_failed(succeeded, "late")
    assert not store.mark_cancelled(succeeded)
    assert not store.mark_interrupted(succeeded, "late")
    assert not store.requeue_alone(succeeded, "late")
    assert store.request_cancel(succeeded) is RunStatus.SUCCEEDED
    assert not store.settle_engine_run(succeeded, RunStatus.FAILED, "late")
    assert _row(store, m.Run, succeeded) == before
    # a user's cancel is the user's: the engine's word does not replace it
    cancelled = _run_in(store, RunStatus.RUNNING)
    assert store.request_cancel(cancelled) is RunStatus.RUNNING  # a running run is flagged
    assert store.run_control(cancelled).cancel_requested
    assert store.mark_cancelled(cancelled)
    assert not store.settle_engine_run(cancelled, RunStatus.FAILED, "Slurm: TIMEOUT")
    with pytest.raises(ValueError, match="status: an engine run is settled as"):
        store.settle_engine_run(cancelled, RunStatus.SUCCEEDED, None)
    # a finish_task may narrow the table, never widen it: a queued task does not succeed
    task = store.create_task(succeeded, "merged")
    assert not store.finish_task(task, TaskStatus.SUCCEEDED, only_if=[TaskStatus.QUEUED])
    assert store.get_task(task).status is TaskStatus.QUEUED
    assert set(SETTLE) == {RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.INTERRUPTED}
    assert set(TASK_ENDS.values()) == {TaskChange.SUCCEED, TaskChange.FAIL, TaskChange.CANCEL}
    assert all(TaskStatus(TASK_MOVES[change].to) is status for status, change in TASK_ENDS.items())


# ------------------------------------------------------------------ nothing else writes a status
STATUS_ENUMS = ("RunStatus", "TaskStatus")
SQL_STATUS_WRITE = re.compile(
    r"\b(update\s+(runs|tasks)\b[^;]*\bset\b[^;]*\bstatus\b|insert\s+into\s+(runs|tasks)\b)", re.I
)


def _table_of(call: ast.Call) -> str | None:
    """The table an `update(m.Run)...values(...)` / `insert(m.Task)...` chain writes (its class name), if any."""
    node: ast.expr = call.func
    while True:
        if isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id in ("update", "insert") and node.args:
                target = node.args[0]
                return target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
            node = node.func
        else:
            return None


def status_writes(source: str) -> list[int]:
    """Lines of `source` that write a run's or a task's status (the shapes the store has used)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            keys = {k.arg for k in node.keywords}
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if "status" in keys and name in ("Run", "Task"):  # a new row with its status
                found.append(node.lineno)
            elif "status" in keys and name == "values" and _table_of(node) in ("Run", "Task", "runs", "tasks"):
                found.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = ast.unparse(node.value) if node.value is not None else ""
            if any(isinstance(t, ast.Attribute) and t.attr == "status" for t in targets) and any(
                e in value for e in STATUS_ENUMS
            ):
                found.append(node.lineno)  # row.status = RunStatus.X.value
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if (
                    isinstance(key, ast.Constant)
                    and key.value == "status"
                    and any(e in ast.unparse(value) for e in STATUS_ENUMS)
                ):
                    found.append(node.lineno)  # values = {"status": RunStatus.X.value}; .values(**values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL_STATUS_WRITE.search(node.value):
            found.append(node.lineno)  # raw SQL
    return found


def test_only_the_lifecycle_writes_a_status() -> None:
    lifecycle = ROOT / "storage" / "lifecycle.py"
    writes = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in module_files().values()
        if path != lifecycle
        for line in status_writes(path.read_text())
    ]
    assert not writes, writes
    assert status_writes(lifecycle.read_text())  # the scan sees the lifecycle's own writes


@pytest.mark.parametrize(
    "source",
    [
        "s.execute(update(m.Run).where(m.Run.id == 1).values(status=RunStatus.FAILED.value, finished_at=1.0))",
        "s.execute(update(m.Task).values(status=status.value))",
        "row = m.Run(name='x', status=RunStatus.QUEUED.value)",
        "row.status = RunStatus.CANCELLED.value",
        "values = {'status': TaskStatus.RUNNING.value}",
        "s.execute(text('UPDATE runs SET status = :s WHERE id = :i'))",
    ],
)
def test_the_scan_sees_each_shape_of_a_status_write(source: str) -> None:
    assert status_writes(source) == [1]


def test_the_scan_passes_reads_and_other_tables() -> None:
    reads = (
        "q = select(m.Run).where(m.Run.status == RunStatus.QUEUED.value)\n"
        "store.list_runs(status=RunStatus.SUCCEEDED)\n"
        "s.execute(update(m.ChatMessage).values(status=ReplyStatus.DONE.value))\n"
        "s.execute(update(m.Run).where(m.Run.id == 1).values(cancel_requested=1))\n"
    )
    assert status_writes(reads) == []
