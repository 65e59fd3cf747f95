"""Managing runs, shared by `tunedeck rm/tag/runs --json`, the run page and the API.

One place checks tags and notes (every problem at once, naming the field and the fix), deletes
a run with its folder, and describes runs as plain data, so the three front ends behave alike.

    tags = parse_tags("baseline, lr-sweep")      # ManageError on a bad tag
    report = delete_run(store, 7)                # ManageError if missing or running
    summaries(store, store.list_runs())          # JSON-ready dicts (id, status, tags, disk_bytes, ...)
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from jobs.errors import Problem, ProblemError
from jobs.spec.stored import spec_of
from jobs.units import human_bytes
from storage.models import RunStatus
from storage.records import RunRecord
from storage.run_files import DiskUsage, remove_run_folder, run_bytes
from storage.store import RunningRunError, Store

log = logging.getLogger(__name__)

TAG_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+/-]{0,63}$")
MAX_NOTE_CHARS = 10_000
TAG_RULE = "1-64 letters, digits or . _ : + / -, starting with a letter or digit"


class ManageError(ProblemError):
    """Bad input to a management command: every problem, each with its field and fix."""


def split_tags(value: str | Iterable[str] | None) -> list[str]:
    """Tags from "a, b c" or a list (commas and spaces separate), order kept, duplicates dropped."""
    items = [value] if isinstance(value, str) else list(value or [])
    out: list[str] = []
    for item in items:
        for tag in re.split(r"[,\s]+", str(item)):
            if tag and tag not in out:
                out.append(tag)
    return out


def parse_tags(value: str | Iterable[str] | None, field: str = "tags") -> list[str]:
    """Checked tags; ManageError naming each bad one."""
    tags = split_tags(value)
    bad = [
        Problem(field, f"`{t[:80]}` is not a valid tag", f"use {TAG_RULE}, e.g. lr-sweep")
        for t in tags
        if not TAG_PATTERN.match(t)
    ]
    if bad:
        raise ManageError(bad)
    return tags


def check_note(note: str | None, field: str = "note") -> str | None:
    """The note to store (None for empty); ManageError when it is too long."""
    text = (note or "").strip()
    if len(text) > MAX_NOTE_CHARS:
        raise ManageError(
            [
                Problem(
                    field,
                    f"is {len(text):,} characters long, over the limit of {MAX_NOTE_CHARS:,}",
                    "shorten the note, or keep long text in a file and put its path in the note",
                )
            ]
        )
    return text or None


def existing_run(store: Store, run_id: Any, field: str = "RUN_ID") -> RunRecord:
    """The run, or ManageError saying how to find one."""
    whole = isinstance(run_id, int) or (isinstance(run_id, float) and run_id.is_integer())
    if isinstance(run_id, bool) or not whole or int(run_id) < 1:
        raise ManageError([Problem(field, f"`{run_id}` is not a run id", "give a whole number from `tunedeck runs`")])
    run = store.get_run(int(run_id))
    if run is None:
        raise ManageError(
            [
                Problem(
                    field,
                    f"run {int(run_id)} does not exist",
                    "list runs with `tunedeck runs` (or the API's `runs` endpoint)",
                )
            ]
        )
    return run


def _running_problem(run_id: int, field: str) -> Problem:
    return Problem(
        field,
        f"run {run_id} is running; deleting it would pull its files from under the training",
        f"cancel it first (`tunedeck cancel {run_id}` or the Cancel button), wait until it shows "
        "cancelled, then delete it",
    )


@dataclass(frozen=True)
class DeleteReport:
    run_id: int
    name: str
    freed_bytes: int
    folder_error: str | None = None  # the row is gone but its folder could not be removed

    @property
    def message(self) -> str:
        text = f"deleted run {self.run_id} ({self.name}), freeing {human_bytes(self.freed_bytes)}"
        if self.folder_error:
            text += f"; its folder could not be removed ({self.folder_error}): remove it by hand"
        return text


def check_deletable(store: Store, run_ids: Sequence[int], field: str = "RUN_ID") -> list[RunRecord]:
    """The runs, when every one exists and none is running; else ManageError with every problem."""
    problems, runs = [], []
    for run_id in run_ids:
        try:
            run = existing_run(store, run_id, field)
        except ManageError as exc:
            problems.extend(exc.problems)
            continue
        if run.status is RunStatus.RUNNING:
            problems.append(_running_problem(run.id, field))
        runs.append(run)
    if problems:
        raise ManageError(problems)
    return runs


def delete_run(store: Store, run_id: int, field: str = "RUN_ID") -> DeleteReport:
    """Delete a run's rows (metrics, memory, artifacts, tags) and then its folder; refuses a running run."""
    (run,) = check_deletable(store, [run_id], field)
    freed = run_bytes(store, run.id)
    try:
        if not store.delete_run(run.id):
            raise ManageError([Problem(field, f"run {run.id} does not exist", "list runs with `tunedeck runs`")])
    except RunningRunError:  # a worker claimed it between the check and the delete
        raise ManageError([_running_problem(run.id, field)]) from None
    try:
        remove_run_folder(store, run.id)
    except OSError as exc:
        log.error("run %s deleted, but its folder could not be removed: %s", run.id, exc)
        return DeleteReport(run.id, run.name, 0, str(exc))
    return DeleteReport(run.id, run.name, freed)


