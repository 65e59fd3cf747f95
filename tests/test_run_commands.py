"""What can be done to a run has one home (jobs.queue.run_actions): typed outcomes, refusals as problems, and
front ends that only translate (delete and tag are covered in depth by tests/test_manage.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from jobs.queue import run_actions
from jobs.queue.run_actions import CancelResult, RunCommandError
from jobs.spec.job import JobSpec
from storage.checkpoints import COMPLETE_MARKER
from storage.models import RunStatus
from storage.store import Store

ROOT = Path(__file__).resolve().parents[1]
SPEC = JobSpec(model="tiny-llama", max_steps=5, run_name="commands")


def running(store: Store) -> int:
    run_id = store.create_run(SPEC)
    assert store.claim_next_on_device("w", "cpu") is not None
    return run_id


def test_cancel_says_what_happened_for_each_status(store: Store) -> None:
    queued = store.create_run(SPEC)
    done = run_actions.cancel(store, queued)
    assert (done.result, done.status) == (CancelResult.CANCELLED, RunStatus.CANCELLED)
    assert done.message == f"run {queued}: cancelled"
    assert store.get_run(queued).status is RunStatus.CANCELLED

    again = run_actions.cancel(store, queued)
    assert again.result is CancelResult.ALREADY_FINISHED
    assert again.message == f"run {queued} already cancelled; nothing to cancel"

    live = running(store)
    asked = run_actions.cancel(store, live)
    assert (asked.result, asked.status) == (CancelResult.REQUESTED, RunStatus.RUNNING)
    assert store.run_control(live).cancel_requested


@pytest.mark.parametrize("bad", [999, 0, -1, 1.5, True, "x"])
def test_a_missing_or_malformed_run_id_is_refused_naming_the_field(store: Store, bad: object) -> None:
    for command in (run_actions.cancel, run_actions.resume, run_actions.delete, run_actions.clone):
        with pytest.raises(RunCommandError) as exc:
            command(store, bad, "run_id")
        (problem,) = exc.value.problems
        assert problem.field == "run_id" and "tunedeck runs" in problem.fix


def _checkpoint(store: Store, run_id: int, step: int, complete: bool = True) -> None:
    folder = store.run_dir(run_id) / "output" / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text("{}")
    if complete:
        (folder / COMPLETE_MARKER).write_text(json.dumps({"step": step}))


def test_resume_requeues_from_the_last_complete_checkpoint(store: Store) -> None:
    run_id = running(store)
    store.request_cancel(run_id)
    store.mark_cancelled(run_id)
    _checkpoint(store, run_id, 2)
    _checkpoint(store, run_id, 4, complete=False)  # half written: never resumed from
    done = run_actions.resume(store, run_id)
    assert done == run_actions.Resumed(run_id, 2)
    assert done.message == f"run {run_id} queued again; it resumes from its checkpoint at step 2"
    assert store.get_run(run_id).status is RunStatus.QUEUED


def test_resume_refuses_a_succeeded_run_and_a_failed_one_without_checkpoint(store: Store) -> None:
    ok = running(store)
    store.mark_succeeded(ok, {})
    failed = running(store)
    store.mark_failed(failed, "boom")
    for run_id, status in ((ok, "succeeded"), (failed, "failed")):
        with pytest.raises(RunCommandError, match=f"run {run_id} is {status}: only interrupted or cancelled"):
            run_actions.resume(store, run_id)
    _checkpoint(store, failed, 3)
    assert run_actions.resumable(store, store.get_run(failed))
    assert run_actions.resume(store, failed).from_step == 3


def test_clone_gives_the_spec_and_leaves_the_run_alone(store: Store) -> None:
    run_id = store.create_run(SPEC)
    assert run_actions.clone(store, run_id) == SPEC
    assert store.count_runs() == 1


STATE_CHANGES = re.compile(r"\.(request_cancel|requeue|delete_run|change_tags|set_note)\(")


def test_the_front_ends_only_translate() -> None:
    """No module of app/ changes a run's state itself: cancel, resume, delete and tag go through the commands."""
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "app").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if STATE_CHANGES.search(line)
    ]
    assert not found, f"call jobs.queue.run_actions instead: {found}"
