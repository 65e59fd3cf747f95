"""The shipped examples/*.yaml are valid job specs that survive a YAML round trip.

.venv/bin/python -m pytest tests/test_examples.py -q
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from jobs.spec.enums import Method, Precision, Scheduler, Trainer
from jobs.spec.job import JobSpec

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
FILES = sorted(EXAMPLES.glob("*.yaml"))


def _load(name: str) -> JobSpec:
    return JobSpec.from_yaml((EXAMPLES / name).read_text())


def test_examples_exist():
    names = {p.name for p in FILES}
    assert {"smollm2-tag-format.yaml", "smollm2-dpo.yaml", "tiny-llama-quick.yaml"} <= names


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_example_parses_and_round_trips(path: Path):
    spec = JobSpec.from_yaml(path.read_text())
    assert spec.problems() == []
    assert JobSpec.from_yaml(spec.to_yaml()) == spec
    assert JobSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_example_sets_only_real_fields(path: Path):
    # from_yaml already rejects unknown keys; this names the file when someone renames a field.
    known = set(JobSpec.__dataclass_fields__)
    keys = set(yaml.safe_load(path.read_text()))
    assert keys <= known, f"{path.name}: unknown fields {sorted(keys - known)}"


def test_default_example_is_the_measured_recipe():
    # ENVIRONMENT.md: this exact recipe took ~101 s on CPU and visibly taught the format.
    spec = _load("smollm2-tag-format.yaml")
    assert spec.model == "smollm2-135m-instruct"
    assert spec.dataset == "sample:chat-format"
    assert spec.trainer is Trainer.SFT and spec.method is Method.LORA
    assert (spec.lora_r, spec.lora_alpha, spec.lora_target_modules) == (16, 32, "all-linear")
    assert spec.learning_rate == pytest.approx(1e-3)
    assert spec.lr_scheduler_type is Scheduler.CONSTANT
    assert spec.per_device_train_batch_size == 8 and spec.effective_batch_size == 8
    assert spec.max_length == 96
    assert spec.gradient_checkpointing is False
    assert spec.precision is Precision.AUTO
    assert (spec.max_steps, spec.logging_steps) == (30, 1)


def test_dpo_example_uses_preference_data():
    spec = _load("smollm2-dpo.yaml")
    assert spec.trainer is Trainer.DPO
    assert spec.dataset == "sample:preference-format"
    assert spec.method is Method.LORA
    assert 0 < spec.max_steps <= 20


def test_quick_example_is_tiny():
    spec = _load("tiny-llama-quick.yaml")
    assert spec.model == "tiny-llama"
    assert spec.max_steps == 20


def test_default_example_ends_scored_against_its_base(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Issue 35: the default example queues its local questions and a judge, in one evaluate task (models loaded once)."""
    from app.cli.usage import load_spec
    from jobs.data.bench_tasks import task_problems
    from jobs.spec.evaluation import evaluation_tasks

    monkeypatch.chdir(tmp_path)  # not the repository's folder: the questions are found beside the spec file
    spec = load_spec(str(EXAMPLES / "smollm2-tag-format.yaml"))
    questions = str(EXAMPLES / "tag-format-questions.jsonl")
    assert spec.eval_tasks == questions and spec.sample_count > 0
    assert evaluation_tasks(spec) == [("evaluate", {"tasks": questions, "judge": "smollm2-135m-instruct"})]
    assert task_problems(spec.eval_tasks) == []


def test_arithmetic_questions_are_what_make_arithmetic_writes() -> None:
    """examples/arithmetic-questions.jsonl is bench/make_arithmetic.py's deterministic output, with its answers."""
    import json
    import runpy

    text = runpy.run_path(str(EXAMPLES.parent / "bench" / "make_arithmetic.py"))["text"]()
    assert (EXAMPLES / "arithmetic-questions.jsonl").read_text() == text, "stale: rerun bench/make_arithmetic.py"
    for row in map(json.loads, text.splitlines()):
        question = row["prompt"][0]["content"]
        a, op, b = question.removeprefix("What is ").split("?")[0].split()
        assert int(row["answer"]) == (int(a) + int(b) if op == "+" else int(a) - int(b)), question


def test_grpo_arithmetic_example_passes_the_data_and_reward_checks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The GRPO example's file is found beside it; its rows are grpo prompts whose `answer` column the numeric
    reward reads (the check run before queueing)."""
    from app.cli.usage import load_spec
    from jobs.checks.datasets import dataset_problems
    from jobs.checks.rewards import reward_column_problems

    monkeypatch.chdir(tmp_path)
    spec = load_spec(str(EXAMPLES / "smollm2-grpo-arithmetic.yaml"))
    assert spec.trainer is Trainer.GRPO and spec.method is Method.LORA
    assert spec.dataset == str(EXAMPLES / "arithmetic-questions.jsonl")
    problems, infos = dataset_problems(spec, lambda: None)
    assert problems == []
    assert "answer" in infos["dataset"].reward_columns
    assert reward_column_problems(spec, infos) == []


def test_grpo_arithmetic_rewards_score_hand_written_answers() -> None:
    """The example's two declared rewards: `format` (ends with `Answer: <number>`) and `correct` (that number is
    the row's answer)."""
    from jobs.config.rewards import reward_functions

    spec = _load("smollm2-grpo-arithmetic.yaml")
    assert [r.name for r in spec.declared_rewards] == ["format", "correct"]
    fmt, correct = reward_functions(spec.declared_rewards, spec.max_completion_length)
    answers = [
        "9 + 3 = 12. Answer: 12",  # the habit, right
        "Answer: 12.",  # a trailing full stop still ends it
        "Answer: 13",  # the habit, wrong number
        "9 + 3 = 12",  # right, without the habit
        "Answer: 12, I think.",  # the number is read, but the reply does not end with it
        "The answer is 12.",
    ]
    completions = [[{"role": "assistant", "content": a}] for a in answers]
    refs = ["12"] * len(answers)
    assert fmt(completions, answer=refs) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert correct(completions, answer=refs) == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
