"""The shapes and formulas behind `jobs.memory.predict.predict`: one function per part of the peak.

Each formula counts bytes for one training step of a decoder-only transformer and says where its
numbers come from; docs/memory.md explains them in prose (section names in the comments). The
shapes come from the model's config alone: the model is built on torch's meta device (no
storage, no weights read) and its modules are listed.

    arch = arch_from_config(config)        # a transformers config or a config.json dict
    activation_bytes(arch, site_plan, tokens=4 * 512, elem=2, ...)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobs.memory.mixers import config_field
from jobs.memory.shape import ModelShape, model_shape

# trl's fused LM head (trl/kernels/chunked_logprob.py) scores at most this many tokens x vocabulary
# columns per tile, and allocates the tile buffer at the full column width whatever the vocabulary.
HEAD_TOKEN_TILE = 4096
HEAD_VOCAB_TILE = 32768
# bitsandbytes 4-bit: one absmax per 64 weights (fp32, or uint8 + an fp32 per 256 absmax with double quant).
NF4_BLOCK = 64
DOUBLE_QUANT_BLOCK = 256
# bitsandbytes 8-bit optimizers keep fp32 state for tensors smaller than this (`min_8bit_size`).
BNB_MIN_8BIT_SIZE = 4096
BNB_OPT_BLOCK = 256
# Module names whose input is shared: with no dropout their LoRA/IA3 adapters save that input once.
INPUT_SITES = {
    "q_proj": "attn_in",
    "k_proj": "attn_in",
    "v_proj": "attn_in",
    "o_proj": "o_in",
    "gate_proj": "mlp_in",
    "up_proj": "mlp_in",
    "down_proj": "down_in",
}


@dataclass(frozen=True)
class LayerLinear:
    """One linear layer of a decoder block: its short name, in/out features, bias."""

    name: str
    in_features: int
    out_features: int
    bias: bool


@dataclass(frozen=True)
class Arch:
    """What the memory arithmetic needs to know about a model, read from its config."""

    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    gated_mlp: bool
    total_params: int  # tied weights once
    embedding_params: int  # input embeddings
    head_params: int  # untied output layer (0 when tied to the embeddings)
    linear_params: int  # weights of every linear inside the blocks: what bitsandbytes quantizes
    linear_bias_params: int  # their biases (stay in 16/32 bits)
    largest_param: int  # elements of the biggest single weight tensor
    param_shapes: tuple[tuple[int, ...], ...]  # every parameter's shape (tied weights once)
    block_linears: tuple[LayerLinear, ...]  # one block's linears
    shape: ModelShape  # for the trainable-parameter count (jobs.memory.params)
    checkpoint_bytes: int = 2  # bytes per parameter in the model's files (its config's dtype)
    vision_params: int = 0  # a vision-language model's vision tower and projector (in total_params; jobs.memory.vision)
    attention: str = "sdpa"  # the attention implementation transformers picks for it ("eager": probabilities kept)
    mask_kinds: int = 1  # eager: the float masks it builds, one per kind of attention layer (full, sliding)
    attn_softcap: bool = False  # attention logits soft-capped (a tanh's output kept; jobs.memory.elementwise)
    logit_softcap: bool = False  # final logits soft-capped (one more tile temporary in the head)
    dropouts: tuple[float, float, float] = (0.0, 0.0, 0.0)  # attention, residual, embedding dropout rates
    composed_activation: int = 0  # tensors its activation keeps beyond a one-op one (gelu_new: 3)
    unequal_head_dims: bool = False  # query/key heads wider or narrower than value heads (multi-head latent attention)

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim


def arch_from_config(config: Any) -> Arch:
    """Build the model on the meta device from its config and read the shapes (milliseconds to seconds)."""
    from transformers import AutoConfig

    from jobs.memory.shape import meta_causal_lm

    if isinstance(config, dict):
        data = dict(config)
        config = AutoConfig.for_model(data.pop("model_type"), **data)
    model = meta_causal_lm(config)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    emb = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is emb.weight
    head_ids = {id(head)} if head is not None else set()
    block_prefix = None
    linears: list[LayerLinear] = []
    linear_w = linear_b = 0
    for name, module in model.named_modules():
        dims = _linear_dims(module)
        if dims is not None and id(module) not in head_ids:
            linear_w += module.weight.numel()
            linear_b += module.bias.numel() if module.bias is not None else 0
            parts = name.split(".")
            prefix = next((".".join(parts[: i + 1]) for i, p in enumerate(parts) if p.isdigit()), None)
            block_prefix = block_prefix or prefix
            if prefix is not None and prefix == block_prefix:
                linears.append(LayerLinear(parts[-1], *dims, module.bias is not None))
    hidden = int(text.hidden_size)
    heads = int(text.num_attention_heads)
    kv = getattr(text, "num_key_value_heads", None) or heads
    head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
    names = {lin.name for lin in linears}
    attention = str(getattr(model.config, "_attn_implementation", None) or "sdpa")
    inter = _intermediate(text, hidden)
    params = list(model.parameters())
    return Arch(
        model_type=str(config.model_type),
        hidden=hidden,
        layers=int(text.num_hidden_layers),
        heads=heads,
        kv_heads=int(kv),
        head_dim=head_dim,
        intermediate=inter,
        vocab=int(emb.weight.shape[0]),
        tied=tied,
        gated_mlp="gate_proj" in names or "w3" in names,
        total_params=sum(p.numel() for p in params),
        embedding_params=emb.weight.numel(),
        head_params=0
        if tied or head is None
        else head.weight.numel() + (head.bias.numel() if head.bias is not None else 0),
        linear_params=linear_w,
        linear_bias_params=linear_b,
        largest_param=max(p.numel() for p in params),
        param_shapes=tuple(tuple(p.shape) for p in params),
        block_linears=tuple(linears),
        shape=model_shape(config),
        checkpoint_bytes=_dtype_bytes(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)),
        attention=attention,
        mask_kinds=_mask_kinds(getattr(text, "layer_types", None)) if attention == "eager" else 1,
        attn_softcap=getattr(text, "attn_logit_softcapping", None) is not None,
        logit_softcap=getattr(text, "final_logit_softcapping", None) is not None,
        dropouts=tuple(_rate(text, keys) for keys in DROPOUT_KEYS),  # type: ignore[arg-type]
        composed_activation=COMPOSED_ACTIVATIONS.get(_activation(text), 0),
        unequal_head_dims=_unequal_head_dims(text),
    )


# The config keys of a model's dropout rates (attention, residual, embedding) and of its activation.
DROPOUT_KEYS = (
    ("attn_pdrop", "attention_dropout", "attention_probs_dropout_prob"),
    ("resid_pdrop", "hidden_dropout"),
    ("embd_pdrop",),
)
COMPOSED_ACTIVATIONS = {"gelu_new": 3}  # intermediate-wide tensors kept beyond a one-op activation


def _rate(config: Any, keys: tuple[str, ...]) -> float:
    for key in keys:
        value = config_field(config, key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return 0.0


def _activation(config: Any) -> str:
    return next((v for k in ("hidden_act", "activation_function") if isinstance(v := config_field(config, k), str)), "")


def _unequal_head_dims(text: Any) -> bool:
    """Whether the query/key heads' width differs from the value heads' (DeepSeek's latent attention: no-rope +
    rope parts against v_head_dim)."""
    v = config_field(text, "v_head_dim")
    qk = config_field(text, "qk_head_dim") or (
        (config_field(text, "qk_nope_head_dim") or 0) + (config_field(text, "qk_rope_head_dim") or 0)
    )
    return isinstance(v, int) and bool(qk) and qk != v


def _mask_kinds(layer_types: Any) -> int:
    """The kinds of attention layer in a config's layer_types (full, sliding, ...): one float mask each."""
    return max(1, len({str(t) for t in layer_types or () if str(t).endswith("attention")}))


