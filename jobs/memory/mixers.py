"""Activations of the state-space mixers of hybrid models (Mamba-2 style: bamba, granitemoehybrid, falcon_h1,
nemotron_h, mamba2), read from the config alone. docs/memory.md "Activations".

A Mamba-2 layer's in_proj writes 2*d_inner + 2*ngroups*d_state + nheads values per token (gate, the
convolved x/B/C, dt), the causal convolution keeps its input and output, and the chunked scan (transformers'
torch path, which the CPU and a machine without `mamba_ssm` run) pads each row to a whole number of chunks
and works in fp32: per head and chunk it keeps chunk x chunk score tensors (the decay mask, C.B and the
masked product), and per padded position B and C repeated to every head (and their einsum copies). The
counts below are what autograd saves, checked against `torch.autograd.graph.saved_tensors_hooks` over a
BambaMixer (within -8%..+21% over chunk sizes 32-256, states 16-256, 1-2 groups, 64-300 tokens).

    mamba2 = mamba2_dims(config)                 # None for a model without Mamba-2 layers
    mixer_bytes(mamba2, sequences=2, length=64, elem=4)   # bytes one layer keeps for a micro-batch
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


def _get(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, dict) else getattr(config, key, None)


def _first(config: Any, keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = _get(config, key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def mamba_layer_count(config: Any, layers: int) -> int:
    """The Mamba layers among `layers`: from the config's layer-type list (`layers_block_type`, `layer_types`,
    nemotron_h's `hybrid_override_pattern`), or every layer but `attn_layer_indices`."""
    for key in ("layers_block_type", "layer_types"):
        kinds = _get(config, key)
        if isinstance(kinds, (list, tuple)) and kinds:
            return sum(1 for k in kinds if str(k).lower() in MAMBA_TYPES)
    pattern = _get(config, "hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return pattern.count("M")
    attention = _get(config, "attn_layer_indices")
    return layers - len(attention) if isinstance(attention, (list, tuple)) else layers


def mamba2_dims(config: Any) -> Mamba2 | None:
    """The Mamba-2 sizes of a config (a transformers config or config.json's dict), None without them."""
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if _first(text, KEYS["state"]) is None or _first(text, KEYS["chunk"]) is None:
        return None
    layers = int(_get(text, "num_hidden_layers") or 0)
    hidden = int(_get(text, "hidden_size") or 0)
    head_dim = _first(text, KEYS["head_dim"]) or 64
    heads = _first(text, KEYS["heads"]) or (int(_get(text, "mamba_expand") or 2) * hidden) // head_dim
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
