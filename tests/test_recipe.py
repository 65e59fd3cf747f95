"""The training child's recipe (`jobs.train.recipe`): its steps in order, cleanup after a failure, and the metrics
sinks (`jobs.train.sinks`): the store and a tracker receive the same rows through one interface."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from jobs.spec.job import JobSpec
from jobs.spec.trackers import Tracker
from jobs.train import recipe as recipe_module
from jobs.train.callbacks import STOP_REQUESTED, StoreCallback
from jobs.train.mirrors import TrackerSink, open_trackers
from jobs.train.recipe import Recipe, run_recipe
from storage.models import RunStatus


@pytest.fixture(autouse=True)
def _clear_stop_flag():
    STOP_REQUESTED.clear()
    yield
    STOP_REQUESTED.clear()


class Steps:
    """A recipe that records each step it is asked for; `fail_in` raises there."""

    def __init__(self, fail_in: str | None = None) -> None:
        self.calls: list[str] = []
        self.fail_in = fail_in

    def _step(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail_in:
            raise RuntimeError(f"{name} broke")

    def setup(self) -> None:
        self._step("setup")

    def train(self) -> None:
        self._step("train")

    def save(self) -> None:
        self._step("save")

    def failed(self, exc: BaseException) -> int:
        self.calls.append(f"failed: {exc}")
        return 7

    def cleanup(self) -> None:
        self.calls.append("cleanup")


def test_the_recipe_steps_run_in_order_and_cleanup_follows_a_failure() -> None:
    ok = Steps()
    assert run_recipe(ok) == 0
    assert ok.calls == ["setup", "train", "save", "cleanup"]
    broken = Steps(fail_in="train")
    assert run_recipe(broken) == 7  # `failed` gives the exit code
    assert broken.calls == ["setup", "train", "failed: train broke", "cleanup"]  # no save after a failed train


class Recording:
    """A tracker's client that records what reaches it (the store's status read at the moment it closes)."""

    def __init__(self, store: Any, run_id: int) -> None:
        self.store, self.run_id = store, run_id
        self.calls: list[Any] = []

    def log(self, points: Any) -> None:
        self.calls.append(("log", list(points)))

    def note(self, findings: Any) -> None:
        self.calls.append(("note", list(findings)))

    def close(self, status: str) -> None:
        self.calls.append(("close", status, self.store.get_run(self.run_id).status))


def test_a_failure_in_train_is_recorded_and_cleanup_closes_every_sink_after(
    store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real Recipe on a real store, with the model's part (`prepare`, `fit`) stood in for: a failure in
    train marks the run failed, and cleanup then gives each tracker the final status."""
    spec = JobSpec(model="tiny-llama", sample_count=0)
    run_id = store.create_run(spec)
    store.claim_next_on_device("w", "0")
    tracker = Recording(store, run_id)
    prepared = type("Prepared", (), {"resolved": {}})()
    monkeypatch.setattr(recipe_module, "open_trackers", lambda *a: [TrackerSink(Tracker.TENSORBOARD, tracker)])
    monkeypatch.setattr(recipe_module, "prepare", lambda *a, **k: prepared)

    def fit(prepared: Any, resume_from: str | None) -> Any:
        raise RuntimeError("the trainer broke")

    monkeypatch.setattr(recipe_module, "fit", fit)
    recipe = Recipe(store, run_id, spec)
    assert run_recipe(recipe) == 1
    run = store.get_run(run_id)
    assert run.status is RunStatus.FAILED and "the trainer broke" in (run.error_summary or "")
    assert tracker.calls[-1] == ("close", "failed", RunStatus.FAILED)  # closed after the run's end was recorded
    assert recipe.callback is not None and recipe.callback.sinks[1].mirror is tracker  # type: ignore[attr-defined]


def test_the_store_and_a_tracker_receive_the_same_rows_through_one_interface(store: Any, tmp_path: Path) -> None:
    """One batch goes to every sink: the store's rows and TensorBoard's scalars are the same (name, step, value)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers import TrainerControl, TrainerState

    spec = JobSpec(model="tiny-llama", report_to="tensorboard")
    run_id = store.create_run(spec)
    trackers = open_trackers(spec, run_id, tmp_path)
    cb = StoreCallback(store, run_id, flush_interval=3600, cancel_interval=None, cuda=False, trackers=trackers)
    assert [type(s).__name__ for s in cb.sinks] == ["StoreSink", "TrackerSink"]
    state, control = TrainerState(max_steps=3), TrainerControl()
    cb.on_train_begin(None, state, control)  # type: ignore[arg-type]
    for step, loss in enumerate([2.5, 2.25, 1.75], start=1):
        state.global_step = step
        cb.on_log(None, state, control, logs={"loss": loss, "learning_rate": 1e-3 * step, "note": "text"})  # type: ignore[arg-type]
    cb.on_train_end(None, state, control)  # type: ignore[arg-type]
    for sink in cb.sinks:
        sink.close("succeeded")
    stored = {(p.name, p.step): p.value for p in store.metrics(run_id)}
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    mirrored = {(tag, e.step): e.value for tag in events.Tags()["scalars"] for e in events.Scalars(tag)}
    assert {("loss", 1), ("loss", 3), ("learning_rate", 2)} <= set(stored)
    assert set(mirrored) == set(stored)
    assert all(math.isclose(mirrored[key], value, rel_tol=1e-6) for key, value in stored.items())


def test_the_spec_is_parsed_once_the_last_oom_recoverys_in_place_of_the_submitted_one(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an OOM recovery the child trains the spec that recovery recorded: it parses that one, once (it used to
    parse the submitted one too); a recorded spec it cannot read fails the run naming the field."""
    from jobs.train import oom
    from jobs.train.recipe import load_spec

    submitted = JobSpec(model="tiny-llama", per_device_train_batch_size=8)
    run_id = store.create_run(submitted)
    store.claim_next_on_device("w", "0")
    recovered = {**submitted.to_dict(), "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}
    store.add_run_event(run_id, oom.EVENT_KIND, "OOM at step 3", step=3, data={"spec": recovered, "rung": 0})
    parsed: list[Any] = []
    from_dict = JobSpec.from_dict.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(
        JobSpec, "from_dict", classmethod(lambda cls, data: parsed.append(data) or from_dict(cls, data))
    )
    spec = load_spec(store, run_id)
    assert spec is not None and (spec.per_device_train_batch_size, spec.gradient_accumulation_steps) == (4, 2)
    assert len(parsed) == 1
    store.add_run_event(run_id, oom.EVENT_KIND, "OOM at step 5", step=5, data={"spec": {**recovered, "lora_r": -1}})
    assert load_spec(store, run_id) is None
    run = store.get_run(run_id)
    assert run.status is RunStatus.FAILED and "lora_r" in (run.error_summary or "")
