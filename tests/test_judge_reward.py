"""GRPO's judge reward (issue 45, item 1): a judge model or an OpenAI-compatible endpoint scores each completion
with a rubric, score/scale in [0, 1]; a reply without a score is skipped (None).

The scorer is the real `jobs.config.rewards.Scorer`; where a test stands in for anything it is the judge MODEL's
reply (a plain function prompts -> replies), never our code. The endpoint is a real HTTP server on 127.0.0.1
(tests/test_egress.py's recorder), the local judge the shared tiny model.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from jobs.checks.access import AccessPolicy
from jobs.checks.egress import TRUSTED_ENV
from jobs.config.rewards import reward_functions
from jobs.devices.facts import DeviceFacts
from jobs.spec.job import JobSpec, SpecError
from jobs.spec.rewards import parse_rewards
from jobs.train.judges import reward_judges
from tests.test_egress import KEY, Recorder, attacker, authorizations, key, serving  # noqa: F401 - fixtures

RUBRIC = "Polite and correct"
CPU_FACTS = DeviceFacts(kind="cpu", name="cpu", total_bytes=32 * 1024**3)
BACKENDS = ("sqlite",)


def judge_reward(judge: str = "tiny-llama", **params) -> dict:
    return {"kind": "judge", "judge": judge, "rubric": RUBRIC, **params}


def grpo(**changes) -> dict:
    return {"trainer": "grpo", "dataset": "sample:prompt-format", "model": "tiny-llama", **changes}


def scorer(declared: dict, judge_for):
    found, problems = parse_rewards(json.dumps([declared]))
    assert not problems, problems
    (func,) = reward_functions(found, 16, judge_for)
    return func


# ---------------------------------------------------------------------- the scorer on hand-made replies
def test_the_judge_reply_s_first_number_is_the_score_clamped_and_a_reply_without_one_is_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    replies = {"c1": "8, it is polite", "c2": "Score: 7/10", "c3": "12 out of 10", "c4": "-3", "c5": "I cannot say"}
    asked: list[list[str]] = []
    made: list[str] = []

    def judge_model(prompts: list[str]) -> list[str]:  # the judge model's replies, by the completion it was shown
        asked.append(prompts)
        return [next(r for c, r in replies.items() if f"Answer:\n{c}\n" in p) for p in prompts]

    def judge_for(ref: str):
        made.append(ref)
        return judge_model

    func = scorer(judge_reward(name="polite"), judge_for)
    assert made == []  # nothing is made before the first call
    with caplog.at_level(logging.WARNING, logger="jobs.config.rewards"):
        got = func(prompts=["Say hi"] * 5, completions=list(replies), completion_ids=[[1]] * 5)
    assert got == [0.8, 0.7, 1.0, 0.0, None]
    assert "reward polite: 1 of 5 judge replies gave no score (skipped)" in caplog.text
    prompt = asked[0][0]
    assert RUBRIC in prompt and "Say hi" in prompt and "Answer:\nc1\n" in prompt
    assert "Reply with a score from 0 to 10" in prompt
    chat = [[{"role": "assistant", "content": "c2"}]]
    assert func(prompts=[[{"role": "user", "content": "Hi?"}]], completions=chat) == [0.7]
    assert made == ["tiny-llama"] and func.unparsed == 1  # made once, held; chat turns read by their text


def test_scale_sets_the_range_the_judge_is_asked_for() -> None:
    asked: list[str] = []

    def judge_model(prompts: list[str]) -> list[str]:
        asked.extend(prompts)
        return ["3"] * len(prompts)

    func = scorer(judge_reward(scale=4), lambda ref: judge_model)
    assert func(prompts=["q"], completions=["a"]) == [0.75]
    assert "Reply with a score from 0 to 4" in asked[0]


# ---------------------------------------------------------------------- a real endpoint: the key only if trusted
@pytest.fixture
def judge_endpoint():
    """A real endpoint that replies as a judge would: a score first."""
    with serving(Recorder(content="9 - courteous")) as server:
        yield server
        server.shutdown()


def test_an_endpoint_judge_the_operator_does_not_trust_gets_no_key(
    judge_endpoint: Recorder,
    key: str,  # noqa: F811 - the fixture
) -> None:
    func = scorer(judge_reward(f"{judge_endpoint.url}/v1#gpt-judge"), reward_judges(None))
    assert func(prompts=["q", "q"], completions=["a", "b"]) == [0.9, 0.9]
    assert [(m, p) for m, p, _ in judge_endpoint.seen] == [("POST", "/v1/chat/completions")] * 2
    assert authorizations(judge_endpoint) == [None, None]


def test_a_trusted_endpoint_judge_gets_the_key(
    judge_endpoint: Recorder,
    key: str,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(TRUSTED_ENV, f"{judge_endpoint.url}/v1")
    func = scorer(judge_reward(f"{judge_endpoint.url}/v1#gpt-judge"), reward_judges(None))
    assert func(prompts=["q"], completions=["a"]) == [0.9]
    assert authorizations(judge_endpoint) == [f"Bearer {KEY}"]


def test_a_trusted_endpoint_judge_that_redirects_does_not_pass_the_key_on(
    attacker: Recorder,  # noqa: F811 - the fixture
    key: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with serving(Recorder(redirect_to=f"{attacker.url}/stolen")) as trusted:
        monkeypatch.setenv(TRUSTED_ENV, f"{trusted.url}/v1")
        func = scorer(judge_reward(f"{trusted.url}/v1#gpt-judge"), reward_judges(None))
        assert func(prompts=["q"], completions=["a"]) == [None]  # the attacker's reply: "A, ..." has no score
        trusted.shutdown()
    assert authorizations(trusted) == [f"Bearer {KEY}"] and authorizations(attacker) == [None]


# ---------------------------------------------------------------------- a local judge: the tiny model
def test_a_local_judge_model_scores_completions_in_one_batch_loaded_once(tiny_model: Path) -> None:
    judges = reward_judges(None)
    func = scorer(judge_reward(str(tiny_model)), judges)
    first = func(prompts=["Say hi", "Say hi"], completions=["Hello!", "Go away."])
    second = func(prompts=["Say hi"], completions=["Hi"])
    assert len(first) == 2 and len(second) == 1
    assert all(s is None or 0.0 <= s <= 1.0 for s in first + second)  # a random tiny model: a number or none
    assert func.ask_all is judges(str(tiny_model))  # loaded on the first call, held after it


# ---------------------------------------------------------------------- refused before queueing
def test_a_judge_reward_round_trips_through_the_stored_text() -> None:
    text = f"""
