"""Reward modelling: trl's RewardTrainer on a sequence-classification head, with LoRA, on CPU.

The bundled `sample:preference-format` (prompt/chosen/rejected, chosen answers in the taught
format) is its sample. What was tried with the capability check off (tiny Llama, 2 steps) is
listed in REFUSED / TRAINS below; refusals name the library's own error.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from jobs.config.mapping import peft_kwargs, resolved_config
from jobs.data.inspection import check_dataset
from jobs.data.loading import load_datasets
from jobs.data.sources import DataError
from jobs.data.tokens.measurement import length_warnings
from jobs.devices.facts import CPU
from jobs.spec.enums import Trainer
from jobs.spec.job import JobSpec, SpecError
from storage.models import RunStatus
from tests.training_helpers import refusal_messages, tiny_spec

REWARD = Trainer.REWARD


def test_reward_data_is_preference_rows() -> None:
    assert check_dataset("sample:preference-format", REWARD).n_rows == 200
    with pytest.raises(DataError) as err:
        check_dataset("sample:chat-format", REWARD)
    text = str(err.value)
    assert "the reward trainer needs prompt/chosen/rejected rows" in text and "sample:preference-format" in text


def test_reward_mapping(tmp_path: Path) -> None:
    from trl import RewardConfig

    from jobs.config.mapping import training_config

    spec = JobSpec(trainer=REWARD, dataset="sample:preference-format")
    resolved = resolved_config(spec, CPU, str(tmp_path))
    assert resolved["trainer_config_class"] == "RewardConfig"
    assert resolved["peft_config"]["task_type"] == "SEQ_CLS"  # peft then trains the new score head too
    kw = resolved["trainer_config"]
    assert not {"loss_type", "beta", "padding_free", "packing"} & set(kw)
    assert isinstance(training_config(spec, CPU, str(tmp_path)), RewardConfig)
    assert peft_kwargs(JobSpec())[1]["task_type"] == "CAUSAL_LM"


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"loss_type": "sigmoid"}, "loss_type: sigmoid is a DPO loss. Fix: for reward use auto"),
        ({"padding_free": True}, "padding_free: is not supported by the REWARD trainer"),
        ({"packing": True}, "packing: is only supported by the SFT trainer. Fix: set packing: false for reward"),
        ({"lora_target_modules": "q_proj,lm_head"}, "lora_target_modules: an adapter on lm_head"),
        ({"assistant_only_loss": True}, "assistant_only_loss: is an SFT option"),
        ({"method": "qlora"}, "method: qlora fails for a reward model"),
        ({"method": "lora_8bit"}, "method: lora_8bit fails for a reward model"),
        ({"method": "prefix_tuning"}, "method: prefix_tuning needs past key values"),
    ],
)
def test_refused_before_queueing(changes: dict, message: str) -> None:
    messages = refusal_messages({"trainer": "reward", "dataset": "sample:preference-format", **changes})
    assert any(message in m for m in messages), messages


def test_reward_config_has_no_padding_free() -> None:
    from trl import RewardConfig

    with pytest.raises(TypeError, match="padding_free"):
        RewardConfig(output_dir="unused", use_cpu=True, bf16=False, padding_free=True)


def test_long_rows_are_dropped_not_truncated(tiny_model: Path) -> None:
    """trl's RewardTrainer filters out rows over max_length: the warning says so."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    train, _ = load_datasets(JobSpec(trainer=REWARD, dataset="sample:preference-format", max_train_samples=10))
    (warning,) = length_warnings(train, tok, 16, trainer=REWARD)
    assert warning.endswith("will be dropped (the reward trainer filters them out)")
    assert length_warnings(train, tok, 16)[0].endswith("will be truncated")


@pytest.mark.integration
@pytest.mark.slow
def test_reward_model_trains_through_the_worker(store, tiny_model: Path) -> None:
    """The real worker and child: LoRA reward model; accuracy/margin graphed; the bundle holds the score head."""
    from app.ui.run import RunPageData
    from jobs.worker.loop import Worker

    spec = tiny_spec(
        tiny_model,
        trainer="reward",
        dataset="sample:preference-format",
        max_steps=3,
        max_train_samples=12,
        max_length=128,
    )
    run_id = store.create_run(spec)
    Worker(store, poll_interval=0.2, sample=False).work(burst=True)
    run = store.get_run(run_id)
    assert run.status is RunStatus.SUCCEEDED, run.error_summary
    assert run.resolved_config["trainer_config_class"] == "RewardConfig"
    assert {"loss", "accuracy", "margin", "mean_reward", "eval_loss"} <= set(store.metric_names(run_id))
    assert len(store.metrics(run_id, ["accuracy"])) == 3
    assert set(RunPageData(store).frames(run_id, "reward")[4]["series"]) == {"accuracy", "margin", "mean reward"}
    bundle = Path(next(a.path for a in store.artifacts(run_id) if a.kind == "adapter"))
    config = json.loads((bundle / "adapter_config.json").read_text())
    assert config["task_type"] == "SEQ_CLS" and "score" in (config.get("modules_to_save") or [])


@pytest.mark.integration
@pytest.mark.parametrize(
    "changes,error",
    [
        ({"method": "qlora"}, "expected m1 and m2 to have the same dtype"),
        ({"method": "prefix_tuning"}, "Model does not support past key values which are required for prefix tuning"),
    ],
)
def test_the_libraries_really_reject_them(
    changes: dict, error: str, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With our check off, the libraries fail on each: the refusals above are grounded, not guessed."""
    import re

    import jobs.train.training
    from jobs.spec.enums import Method

    monkeypatch.setattr(jobs.train.training, "capability_problems", lambda spec, device=None: [])
    spec = tiny_spec(
        tiny_model,
        trainer="reward",
        dataset="sample:preference-format",
        max_steps=1,
        max_train_samples=4,
        max_length=128,
        num_virtual_tokens=4,
    )
    spec = dataclasses.replace(spec, method=Method(changes["method"]))
    with pytest.raises(Exception, match=re.escape(error)):
        jobs.train.training.train_spec(spec, tmp_path / "out", device=CPU)


@pytest.mark.integration
def test_all_rows_too_long_names_max_length(tiny_model: Path, tmp_path: Path) -> None:
    """trl drops every row and then fails with 'num_samples=0'; tunedeck names max_length instead."""
    from jobs.train.training import train_spec

    spec = tiny_spec(
        tiny_model,
        trainer="reward",
        dataset="sample:preference-format",
        max_steps=1,
        max_train_samples=4,
        max_length=16,
    )
    with pytest.raises(SpecError) as err:
        train_spec(spec, tmp_path / "out", device=CPU)
    (problem,) = err.value.problems
    assert problem.field == "max_length" and "reward trainer drops such rows" in problem.problem
