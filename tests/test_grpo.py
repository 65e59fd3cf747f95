"""GRPO: built-in rewards, a finished reward run's model, and a custom reward function (CLI only).

The bundled `sample:prompt-format` (chat prompts, the questions of the other samples) is its
sample. Refusals are grounded in what the libraries do with the check off (tiny Llama, 2 steps,
num_generations 2): GRPOConfig raises for auto_find_batch_size ("auto_find_batch_size is not
supported by GRPO"), for an effective batch that num_generations does not divide
("generation_batch_size (3) must be divisible by num_generations (2)") and for padding_free
(TypeError: unexpected keyword), and peft's EVA initialisation fails on GRPO's raw-prompt batches
("inputs must be a dictionary"). Tried and training (2 steps each): full, full with beta > 0 (trl
loads a second copy as the reference), lora, dora, qlora, lora_8bit, ia3, prompt_tuning,
prefix_tuning, p_tuning (also with beta > 0), mora, adaption_prompt, lokr, loha, oft, vera, miss, hira,
gradient checkpointing (lora and full), pissa, bf16 (use_cpu), and a micro-batch of 1 with
accumulation 2 and eval_steps (the eval batch is rounded up to whole groups by jobs.config.trainers).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from jobs.checks.access import AccessPolicy
from jobs.config.mapping import resolved_config, training_kwargs
from jobs.config.rewards import reward_functions
from jobs.config.trainers import reward_weights
from jobs.data.inspection import check_dataset
from jobs.data.loading import load_datasets
from jobs.data.sources import DataError
from jobs.data.tokens.measurement import length_warnings
from jobs.devices.facts import CPU
from jobs.spec.custom_reward import function_ref_problem
from jobs.spec.enums import Trainer
from jobs.spec.job import JobSpec, SpecError
from jobs.spec.rewards import RewardKind, parse_rewards
from storage.models import RunStatus
from tests.training_helpers import refusal_messages, tiny_spec

GRPO = Trainer.GRPO
SCORE_FILE = '''
def shortness(completions, **kwargs):
    """Fewer characters score higher."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [-len(t) / 10.0 for t in texts]
