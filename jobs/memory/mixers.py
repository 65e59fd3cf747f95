"""Activations of the state-space mixers of hybrid models (Mamba-2 style: bamba, granitemoehybrid, falcon_h1,
nemotron_h, mamba2) and of qwen3_next's gated delta-nets, read from the config alone. docs/memory.md "Activations".

A Mamba-2 layer's in_proj writes 2*d_inner + 2*ngroups*d_state + nheads values per token (gate, the
convolved x/B/C, dt), the causal convolution keeps its input and output, and the chunked scan (transformers'
torch path, which the CPU and a machine without `mamba_ssm` run) pads each row to a whole number of chunks
and works in fp32: per head and chunk it keeps chunk x chunk score tensors (the decay mask, C.B and the
masked product), and per padded position B and C repeated to every head (and their einsum copies). The
counts below are what autograd saves, checked against `torch.autograd.graph.saved_tensors_hooks` over a
BambaMixer (within -8%..+21% over chunk sizes 32-256, states 16-256, 1-2 groups, 64-300 tokens).

    mamba2 = mamba2_dims(config)                 # None for a model without Mamba-2 layers
    mixer_bytes(mamba2, sequences=2, length=64, elem=4)   # bytes one layer keeps for a micro-batch
    delta_net_bytes(delta_net_dims(config), sequences=2, length=64)   # qwen3_next: one delta-net layer's rule
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Config keys of the Mamba-2 sizes, as the families spell them (bamba/granitemoehybrid, nemotron_h, mamba2).
KEYS = {
    "heads": ("mamba_n_heads", "mamba_num_heads", "num_heads"),
    "head_dim": ("mamba_d_head", "mamba_head_dim", "head_dim"),
    "state": ("mamba_d_state", "ssm_state_size", "state_size"),
    "groups": ("mamba_n_groups", "n_groups"),
    "chunk": ("mamba_chunk_size", "chunk_size"),
}
# The names hybrid configs give their state-space layers in their layer-type lists.
MAMBA_TYPES = {"mamba", "mamba2", "m", "linear_attention", "hybrid"}  # falcon_h1: "hybrid" (mixer + attention)
# Tensors kept per Mamba-2 layer (module docstring): chunk x chunk scores, padded fp32 B/C per head,
# unpadded fp32 B/C per head, padded fp32 head outputs, in_proj/conv outputs per token.
# The class names of these layers (BambaMixer, Mamba2Mixer, FalconH1Mixer, GraniteMoeHybridMambaLayer).
MIXER_CLASS_SUFFIX = ("Mixer", "MambaLayer")
SCORES, PADDED_STATE, STATE, PADDED_HEADS, PROJECTED = 2, 4, 2, 10, 3


@dataclass(frozen=True)
class Mamba2:
    heads: int
    head_dim: int
    state: int
    groups: int
    chunk: int
    layers: int  # how many decoder layers are Mamba-2 mixers

    @property
    def in_proj_width(self) -> int:
        """gate (d_inner) + x, B, C (d_inner + 2*groups*state) + dt (heads)."""
        return 2 * self.heads * self.head_dim + 2 * self.groups * self.state + self.heads


def config_field(config: Any, key: str) -> Any:
    """A config's key, whether the config is a transformers config or its dict (None when it has none)."""
    return config.get(key) if isinstance(config, dict) else getattr(config, key, None)


