"""GRPO rewards declared in the spec (issue 45): each scorer on hand-made completions, the refusals naming
`rewards[i].param`, the column check with the data, the loss variants mapped to GRPOConfig, and one short
GRPO run with a regex and an exact reward through the worker.

The scorers are `jobs.config.rewards`; the declarations `jobs.spec.rewards`; the column check
`jobs.checks.rewards`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from jobs.checks.access import AccessPolicy
from jobs.config.rewards import reward_functions
from jobs.devices.facts import CPU
from jobs.spec.job import JobSpec, SpecError
from jobs.spec.rewards import parse_rewards
from storage.models import RunStatus
from tests.training_helpers import refusal_messages, tiny_spec


def grpo(**changes) -> dict:
    return {"trainer": "grpo", "dataset": "sample:prompt-format", "rewards": "repetition", **changes}


def score(declared: dict | str, completions: list, **columns) -> list:
    """The scores of one declared reward on `completions` (text), with `columns` as the data's columns."""
    found, problems = parse_rewards(json.dumps([declared]))
    assert not problems, problems
    (func,) = reward_functions(found, 16)
    ids = [[1] * len(str(c).split()) for c in completions]
    return func(prompts=["q"] * len(completions), completions=completions, completion_ids=ids, **columns)


# ---------------------------------------------------------------------- each scorer on hand-made completions
SOL = r"\frac{1}{3}"
CASES = [
    ({"kind": "regex", "pattern": "Answer: \\d+"}, ["so Answer: 42", "Answer: x", "answer: 4"], {}, [1.0, 0.0, 0.0]),
    ({"kind": "regex", "pattern": "Answer", "mode": "match"}, ["Answer: 1", "The Answer: 1"], {}, [1.0, 0.0]),
    ({"kind": "regex", "pattern": "answer", "ignore_case": True}, ["ANSWER", "none"], {}, [1.0, 0.0]),
    ({"kind": "exact", "column": "answer"}, [" 42 ", "42.", "Paris"], {"answer": ["42", "42", "paris"]}, [1, 0, 0]),
    ({"kind": "exact", "column": "answer", "ignore_case": True}, ["Paris"], {"answer": ["paris"]}, [1.0]),
    (
        {"kind": "exact", "column": "answer", "extract": "Answer: (\\w+)"},
        ["Answer: 7 no, Answer: 8", "Answer: 7", "8"],
        {"answer": ["8", "8", "8"]},
        [1.0, 0.0, 0.0],  # the last match counts; no match scores 0
    ),
    (
        {"kind": "numeric", "column": "answer", "tolerance": 0.01},
        ["it is 3.14", "about 3.2", "1,234 apples", "no number", "x"],
        {"answer": ["3.141", "3.14", 1234, "12", "n/a"]},
        [1.0, 0.0, 1.0, 0.0, None],  # a reference that is no number: skipped (None), as trl's accuracy
    ),
    (
        {"kind": "numeric", "column": "answer", "extract": "Answer: (\\S+)"},
        ["7 then Answer: 12", "Answer: 7 then 12", "Answer: 7, no: Answer: 12"],
        {"answer": ["12", "12", "12"]},
        [1.0, 0.0, 1.0],  # the last match counts (tests/test_reward_mutations.py)
    ),
    ({"kind": "contains", "column": "city"}, ["It is Paris.", "It is paris."], {"city": ["Paris", "Paris"]}, [1, 0]),
    ({"kind": "json_valid"}, ['{"a": 1}', "```json\n[1, 2]\n```", "{a: 1}", ""], {}, [1.0, 1.0, 0.0, 0.0]),
    (
        {"kind": "json_schema", "schema": {"type": "object", "required": ["answer"]}},
        ['{"answer": 3}', '{"other": 3}', "[1]", "not json"],
        {},
        [1.0, 0.0, 0.0, 0.0],
    ),
    ({"kind": "length", "target": 4}, ["a b c d", "a b", "a b c d e f g h i"], {}, [1.0, 0.5, 0.0]),
    (
        {"kind": "required_words", "words": ["please", "thanks"]},
        ["Please and THANKS", "please", "pleased thanksgiving"],
        {},
        [1.0, 0.5, 0.0],  # whole words, case ignored by default
    ),
    (
        {"kind": "forbidden_words", "words": ["sorry", "cannot"]},
        ["Sorry, I cannot", "fine", "sorry"],
        {},
        [-1, 0, -0.5],
    ),
    (
        {"kind": "accuracy", "column": "gold"},
        [rf"\boxed{{{SOL}}}", r"\boxed{\frac{1}{2}}"],
        {"gold": [SOL, SOL]},
        [1, 0],
    ),
    ({"kind": "accuracy"}, [rf"It is \boxed{{{SOL}}}"], {"solution": [SOL]}, [1.0]),
    (
        {"kind": "reasoning_accuracy", "column": "gold"},
        [rf"<think>hm</think> \boxed{{{SOL}}}", rf"\boxed{{{SOL}}}"],
        {"gold": [SOL, SOL]},
        [1.0, 0.0],  # without </think> the reasoning is incomplete: 0
    ),
]


