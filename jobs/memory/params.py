"""Trainable parameters of a spec, known before launch, without loading any weights.

The model's layer shapes come from its config alone: the model is built on torch's `meta`
device (shapes, no storage, no weights read: milliseconds even for 7B), then peft's rules for
each method are applied as arithmetic. Tests check the result equals peft's own
`get_nb_trainable_parameters()` on real models, exactly.

    shape = model_shape(config)                    # jobs.memory.shape: a transformers config or config.json dict
    count = trainable_params(spec, shape)          # ParamCount(trainable, total); count.percent
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.memory.shape import ModelShape, matches_target, targeted_linears
from jobs.spec.enums import LORA_FAMILY, Method
from jobs.spec.job import JobSpec


@dataclass(frozen=True)
class ParamCount:
    """Trainable and total parameters as peft's `get_nb_trainable_parameters()` reports them."""

    trainable: int
    total: int

    @property
    def percent(self) -> float:
        return 100.0 * self.trainable / self.total if self.total else 0.0


def counted_by_peft(spec: JobSpec, shape: ModelShape) -> int:
    """Trainable parameters as peft counts them on the model built on the meta device (no weights)."""
    from peft import get_peft_model

    from jobs.config.peft import peft_config
    from jobs.memory.shape import meta_causal_lm, transformers_config

    config = transformers_config(shape.config) if isinstance(shape.config, dict) else shape.config  # read back
    model = meta_causal_lm(config)
    adapter = peft_config(spec, shape.model_type, shape.moe)
    assert adapter is not None, f"{spec.method.value} trains no adapter: there is nothing for peft to count"
    trainable, _ = get_peft_model(model, adapter).get_nb_trainable_parameters()
    return int(trainable)


def trainable_params(spec: JobSpec, shape: ModelShape) -> ParamCount:
    """What peft's `get_nb_trainable_parameters()` will report for `spec` on this model."""
    from jobs.config.peft import peft_kwargs

    m = spec.method
    if m is Method.FULL:
        return ParamCount(shape.total, shape.total)
    found = peft_kwargs(spec, shape.model_type, shape.moe)
    assert found is not None
    kwargs = found[1]
    h, n = shape.hidden_size, spec.num_virtual_tokens
    if m in LORA_FAMILY and shape.moe is not None and shape.config is not None:
        # Adapters on fused experts (peft's ParamWrapper, one A/B per expert or shared, per family conversion)
        # are counted by peft itself on the meta-device model.
        trainable = counted_by_peft(spec, shape)
    elif m in LORA_FAMILY:
        # Each targeted linear gets A (r x in) and B (out x r); DoRA adds one magnitude per output feature.
        chosen = targeted_linears(spec, shape, kwargs["target_modules"])
        trainable = sum(spec.lora_r * (lin.in_features + lin.out_features) for lin in chosen)
        if m is Method.DORA:
            trainable += sum(lin.out_features for lin in chosen)
    elif m is Method.IA3:
        # One scaling vector per targeted layer: over the input for feed-forward layers, else over the output.
        feedforward = kwargs["feedforward_modules"]
        trainable = sum(
            lin.in_features if matches_target(lin.name, feedforward) else lin.out_features
            for lin in targeted_linears(spec, shape, kwargs["target_modules"])
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
