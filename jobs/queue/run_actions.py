"""What can be done to a run, in one place: cancel, resume, delete, tag, clone (and submit, next door).

The API (`app.api`), the dashboard (`app.ui.run`, `app.ui.manage`, `app.ui.dashboard`) and the command
line (`app.cli.runs`, `app.cli.manage`) call these and only translate: an outcome into a message, a
JSON answer or a page update; a `RunCommandError` (a `ProblemError`: field, problem, fix) into a
`gr.Error`, exit code 2 or an error panel. `field` names the input the run id came from in the
caller's words (`RUN_ID` on the command line, `run_id` in the API, `run` on a page).

    run_id = submit(store, spec)                   # jobs.queue.submit (beside this module, which does not import
                                                   # it: the check pipeline is deep); the one check, then queued
    cancel(store, 7)                               # Cancelled(run_id=7, result=CancelResult.CANCELLED, ...)
    resume(store, 7)                               # Resumed(run_id=7, from_step=40)
    delete(store, 7)                               # DeleteReport(run_id=7, name=..., freed_bytes=...)
    tag(store, 7, add="baseline", note="the good one")   # the run as it is now
    clone(store, 7)                                # its JobSpec, for the form or a new submit
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from jobs.errors import Problem, ProblemError
from jobs.spec.job import JobSpec
from jobs.spec.stored import spec_of
from jobs.units import human_bytes
from storage.checkpoints import last_complete
from storage.models import RunStatus
from storage.records import RunRecord
from storage.roles import RunFolders, RunReader
from storage.roles_queue import RunActing
from storage.run_files import remove_run_folder, run_bytes
from storage.store import RunningRunError

__all__ = [
    "CancelResult",
    "Cancelled",
    "DeleteReport",
    "Resumed",
    "RunCommandError",
    "cancel",
    "check_deletable",
    "clone",
    "delete",
    "existing_run",
    "parse_tags",
    "resumable",
    "resume",
    "tag",
]

log = logging.getLogger(__name__)

TAG_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+/-]{0,63}$")
MAX_NOTE_CHARS = 10_000
TAG_RULE = "1-64 letters, digits or . _ : + / -, starting with a letter or digit"


class RunCommandError(ProblemError):
    """A run command refused: every problem, each with its field and fix. Nothing was changed."""


def existing_run(store: RunReader, run_id: Any, field: str = "RUN_ID") -> RunRecord:
    """The run, or RunCommandError saying how to find one."""
    whole = isinstance(run_id, int) or (isinstance(run_id, float) and run_id.is_integer())
    if isinstance(run_id, bool) or not whole or int(run_id) < 1:
        raise RunCommandError(
            [Problem(field, f"`{run_id}` is not a run id", "give a whole number from `tunedeck runs`")]
        )
    run = store.get_run(int(run_id))
    if run is None:
        raise RunCommandError(
            [
                Problem(
                    field,
                    f"run {int(run_id)} does not exist",
                    "list runs with `tunedeck runs` (or the API's `runs` endpoint)",
                )
            ]
        )
    return run


# ---------------------------------------------------------------------- cancel
class CancelResult(str, Enum):
    CANCELLED = "cancelled"  # it was queued: cancelled at once
    REQUESTED = "cancel requested"  # it is running: its worker stops it within seconds (checkpoint first)
    ALREADY_FINISHED = "already finished"  # nothing to do


@dataclass(frozen=True)
class Cancelled:
    run_id: int
    result: CancelResult
    status: RunStatus  # the run's status after the command

    @property
    def message(self) -> str:
        if self.result is CancelResult.ALREADY_FINISHED:
            return f"run {self.run_id} already {self.status.value}; nothing to cancel"
        return f"run {self.run_id}: {self.result.value}"


def cancel(store: RunActing, run_id: Any, field: str = "RUN_ID") -> Cancelled:
    """Cancel a queued run at once, or ask a running run's worker to stop it; a finished run is left alone."""
    run = existing_run(store, run_id, field)
    if run.status.finished:
        return Cancelled(run.id, CancelResult.ALREADY_FINISHED, run.status)
    new = store.request_cancel(run.id)
    if new is None:  # deleted between the two reads
        raise RunCommandError([Problem(field, f"run {run.id} does not exist", "list runs with `tunedeck runs`")])
    if new.finished and new is not RunStatus.CANCELLED:  # it ended on its own meanwhile
        return Cancelled(run.id, CancelResult.ALREADY_FINISHED, new)
    return Cancelled(run.id, CancelResult.CANCELLED if new is RunStatus.CANCELLED else CancelResult.REQUESTED, new)


# ---------------------------------------------------------------------- resume
@dataclass(frozen=True)
class Resumed:
    run_id: int
    from_step: int | None  # the complete checkpoint it continues from; None: from step 0

    @property
    def message(self) -> str:
        if self.from_step is None:
            return f"run {self.run_id} queued again; it has no complete checkpoint, so it starts from step 0"
        return f"run {self.run_id} queued again; it resumes from its checkpoint at step {self.from_step}"


def resumable(store: RunFolders, run: RunRecord) -> bool:
    """Interrupted and cancelled runs resume (from a checkpoint, or afresh); failed ones only from a checkpoint."""
    if run.status in (RunStatus.INTERRUPTED, RunStatus.CANCELLED):
        return True
    return run.status is RunStatus.FAILED and last_complete(store.run_dir(run.id) / "output") is not None


