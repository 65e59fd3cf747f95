"""A zoo of tiny random-weight causal LMs, one per transformers family, for tests and `bench/zoo_table.py`.

Each family is built from `AutoConfig.for_model(family, ...)` at hidden 64, 2 layers and the tiny model's
512-token tokenizer (`jobs.models.tiny.train_tokenizer`), saved as a normal model folder. The table covers the
structures the predictor and the adapter mapping must know: every mixture-of-experts family of transformers
5.24 that builds from its config, sliding-window and hybrid attention, multi-head latent attention, hybrid
linear-attention / state-space layers, fused qkv, biases, tied and untied heads, logit soft-capping.

    build_zoo_model(dest, "mixtral")     # the folder (built once: a complete folder is kept)
    FAMILIES["qwen3_moe"].structure      # what the family exercises, in words
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.models.tiny import SEED, build_folder_atomically

ZOO_VERSION = "zoo-2"  # zoo-2: deepseek_v3 with as many key/value heads as heads, as its published config
BASE: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
)
MOE: dict[str, Any] = dict(num_experts=4, num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
# The zoo's second size: wider, deeper, more heads and experts, positions for 2,048 tokens. Each family's own
# fields that name a width (gpt2's n_embd, the Mamba-2 heads, ...) are scaled with it in `SIZE_FIELDS`.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {},
    "small": dict(
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        num_experts=8,
        num_local_experts=8,
        n_routed_experts=8,
        moe_intermediate_size=256,
        head_dim=64,
    ),
}
SIZE_FIELDS: dict[str, dict[str, dict[str, Any]]] = {
    "small": {
        "gpt2": dict(n_embd=512, n_layer=4, n_head=8, n_positions=2048),
        "bamba": dict(mamba_n_heads=16, mamba_d_head=64, attn_layer_indices=[1, 3]),
        "granitemoehybrid": dict(
            mamba_n_heads=16,
            mamba_d_head=64,
            shared_intermediate_size=512,
            layer_types=["linear_attention", "full_attention"] * 2,
        ),
        "deepseek_v3": dict(
            num_key_value_heads=8,
            kv_lora_rank=64,
            q_lora_rank=128,
            qk_rope_head_dim=16,
            qk_nope_head_dim=32,
            v_head_dim=64,
        ),
        "qwen3_next": dict(
            linear_num_key_heads=4,
            linear_num_value_heads=8,
            linear_key_head_dim=64,
            linear_value_head_dim=64,
            shared_expert_intermediate_size=512,
        ),
        "qwen2_moe": dict(shared_expert_intermediate_size=512),
        "llama4_text": dict(intermediate_size_mlp=1024),
    },
}
MLA: dict[str, Any] = dict(
    kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_routed_experts=4
)


@dataclass(frozen=True)
class Family:
    """One zoo entry: its transformers model_type, what it exercises, the config fields that shrink it."""

    model_type: str
    structure: str
    config: dict[str, Any] = field(default_factory=dict)
    moe: bool = False


def _family(model_type: str, structure: str, moe: bool = False, **config: Any) -> Family:
    return Family(model_type, structure, {**(MOE if moe else {}), **config}, moe)


FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        _family("llama", "dense, grouped-query attention, tied head", tie_word_embeddings=True),
        _family("mistral", "dense, sliding-window attention", sliding_window=32),
        _family("qwen2", "attention q/k/v biases, untied head", tie_word_embeddings=False),
        _family("qwen3", "q/k norms"),
        _family("gemma2", "logit and attention soft-capping, alternating sliding window", head_dim=16),
        _family("gemma3_text", "hybrid local/global attention, soft-capping", head_dim=16),
        _family("phi3", "fused qkv_proj and gate_up_proj linears"),
        _family("gpt2", "fused c_attn Conv1D, learned positions, biases", n_embd=64, n_layer=2, n_head=4),
        _family("gpt_neox", "fused query_key_value, parallel residual, untied embed_out"),
        _family("falcon", "fused query_key_value, multi-query attention", new_decoder_architecture=True),
        _family("olmo2", "post-norms, q/k norms"),
        _family("granite", "scaled residuals and logits"),
        _family("stablelm", "partial rotary, LayerNorm with bias"),
        _family("smollm3", "NoPE layers (no rotary on some layers)"),
        _family("glm4", "fused gate_up_proj, extra post-norms"),
        _family("cohere2", "sliding window + global layers, logit scale"),
        _family("exaone4", "hybrid sliding/global attention"),
        _family("lfm2", "hybrid short convolutions + attention (w1/w2/w3 MLP)"),
        _family("bamba", "hybrid Mamba-2 state-space + attention", mamba_n_heads=4, mamba_d_head=32),
        _family(
            "granitemoehybrid",
            "hybrid Mamba-2 state-space + attention, mixture of experts + shared expert",
            moe=True,
            mamba_n_heads=4,
            mamba_d_head=32,
            mamba_chunk_size=32,
            shared_intermediate_size=64,
            layer_types=["linear_attention", "full_attention"],
        ),
        _family("mixtral", "mixture of experts, fused experts, custom router", moe=True),
        _family("qwen2_moe", "mixture of experts + gated shared expert", moe=True, shared_expert_intermediate_size=64),
        _family("qwen3_moe", "mixture of experts, q/k norms", moe=True),
        _family("olmoe", "mixture of experts, q/k norms", moe=True),
        _family("phimoe", "mixture of experts, sparse-mixer router", moe=True),
        _family("granitemoe", "mixture of experts (block_sparse_moe), scaled residuals", moe=True),
        _family("flex_olmo", "mixture of experts, post-norms", moe=True),
        _family("minimax", "mixture of experts + lightning (linear) attention layers", moe=True),
        _family("gpt_oss", "mixture of experts with biases, attention sinks, sliding window", moe=True),
        _family(
            "llama4_text",
            "mixture of experts + shared expert, router is a linear layer",
            moe=True,
            intermediate_size_mlp=128,
            interleave_moe_layer_step=1,
        ),
        _family(
            "deepseek_v3",
            "multi-head latent attention, dense first layer, experts + shared expert",
            moe=True,
            num_key_value_heads=4,  # fewer fails in transformers whenever a padding mask is passed
            n_shared_experts=1,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
            **MLA,
        ),
        _family(
            "glm4_moe",
            "mixture of experts + shared expert, dense first layer",
            moe=True,
            n_routed_experts=4,
            n_shared_experts=1,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
        ),
        _family(
            "qwen3_next",
            "hybrid gated delta-net linear attention + attention, experts + shared expert",
            moe=True,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            full_attention_interval=2,
            shared_expert_intermediate_size=64,
        ),
    )
}


def zoo_config(family: str, tokenizer: Any, size: str = "tiny") -> Any:
    """The family's transformers config at `size` (`SIZES`), with the tokenizer's vocabulary and special tokens."""
    from transformers import AutoConfig

    fam = FAMILIES[family]
    ids = dict(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    sized = {k: v for k, v in SIZES[size].items() if k in BASE or (fam.moe and k in MOE) or k in fam.config}
    fields = {**BASE, **ids, **fam.config, **sized, **SIZE_FIELDS.get(size, {}).get(family, {})}
    return AutoConfig.for_model(fam.model_type, **fields)


def build_zoo_model(dest: Path, family: str, size: str = "tiny") -> Path:
    """The family's model folder at `dest` at `size`, built once (seeded random weights, the tiny tokenizer)."""

    def write(out: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from jobs.models.tiny import train_tokenizer

        tokenizer = train_tokenizer()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            model = AutoModelForCausalLM.from_config(zoo_config(family, tokenizer, size))
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        (out / "tunedeck.json").write_text(
            json.dumps({"builder": "jobs.models.zoo", "family": family, **({"size": size} if size != "tiny" else {})})
            + "\n"
        )

    return build_folder_atomically(Path(dest), write, version=zoo_version(size))


def zoo_version(size: str) -> str:
    """The folder version of a zoo model at `size`: the tiny one's is `ZOO_VERSION`; another size's names its
    fields' digest too, so that a folder built at an older definition of the size is rebuilt."""
    if size == "tiny":
        return ZOO_VERSION
    fields = json.dumps([SIZES[size], SIZE_FIELDS.get(size, {})], sort_keys=True)
    return f"{ZOO_VERSION}-{size}-{hashlib.sha256(fields.encode()).hexdigest()[:8]}"
