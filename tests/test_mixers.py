"""jobs.memory.mixers: the Mamba-2 layers' activation arithmetic against hand-computed figures (config dicts only)."""

from __future__ import annotations

import pytest

from jobs.memory.mixers import Mamba2, mamba2_dims, mamba_layer_count, mixer_bytes
from jobs.models.zoo import FAMILIES

TINY = {
    "model_type": "bamba",
    "hidden_size": 8,
    "num_hidden_layers": 4,
    "mamba_n_heads": 2,
    "mamba_d_head": 4,
    "mamba_d_state": 8,
    "mamba_n_groups": 1,
    "mamba_chunk_size": 16,
    "attn_layer_indices": [1],
}


def test_sizes_are_read_from_a_bamba_config_dict():
    assert mamba2_dims(TINY) == Mamba2(heads=2, head_dim=4, state=8, groups=1, chunk=16, layers=3)
    assert mamba2_dims(TINY).in_proj_width == 2 * 8 + 2 * 8 + 2  # gate + x + B + C + dt


@pytest.mark.parametrize(
    ("config", "mamba"),
    [
        ({"layers_block_type": ["linear_attention", "attention", "linear_attention"]}, 2),
        ({"layer_types": ["mamba", "attention", "mamba", "mamba"]}, 3),
        ({"layer_types": ["hybrid", "hybrid"]}, 2),  # falcon_h1: a mixer beside attention in every layer
        ({"hybrid_override_pattern": "M-M*"}, 2),  # nemotron_h
        ({"attn_layer_indices": [0, 3]}, 2),
        ({}, 4),  # a pure state-space model
    ],
)
def test_mamba_layers_come_from_the_layer_type_list(config, mamba):
    assert mamba_layer_count(config, 4) == mamba


def test_models_without_mamba2_sizes_have_no_term():
    gated_delta_net = {"num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"]}
    assert mamba2_dims(gated_delta_net) is None
    assert mamba2_dims({"num_hidden_layers": 2, "hidden_size": 8}) is None
    assert mamba2_dims(None) is None


def test_one_chunk_by_hand():
    # 10 tokens pad to one chunk of 16: d_inner 8, heads x state 16, in_proj width 34 (26 beyond d_inner).
    scores = 2 * 2 * 1 * 16 * 16 * 4  # 2 fp32 chunk x chunk tensors per head
    padded_state = 4 * 16 * 16 * 4
    state = 2 * 10 * 16 * 4
    padded_heads = 10 * 16 * 8 * 4
    projected = 3 * 10 * 26 * 2  # bf16 in_proj / conv outputs
    assert scores + padded_state + state + padded_heads + projected == 16152
    assert mixer_bytes(mamba2_dims(TINY), sequences=3, length=10, elem=2) == 3 * 16152


def test_a_longer_row_pays_for_a_second_chunk():
    # 20 tokens pad to 32: two chunks of 16.
    by_hand = 2 * 2 * 2 * 256 * 4 + 4 * 32 * 16 * 4 + 2 * 20 * 16 * 4 + 10 * 32 * 8 * 4 + 3 * 20 * 26 * 2
    assert by_hand == 32304
    assert mixer_bytes(mamba2_dims(TINY), sequences=1, length=20, elem=2) == by_hand


@pytest.mark.parametrize(
    ("family", "mixer", "fields"),
    [
        ("bamba", "BambaMixer", {"mamba_n_heads": 4, "mamba_d_head": 32}),
        ("granitemoehybrid", "GraniteMoeHybridMambaLayer", FAMILIES["granitemoehybrid"].config),
    ],
)
def test_a_hybrids_prediction_counts_its_mixers(family: str, mixer: str, fields: dict) -> None:
    """The prediction names no Mamba-2 mixer as not modelled and its activations grow by the layers' scan."""
    from transformers import AutoConfig

    from jobs.devices.probe import cpu_facts
    from jobs.memory.parts import arch_from_config
    from jobs.memory.predict import predict
    from jobs.models.zoo import BASE
    from jobs.spec.job import JobSpec

    config = AutoConfig.for_model(family, **{**BASE, "vocab_size": 512, **fields})
    spec = JobSpec.from_dict({"model": "m", "dataset": "sample:chat-format", "max_length": 64})
    arch = arch_from_config(config)
    assert mixer in arch.shape.unmodelled  # found on the built model, then described by the Mamba-2 term
    p = predict(spec, arch, cpu_facts())
    assert mixer not in p.not_modelled
    m = mamba2_dims(config)
    layers = 2 if family == "bamba" else 1  # the zoo's granitemoehybrid: one Mamba-2 layer, one attention layer
    assert m is not None and m.layers == layers
    assert f"{layers} Mamba-2 layers' chunked scan" in p.to_dict()["formulas"]["activations"]
    assert p.part("activations") >= layers * mixer_bytes(m, p.batch.sequences, 64, 4)