def resume(store: RunActing, run_id: Any, field: str = "RUN_ID") -> Resumed:
    """Queue the run again under the same id; its child continues from the last complete checkpoint."""
    run = existing_run(store, run_id, field)
    fix = "resume an interrupted or cancelled run (or a failed one with a checkpoint), or submit it again"
    if not resumable(store, run):
        raise RunCommandError(
            [
                Problem(
                    field,
                    f"run {run.id} is {run.status.value}: only interrupted or cancelled runs, "
                    "or failed runs with a complete checkpoint, can be resumed",
                    fix,
                )
            ]
        )
    last = last_complete(store.run_dir(run.id) / "output")
    if not store.requeue(run.id):
        raise RunCommandError([Problem(field, f"run {run.id} changed status meanwhile; nothing done", fix)])
    return Resumed(run.id, None if last is None else last[0])


# ---------------------------------------------------------------------- delete
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


def _running_problem(run_id: int, field: str) -> Problem:
    return Problem(
        field,
        f"run {run_id} is running; deleting it would pull its files from under the training",
        f"cancel it first (`tunedeck cancel {run_id}` or the Cancel button), wait until it shows "
        "cancelled, then delete it",
    )


def check_deletable(store: RunActing, run_ids: Sequence[Any], field: str = "RUN_ID") -> list[RunRecord]:
    """The runs, when every one exists and none is running; else RunCommandError with every problem."""
    problems, runs = [], []
    for run_id in run_ids:
        try:
            run = existing_run(store, run_id, field)
        except RunCommandError as exc:
            problems.extend(exc.problems)
            continue
        if run.status is RunStatus.RUNNING:
            problems.append(_running_problem(run.id, field))
        runs.append(run)
    if problems:
        raise RunCommandError(problems)
    return runs


def delete(store: RunActing, run_id: Any, field: str = "RUN_ID") -> DeleteReport:
    """Delete a run's rows (metrics, memory, artifacts, tags) and then its folder; refuses a running run."""
    (run,) = check_deletable(store, [run_id], field)
    freed = run_bytes(store, run.id)
    try:
        if not store.delete_run(run.id):
            raise RunCommandError([Problem(field, f"run {run.id} does not exist", "list runs with `tunedeck runs`")])
    except RunningRunError:  # a worker claimed it between the check and the delete
        raise RunCommandError([_running_problem(run.id, field)]) from None
    try:
        remove_run_folder(store, run.id)
    except OSError as exc:
        log.error("run %s deleted, but its folder could not be removed: %s", run.id, exc)
        return DeleteReport(run.id, run.name, 0, str(exc))
    return DeleteReport(run.id, run.name, freed)


# ---------------------------------------------------------------------- tag
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
    """Checked tags; RunCommandError naming each bad one."""
    tags = split_tags(value)
    bad = [
        Problem(field, f"`{t[:80]}` is not a valid tag", f"use {TAG_RULE}, e.g. lr-sweep")
        for t in tags
        if not TAG_PATTERN.match(t)
    ]
    if bad:
        raise RunCommandError(bad)
    return tags


def check_note(note: str | None, field: str = "note") -> str | None:
    """The note to store (None for empty); RunCommandError when it is too long."""
    text = (note or "").strip()
    if len(text) > MAX_NOTE_CHARS:
        raise RunCommandError(
            [
                Problem(
                    field,
                    f"is {len(text):,} characters long, over the limit of {MAX_NOTE_CHARS:,}",
                    "shorten the note, or keep long text in a file and put its path in the note",
                )
            ]
        )
    return text or None


def tag(
    store: RunActing, run_id: Any, add: Any = (), remove: Any = (), note: str | None = None, field: str = "RUN_ID"
) -> RunRecord:
    """Add and remove tags and (when `note` is not None) replace the note; every problem at once."""
    problems: list[Problem] = []

    def checked(fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except RunCommandError as exc:
            problems.extend(exc.problems)
            return None

    run = checked(existing_run, store, run_id, field)
    tags = checked(parse_tags, add, "tags") or []
    gone = checked(parse_tags, remove, "remove") or []
    text = checked(check_note, note) if note is not None else None
    if problems:
        raise RunCommandError(problems)
    if tags or gone:
        store.change_tags(run.id, add=tags, remove=gone)
    if note is not None:
        store.set_note(run.id, text)
    return existing_run(store, run.id, field)


# ---------------------------------------------------------------------- clone
def clone(store: RunActing, run_id: Any, field: str = "RUN_ID", fix: int | None = None) -> JobSpec:
    """The run's spec as submitted, to edit in the form or queue again (`submit`): a new run, the old one untouched.

    `fix`: with the spec change of the run's finding number `fix` applied (`jobs.doctor`; 1 = the first
    `tunedeck show` lists)."""
    run = existing_run(store, run_id, field)
    spec = spec_of(run)
    if fix is None:
        return spec
    from jobs.doctor.findings import findings_of

    found = findings_of(store.run_events(run.id))
    if not 1 <= fix <= len(found):
        have = f"findings 1 to {len(found)}" if found else "no finding of the training doctor"
        raise RunCommandError(
            [Problem("--fix", f"run {run.id} has {have}, not {fix}", f"see `tunedeck show {run.id}`")]
        )
    change = found[fix - 1].spec_change
    if not change:
        what = f"finding {fix} ({found[fix - 1].code.value}) names no spec change"
        raise RunCommandError([Problem("--fix", what, f"do what it says ({found[fix - 1].fix}), then submit")])
    return spec.replace(**change)
