"""The pre-launch trainable parameter count equals peft's own count, exactly (no training)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.config.mapping import peft_config
from jobs.memory.model_config import arch_for
from jobs.memory.params import trainable_params
from jobs.memory.shape import ModelShape, model_shape
from jobs.spec.job import JobSpec

PEFT_METHODS = [
    "lora",
    "dora",
    "ia3",
    "prompt_tuning",
    "prefix_tuning",
    "p_tuning",
    "mora",
    "adaption_prompt",
    "lokr",
    "loha",
    "oft",
    "vera",
    "miss",
    "hira",
]


def qwen2_like() -> Any:
    """A small random config with grouped-query attention and q/k/v biases (Qwen2 style), untied head."""
    from transformers import Qwen2Config

    return Qwen2Config(
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        vocab_size=300,
        tie_word_embeddings=False,
    )


def peft_count(model: Any, spec: JobSpec) -> tuple[int, int]:
    from peft import get_peft_model

    peft_model = get_peft_model(model, peft_config(spec, model.config.model_type))
    return peft_model.get_nb_trainable_parameters()


@pytest.mark.parametrize("method", PEFT_METHODS)
@pytest.mark.parametrize(
    "changes",
    [
        {"adapter_layers": 2},
        {
            "lora_r": 3,
            "lora_target_modules": "q_proj,v_proj",
            "num_virtual_tokens": 7,
            "adapter_layers": 1,
            "adapter_len": 3,
            "oft_block_size": 8,
            "mora_type": "sharing",
        },
    ],
)
def test_estimate_equals_peft_on_the_tiny_model(method: str, changes: dict[str, Any], tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    spec = JobSpec.from_dict({"method": method, "model": str(tiny_model), **changes})
    estimate = trainable_params(spec, arch_for(str(tiny_model)).shape)
    assert (estimate.trainable, estimate.total) == peft_count(
        AutoModelForCausalLM.from_pretrained(str(tiny_model)), spec
    )
    assert 0 < estimate.percent < 100


@pytest.mark.parametrize("method", PEFT_METHODS)
def test_estimate_equals_peft_with_grouped_query_attention_and_biases(method: str) -> None:
    from transformers import AutoModelForCausalLM

    if method == "adaption_prompt":
        pytest.skip(
            "peft's LLaMA-Adapter does not support qwen2 (see test_adaption_prompt_refuses_other_architectures)"
        )
    spec = JobSpec.from_dict({"method": method, "lora_r": 4, "num_virtual_tokens": 5})
    config = qwen2_like()
    estimate = trainable_params(spec, model_shape(config))
    assert (estimate.trainable, estimate.total) == peft_count(AutoModelForCausalLM.from_config(config), spec)


def test_full_fine_tune_trains_everything(tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    count = trainable_params(JobSpec.from_dict({"method": "full"}), arch_for(str(tiny_model)).shape)
    assert count.trainable == count.total == sum(p.numel() for p in model.parameters())
    assert count.percent == 100.0


def test_builtin_default_model_shape_needs_no_download() -> None:
    shape = arch_for("smollm2-135m-instruct").shape
    assert isinstance(shape, ModelShape) and shape.total == 134_515_008  # counted on the converted model
    lora = trainable_params(JobSpec(), shape)  # r=16 on all linear layers
    assert lora.trainable == 30 * 16 * (4 * 576 + 2 * 192 + 2 * 576 + 3 * (576 + 1536)) and lora.percent < 5


def test_unknown_model_has_no_estimate(tmp_path: Path) -> None:
    assert arch_for(str(tmp_path / "missing")) is None
