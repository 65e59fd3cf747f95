"""Try rewards before training (`jobs.train.reward_trial`): advantages as trl computes them, groups with no
learning signal, the share of prompts that can teach; the worker task (no run), the CLI, the API and the
dashboard's policy (declared rewards accepted, code refused)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from jobs.queue.trial import request_try_rewards
from jobs.spec.job import JobSpec, SpecError
from jobs.train.reward_trial import advantages, summarise, weighted_totals
from jobs.worker.tasks import TaskKind, cli_args
from storage.models import TaskStatus
from tests.training_helpers import tiny_spec

NEVER = '[{kind: regex, pattern: "qqqzzzqqq", name: never}]'  # no completion of the tiny model matches
SHORT = '[{kind: regex, pattern: "^.{0,22}$", mode: match, name: short}]'  # its completions are 12-30 characters


def grpo(**changes) -> dict:
    return {"trainer": "grpo", "dataset": "sample:prompt-format", "rewards": NEVER, "num_generations": 4, **changes}


# ---------------------------------------------------------------------- the statistics (fast)
@pytest.mark.parametrize(
    ("scale", "expected"),
    [
        ("group", [0.5 / (math.sqrt(0.5) + 1e-4), -0.5 / (math.sqrt(0.5) + 1e-4), 0.0, 0.0]),
        ("none", [0.5, -0.5, 0.0, 0.0]),
        ("batch", [0.5 / (0.5 + 1e-4), -0.5 / (0.5 + 1e-4), 0.0, 0.0]),  # std of [1, 0, 1, 1] (unbiased) is 0.5
    ],
)
def test_advantages_are_trls(scale: str, expected: list[float]) -> None:
    """Group baseline; divided by the group's std (unbiased, +1e-4), the batch's, or not at all."""
    adv, means, spreads = advantages([1.0, 0.0, 1.0, 1.0], 2, scale)
    assert adv == pytest.approx(expected, rel=1e-5)
    assert means == [0.5, 1.0] and spreads == pytest.approx([math.sqrt(0.5), 0.0])


def test_a_reward_that_cannot_vary_has_no_signal_and_one_that_varies_has_some() -> None:
    prompts, g = ["p1", "p2"], 2
    flat = summarise(prompts, ["a", "b", "c", "d"], {"never": [0.0] * 4}, [1.0], g, "group")
    assert flat["teaching"] == 0 and flat["share_teaching"] == 0.0
    assert [grp["teaches"] for grp in flat["groups"]] == [False, False]
    assert all(c["advantage"] == 0.0 for grp in flat["groups"] for c in grp["completions"])
    mixed = summarise(prompts, ["a", "b", "c", "d"], {"short": [1.0, 0.0, 1.0, 1.0]}, [1.0], g, "group")
    assert mixed["teaching"] == 1 and mixed["share_teaching"] == 0.5
    assert mixed["groups"][0]["completions"][0]["scores"] == {"short": 1.0}


def test_weights_sum_and_unscorable_completions_get_no_advantage() -> None:
    """trl's nansum of weighted scores; a completion no reward scored (None) is left out of its group's baseline."""
    assert weighted_totals({"a": [1.0, None, None], "b": [0.5, 1.0, None]}, [2.0, -1.0]) == [1.5, -1.0, None]
    adv, means, _ = advantages([1.0, None, 3.0, 1.0], 2, "group")  # type: ignore[list-item]
    assert adv[1] == 0.0 and means[0] == 1.0


# ---------------------------------------------------------------------- the request (fast)
def test_the_dashboard_queues_declared_rewards_as_a_task_without_a_run_and_refuses_code(data_home, store) -> None:
    from jobs.checks.access import AccessPolicy

    task_id = request_try_rewards(store, JobSpec.from_dict(grpo(model="tiny-llama")), 2, AccessPolicy.dashboard())
    task = store.get_task(task_id)
    assert task.run_id is None and task.kind == TaskKind.TRY_REWARDS.value and task.status is TaskStatus.QUEUED
    assert task.args["prompts"] == 2 and JobSpec.from_dict(task.args["spec"]).rewards == NEVER
    assert cli_args(task) == ["grpo", "try", "--task", str(task_id)]
    assert store.count_runs() == 0
    code = JobSpec.from_dict(grpo(model="tiny-llama", rewards=None, reward_function="my_rewards:score"))
    with pytest.raises(SpecError) as err:
        request_try_rewards(store, code, 2, AccessPolicy.dashboard())
    assert [p.field for p in err.value.problems] == ["reward_function"]
    with pytest.raises(SpecError) as err:
        request_try_rewards(store, JobSpec(model="tiny-llama"), 2, AccessPolicy.dashboard())
    assert [p.field for p in err.value.problems] == ["trainer"]
    with pytest.raises(SpecError) as err:
        request_try_rewards(store, JobSpec.from_dict(grpo(model="tiny-llama")), 0)
    assert [p.field for p in err.value.problems] == ["prompts"]


# ---------------------------------------------------------------------- real sampling (tiny model)
def _spec(tiny_model: Path, rewards: str) -> JobSpec:
    return tiny_spec(
        tiny_model,
        trainer="grpo",
        dataset="sample:prompt-format",
        num_generations=4,
        max_completion_length=12,
        per_device_train_batch_size=4,
        rewards=rewards,
    )


@pytest.mark.integration
def test_the_cli_reports_zero_signal_for_a_reward_that_cannot_vary(
    data_home, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli.main import main

    path = tmp_path / "never.yaml"
    path.write_text(_spec(tiny_model, NEVER).to_yaml())
    assert main(["grpo", "try", str(path), "--prompts", "2"]) == 1  # exit 1: nothing can teach
    out = capsys.readouterr().out
    assert "0 of 2 prompts can teach (0%)" in out and out.count("no learning signal") == 2


@pytest.mark.integration
def test_a_worker_tries_a_reward_that_varies_and_reports_a_positive_share(store, tiny_model: Path) -> None:
    """The task as the dashboard queues it, carried out by a worker's task service as `tunedeck grpo try --task`."""
    from jobs.worker.loop import Worker
    from jobs.worker.task_service import task_service

    task_id = request_try_rewards(store, _spec(tiny_model, SHORT), 3)
    Worker(store, poll_interval=0.2, sample=False, services=[task_service]).work(burst=True)
    task = store.get_task(task_id)
    assert task.status is TaskStatus.SUCCEEDED, task.error
    result = task.result
    assert result["rewards"] == ["short"] and len(result["groups"]) == 3 and 0 < result["share_teaching"] <= 1
    group = next(g for g in result["groups"] if g["teaches"])
    scores = [c["scores"]["short"] for c in group["completions"]]
    assert len(scores) == 4 and set(scores) == {0.0, 1.0}  # 1 for the short ones, 0 for the others
    assert [c["advantage"] > 0 for c in group["completions"]] == [s == 1.0 for s in scores]
    assert any("prompts can teach" in line for line in task.log)