def change_notes(
    store: Store, run_id: int, add: Any = (), remove: Any = (), note: str | None = None, field: str = "RUN_ID"
) -> RunRecord:
    """Add and remove tags and (when `note` is not None) replace the note; every problem at once."""
    problems: list[Problem] = []

    def checked(fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except ManageError as exc:
            problems.extend(exc.problems)
            return None

    run = checked(existing_run, store, run_id, field)
    tags = checked(parse_tags, add, "tags") or []
    gone = checked(parse_tags, remove, "remove") or []
    text = checked(check_note, note) if note is not None else None
    if problems:
        raise ManageError(problems)
    if tags or gone:
        store.change_tags(run.id, add=tags, remove=gone)
    if note is not None:
        store.set_note(run.id, text)
    return existing_run(store, run.id, field)


# ---------------------------------------------------------------------- plain data
def finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN or infinity: a non-finite value (a diverged loss) becomes null."""
    return value if value is not None and math.isfinite(value) else None


class RunSummary(TypedDict):
    """One run as plain data: `tunedeck runs --json` and the API's `runs` and `run` (times are Unix seconds)."""

    id: int
    name: str
    status: str
    model: str
    method: str
    trainer: str
    tags: list[str]
    note: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    current_step: int
    total_steps: int | None
    last_loss: float | None
    peak_memory_bytes: int | None
    peak_memory_source: str | None
    disk_bytes: int
    error_summary: str | None


def summaries(store: Store, runs: Sequence[RunRecord], disk: DiskUsage | None = None) -> list[RunSummary]:
    """One JSON-ready summary per run."""
    usage = disk or DiskUsage(store)
    loss = store.last_metric_values([r.id for r in runs], "loss")
    return [
        RunSummary(
            id=r.id,
            name=r.name,
            status=r.status.value,
            model=spec_of(r).model,
            method=spec_of(r).method.value,
            trainer=spec_of(r).trainer.value,
            tags=list(r.tags),
            note=r.note,
            created_at=r.created_at,
            started_at=r.started_at,
            finished_at=r.finished_at,
            current_step=r.current_step,
            total_steps=r.total_steps,
            last_loss=finite_or_none(loss.get(r.id)),
            peak_memory_bytes=r.peak_memory_bytes,
            peak_memory_source=r.peak_memory_source,
            disk_bytes=usage.of(r),
            error_summary=r.error_summary,
        )
        for r in runs
    ]
