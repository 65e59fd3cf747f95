"""What a model's attention probabilities, dropout layers and composed activation keep for the backward
(docs/memory.md "Activations"), beyond `jobs.memory.parts.block_elements` (which counts SDPA's fused kernels).

Most families train with every dropout at 0 (their configs' default). Those that keep it on (GPT-2's
`attn_pdrop`, `resid_pdrop` and `embd_pdrop` are 0.1) keep more, counted from what autograd saves in a
GPT-2 block (2 x 1,024 tokens, 8 heads: 105 MiB without dropout, 305 MiB with it, all of the difference
below):

- attention probabilities, heads x length per token a layer, kept where the kernel materialises them: an
  "eager" attention (the implementation transformers picks for Gemma-2 and gpt-oss) keeps the softmax's output
  (1 tensor; its soft-capping's tanh output a second; a dropout's mask and result two more); SDPA with
  attention dropout where its fused kernel cannot apply it (PyTorch's fused CPU kernel cannot: SDPA falls
  back to its math path) keeps three (the probabilities, the mask in the input's dtype, the dropped
  probabilities); so does SDPA on the CPU when the query/key heads are not as wide as the value heads
  (DeepSeek's latent attention: 32 + 16 against 64 in the zoo), keeping the probabilities (one tensor;
  counted: a DeepSeek-V3 of hidden 512 at 2 x 1,024 tokens keeps 4 x 64 MiB of them). On CUDA the fused
  kernels draw the mask from a seed and take unequal widths: none of them is kept.
  The block's backward then holds one more at a time beside them: the gradient of the last tensor kept
  (made by the matmul's backward while the kept ones are alive), then of the one before, ...: a transient
  of the block being back-propagated, on top of the saved tensors of the blocks not reached yet (counted
  like a recomputed block: only what exceeds the LM head's own transient).
- residual dropout (after the attention and after the MLP): each keeps its mask (bool on CUDA, the input's
  dtype on the CPU), hidden wide.
- embedding dropout: one mask, hidden wide, once.
- an eager attention's masks: transformers builds one float length x length mask a row per kind of attention
  layer (full, sliding) for the whole model; with gradient checkpointing every checkpointed block keeps it
  as an input of its recomputation, so it lives until the last block's backward (without, it dies with the
  forward: not counted). SDPA is given none for unpadded rows.

Counted against what autograd saves: a Gemma-2 block of hidden 512, 8 heads, keeps 2 x 8 x length x 4 B a
token more than the block formula (the probabilities and the tanh; 1 x without soft-capping).

A composed activation: `gelu_new` (GPT-2's, transformers' `NewGELUActivation`) is written as torch ops,
`0.5 * x * (1 + tanh(c * (x + 0.044715 * x**3)))`, and autograd keeps the tanh's output, `0.5 * x` and
`1 + tanh(...)`: three intermediate-wide tensors more than a one-op GELU (counted: 3 x 2,048 elements a token
in a GPT-2 block of hidden 512, 3 x 1,536 at hidden 256, against `gelu_pytorch_tanh`).

    e = elementwise_bytes(arch, length, elem, mask_bytes, cuda)   # bytes per token
    e.per_layer, e.once, e.backward, e.words
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.memory.parts import Arch


@dataclass(frozen=True)
class Elementwise:
    """Bytes per token: kept by each block, kept once (outside the blocks), in flight during one block's backward."""

    per_layer: float = 0.0
    once: float = 0.0
    backward: float = 0.0
    words: str = ""
    checkpointed: float = 0.0  # kept only with checkpointing: the float attention masks each block is given


def elementwise_bytes(arch: Arch, length: int, elem: float, mask_bytes: float, cuda: bool) -> Elementwise:
    """What the model's attention kernel, dropout layers and composed activation keep (`Elementwise`)."""
    attention, residual, embedding = (rate > 0 for rate in arch.dropouts)
    per_layer = once = backward = masks = 0.0
    words = []
    probabilities = 0.0  # bytes per (head x length) value a token keeps per layer
    if arch.attention == "eager":  # the softmax's output, the soft-capping's tanh, a dropout's mask and result
        probabilities = (1 + arch.attn_softcap + attention) * elem + attention * mask_bytes
        masks = arch.mask_kinds * length * elem  # one float length x length mask a row per kind of layer
    elif attention and not cuda:  # SDPA's math path: probabilities, the mask (input dtype), dropped probabilities
        probabilities = 2 * elem + mask_bytes
    elif arch.unequal_head_dims and not cuda:  # SDPA's math path too (the CPU kernel wants equal head widths)
        probabilities = elem
    if probabilities:
        per_layer += arch.heads * length * probabilities
        backward = arch.heads * length * elem
        words.append(f"{arch.attention} attention keeps {arch.heads} heads x {length} x {probabilities:g} B")
    if residual:
        per_layer += 2 * arch.hidden * mask_bytes
        words.append(f"residual dropout masks 2 x {arch.hidden} x {mask_bytes:g} B")
    if embedding:
        once += arch.hidden * mask_bytes
        words.append(f"embedding dropout mask {arch.hidden} x {mask_bytes:g} B")
    if arch.composed_activation:
        per_layer += arch.composed_activation * arch.intermediate * elem
        words.append(f"its activation keeps {arch.composed_activation} x {arch.intermediate} x {elem:g} B more")
    return Elementwise(per_layer, once, backward, "; ".join(words), masks)