# ---------------------------------------------------------------------- the API and the form (fast)
def test_the_api_queues_a_trial_refuses_code_and_shows_the_task(data_home, store) -> None:
    from app.api import Endpoints

    api = Endpoints(store)
    out = api.try_rewards(JobSpec.from_dict(grpo(model="tiny-llama")).to_yaml(), 2)
    assert out["problems"] == [] and api.task(out["task_id"])["status"] == "queued"
    assert api.task(out["task_id"])["run_id"] is None and api.task(out["task_id"])["kind"] == "try_rewards"
    code = JobSpec.from_dict(grpo(model="tiny-llama", rewards=None, reward_function="my_rewards:score"))
    refused = api.try_rewards(code.to_yaml(), 2)
    assert refused["task_id"] is None and [p["field"] for p in refused["problems"]] == ["reward_function"]


def test_the_form_s_table_shows_every_score_and_flags_a_flat_group(data_home, store) -> None:
    from app.ui.reward_trial import follow, summary_of, table_of

    result = summarise(["p1", "p2"], ["a", "b", "c", "d"], {"short": [1.0, 0.0, 1.0, 1.0]}, [1.0], 2, "group")
    table = table_of(result)
    assert table["headers"] == ["prompt", "completion", "short", "reward", "advantage", "group"]
    assert table["data"][0][:5] == ["1. p1", "a", "1.000", "1.000", "0.707"] and table["data"][1][0] == ""
    assert table["data"][2][-1] == "mean 1.000, spread 0.000: no learning signal"
    assert summary_of(result).startswith("**1 of 2 prompts can teach (50%)**")
    task_id = store.create_task(None, TaskKind.TRY_REWARDS.value, {"prompts": 2})
    assert follow(store, task_id)[2] is True  # queued: the timer keeps going
    store.claim_task(task_id, "w:1")
    store.finish_task(task_id, TaskStatus.SUCCEEDED, result=result)
    text, update, going = follow(store, task_id)
    assert not going and text == summary_of(result) and update["value"] == table
