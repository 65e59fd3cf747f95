"""Checkpoints a long run can count on: a timed default interval, and a cancel that waits for the save."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from test_worker import make_worker  # noqa: E402
from training_helpers import tiny_spec, wait_for  # noqa: E402

from jobs.spec.job import JobSpec
from jobs.train.callbacks import StoreCallback
from storage.checkpoints import is_complete
from storage.models import RunStatus
from storage.store import Store


def test_timed_checkpoints_by_default(store: Store) -> None:
    assert JobSpec().save_minutes == 10.0 and JobSpec().save_total_limit == 2
    run_id = store.create_run(JobSpec(model="tiny-llama", max_steps=5))
    cb = StoreCallback(store, run_id, cuda=False, save_interval_s=600.0)
    state = SimpleNamespace(global_step=0, max_steps=100)
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    cb.on_train_begin(None, state, control)
    state.global_step = 1
    cb.on_step_end(None, state, control)
    assert control.should_save is False  # not yet ten minutes
    cb._last_save -= 601.0  # ten minutes of training later
    state.global_step = 2
    cb.on_step_end(None, state, control)
    assert control.should_save is True


def test_cancel_waits_for_the_checkpoint_being_written(store: Store) -> None:
    """The child takes longer than the grace period to finish its checkpoint: it is not killed mid-save."""
    run_id = store.create_run(JobSpec(model="tiny-llama", max_steps=5))
    out = store.run_dir(run_id) / "output"
    code = f"""
    import json
    from pathlib import Path
    from storage.store import Store
    folder = Path({str(out)!r}) / "checkpoint-3"
    def on_term(signum, frame):
        folder.mkdir(parents=True)            # the save begins...
        time.sleep(2.5)                       # ...and outlasts the 0.5 s grace period
        (folder / "trainer_state.json").write_text("{{}}")
        (folder / "tunedeck-complete.json").write_text(json.dumps({{"step": 3}}))
        Store().mark_cancelled(run_id, exit_code=0)
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
    """
    worker = make_worker(store, code, grace_period=0.5, save_grace=60.0)
    import threading

    thread = threading.Thread(target=worker.work, kwargs={"stop_after": run_id})
    thread.start()
    log = store.run_dir(run_id) / "train.log"
    wait_for(lambda: log.exists() and "ready" in log.read_text(), what="child ready for SIGTERM")
    store.request_cancel(run_id)
    thread.join(120)
    run = store.get_run(run_id)
    assert run.status is RunStatus.CANCELLED and run.exit_code == 0  # not SIGKILLed (-9)
    assert is_complete(out / "checkpoint-3")
    assert Path(run.log_path).exists()


@pytest.mark.integration
def test_auto_find_batch_size_records_the_micro_batch_it_ended_with(tiny_model: Path, tmp_path: Path) -> None:
    from jobs.train.training import train_spec

    spec = tiny_spec(tiny_model, max_steps=2, max_length=48, per_device_train_batch_size=4, auto_find_batch_size=True)
    result = train_spec(spec, tmp_path / "out")
    assert result.metrics["per_device_train_batch_size_final"] == 4.0  # no OOM on CPU: what was asked
    assert result.resolved["per_device_train_batch_size_final"] == 4
