"""MoRA (jobs/config/mora.py) against the paper: budget, operators, merging, saving and loading."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from jobs.config.mora import MoraConfig, load_mora, mora_delta_weight, mora_delta_x, mora_rank


def small_llama(hidden: int = 64, intermediate: int = 176, layers: int = 2) -> Any:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
    )
    return AutoModelForCausalLM.from_config(config)


def randomize(model: Any) -> None:
    """Give MoRA's zero-initialised matrices values, so the update is not trivially zero."""
    torch.manual_seed(1)
    for p in model.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)


@pytest.mark.parametrize("mora_type", ["rope", "sharing"])
@pytest.mark.parametrize("k, d", [(64, 64), (64, 176), (176, 64), (50, 30)])
def test_operator_equals_its_merged_matrix(mora_type: str, k: int, d: int) -> None:
    torch.manual_seed(0)
    rank = mora_rank(k, d, 2, mora_type)
    matrix, x = torch.randn(rank, rank), torch.randn(3, 5, k)
    delta = mora_delta_weight(matrix, k, d, mora_type)
    assert delta.shape == (d, k)
    torch.testing.assert_close(mora_delta_x(x, matrix, d, mora_type), x @ delta.T, rtol=1e-4, atol=1e-4)


def test_rope_update_is_high_rank_and_sharing_is_bounded_by_r_hat() -> None:
    """The point of MoRA: on a square layer the RoPE update reaches full rank, far above LoRA's r."""
    torch.manual_seed(0)
    k = d = 256
    r = 8
    rank = mora_rank(k, d, r)
    assert rank == 64  # sqrt(512 * 8)
    rope = mora_delta_weight(torch.randn(rank, rank), k, d, "rope")
    sharing = mora_delta_weight(torch.randn(rank, rank), k, d, "sharing")
    assert torch.linalg.matrix_rank(rope) == 256 > r
    assert torch.linalg.matrix_rank(sharing) == rank > r


@pytest.mark.parametrize("mora_type", ["rope", "sharing"])
def test_parameter_count_is_loras_budget(mora_type: str) -> None:
    """r^ is the largest (even, for rope) size with r^^2 <= r (k + d); equal to LoRA's count when that is a square."""
    from peft import LoraConfig, get_peft_model

    r = 4
    mora = get_peft_model(small_llama(), MoraConfig(r=r, target_modules="all-linear", mora_type=mora_type))
    lora = get_peft_model(small_llama(), LoraConfig(r=r, target_modules="all-linear"))
    step = 2 if mora_type == "rope" else 1
    for name, module in mora.named_modules():
        if hasattr(module, "mora_type"):
            k, d = module.in_features, module.out_features
            rank = module.lora_A["default"].weight.shape[0]
            assert module.lora_A["default"].weight.shape == (rank, rank)
            assert rank * rank <= r * (k + d) < (rank + step) ** 2, name
    assert mora.get_nb_trainable_parameters()[0] <= lora.get_nb_trainable_parameters()[0]
    # On a layer whose budget is a perfect square (256 x 256, r = 8), the counts are equal.
    square = get_peft_model(
        small_llama(256, 256, 1), MoraConfig(r=8, target_modules=["q_proj", "o_proj"], mora_type=mora_type)
    )
    lora_square = get_peft_model(small_llama(256, 256, 1), LoraConfig(r=8, target_modules=["q_proj", "o_proj"]))
    assert square.get_nb_trainable_parameters()[0] == lora_square.get_nb_trainable_parameters()[0] == 2 * 64 * 64


def test_starts_as_the_base_model() -> None:
    base = small_llama()
    ids = torch.randint(0, 300, (2, 9))
    expected = base(ids).logits
    model = __import__("peft").get_peft_model(copy.deepcopy(base), MoraConfig(r=4, target_modules="all-linear"))
    torch.testing.assert_close(model(ids).logits, expected)


