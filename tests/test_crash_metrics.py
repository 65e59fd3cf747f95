"""Nothing lost on a crash (issue 48): every step's metrics up to the last complete checkpoint are in the
store before that checkpoint is marked complete, and a resume writes each step's rows once.

The real case kills the training child with SIGKILL inside `on_save` at step 2, right after the run's own
`on_save` (the store-side flush, then the completeness marker), through a callback the test injects into
a launcher of `jobs.train.child.run`; nothing in the product's path knows about it.
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_worker import make_worker
from training_helpers import tiny_spec

from jobs.queue.run_actions import resume
from jobs.train.callbacks import StoreCallback
from jobs.worker.loop import Worker
from storage.checkpoints import is_complete, last_complete
from storage.models import RunStatus
from storage.store import MetricPoint, Store

# The training child of run `run_id` (`fake_child` defines it), with one extra callback that kills the
# process at step 2's save. The callbacks run in order: the run's StoreCallback comes before the injected
# ones, so its on_save (flush, then marker) has returned when the kill lands.
# No periodic flush in this child: only the checkpoint decides what reached the store before the kill
# (with the default 1 s timer it would be a race whether step 2's rows got there first).
KILLED_IN_SAVE = """
import functools
from transformers import TrainerCallback
import jobs.train.child as child
import jobs.train.recipe as recipe