@pytest.mark.parametrize(
    ("key_heads", "value_heads", "key_dim", "value_dim", "length", "rows"),
    [
        (2, 4, 16, 16, 64, 2),
        (2, 4, 16, 16, 100, 1),
        (4, 4, 32, 16, 128, 1),
        (2, 8, 16, 32, 64, 1),
        (1, 2, 16, 8, 300, 1),
    ],
)
def test_the_delta_nets_rule_keeps_what_the_formula_says(
    key_heads: int, value_heads: int, key_dim: int, value_dim: int, length: int, rows: int, monkeypatch
) -> None:
    """What autograd saves inside transformers' torch gated delta rule, counted by storage, against
    `delta_net_bytes` (the rule's own tensors: the layer's projections are the block formula's)."""
    import torch
    from transformers import AutoConfig
    from transformers.models.qwen3_next import modeling_qwen3_next

    from jobs.memory.mixers import delta_net_bytes, delta_net_dims
    from jobs.models.zoo import BASE

    fields = {
        **FAMILIES["qwen3_next"].config,
        "linear_num_key_heads": key_heads,
        "linear_num_value_heads": value_heads,
        "linear_key_head_dim": key_dim,
        "linear_value_head_dim": value_dim,
    }
    config = AutoConfig.for_model("qwen3_next", **{**BASE, "vocab_size": 512, **fields})
    saved: dict[int, int] = {}
    rule = modeling_qwen3_next.torch_chunk_gated_delta_rule

    def counted(*args, **kwargs):
        def keep(t: torch.Tensor) -> torch.Tensor:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            return rule(*args, **kwargs)

    monkeypatch.setattr(modeling_qwen3_next, "torch_chunk_gated_delta_rule", counted)
    layer = modeling_qwen3_next.Qwen3NextGatedDeltaNet(config, 0).requires_grad_(False)
    layer(torch.randn(rows, length, config.hidden_size, requires_grad=True))
    dims = delta_net_dims(config)
    assert dims is not None and dims.layers == 1  # the zoo's layer types: one delta-net, one attention layer
    error = delta_net_bytes(dims, rows, length) / sum(saved.values()) - 1
    assert -0.10 <= error <= 0.15, error


def test_qwen3_nexts_prediction_counts_its_delta_nets() -> None:
    """The gated delta-net is described (not "not modelled") and its rule's bytes are in the activations, once
    per layer without checkpointing and once for the recomputed layer with it."""
    from transformers import AutoConfig

    from jobs.devices.probe import cpu_facts
    from jobs.memory.mixers import delta_net_bytes, delta_net_dims
    from jobs.memory.parts import arch_from_config
    from jobs.memory.predict import predict
    from jobs.models.zoo import BASE
    from jobs.spec.job import JobSpec

    config = AutoConfig.for_model("qwen3_next", **{**BASE, "vocab_size": 512, **FAMILIES["qwen3_next"].config})
    arch = arch_from_config(config)
    assert "Qwen3NextGatedDeltaNet" in arch.shape.unmodelled
    spec = JobSpec.from_dict({"model": "m", "dataset": "sample:chat-format", "max_length": 256})
    p = predict(spec, arch, cpu_facts())
    assert "Qwen3NextGatedDeltaNet" not in p.not_modelled
    d = delta_net_dims(config)
    assert d is not None and d.layers == 1 and (d.value_heads, d.key_head_dim, d.value_head_dim) == (4, 16, 16)
    assert "1 gated delta-net layers' chunked rule" in p.to_dict()["formulas"]["activations"]
    assert p.part("activations") >= delta_net_bytes(d, p.batch.sequences, 256)
    assert delta_net_dims(AutoConfig.for_model("llama", **BASE)) is None