@pytest.mark.parametrize("declared,completions,columns,expected", CASES, ids=[str(c[0]) for c in CASES])
def test_each_declared_reward_scores_hand_made_completions(declared, completions, columns, expected) -> None:
    assert score(declared, completions, **columns) == expected


def test_chat_completions_are_scored_by_their_text() -> None:
    chats = [[{"role": "assistant", "content": "Answer: 5"}], [{"role": "assistant", "content": "five"}]]
    assert score({"kind": "regex", "pattern": "\\d"}, chats) == [1.0, 0.0]


def test_cosine_length_scales_accuracy_by_length() -> None:
    (func,) = reward_functions(parse_rewards("[{kind: cosine_length, column: gold}]")[0], 100)
    done = func(completions=[rf"\boxed{{{SOL}}}", r"\boxed{2}"], completion_ids=[[1] * 50] * 2, gold=[SOL, SOL])
    assert done == pytest.approx([0.75, -0.75])  # trl's own example: half of max_len


def test_a_catastrophic_pattern_is_cut_off_not_left_to_stall_the_worker(caplog: pytest.LogCaptureFixture) -> None:
    """`(a+)+$` backtracks exponentially on a run of a's that ends otherwise; the regex package's timeout ends
    it and the completion scores 0 (without the timeout this call would not return for hours)."""
    with caplog.at_level("WARNING", logger="jobs.config.rewards"):
        assert score({"kind": "regex", "pattern": "(a+)+$"}, ["a" * 5000 + "!", "aaa"]) == [0.0, 1.0]
    assert "ran out of time" in caplog.text  # the time bound ended it, not the pattern


def test_each_reward_logs_under_its_own_name() -> None:
    found, _ = parse_rewards(
        "[{kind: regex, pattern: a}, {kind: regex, pattern: b}, {kind: exact, column: x, name: final}, think_format]"
    )
    assert [f.__name__ for f in reward_functions(found, 8)] == ["regex", "regex_2", "final", "think_format_reward"]


# ---------------------------------------------------------------------- the spec: parsed once, refusals by field
def test_a_yaml_list_round_trips_through_the_stored_text() -> None:
    text = """
trainer: grpo
dataset: sample:prompt-format
rewards:
  - {kind: regex, pattern: "^<answer>", weight: 0.5}
  - {kind: json_schema, schema: {type: object}}
  - think_format
"""
    spec = JobSpec.from_yaml(text)
    again = JobSpec.from_dict(spec.to_dict())  # the database's JSON and the form hold the text
    assert again == spec and [(r.kind.value, r.weight) for r in again.declared_rewards] == [
        ("regex", 0.5),
        ("json_schema", 1.0),
        ("think_format", 1.0),
    ]
    assert AccessPolicy.dashboard().problems(spec) == []  # no code: the dashboard's policy accepts it