def _intermediate(text: Any, hidden: int) -> int:
    """The MLP's width as the model builds it: a config with `n_inner` (GPT-2 and its kin) means `n_inner` or
    4 x hidden, whatever other `intermediate_size` attribute it carries; the others name `intermediate_size`."""
    if "n_inner" in text.to_dict():
        return int(text.n_inner or 4 * hidden)
    return int(getattr(text, "intermediate_size", None) or 4 * hidden)


def _linear_dims(module: Any) -> tuple[int, int] | None:
    """(in, out) features of a linear layer: torch's, or transformers' `Conv1D` (GPT-2's fused c_attn and its MLP:
    a linear whose weight is stored transposed, which peft adapts as one); None for any other module."""
    import torch

    if isinstance(module, torch.nn.Linear):
        return module.in_features, module.out_features
    if type(module).__name__ == "Conv1D" and hasattr(module, "nx") and hasattr(module, "nf"):
        return int(module.nx), int(module.nf)
    return None


def _dtype_bytes(dtype: Any) -> int:
    """Bytes per element of a config's dtype ('float32', torch.bfloat16, ...); 2 when unstated."""
    name = str(dtype or "").removeprefix("torch.")
    return {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}.get(name, 2)


# ---------------------------------------------------------------------- weights (docs/memory.md "Weights")
def nf4_bytes_per_param(double_quant: bool) -> float:
    """4 bits per weight plus the block constants: fp32 per 64 weights, or with double quantization
    uint8 per 64 and fp32 per 256 blocks (QLoRA paper, section 3: 4.5 vs ~4.127 bits)."""
    if double_quant:
        return 0.5 + 1 / NF4_BLOCK + 4 / (NF4_BLOCK * DOUBLE_QUANT_BLOCK)
    return 0.5 + 4 / NF4_BLOCK


