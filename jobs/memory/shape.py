"""A base model's shape, read from its config alone: parameter totals and every linear layer.

The model is built on the meta device (no weights, no memory), so the shapes come from
transformers itself rather than from formulas. `jobs.memory.parts` sizes the prediction's parts
from it and `jobs.memory.params` lets peft count an adapter's parameters on it. Imports nothing of
the project, so both stay low in the layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobs.models.moe_layout import MoeLayout, moe_layout


@dataclass(frozen=True)
class Linear:
    """One linear layer of the base model: full module name, in/out features."""

    name: str
    in_features: int
    out_features: int


@dataclass(frozen=True)
class ModelShape:
    """What the parameter arithmetic needs to know about a base model."""

    model_type: str
    total: int  # parameters of the base model (tied weights counted once)
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None  # None when the config has no such key (peft then uses all heads)
    head_dim: int
    linears: tuple[Linear, ...] = field(default=())
    moe: MoeLayout | None = None  # None for a dense model
    # The transformers config it was read from; its config.json dict when read back from jobs.memory.arch_cache.
    config: Any = field(default=None, compare=False, repr=False)
    # The linears each `target_modules` value picks (`jobs.memory.params`), worked out once per shape.
    picked: dict[Any, tuple[Linear, ...]] = field(default_factory=dict, init=False, compare=False, repr=False)


# ---------------------------------------------------------------------- shapes (no weights)
def model_shape(config: Any) -> ModelShape:
    """Build the model on the meta device from a transformers config (or config dict) and read its shapes."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if isinstance(config, dict):
        config = AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    linears = tuple(
        Linear(name, m.in_features, m.out_features)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear)
    )
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = int(text.hidden_size)
    heads = int(text.num_attention_heads)
    kv = getattr(text, "num_key_value_heads", None)
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    return ModelShape(
        model_type=str(config.model_type),
        total=sum(p.numel() for p in model.parameters()),
        hidden_size=hidden,
        num_layers=int(text.num_hidden_layers),
        num_attention_heads=heads,
        num_key_value_heads=int(kv) if kv is not None else None,
        head_dim=int(head_dim),
        linears=linears,
        moe=moe_layout(model, text),
        config=config,
    )


# ---------------------------------------------------------------------- peft's rules as arithmetic