@pytest.mark.parametrize(
    "rewards,message",
    [
        ([{"kind": "regex", "pattern": "(unclosed"}], "rewards[0].pattern: `(unclosed` does not compile"),
        ([{"kind": "regex", "pattern": "a" * 501}], "rewards[0].pattern: is 501 characters long"),
        (["think_format", {"kind": "regex"}], "rewards[1].pattern: regex needs it"),
        ([{"kind": "regex", "pattern": "a", "column": "x"}], "rewards[0].column: is not a parameter of regex"),
        ([{"kind": "regex", "pattern": "a", "mode": "full"}], "rewards[0].mode: `full` is not a mode"),
        ([{"kind": "exact"}], "rewards[0].column: exact needs it"),
        ([{"kind": "exact", "column": "a", "extract": "(a)(b)"}], "rewards[0].extract: `(a)(b)` has 2 groups"),
        ([{"kind": "json_schema", "schema": {"type": "objekt"}}], "rewards[0].schema: is not a valid JSON Schema"),
        ([{"kind": "json_schema", "schema": "{not json"}], "rewards[0].schema: is not JSON"),
        (
            [{"kind": "json_schema", "schema": {"properties": {"a": {"type": "string", "pattern": "(a+)+$"}}}}],
            "rewards[0].schema: uses `pattern`, whose regular expressions jsonschema runs without a time bound",
        ),
        (
            [{"kind": "json_schema", "schema": {"allOf": [{"$ref": "https://example.com/s.json"}]}}],
            "rewards[0].schema: refers to `https://example.com/s.json` outside the schema",
        ),
        ([{"kind": "repetition", "weight": ".nan"}], "rewards[0].weight: `.nan` is not a finite number"),
        ([{"kind": "repetition", "weight": 1e308 * 10}], "rewards[0].weight: `inf` is not a finite number"),
        ([{"kind": "length", "target": 0}], "rewards[0].target: `0` is not a whole number >= 1"),
        ([{"kind": "required_words", "words": []}], "rewards[0].words: is not a list of words"),
        ([{"kind": "numeric", "column": "a", "tolerance": -1}], "rewards[0].tolerance: `-1` is not a number >= 0"),
        ([{"weight": 1}], "rewards[0]: is neither a reward's name nor a mapping with `kind`"),
        ([{"kind": "vibes"}], "rewards[0].kind: `vibes` is not a reward"),
        ("[{kind: regex", "rewards: is not a valid list"),
        ("regex", "rewards[0].pattern: regex needs it"),
    ],
)
def test_declared_rewards_that_cannot_run_are_refused_naming_the_field(rewards, message: str) -> None:
    with pytest.raises(SpecError) as err:
        JobSpec.from_dict(grpo(rewards=rewards))
    assert message in str(err.value), str(err.value)


def test_every_problem_at_once() -> None:
    rewards = [{"kind": "regex", "pattern": "("}, {"kind": "exact", "weight": "x"}]
    with pytest.raises(SpecError) as err:
        JobSpec.from_dict(grpo(rewards=rewards))
    assert {p.field for p in err.value.problems} == {"rewards[0].pattern", "rewards[1].column", "rewards[1].weight"}


def _rows(tmp_path: Path, **extra) -> str:
    path = tmp_path / "sums.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"What is {i} + 1?", **extra}) + "\n" for i in range(6)))
    return str(path)


def test_a_column_the_data_lacks_is_refused_at_submit(tmp_path: Path) -> None:
    from jobs.checks.pipeline import check

    data = _rows(tmp_path, answer="1")
    rewards = [{"kind": "regex", "pattern": "\\d"}, {"kind": "exact", "column": "solution"}, {"kind": "accuracy"}]
    checked = check(grpo(model="tiny-llama", dataset=data, rewards=rewards), policy=AccessPolicy.dashboard())
    by_field = {p.field: p for p in checked.problems}
    assert set(by_field) == {"rewards[1].column", "rewards[2].column"}, checked.problems
    assert "`solution`, which dataset" in by_field["rewards[1].column"].problem
    assert "`answer`" in by_field["rewards[1].column"].problem  # the columns it has are named
    ok = check(grpo(model="tiny-llama", dataset=data, rewards=[{"kind": "exact", "column": "answer"}]))
    assert not [p for p in ok.problems if p.field.startswith("rewards")], ok.problems


# ---------------------------------------------------------------------- the loss variants, mapped to GRPOConfig
@pytest.mark.parametrize(
    "changes,expected",
    [
        (
            {},
            {
                "loss_type": "dapo",
                "importance_sampling_level": "token",
                "scale_rewards": "group",
                "epsilon_high": None,
                "mask_truncated_completions": False,
                "top_entropy_quantile": 1.0,
                "log_completions": True,
            },
        ),
        ({"loss_type": "grpo"}, {"loss_type": "grpo"}),
        ({"loss_type": "dr_grpo", "scale_rewards": "none"}, {"loss_type": "dr_grpo", "scale_rewards": "none"}),
        ({"loss_type": "bnpo", "scale_rewards": "batch"}, {"loss_type": "bnpo", "scale_rewards": "batch"}),
        ({"importance_sampling_level": "sequence"}, {"importance_sampling_level": "sequence"}),
        ({"epsilon_high": 0.28}, {"epsilon_high": 0.28, "epsilon": 0.2}),
        ({"mask_truncated_completions": True}, {"mask_truncated_completions": True}),
        ({"top_entropy_quantile": 0.2}, {"top_entropy_quantile": 0.2}),
    ],
)
def test_loss_variants_map_to_grpo_config(changes: dict, expected: dict, tmp_path: Path) -> None:
    from jobs.config.mapping import training_config

    spec = JobSpec.from_dict(grpo(num_generations=2, per_device_train_batch_size=2, **changes))
    config = training_config(spec, CPU, str(tmp_path))
    assert {k: getattr(config, k) for k in expected} == expected


