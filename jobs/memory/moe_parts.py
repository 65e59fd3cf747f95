"""The mixture-of-experts terms of the prediction (docs/memory.md "Mixture of experts").

A MoE block keeps, per token, the activations of the top-k experts it was routed to (not of every expert,
and not of a dense MLP of `intermediate_size`), plus the router's scores. LoRA on the fused experts (peft's
`ParamWrapper`) folds `W + scale * B A` into a full-size copy of each targeted expert stack for the forward,
in the weights' dtype, which autograd keeps for the backward: one such copy per MoE layer until the backward
reaches it (one layer at a time with gradient checkpointing), and its gradient while that layer's backward runs
(a transient of that block's backward, which the LM head's own transient is no longer beside).

    routed_bytes_per_token(arch, moe, elem)   # one MoE layer's routed activations, per token
    folded_expert_bytes(moe, weight_bytes, checkpointing)
"""

from __future__ import annotations

from jobs.memory.parts import Arch
from jobs.models.moe_layout import MoeLayout


def expert_intermediate(arch: Arch, moe: MoeLayout) -> float:
    """One expert's intermediate width, from the fused weights (gate, up and down: 3 x hidden x width)."""
    per_expert = moe.expert_param_count / max(1, moe.moe_layers * moe.experts)
    return per_expert / (3 * arch.hidden)


def dense_mlp_per_token(arch: Arch) -> float:
    """What `jobs.memory.parts.block_elements` counts for a dense MLP per token (elements)."""
    return 3 * arch.intermediate if arch.gated_mlp else 2 * arch.intermediate


def routed_bytes_per_token(arch: Arch, moe: MoeLayout, elem: float, experts_train: bool) -> float:
    """Bytes one MoE layer keeps per token: top-k x (gate/up out, activation, down input, the token's copy and
    its weighted output) + the router's fp32 scores and weights; the token's input copy for the experts'
    weight gradients when they train."""
    width = expert_intermediate(arch, moe)
    per_expert = 2 * width + width + width + 2 * arch.hidden + (arch.hidden if experts_train else 0)
    return moe.top_k * per_expert * elem + 2 * moe.experts * 4


def folded_expert_bytes(moe: MoeLayout, weight_bytes: float, checkpointing: bool) -> tuple[float, float]:
    """(peft's folded expert copies (W + scale B A, the weights' dtype) kept for the backward, the gradient of one
    layer's copy while that layer's backward runs). The gradient is a transient of a block's backward: it is
    never alive beside the LM head's transient (the head's backward has finished before any block's starts)."""
    per_layer = moe.expert_param_count / max(1, moe.moe_layers) * weight_bytes
    kept = per_layer if checkpointing else per_layer * moe.moe_layers
    return kept, per_layer


def active_params(arch: Arch) -> int | None:
    """Parameters one token passes through (top-k of the experts, every other weight); None for a dense model."""
    moe = arch.shape.moe
    if moe is None:
        return None
    return int(arch.total_params - moe.expert_param_count * (1 - moe.active_param_share))
