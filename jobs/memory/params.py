"""Trainable parameters of a spec, known before launch, without loading any weights.

The model's layer shapes come from its config alone: the model is built on torch's `meta`
device (shapes, no storage, no weights read: milliseconds even for 7B), then peft's rules for
each method are applied as arithmetic. Tests check the result equals peft's own
`get_nb_trainable_parameters()` on real models, exactly.

    shape = model_shape(config)                    # a transformers config or a config.json dict
    count = trainable_params(spec, shape)          # ParamCount(trainable, total); count.percent
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobs.spec.enums import LORA_FAMILY, Method
from jobs.spec.job import JobSpec

# peft's `all-linear` skips the output layer; these are the names it has in decoder models.
OUTPUT_LAYER_NAMES = {"lm_head", "embed_out", "output"}


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
    config: Any = field(default=None, compare=False, repr=False)  # the transformers config it was read from


@dataclass(frozen=True)
class ParamCount:
    """Trainable and total parameters as peft's `get_nb_trainable_parameters()` reports them."""

    trainable: int
    total: int

    @property
    def percent(self) -> float:
        return 100.0 * self.trainable / self.total if self.total else 0.0


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
        config=config,
    )


# ---------------------------------------------------------------------- peft's rules as arithmetic
def _matches(name: str, targets: str | list[str]) -> bool:
    """peft's module matching for a list of names: the full name, or a `.`-separated suffix."""
    if isinstance(targets, str):  # a regular expression, matched against the full name
        import re

        return re.fullmatch(targets, name) is not None
    return any(name == t or name.endswith("." + t) for t in targets)


def _targeted(spec: JobSpec, shape: ModelShape, targets: str | list[str]) -> list[Linear]:
    if targets == "all-linear":
        return [lin for lin in shape.linears if lin.name.split(".")[-1] not in OUTPUT_LAYER_NAMES]
    return [lin for lin in shape.linears if _matches(lin.name, targets)]


def counted_by_peft(spec: JobSpec, shape: ModelShape) -> int:
    """Trainable parameters as peft counts them on the model built on the meta device (no weights)."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from jobs.config.peft import peft_config

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(shape.config)
    trainable, _ = get_peft_model(model, peft_config(spec, shape.model_type)).get_nb_trainable_parameters()
    return int(trainable)


def trainable_params(spec: JobSpec, shape: ModelShape) -> ParamCount:
    """What peft's `get_nb_trainable_parameters()` will report for `spec` on this model."""
    from jobs.config.peft import peft_kwargs

    m = spec.method
    if m is Method.FULL:
        return ParamCount(shape.total, shape.total)
    found = peft_kwargs(spec, shape.model_type)
    assert found is not None
    kwargs = found[1]
    h, n = shape.hidden_size, spec.num_virtual_tokens
    if m in LORA_FAMILY:
        # Each targeted linear gets A (r x in) and B (out x r); DoRA adds one magnitude per output feature.
        chosen = _targeted(spec, shape, kwargs["target_modules"])
        trainable = sum(spec.lora_r * (lin.in_features + lin.out_features) for lin in chosen)
        if m is Method.DORA:
            trainable += sum(lin.out_features for lin in chosen)
    elif m is Method.IA3:
        # One scaling vector per targeted layer: over the input for feed-forward layers, else over the output.
        feedforward = kwargs["feedforward_modules"]
        trainable = sum(
            lin.in_features if _matches(lin.name, feedforward) else lin.out_features
            for lin in _targeted(spec, shape, kwargs["target_modules"])
        )
    elif m is Method.PROMPT_TUNING:
        trainable = n * h  # one embedding per virtual token
    elif m is Method.PREFIX_TUNING:
        # A key and a value per virtual token per layer; with grouped-query attention peft sizes
        # them to the key/value heads (head_dim x kv heads), not the hidden size.
        kv_dim = shape.head_dim * shape.num_key_value_heads if shape.num_key_value_heads is not None else h
        trainable = n * shape.num_layers * 2 * kv_dim
    elif m is Method.P_TUNING:
        # Virtual-token embeddings plus the MLP encoder (hidden -> hidden -> hidden -> hidden, with biases).
        trainable = n * h + 3 * (h * h + h)
    elif shape.config is not None:
        # The other methods' rules (Kronecker factors, orthogonal blocks, shared projections...) are
        # not restated here: peft applies them to the meta-device model and counts.
        trainable = counted_by_peft(spec, shape)
    else:  # pragma: no cover - shapes always come from a config
        raise ValueError(f"no trainable-parameter rule for {m} without the model's config")
    return ParamCount(trainable, shape.total + trainable)