def test_reward_weights_follow_the_declared_order(tmp_path: Path) -> None:
    from jobs.config.mapping import training_config

    rewards = [
        {"kind": "regex", "pattern": "a", "weight": 0.5},
        "think_format",
        {"kind": "length", "target": 8, "weight": -2},
    ]
    spec = JobSpec.from_dict(grpo(rewards=rewards, reward_model_run=4, reward_model_weight=3))
    assert training_config(spec, CPU, str(tmp_path)).reward_weights == [0.5, 1.0, -2.0, 3.0]


@pytest.mark.parametrize(
    "changes,message",
    [
        (
            {"loss_type": "dapo", "trainer": "dpo", "dataset": "sample:preference-format", "rewards": None},
            "loss_type: dapo is a GRPO loss. Fix: for dpo use auto, hinge, ipo, sigmoid",
        ),
        (
            {"loss_type": "sigmoid"},
            "loss_type: sigmoid is a DPO loss. Fix: for grpo use auto, bnpo, dapo, dr_grpo, grpo",
        ),
        (
            {"trainer": "sft", "dataset": "sample:chat-format", "rewards": None, "scale_rewards": "none"},
            "scale_rewards: is a grpo option; the sft trainer does not read it",
        ),
        (
            {"trainer": "sft", "dataset": "sample:chat-format", "rewards": None, "top_entropy_quantile": 0.2},
            "top_entropy_quantile: is a grpo option",
        ),
        ({"epsilon_high": 0.1}, "epsilon_high: 0.1 is out of range. Fix: use a value >= 0.2 and <= 1"),
        ({"top_entropy_quantile": 1.5}, "top_entropy_quantile: 1.5 is out of range"),
        ({"importance_sampling_level": "group"}, "importance_sampling_level: `group` is not one of the choices"),
        ({"scale_rewards": "std"}, "scale_rewards: `std` is not one of the choices. Fix: use one of: group, batch"),
    ],
)
def test_loss_variants_refused_before_queueing(changes: dict, message: str) -> None:
    messages = refusal_messages(grpo(**changes))
    assert any(message in m for m in messages), messages


# ---------------------------------------------------------------------- one short run through the worker
@pytest.mark.integration
@pytest.mark.slow
def test_grpo_trains_with_a_regex_and_an_exact_reward(store, tiny_model: Path, tmp_path: Path) -> None:
    """2 steps of GRPO scored by a declared regex and an exact match against the data's `answer` column: each
    reward's metric is logged, the total is their weighted sum, and trl's completion log holds both scores."""
    import pandas as pd

    from jobs.worker.loop import Worker

    data = _rows(tmp_path, answer="1")
    rewards = [{"kind": "regex", "pattern": "[a-z]", "weight": 0.5}, {"kind": "exact", "column": "answer"}]
    spec = tiny_spec(
        tiny_model,
        trainer="grpo",
        dataset=data,
        rewards=rewards,
        max_steps=2,
        num_generations=2,
        max_completion_length=8,
        per_device_train_batch_size=4,
        loss_type="dr_grpo",
        scale_rewards="none",
    )
    run_id = store.create_run(spec)
    Worker(store, poll_interval=0.2, sample=False).work(burst=True)
    run = store.get_run(run_id)
    assert run.status is RunStatus.SUCCEEDED, run.error_summary
    assert run.resolved_config["trainer_config"]["reward_weights"] == [0.5, 1.0]
    assert run.resolved_config["trainer_config"]["loss_type"] == "dr_grpo"

    def values(name: str) -> list[float]:
        return [p.value for p in store.metrics(run_id, [name])]

    regex, exact = values("rewards/regex/mean"), values("rewards/exact/mean")
    assert len(regex) == len(exact) == 2 and all(0.0 <= v <= 1.0 for v in regex + exact)
    assert values("reward") == pytest.approx([0.5 * r + e for r, e in zip(regex, exact, strict=True)])
    logged = sorted((store.run_dir(run_id) / "output" / "completions").glob("completions_*.parquet"))
    assert logged, "log_completions wrote no completions table"
    table = pd.read_parquet(logged[-1])
    assert {"prompt", "completion", "regex", "exact", "advantage"} <= set(table.columns)
    assert not any(math.isnan(v) for v in table["regex"])


