"""Every change of a run's or a task's status: one table of allowed moves, one conditional UPDATE each.

    with self._tx() as s:
        moved = move_run(s, run_id, RunChange.FAIL, self._db_now(), error_summary="...", exit_code=1)
    # moved: the run was in one of FAIL's `from` statuses (now failed, finished_at written); else nothing changed

The tables (`RUN_MOVES`, `TASK_MOVES`) say, for each change, the statuses it may start from, the
status it ends in, the timestamps it writes and any further guard. A move is ONE statement,

    UPDATE runs SET status = <to>, <timestamps>, <the caller's columns> WHERE id = ? AND status IN (<from>) [AND <guard>]

inside the caller's transaction (a claim's also takes the device lease there), so the status, its
timestamps and the columns that go with it change together or not at all; it returns whether the
row moved. A move from any other status (or of a missing row) changes nothing and returns False:
the first word wins (a worker's late "succeeded" never overwrites the user's cancel). A caller may
narrow a change's `from` statuses (`only_from`: e.g. `request_cancel` withdraws a queued run only),
never widen them. New rows are born queued here too (`new_run`, `new_task`).

Nothing else in storage/, jobs/ or app/ writes a status (tests/test_lifecycle.py reads the source
to hold that). Status changes are not run events: `run_events` keeps what happened besides the
status (OOM recoveries, engine jobs, best checkpoints), and the status's own history is its row's
timestamps (created, started, heartbeat, finished), as before. Chat replies (`ReplyStatus`) keep their
own guarded writes in `storage.store_chat`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from sqlalchemy import and_, or_, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from storage import models as m
from storage.models import RunStatus, TaskStatus

NOW = "now"  # the writer's clock (time.time())
DB_NOW = "db_now"  # the database's clock (heartbeats: one clock for every host)
CLEARED = "cleared"  # NULL


class RunChange(str, Enum):
    """What can happen to a run's status."""

    CLAIM = "claim"  # a worker (or a cluster dispatcher) takes a queued run
    SUCCEED = "succeed"
    FAIL = "fail"
    CANCEL = "cancel"  # the worker stopped it at the user's word (or the user withdrew it while queued)
    ASK_TO_STOP = "ask_to_stop"  # the user's cancel of a running run: it stays running, flagged for its worker
    INTERRUPT = "interrupt"  # it stopped without finishing: a worker's shutdown, a lost worker
    REQUEUE = "requeue"  # the user puts an ended run back at the end of the queue
    REQUEUE_ALONE = "requeue_alone"  # it outgrew its share of a device: back to the queue, to run alone
    SETTLE_FAILED = "settle_failed"  # a cluster engine's word on how its job ended (`storage.store_engine`)
    SETTLE_CANCELLED = "settle_cancelled"
    SETTLE_INTERRUPTED = "settle_interrupted"


class TaskChange(str, Enum):
    """What can happen to a task's status."""

    CLAIM = "claim"
    SUCCEED = "succeed"
    FAIL = "fail"
    CANCEL = "cancel"
    ASK_TO_STOP = "ask_to_stop"  # the user's cancel of a running task: flagged for the worker carrying it out


@dataclass(frozen=True)
class Move:
    """One allowed change: from any of `from_` to `to`, writing `stamps` (column -> NOW, DB_NOW or CLEARED)
    and `flags` (column -> value).

    `guard`, when set, is a further condition on the row (an SQL expression), part of the same UPDATE."""

    from_: frozenset[str]
    to: str
    stamps: Mapping[str, str] = field(default_factory=dict)
    guard: Callable[[], ColumnElement[bool]] | None = None
    flags: Mapping[str, Any] = field(default_factory=dict)


def _runs(*statuses: RunStatus) -> frozenset[str]:
    return frozenset(s.value for s in statuses)


def _tasks(*statuses: TaskStatus) -> frozenset[str]:
    return frozenset(s.value for s in statuses)


def _engine_settles() -> ColumnElement[bool]:
    """An engine run, and a cancelled one only when the user did not ask for it (the child's answer to SIGTERM)."""
    return and_(
        m.Run.engine.is_not(None),
        or_(m.Run.status != RunStatus.CANCELLED.value, m.Run.cancel_requested == 0),
    )


_ENDED = {"finished_at": NOW}
_SETTLED_FROM = _runs(RunStatus.RUNNING, RunStatus.INTERRUPTED, RunStatus.CANCELLED)
_CLAIMED = {"started_at": NOW, "heartbeat_at": DB_NOW, "progress_at": CLEARED, "finished_at": CLEARED}

