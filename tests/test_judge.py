"""A judge's win rate of a run against its base: both orders per prompt, replies without a verdict counted as ties
and recorded, the counts and reasons stored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobs.evaluate.judge import judge_pairs, parse_verdict
from jobs.train.judges import one_by_one


@pytest.mark.parametrize(
    "reply,verdict",
    [
        ("A", "A"),
        ("b. The second answer is right.", "B"),
        ("**Verdict: A** because", "A"),
        ("Tie - both are fine", "tie"),
        ("  answer: b", "B"),
        ("", None),
        ("Absolutely the first", None),  # a word starting with a is no verdict
        ("I think the better one is A", None),  # the verdict must lead the reply
        ("The answer is A.", "A"),  # how SmolLM2-135M leads its verdicts
        ("The better answer is b: it is shorter", "B"),
        ("The answer to the question is long", None),
        ("\x00\x01 garbage", None),
    ],
)
def test_verdicts_are_read_from_the_start_of_the_reply(reply: str, verdict: str | None) -> None:
    assert parse_verdict(reply) == verdict


def test_both_orders_cancel_a_judge_that_always_picks_the_first_answer() -> None:
    """A judge biased to answer A gives the run one win and one loss per prompt: a win rate of 0.5."""
    asked: list[str] = []

    def first(prompt: str) -> str:
        asked.append(prompt)
        return "A"

    result = judge_pairs("biased", one_by_one(first), [("q1", "base answer", "run answer"), ("q2", "b2", "r2")])
    assert (result.wins, result.ties, result.losses, len(result.judgments)) == (2, 0, 2, 4)
    assert result.win_rate == 0.5
    assert "Answer A:\nrun answer" in asked[0] and "Answer A:\nbase answer" in asked[1]  # both orders shown


def test_unparsed_replies_count_as_ties_and_are_recorded() -> None:
    replies = iter(["B because", "nonsense", "tie", "A"])
    result = judge_pairs("odd", one_by_one(lambda _: next(replies)), [("q1", "b", "r"), ("q2", "b", "r")])
    assert [j.verdict for j in result.judgments] == ["base", "unparsed", "tie", "base"]
    assert (result.wins, result.ties, result.losses, result.unparsed) == (0, 2, 2, 1)
    assert "1 replies without a verdict counted as ties" in result.summary()


@pytest.mark.integration
def test_a_tiny_local_judge_judges_a_run_against_its_base(tag_store: Any, tiny_model: Path) -> None:
    import zipfile

    from app.cli.show import show_text
    from jobs.evaluate.judge import judge_run
    from jobs.train.artifacts import bundle_of

    _folder, store, ids = tag_store
    run_id = ids["lora"]
    result = judge_run(store, run_id, str(tiny_model))
    n = len(result.judgments)
    assert n == 6 and {j.run_first for j in result.judgments} == {True, False}  # 3 samples, both orders
    assert result.wins + result.ties + result.losses == n
    scores = {s.metric: s for s in store.scores(run_id) if s.task == "judge"}
    assert scores["wins"].value == result.wins and scores["unparsed"].value == result.unparsed
    assert scores["win_rate"].value == pytest.approx(result.win_rate)
    saved = json.loads((store.run_dir(run_id) / "judge.json").read_text())
    assert [j["reply"] for j in saved["judgments"]] == [j.reply for j in result.judgments]  # the reasons are kept
    event = [e for e in store.run_events(run_id) if e["kind"] == "judge"][-1]
    assert event["message"] == result.summary() and f"of {n} judgments" in event["message"]
    assert f"judge: {result.summary()}" in show_text(store, store.get_run(run_id))
    with zipfile.ZipFile(bundle_of(store, run_id)) as zf:  # the bundle's card says it too
        assert result.summary() in zf.read("README.md").decode()


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"judge": "smollm2-135m-instruct", "sample_count": 0}, "sample_count is 0"),
        ({"judge": "https://api.example.com/v1"}, "names no model"),
        ({"judge": "smollm2-135m-instruct", "trainer": "reward"}, "writes no answers"),
    ],
)
def test_a_judge_that_could_not_judge_is_refused_at_submit(fields: dict[str, Any], words: str) -> None:
    from jobs.spec.job import JobSpec, SpecError

    with pytest.raises(SpecError) as refused:
        JobSpec.from_dict(fields)
    problems = [p for p in refused.value.problems if p.field == "judge"]
    assert len(problems) == 1 and words in problems[0].problem, problems


def test_a_judge_is_queued_alone_or_with_the_benchmarks_in_one_task() -> None:
    from jobs.spec.evaluation import evaluation_tasks
    from jobs.spec.job import JobSpec

    assert evaluation_tasks(JobSpec()) == []
    assert evaluation_tasks(JobSpec(judge=" run:3 ")) == [("judge", {"judge": "run:3"})]
    assert evaluation_tasks(JobSpec(eval_tasks="qa.jsonl")) == [("evaluate", {"tasks": "qa.jsonl"})]
    both = evaluation_tasks(JobSpec(eval_tasks="qa.jsonl", judge="smollm2-135m-instruct"))
    assert both == [("evaluate", {"tasks": "qa.jsonl", "judge": "smollm2-135m-instruct"})]
