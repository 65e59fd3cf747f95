"""What a model's own dropout layers and a composed activation keep for the backward (docs/memory.md
"Activations": dropout and composed activations), beyond `jobs.memory.parts.block_elements`.

Most families train with every dropout at 0 (their configs' default). Those that keep it on (GPT-2's
`attn_pdrop`, `resid_pdrop` and `embd_pdrop` are 0.1) keep more, counted from what autograd saves in a
GPT-2 block (2 x 1,024 tokens, 8 heads: 105 MiB without dropout, 305 MiB with it, all of the difference
below):

- attention dropout: where the attention kernel cannot apply dropout itself (PyTorch's fused CPU kernel
  cannot: SDPA falls back to its math path), the probabilities are materialised per head, length x length
  per row, and three such tensors stay: the softmax output, the dropout mask (in the input's dtype on the
  CPU) and the dropped probabilities. On CUDA the fused kernels draw the mask from a seed: nothing stays.
  The block's backward then holds one more at a time beside them: the dropped probabilities' gradient (the
  matmul's backward makes it while the three are alive), then the probabilities' gradient (the dropout's
  backward, once the dropped probabilities are freed), then the scores' gradient (the softmax's): a transient
  of the block being back-propagated, on top of the saved tensors of the blocks not reached yet.
- residual dropout (after the attention and after the MLP): each keeps its mask (bool on CUDA, the input's
  dtype on the CPU), hidden wide.
- embedding dropout: one mask, hidden wide, once.

A composed activation: `gelu_new` (GPT-2's, transformers' `NewGELUActivation`) is written as torch ops,
`0.5 * x * (1 + tanh(c * (x + 0.044715 * x**3)))`, and autograd keeps the tanh's output, `0.5 * x` and
`1 + tanh(...)`: three intermediate-wide tensors more than a one-op GELU (counted: 3 x 2,048 elements a token
in a GPT-2 block of hidden 512, 3 x 1,536 at hidden 256, against `gelu_pytorch_tanh`).

    e = elementwise_bytes(arch, length, elem, mask_bytes, cuda)   # bytes per token
    e.per_layer, e.once, e.backward, e.words
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobs.memory.parts import Arch

ATTENTION_KEYS = ("attn_pdrop", "attention_dropout", "attention_probs_dropout_prob")
RESIDUAL_KEYS = ("resid_pdrop", "hidden_dropout")
EMBEDDING_KEYS = ("embd_pdrop",)
ACTIVATION_KEYS = ("hidden_act", "activation_function")
COMPOSED_ACTIVATIONS = {"gelu_new": 3}  # intermediate-wide tensors kept beyond a one-op activation


def _get(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, dict) else getattr(config, key, None)


def _rate(config: Any, keys: tuple[str, ...]) -> float:
    for key in keys:
        value = _get(config, key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return 0.0


@dataclass(frozen=True)
class Elementwise:
    """Bytes per token: kept by each block, kept once (outside the blocks), in flight during one block's backward."""

    per_layer: float = 0.0
    once: float = 0.0
    backward: float = 0.0
    words: str = ""


def elementwise_bytes(arch: Arch, length: int, elem: float, mask_bytes: float, cuda: bool) -> Elementwise:
    """What the config's dropout layers and composed activation keep (`Elementwise`)."""
    config = arch.shape.config
    if config is None:
        return Elementwise()
    per_layer = once = backward = 0.0
    words = []
    if _rate(config, ATTENTION_KEYS) > 0 and not cuda:
        per_layer += arch.heads * length * (2 * elem + mask_bytes)
        backward = arch.heads * length * elem
        words.append(f"attention dropout: {arch.heads} heads x {length} x (2 x {elem:g} + {mask_bytes:g}) B")
    if _rate(config, RESIDUAL_KEYS) > 0:
        per_layer += 2 * arch.hidden * mask_bytes
        words.append(f"residual dropout masks 2 x {arch.hidden} x {mask_bytes:g} B")
    if _rate(config, EMBEDDING_KEYS) > 0:
        once += arch.hidden * mask_bytes
        words.append(f"embedding dropout mask {arch.hidden} x {mask_bytes:g} B")
    act = next((v for k in ACTIVATION_KEYS if isinstance(v := _get(config, k), str)), "")
    if act in COMPOSED_ACTIVATIONS:
        per_layer += COMPOSED_ACTIVATIONS[act] * arch.intermediate * elem
        words.append(f"{act} keeps {COMPOSED_ACTIVATIONS[act]} x {arch.intermediate} x {elem:g} B more")
    return Elementwise(per_layer, once, backward, "; ".join(words))