RUN_MOVES: dict[RunChange, Move] = {
    RunChange.CLAIM: Move(_runs(RunStatus.QUEUED), RunStatus.RUNNING.value, _CLAIMED),
    RunChange.SUCCEED: Move(_runs(RunStatus.RUNNING), RunStatus.SUCCEEDED.value, _ENDED),
    RunChange.FAIL: Move(_runs(RunStatus.RUNNING, RunStatus.QUEUED), RunStatus.FAILED.value, _ENDED),
    RunChange.CANCEL: Move(_runs(RunStatus.RUNNING, RunStatus.QUEUED), RunStatus.CANCELLED.value, _ENDED),
    RunChange.ASK_TO_STOP: Move(_runs(RunStatus.RUNNING), RunStatus.RUNNING.value, {}, flags={"cancel_requested": 1}),
    RunChange.INTERRUPT: Move(_runs(RunStatus.RUNNING), RunStatus.INTERRUPTED.value, _ENDED),
    RunChange.REQUEUE: Move(
        _runs(RunStatus.INTERRUPTED, RunStatus.CANCELLED, RunStatus.FAILED),
        RunStatus.QUEUED.value,
        {"queue_order": NOW, "finished_at": CLEARED},  # the end of the queue
    ),
    RunChange.REQUEUE_ALONE: Move(
        _runs(RunStatus.RUNNING),
        RunStatus.QUEUED.value,
        {"finished_at": CLEARED},  # keeps its place: the head
    ),
    RunChange.SETTLE_FAILED: Move(_SETTLED_FROM, RunStatus.FAILED.value, _ENDED, _engine_settles),
    RunChange.SETTLE_CANCELLED: Move(_SETTLED_FROM, RunStatus.CANCELLED.value, _ENDED, _engine_settles),
    RunChange.SETTLE_INTERRUPTED: Move(_SETTLED_FROM, RunStatus.INTERRUPTED.value, _ENDED, _engine_settles),
}

# The engine's word by the status it names (`Store.settle_engine_run`).
SETTLE: dict[RunStatus, RunChange] = {
    RunStatus.FAILED: RunChange.SETTLE_FAILED,
    RunStatus.CANCELLED: RunChange.SETTLE_CANCELLED,
    RunStatus.INTERRUPTED: RunChange.SETTLE_INTERRUPTED,
}

TASK_MOVES: dict[TaskChange, Move] = {
    TaskChange.CLAIM: Move(
        _tasks(TaskStatus.QUEUED), TaskStatus.RUNNING.value, {"started_at": NOW, "heartbeat_at": DB_NOW}
    ),
    TaskChange.SUCCEED: Move(_tasks(TaskStatus.RUNNING), TaskStatus.SUCCEEDED.value, _ENDED),
    TaskChange.FAIL: Move(_tasks(TaskStatus.RUNNING, TaskStatus.QUEUED), TaskStatus.FAILED.value, _ENDED),
    TaskChange.CANCEL: Move(_tasks(TaskStatus.RUNNING, TaskStatus.QUEUED), TaskStatus.CANCELLED.value, _ENDED),
    TaskChange.ASK_TO_STOP: Move(
        _tasks(TaskStatus.RUNNING), TaskStatus.RUNNING.value, {}, flags={"cancel_requested": 1}
    ),
}

# The change that ends a task in each finished status (`Store.finish_task`).
TASK_ENDS: dict[TaskStatus, TaskChange] = {
    TaskStatus.SUCCEEDED: TaskChange.SUCCEED,
    TaskStatus.FAILED: TaskChange.FAIL,
    TaskStatus.CANCELLED: TaskChange.CANCEL,
}


def _stamp(rule: str, db_now: ColumnElement[float]) -> Any:
    return {NOW: time.time(), DB_NOW: db_now, CLEARED: None}[rule]


def _move(
    s: Session,
    table: type[m.Run] | type[m.Task],
    row_id: int,
    move: Move,
    db_now: ColumnElement[float],
    only_from: set[str] | None,
    values: dict[str, Any],
) -> bool:
    taken = {"status", *move.stamps, *move.flags} & values.keys()
    assert not taken, f"the lifecycle writes {sorted(taken)} itself"
    allowed = move.from_ if only_from is None else move.from_ & set(only_from)
    statement = (
        update(table)
        .where(table.id == row_id, table.status.in_(sorted(allowed)))
        .values(
            status=move.to, **{col: _stamp(rule, db_now) for col, rule in move.stamps.items()}, **move.flags, **values
        )
    )
    if move.guard is not None:
        statement = statement.where(move.guard())
    result = s.execute(statement)
    assert isinstance(result, CursorResult)  # a plain UPDATE: its rowcount is the rows it matched
    return result.rowcount == 1


def move_run(
    s: Session,
    run_id: int,
    change: RunChange,
    db_now: ColumnElement[float],
    *,
    only_from: Iterable[RunStatus] | None = None,
    **values: Any,
) -> bool:
    """Apply `change` to run `run_id` in the session's transaction, with the caller's `values`; True when it moved."""
    narrowed = None if only_from is None else {st.value for st in only_from}
    return _move(s, m.Run, run_id, RUN_MOVES[change], db_now, narrowed, values)


def move_task(
    s: Session,
    task_id: int,
    change: TaskChange,
    db_now: ColumnElement[float],
    *,
    only_from: Iterable[TaskStatus] | None = None,
    **values: Any,
) -> bool:
    """Apply `change` to task `task_id` in the session's transaction, with the caller's `values`; True when it moved."""
    narrowed = None if only_from is None else {st.value for st in only_from}
    return _move(s, m.Task, task_id, TASK_MOVES[change], db_now, narrowed, values)


def new_run(**columns: Any) -> m.Run:
    """A new run's row: every run is born queued."""
    return m.Run(status=RunStatus.QUEUED.value, **columns)


def new_task(**columns: Any) -> m.Task:
    """A new task's row: every task is born queued."""
    return m.Task(status=TaskStatus.QUEUED.value, **columns)