def int8_bytes(arch: Arch) -> float:
    """LLM.int8: one byte per weight plus one fp32 scale per output row (bitsandbytes `SCB`)."""
    rows = sum(lin.out_features for lin in arch.block_linears) * arch.layers
    return arch.linear_params + 4 * rows


# ---------------------------------------------------------------------- optimizer (docs/memory.md "Optimizer state")
def adam8bit_state_bytes(sizes: list[int]) -> float:
    """bitsandbytes 8-bit Adam: two uint8 moments + an fp32 absmax per 256 values each; small tensors fp32."""
    total = 0.0
    for n in sizes:
        total += 8 * n if n < BNB_MIN_8BIT_SIZE else 2 * n + 2 * 4 * (n / BNB_OPT_BLOCK)
    return total


def adafactor_state_bytes(shapes: list[tuple[int, ...]]) -> float:
    """transformers' Adafactor as the Trainer builds it (no first moment): a matrix keeps one fp32
    value per row and per column (factored second moment), a vector keeps one per element."""
    total = 0.0
    for shape in shapes:
        if len(shape) >= 2:
            total += 4 * (shape[0] + shape[1])
        else:
            total += 4 * (shape[0] if shape else 1)
    return total


# ---------------------------------------------------------------------- activations (docs/memory.md "Activations")
@dataclass(frozen=True)
class ActivationPlan:
    """Which tensors a block keeps for the backward pass, decided by the method."""

    weights_train: bool  # full fine-tuning: linears and norms keep their inputs for weight gradients
    adapters: tuple[LayerLinear, ...] = ()  # LoRA-family targets in one block
    lora_r: int = 0
    dropout: bool = False  # LoRA dropout > 0: each adapter keeps its own dropped input and mask
    dora: bool = False
    ia3: tuple[LayerLinear, ...] = ()
    ia3_feedforward: frozenset[str] = frozenset()
    adapter_elem: float | None = None  # bytes per value on the adapter path (None: the activations' own)


