"""What peft and transformers would refuse is refused at submit, with nothing queued (`jobs.checks.library`).

Each case is a tiny random-weight model of the shape a user brought (issue 49): a Falcon-H1 LoRA run whose
all-linear targets peft refuses (Mamba `out_proj`), a DeepSeek-V3 shape whose attention heads disagree (the
padded forward fails with a size mismatch), a GraniteMoE-hybrid config without the `num_experts` key trl's
load-balancing loss reads, and a Llama-3.2-Vision-shaped (Mllama) model that had no prediction."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from jobs.errors import ProblemError
from jobs.spec.job import JobSpec

BASE: dict[str, Any] = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=512
)
IDS: dict[str, Any] = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)
DEEPSEEK: dict[str, Any] = dict(
    kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_routed_experts=4,
    num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, n_group=1,
    topk_group=1,
)  # fmt: skip
GRANITE_HYBRID: dict[str, Any] = dict(
    num_local_experts=4, num_experts_per_tok=2, num_key_value_heads=2, mamba_n_heads=4, mamba_d_head=32,
    mamba_chunk_size=32, shared_intermediate_size=64, layer_types=["mamba", "attention"],
)  # fmt: skip


def _folder(dest: Path, tokenizer_from: Path, build: Any) -> Path:
    """A model folder: the tiny model's tokenizer and chat template, the weights `build()` makes."""
    import torch

    dest.mkdir(parents=True)
    for f in tokenizer_from.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, dest / f.name)
    torch.manual_seed(0)
    build().save_pretrained(dest, safe_serialization=True)
    return dest


def _causal(dest: Path, tiny_model: Path, model_type: str, **config: Any) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(model_type, **{**BASE, **IDS, **config})
    return _folder(dest, tiny_model, lambda: AutoModelForCausalLM.from_config(cfg))


def _refused_at_submit(store: Any, raw: dict[str, Any], field: str, words: str) -> None:
    from jobs.queue.submit import submit

    with pytest.raises(ProblemError) as exc:
        submit(store, JobSpec.from_dict(raw))
    hits = [p for p in exc.value.problems if p.field == field and words.lower() in f"{p.problem} {p.fix}".lower()]
    assert hits, exc.value.problems
    assert all(p.fix for p in hits)
    assert store.count_runs() == 0 and store.queued() == []


def test_peft_refusal_of_a_mamba_module_is_refused_at_submit_naming_the_field(
    store: Any, tmp_path: Path, tiny_model: Path
) -> None:
    from jobs.checks.pipeline import check

    model = _causal(
        tmp_path / "falcon-h1", tiny_model, "falcon_h1", num_key_value_heads=2, mamba_n_heads=4, mamba_d_head=16,
        mamba_d_ssm=64, mamba_expand=1, mamba_chunk_size=32,
    )  # fmt: skip
    raw = {"model": str(model), "dataset": "sample:chat-format", "max_length": 64, "method": "lora"}
    _refused_at_submit(store, raw, "lora_target_modules", "incompatible with Mamba")
    fixed = check(JobSpec.from_dict({**raw, "lora_target_modules": "q_proj,k_proj,v_proj,o_proj"}))
    assert fixed.problems == [], fixed.problems


def test_a_shape_transformers_cannot_run_is_refused_at_submit_with_its_message(
    store: Any, tmp_path: Path, tiny_model: Path
) -> None:
    """A DeepSeek-V3 shape with fewer key/value heads than heads: transformers repeats the latent attention's keys
    to twice the queries' heads whenever a mask is passed (a padded batch) and the step fails."""
    from jobs.checks.pipeline import check

    model = _causal(tmp_path / "dsv3", tiny_model, "deepseek_v3", num_key_value_heads=2, **DEEPSEEK)
    raw = {"model": str(model), "dataset": "sample:chat-format", "max_length": 64}
    _refused_at_submit(store, raw, "model", "must match the size of tensor")
    sound = _causal(tmp_path / "dsv3-sound", tiny_model, "deepseek_v3", num_key_value_heads=4, **DEEPSEEK)
    assert check(JobSpec.from_dict({**raw, "model": str(sound)})).problems == []


