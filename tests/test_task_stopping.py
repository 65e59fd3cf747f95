"""Early stopping on a benchmark task's score (`metric_for_best_model: task:<task>/<metric>`): the spec's and the
submit check's refusals, the mapping to transformers, and a run that watches a task score, scored at every
evaluation by the harness's own scoring, stopping when it stops improving with the best step in its bundle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobs.config.evaluation import early_stopping_kwargs
from jobs.spec.job import JobSpec, SpecError
from jobs.train.best import BestCheckpoint
from storage.models import RunStatus
from tests.training_helpers import tiny_spec

WATCHING = {"early_stopping_patience": 2, "eval_split": 0.1, "eval_steps": 5}


def questions(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize(
    "metric,tasks,words,fix",
    [
        ("task:qa", "qa.jsonl", "is not a task score", "task:<task>/<metric>"),
        ("task:qa/f1", "qa.jsonl", "'f1' is not a score of a task of questions", "exact_match"),
        ("task:qa/exact_match", None, "eval_tasks does not list (it is empty)", "add qa.jsonl to eval_tasks"),
        ("task:qa/exact_match", "data/other.jsonl", "(it lists other)", "add qa.jsonl"),
    ],
)
def test_a_task_score_written_wrong_is_refused(metric: str, tasks: str | None, words: str, fix: str) -> None:
    with pytest.raises(SpecError) as err:
        JobSpec.from_dict({**WATCHING, "metric_for_best_model": metric, "eval_tasks": tasks})
    assert any(
        p.field == "metric_for_best_model" and words in p.problem and fix in p.fix for p in err.value.problems
    ), err.value.problems


def test_a_task_score_is_mapped_as_greater_is_better() -> None:
    spec = JobSpec.from_dict(
        {**WATCHING, "metric_for_best_model": "task:qa/exact_match", "eval_tasks": "data/qa.jsonl, other.jsonl"}
    )
    assert spec.problems() == []
    kwargs = early_stopping_kwargs(spec, has_eval=True)
    assert kwargs["metric_for_best_model"] == "eval_task/qa/exact_match" and kwargs["greater_is_better"] is True
    assert early_stopping_kwargs(JobSpec.from_dict(WATCHING), has_eval=True)["greater_is_better"] is False


def test_the_submit_check_refuses_a_task_that_cannot_be_watched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs.checks.pipeline import check

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    answers = questions(tmp_path / "answers.jsonl", [{"question": "2+2?", "answer": "4"}])
    yaml_task = tmp_path / "mine.yaml"
    yaml_task.write_text("task: mine\noutput_type: multiple_choice\n")

    def refusals(metric: str, tasks: str) -> list[str]:
        spec = JobSpec(model="tiny-llama", metric_for_best_model=metric, eval_tasks=tasks, **WATCHING)  # type: ignore[arg-type]
        return [f"{p.problem} | {p.fix}" for p in check(spec).problems if p.field == "metric_for_best_model"]

    (unscored,) = refusals("task:answers/regex_match", answers)
    assert "is not scored by regex_match (its rows give exact_match)" in unscored
    assert "watch task:answers/exact_match" in unscored
    (hub,) = refusals("task:arc_easy/acc", f"{answers}, arc_easy")
    assert "arc_easy is the hub's task: only a .jsonl of questions is scored during training" in hub
    (own,) = refusals("task:mine/acc", f"{answers}, {yaml_task}")
    assert "a task YAML's task" in own
    assert refusals("task:answers/exact_match", answers) == []


def test_the_end_names_the_task_score() -> None:
    best = BestCheckpoint("eval_task/tag-format-questions/exact_match", 0.75, 20, 40, True, 2)
    assert best.message() == (
        "tag-format-questions exact_match did not improve for 2 evaluations after step 20 (best 0.75); "
        "training stopped at step 40; the bundle holds step 20"
    )


def test_scoring_leaves_the_training_random_generators_as_they_were() -> None:
    import random

    import numpy as np
    import torch

    from jobs.train.task_watch import _training_kept

    torch.manual_seed(1234), np.random.seed(1234), random.seed(1234)
    expected = torch.rand(3), np.random.rand(), random.random()
    torch.manual_seed(1234), np.random.seed(1234), random.seed(1234)
    with _training_kept():  # lm-eval seeds all three with 0 at each call
        torch.manual_seed(0), np.random.seed(0), random.seed(0)
        torch.rand(5)
    assert torch.equal(torch.rand(3), expected[0]) and (np.random.rand(), random.random()) == expected[1:]


def opposite_data(tmp_path: Path) -> tuple[str, str, str]:
    """Training rows teach one answer to each code; the watched task asks for each code's answer against another
    code's, so its accuracy moves as the model learns the codes (it cannot improve past 8 of 8), and stops improving
    within a few evaluations."""

    def rows(answers: list[str]) -> list[dict[str, Any]]:
        turns = [
            [{"role": "user", "content": f"Code {i}?"}, {"role": "assistant", "content": a}]
            for i, a in enumerate(answers)
        ]
        return [{"messages": t} for t in turns]

    taught = [f"alpha bravo {i} charlie delta" for i in range(8)]
    held = [f"zulu yankee {i} xray whiskey" for i in range(8)]  # eval rows: eval loss needs held-out data
    train = questions(tmp_path / "train.jsonl", rows(taught))
    eval_ = questions(tmp_path / "eval.jsonl", rows(held))
    task = [{"question": f"Code {i}?", "choices": [taught[(i + 3) % 8], taught[i]], "answer": 1} for i in range(8)]
    return train, eval_, questions(tmp_path / "codes.jsonl", task)


@pytest.mark.integration
def test_a_run_watching_a_task_score_stops_early_and_keeps_its_best_step(
    store: Any, tiny_model: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    from app.cli.show import show_text
    from app.ui.run import RunPageData
    from jobs.spec.evaluation import task_series
    from jobs.train.child import run

    train, eval_, task = opposite_data(tmp_path)
    spec = tiny_spec(
        tiny_model,
        dataset=train,
        eval_dataset=eval_,
        eval_tasks=task,
        metric_for_best_model="task:codes/acc",
        max_steps=30,
        max_train_samples=None,
        method="full",  # a full fine-tune of the tiny model learns its answers within a few steps
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
    last = int(record.final_metrics["global_step"])
    assert last < 30, f"the run trained to the end: {store.metrics(run_id, ['eval_task/codes/acc'])}"
    # One row per evaluation during training (every 2 steps), then the final evaluation's of the bundle's model.
    points = store.metrics(run_id, ["eval_task/codes/acc"])
    during = points[: last // 2]
    assert [p.step for p in during] == list(range(2, last + 1, 2)), points
    assert len(points) == len(during) + 1 and all(0.0 <= p.value <= 1.0 for p in points)
    top = max(p.value for p in during)
    best_step = next(p.step for p in during if p.value == top)  # the first best: later ties are no improvement
    assert best_step < last and last == best_step + 2 * 2  # two evaluations without improvement, then the stop
    assert int(record.final_metrics["best_step"]) == best_step
    (event,) = [e for e in store.run_events(run_id) if e["kind"] == "best_checkpoint"]
    assert event["step"] == best_step and event["message"].startswith(
        f"codes acc did not improve for 2 evaluations after step {best_step} (best {top:.4g})"
    )
    assert f"the bundle holds step {best_step}" in event["message"]
    shown = show_text(store, record)  # `tunedeck show`: the end's words, the score among the final metrics
    assert event["message"] in shown and "eval_task/codes/acc:" in shown
    # The run page charts the score with the trainer's metrics.
    own = RunPageData(store).frames(run_id, "sft", task_series(spec.metric_for_best_model))[4]
    assert set(own["series"]) >= {"codes acc"}
    # The bundle's weights are the best checkpoint's.
    output = store.run_dir(run_id) / "output"
    bundle = load_file(store.run_dir(run_id) / "bundle" / "model.safetensors")
    kept = load_file(output / f"checkpoint-{best_step}" / "model.safetensors")
    assert bundle.keys() == kept.keys() and all((bundle[k] == kept[k]).all() for k in bundle)