def _first(config: Any, keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = config_field(config, key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def mamba_layer_count(config: Any, layers: int) -> int:
    """The Mamba layers among `layers`: from the config's layer-type list (`layers_block_type`, `layer_types`,
    nemotron_h's `hybrid_override_pattern`), or every layer but `attn_layer_indices`."""
    for key in ("layers_block_type", "layer_types"):
        kinds = config_field(config, key)
        if isinstance(kinds, (list, tuple)) and kinds:
            return sum(1 for k in kinds if str(k).lower() in MAMBA_TYPES)
    pattern = config_field(config, "hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return pattern.count("M")
    attention = config_field(config, "attn_layer_indices")
    return layers - len(attention) if isinstance(attention, (list, tuple)) else layers


def mamba2_dims(config: Any) -> Mamba2 | None:
    """The Mamba-2 sizes of a config (a transformers config or config.json's dict), None without them."""
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if _first(text, KEYS["state"]) is None or _first(text, KEYS["chunk"]) is None:
        return None
    layers = int(config_field(text, "num_hidden_layers") or 0)
    hidden = int(config_field(text, "hidden_size") or 0)
    head_dim = _first(text, KEYS["head_dim"]) or 64
    heads = _first(text, KEYS["heads"]) or (int(config_field(text, "mamba_expand") or 2) * hidden) // head_dim
    count = mamba_layer_count(text, layers)
    if count == 0 or heads <= 0:
        return None
    return Mamba2(
        heads=heads,
        head_dim=head_dim,
        state=int(_first(text, KEYS["state"]) or 0),
        groups=_first(text, KEYS["groups"]) or 1,
        chunk=int(_first(text, KEYS["chunk"]) or 256),
        layers=count,
    )


def mixer_bytes(m: Mamba2, sequences: int, length: int, elem: float) -> float:
    """Bytes one Mamba-2 layer keeps for the backward, for `sequences` rows of `length` tokens."""
    padded = math.ceil(length / m.chunk) * m.chunk
    chunks = padded // m.chunk
    d_inner, hn = m.heads * m.head_dim, m.heads * m.state
    per_row = (
        SCORES * m.heads * chunks * m.chunk * m.chunk * 4
        + PADDED_STATE * padded * hn * 4
        + STATE * length * hn * 4
        + PADDED_HEADS * padded * d_inner * 4
        + PROJECTED * length * (m.in_proj_width - d_inner) * elem
    )
    return float(sequences * per_row)


def mixer_formula(m: Mamba2, per_layer: float) -> str:
    return (
        f" + {m.layers} Mamba-2 layers' chunked scan ({m.heads} heads x {m.state} state, chunks of {m.chunk}: "
        f"{per_layer:,.0f} B each)"
    )


# ---------------------------------------------------------------------- gated delta-net (qwen3_next)
# transformers' torch path of the gated delta rule (`torch_chunk_gated_delta_rule`, what runs without
# flash-linear-attention) repeats queries and keys to every value head, works in fp32 and pads each row to
# chunks of 64. Per value head it keeps chunk x chunk matrices (the pairwise decay, the UT system, the
# intra-chunk scores and their products), padded keys/queries and values and their decayed copies, and the
# l2-normalised queries and keys. Counted with `torch.autograd.graph.saved_tensors_hooks` over the rule
# (tests/test_mixers.py holds the formula within -10%..+15% of the count over heads, head sizes and lengths).
DELTA_CHUNK = 64
DELTA_SCORES, DELTA_PADDED_KEYS, DELTA_PADDED_VALUES, DELTA_KEYS = 5, 3, 2, 10
DELTA_NET_CLASS_SUFFIX = "GatedDeltaNet"


@dataclass(frozen=True)
class DeltaNet:
    value_heads: int
    key_head_dim: int
    value_head_dim: int
    layers: int  # how many decoder layers are gated delta-nets


def delta_net_dims(config: Any) -> DeltaNet | None:
    """The gated delta-net sizes of a config (qwen3_next's `linear_*` keys and its layer types), or None."""
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    sizes = [_first(text, (key,)) for key in ("linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")]
    kinds = config_field(text, "layer_types")
    layers = sum(1 for k in kinds if k == "linear_attention") if isinstance(kinds, (list, tuple)) else 0
    if layers == 0 or not all(isinstance(v, int) and v > 0 for v in sizes):
        return None
    heads, key_dim, value_dim = (int(v) for v in sizes)  # type: ignore[arg-type]
    return DeltaNet(heads, key_dim, value_dim, layers)


def delta_net_bytes(d: DeltaNet, sequences: int, length: int) -> float:
    """Bytes one gated delta-net layer's chunked rule keeps for the backward (fp32, whatever the model's dtype)."""
    padded = math.ceil(length / DELTA_CHUNK) * DELTA_CHUNK
    per_head = (
        DELTA_SCORES * padded * DELTA_CHUNK
        + DELTA_PADDED_KEYS * padded * d.key_head_dim
        + DELTA_PADDED_VALUES * padded * d.value_head_dim
        + DELTA_KEYS * length * d.key_head_dim
    )
    return float(sequences * d.value_heads * per_head * 4)


def delta_net_formula(d: DeltaNet, per_layer: float) -> str:
    return (
        f" + {d.layers} gated delta-net layers' chunked rule ({d.value_heads} value heads, chunks of {DELTA_CHUNK}: "
        f"{per_layer:,.0f} B each)"
    )


def modelled_out(shape: Any) -> tuple[str, ...]:
    """The model's layer kinds no formula describes (Mamba-2 mixers and gated delta-nets are described here)."""
    described: tuple[str, ...] = ()
    if mamba2_dims(shape.config) is not None:
        described += MIXER_CLASS_SUFFIX
    if delta_net_dims(shape.config) is not None:
        described += (DELTA_NET_CLASS_SUFFIX,)
    return tuple(k for k in shape.unmodelled if not k.endswith(described))
