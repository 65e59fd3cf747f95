"""eval_split: rows held out of the training file, evaluated, with eval loss and perplexity graphed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from jobs.data.loading import eval_rows, load_data
from jobs.data.sources import DataError
from jobs.errors import Problem
from jobs.spec.job import JobSpec, SpecError
from storage.models import RunStatus
from tests.training_helpers import tiny_spec


def chat_file(path: Path, n: int) -> str:
    path.write_text(
        "".join(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": f"Question {i}?"},
                        {"role": "assistant", "content": f"Answer {i}."},
                    ]
                }
            )
            + "\n"
            for i in range(n)
        )
    )
    return str(path)


def question(row: dict) -> str:
    return row["messages"][0]["content"]


@pytest.mark.parametrize("split,held_out", [(0.1, 4), (0.25, 10), (0.001, 1), (7, 7), (7.0, 7)])
def test_fraction_or_count(tmp_path: Path, split: float, held_out: int) -> None:
    ref = chat_file(tmp_path / "d.jsonl", 40)
    loaded = load_data(JobSpec(dataset=ref, eval_split=split))
    assert (len(loaded.train), len(loaded.eval)) == (40 - held_out, held_out)
    assert not {question(r) for r in loaded.train} & {question(r) for r in loaded.eval}
    assert loaded.record()["eval_rows"] == held_out and "eval_split" in loaded.record()["eval_dataset"]["ref"]
    again = load_data(JobSpec(dataset=ref, eval_split=split))
    assert [question(r) for r in again.eval] == [question(r) for r in loaded.eval]  # the seed fixes the split


def test_split_comes_before_max_train_samples(tmp_path: Path) -> None:
    loaded = load_data(JobSpec(dataset=chat_file(tmp_path / "d.jsonl", 40), eval_split=10, max_train_samples=5))
    assert (len(loaded.train), len(loaded.eval)) == (5, 10)


def test_split_replaces_a_samples_eval_split() -> None:
    loaded = load_data(JobSpec(dataset="sample:chat-format", eval_split=0.1))
    assert (len(loaded.train), len(loaded.eval)) == (216, 24)


def test_no_split_no_eval_for_user_data(tmp_path: Path) -> None:
    assert load_data(JobSpec(dataset=chat_file(tmp_path / "d.jsonl", 10))).eval is None


@pytest.mark.parametrize("n,split", [(10, 10), (10, 50), (1, 0.5)])
def test_split_leaving_nothing_to_train_is_refused(tmp_path: Path, n: int, split: float) -> None:
    problem = eval_rows(n, split)
    assert (
        isinstance(problem, Problem) and problem.field == "eval_split" and "leaving none to train on" in problem.problem
    )
    from jobs.checks.pipeline import check

    spec = JobSpec(model="tiny-llama", dataset=chat_file(tmp_path / "d.jsonl", n), eval_split=split)
    assert [p for p in check(spec).problems if p.field == "eval_split"]
    with pytest.raises(DataError, match="eval_split"):
        load_data(spec)


@pytest.mark.parametrize(
    "data,words",
    [
        ({"eval_split": 1.5}, "neither a fraction below 1 nor a whole row count"),
        ({"eval_split": 0}, "out of range"),
        ({"eval_split": -0.1}, "out of range"),
        ({"eval_split": 0.1, "eval_dataset": "sample:chat-format:eval"}, "set together with eval_dataset"),
    ],
)
def test_spec_problems(data: dict, words: str) -> None:
    with pytest.raises(SpecError) as err:
        JobSpec.from_dict(data)
    assert any(p.field == "eval_split" and words in p.problem for p in err.value.problems), err.value.problems


@pytest.mark.integration
@pytest.mark.slow
def test_eval_loss_and_perplexity_through_the_worker(store, tiny_model: Path, tmp_path: Path) -> None:
    """The real worker and child: eval every 2 steps on held-out rows; both series reach the run page."""
    from app.ui.run import RunPageData
    from jobs.worker.loop import Worker

    spec = tiny_spec(
        tiny_model,
        dataset=chat_file(tmp_path / "d.jsonl", 24),
        eval_split=0.25,
        max_steps=4,
        eval_steps=2,
        max_train_samples=None,
    )
    run_id = store.create_run(spec)
    Worker(store, poll_interval=0.2, sample=False).work(burst=True)
    run = store.get_run(run_id)
    assert run.status is RunStatus.SUCCEEDED, run.error_summary
    assert run.resolved_config["data"]["eval_rows"] == 6 and run.resolved_config["data"]["train_rows"] == 18
    assert run.resolved_config["trainer_config"]["eval_strategy"] == "steps"
    final = run.final_metrics
    assert math.isclose(final["eval_perplexity"], math.exp(final["eval_loss"]), rel_tol=1e-6)
    losses = store.metrics(run_id, ["eval_loss"])
    perplexities = store.metrics(run_id, ["eval_perplexity"])
    assert len(losses) >= 2 and len(perplexities) == len(losses)  # steps 2 and 4, and the final evaluation
    page = RunPageData(store)
    frames = page.frames(run_id, "sft")
    assert set(frames[4]["series"]) == {"eval perplexity"}
    assert set(frames[1]["series"]) == {"train", "eval"}
