"""Mixture-of-experts models: where LoRA goes (`moe_targets` -> peft arguments), what is refused at submit and
why, what is chosen for the user, and that peft counts what the prediction says, on tiny models of several
families built on the meta device (no weights; milliseconds each after the first)."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from jobs.config.moe import moe_notes, moe_problems
from jobs.config.peft import peft_kwargs
from jobs.spec.job import JobSpec


@functools.cache
def shape(family: str) -> Any:
    from jobs.memory.shape import model_shape
    from jobs.models.zoo import zoo_config

    return model_shape(zoo_config(family, _tokenizer()))


@functools.cache
def _tokenizer() -> Any:
    from jobs.models.tiny import train_tokenizer

    return train_tokenizer()


def spec(**changes: Any) -> JobSpec:
    return JobSpec.from_dict({"model": "m", "dataset": "sample:chat-format", **changes})


# family, moe_targets -> (linear leaf names, fused parameters)
TARGETS = [
    ("mixtral", "attention", ["k_proj", "o_proj", "q_proj", "v_proj"], []),
    (
        "mixtral",
        "attention+experts",
        ["k_proj", "o_proj", "q_proj", "v_proj"],
        ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"],
    ),
    (
        "mixtral",
        "attention+experts+router",
        ["k_proj", "o_proj", "q_proj", "v_proj"],
        ["mlp.experts.down_proj", "mlp.experts.gate_up_proj", "mlp.gate.weight"],
    ),
    ("gpt_oss", "attention+experts+router", ["k_proj", "o_proj", "q_proj", "v_proj"], None),
    (
        "llama4_text",
        "attention+experts",
        ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"],
        ["feed_forward.experts.down_proj", "feed_forward.experts.gate_up_proj"],
    ),
    ("llama4_text", "attention", ["k_proj", "o_proj", "q_proj", "v_proj"], []),
    (
        "deepseek_v3",
        "attention",
        ["kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "q_a_proj", "q_b_proj"],
        [],
    ),
]


@pytest.mark.parametrize(("family", "choice", "modules", "params"), TARGETS)
def test_moe_targets_map_to_peft_arguments(family: str, choice: str, modules: list[str], params: Any) -> None:
    found = peft_kwargs(spec(moe_targets=choice), family, shape(family).moe)
    assert found is not None
    kwargs = found[1]
    assert kwargs["target_modules"] == modules
    if params is not None:
        assert sorted(kwargs.get("target_parameters", [])) == params
    assert kwargs["lora_dropout"] == (0.0 if kwargs.get("target_parameters") else 0.05)


def test_dense_models_keep_all_linear_and_dropout() -> None:
    assert shape("llama").moe is None
    kwargs = peft_kwargs(spec(), "llama", None)[1]  # type: ignore[index]
    assert kwargs["target_modules"] == "all-linear" and kwargs["lora_dropout"] == 0.05
    assert "target_parameters" not in kwargs


def test_the_layout_is_read_from_the_model_not_a_family_table() -> None:
    moe = shape("qwen3_moe").moe
    assert moe is not None
    assert (moe.experts, moe.top_k, moe.moe_layers) == (4, 2, 2)
    assert moe.expert_params == ("mlp.experts.down_proj", "mlp.experts.gate_up_proj")
    assert shape("granitemoe").moe.expert_params == (
        "block_sparse_moe.experts.down_proj",
        "block_sparse_moe.experts.gate_up_proj",
    )


def test_dropout_forced_to_zero_is_said() -> None:
    moe = shape("mixtral").moe
    notes = moe_notes(spec(lora_dropout=0.1), moe)
    assert notes and "lora_dropout 0.1 -> 0" in notes[0] and "moe_targets: attention" in notes[0]
    assert moe_notes(spec(moe_targets="attention"), moe) == []
    assert moe_notes(spec(lora_dropout=0.0), moe) == []
    assert moe_notes(spec(), None) == []


def test_dora_on_experts_is_refused_with_the_fix() -> None:
    problems = moe_problems(spec(method="dora"), shape("mixtral").moe)
    assert [p.field for p in problems] == ["moe_targets"]
    assert "dora" in problems[0].problem and "moe_targets: attention" in problems[0].fix
    assert moe_problems(spec(method="dora", moe_targets="attention"), shape("mixtral").moe) == []


def test_a_router_peft_cannot_wrap_is_refused() -> None:
    problems = moe_problems(spec(moe_targets="attention+experts+router"), shape("llama4_text").moe)
    assert [p.field for p in problems] == ["moe_targets"]
    assert "attention+experts" in problems[0].fix
    assert moe_problems(spec(moe_targets="attention+experts+router"), shape("mixtral").moe) == []


@pytest.mark.parametrize(
    ("family", "choice"),
    [("mixtral", "attention+experts"), ("qwen2_moe", "attention"), ("deepseek_v3", "attention+experts+router")],
)
def test_trainable_count_is_peft_own(family: str, choice: str) -> None:
    """The count shown before launch is what peft reports on the built model (with its fused experts)."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from jobs.config.peft import peft_config
    from jobs.memory.params import trainable_params
    from jobs.models.zoo import zoo_config

    s = spec(moe_targets=choice, lora_r=4)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(zoo_config(family, _tokenizer()))
    peft_model = get_peft_model(model, peft_config(s, family, shape(family).moe))
    assert trainable_params(s, shape(family)).trainable == peft_model.get_nb_trainable_parameters()[0]


def test_active_parameters_count_top_k_experts() -> None:
    from jobs.devices.probe import cpu_facts
    from jobs.memory.parts import arch_from_config
    from jobs.memory.predict import predict
    from jobs.models.zoo import zoo_config

    arch = arch_from_config(zoo_config("mixtral", _tokenizer()))
    moe = arch.shape.moe
    p = predict(spec(), arch, cpu_facts())
    assert p.active_params == arch.total_params - moe.expert_param_count // 2  # top 2 of 4 experts
    assert predict(spec(), arch_from_config(zoo_config("llama", _tokenizer())), cpu_facts()).active_params is None


def test_a_config_with_infinity_builds() -> None:
    """transformers writes inf as {"__float__": "Infinity"} (Bamba's time_step_limit): submit read it back and
    printed a traceback (issue 31)."""
    from jobs.memory.shape import transformers_config
    from jobs.models.zoo import zoo_config

    data = zoo_config("bamba", _tokenizer()).to_diff_dict()
    data["model_type"] = "bamba"
    data["time_step_limit"] = [0.0, {"__float__": "Infinity"}]
    assert transformers_config(data).time_step_limit == (0.0, float("inf"))
