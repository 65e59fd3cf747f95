"""The rough memory budget shown before launch: weights, gradients and optimizer state.

Pure arithmetic (bytes per parameter, mixed-precision AdamW figures); activations, the CUDA context
and the logits are left out on purpose and the form says so. The full predictor is a later issue.

    arch = Arch.from_config(json.load(open("config.json")))
    b = estimate(arch, spec, cuda=True)
    b.total_bytes, b.trainable_params
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobs.spec import JobSpec, Method, Optim, Precision

# Optimizer state bytes per trainable parameter (MEMORY.md: AdamW two fp32 moments; 8-bit AdamW ~2 B).
OPTIMIZER_BYTES: dict[Optim, float] = {
    Optim.ADAMW: 8.0,
    Optim.ADAMW_8BIT: 2.0,
    Optim.PAGED_ADAMW_8BIT: 2.0,
    Optim.PAGED_ADAMW_32BIT: 8.0,
    Optim.ADAFACTOR: 4.0,  # factored second moment: well under 8 B; 4 B is a cautious round figure
}
QLORA_BASE_BYTES = 0.516  # NF4 + double-quantized block constants, 4.127 bits (QLoRA paper s.3)
INT8_BASE_BYTES = 1.0
ADAPTER_BYTES = 4.0  # peft keeps adapter weights and their gradients in fp32
FULL_MIXED_WEIGHT_BYTES = 6.0  # fp32 master 4 + half copy 2 (MEMORY.md: 18 B/param in all)


@dataclass(frozen=True)
class Arch:
    """The few numbers of a decoder-only transformer that parameter counts need."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool = True

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> "Arch":
        """From a Hugging Face config.json dict (Llama/Qwen/Mistral-style keys)."""
        hidden = int(cfg.get("hidden_size") or cfg.get("n_embd") or cfg["d_model"])
        heads = int(cfg.get("num_attention_heads") or cfg.get("n_head") or 1)
        return cls(hidden=hidden, intermediate=int(cfg.get("intermediate_size") or 4 * hidden),
                   layers=int(cfg.get("num_hidden_layers") or cfg.get("n_layer") or 1), heads=heads,
                   kv_heads=int(cfg.get("num_key_value_heads") or heads), vocab=int(cfg.get("vocab_size") or 0),
                   tied=bool(cfg.get("tie_word_embeddings", True)))

    @property
    def kv_dim(self) -> int:
        return self.hidden // self.heads * self.kv_heads

    def linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of one block, by the usual Llama module names."""
        h, kv, i = self.hidden, self.kv_dim, self.intermediate
        return {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    @property
    def params(self) -> int:
        per_layer = sum(a * b for a, b in self.linears().values()) + 2 * self.hidden
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * per_layer + embeddings + self.hidden


# SmolLM2-135M's published config (MEMORY.md), for the built-in default before it is converted.
SMOLLM2_135M = Arch(hidden=576, intermediate=1536, layers=30, heads=9, kv_heads=3, vocab=49152, tied=True)


def trainable_params(arch: Arch, spec: JobSpec) -> int:
    """Parameters that get gradients and optimizer state under the spec's method."""
    m = spec.method
    lin = arch.linears()
    if m is Method.FULL:
        return arch.params
    if m in (Method.LORA, Method.DORA, Method.QLORA, Method.LORA_8BIT):
        targets = spec.lora_target_modules.strip()
        names = set(lin) if targets == "all-linear" else {t.strip() for t in targets.split(",") if t.strip()}
        chosen = [lin[n] for n in names if n in lin]
        per_layer = sum(spec.lora_r * (a + b) for a, b in chosen)
        if m is Method.DORA:
            per_layer += sum(b for _, b in chosen)  # one magnitude per output feature
        return arch.layers * per_layer
    if m is Method.IA3:
        return arch.layers * (lin["k_proj"][1] + lin["v_proj"][1] + lin["down_proj"][0])
    if m is Method.PROMPT_TUNING:
        return spec.num_virtual_tokens * arch.hidden
    if m is Method.PREFIX_TUNING:
        return spec.num_virtual_tokens * 2 * arch.layers * arch.kv_dim
    if m is Method.P_TUNING:  # virtual tokens + the default MLP prompt encoder (hidden -> hidden -> hidden)
        return spec.num_virtual_tokens * arch.hidden + 2 * arch.hidden * arch.hidden
    raise ValueError(f"no trainable-parameter rule for {m}")  # pragma: no cover - new enum member


def half_precision(spec: JobSpec, cuda: bool) -> bool:
    """Whether weights are held in 16 bits: bf16/fp16, or auto on a CUDA machine."""
    return spec.precision in (Precision.BF16, Precision.FP16) or (spec.precision is Precision.AUTO and cuda)


@dataclass(frozen=True)
class Budget:
    total_params: int
    trainable_params: int
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    effective_batch_size: int

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes


def estimate(arch: Arch, spec: JobSpec, cuda: bool) -> Budget:
    """Weights + gradients + optimizer state in bytes; activations not included."""
    n, p = arch.params, trainable_params(arch, spec)
    half = half_precision(spec, cuda)
    opt = OPTIMIZER_BYTES[spec.optim] * p
    if spec.method is Method.FULL:
        weights = n * (FULL_MIXED_WEIGHT_BYTES if half else 4.0)
        grads = p * 4.0
    else:
        base = {Method.QLORA: QLORA_BASE_BYTES, Method.LORA_8BIT: INT8_BASE_BYTES}.get(spec.method,
                                                                                       2.0 if half else 4.0)
        weights = n * base + p * ADAPTER_BYTES
        grads = p * ADAPTER_BYTES
    return Budget(n, p, weights, grads, opt, spec.effective_batch_size)


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def human_count(n: int) -> str:
    """134515008 -> '134.5M'."""
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.1f}{suffix}"
    return str(n)


def budget_markdown(b: Budget, arch_source: str) -> str:
    pct = 100.0 * b.trainable_params / b.total_params if b.total_params else 0.0
    return (f"**Before launch** (architecture from {arch_source})  \n"
            f"Effective batch size: **{b.effective_batch_size}** · trainable parameters: "
            f"**{human_count(b.trainable_params)}** of {human_count(b.total_params)} ({pct:.2f}%)  \n"
            f"Rough memory: weights {human_bytes(b.weights_bytes)} + gradients {human_bytes(b.gradients_bytes)} "
            f"+ optimizer {human_bytes(b.optimizer_bytes)} = **{human_bytes(b.total_bytes)}** "
            f"(activations and the CUDA context not included)")