def block_elements(arch: Arch, plan: ActivationPlan, mask_bytes: float, elem: float) -> float:
    """Bytes kept per token by one decoder block until its backward runs (no checkpointing).

    Counted from what autograd saves in a Llama-style block (RMSNorm, rotary attention through
    SDPA/FlashAttention, gated or plain MLP): a frozen linear keeps nothing (its weight is a
    parameter); a trained one keeps its input."""
    h, kv, q, i = arch.hidden, arch.kv_dim, arch.q_dim, arch.intermediate
    # Norms: the input (for the variance); with trained norm weights also the normalised value.
    n = 2 * h * (2 if plan.weights_train else 1)
    # Attention: rotated q and k, v and the output (SDPA keeps them and a per-head logsumexp).
    n += 2 * q + 2 * kv
    # MLP: gated (SwiGLU) keeps gate out, its activation and up out; plain keeps the pre-activation and activation.
    n += 3 * i if arch.gated_mlp else 2 * i
    if plan.weights_train:
        n += 2 * h + q + i  # inputs of the q/k/v, gate/up (normed), o_proj and down_proj linears
    byte_total = n * elem
    seen_sites: set[str] = set()
    a_elem = plan.adapter_elem or elem  # peft casts the adapter's input to the adapter weights' dtype
    a_mask = min(mask_bytes, a_elem)  # a boolean mask stays 1 byte; a dtype mask follows the input
    for lin in plan.adapters:
        if plan.dropout:  # peft applies a fresh dropout per adapter: the dropped copy and its mask stay
            byte_total += lin.in_features * (a_elem + a_mask)
        else:
            site = INPUT_SITES.get(lin.name, lin.name)
            if site not in seen_sites and not plan.weights_train:
                seen_sites.add(site)
                byte_total += lin.in_features * a_elem
        byte_total += plan.lora_r * a_elem  # A's output, kept for B's gradient
        if plan.dora:  # DoRA also keeps the base output and the magnitude-scaled sum
            byte_total += 2 * lin.out_features * elem
    for lin in plan.ia3:
        # IA3 scales an input (feed-forward layers) or an output: it keeps the scaled tensor.
        byte_total += (lin.in_features if lin.name in plan.ia3_feedforward else lin.out_features) * elem
    return byte_total


def dequantized_bytes(arch: Arch, elem: float) -> float:
    """A quantized layer's matmul de-quantizes one weight at a time (and its transpose): the largest one's bytes."""
    return max(lin.in_features * lin.out_features for lin in arch.block_linears) * elem * 2.0


# ---------------------------------------------------------------------- logits (docs/memory.md "Logits and loss")
def head_bytes(
    arch: Arch,
    rows_tokens: int,
    compute_elem: float,
    mask_bytes: float,
    head_trains: bool,
    fused_kernel: bool,
    resident: bool = False,
) -> tuple[float, str]:
    """Peak of trl's fused LM head in its backward: (bytes, formula).

    trl 1.16 never materialises batch x length x vocab logits: it scores tiles of at most
    4096 tokens x 32768 vocabulary columns, in a buffer allocated at the full tile width. Without
    Triton (CPU) the tile's fold runs as torch ops holding 7 fp32 tile-sized temporaries and a
    boolean one (counted); the backward also accumulates the hidden-state gradient (and the head's weight
    gradient when the head trains) in fp32. `resident`: count only the pages written (a host process's RSS:
    a vocabulary narrower than the tile leaves the rest of each buffer row untouched), not the allocation."""
    n = min(rows_tokens, HEAD_TOKEN_TILE)
    v = min(arch.vocab, HEAD_VOCAB_TILE)
    width = v if resident else HEAD_VOCAB_TILE
    buffer = n * width * compute_elem
    softcap = int(arch.logit_softcap)  # a final logit soft-capping's tanh: one more fp32 temporary
    temps = 0.0 if fused_kernel else n * v * ((7 + softcap) * 4 + 1)
    grad_hidden = rows_tokens * arch.hidden * 4
    grad_weight = arch.vocab * arch.hidden * 4 if head_trains else 0
    formula = (
        f"tile {n}x{width}x{compute_elem:g} B{' (written part)' if resident and width < HEAD_VOCAB_TILE else ''}"
        + ("" if fused_kernel else f" + {7 + softcap} fp32 + 1 bool temporaries {n}x{v}")
        + f" + fp32 hidden grad {rows_tokens}x{arch.hidden}"
        + (f" + fp32 head grad {arch.vocab}x{arch.hidden}" if head_trains else "")
    )
    return buffer + temps + grad_hidden + grad_weight, formula