def test_the_dashboard_and_its_api_queue_declared_rewards(data_home: Path, store) -> None:
    """Declared rewards run no user code: the form and the API queue them under the dashboard's default policy
    (a `reward_function` stays refused there: tests/test_grpo.py)."""
    from app import api
    from app.ui import form as ui_form

    rewards = [
        {"kind": "regex", "pattern": "^<answer>", "weight": 0.5},
        {"kind": "json_schema", "schema": {"type": "object", "properties": {"pattern": {"type": "string"}}}},
        "think_format",
    ]  # a property named `pattern` is no pattern keyword
    spec = JobSpec.from_dict(grpo(model="tiny-llama", rewards=rewards, max_steps=1))
    errors, run_id = ui_form.launch(store, *ui_form.form_values(spec))
    assert run_id is not None, errors
    out = api.submit_yaml(store, spec.to_yaml())
    assert out["run_id"] is not None, out["problems"]
    from jobs.spec.stored import spec_of

    stored = [spec_of(store.get_run(i)) for i in (run_id, out["run_id"])]
    assert all(s.declared_rewards == spec.declared_rewards for s in stored)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize(
    "changes",
    [
        {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon_high": 0.28},
        {"loss_type": "bnpo", "scale_rewards": "batch", "mask_truncated_completions": True},
        {"loss_type": "dr_grpo", "scale_rewards": "none", "top_entropy_quantile": 0.2},
    ],
)
def test_each_loss_variant_trains_a_step(changes: dict, tiny_model: Path, tmp_path: Path) -> None:
    from jobs.train.training import train_spec

    spec = tiny_spec(
        tiny_model,
        trainer="grpo",
        dataset="sample:prompt-format",
        rewards=[{"kind": "length", "target": 4}],
        max_steps=1,
        max_train_samples=4,
        num_generations=2,
        max_completion_length=8,
        **changes,
    )
    result = train_spec(spec, tmp_path / "out", device=CPU)
    assert result.metrics["global_step"] == 1
    args = result.trainer.args
    assert {k: getattr(args, k) for k in changes} == changes
    assert math.isfinite(result.metrics["train_loss"])


def test_a_trl_grpo_config_imports_with_its_rewards_and_loss_knobs() -> None:
    from jobs.spec.imports import ImportConfigError, build_spec, import_config

    imported = import_config(
        {
            "model_name_or_path": "m",
            "dataset_name": "d",
            "reward_funcs": ["think_format_reward", "accuracy_reward"],
            "reward_weights": [0.5, 2.0],
            "num_generations": 4,
            "loss_type": "dr_grpo",
            "scale_rewards": False,
            "epsilon_high": 0.28,
            "importance_sampling_level": "sequence",
            "mask_truncated_completions": True,
            "top_entropy_quantile": 0.2,
        }
    )
    spec = build_spec(imported, {"model": "tiny-llama", "dataset": "sample:prompt-format"})
    assert (spec.trainer.value, spec.loss_type.value, spec.scale_rewards.value, spec.beta) == (
        "grpo",
        "dr_grpo",
        "none",
        0.0,  # GRPOConfig's default, not tunedeck's
    )
    assert (spec.epsilon_high, spec.importance_sampling_level.value, spec.top_entropy_quantile) == (
        0.28,
        "sequence",
        0.2,
    )
    assert spec.mask_truncated_completions and spec.max_completion_length == 256
    assert [(r.kind.value, r.weight) for r in spec.declared_rewards] == [("think_format", 0.5), ("accuracy", 2.0)]
    with pytest.raises(ImportConfigError) as err:
        import_config({"model_name_or_path": "m", "reward_funcs": ["my_pkg.score"], "num_generations": 4})
    assert "reward_funcs: my_pkg.score: code tunedeck does not import" in str(err.value)
    with pytest.raises(ImportConfigError) as err:
        import_config({"model_name_or_path": "m", "num_generations": 4, "loss_type": "cispo"})
    assert "loss_type: `cispo` has no tunedeck equivalent" in str(err.value)
