"""Early stopping: the spec's patience mapped to transformers, refused when inconsistent, and a run that
overfits stopping early with its best checkpoint in the bundle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import TrainerCallback

from jobs.config.evaluation import early_stopping_callback, early_stopping_kwargs
from jobs.spec.job import JobSpec, SpecError
from jobs.train.best import BestCheckpoint
from storage.models import RunStatus
from tests.training_helpers import tiny_spec


@pytest.mark.parametrize(
    "data,field,words",
    [
        ({"dataset": "d.jsonl", "eval_steps": 5}, "early_stopping_patience", "this run has none"),
        ({"eval_split": 0.1}, "early_stopping_patience", "eval_steps is empty"),
        ({"eval_split": 0.1, "eval_steps": 5, "save_steps": 7}, "save_steps", "not a multiple of eval_steps (5)"),
        ({"eval_split": 0.1, "eval_steps": 5, "metric_for_best_model": "eval loss"}, "metric_for_best_model", "not a"),
        ({"early_stopping_patience": 0, "eval_split": 0.1, "eval_steps": 5}, "early_stopping_patience", "range"),
    ],
)
def test_inconsistent_early_stopping_is_refused(data: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(SpecError) as err:
        JobSpec.from_dict({"early_stopping_patience": 3, **data})
    assert any(p.field == field and words in p.problem and p.fix for p in err.value.problems), err.value.problems


@pytest.mark.parametrize(
    "data",
    [
        {"eval_split": 0.1, "eval_steps": 5},
        {"dataset": "sample:chat-format", "eval_steps": 5},  # a sample's own eval split
        {"dataset": "d.jsonl", "eval_dataset": "e.jsonl", "eval_steps": 5, "save_steps": 10},
    ],
)
def test_consistent_early_stopping_is_accepted(data: dict[str, Any]) -> None:
    assert JobSpec.from_dict({"early_stopping_patience": 3, **data}).problems() == []


@pytest.mark.parametrize(
    "data,has_eval,expected",
    [
        ({}, True, {}),
        ({"early_stopping_patience": 2, "eval_split": 0.1, "eval_steps": 5}, False, {}),
        (
            {"early_stopping_patience": 2, "eval_split": 0.1, "eval_steps": 5},
            True,
            {
                "load_best_model_at_end": True,
                "metric_for_best_model": "eval_loss",
                "greater_is_better": False,
                "save_strategy": "steps",
                "save_steps": 5,
                "restore_callback_states_from_checkpoint": True,
            },
        ),
        (
            {
                "early_stopping_patience": 2,
                "eval_split": 0.1,
                "eval_steps": 5,
                "save_steps": 15,
                "metric_for_best_model": "mean_token_accuracy",
            },
            True,
            {
                "load_best_model_at_end": True,
                "metric_for_best_model": "eval_mean_token_accuracy",
                "greater_is_better": True,
                "save_strategy": "steps",
                "save_steps": 15,
                "restore_callback_states_from_checkpoint": True,
            },
        ),
    ],
)
def test_mapping(data: dict[str, Any], has_eval: bool, expected: dict[str, Any]) -> None:
    spec = JobSpec.from_dict(data)
    assert early_stopping_kwargs(spec, has_eval=has_eval) == expected
    callback = early_stopping_callback(spec, has_eval=has_eval)
    assert (callback is None) == (not expected)
    if callback is not None:
        assert (callback.early_stopping_patience, callback.early_stopping_threshold) == (2, 0.0)


def test_the_training_arguments_accept_the_mapping() -> None:
    """transformers itself checks that saves fall on evaluations; the mapped arguments pass its check."""
    from jobs.config.mapping import training_config
    from jobs.devices.probe import detect_device

    spec = JobSpec.from_dict({"early_stopping_patience": 2, "eval_split": 0.1, "eval_steps": 5, "save_steps": 10})
    args = training_config(spec, detect_device(), "/tmp/out", has_eval=True)
    assert args.load_best_model_at_end and args.save_steps == 10 and args.eval_steps == 5


@pytest.mark.parametrize(
    "best,words",
    [
        (
            BestCheckpoint("eval_loss", 1.23456, 120, 180, True, 3),
            "eval loss did not improve for 3 evaluations after step 120 (best 1.235); training stopped at step 180; "
            "the bundle holds step 120",
        ),
        (BestCheckpoint("eval_loss", 2.0, 40, 60, False, 3), "eval loss was best at step 40 (best 2); training ran"),
        (BestCheckpoint("eval_loss", 2.0, 60, 60, False, 3), "best at the last step, 60 (best 2)"),
    ],
)
def test_the_end_is_worded(best: BestCheckpoint, words: str) -> None:
    assert words in best.message()


def conflicting_data(tmp_path: Path) -> tuple[Path, Path]:
    """Training rows that answer each question with one word list, eval rows that answer the same questions with
    another: the better the model learns the training answers, the worse its eval loss gets."""

    def write(name: str, answers: list[str]) -> Path:
        rows = [
            {
                "messages": [
                    {"role": "user", "content": f"Code {i}?"},
                    {"role": "assistant", "content": answer},
                ]
            }
            for i, answer in enumerate(answers)
        ]
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path

    return (
        write("train.jsonl", [f"alpha bravo {i} charlie delta" for i in range(8)]),
        write("eval.jsonl", [f"zulu yankee {i} xray whiskey" for i in range(8)]),
    )


@pytest.mark.integration
def test_an_overfitting_run_stops_early_and_its_bundle_holds_the_best_step(
    store: Any, tiny_model: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    from jobs.train.child import run

    train, eval_ = conflicting_data(tmp_path)
    spec = tiny_spec(
        tiny_model,
        dataset=str(train),
        eval_dataset=str(eval_),
        max_steps=30,
        max_train_samples=None,
        method="full",  # a full fine-tune of the tiny model overfits within a few steps (LoRA learns too slowly)
        learning_rate=1e-2,
        eval_steps=2,
        early_stopping_patience=2,
        sample_count=0,
    )
    run_id = store.create_run(spec)
    store.claim_next_on_device("test", "0")
    assert run(run_id, store) == 0
    record = store.get_run(run_id)
    assert record.status is RunStatus.SUCCEEDED, record.error_summary
    evals = {
        p.step: p.value for p in store.metrics(run_id, ["eval_loss"]) if p.step < record.final_metrics["global_step"]
    }
    best_step = min(evals, key=lambda s: evals[s])
    last = int(record.final_metrics["global_step"])
    assert last < 30, f"the run trained to the end: eval losses {evals}"
    assert int(record.final_metrics["best_step"]) == best_step < last
    events = [e for e in store.run_events(run_id) if e["kind"] == "best_checkpoint"]
    assert len(events) == 1 and events[0]["step"] == best_step
    assert (
        f"eval loss did not improve for 2 evaluations after step {best_step}" in events[0]["message"]
        and f"the bundle holds step {best_step}" in events[0]["message"]
    )
    # The run page's loss graph marks the step the bundle holds.
    from app.ui.run import RunPageData

    loss = RunPageData(store).frames(run_id, "sft")[1]
    marked = loss[loss["series"] == "best (in the bundle)"]
    # (one logged value is drawn as a short flat segment centred on its step: app.ui.series.metric_rows)
    assert list(marked["step"]) == [best_step - 0.5, best_step + 0.5]
    assert list(marked["value"]) == pytest.approx([evals[best_step]] * 2)
    # The bundle's weights are the best checkpoint's, not the last step's.
    output = store.run_dir(run_id) / "output"
    bundle = load_file(store.run_dir(run_id) / "bundle" / "model.safetensors")
    kept = load_file(output / f"checkpoint-{best_step}" / "model.safetensors")
    latest = load_file(output / f"checkpoint-{last}" / "model.safetensors")
    assert bundle.keys() == kept.keys()
    assert all((bundle[k] == kept[k]).all() for k in bundle)
    assert any((bundle[k] != latest[k]).any() for k in bundle)


class StopAtFirstSetback(TrainerCallback):  # type: ignore[misc]
    """Asks training to stop (as a cancel does) at the first evaluation that did not improve on the best."""

    def __init__(self) -> None:
        self.best: float | None = None
        self.stopped_after: int | None = None

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, float], **kwargs: Any) -> None:
        from jobs.train.callbacks import STOP_REQUESTED

        loss = metrics["eval_loss"]
        if self.best is not None and loss >= self.best and self.stopped_after is None:
            self.stopped_after = state.global_step
            STOP_REQUESTED.set()
        self.best = loss if self.best is None else min(self.best, loss)


@pytest.mark.integration
def test_a_resumed_run_keeps_its_best_and_its_patience_count(store: Any, tiny_model: Path, tmp_path: Path) -> None:
    """Cancelled one evaluation into its patience and resumed, the run stops exactly `patience` evaluations
    after its best: the count went on from the checkpoint (a fresh count would train one evaluation longer)."""
    from jobs.queue.run_actions import resume
    from jobs.train.callbacks import STOP_REQUESTED
    from jobs.train.child import run

    train, eval_ = conflicting_data(tmp_path)
    spec = tiny_spec(
        tiny_model,
        dataset=str(train),
        eval_dataset=str(eval_),
        max_steps=30,
        max_train_samples=None,
        method="full",
        learning_rate=1e-2,
        eval_steps=2,
        early_stopping_patience=2,
        sample_count=0,
    )
    run_id = store.create_run(spec)
    store.claim_next_on_device("test", "0")
    setback = StopAtFirstSetback()
    try:
        assert run(run_id, store, callbacks=[setback]) == 0
    finally:
        STOP_REQUESTED.clear()
    assert setback.stopped_after is not None and store.get_run(run_id).status is RunStatus.CANCELLED
    assert resume(store, run_id).run_id == run_id
    store.claim_next_on_device("test", "0")
    assert run(run_id, store) == 0
    record = store.get_run(run_id)
    assert record.status is RunStatus.SUCCEEDED, record.error_summary
    best, last = int(record.final_metrics["best_step"]), int(record.final_metrics["global_step"])
    assert last == best + 2 * 2 and last > setback.stopped_after, (best, last, setback.stopped_after)
    (event,) = [e for e in store.run_events(run_id) if e["kind"] == "best_checkpoint"]
    assert f"the bundle holds step {best}" in event["message"]