class KillInSave(TrainerCallback):
    def on_save(self, args, state, control, **kwargs):
        if state.global_step == 2:
            print("killing myself in on_save at step 2", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

recipe.StoreCallback = functools.partial(recipe.StoreCallback, flush_interval=3600.0)
child.setup_logging()
sys.exit(child.run(run_id, callbacks=[KillInSave()]))
"""


def steps_of(store: Store, run_id: int, name: str) -> list[int]:
    return [p.step for p in store.metrics(run_id, [name])]


def repeated_rows(store: Store, run_id: int) -> list[tuple[int, str]]:
    """(step, name) pairs the store holds more than once."""
    counts = Counter((p.step, p.name) for p in store.metrics(run_id))
    return sorted(key for key, n in counts.items() if n > 1)


@pytest.mark.integration
def test_child_killed_inside_on_save_loses_no_step_and_resume_writes_each_once(store: Store, tiny_model: Path) -> None:
    spec = tiny_spec(tiny_model, max_steps=4, max_length=48, save_steps=1, gradient_accumulation_steps=2)
    run_id = store.create_run(spec)
    make_worker(store, KILLED_IN_SAVE, sample=False).work(burst=True)  # returns once the child is dead
    run = store.get_run(run_id)
    log = Path(run.log_path).read_text()
    assert "killing myself in on_save at step 2" in log, log[-3000:]
    assert run.status is RunStatus.FAILED and run.exit_code == -9, (run.error_summary, log[-3000:])
    out = store.run_dir(run_id) / "output"
    assert last_complete(out) == (2, out / "checkpoint-2")  # marked complete before the kill...
    assert steps_of(store, run_id, "learning_rate") == [1, 2]  # ...with every step's metrics already stored

    assert resume(store, run_id).from_step == 2
    Worker(store, poll_interval=0.2, sample=False).work(burst=True)  # the real child, resuming
    run = store.get_run(run_id)
    log = Path(run.log_path).read_text()
    assert run.status is RunStatus.SUCCEEDED, (run.error_summary, log[-3000:])
    assert f"resuming from {out / 'checkpoint-2'} (step 2)" in log
    assert steps_of(store, run_id, "learning_rate") == [1, 2, 3, 4]
    assert steps_of(store, run_id, "loss") == [1, 2, 3, 4]
    # Any run has this one twice: the trainer adds `epoch` to each log, the last step's and the end's.
    assert repeated_rows(store, run_id) == [(4, "epoch")]


def test_on_save_writes_the_buffered_rows_before_marking_the_checkpoint(store: Store, tmp_path: Path) -> None:
    """The marker is written only after the rows up to its step are in the store (no timer flush here)."""
    run_id = store.create_run(tiny_spec(Path("tiny-llama"), max_steps=4))
    cb = StoreCallback(store, run_id, flush_interval=3600.0, cancel_interval=None, cuda=False)
    seen_when_marked: list[list[int]] = []

    import storage.checkpoints as checkpoints

    real_mark = checkpoints.mark_complete

    def mark_complete(folder: Path, step: int) -> None:
        seen_when_marked.append(steps_of(store, run_id, "loss"))
        real_mark(folder, step)

    args, state, control = SimpleNamespace(output_dir=str(tmp_path)), SimpleNamespace(global_step=0, max_steps=4), None
    cb.on_train_begin(args, state, control)  # type: ignore[arg-type]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoints, "mark_complete", mark_complete)
        for step in (1, 2):
            state.global_step = step
            cb.on_log(args, state, control, logs={"loss": 1.0 / step})  # type: ignore[arg-type]
            (tmp_path / f"checkpoint-{step}").mkdir()
            (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
            cb.on_save(args, state, control)  # type: ignore[arg-type]
    assert seen_when_marked == [[1], [1, 2]]
    assert is_complete(tmp_path / "checkpoint-2")


def test_rows_a_locked_database_kept_back_leave_the_checkpoint_unmarked(
    data_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows the store keeps in memory (still locked after its retries) would die with the process: the
    checkpoint is not marked complete; the next save, once they are written, is."""
    from storage import store_core

    monkeypatch.setattr(store_core, "BUSY_TIMEOUT_MS", 50)  # read when the store's engines are made
    monkeypatch.setattr(store_core, "WRITE_RETRY_S", 0.2)
    store = Store()
    try:
        run_id = store.create_run(tiny_spec(Path("tiny-llama"), max_steps=4))
        cb = StoreCallback(store, run_id, flush_interval=3600.0, cancel_interval=None, cuda=False)
        args, state = SimpleNamespace(output_dir=str(tmp_path)), SimpleNamespace(global_step=0, max_steps=4)
        cb.on_train_begin(args, state, None)  # type: ignore[arg-type]

        def save(step: int) -> Path:
            state.global_step = step
            cb.on_log(args, state, None, logs={"loss": 1.0 / step})  # type: ignore[arg-type]
            folder = tmp_path / f"checkpoint-{step}"
            folder.mkdir()
            (folder / "trainer_state.json").write_text("{}")
            cb.on_save(args, state, None)  # type: ignore[arg-type]
            return folder

        holder = sqlite3.connect(data_home / "tunedeck.db", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another writer holds the database until the test lets go
        try:
            first = save(1)
        finally:
            holder.execute("COMMIT")
            holder.close()
        assert not is_complete(first) and steps_of(store, run_id, "loss") == []
        second = save(2)
        assert is_complete(second) and steps_of(store, run_id, "loss") == [1, 2]
    finally:
        store.dispose()


def test_a_resumed_callback_skips_rows_the_store_has_at_its_checkpoint(store: Store) -> None:
    """Killed after its last checkpoint, once the end-of-training rows were written: the resume (at that
    same step) logs them again, and the store keeps one of each."""
    run_id = store.create_run(tiny_spec(Path("tiny-llama"), max_steps=4))
    now = time.time()
    store.add_metrics(run_id, [MetricPoint(4, "loss", 0.5, now), MetricPoint(4, "train_runtime", 9.0, now)])
    cb = StoreCallback(store, run_id, flush_interval=3600.0, cancel_interval=None, cuda=False)
    state, control = SimpleNamespace(global_step=4, max_steps=4), None
    cb.on_train_begin(None, state, control)  # type: ignore[arg-type]
    cb.on_log(None, state, control, logs={"train_runtime": 1.0, "train_loss": 0.7})  # type: ignore[arg-type]
    cb.on_train_end(None, state, control)  # type: ignore[arg-type]
    assert repeated_rows(store, run_id) == []
    assert [p.value for p in store.metrics(run_id, ["train_runtime"])] == [9.0]
    assert steps_of(store, run_id, "train_loss") == [4]  # what the store lacked is written