def test_a_moe_config_without_num_experts_runs_trl_s_load_balancing_loss(tmp_path: Path) -> None:
    """GraniteMoE-hybrid keeps its expert count in num_local_experts; trl's fused head reads num_experts. The key is
    filled from the built model as training fills it, and the step the submit check runs reads it the same way."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from jobs.models.expert_keys import fill_expert_keys
    from jobs.models.moe_layout import moe_layout

    config = AutoConfig.for_model("granitemoehybrid", **{**BASE, **IDS, **GRANITE_HYBRID})
    assert not hasattr(config, "num_experts")  # the shape of the run that failed at its first step
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    add_fused_lm_head(model)
    ids = torch.randint(3, 512, (1, 16))
    with pytest.raises(AttributeError, match="num_experts"):
        model(input_ids=ids, labels=ids, fused_lm_head=True, output_router_logits=True)
    assert fill_expert_keys(model, moe_layout(model, config)) == ["num_experts"]
    out = model(input_ids=ids, labels=ids, fused_lm_head=True, output_router_logits=True)
    out.loss.backward()
    assert model.config.num_experts == 4 and out.aux_loss is not None


def test_the_submit_check_of_a_granite_hybrid_without_num_experts_passes(
    store: Any, tmp_path: Path, tiny_model: Path
) -> None:
    from jobs.checks.pipeline import check

    model = _causal(tmp_path / "granite-hybrid", tiny_model, "granitemoehybrid", **GRANITE_HYBRID)
    checked = check(JobSpec.from_dict({"model": str(model), "dataset": "sample:chat-format", "max_length": 64}))
    assert checked.problems == [] and checked.prediction is not None
    assert not any("skipped" in w for w in checked.warnings), checked.warnings


def test_an_mllama_model_is_predicted_and_its_run_keeps_the_prediction(
    store: Any, tmp_path: Path, tiny_model: Path
) -> None:
    """Mllama's text_config is a MllamaTextConfig, which transformers' causal-LM mapping does not key: the plan said
    "no readable config.json" and the run was queued without a prediction."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    from jobs.checks.pipeline import check
    from jobs.queue.saved_prediction import load_prediction
    from jobs.queue.submit import enqueue

    text = dict(**BASE, **IDS, num_key_value_heads=2, cross_attention_layers=[1])
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_global_layers=1, attention_heads=2,
        image_size=56, patch_size=14, intermediate_layers_indices=[0],
    )  # fmt: skip
    config = AutoConfig.for_model("mllama", text_config=text, vision_config=vision)
    model = _folder(tmp_path / "mllama", tiny_model, lambda: AutoModelForImageTextToText.from_config(config))
    checked = check(JobSpec.from_dict({"model": str(model), "dataset": "sample:chat-format", "max_length": 64}))
    assert checked.problems == [], checked.problems
    assert checked.prediction is not None and checked.prediction.total_bytes > 0
    run_id = enqueue(store, checked)
    assert load_prediction(store, run_id) is not None


@pytest.mark.parametrize("method", ["lokr", "loha"])
def test_a_method_fake_tensors_cannot_run_is_skipped_saying_so_never_refused(tiny_model: Path, method: str) -> None:
    """LoKr and LoHa read a value back (`.item()`) in their forward: the one-step check cannot run them on shapes
    alone, so it says it skipped them; the model and method are not refused for it."""
    from jobs.checks.pipeline import check

    checked = check(JobSpec.from_dict({"model": str(tiny_model), "method": method, "max_length": 64}))
    assert checked.problems == [], checked.problems
    assert any("one-step check" in w and "skipped" in w and "reads a tensor's value" in w for w in checked.warnings)
