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
    # Kinds of layer in a decoder block that own weights the prediction's formulas do not describe (a state-space
    # mixer, a convolution, linear attention): named in the prediction as "not modelled".
    unmodelled: tuple[str, ...] = ()
    # Whether `model.base_model` is the backbone (its `base_model_prefix` names an attribute): trl's fused LM head
    # runs the backbone through it and reads `last_hidden_state` (Llama4ForCausalLM names a missing one).
    backbone: bool = True
    # The transformers config it was read from; its config.json dict when read back from jobs.memory.arch_cache.
    config: Any = field(default=None, compare=False, repr=False)
    # The linears each `target_modules` value picks (`jobs.memory.params`), worked out once per shape.
    picked: dict[Any, tuple[Linear, ...]] = field(default_factory=dict, init=False, compare=False, repr=False)


# ---------------------------------------------------------------------- shapes (no weights)
def _special_floats(value: Any) -> Any:
    """config.json as transformers writes it: Infinity and NaN as {"__float__": "Infinity"} (Bamba's
    time_step_limit); decoded here as `from_pretrained` does, or building the config fails validation."""
    if isinstance(value, dict):
        if set(value) == {"__float__"} and value["__float__"] in ("Infinity", "-Infinity", "NaN"):
            return float(value["__float__"].lower().replace("infinity", "inf"))
        return {k: _special_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_special_floats(v) for v in value]
    return value


def transformers_config(config: dict[str, Any]) -> Any:
    """The transformers config of a causal LM described by config.json, or None when transformers has no
    causal-LM class for it (an unknown or custom `model_type`: such a model simply has no prediction)."""
    from transformers import AutoConfig

    data = _special_floats(dict(config))
    try:
        built = AutoConfig.for_model(data.pop("model_type"), **data)
    except ValueError:  # transformers: "Unrecognized model identifier: ..." (custom code, or newer than this install)
        return None
    return built if causal_lm_class(built) is not None else None


def causal_lm_class(config: Any) -> Any:
    """transformers' causal-LM class for a config: the auto mapping's, or the listed class whose `config_class` it is
    (Mllama's text model: `MllamaForCausalLM` takes a `MllamaTextConfig`, which the mapping does not key); None."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    module = type(config).__module__  # transformers.models.mllama.configuration_mllama
    for model_type, class_name in MODEL_FOR_CAUSAL_LM_MAPPING._model_mapping.items():
        if module.endswith(f".configuration_{model_type}") and model_type in CONFIG_MAPPING_NAMES:
            cls = getattr(transformers, class_name, None)
            if cls is not None and getattr(cls, "config_class", None) is type(config):
                return cls
    return None


def meta_causal_lm(config: Any) -> Any:
    """The causal LM of a transformers config built on the meta device (no weights, no memory)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    with torch.device("meta"):
        if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
            return AutoModelForCausalLM.from_config(config)
        return causal_lm_class(config)._from_config(config)


def model_shape(config: Any) -> ModelShape:
    """Build the model on the meta device from a transformers config (or config dict) and read its shapes."""
    import torch
    from transformers import AutoConfig

    if isinstance(config, dict):
        config = AutoConfig.for_model(**config)
    model = meta_causal_lm(config)
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
        unmodelled=unmodelled_layers(model),
        backbone=getattr(model, model.base_model_prefix, None) is not None,
        config=config,
    )


# Layers the formulas of jobs.memory.parts know (by class name): linears, norms, embeddings, rotary tables, a
# Llama-style attention and MLP, and MoE experts and routers (jobs.memory.moe_parts).
KNOWN_LAYERS = ("Linear", "Conv1D", "Norm", "Embedding", "Rotary", "Experts", "Router", "Attention", "MLP", "Mlp")


def unmodelled_layers(model: Any) -> tuple[str, ...]:
    """Class names of the decoder blocks' layers that own weights and that no formula describes."""
    import torch

    found: set[str] = set()
    for name, module in model.named_modules():
        kind = type(module).__name__
        in_block = any(p.isdigit() for p in name.split("."))
        if not in_block or isinstance(module, torch.nn.Linear) or kind.endswith(("DecoderLayer", "Block")):
            continue
        if any(True for _ in module.parameters(recurse=False)) and not any(k in kind for k in KNOWN_LAYERS):
            found.add(kind)
    return tuple(sorted(found))


# ---------------------------------------------------------------------- peft's rules as arithmetic
# peft's `all-linear` skips the output layer; these are the names it has in decoder models.
OUTPUT_LAYER_NAMES = {"lm_head", "embed_out", "output"}


def matches_target(name: str, targets: str | list[str]) -> bool:
    """peft's module matching for a list of names: the full name, or a `.`-separated suffix."""
    if isinstance(targets, str):  # a regular expression, matched against the full name
        import re

        return re.fullmatch(targets, name) is not None
    return any(name == t or name.endswith("." + t) for t in targets)


def targeted_linears(spec: Any, shape: ModelShape, targets: str | list[str]) -> list[Linear]:
    key = targets if isinstance(targets, str) else tuple(targets)
    if key not in shape.picked:  # once per shape and targets: a prediction asks three times, for ~50 variants
        if targets == "all-linear":
            found = [lin for lin in shape.linears if lin.name.split(".")[-1] not in OUTPUT_LAYER_NAMES]
        else:
            found = [lin for lin in shape.linears if matches_target(lin.name, targets)]
        shape.picked[key] = tuple(found)
    return list(shape.picked[key])