'''


def grpo(**changes) -> dict:
    return {"trainer": "grpo", "dataset": "sample:prompt-format", "rewards": "repetition", **changes}


# ---------------------------------------------------------------------- data
def test_grpo_reads_prompt_only_rows(tmp_path: Path) -> None:
    assert check_dataset("sample:prompt-format", GRPO).n_rows == 120
    train, evaluation = load_datasets(JobSpec.from_dict(grpo()))
    assert train.column_names == ["prompt"] and train[0]["prompt"][0]["role"] == "user" and len(evaluation) == 20
    assert length_warnings(train, None, 8, trainer=GRPO) == []  # grpo never truncates prompts: nothing to warn
    with pytest.raises(DataError) as err:
        check_dataset("sample:chat-format", GRPO)
    assert "grpo trainer needs prompt rows" in str(err.value) and "sample:prompt-format" in str(err.value)
    # the preference rows' prompts serve too; the answers are dropped (grpo generates its own)
    info = check_dataset("sample:preference-format", GRPO)
    assert info.format.value == "prompt_only" and "`chosen`, `rejected` are not used by grpo" in info.warnings[0]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        "\n".join(
            json.dumps(r)
            for r in (
                {"prompt": "fine"},
                {"prompt": ""},
                {"prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
            )
        )
        + "\n"
    )
    with pytest.raises(DataError) as err:
        check_dataset(str(bad), GRPO)
    text = str(err.value)
    assert "row 2: `prompt` is empty" in text and "row 3: `prompt` ends with an assistant turn" in text


def test_other_columns_reach_the_reward_functions(tmp_path: Path) -> None:
    """trl passes every column but the prompt to reward functions: a `solution` column survives loading."""
    rows = [{"prompt": f"What is {i} + 1?", "solution": str(i + 1), "completion": "unused"} for i in range(4)]
    path = tmp_path / "sums.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    info = check_dataset(str(path), GRPO)
    assert info.reward_columns == ["solution"] and any("`completion` are not used" in w for w in info.warnings)
    train, _ = load_datasets(JobSpec.from_dict(grpo(dataset=str(path))))
    assert train.column_names == ["prompt", "solution"] and train[2] == {"prompt": "What is 2 + 1?", "solution": "3"}


# ---------------------------------------------------------------------- rewards and mapping
@pytest.mark.parametrize(
    "text,weights,problem",
    [
        ("think_format", {"think_format_reward": 1.0}, None),
        (
            "think_format, repetition=0.5, overlong=-2",
            {"think_format_reward": 1.0, "repetition_penalty_reward": 0.5, "soft_overlong_punishment_reward": -2.0},
            None,
        ),
        ("accuracy", {"accuracy_reward": 1.0}, None),
        ("regex", {}, "rewards[0].pattern: regex needs it"),
        ("best", {}, "rewards[0].kind: `best` is not a reward"),
        ("repetition=lots", {}, "rewards[0].weight: `lots` is not a finite number"),
        ("repetition, repetition", {"repetition_penalty_reward": 1.0, "repetition_penalty_reward_2": 1.0}, None),
        ("[{kind: overlong, name: a}, {kind: repetition, name: a}]", {}, "rewards[1].name: `a` is used twice"),
        (" , ", {}, "rewards: lists no reward"),
    ],
)
def test_parse_rewards(text: str, weights: dict, problem: str | None) -> None:
    found, problems = parse_rewards(text)
    assert {r.name: r.weight for r in found} == weights
    assert (problem is None and not problems) or (problem and problem in str(problems[0])), problems


def test_builtin_rewards_score_as_trl_does() -> None:
    think, repetition, overlong = reward_functions(parse_rewards("think_format, repetition, overlong")[0], 16)
    plain = ["<think>\nhm\n</think>\nyes", "no tags"]
    assert think(plain) == [1.0, 0.0]  # plain-text completions are wrapped for trl's chat-only function
    assert think([[{"role": "assistant", "content": c}] for c in plain]) == [1.0, 0.0]
    # 3-grams of five equal tokens: three, one of them unique -> -(1 - 1/3)
    assert repetition(completion_ids=[[1, 2, 3, 4], [5] * 5]) == pytest.approx([0.0, -2 / 3])
    assert overlong(completion_ids=[[1] * 8, [1] * 14, [1] * 17]) == [0.0, -0.5, -1.0]
    assert [f.__name__ for f in (think, repetition, overlong)] == [
        "think_format_reward",
        "repetition_penalty_reward",
        "soft_overlong_punishment_reward",
    ]
    assert parse_rewards("think_format")[0][0].kind is RewardKind.THINK_FORMAT


@pytest.mark.parametrize(
    "ref,ok",
    [
        ("my_rewards:score", True),
        ("pkg.mod:score", True),
        ("/x/r.py:score", True),
        ("score", False),
        ("my rewards:score", False),
        ("r.py:", False),
    ],
)
def test_function_ref_form(ref: str, ok: bool) -> None:
    assert (function_ref_problem(ref) is None) == ok


def test_grpo_mapping(tmp_path: Path) -> None:
    from trl import GRPOConfig

    from jobs.config.mapping import training_config

    spec = JobSpec.from_dict(
        grpo(
            rewards="think_format=2, repetition",
            reward_model_run=3,
            reward_model_weight=0.5,
            reward_function="r.py:score",
            num_generations=2,
            max_completion_length=32,
            beta=0.0,
            temperature=0.7,
            per_device_train_batch_size=3,
            gradient_accumulation_steps=2,
        )
    )
    assert reward_weights(spec) == [2.0, 1.0, 0.5, 1.0]
    resolved = resolved_config(spec, CPU, str(tmp_path))
    kw = resolved["trainer_config"]
    assert resolved["trainer_config_class"] == "GRPOConfig"
    assert {k: kw[k] for k in ("num_generations", "max_completion_length", "beta", "temperature")} == {
        "num_generations": 2,
        "max_completion_length": 32,
        "beta": 0.0,
        "temperature": 0.7,
    }
    assert kw["per_device_eval_batch_size"] == 4  # the micro-batch rounded up to whole groups for evaluation
    assert not {"max_length", "padding_free", "packing"} & set(kw)
    assert kw["loss_type"] == "dapo" and kw["log_completions"] is True  # trl's default loss; completions logged
    config = training_config(spec, CPU, str(tmp_path))
    assert isinstance(config, GRPOConfig) and config.generation_batch_size == 6


# ---------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    "changes,message",
    [
        ({"rewards": None}, "rewards: grpo needs at least one reward to score the completions"),
        ({"per_device_train_batch_size": 3}, "num_generations: 4 does not divide the effective batch (3 x 1 = 3)"),
        ({"auto_find_batch_size": True}, "auto_find_batch_size: is not supported by grpo"),
        ({"padding_free": True}, "padding_free: is not supported by the GRPO trainer"),
        ({"packing": True}, "packing: is only supported by the SFT trainer"),
        (
            {"loss_type": "sigmoid"},
            "loss_type: sigmoid is a DPO loss. Fix: for grpo use auto, bnpo, dapo, dr_grpo, grpo",
        ),
        ({"lora_target_modules": "q_proj,lm_head"}, "lora_target_modules: an adapter on lm_head"),
        ({"rewards": "best"}, "rewards[0].kind: `best` is not a reward"),
        ({"reward_function": "score"}, "reward_function: `score` is not module:function"),
        ({"num_generations": 1}, "num_generations: 1 is out of range"),
        ({"lora_init": "eva"}, "lora_init: eva fails with grpo"),
        ({"trainer": "dpo", "dataset": "sample:preference-format"}, "rewards: is a grpo option"),
        (
            {"trainer": "dpo", "dataset": "sample:preference-format", "rewards": None, "beta": 0},
            "beta: 0 leaves dpo without its preference term",
        ),
    ],
)
def test_refused_before_queueing(changes: dict, message: str) -> None:
    messages = refusal_messages(grpo(**changes))
    assert any(message in m for m in messages), messages


@pytest.mark.parametrize(
    "changes,error",
    [
        ({"auto_find_batch_size": True}, "auto_find_batch_size is not supported by GRPO"),
        ({"per_device_train_batch_size": 3, "num_generations": 2}, "must be divisible by num_generations (2)"),
        ({"padding_free": True}, "padding_free"),
    ],
)
def test_the_library_really_rejects_them(changes: dict, error: str, tmp_path: Path) -> None:
    """With our checks bypassed, GRPOConfig itself fails on each refused combination."""
    import re

    from trl import GRPOConfig

    spec = dataclasses.replace(JobSpec.from_dict(grpo(num_generations=2, per_device_train_batch_size=2)), **changes)
    kw = training_kwargs(spec, CPU, str(tmp_path))
    if spec.padding_free:
        kw["padding_free"] = True  # the mapping drops it for grpo: put it back to see trl's answer
    with pytest.raises((ValueError, TypeError), match=re.escape(error)):
        GRPOConfig(**kw)


def test_custom_reward_function_is_refused_by_the_dashboard_and_its_api(data_home: Path, store) -> None:
    from app import api
    from app.ui import form as ui_form

    spec = JobSpec.from_dict(grpo(model="tiny-llama", reward_function="my_rewards:score", max_steps=1))
    assert AccessPolicy.open().problems(spec) == []  # the command line
    for policy in (AccessPolicy.dashboard(), AccessPolicy.for_server(login=False), AccessPolicy.for_server(login=True)):
        (problem,) = policy.problems(spec)
        assert problem.field == "reward_function" and "tunedeck submit SPEC.yaml" in problem.fix
    errors, run_id = ui_form.launch(store, *ui_form.form_values(spec))
    assert run_id is None and "reward_function" in errors and "tunedeck submit" in errors
    out = api.submit_yaml(store, spec.to_yaml())
    assert out["run_id"] is None and [p["field"] for p in out["problems"]] == ["reward_function"]
    assert store.count_runs() == 0


def test_reward_model_run_must_be_a_finished_reward_run(data_home: Path, store) -> None:
    from jobs.models.reward_model import reward_run_problems

    def problem(run_id: int) -> str:
        found = reward_run_problems(store, JobSpec.from_dict(grpo(rewards=None, reward_model_run=run_id)))
        return found[0].problem if found else ""

    sft = store.create_run(JobSpec(model="tiny-llama"))
    reward = store.create_run(
        JobSpec.from_dict({"model": "tiny-llama", "trainer": "reward", "dataset": "sample:preference-format"})
    )
    assert problem(999) == "run 999 does not exist"
    assert problem(sft) == f"run {sft} trained with trainer: sft, not a reward model"
    assert problem(reward) == f"reward run {reward} is queued, not succeeded"


# ---------------------------------------------------------------------- training through the worker
def _train(store, spec: JobSpec) -> int:
    from jobs.worker.loop import Worker

    run_id = store.create_run(spec)
    Worker(store, poll_interval=0.2, sample=False).work(burst=True)
    run = store.get_run(run_id)
    assert run.status is RunStatus.SUCCEEDED, run.error_summary
    return run_id


def _grpo_spec(tiny_model: Path, **changes) -> JobSpec:
    fields = dict(
        trainer="grpo",
        dataset="sample:prompt-format",
        max_steps=3,
        max_train_samples=8,
        num_generations=2,
        max_completion_length=12,
        per_device_train_batch_size=4,
        beta=0.1,
        eval_split=2,
    )
    return tiny_spec(tiny_model, **{**fields, **changes})


@pytest.mark.integration
@pytest.mark.slow
def test_grpo_trains_with_a_builtin_reward_through_the_worker(store, tiny_model: Path) -> None:
    """Reward, its spread, completion length and KL are logged and graphed; the total is the weighted sum.

    The tiny random model never stops early and rarely repeats itself, so every completion runs to
    max_completion_length: overlong gives each -1 and repetition 0 (no spread, nothing learnt; the
    reward-model test below checks learning)."""
    from app.ui.run import RunPageData
    from jobs.train.completions import completion_steps, read_step

    run_id = _train(store, _grpo_spec(tiny_model, rewards="repetition=0.5, overlong=2", completions_every=2))
    run = store.get_run(run_id)
    assert completion_steps(store.run_path(run_id)) == [2, 3]  # every 2nd logged step, and the last
    kept = read_step(store.run_path(run_id), 2)
    assert (
        kept["rewards"] == ["repetition_penalty_reward", "soft_overlong_punishment_reward"] and len(kept["rows"]) == 4
    )
    assert {r["scores"]["soft_overlong_punishment_reward"] for r in kept["rows"]} == {-1.0}
    assert run.resolved_config["trainer_config_class"] == "GRPOConfig"
    assert run.resolved_config["trainer_config"]["reward_weights"] == [0.5, 2.0]
    names = set(store.metric_names(run_id))
    assert {
        "reward",
        "reward_std",
        "completions/mean_length",
        "kl",
        "rewards/repetition_penalty_reward/mean",
        "rewards/soft_overlong_punishment_reward/mean",
        "eval_reward",
        "grpo_step_time",
    } <= names
    assert len(store.metrics(run_id, ["step_time"])) == 3  # trl's own step_time is kept apart
    assert set(RunPageData(store).frames(run_id, "grpo")[4]["series"]) == {
        "reward",
        "reward std",
        "completion length",
        "KL",
        "zero-spread groups",
        "truncated",
        "clip ratio",
        "entropy",
    }

    def values(name: str) -> list[float]:
        return [p.value for p in store.metrics(run_id, [name])]

    assert (
        values("completions/mean_length") == [12.0] * 3
        and values("rewards/soft_overlong_punishment_reward/mean") == [-1.0] * 3
    )
    expected = [
        0.5 * r + 2 * o
        for r, o in zip(
            values("rewards/repetition_penalty_reward/mean"), values("rewards/soft_overlong_punishment_reward/mean")
        )
    ]
    assert values("reward") == pytest.approx(expected)


@pytest.mark.integration
@pytest.mark.slow
def test_grpo_scores_with_a_finished_reward_run(store, tiny_model: Path) -> None:
    """A tiny reward run, then GRPO whose only reward is that run's model (LoRA adapter + score head)."""
    from safetensors.torch import load_file

    from jobs.queue.submit import submit

    reward_run = _train(
        store,
        tiny_spec(
            tiny_model,
            trainer="reward",
            dataset="sample:preference-format",
            max_steps=2,
            max_train_samples=8,
            max_length=128,
        ),
    )
    spec = _grpo_spec(tiny_model, reward_model_run=reward_run, reward_model_weight=2.0, eval_split=None)
    run_id = submit(store, spec)
    from jobs.worker.loop import Worker

    Worker(store, poll_interval=0.2, sample=False).work(burst=True)
    run = store.get_run(run_id)
    assert run.status is RunStatus.SUCCEEDED, run.error_summary
    assert run.resolved_config["trainer_config"]["reward_weights"] == [2.0]
    per_model = [n for n in store.metric_names(run_id) if n.startswith("rewards/") and n.endswith("/mean")]
    assert per_model == [f"rewards/{Path(tiny_model).name}/mean"]  # trl names a reward model after its base
    scores = [p.value for p in store.metrics(run_id, per_model)]
    assert len(scores) == 3 and all(s == s for s in scores) and len(set(scores)) > 1  # real, varying scores
    assert max(p.value for p in store.metrics(run_id, ["reward_std"])) > 0  # the groups had something to compare
    bundle = Path(next(a.path for a in store.artifacts(run_id) if a.kind == "adapter"))
    lora_b = [t for k, t in load_file(bundle / "adapter_model.safetensors").items() if "lora_B" in k]
    assert any(t.abs().max() > 0 for t in lora_b)  # B starts at zero: the policy moved
    with pytest.raises(SpecError, match="reward_model_run: run .* trained with trainer: grpo"):
        submit(store, spec.replace(reward_model_run=run_id))


@pytest.mark.integration
@pytest.mark.slow
def test_custom_reward_function_from_a_spec_file_on_the_command_line(store, tiny_model: Path, tmp_path: Path) -> None:
    from app.cli.main import main
    from jobs.worker.loop import Worker

    (tmp_path / "my_scores.py").write_text(SCORE_FILE)
    spec = _grpo_spec(
        tiny_model, rewards=None, reward_function=f"{tmp_path / 'my_scores.py'}:shortness", max_steps=2, eval_split=None
    )
    path = tmp_path / "grpo.yaml"
    path.write_text(spec.to_yaml())
    assert main(["submit", str(path)]) == 0
    (run,) = store.list_runs()
    Worker(store, poll_interval=0.2, sample=False).work(burst=True)
    run = store.get_run(run.id)
    assert run.status is RunStatus.SUCCEEDED, run.error_summary
    scores = [p.value for p in store.metrics(run.id, ["rewards/shortness/mean"])]
    assert len(scores) == 2 and all(s < 0 for s in scores)  # the function's own numbers: minus a tenth of the length


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize(
    "changes,error",
    [
        ({"lora_init": "eva"}, "inputs must be a dictionary"),
    ],
)
def test_the_libraries_really_fail_on_what_is_refused(
    changes: dict, error: str, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the capability check off, training fails with the library's own error."""
    import re

    import jobs.train.training
    from jobs.spec.enums import LoraInit

    monkeypatch.setattr(jobs.train.training, "capability_problems", lambda spec, device=None: [])
    spec = dataclasses.replace(
        _grpo_spec(tiny_model, max_steps=1, rewards="repetition", eval_split=None),
        lora_init=LoraInit(changes["lora_init"]),
    )
    with pytest.raises(Exception, match=re.escape(error)):
        jobs.train.training.train_spec(spec, tmp_path / "out", device=CPU)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize(
    "changes", [{"method": "full", "beta": 0.1}, {"method": "prefix_tuning", "num_virtual_tokens": 4}]
)
def test_methods_that_generate_differently_train(changes: dict, tiny_model: Path, tmp_path: Path) -> None:
    """A full fine-tune with a KL term gets a second model as its reference; prefix tuning generates through
    its cached prefix. Both train with GRPO."""
    from jobs.train.training import train_spec

    result = train_spec(
        _grpo_spec(tiny_model, max_steps=1, rewards="overlong", eval_split=None, **changes),
        tmp_path / "out",
        device=CPU,
    )
    assert result.metrics["global_step"] == 1 and result.resolved["trainer_config_class"] == "GRPOConfig"
    if changes["method"] == "full":
        assert result.trainer.ref_model is not None  # beta > 0 without an adapter to switch off


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize(
    "changes",
    [
        {"loss_type": "grpo"},
        {"loss_type": "dr_grpo", "scale_rewards": "none"},
        {"loss_type": "dapo", "epsilon_high": 0.28, "mask_truncated_completions": True},
        {"loss_type": "bnpo", "scale_rewards": "batch"},
        {"loss_type": "grpo", "importance_sampling_level": "sequence"},  # GSPO
    ],
    ids=["grpo", "dr_grpo", "dapo", "bnpo", "gspo"],
)
def test_every_loss_variant_trains(changes: dict, tiny_model: Path, tmp_path: Path) -> None:
    """One optimizer step of each loss variant on the tiny model, with a reward whose scores vary (short
    completions score 1), so the loss has advantages to weigh; trl's trainer takes each knob as set."""
    from jobs.train.training import train_spec

    short = '[{kind: regex, pattern: "^.{0,22}$", mode: match, name: short}]'
    result = train_spec(
        _grpo_spec(tiny_model, max_steps=1, rewards=short, eval_split=None, beta=0.0, **changes),
        tmp_path / "out",
        device=CPU,
    )
    assert result.metrics["global_step"] == 1
    config = result.resolved["trainer_config"]
    assert {k: config[k] for k in changes} == changes
    assert result.trainer.loss_type == changes["loss_type"]
    assert result.trainer.importance_sampling_level == changes.get("importance_sampling_level", "token")


def test_memory_prediction_for_grpo_is_an_approximation_that_says_so() -> None:
    """Rows are prompt (max_length) + completion; a full fine-tune with a KL term adds a reference copy."""
    from jobs.devices.facts import DeviceFacts
    from jobs.memory.model_config import arch_for
    from jobs.memory.predict import predict

    arch = arch_for("smollm2-135m-instruct")
    h200 = DeviceFacts(
        kind="cuda", name="NVIDIA H200", total_bytes=139 * 2**30, compute_capability="9.0", bf16=True, fp16=True
    )
    sft = predict(JobSpec(max_length=256), arch, h200)
    spec = JobSpec.from_dict(grpo(max_length=192, max_completion_length=64, num_generations=2))
    prediction = predict(spec, arch, h200)
    assert prediction.part("activations") == pytest.approx(sft.part("activations"), rel=0.01)  # same 256 tokens/row
    assert any("grpo: rows taken as max_length prompt + max_completion_length" in n for n in prediction.notes)
    full = {"method": "full"}
    with_kl = predict(JobSpec.from_dict(grpo(**full, beta=0.1)), arch, h200).part("weights")
    without = predict(JobSpec.from_dict(grpo(**full, beta=0.0)), arch, h200).part("weights")
    assert with_kl - without == 4 * arch.total_params