trainer: grpo
dataset: sample:prompt-format
rewards:
  - {{kind: judge, judge: run:7, rubric: "{RUBRIC}", scale: 5, weight: 0.5}}
  - think_format
"""
    spec = JobSpec.from_yaml(text)
    again = JobSpec.from_dict(spec.to_dict())
    (judged, _) = again.declared_rewards
    assert again == spec and (judged.judge, judged.rubric, judged.scale, judged.weight) == ("run:7", RUBRIC, 5, 0.5)
    assert judged.name == "judge" and judged.local_judge == "run:7"


@pytest.mark.parametrize(
    "rewards,message",
    [
        ([{"kind": "judge", "judge": "tiny-llama"}], "rewards[0].rubric: judge needs it"),
        ([judge_reward(rubric="  ")], "rewards[0].rubric: is empty"),
        ([judge_reward("https://judge.example/v1")], "rewards[0].judge: `https://judge.example/v1` names no model"),
        ([judge_reward("run:seven")], "rewards[0].judge: `run:seven` names no run"),
        ([judge_reward(scale=0)], "rewards[0].scale: `0` is not a whole number from 1 to 1000"),
        ([{"kind": "judge", "rubric": RUBRIC}], "rewards[0].judge: judge needs it"),
    ],
)
def test_a_judge_reward_that_cannot_run_is_refused_naming_the_field(rewards, message: str) -> None:
    with pytest.raises(SpecError) as err:
        JobSpec.from_dict(grpo(rewards=rewards))
    assert message in str(err.value), str(err.value)


def test_a_judge_that_does_not_resolve_is_refused_at_submit_with_nothing_queued(
    store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs.queue.submit import submit

    monkeypatch.delenv(TRUSTED_ENV, raising=False)
    empty = tmp_path / "no-model"
    empty.mkdir()
    rewards = [
        judge_reward("no-such-model"),
        judge_reward(str(empty)),
        judge_reward("run:99"),
        judge_reward("https://judge.evil.example/v1#gpt-judge"),
    ]
    spec = JobSpec.from_dict(grpo(rewards=rewards, max_steps=1))
    with pytest.raises(SpecError) as refused:
        submit(store, spec, AccessPolicy.for_server(login=True))
    by_field = {p.field: p for p in refused.value.problems}
    assert {f"rewards[{i}].judge" for i in range(4)} <= set(by_field), refused.value.problems
    assert "run 99 does not exist" in by_field["rewards[2].judge"].problem
    assert "is not an endpoint this server trusts" in by_field["rewards[3].judge"].problem
    assert TRUSTED_ENV in by_field["rewards[3].judge"].fix
    assert store.count_runs() == 0
    # a local dashboard queues an untrusted endpoint judge, saying it is called without the workers' keys
    from jobs.checks.pipeline import check

    local = check(JobSpec.from_dict(grpo(rewards=rewards[3:], max_steps=1)), policy=AccessPolicy.dashboard())
    assert not [p for p in local.problems if p.field.startswith("rewards")], local.problems
    assert [w for w in local.warnings if w.startswith("rewards[0].judge:")] == [
        f"rewards[0].judge: `https://judge.evil.example/v1` is not in {TRUSTED_ENV}, so the workers call it without "
        "their keys (fine for an endpoint that needs none; else ask the operator to add it)"
    ]


def test_a_shared_dashboard_reads_no_judge_folder_outside_its_data_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNEDECK_DATA_DIRS", str(tmp_path / "data"))
    spec = JobSpec.from_dict(grpo(rewards=[judge_reward("/etc/models/judge")]))
    (problem,) = AccessPolicy.for_server(login=True).problems(spec)
    assert problem.field == "rewards[0].judge" and "outside this shared server's data folders" in problem.problem


def test_the_dashboard_queues_a_judge_reward_on_a_built_in_or_trusted_judge_and_refuses_code(
    store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app import api
    from app.ui import form as ui_form

    monkeypatch.setenv(TRUSTED_ENV, "https://judge.example/v1")
    rewards = [judge_reward("tiny-llama"), judge_reward("https://judge.example/v1#gpt-judge", name="remote")]
    spec = JobSpec.from_dict(grpo(rewards=rewards, max_steps=1))
    errors, run_id = ui_form.launch(store, *ui_form.form_values(spec))
    assert run_id is not None, errors
    out = api.submit_yaml(store, spec.to_yaml())
    assert out["run_id"] is not None, out["problems"]
    coded = JobSpec.from_dict(grpo(rewards=rewards, reward_function="r.py:score", max_steps=1))
    assert [p.field for p in AccessPolicy.dashboard().problems(coded)] == ["reward_function"]


# ---------------------------------------------------------------------- memory: a local judge's weights are held
def test_a_local_judge_s_weights_count_in_the_reward_model_part_and_an_endpoint_s_do_not(tiny_model: Path) -> None:
    from jobs.checks.memory import judge_reward_archs, model_arch
    from jobs.memory.predict import predict

    arch, _ = model_arch(str(tiny_model))
    assert arch is not None

    def part(rewards: list) -> tuple[int, str, int]:
        spec = JobSpec.from_dict(grpo(model=str(tiny_model), rewards=rewards))
        found = predict(spec, arch, CPU_FACTS, judge_archs=judge_reward_archs(None, spec))
        reward = next(p for p in found.parts if p.name == "reward_model")
        return reward.bytes, reward.formula, found.phases["scoring"]

    plain = part(["think_format"])
    local = part(["think_format", judge_reward(str(tiny_model))])
    endpoint = part(["think_format", judge_reward("https://judge.example/v1#gpt-judge")])
    assert plain[0] == 0 and endpoint[:2] == plain[:2] and endpoint[2] == plain[2]
    assert local[0] == arch.total_params * 4  # fp32 on the CPU
    assert f"reward judge {tiny_model}'s model: {arch.total_params:,} params" in local[1]
    assert local[2] > plain[2]  # its weights and its generation while scoring


# ---------------------------------------------------------------------- "try rewards" asks the judge too
def test_try_rewards_scores_with_a_local_judge(tiny_model: Path) -> None:
    from jobs.train.reward_trial import try_rewards

    rewards = [judge_reward(str(tiny_model), name="polite"), {"kind": "length", "target": 4}]
    spec = JobSpec.from_dict(
        grpo(model=str(tiny_model), rewards=rewards, num_generations=2, max_completion_length=6, max_steps=1)
    )
    result = try_rewards(spec, prompts=1)
    assert result["rewards"] == ["polite", "length"]
    (group,) = result["groups"]
    judged = [c["scores"]["polite"] for c in group["completions"]]
    assert len(judged) == 2 and all(s is None or 0.0 <= s <= 1.0 for s in judged)
