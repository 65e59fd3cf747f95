"""The `Arch` of a common dense family computed from its config.json alone, without torch or transformers.

Building the model on the meta device (`jobs.memory.parts.arch_from_config`) is exact for every family, but a
config never seen before costs an import of torch and transformers and of the family's model code (~5-8 s of a
`tunedeck plan`). The Llama-shaped families below are one pattern with a few switches (which biases a config
can turn on, q/k norms, the norms of a block, head_dim's and the head's defaults), so their parameters and
linears are written out here in the order transformers registers them. `tests/test_dense_shape.py` holds each
family against the meta-device build (every field of the Arch equal, the parameter shapes included) and its
defaults against the installed transformers' config classes; anything unusual in a config (a key missing or of
another type, heads that do not divide, a pad token outside the vocabulary) returns None and the caller builds
the model as before.

    arch = dense_arch(json.loads(config_text))   # an Arch, or None: not one of these families, or unusual
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobs.memory.parts import (
    COMPOSED_ACTIVATIONS,
    DROPOUT_KEYS,
    Arch,
    LayerLinear,
    _activation,
    _dtype_bytes,
    _mask_kinds,
    _rate,
)
from jobs.memory.shape import Linear, ModelShape

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
# The config.json keys every covered family needs stated (real configs state them; a missing one means the
# config class's default, which only the meta-device build knows for sure).
# num_key_value_heads too: its default is the heads for some classes, a number of their own for others.
REQUIRED = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)
PRE_POST = ("input_layernorm", "post_attention_layernorm")
FOUR_NORMS = PRE_POST + ("pre_feedforward_layernorm", "post_feedforward_layernorm")
_ALTERNATING = ("sliding_attention", "full_attention")  # Gemma-2's layer_types when its config has none


@dataclass(frozen=True)
class DenseFamily:
    """How one family's decoder differs from Llama's, as its transformers modeling code builds it."""

    head_dim: int | None = None  # the config class's default head_dim; None: hidden_size // num_attention_heads
    tied: bool = False  # the config class's default tie_word_embeddings
    attention_bias: bool = True  # the config's attention_bias gives q/k/v/o biases
    mlp_bias: bool = False  # the config's mlp_bias gives gate/up/down biases
    qkv_bias: bool = False  # q/k/v always have biases (Qwen2)
    qk_norm: str = ""  # "head": q/k norms of head_dim; "full": of heads x head_dim and kv heads x head_dim
    norms: tuple[str, ...] = PRE_POST  # a block's norms, in order
    attention: str = "sdpa"  # the attention implementation transformers picks for the family
    softcaps: tuple[float | None, float | None] = (None, None)  # the class's attention and final logit soft-capping


FAMILIES: dict[str, DenseFamily] = {
    "llama": DenseFamily(mlp_bias=True),
    "granite": DenseFamily(mlp_bias=True),
    "mistral": DenseFamily(attention_bias=False),
    "qwen2": DenseFamily(attention_bias=False, qkv_bias=True),
    "qwen3": DenseFamily(head_dim=128, qk_norm="head"),
    "olmo2": DenseFamily(qk_norm="full", norms=("post_attention_layernorm", "post_feedforward_layernorm")),
    "gemma": DenseFamily(head_dim=256, tied=True),
    "gemma2": DenseFamily(head_dim=256, tied=True, norms=FOUR_NORMS, attention="eager", softcaps=(50.0, 30.0)),
    "gemma3_text": DenseFamily(head_dim=256, tied=True, qk_norm="head", norms=FOUR_NORMS),
}


@dataclass(frozen=True)
class _Dims:
    hidden: int
    inter: int
    layers: int
    heads: int
    kv: int
    head_dim: int
    vocab: int
    tied: bool
    attention_bias: bool
    mlp_bias: bool


def dense_arch(config: dict[str, Any]) -> Arch | None:
    """The Arch the meta-device build gives for this config.json, or None when it is not a covered family
    or anything in it is unusual (the caller then builds the model)."""
    family = FAMILIES.get(config.get("model_type"))  # type: ignore[arg-type]
    dims = _dims(config, family) if family is not None else None
    if family is None or dims is None:
        return None
    block = _block(family, dims)
    named = _parameters(family, dims, block)
    block_linears = tuple(LayerLinear(n.rpartition(".")[2], i, o, b) for n, i, o, b in block)
    linears = [Linear(f"model.layers.{layer}.{name}", i, o) for layer in range(dims.layers) for name, i, o, _ in block]
    linears.append(Linear("lm_head", dims.hidden, dims.vocab))
    shapes = tuple(shape for _, shape in named)
    total = sum(_numel(s) for s in shapes)
    per_block = [(i * o, o if b else 0) for _, i, o, b in block]
    shape = ModelShape(
        model_type=str(config["model_type"]),
        total=total,
        hidden_size=dims.hidden,
        num_layers=dims.layers,
        num_attention_heads=dims.heads,
        num_key_value_heads=dims.kv,
        head_dim=dims.head_dim,
        linears=tuple(linears),
        config=config,
    )
    return Arch(
        model_type=shape.model_type,
        hidden=dims.hidden,
        layers=dims.layers,
        heads=dims.heads,
        kv_heads=dims.kv,
        head_dim=dims.head_dim,
        intermediate=dims.inter,
        vocab=dims.vocab,
        tied=dims.tied,
        gated_mlp=True,
        total_params=total,
        embedding_params=dims.vocab * dims.hidden,
        head_params=0 if dims.tied else dims.vocab * dims.hidden,
        linear_params=dims.layers * sum(w for w, _ in per_block),
        linear_bias_params=dims.layers * sum(b for _, b in per_block),
        largest_param=max(_numel(s) for s in shapes),
        param_shapes=shapes,
        block_linears=block_linears,
        shape=shape,
        checkpoint_bytes=_dtype_bytes(config.get("dtype") or config.get("torch_dtype")),
        attention=family.attention,
        mask_kinds=_mask_kinds(config.get("layer_types") or _ALTERNATING[: dims.layers])
        if family.attention == "eager"
        else 1,
        attn_softcap=config.get("attn_logit_softcapping", family.softcaps[0]) is not None,
        logit_softcap=config.get("final_logit_softcapping", family.softcaps[1]) is not None,
        dropouts=tuple(_rate(config, keys) for keys in DROPOUT_KEYS),  # type: ignore[arg-type]
        composed_activation=COMPOSED_ACTIVATIONS.get(_activation(config), 0),
    )


def _dims(config: dict[str, Any], family: DenseFamily) -> _Dims | None:
    """The sizes the family's code reads, with its config class's defaults; None when any is unusual."""
    found = [config.get(key) for key in REQUIRED]
    if not all(_positive(v) for v in found):
        return None
    hidden, inter, layers, heads, kv, vocab = (int(v) for v in found)  # type: ignore[arg-type]
    head_dim: Any = config.get("head_dim", family.head_dim or (hidden // heads if hidden % heads == 0 else None))
    flags = [config.get("tie_word_embeddings", family.tied), config.get("attention_bias", False)]
    flags.append(config.get("mlp_bias", False))
    pad = config.get("pad_token_id")
    if not (_positive(head_dim) and heads % kv == 0 and all(isinstance(f, bool) for f in flags)):
        return None
    if pad is not None and not (isinstance(pad, int) and -vocab <= pad < vocab):  # nn.Embedding refuses it
        return None
    tied, attention_bias, mlp_bias = flags
    return _Dims(hidden, inter, layers, heads, kv, head_dim, vocab, tied, attention_bias, mlp_bias)


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _block(family: DenseFamily, d: _Dims) -> list[tuple[str, int, int, bool]]:
    """One decoder block's linears in registration order: (name in the block, in, out, bias)."""
    q, kv = d.heads * d.head_dim, d.kv * d.head_dim
    attn_bias = family.attention_bias and d.attention_bias
    qkv_bias = attn_bias or family.qkv_bias
    mlp_bias = family.mlp_bias and d.mlp_bias
    return [
        ("self_attn.q_proj", d.hidden, q, qkv_bias),
        ("self_attn.k_proj", d.hidden, kv, qkv_bias),
        ("self_attn.v_proj", d.hidden, kv, qkv_bias),
        ("self_attn.o_proj", q, d.hidden, attn_bias),
        ("mlp.gate_proj", d.hidden, d.inter, mlp_bias),
        ("mlp.up_proj", d.hidden, d.inter, mlp_bias),
        ("mlp.down_proj", d.inter, d.hidden, mlp_bias),
    ]


def _parameters(
    family: DenseFamily, d: _Dims, block: list[tuple[str, int, int, bool]]
) -> list[tuple[str, tuple[int, ...]]]:
    """Every parameter (name, shape) in `model.parameters()` order; the tied head counted once."""
    one: list[tuple[str, tuple[int, ...]]] = []
    for name, fan_in, fan_out, bias in block:
        one.append((f"{name}.weight", (fan_out, fan_in)))
        if bias:
            one.append((f"{name}.bias", (fan_out,)))
        if name == "self_attn.o_proj" and family.qk_norm:  # q/k norms are registered after the projections
            full = family.qk_norm == "full"
            one.append(("self_attn.q_norm.weight", (d.heads * d.head_dim if full else d.head_dim,)))
            one.append(("self_attn.k_norm.weight", (d.kv * d.head_dim if full else d.head_dim,)))
    one += [(f"{norm}.weight", (d.hidden,)) for norm in family.norms]
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (d.vocab, d.hidden))]
    out += [(f"model.layers.{i}.{name}", shape) for i in range(d.layers) for name, shape in one]
    out.append(("model.norm.weight", (d.hidden,)))
    if not d.tied:
        out.append(("lm_head.weight", (d.vocab, d.hidden)))
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