@pytest.mark.parametrize("mora_type", ["rope", "sharing"])
def test_merged_model_gives_the_unmerged_outputs(mora_type: str) -> None:
    from peft import get_peft_model

    model = get_peft_model(small_llama(), MoraConfig(r=4, target_modules="all-linear", mora_type=mora_type))
    randomize(model)
    model.eval()
    ids = torch.randint(0, 300, (2, 9))
    with torch.no_grad():
        unmerged = model(ids).logits
        with model.disable_adapter():
            plain = model(ids).logits
        assert not torch.allclose(unmerged, plain, atol=1e-3)  # the adapter does something
        model.merge_adapter()
        torch.testing.assert_close(model(ids).logits, unmerged, rtol=1e-4, atol=1e-4)
        model.unmerge_adapter()
        torch.testing.assert_close(model(ids).logits, unmerged, rtol=1e-4, atol=1e-4)
        merged = model.merge_and_unload()
        assert not any("lora" in name for name, _ in merged.named_parameters())
        torch.testing.assert_close(merged(ids).logits, unmerged, rtol=1e-4, atol=1e-4)


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    from peft import PeftModel, get_peft_model
    from safetensors.torch import load_file

    base = small_llama()
    pristine = copy.deepcopy(base)
    model = get_peft_model(base, MoraConfig(r=4, target_modules="all-linear", mora_type="sharing"))
    randomize(model)
    model.eval()
    ids = torch.randint(0, 300, (2, 9))
    with torch.no_grad():
        expected = model(ids).logits
    model.save_pretrained(str(tmp_path))
    saved = load_file(str(tmp_path / "adapter_model.safetensors"))
    assert saved and all(t.shape[0] == t.shape[1] for t in saved.values())  # only the square matrices
    reloaded = load_mora(copy.deepcopy(pristine), str(tmp_path))
    reloaded.eval()
    assert reloaded.peft_config["default"].mora_type == "sharing"
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, expected)
    # Plain peft without tunedeck's config does not silently load it as LoRA: the shapes differ.
    with pytest.raises(RuntimeError, match="size mismatch"):
        PeftModel.from_pretrained(copy.deepcopy(pristine), str(tmp_path))


def test_rank_formula() -> None:
    assert mora_rank(4096, 4096, 8, "sharing") == 256 == math.isqrt(8192 * 8)
    assert mora_rank(4096, 11008, 8, "rope") % 2 == 0
    assert mora_rank(10, 10, 1, "rope") == 4  # floor(sqrt(20)) = 4
    assert mora_rank(10, 11, 1, "sharing") == 4 and mora_rank(12, 13, 1, "rope") == 4  # floor(sqrt(25)) = 5 -> even 4


def test_gpt2_conv1d_layers_merge_too() -> None:
    """GPT-2 stores its projections as Conv1D (weight in x out): the merged update must be transposed."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, GPT2Config

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(
        GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=300, n_positions=64, bos_token_id=0, eos_token_id=0)
    )
    model = get_peft_model(base, MoraConfig(r=4, target_modules="all-linear"))
    randomize(model)
    model.eval()
    ids = torch.randint(0, 300, (2, 9))
    with torch.no_grad():
        unmerged = model(ids).logits
        with model.disable_adapter():
            assert not torch.allclose(model(ids).logits, unmerged, atol=1e-3)
        torch.testing.assert_close(model.merge_and_unload()(ids).logits, unmerged, rtol=1e-4, atol=1e-4)


def test_trains_after_an_inference_mode_forward() -> None:
    """The operators' cached index tensors must not be inference tensors (samples are drawn mid-training)."""
    from peft import get_peft_model

    for mora_type in ("rope", "sharing"):
        model = get_peft_model(small_llama(), MoraConfig(r=4, target_modules="all-linear", mora_type=mora_type))
        ids = torch.randint(0, 300, (2, 7))
        with torch.inference_mode():
            model(ids)
        model(input_ids=ids, labels=ids).loss.backward()
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters() if p.requires_grad)
